"""Multi-step reads through the vLLM proxy, against the stand-in running vLLM 0.33's denoising loop with pins."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import canvas_backend
from vllm_standin import Standin, load_standin, running

from canvasread.canvas.reader import CanvasRead, Slot
from canvasread.canvas.vllm.reader import completion_body
from canvasread.canvas.vllm.settings import VllmSettings
from canvasread.catalog import open_decider
from canvasread.decide import Decider
from canvasread.errors import InvalidRequest
from canvasread.wire import parse_request

STATE = {"ticket": "I was charged twice for order 1182 — please refund me.", "channel": "email"}
QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "charges", "tech": None}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]},
}


@pytest.fixture(scope="module")
def upstream(tiny_wide_checkpoint: Path) -> Iterator[tuple[Decider, Standin, str]]:
    served = load_standin(str(tiny_wide_checkpoint), served_name="dgemma")
    with running(served) as base:
        settings = VllmSettings(urls=(base,), tokenizer=str(tiny_wide_checkpoint), canvas_length=256)
        decider = open_decider((), wings=[settings])
        yield decider, served, base
        backend = canvas_backend(decider)
        backend.close()


def test_steps_reach_vllm_as_max_steps_with_every_other_position_pinned(upstream: tuple[Decider, Standin, str]) -> None:
    decider, standin, _ = upstream
    backend = canvas_backend(decider)
    body = {"seed": 4, "samples": 1, "diagnostics": True}
    job = backend.prepare(parse_request({"model": "dgemma", "state": STATE, "questions": QUESTIONS, "steps": 3})[1])
    before = len(standin.requests)
    three = decider.ask(STATE, QUESTIONS, steps=3, **body)["answers"]
    sent = standin.requests[before:]
    assert len(sent) == len(job.plan.canvases) == 1
    xargs = sent[0]["vllm_xargs"]
    slots = {slot.position for planned in job.plan.questions for slot in planned.slots}
    assert xargs["diffusion_max_steps"] == 3 and xargs["diffusion_read_only"] is True
    assert xargs["diffusion_pinned"] == [p for p in range(len(xargs["diffusion_seed_canvas"])) if p not in slots]
    assert all(type(p) is int for p in xargs["diffusion_pinned"])
    assert standin.steps_taken[-1] == 3  # a random checkpoint never converges early
    one = decider.ask(STATE, QUESTIONS, steps=1, **body)["answers"]
    assert "diffusion_pinned" not in standin.requests[-1]["vllm_xargs"]
    assert {a["diagnostics"]["steps"] for a in three.values()} == {3}  # type: ignore[index]
    assert three["team"]["probabilities"] != one["team"]["probabilities"]  # type: ignore[index]
    assert sum(three["team"]["probabilities"].values()) == pytest.approx(1.0)  # type: ignore[index,union-attr]


def test_a_multi_step_read_past_128_label_ids_is_a_422_at_steps(upstream: tuple[Decider, Standin, str]) -> None:
    decider, standin, _ = upstream
    wide = {
        "intent": {"type": "choice", "instructions": "Which?", "criteria": {f"intent_{i}": None for i in range(200)}}
    }
    before = len(standin.requests)
    with pytest.raises(InvalidRequest) as refused:
        decider.ask(STATE, wide, steps=2, samples=1)
    assert refused.value.problems[0].loc == ("steps",)
    assert "128" in refused.value.problems[0].msg
    request = parse_request({"model": "dgemma", "state": STATE, "questions": wide, "steps": 2})[1]
    with pytest.raises(InvalidRequest):  # refused by `prepare`, so it never reaches a batch
        decider.served[0].backend.prepare(request)
    assert len(standin.requests) == before  # refused before anything is sent
    assert decider.ask(STATE, wide, steps=1, samples=1)["answers"]["intent"]["type"] == "choice"  # type: ignore[index]


def test_the_standin_holds_pins_as_vllm_validates_them(upstream: tuple[Decider, Standin, str]) -> None:
    _, _, base = upstream
    read = CanvasRead((2, 105, 2364), 0, (7,) * 16, (Slot(0, (1294, 4443)),), steps=2, seed=1)
    body = completion_body("dgemma", read, (1294, 4443))  # what the reader sends: pins 1..15
    assert body["vllm_xargs"]["diffusion_pinned"] == list(range(1, 16))
    url = base + "/v1/completions"
    assert httpx.post(url, json=body, timeout=60).status_code == 200
    for pins, message in (([16], "inside the canvas"), ([-1], "inside the canvas"), ([True], "diffusion_pinned")):
        broken = {**body, "vllm_xargs": {**body["vllm_xargs"], "diffusion_pinned": pins}}
        refused = httpx.post(url, json=broken, timeout=60)
        assert refused.status_code == 400 and message in refused.json()["error"]["message"], pins
