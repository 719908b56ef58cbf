"""Fused passes over the KV store: rows of different prompts, prefixes, lengths and steps share one pass."""

from __future__ import annotations

from typing import Any

from reference import assert_same_read, mixed_reads, tiny_model

from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.settings import Buckets
from canvasread.canvas.reader import CanvasRead
from canvasread.decide import Decider


def test_mixed_prompts_in_one_pass_equal_each_read_alone(tiny_decider: Decider) -> None:
    model = tiny_model(tiny_decider)
    reads = mixed_reads(int(model.config.text_config.vocab_size))
    together = InProcessReader(FusedRunner(model))
    got = together.read(reads)
    assert together.counters()["passes"] == 3  # all first reads in one pass, then the two later steps
    for read, result in zip(reads, got, strict=True):
        [alone] = InProcessReader(FusedRunner(model)).read([read])
        assert_same_read(read, result, alone)


def test_cached_prompts_and_prefixes_read_as_fresh_ones(tiny_decider: Decider) -> None:
    model = tiny_model(tiny_decider)
    reads = mixed_reads(int(model.config.text_config.vocab_size))
    reader = InProcessReader(FusedRunner(model))
    first = reader.read(reads)
    encoded = reader.counters()["prompt_tokens_encoded"]
    again = reader.read(reads)
    assert reader.counters()["prompt_tokens_encoded"] == encoded  # every prompt came from the store
    assert reader.counters()["prompt_cache_hits"] == 6
    for read, a, b in zip(reads, first, again, strict=True):
        assert_same_read(read, a, b)


def test_a_long_prompt_is_encoded_in_rows_over_passes_and_reads_as_one(tiny_decider: Decider) -> None:
    model = tiny_model(tiny_decider)
    [read] = mixed_reads(int(model.config.text_config.vocab_size))[3:4]
    long = CanvasRead(read.prompt_ids * 4, 0, read.canvas_ids, read.slots)
    small = InProcessReader(FusedRunner(model, buckets=Buckets((64, 128))))
    [chunked] = small.read([long])
    assert small.counters()["passes"] >= 3
    [whole] = InProcessReader(FusedRunner(model)).read([long])
    assert_same_read(long, chunked, whole)


def test_a_store_too_small_evicts_the_cache_and_still_reads(tiny_decider: Decider) -> None:
    model = tiny_model(tiny_decider)
    reads = mixed_reads(int(model.config.text_config.vocab_size))
    runner = FusedRunner(model)
    per_prompt = max(len(r.prompt_ids) for r in reads) + 16
    from canvasread.canvas.engine.kvstore import KVStore

    shapes = runner.stack.kv_shapes()
    budget = 7 * per_prompt * KVStore.bytes_per_token(shapes, runner.stack.embed.weight.dtype)
    reader = InProcessReader(runner, cache_bytes=budget)
    for read in reads:
        reader.read([read])
    assert reader.counters()["kv_cache_entries"] < 2 * len(reads)
    [result] = reader.read(reads[:1])
    [fresh] = InProcessReader(FusedRunner(model)).read(reads[:1])
    assert_same_read(reads[0], result, fresh)


def test_a_store_given_another_stores_budget_has_as_many_pages(tiny_decider: Decider) -> None:
    """How an engine started in a dead one's place keeps the page count the server plans with."""
    model = tiny_model(tiny_decider)
    first = InProcessReader(FusedRunner(model), cache_bytes=123_457)
    again = InProcessReader(FusedRunner(model), cache_bytes=first.store.budget)
    assert again.store.pages == first.store.pages and first.store.budget <= 123_457


def test_one_prompt_with_many_reads_does_not_fill_a_pass_while_another_waits(tiny_decider: Decider) -> None:
    """A request's 24 reads (samples times canvases) and another's one: the second is read in the first pass."""
    model = tiny_model(tiny_decider)
    reads = mixed_reads(int(model.config.text_config.vocab_size))
    busy, lone = reads[0], reads[2]  # two prompts of the same question set, of different lengths
    many = [CanvasRead(busy.prompt_ids, busy.prefix_length, busy.canvas_ids, busy.slots, seed=n) for n in range(24)]
    reader = InProcessReader(FusedRunner(model, buckets=Buckets((64, 128))))
    passes: list[list[int]] = []  # per pass: the prompt length each canvas row reads
    run = reader.runner.run

    def recording(rows: Any, store: Any) -> Any:
        passes.append([len(row.past) for row in rows if row.canvas])
        return run(rows, store)

    reader.runner.run = recording  # type: ignore[method-assign]
    results = reader.read([*many, lone])
    assert len(passes) >= 3, "24 reads of 16 tokens need several 128-token passes"
    assert len(lone.prompt_ids) in passes[0]  # not behind the 24 reads of the other prompt
    [alone] = InProcessReader(FusedRunner(model)).read([lone])
    assert_same_read(lone, results[-1], alone)


def test_flat_passes_equal_grouped_ones(tiny_decider: Decider) -> None:
    """The same mixed reads (two prefixes, a prompt of its own, later steps) with small passes attending flat (as
    a GPU's whole-pass graphs run them) and attending in groups (a CPU's default): the same distributions."""
    model = tiny_model(tiny_decider)
    reads = mixed_reads(int(model.config.text_config.vocab_size))
    flat = InProcessReader(FusedRunner(model, flat=True))
    grouped = InProcessReader(FusedRunner(model))
    for read, a, b in zip(reads, flat.read(reads), grouped.read(reads), strict=True):
        assert_same_read(read, a, b)
    assert flat.counters()["flat_passes"] == flat.counters()["passes"] == 3
    assert grouped.counters()["flat_passes"] == 0
    beyond = InProcessReader(FusedRunner(model, flat=True, buckets=Buckets(flat_past=(16,))))
    beyond.read(reads)
    assert beyond.counters()["flat_passes"] == 0  # every pass has more past keys than a flat one may hold
