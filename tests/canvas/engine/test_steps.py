"""Pinned multi-step reads in process, against transformers' own DiffusionGemma denoising loop (fp32).

The reference is `reference.transformers_denoising`: transformers' own
`_denoising_step` loop, prepared by transformers' own functions, with one
hook (its renoise is followed by the pin) and torch's generator seeded with
the read's seed where the engine's per-read generator starts.

The canvases must match token for token at every step (the same samples,
acceptances and renoise), and the slots' distributions to float noise: the
engine's first pass is transformers' to 2e-5 in the logits, and this random
checkpoint (std 0.3) amplifies such noise about tenfold a step through
self-conditioning (transformers' own loop, its logits nudged by 1e-6, moves
its step-3 distributions by 6e-5), so three steps are held to 2e-4.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from helpers import canvas_backend, loaded_runtime
from reference import transformers_denoising

from canvasread.canvas.backend import CanvasBackend
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.steps import Denoising
from canvasread.canvas.reader import CanvasRead
from canvasread.canvas.readout import slot_reading
from canvasread.decide import Decider
from canvasread.wire import parse_request

STATE = {"ticket": "I was charged twice for order 1182 — please refund me.", "channel": "email"}
QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "charges", "tech": None}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]},
}


def transformers_read(model: Any, read: CanvasRead) -> tuple[list[list[float]], list[list[int]]]:
    """The slots' label log-probabilities after transformers' loop, and the canvas each denoising step left."""
    logprobs, canvases = transformers_denoising(model, read)
    return [logprobs[slot.position, list(slot.label_ids)].tolist() for slot in read.slots], canvases


def engine(decider: Decider) -> tuple[CanvasBackend, InProcessReader]:
    backend = canvas_backend(decider)
    reader = loaded_runtime(backend).reader
    assert isinstance(reader, InProcessReader)
    return backend, reader


def planned_reads(decider: Decider, monkeypatch: pytest.MonkeyPatch, **extensions: Any) -> list[CanvasRead]:
    """The reads the backend hands its reader for one request (recorded on the way through)."""
    backend, reader = engine(decider)
    seen: list[CanvasRead] = []
    original = reader.read

    def recording(reads: Any, *gone: Any) -> Any:
        seen.extend(reads)
        return original(reads, *gone)

    monkeypatch.setattr(reader, "read", recording)
    request = parse_request({"model": "default", "state": STATE, "questions": QUESTIONS, **extensions})[1]
    backend.decide([backend.prepare(request)])
    monkeypatch.undo()
    return seen


def label_logprobs(reader: InProcessReader, reads: list[CanvasRead]) -> list[list[list[float]]]:
    return [[list(slot.label_logprobs) for slot in result] for result in reader.read(reads)]


def test_three_steps_equal_transformers_own_loop_with_the_same_pins_and_noise(
    tiny_decider: Decider, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, reader = engine(tiny_decider)
    model = reader.runner.model
    [read] = planned_reads(tiny_decider, monkeypatch, steps=3, samples=1, seed=17)
    assert read.steps == 3 and len(read.slots) == 3
    trajectory: list[list[int]] = []
    advance = Denoising.advance

    def recorded(state: Denoising, *args: Any) -> None:
        advance(state, *args)
        trajectory.append(state.canvas_ids())

    monkeypatch.setattr(Denoising, "advance", recorded)
    before = reader.counters()
    [got] = label_logprobs(reader, [read])
    after = reader.counters()
    want, canvases = transformers_read(model, read)
    assert trajectory == canvases and len(canvases) == 2
    assert any(canvas != list(read.canvas_ids) for canvas in canvases), "the slots should be resampled or renoised"
    for ours, theirs in zip(got, want, strict=True):
        assert ours == pytest.approx(theirs, rel=1e-4)
        assert slot_reading(ours).probabilities == pytest.approx(slot_reading(theirs).probabilities, abs=2e-4)
    assert after["denoising_steps"] - before["denoising_steps"] == 2
    assert after["encoder_runs"] - before["encoder_runs"] <= 1  # once at most (the prompt may be cached)
    [single] = label_logprobs(reader, [CanvasRead(read.prompt_ids, read.prefix_length, read.canvas_ids, read.slots)])
    moved = max(abs(a - b) for ours, one in zip(got, single, strict=True) for a, b in zip(ours, one, strict=True))
    assert moved > 1e-3, "two denoising steps before the read should move the slots' distributions"


def test_the_seed_picks_the_noise_and_the_same_seed_gives_the_same_numbers(
    tiny_decider: Decider, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, reader = engine(tiny_decider)
    [read] = planned_reads(tiny_decider, monkeypatch, steps=4, samples=1, seed=3)
    again = label_logprobs(reader, [read])
    assert label_logprobs(reader, [read]) == again
    other = CanvasRead(read.prompt_ids, read.prefix_length, read.canvas_ids, read.slots, steps=4, seed=read.seed + 1)
    assert label_logprobs(reader, [other]) != again
    assert again[0][0] == pytest.approx(transformers_read(reader.runner.model, read)[0][0], rel=1e-3)


def test_reads_of_different_steps_batched_together_equal_each_read_alone(
    tiny_decider: Decider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One call mixing steps 1, 2 and 3 over one shared prompt and a second prompt: batching changes nothing.

    Batched passes pad rows, so their logits move in the last float digits, and the steps amplify that (the
    module docstring): a row that read another's canvas or self-conditioning would be off by whole units.
    """
    _, reader = engine(tiny_decider)
    [base] = planned_reads(tiny_decider, monkeypatch, steps=2, samples=1, seed=8)
    [other] = planned_reads(tiny_decider, monkeypatch, steps=3, samples=1, seed=9)
    one = CanvasRead(base.prompt_ids, base.prefix_length, base.canvas_ids, base.slots, steps=1)
    prompt = (*other.prompt_ids[:-1], 107, other.prompt_ids[-1])
    fresh = CanvasRead(prompt, other.prefix_length, other.canvas_ids, other.slots, steps=3, seed=other.seed)
    mixed = [base, one, other, fresh]
    alone = [label_logprobs(reader, [read])[0] for read in mixed]
    together = label_logprobs(reader, mixed)
    for a, b in zip(alone, together, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x == pytest.approx(y, rel=1e-3)
    assert together[2] != together[3], "the two prompts differ by a token"


def plain(response: dict[str, Any]) -> dict[str, Any]:
    """The answers without their diagnostics (which carry timings)."""
    return {key: {k: v for k, v in answer.items() if k != "diagnostics"} for key, answer in response["answers"].items()}


def test_steps_through_the_live_server(tiny_server: str) -> None:
    body = {"model": "jev-latest", "state": STATE, "questions": QUESTIONS, "seed": 5, "samples": 1, "diagnostics": True}
    one = httpx.post(tiny_server + "/v1/systemone", json=body, timeout=120).json()
    three = httpx.post(tiny_server + "/v1/systemone", json={**body, "steps": 3}, timeout=120).json()
    again = httpx.post(tiny_server + "/v1/systemone", json={**body, "steps": 3}, timeout=120).json()
    assert plain(three) == plain(again)  # the same seed gives the same answers
    assert {a["diagnostics"]["steps"] for a in three["answers"].values()} == {3}
    assert {a["diagnostics"]["steps"] for a in one["answers"].values()} == {1}
    assert three["answers"]["team"]["probabilities"] != one["answers"]["team"]["probabilities"]
    assert sum(three["answers"]["team"]["probabilities"].values()) == pytest.approx(1.0)
    refused = httpx.post(tiny_server + "/v1/systemone", json={**body, "steps": 9}, timeout=60)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "steps"]


def test_one_step_takes_no_denoising_step_and_rereads_take_all_their_steps(tiny_decider: Decider) -> None:
    _, reader = engine(tiny_decider)
    before = reader.counters()["denoising_steps"]
    plain = tiny_decider.ask(STATE, QUESTIONS, seed=2, samples=2, diagnostics=True)["answers"]
    assert reader.counters()["denoising_steps"] == before  # steps 1: today's read-only step, nothing more
    stepped = tiny_decider.ask(STATE, QUESTIONS, seed=2, samples=2, steps=2, diagnostics=True)["answers"]
    assert reader.counters()["denoising_steps"] == before + 2  # two reads of the one canvas, one step each first
    for key, answer in stepped.items():
        details = answer["diagnostics"]  # type: ignore[index]
        assert (details["reads"], details["steps"]) == (2, 2), key
        assert plain[key]["diagnostics"]["steps"] == 1  # type: ignore[index]
