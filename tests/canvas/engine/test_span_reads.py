"""Span and spans questions on the tiny thinking checkpoint: in process (the blank read equals transformers' own
denoising loop over the same canvas) and through a live loopback server (every answer is `state[start:end]`, the SDK
still parses the other answers, bad input is a 422 at the field).

Its canvas is 32 tokens: a blank's denoising steps take full-vocabulary logits over the whole canvas, which on the
256-token one tripled these tests' time."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from helpers import canvas_backend, loaded_runtime
from reference import transformers_denoising
from typesafe_sdk import Choice, TypeSafeClient

from canvasread.canvas import seeds
from canvasread.canvas.plan import CANVAS_TAIL
from canvasread.canvas.reader import CanvasRead
from canvasread.canvas.spans import SPAN_STEPS, StateTokens, markers_for, score_blank
from canvasread.decide import Decider
from canvasread.kinds import kind_of
from canvasread.kinds.span import SpanAnswer
from canvasread.kinds.spans import SpansAnswer
from canvasread.wire import parse_request

STATE = "Order 1182 was charged twice to Zoë Brontë; please refund 李雷 before 9:30 🦜 tomorrow."
QUESTIONS: dict[str, Any] = {
    "who": {"type": "span", "instructions": "Who should be refunded?"},
    "names": {"type": "spans", "instructions": "Every person named"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None}},
}


def check_pieces(state: str, answer: dict[str, Any]) -> None:
    """Every piece is the state's own text at its offsets, in reading order, with a confidence in [0, 1]."""
    pieces = answer["spans"] if answer["type"] == "spans" else [answer]
    for piece in pieces:
        assert state[piece["start"] : piece["end"]] == piece["text"]
        assert 0.0 <= piece["confidence"] <= 1.0
    assert [p["start"] for p in pieces] == sorted(p["start"] for p in pieces)
    if answer["type"] == "span":
        SpanAnswer.model_validate(answer)
        assert answer["found"] == bool(answer["text"])
    else:
        SpansAnswer.model_validate(answer)


def test_a_blank_read_equals_transformers_own_loop_over_the_same_canvas(
    tiny_thinking_decider: Decider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 0 of each span question, rebuilt from the documented noise, scored from transformers' logits after
    the blank's denoising steps (`reference.transformers_denoising`, the loop the steps tests hold reads to)."""
    backend = canvas_backend(tiny_thinking_decider)
    runtime = loaded_runtime(backend)
    model = runtime.reader.runner.model  # type: ignore[attr-defined]
    sent: list[CanvasRead] = []
    read = runtime.reader.read
    monkeypatch.setattr(runtime.reader, "read", lambda reads, *gone: (sent.extend(reads), read(reads, *gone))[1])
    _, request = parse_request({"model": "default", "state": STATE, "questions": QUESTIONS, "seed": 5, "samples": 1})
    job = backend.prepare(request)
    [result] = backend.decide([job])
    state = StateTokens.of(runtime.tokenizer, STATE)
    for q, key in enumerate(("who", "names")):
        planned = job.plan.questions[q]
        canvas = job.plan.canvases[planned.canvas]
        start = planned.position
        rng = seeds.noise(5, 0, planned.digest, "round0")
        ids = canvas.ids[:start] + tuple(rng.randrange(runtime.tokenizer.vocab_size) for _ in canvas.ids[start:])
        distribution = result.distributions[q]
        [blank] = [r for r in sent if r.canvas_ids == ids]
        assert distribution.details["steps"] == blank.steps == SPAN_STEPS
        logprobs, _ = transformers_denoising(model, blank)
        form = kind_of(planned.question.kind).blank
        assert form is not None
        markers = markers_for(runtime.tokenizer, form, CANVAS_TAIL)
        wanted = sorted({*state.distinct_ids, markers.stop, *markers.ends})
        rows = [dict(zip(wanted, logprobs[p, wanted].tolist(), strict=True)) for p in range(start, len(ids))]
        expected = score_blank(state, rows, markers)
        rounds = distribution.details["rounds"]
        assert isinstance(rounds, list) and isinstance(rounds[0], dict)
        assert rounds[0]["confidence"] == pytest.approx(expected.confidence, abs=2e-4), key  # as test_steps.py
        assert rounds[0]["mass"] == pytest.approx(expected.mass, rel=1e-3), key
        found = distribution.found
        assert found is not None
        offsets = {(p.start, p.end) for p in found.pieces}
        if expected.best is None:
            assert offsets == set(), key
        else:
            assert state.piece(*expected.best)[1:] in offsets, key


def same_but_rounding(ours: Any, theirs: Any) -> bool:
    """Equal, floats to 1e-6: the same values summed in another order by passes of other shapes."""
    if isinstance(ours, float):
        return ours == pytest.approx(theirs, abs=1e-6)
    if isinstance(ours, dict):
        return ours.keys() == theirs.keys() and all(same_but_rounding(ours[k], theirs[k]) for k in ours)
    if isinstance(ours, list):
        return len(ours) == len(theirs) and all(same_but_rounding(a, b) for a, b in zip(ours, theirs, strict=True))
    return bool(ours == theirs)


def test_the_same_seed_gives_the_same_pieces(tiny_thinking_decider: Decider) -> None:
    """The first ask may encode the prompt and the second find it cached: their passes then hold other rows, so
    probabilities may differ in fp32's last bits, but never a piece, a text or a choice."""
    both = tiny_thinking_decider.ask(STATE, QUESTIONS, seed=9)
    again = tiny_thinking_decider.ask(STATE, QUESTIONS, seed=9)
    assert same_but_rounding(both["answers"], again["answers"]), (both["answers"], again["answers"])
    for key in ("who", "names"):
        check_pieces(STATE, both["answers"][key])  # type: ignore[arg-type,index]


def test_answers_over_http_are_substrings_and_the_sdk_still_parses_the_rest(tiny_thinking_server: str) -> None:
    with TypeSafeClient(base_url=tiny_thinking_server, api_key="local", timeout=120) as client:
        result = client.system_one(
            STATE,
            {
                "who": QUESTIONS["who"],
                "names": QUESTIONS["names"],
                "team": Choice(instructions="Which team?", criteria={"billing": None, "tech": None}),
            },
        )
    assert set(result.answers) == {"team"}  # the SDK drops answer types it does not model, with a warning
    assert sum(result.choices["team"].probabilities.values()) == pytest.approx(1.0)
    raw = result.raw_http_response.json()["answers"]
    assert list(raw) == ["who", "names", "team"]
    check_pieces(STATE, raw["who"])
    check_pieces(STATE, raw["names"])
    body = {"model": "default", "state": STATE, "questions": QUESTIONS, "diagnostics": True, "samples": 2}
    answer = httpx.post(tiny_thinking_server + "/v1/systemone", json=body, timeout=120).json()["answers"]["who"]
    check_pieces(STATE, answer)
    assert answer["diagnostics"]["reads"] == 2 and answer["diagnostics"]["calibrated"] is False


@pytest.mark.parametrize(
    ("change", "loc", "message"),
    [
        ({"state": {"ticket": STATE}}, ["body", "questions", "who", "span"], "text state; this state is an object"),
        ({"questions": {"who": {"type": "span"}}}, ["body", "questions", "who", "span", "instructions"], "required"),
        (
            {"questions": {"who": {"type": "spans", "instructions": "x", "criteria": ["a"]}}},
            ["body", "questions", "who", "spans", "criteria"],
            "take no criteria",
        ),
        (
            {
                "questions": {
                    "who": {"type": "span", "instructions": "Who?"},
                    "ok": {"type": "noul", "instructions": "Is it fine?", "ask_if": {"who": [True]}},
                }
            },
            ["body", "questions", "ok", "noul", "ask_if", "who", 0],
            "ask_if cannot test",
        ),
    ],
)
def test_bad_span_questions_are_a_422_at_the_field(
    tiny_thinking_server: str, change: dict[str, Any], loc: list[Any], message: str
) -> None:
    body = {"model": "default", "state": STATE, "questions": {"who": QUESTIONS["who"]}, **change}
    response = httpx.post(tiny_thinking_server + "/v1/systemone", json=body, timeout=60)
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == loc and message in problem["msg"]
