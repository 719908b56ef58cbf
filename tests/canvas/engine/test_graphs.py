"""Captured passes on a CPU: the graphs' bookkeeping with a stand-in whose replay runs the recorded work again.

A CUDA graph replays its kernels over the memory it was recorded on, so a
replay sees only what was copied into that memory before it. `Rerun` keeps
that contract on a CPU: its replay runs the recorded work again over the same
buffers, inputs and store. Reads through replayed pieces and replayed flat
passes must equal reads run eagerly; a pass whose inputs were not copied into
the recorded ones would read the last pass's rows instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from reference import assert_same_read, mixed_reads, tiny_model

from canvasread.canvas.engine.graphs import Graph, PieceGraphs
from canvasread.canvas.engine.kvstore import KVStore
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.rows import NO_PAST, Row
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.settings import Buckets
from canvasread.decide import Decider

BUCKETS = Buckets((16, 32, 64, 128, 256, 512))


@dataclass
class Rerun:
    run: Callable[[], None]

    def replay(self) -> None:
        self.run()


class Replaying(PieceGraphs):
    """`PieceGraphs` recording `Rerun`s instead of CUDA graphs."""

    def record(self, run: Callable[[], None]) -> Graph:
        return Rerun(run)


def replaying_runner(model: object, *, flat: bool) -> FusedRunner:
    runner = FusedRunner(model, buckets=BUCKETS, flat=flat)
    runner.graphs = Replaying()
    runner.warm_up()  # records every bucket's pieces
    return runner


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "grouped"])
def test_replayed_passes_read_as_passes_run_eagerly(tiny_decider: Decider, flat: bool) -> None:
    model = tiny_model(tiny_decider)
    reads = mixed_reads(int(model.config.text_config.vocab_size))
    runner = replaying_runner(model, flat=flat)
    replayed = InProcessReader(runner)  # records every flat shape over its store
    eager = InProcessReader(FusedRunner(model, buckets=BUCKETS))
    for read, a, b in zip(reads, replayed.read(reads), eager.read(reads), strict=True):
        assert_same_read(read, a, b)
    counted = replayed.counters()
    assert counted["flat_passes"] == (counted["passes"] if flat else 0) and counted["passes"] == 3
    assert counted["graph_replays"] == (3 if flat else 3 * 2 * len(runner.stack.layers))
    assert counted["graph_misses/not_captured"] == 0


def test_a_pass_over_another_store_attends_in_groups_over_replayed_pieces(tiny_decider: Decider) -> None:
    """Flat graphs read and write the store they were recorded over; a pass over any other store must not
    replay them (it attends in groups, its pieces replayed)."""
    model = tiny_model(tiny_decider)
    runner = replaying_runner(model, flat=True)
    InProcessReader(runner)
    stack = runner.stack
    other = KVStore(stack.kv_shapes(), pages=64, page=16, dtype=stack.embed.weight.dtype, device=stack.device)
    prompt = list(range(3, 43))
    runner.run([Row(NO_PAST, prompt, other.allocate(None, len(prompt)).slots)], other)
    counted = runner.counters()
    assert counted["flat_passes"] == 0 and counted["graph_replays"] == 2 * len(stack.layers)
