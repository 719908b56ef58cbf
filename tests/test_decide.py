"""`Decider` without HTTP: a `FunctionBackend` for the request path, a fake `Reader` under the real canvas backend."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from helpers import canvas_backend, even

from canvasread.backends.base import FunctionBackend
from canvasread.calibration import Calibration
from canvasread.canvas.backend import CanvasBackend, CanvasRuntime
from canvasread.canvas.reader import CanvasRead, SlotLogProbs
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.decide import Decider, DeciderSettings
from canvasread.errors import CalibrationMismatch, DeadlineExceeded, InvalidRequest, ModelNotFound, NotReady
from canvasread.types import Capabilities, DecisionRequest, JobCost, ModelCard
from canvasread.wire import parse_request

NOUL = {"type": "noul", "instructions": "Is it about money?"}
CHOICE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None, "sales": None}}


def loaded(*backends: Any, settings: DeciderSettings = DeciderSettings()) -> Decider:
    decider = Decider(list(backends), settings)
    decider.load()
    return decider


def request(questions: dict[str, Any], **extra: Any) -> DecisionRequest:
    return parse_request({"model": "m", "state": "I was charged twice.", "questions": questions, **extra})[1]


# ---- the request path, on a function backend ---------------------------------------------------


def test_answers_come_back_in_question_order_with_usage() -> None:
    decider = loaded(
        FunctionBackend(lambda r: [[0.9, 0.1] if q.kind == "noul" else [0.2, 0.5, 0.3] for q in r.questions])
    )
    decision = decider.decide_now("default", request({"money": NOUL, "team": CHOICE}))
    assert list(decision.answers) == ["money", "team"]
    assert decision.answers["money"]["noul"] == 0.9
    assert decision.answers["team"]["choice"] == "tech"
    assert decision.usage == {"input_tokens": 1, "output_tokens": 2}
    assert decision.reads == ()  # the function backend does not count reads


def test_model_names_resolve_to_the_default_and_unknown_ones_are_refused() -> None:
    decider = loaded(FunctionBackend(even, name="first"), FunctionBackend(even, name="second"))
    assert decider.resolve("jev-latest").card.name == "first"
    assert decider.resolve("second").card.name == "second"
    with pytest.raises(ModelNotFound, match="first, second"):
        decider.resolve("third")
    with pytest.raises(ValueError, match="both called"):
        Decider([FunctionBackend(even, name="x"), FunctionBackend(even, name="x")])


def test_nothing_is_answered_before_the_model_has_loaded() -> None:
    decider = Decider([FunctionBackend(even)])
    with pytest.raises(NotReady):
        decider.decide_now("default", request({"q": NOUL}))


def test_capabilities_are_checked_before_the_backend_sees_the_request() -> None:
    seen: list[DecisionRequest] = []

    def answer(r: DecisionRequest) -> list[list[float]]:
        seen.append(r)
        return even(r)

    decider = loaded(FunctionBackend(answer, capabilities=Capabilities(max_options=2)))
    with pytest.raises(InvalidRequest) as caught:
        decider.decide_now("default", request({"team": CHOICE}))
    [problem] = caught.value.problems
    assert problem.loc == ("questions", "team", "choice", "criteria")
    assert problem.type == "too_long" and problem.ctx == {"max_length": 2}
    assert seen == []


def test_a_calibration_applies_only_to_its_own_model_and_weights() -> None:
    class Fingerprinted(FunctionBackend):
        fingerprint = "sha256:abc"

    decider = loaded(Fingerprinted(lambda r: [[0.9, 0.1] for _ in r.questions], name="m"))
    with pytest.raises(CalibrationMismatch, match="not served here"):
        decider.use_calibration(Calibration("other", "sha256:abc", {"noul": 2.0}))
    with pytest.raises(CalibrationMismatch, match="fingerprint"):
        decider.use_calibration(Calibration("m", "sha256:def", {"noul": 2.0}))
    decider.use_calibration(Calibration("m", "sha256:abc", {"noul": 2.0}))
    answer = decider.decide_now("m", request({"q": NOUL}, diagnostics=True)).answers["q"]
    odds = math.sqrt(0.9 / 0.1)  # temperature 2 halves the log-odds
    assert answer["noul"] == pytest.approx(odds / (1 + odds))
    assert answer["diagnostics"] == {"calibrated": True, "temperature": 2.0}


def test_the_queued_path_answers_and_gives_up_at_the_deadline() -> None:
    release = threading.Event()

    class Stuck(FunctionBackend):
        """Prepares a state "stuck" only once released: long past the deadline."""

        def prepare(self, r: DecisionRequest) -> DecisionRequest:
            if r.state == "stuck":
                assert release.wait(30)
            return r

    async def scenario() -> None:
        decider = loaded(Stuck(even), settings=DeciderSettings(timeout_s=0.2))
        decider.start()
        try:
            decision = await decider.decide("default", request({"q": NOUL}))
            assert decision.answers["q"]["noul"] == 0.5
            stuck = parse_request({"model": "m", "state": "stuck", "questions": {"q": NOUL}})[1]
            with pytest.raises(DeadlineExceeded):
                await decider.decide("default", stuck)
        finally:
            release.set()
            await decider.stop(5.0)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"decimals": 0}, "--round must be at least 1"),  # would turn 0.67 into 1.0
        ({"decimals": -1}, "--round must be at least 1"),  # would turn every probability into 0.0
        ({"timeout_s": 0.0}, "--timeout must be positive"),  # every request a 504
        ({"timeout_s": -1.0}, "--timeout must be positive"),
        ({"timeout_s": math.nan}, "--timeout must be positive"),
    ],
)
def test_settings_that_would_spoil_every_answer_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DeciderSettings(**settings)


def test_one_decimal_rounds_and_no_rounding_or_deadline_stay_possible() -> None:
    answer = FunctionBackend(lambda r: [[2 / 3, 1 / 3] for _ in r.questions])
    decider = loaded(answer, settings=DeciderSettings(decimals=1))
    assert decider.decide_now("default", request({"q": NOUL})).answers["q"]["noul"] == 0.7
    assert DeciderSettings(decimals=None, timeout_s=None).timeout_s is None


# ---- the canvas backend over a fake reader ---------------------------------------------------------


class ScriptedReader:
    """Gives each slot's first label log-probability `top` and the others `rest`, per question key in the canvas.

    Records every call, so a test sees how reads were batched.
    """

    def __init__(self, unsure_labels: int) -> None:
        self.calls: list[int] = []
        self.unsure_labels = unsure_labels  # slots with this many labels read as uniform (uncertain)

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        self.calls.append(len(reads))
        out = []
        for read in reads:
            slots = []
            for slot in read.slots:
                if len(slot.label_ids) == self.unsure_labels:
                    slots.append(SlotLogProbs(tuple(-2.0 for _ in slot.label_ids)))
                else:
                    slots.append(SlotLogProbs((-0.05, *(-5.0 for _ in slot.label_ids[1:]))))
            out.append(slots)
        return out


def canvas_decider(tokenizer: HFTokenizer, reader: ScriptedReader) -> Decider:
    card = ModelCard("canvas", "a canvas backend over a scripted reader", "2026-01-01")
    runtime = CanvasRuntime(reader, tokenizer, canvas_length=64, max_positions=None, fingerprint="sha256:0")
    return loaded(CanvasBackend(card, lambda: runtime))


def test_uncertain_questions_alone_are_read_again_and_reads_are_counted(tokenizer: HFTokenizer) -> None:
    reader = ScriptedReader(unsure_labels=3)
    decider = canvas_decider(tokenizer, reader)
    decision = decider.decide_now("canvas", request({"money": NOUL, "team": CHOICE}, diagnostics=True, seed=1))
    # One call: the canvas's first read and its three re-reads read ahead (samples "auto": at most
    # 4 reads), of which the sure question files one and the unsure one all four.
    assert reader.calls == [4]
    assert decision.reads == (1, 4)  # typed counts, in question order, for /metrics
    team = decision.answers["team"]
    assert team["diagnostics"]["reads"] == 4 and team["probabilities"] == pytest.approx(
        {"billing": 1 / 3, "tech": 1 / 3, "sales": 1 / 3}
    )
    assert decision.answers["money"]["diagnostics"]["reads"] == 1
    assert decision.answers["money"]["noul"] > 0.9


def test_a_fixed_sample_count_reads_every_question_that_often_in_one_call(tokenizer: HFTokenizer) -> None:
    reader = ScriptedReader(unsure_labels=3)
    decider = canvas_decider(tokenizer, reader)
    decision = decider.decide_now("canvas", request({"money": NOUL, "team": CHOICE}, samples=3, seed=1))
    assert reader.calls == [3] and decision.reads == (3, 3)


def test_a_canvas_jobs_cost_is_its_prompt_and_first_reads(tokenizer: HFTokenizer) -> None:
    decider = canvas_decider(tokenizer, ScriptedReader(unsure_labels=0))
    backend = canvas_backend(decider)
    job = backend.prepare(request({"money": NOUL, "team": CHOICE}, samples=3))
    canvases = sum(len(canvas.ids) for canvas in job.plan.canvases)
    assert backend.cost(job) == JobCost(job.plan.prompt_tokens + 3 * canvases, 0)
