"""Thoughts written by the engine's own passes: transformers' `generate`, token for token, beside other reads.

The reference is `GenerateThinker` (transformers' `generate` on the same
model, seeded). The engine writes the same blocks in its fused passes: the
prompt encoded in the store, each denoising step a canvas row
self-conditioned on the last, each block but the last encoded after the
prompt. In fp32 on the tiny thinking checkpoint (canvas 32, 2 denoising
steps a block) every token must be `generate`'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from canvasread.canvas.backend import CanvasRuntime
from canvasread.canvas.engine.factory import load_runtime
from canvasread.canvas.engine.generation import Generation
from canvasread.canvas.engine.reader import EngineThinker, InProcessReader
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.engine.thinker import GenerateThinker
from canvasread.canvas.reader import CanvasRead, Slot
from canvasread.canvas.thinker import ThoughtChannel, ThoughtRequest
from canvasread.canvas.tokenizer import HFTokenizer


@pytest.fixture(scope="module")
def runtime(tiny_thinking_checkpoint: Path) -> CanvasRuntime:
    return load_runtime(str(tiny_thinking_checkpoint), EngineSettings(), naive=False)


@pytest.fixture(scope="module")
def model(runtime: CanvasRuntime) -> Any:
    assert isinstance(runtime.reader, InProcessReader)
    return runtime.reader.runner.model


def thought_requests(tokenizer: HFTokenizer, tokens: int, seeds: tuple[int, ...]) -> list[ThoughtRequest]:
    """Thought prompts as the canvas backend asks them: a chat prompt left open in the thought channel."""
    channel = ThoughtChannel.of(tokenizer)
    assert channel is not None
    requests = []
    for n, seed in enumerate(seeds):
        text = f"<bos><|turn>user\nTicket {n}: charged twice for order {1180 + n}.<turn|>\n<|turn>model\n"
        ids = (*tokenizer.encode(text + "<|channel>thought\n"), channel.close_id)
        prompt_ids = ids[:-1]
        requests.append(ThoughtRequest(prompt_ids, tokens, channel.stop_ids, seed, prefix_length=3))
    return requests


def never_stopping(request: ThoughtRequest) -> ThoughtRequest:
    """The same request with no stop ids, so the thought runs its whole length (every block, every encode)."""
    return ThoughtRequest(
        request.prompt_ids, request.max_tokens, (), request.seed, request.images, request.prefix_length
    )


@pytest.mark.parametrize("flat", [False, True], ids=["grouped", "flat"])
def test_a_thought_is_generate_token_for_token(model: Any, tokenizer: HFTokenizer, flat: bool) -> None:
    """Three blocks of 32 (two of them encoded after the prompt), and a thought cut inside its first block; with
    passes attending in groups (a CPU's default) and flat (as a GPU's whole-pass graphs run them)."""
    runner = FusedRunner(model, flat=flat)
    engine = EngineThinker(InProcessReader(runner))
    reference = GenerateThinker(model, pad_id=tokenizer.pad_id)
    long = [never_stopping(request) for request in thought_requests(tokenizer, 80, (7,))]
    short = thought_requests(tokenizer, 12, (9,))
    for request in [*long, *short]:
        [ours] = engine.think([request])
        [theirs] = reference.think([request])
        assert ours is not None and theirs is not None
        assert ours.token_ids == theirs.token_ids and ours.closed == theirs.closed
    assert len(ours.token_ids) <= 12
    assert (runner.counters()["flat_passes"] > 0) == flat


def test_thoughts_written_together_equal_each_alone(model: Any, tokenizer: HFTokenizer) -> None:
    """Batched thoughts share passes (one canvas row each a pass) and still draw only from their own seeds."""
    requests = [never_stopping(request) for request in thought_requests(tokenizer, 40, (1, 2, 3))]
    reader = InProcessReader(FusedRunner(model))
    together = EngineThinker(reader).think(requests)
    passes = reader.counters()["passes"]
    alone = [EngineThinker(InProcessReader(FusedRunner(model))).think([request])[0] for request in requests]
    assert [t.token_ids for t in together if t] == [t.token_ids for t in alone if t]
    assert len({t.token_ids for t in together if t}) == 3
    # two blocks of two steps each, the second block's encoding sharing the pass of its first step: 4 passes
    assert passes == 4


def test_a_thought_whose_caller_left_stops_between_passes(model: Any, tokenizer: HFTokenizer) -> None:
    [request] = [never_stopping(request) for request in thought_requests(tokenizer, 320, (5,))]
    reader = InProcessReader(FusedRunner(model))
    written = EngineThinker(reader).think([request], lambda _: reader.counters()["passes"] >= 3)
    assert written == [None]
    assert reader.counters()["passes"] == 3, "ten blocks of two steps, stopped after the third pass"
    reader.cache.make_room(reader.store.pages)
    assert reader.store.free_pages == reader.store.pages, "the thought's prompt and reserved blocks are let go"


def test_a_long_thought_does_not_hold_a_read_of_another_request(model: Any, tokenizer: HFTokenizer) -> None:
    """While one caller's thought runs its twenty passes, another's read is answered in the pass after it
    arrives: the loop interleaves them, and the thought is still being written when the read returns."""
    [request] = [never_stopping(request) for request in thought_requests(tokenizer, 320, (6,))]
    reader = InProcessReader(FusedRunner(model))
    thinker = EngineThinker(reader)
    entered, release = threading.Event(), threading.Event()
    run = reader.runner.run

    def gated(rows: Any, store: Any) -> Any:
        if reader.counters()["passes"] == 1:  # the thought's second pass waits until the read has arrived
            entered.set()
            assert release.wait(60)
        return run(rows, store)

    reader.runner.run = gated  # type: ignore[method-assign]
    submitted = threading.Event()
    submit = reader.loop.submit

    def recorded(work: Any) -> None:
        submit(work)
        submitted.set()

    reader.loop.submit = recorded  # type: ignore[method-assign]
    thought: list[Any] = []
    thinking = threading.Thread(target=lambda: thought.extend(thinker.think([request])))
    thinking.start()
    assert entered.wait(60)
    vocab = int(model.config.text_config.vocab_size)
    canvas = tuple(range(100, 116))
    read = CanvasRead(request.prompt_ids[:20], 0, canvas, (Slot(3, (5, 6)),))
    answered: list[Any] = []
    reading = threading.Thread(target=lambda: answered.extend(reader.read([read])))
    submitted.clear()
    reading.start()
    assert submitted.wait(60)
    release.set()
    reading.join(60)
    passes_at_answer = reader.counters()["passes"]
    assert answered and len(answered[0]) == 1 and vocab > 0
    assert passes_at_answer <= 3, "the read is answered in the pass after it arrived"
    assert not thought, "the thought is still being written"
    thinking.join(120)
    assert thought and thought[0] is not None and len(thought[0].token_ids) == 320
    assert reader.counters()["passes"] >= 20


def write_beside_a_read(
    reader: InProcessReader,
    requests: list[ThoughtRequest],
    read: CanvasRead,
    record: Callable[[Any], None],
    answered: threading.Event | None = None,
) -> tuple[list[Any], list[tuple[float, float]]]:
    """Write `requests`' thoughts on `reader` while another caller reads `read`, which arrives mid-thought: the
    thoughts' second pass waits until it has been submitted. `record` sees each pass's rows before it runs, and
    `answered` is set once the read's caller has its answer. The thoughts, and when each pass started and ended."""
    entered, release, submitted = threading.Event(), threading.Event(), threading.Event()
    times: list[tuple[float, float]] = []
    run, submit = reader.runner.run, reader.loop.submit

    def gated(rows: Any, store: Any) -> Any:
        if len(times) == 1:  # the thoughts' second pass waits until the read has arrived
            entered.set()
            assert release.wait(60)
        record(rows)
        started = time.monotonic()
        outputs = run(rows, store)
        times.append((started, time.monotonic()))
        return outputs

    def recorded(work: Any) -> None:
        submit(work)
        submitted.set()

    def reads() -> None:
        reader.read([read])
        if answered is not None:
            answered.set()

    reader.runner.run = gated  # type: ignore[method-assign]
    reader.loop.submit = recorded  # type: ignore[method-assign]
    thoughts: list[Any] = []
    thinking = threading.Thread(target=lambda: thoughts.extend(EngineThinker(reader).think(requests)))
    thinking.start()
    assert entered.wait(60)
    submitted.clear()
    reading = threading.Thread(target=reads)
    reading.start()
    assert submitted.wait(60)
    release.set()
    reading.join(60)
    thinking.join(120)
    return thoughts, times


def test_while_reads_come_only_the_oldest_thought_takes_a_step(
    model: Any, tokenizer: HFTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two thoughts step together, a canvas row each a pass; the pass that reads another caller's canvas takes
    only the older thought's step, so the thoughts in flight do not lengthen the pass a read waits on. Then the
    thoughts wait for the length of that pass (another read may be on its way) and both step again. The read's
    caller is answered before the thought in its pass takes its draw. Both thoughts still come out as each
    written alone (each draws from its own seed, whatever the passes)."""
    requests = [never_stopping(request) for request in thought_requests(tokenizer, 96, (11, 12))]
    reader = InProcessReader(FusedRunner(model))
    answered, drawn_after_answer = threading.Event(), []
    passes: list[tuple[int, bool]] = []  # per pass: thought canvas rows, and whether a read's slots were in it
    advance = Generation.advance

    def after_the_read(generation: Generation, logits: Any, embed: Any) -> None:
        if passes[-1][1] and not drawn_after_answer:  # the first draw in the read's pass
            drawn_after_answer.append(answered.wait(30))
        advance(generation, logits, embed)

    def record(rows: Any) -> None:
        passes.append((sum(row.canvas_hidden for row in rows), any(row.label_ids for row in rows)))

    monkeypatch.setattr(Generation, "advance", after_the_read)
    read = CanvasRead(requests[0].prompt_ids[:20], 0, tuple(range(100, 116)), (Slot(3, (5, 6)),))
    thoughts, times = write_beside_a_read(reader, requests, read, record, answered)
    assert drawn_after_answer == [True], "the read was answered before the thought beside it drew"
    assert passes[0] == (2, False), "alone, both thoughts step in one pass"
    [read_pass] = [n for n, (_, read_in) in enumerate(passes) if read_in]
    assert passes[read_pass : read_pass + 2] == [(1, True), (2, False)]
    (started, ended), (resumed, _) = times[read_pass : read_pass + 2]
    assert resumed >= ended + (ended - started), "the thoughts waited a reading pass's length for the next read"
    alone = [EngineThinker(InProcessReader(FusedRunner(model))).think([request])[0] for request in requests]
    assert [t.token_ids for t in thoughts] == [t.token_ids for t in alone if t]


def test_with_no_share_a_thought_steps_only_in_passes_without_reads(model: Any, tokenizer: HFTokenizer) -> None:
    """`thought_share=0`: a read of three denoising steps that arrives while the thought's second pass runs has
    the next three passes to itself (its prompt's row with its first step), and the thought's second block starts
    in the pass after the last; it still comes out as written alone."""
    [request] = [never_stopping(request) for request in thought_requests(tokenizer, 64, (13,))]
    reader = InProcessReader(FusedRunner(model), thought_share=0.0)
    passes: list[tuple[int, int]] = []  # per pass: thought canvas rows (32 tokens), read canvas rows (16)

    def record(rows: Any) -> None:
        canvases = [len(row.ids) for row in rows if row.canvas]
        passes.append((canvases.count(32), canvases.count(16)))

    read = CanvasRead(request.prompt_ids[:20], 0, tuple(range(100, 116)), (Slot(3, (5, 6)),), steps=3, seed=4)
    thoughts, _ = write_beside_a_read(reader, [request], read, record)
    assert passes == [(1, 0), (1, 0), (0, 1), (0, 1), (0, 1), (1, 0), (1, 0)]
    [alone] = EngineThinker(InProcessReader(FusedRunner(model))).think([request])
    assert thoughts and alone is not None and thoughts[0].token_ids == alone.token_ids
