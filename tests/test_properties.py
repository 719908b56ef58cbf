"""Property tests: for any valid question set and any distribution a backend may return, the answer is well-formed.

Requests are drawn as wire JSON, validated by `parse_request`, answered by a
backend that returns arbitrary (normalised, zeros allowed) distributions, and
assembled by the `Decider`, rotations included. Every answer must parse as the
wire response, survive strict JSON, and keep the Jev invariants.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider, DeciderSettings
from canvasread.kinds.base import confidence, top_index
from canvasread.kinds.score import expected_score
from canvasread.types import DecisionRequest
from canvasread.wire import SystemOneResponse, parse_request

JSON_LEAVES = (
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False)
)
JSON_LEAVES |= st.text(max_size=20)
JSON = st.recursive(
    JSON_LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
)
CONTENT = st.text(max_size=30) | st.lists(JSON, max_size=3) | st.dictionaries(st.text(max_size=8), JSON, max_size=3)
# A blank text is null (as the hosted API treats an empty one), so a noul's instructions, or else its only described
# side, must say something.
DESCRIBED = CONTENT.filter(lambda value: not isinstance(value, str) or bool(value.strip()))

NOUL = st.one_of(
    st.fixed_dictionaries({"type": st.just("noul"), "instructions": DESCRIBED}),
    st.fixed_dictionaries(
        {
            "type": st.just("noul"),
            "criteria": st.fixed_dictionaries({"true": DESCRIBED}, optional={"false": st.none() | CONTENT}),
        }
    ),
)
CHOICE = st.fixed_dictionaries(
    {
        "type": st.just("choice"),
        "criteria": st.dictionaries(st.text(max_size=12), st.none() | JSON, min_size=1, max_size=12),
    },
    optional={"instructions": CONTENT, "order": st.sampled_from(["as-given", "rotate"])},
)
SCORE = st.fixed_dictionaries(
    {"type": st.just("score"), "criteria": st.lists(CONTENT, min_size=1, max_size=10)},
    optional={"instructions": CONTENT},
)
QUESTION = st.one_of(NOUL, CHOICE, SCORE).flatmap(
    lambda q: st.fixed_dictionaries({}, optional={"min_confidence": st.floats(0.0, 1.0)}).map(
        lambda extra: {**q, **extra}
    )
)
QUESTIONS = st.dictionaries(st.text(max_size=10), QUESTION, min_size=1, max_size=6)


def arbitrary_backend(seed: int) -> FunctionBackend:
    """Returns a fresh random distribution per question: spiky, flat, with exact zeros and ties."""
    rng = random.Random(seed)

    def answer(request: DecisionRequest) -> list[list[float]]:
        distributions = []
        for question in request.questions:
            weights = [rng.choice([0.0, 0.0, 1.0, rng.random(), rng.random() ** 8]) for _ in question.options]
            if not any(weights):
                weights[rng.randrange(len(weights))] = 1.0
            total = math.fsum(weights)
            distributions.append([w / total for w in weights])
        return distributions

    return FunctionBackend(answer)


def answered(seed: int, questions: dict[str, Any], decimals: int | None) -> tuple[DecisionRequest, dict[str, Any]]:
    decider = Decider([arbitrary_backend(seed)], DeciderSettings(decimals=decimals))
    decider.load()
    model, request = parse_request({"model": "jev-latest", "state": "a ticket", "questions": questions})
    return request, decider.decide_now(model, request).to_json()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), questions=QUESTIONS, decimals=st.none() | st.integers(1, 6))
def test_every_answer_is_well_formed(seed: int, questions: dict[str, Any], decimals: int | None) -> None:
    request, response = answered(seed, questions, decimals)
    SystemOneResponse.model_validate(response)
    json.dumps(response, allow_nan=False)  # strict JSON: what the server sends
    answers = response["answers"]
    assert list(answers) == list(questions)
    slack = 0.0 if decimals is None else 10.0**-decimals
    for question in request.questions:
        answer, sent = answers[question.key], questions[question.key]
        names = list(question.option_names)
        assert answer["type"] == sent["type"]
        if question.kind == "noul":
            assert set(answer) - {"abstain"} == {"type", "noul"}
            assert 0.0 <= answer["noul"] <= 1.0
            continue
        probabilities = answer["probabilities"]
        assert list(probabilities) == names
        assert all(0.0 <= p <= 1.0 for p in probabilities.values())
        assert math.isclose(math.fsum(probabilities.values()), 1.0, abs_tol=1e-9 + slack * len(names))
        assert 0.0 <= answer["confidence"] <= 1.0
        if question.kind == "choice":
            assert list(sent["criteria"]) == names
            assert answer["choice"] in names
            assert probabilities[answer["choice"]] >= max(probabilities.values()) - slack
        else:
            assert names == [str(i) for i in range(len(sent["criteria"]))]
            assert answer["legend"] == dict(zip(names, sent["criteria"], strict=True))
            assert -slack <= answer["score"] <= len(names) - 1 + slack
        if "min_confidence" in sent:
            assert isinstance(answer["abstain"], bool)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), questions=QUESTIONS)
def test_rounding_moves_no_number_by_more_than_half_a_unit(seed: int, questions: dict[str, Any]) -> None:
    _, full = answered(seed, questions, None)
    _, rounded = answered(seed, questions, 2)
    for key, answer in full["answers"].items():
        for field in ("noul", "score", "confidence"):
            if field in answer:
                assert abs(rounded["answers"][key][field] - answer[field]) <= 0.005 + 1e-12
        for name, p in answer.get("probabilities", {}).items():
            assert abs(rounded["answers"][key]["probabilities"][name] - p) <= 0.005 + 1e-12


WEIGHTS = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=255).filter(lambda w: math.fsum(w) > 0)


@given(WEIGHTS, st.randoms(use_true_random=False))
def test_confidence_and_argmax_ignore_option_order(weights: list[float], rng: random.Random) -> None:
    total = math.fsum(weights)
    probabilities = [w / total for w in weights]
    shuffled = probabilities[:]
    rng.shuffle(shuffled)
    assert confidence(shuffled) == confidence(probabilities)
    assert shuffled[top_index(shuffled)] == probabilities[top_index(probabilities)] == max(probabilities)


@given(WEIGHTS)
def test_the_score_is_the_expected_level(weights: list[float]) -> None:
    total = math.fsum(weights)
    probabilities = [w / total for w in weights]
    score = expected_score(probabilities)
    assert 0.0 <= score <= len(probabilities) - 1 + 1e-9
    assert min(i for i, p in enumerate(probabilities) if p > 0) - 1e-9 <= score
    assert score <= max(i for i, p in enumerate(probabilities) if p > 0) + 1e-9
