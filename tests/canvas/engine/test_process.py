"""The engine in a process of its own (`--engine-process`, the default on a GPU): the same reads and thoughts as
in process, callers who leave stop its work, a dead engine process is a 503 and a health problem."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import eventually, post, serve_cli
from reference import assert_same_read, mixed_reads

from canvasread.canvas.engine.client import EngineClient
from canvasread.canvas.engine.launch import EngineUnloadable
from canvasread.canvas.engine.loader import load_checkpoint
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.engine.thinker import GenerateThinker
from canvasread.canvas.reader import CanvasRead
from canvasread.canvas.thinker import ThoughtRequest
from canvasread.errors import NotReady

SETTINGS = EngineSettings(process=True)


@pytest.fixture(scope="module")
def engine(tiny_thinking_checkpoint: Path) -> Iterator[EngineClient]:
    """The thinking checkpoint (a 32-token canvas, 2 steps a block), so a thought costs a few passes."""
    client = EngineClient.start(str(tiny_thinking_checkpoint), SETTINGS)
    yield client
    client.close()


@pytest.fixture(scope="module")
def model(tiny_thinking_checkpoint: Path) -> Any:
    """The same checkpoint loaded in this process, to compare with."""
    return load_checkpoint(str(tiny_thinking_checkpoint)).model


def test_reads_through_the_engine_process_equal_reads_in_process(engine: EngineClient, model: Any) -> None:
    reads = mixed_reads(int(model.config.text_config.vocab_size))
    got = engine.read(reads)
    want = InProcessReader(FusedRunner(model)).read(reads)
    for read, ours, theirs in zip(reads, got, want, strict=True):
        assert_same_read(read, ours, theirs)
    assert engine.counters()["reads"] >= len(reads)


def test_a_thought_through_the_engine_process_is_generate(engine: EngineClient, model: Any) -> None:
    request = ThoughtRequest((2, 105, 2364, 107, 105, 4368, 107, 100, 45518, 107), 40, (101, 106), seed=4)
    [ours] = engine.think([request])
    [theirs] = GenerateThinker(model, pad_id=0).think([request])
    assert ours is not None and theirs is not None and ours.token_ids == theirs.token_ids


def test_a_caller_who_left_stops_the_engine_process_between_passes(engine: EngineClient, model: Any) -> None:
    [read] = mixed_reads(int(model.config.text_config.vocab_size))[:1]
    many = [replace(read, steps=8, seed=n) for n in range(40)]
    before = engine.counters()["passes"]
    engine.read(many, lambda _: True)
    assert engine.counters()["passes"] - before < 8, "told between passes, the engine stops before its 8 steps"


def test_a_caller_gone_before_the_call_costs_the_engine_process_no_pass(engine: EngineClient, model: Any) -> None:
    """Items whose callers left before the call was sent (a thought's caller gone before its reads) travel with
    the call, so the engine never admits them; news the engine got before the call would have been lost."""
    [read] = mixed_reads(int(model.config.text_config.vocab_size))[:1]
    before = engine.counters()["passes"]
    for attempt in range(5):
        assert engine.read([replace(read, steps=4, seed=attempt)], lambda _: True) == [[]]
    assert engine.counters()["passes"] == before


def test_a_checkpoint_the_engine_process_cannot_load_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(EngineUnloadable) as failed:
        EngineClient.start(str(tmp_path), SETTINGS)
    assert "\n" not in str(failed.value) and str(failed.value)


def test_a_dead_engine_process_is_a_503_until_it_has_started_again(
    engine: EngineClient, model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed (out of memory, say), the engine's death is logged at ERROR and its calls answer 503; a new engine
    process loads in its place and answers as the old one did."""
    [read] = mixed_reads(int(model.config.text_config.vocab_size))[:1]
    [before] = engine.read([read])
    dead = engine.pid
    assert dead is not None and engine.health_problem() is None
    os.kill(dead, signal.SIGKILL)
    eventually(lambda: engine.health_problem() is not None, what="the death noticed")
    assert "exit code -9" in str(engine.health_problem()) and "starting again" in str(engine.health_problem())
    with pytest.raises(NotReady):  # the new engine waits a second before it loads: it cannot answer yet
        engine.read([read])
    [logged] = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert "exit code -9" in logged.getMessage() and "starting again" in logged.getMessage()
    eventually(lambda: engine.health_problem() is None, what="the engine started again", timeout=120)
    assert engine.pid not in (None, dead)
    assert engine.counters()["kv_store_free_pages"] == engine.ready.pages, "a store of the first one's pages"
    [after] = engine.read([read])
    assert_same_read(read, after, before)


def test_closing_ends_the_engine_process_quietly(
    tiny_thinking_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = EngineClient.start(str(tiny_thinking_checkpoint), SETTINGS)
    client.close()
    eventually(lambda: client.health_problem() is not None, what="the end noticed")
    assert "has ended" in str(client.health_problem()) and "starting again" not in str(client.health_problem())
    with pytest.raises(NotReady):
        client.read([CanvasRead((2, 3, 4), 0, (5, 6, 7), ())])
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


def test_serve_with_the_engine_process_answers_over_http(tiny_thinking_checkpoint: Path) -> None:
    body = {"model": "default", "state": "Charged twice.", "questions": {"r": {"type": "noul", "instructions": "?"}}}
    with serve_cli("--model", str(tiny_thinking_checkpoint), "--engine-process") as base:
        answer = post(base, {**body, "seed": 3}).json()
        assert 0.0 <= answer["answers"]["r"]["noul"] <= 1.0
