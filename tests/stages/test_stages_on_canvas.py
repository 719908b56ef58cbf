"""Stages and `alone` on the canvas backend: the tiny checkpoint in process and through the vLLM stand-in.

What is checked is what the model reads: the prompt tokens of a later stage
hold the earlier answer, and an `alone` question's canvas holds only it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import RecordingReader, canvas_backend, loaded_runtime
from vllm_standin import Standin, load_standin, running

from canvasread.canvas.backend import CanvasBackend
from canvasread.canvas.tokenizer import Tokenizer
from canvasread.canvas.vllm.settings import VllmSettings
from canvasread.catalog import open_decider
from canvasread.decide import Decider
from canvasread.wire import parse_request

STATE = {"ticket": "The export button crashes the app since the last update.", "channel": "email"}
STAGED = {
    "bug": {"type": "noul", "instructions": "Is this a bug report?"},
    "component": {
        "type": "choice",
        "instructions": "Which component is broken?",
        "criteria": {"ui": "buttons and screens", "export": None, "sync": None},
        "depends_on": ["bug"],
        "order": "rotate",
    },
    "severity": {"type": "score", "criteria": ["minor", "major", "blocking"], "depends_on": ["component"]},
}
ALONE = {
    "first": {"type": "noul", "instructions": "Is the customer polite?"},
    "lonely": {"type": "noul", "instructions": "Is this a bug report?", "alone": True},
    "third": {"type": "choice", "instructions": "Which channel?", "criteria": {"email": None, "chat": None}},
}


@pytest.fixture(scope="module")
def recorded(tiny_decider: Decider) -> tuple[Decider, RecordingReader, Tokenizer]:
    """The tiny checkpoint's loaded engine behind a reader that records what it reads."""
    runtime = loaded_runtime(canvas_backend(tiny_decider))
    reader = RecordingReader(runtime.reader)
    backend = CanvasBackend(tiny_decider.served[0].card, lambda: dataclasses.replace(runtime, reader=reader))
    decider = Decider([backend])
    decider.load()
    return decider, reader, runtime.tokenizer


@pytest.fixture(scope="module")
def proxy(tiny_wide_checkpoint: Path) -> Iterator[tuple[Decider, Standin]]:
    """Through the stand-in on the wide-window checkpoint, where vLLM's and transformers' windows agree."""
    served = load_standin(str(tiny_wide_checkpoint), served_name="dgemma")
    with running(served) as base:
        upstream = VllmSettings(urls=(base,), tokenizer=str(tiny_wide_checkpoint), canvas_length=256)
        decider = open_decider((), wings=[upstream])
        yield decider, served
        backend = canvas_backend(decider)
        backend.close()


def told(answer: dict[str, Any], key: str, instructions: str) -> str:
    """The line a later stage's prompt must hold for an earlier choice or noul answer."""
    if answer["type"] == "noul":
        said, p = ("yes", answer["noul"]) if answer["noul"] >= 0.5 else ("no", 1 - answer["noul"])
    else:
        said, p = answer["choice"], answer["probabilities"][answer["choice"]]
    return f"- `{key}` ({instructions}): {said}, probability {p:.2f}"


def numbers(answer: dict[str, Any]) -> list[float]:
    return [answer["noul"]] if answer["type"] == "noul" else list(answer["probabilities"].values())


def check_staged_prompts(answers: dict[str, Any], prompts: Sequence[str]) -> None:
    """One prompt per stage, in order; each later one holds the answer it depends on, in words."""
    assert len(prompts) == 3
    assert "Which component is broken?" not in prompts[0]
    assert told(answers["bug"], "bug", "Is this a bug report?") in prompts[1]
    assert "`severity`" not in prompts[1]
    assert told(answers["component"], "component", "Which component is broken?") in prompts[2]
    assert [answers[key]["diagnostics"]["stage"] for key in STAGED] == [0, 1, 2]


def test_later_stages_read_the_earlier_answers_in_process(recorded: tuple[Decider, RecordingReader, Tokenizer]) -> None:
    decider, reader, tokenizer = recorded
    before = len(reader.reads)
    answers = decider.ask(STATE, STAGED, seed=7, samples=1, diagnostics=True)["answers"]
    reads = reader.reads[before:]
    assert len(reads) == 3  # one canvas a stage (the three rotations of `component` share one)
    prompts = list(dict.fromkeys(tokenizer.decode(read.prompt_ids) for read in reads))
    check_staged_prompts(answers, prompts)  # type: ignore[arg-type]


def test_later_stages_read_the_earlier_answers_through_vllm(
    proxy: tuple[Decider, Standin], tiny_wide_decider: Decider
) -> None:
    decider, served = proxy
    before = len(served.requests)
    remote = decider.ask(STATE, STAGED, seed=7, samples="auto", diagnostics=True)["answers"]
    runtime = loaded_runtime(canvas_backend(tiny_wide_decider))
    prompts = list(dict.fromkeys(runtime.tokenizer.decode(r["prompt"]) for r in served.requests[before:]))
    check_staged_prompts(remote, prompts)  # type: ignore[arg-type]
    local = tiny_wide_decider.ask(STATE, STAGED, seed=7, samples="auto", diagnostics=True)["answers"]
    for key in STAGED:  # the same stages, re-reads and rotations through either reader
        got, want = remote[key], local[key]  # type: ignore[index]
        assert got["diagnostics"]["reads"] == want["diagnostics"]["reads"], key
        assert numbers(got) == pytest.approx(numbers(want), abs=1e-5), key


def test_an_alone_question_gets_a_canvas_of_its_own(tiny_decider: Decider) -> None:
    backend = canvas_backend(tiny_decider)
    plan = backend.prepare(parse_request({"model": "m", "state": STATE, "questions": ALONE})[1]).plan
    assert [canvas.questions for canvas in plan.canvases] == [(0,), (1,), (2,)]
    shared = {key: {k: v for k, v in q.items() if k != "alone"} for key, q in ALONE.items()}
    together = backend.prepare(parse_request({"model": "m", "state": STATE, "questions": shared})[1]).plan
    assert [canvas.questions for canvas in together.canvases] == [(0, 1, 2)]


def test_an_alone_question_is_read_alone_in_process(recorded: tuple[Decider, RecordingReader, Tokenizer]) -> None:
    decider, reader, tokenizer = recorded
    before = len(reader.reads)
    decider.ask(STATE, ALONE, seed=2, samples=1)
    canvases = [tokenizer.decode(read.canvas_ids) for read in reader.reads[before:]]
    assert len(canvases) == 3
    [lonely] = [text for text in canvases if "lonely:" in text]
    assert "first:" not in lonely and "third:" not in lonely


def test_an_alone_question_is_read_alone_through_vllm(proxy: tuple[Decider, Standin], tiny_decider: Decider) -> None:
    decider, served = proxy
    before = len(served.requests)
    decider.ask(STATE, ALONE, seed=2, samples=1)
    runtime = loaded_runtime(canvas_backend(tiny_decider))
    sent = served.requests[before:]
    canvases = [runtime.tokenizer.decode(r["vllm_xargs"]["diffusion_seed_canvas"]) for r in sent]
    assert len(canvases) == 3
    [lonely] = [text for text in canvases if "lonely:" in text]
    assert "first:" not in lonely and "third:" not in lonely
