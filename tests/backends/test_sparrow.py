"""The embedded sparrow backend: the library's own numbers, texts read once per request, a bounded cost per request."""

from __future__ import annotations

import asyncio
import string
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np
import pytest
from sparrow_decider import Decider as SparrowLibrary
from typesafe_sdk import TypeSafeClient

from canvasread.backends.base import Gone, PreparationStopped, never_gone, watching
from canvasread.backends.sparrow import SparrowBackend, SparrowJob, SparrowLimits, sparrow_question
from canvasread.backends.sparrow_static import CHUNK_CHARS, bounded_ids
from canvasread.decide import Decider
from canvasread.errors import InvalidRequest, PayloadTooLarge
from canvasread.types import DecisionRequest, DecisionResult, Question
from canvasread.wire import parse_request

MODELS = ("sparrow-nano-general-v1.1", "sparrow-nano-robot-v1.2")
QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
    "side": {"type": "noul", "instructions": "Low battery?", "criteria": {"true": "under 10%"}},
    "team": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "charges", "tech": None, "sales": ""},
    },
    "anger": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]},
    "one": {"type": "score", "instructions": "Only one level", "criteria": ["all"]},
}
STATES: list[Any] = [
    "I was charged twice for order 1182. I want my money back!",
    {"robot": {"battery": "6%", "zone_a": "dirt_level=34", "obstacle_cm": 12}, "note": "ΣΑΣ  tabs\there\r\nnew"},
    "long text, " * 3000 + "battery: 4% and zone_b: dirt_level=90",  # past the 512 tokens the model reads
    "",
    ["a", 1.5, None, {"nested": [True, "x" * 150]}],
]


@pytest.fixture(scope="module", params=MODELS)
def pair(request: pytest.FixtureRequest) -> tuple[SparrowBackend, SparrowLibrary]:
    backend = SparrowBackend(request.param)
    backend.load()
    return backend, SparrowLibrary.load(request.param)


def parsed(state: Any, questions: dict[str, Any] = QUESTIONS) -> DecisionRequest:
    return parse_request({"model": "m", "state": state, "questions": questions})[1]


@pytest.mark.parametrize("state", STATES, ids=range(len(STATES)))
def test_answers_equal_the_librarys_own_reads(pair: tuple[SparrowBackend, SparrowLibrary], state: Any) -> None:
    backend, library = pair
    request = parsed(state)
    [result] = backend.decide([backend.prepare(request)])
    for question, distribution in zip(request.questions, result.distributions, strict=True):
        if len(question.options) == 1:
            assert distribution.probabilities == (1.0,)
            continue
        _, names, _, expected = library.probs(state, sparrow_question(question))
        by_name = dict(zip(names, (float(p) for p in expected), strict=True))
        want = [by_name[name] / sum(by_name.values()) for name in question.option_names]
        np.testing.assert_allclose(distribution.probabilities, want, rtol=1e-5, atol=1e-7)


def test_bounded_tokenising_equals_the_tokenizers_own_truncation() -> None:
    """Exact wherever a chunk can end at a space or at punctuation, also in text without spaces (every ASCII
    punctuation mark, Greek sigmas that lowercase by context, accents that normalising drops)."""
    tokenizer = SparrowLibrary.load().static.tok
    texts = [
        "word " * 5000,
        ("Ünïcödé ΣΑΣ, punctuation!? " * 400) + "tail",
        "lines\n" * 3000,
        "tabs\tand\rreturns" * 1000,
        "".join(f"ΑΣ{mark}Σα{mark}é" for mark in string.punctuation) * 300,
        "a.b:c'd^e`f" * 1000 + "(then)" * 1000,
        "",
    ]
    for text in texts:
        for limit in (1, 7, 512, 10**6):
            assert bounded_ids(tokenizer, text, limit) == tokenizer.encode(text, limit)


class Counting:
    """The model's tokenizer, counting the characters it is given."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.chars = 0

    def encode(self, text: str, max_len: int = 512) -> list[int]:
        self.chars += len(text)
        return list(self.tokenizer.encode(text, max_len))


def test_text_without_spaces_costs_what_the_model_reads_of_it() -> None:
    """Issue 28: 2 MiB without a space was normalised whole (seconds a text) for the one [UNK] it reads as."""
    tokenizer = SparrowLibrary.load().static.tok
    counting = Counting(tokenizer)
    ids = bounded_ids(counting, "x" * (2 << 20) + " tail", 8)
    assert ids == [tokenizer.unk_id] * 8  # a run longer than a word is unknown tokens, cut every chunk
    assert counting.chars <= 8 * CHUNK_CHARS


def test_usage_counts_what_the_model_read_and_a_request_past_the_budget_is_refused() -> None:
    backend = SparrowBackend(limits=SparrowLimits(max_request_tokens=600))
    backend.load()
    [result] = backend.decide([backend.prepare(parsed("word " * 10_000, {"q": QUESTIONS["refund"]}))])
    assert 512 < result.usage.input_tokens < 600  # the state counts the 512 tokens read, not 10,000
    criteria = {f"option {i}": "a description of several words" for i in range(100)}
    with pytest.raises(PayloadTooLarge, match="more than 600 tokens"):
        backend.prepare(parsed("s", {"q": {"type": "choice", "criteria": criteria}}))


class Recording(SparrowBackend):
    """Records which requests each batch held; a "huge" request's reading waits until `release`."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = threading.Event()
        self.release = threading.Event()
        self.batches: list[list[str]] = []

    def prepare(self, request: DecisionRequest) -> SparrowJob:
        if str(request.state).startswith("huge"):
            self.reading.set()
            assert self.release.wait(30)
        return super().prepare(request)

    def decide(self, jobs: Sequence[SparrowJob], gone: Gone = never_gone) -> list[DecisionResult | None]:
        self.batches.append([str(job.request.state)[:5] for job in jobs])
        return super().decide(jobs, gone)


HUGE = "huge " + "I was charged twice for order 1182. " * 28_000  # 1 MB


def test_the_worker_tokenises_nothing() -> None:
    """A 1 MB state with 40 questions used to hold the worker for tens of seconds, re-tokenised per question
    (issue 16, item 5): every text is now read in `prepare`, on the request's own thread, so `decide` (the
    single worker) runs numpy only. Shown by taking the tokenizer away between the two."""
    backend = SparrowBackend("sparrow-nano-robot-v1.2")
    backend.load()
    job = backend.prepare(parsed(HUGE + " battery: 5%", {f"q{i}": QUESTIONS["team"] for i in range(40)}))
    tokenizer = backend.library.static.tok

    def refuse(text: str, max_len: int = 512) -> list[int]:
        raise AssertionError("the worker tokenised text")

    tokenizer.encode = refuse
    try:
        [result] = backend.decide([job])
    finally:
        del tokenizer.encode
    assert len(result.distributions) == 40


def test_a_small_request_is_answered_while_a_huge_one_is_still_being_read() -> None:
    backend = Recording()
    decider = Decider([backend])
    decider.load()
    huge = parsed(HUGE, {f"q{i}": QUESTIONS["team"] for i in range(40)})
    small = parsed("small request", {"q": QUESTIONS["refund"]})

    async def scenario() -> None:
        decider.start()
        try:
            big = asyncio.create_task(decider.decide("default", huge))
            assert await asyncio.to_thread(backend.reading.wait, 30)  # the huge request is being read
            answered = await asyncio.wait_for(decider.decide("default", small), 30)
            assert answered.answers["q"]["type"] == "noul"
            assert not big.done() and backend.batches == [["small"]]
            backend.release.set()
            assert len((await big).answers) == 40
            assert backend.batches == [["small"], ["huge "]]
        finally:
            backend.release.set()
            await decider.stop(5.0)

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", ["span", "spans"])
def test_span_questions_are_a_422_naming_the_model(sparrow_server: str, kind: str) -> None:

    body = {
        "model": "default",
        "state": "Refund Zoë for order 1182.",
        "questions": {"who": {"type": kind, "instructions": "Who?"}, "ok": {"type": "noul", "instructions": "Ok?"}},
    }
    response = httpx.post(sparrow_server + "/v1/systemone", json=body, timeout=60)
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", "questions", "who", kind]
    assert problem["msg"] == f"model sparrow-nano-general-v1.1 cannot answer {kind} questions"


def test_a_request_whose_caller_has_left_stops_at_the_next_question(
    pair: tuple[SparrowBackend, SparrowLibrary],
) -> None:
    """Issue 16 item 6: the worker stops a job between questions once `gone` says its caller has left."""
    backend, _ = pair
    job = backend.prepare(parsed(STATES[0]))
    asked: list[int] = []

    def gone(index: int) -> bool:
        asked.append(index)
        return len(asked) > 2  # the caller leaves while the second question is read

    kept = backend.prepare(parsed(STATES[1]))
    first, second = backend.decide([job, kept], lambda index: index == 0 and gone(index))
    assert first is None and asked == [0, 0, 0], "it stopped at the third question, not after all five"
    assert second is not None and len(second.distributions) == len(QUESTIONS)


@pytest.mark.parametrize("kind", ["box", "span", "spans"])
def test_a_kind_sparrow_was_not_trained_on_is_refused_before_it_queues_never_read_as_a_score(kind: str) -> None:
    """Called directly (no capability check in front), the backend refuses the kind in `prepare`."""
    backend = SparrowBackend()
    backend.load()
    asked = DecisionRequest("Refund Zoë.", (Question("what", kind, "Which?", ()), Question("ok", "noul", "Ok?", ())))
    with pytest.raises(InvalidRequest) as refused:
        backend.prepare(asked)
    [problem] = refused.value.problems
    assert problem.loc == ("questions", "what")
    assert problem.msg == f"sparrow models answer only noul, choice, score questions, not {kind}"


# A decisive sentence after more filler than the 512 tokens the model reads (about 1,700 tokens).
FILLER = "The quarterly newsletter covers the office move, the picnic and the new parking rules. " * 100
DECISIVE = "I was charged twice for order 1182. I want my money back!"


def test_a_state_past_what_the_model_reads_is_answered_with_a_warning_the_sdk_ignores(sparrow_server: str) -> None:
    """Issue 26: the model used to read the first 512 tokens of a state and drop the rest without a word."""
    questions = {"team": QUESTIONS["team"], "refund": QUESTIONS["refund"]}
    body = {"model": "default", "state": FILLER + DECISIVE, "questions": questions, "diagnostics": True}
    long = httpx.post(sparrow_server + "/v1/systemone", json=body, timeout=60).json()
    [warning] = long["warnings"]
    assert warning["loc"] == ["state"] and warning["type"] == "truncated"
    assert "first 512 tokens of the state" in warning["msg"] and "--max-state-tokens" in warning["msg"]
    assert [answer["diagnostics"]["truncated"] for answer in long["answers"].values()] == [True, True]
    short = httpx.post(sparrow_server + "/v1/systemone", json={**body, "state": DECISIVE}, timeout=60).json()
    assert "warnings" not in short
    assert [answer["diagnostics"]["truncated"] for answer in short["answers"].values()] == [False, False]
    with TypeSafeClient(base_url=sparrow_server, api_key="local") as client:
        result = client.system_one(FILLER + DECISIVE, questions)
    assert result.choices["team"].choice == long["answers"]["team"]["choice"]
    assert result.raw_http_response.json()["warnings"] == long["warnings"]


def test_a_dependents_instructions_cut_by_the_answers_written_in_are_warned_about_once_per_question() -> None:
    """The answers `depends_on` writes into instructions can push them past 512 tokens; a rotated question's
    long option is read once per rotation and warned about once, at the caller's own key."""
    backend = SparrowBackend()
    decider = Decider([backend])
    decider.load()
    long = "word " * 600
    criteria = {"billing": "charges", "tech": long}
    questions = {
        "first": {"type": "noul", "instructions": long},
        "then": {"type": "noul", "instructions": "Is it urgent?", "depends_on": ["first"]},
        "team": {"type": "choice", "criteria": criteria, "order": "rotate"},
    }
    response = decider.ask("short state", questions)
    assert [warning["loc"] for warning in response["warnings"]] == [  # type: ignore[union-attr]
        ["questions", "first", "instructions"],
        ["questions", "team", "criteria", "tech"],
        ["questions", "then", "instructions"],
    ]


def test_max_state_tokens_refuses_a_longer_state_with_a_413_naming_the_flag() -> None:
    backend = SparrowBackend(limits=SparrowLimits(max_state_tokens=20))
    backend.load()
    tokenizer = SparrowLibrary.load().static.tok
    state = "one two three four five six seven eight nine ten " * 2
    assert len(tokenizer.encode(state, 10**6)) == 20
    [result] = backend.decide([backend.prepare(parsed(state, {"q": QUESTIONS["refund"]}))])
    assert result.warnings == ()
    with pytest.raises(PayloadTooLarge, match=r"longer than 20 tokens.*\(--max-state-tokens\)"):
        backend.prepare(parsed(state + "eleven", {"q": QUESTIONS["refund"]}))


def test_reading_a_text_stops_between_chunks_once_the_caller_has_gone() -> None:
    tokenizer = Counting(SparrowLibrary.load().static.tok)
    left = threading.Event()
    left.set()
    with pytest.raises(PreparationStopped):
        watching(left, lambda: bounded_ids(tokenizer, "word " * 10_000, 512))
    assert tokenizer.chars == 0
