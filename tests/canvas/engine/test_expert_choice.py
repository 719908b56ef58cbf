"""Which routed-expert product each pass size runs: the start-up trial's checks and the table a pass reads."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

import pytest
import torch

from canvasread.canvas.engine.expert_choice import MARGIN, KernelTable, Trial, summary, trial


def clock(*times: float) -> Callable[[Callable[[], object]], float]:
    """A timer that gives `times` in turn (the grouped GEMM's first), whatever it is asked to time."""
    given = iter(times)

    def timer(call: Callable[[], object]) -> float:
        return next(given)

    return timer


def test_the_fastest_tile_is_kept_only_where_it_beats_the_grouped_product_by_the_margin() -> None:
    assert Trial(128, 1.0, (("a", 0.7), ("b", 0.5))).winner == "b"
    assert Trial(128, 1.0, (("a", 1.0 - MARGIN / 2),)).winner is None
    assert Trial(128, 1.0, (("a", None), ("b", 0.9))).winner == "b"
    assert Trial(128, 1.0, (("a", None),)).winner is None
    assert Trial(128, 1.0).winner is None


def test_the_table_answers_per_weight_and_row_count() -> None:
    table = KernelTable()
    table.record(
        "gate",
        [
            Trial(128, 1.0, (("a", 0.5), ("b", 0.6))),
            Trial(512, 1.0, (("a", 0.8), ("b", 0.4))),
            Trial(1024, 1.0, (("a", 0.99),)),
        ],
    )
    assert table.tiles("gate", 128) == "a"
    assert table.tiles("gate", 512) == "b"
    assert table.tiles("gate", 1024) is None
    assert table.tiles("gate", 256) is None  # a size never tried
    assert table.tiles("down", 128) is None  # a weight never tried
    table.record("gate", [Trial(128, 1.0, (("a", 2.0),))])  # a replica's own trial replaces the record
    assert table.tiles("gate", 128) is None


def test_agreeing_tiles_are_timed_against_the_grouped_product() -> None:
    out = torch.randn(8, 4)
    found = trial(8, lambda tiles: out + (1e-4 if tiles else 0.0), "down", ["a", "b"], clock(2.0, 1.0, 1.5))
    assert found == Trial(8, 2.0, (("a", 1.0), ("b", 1.5)))
    assert found.winner == "a"


def test_a_tile_that_disagrees_is_never_used_and_the_log_says_so(caplog: pytest.LogCaptureFixture) -> None:
    out = torch.randn(8, 4)
    with caplog.at_level(logging.WARNING):
        found = trial(8, lambda tiles: out * (1.5 if tiles == "a" else 1.0), "down", ["a", "b"], clock(2.0, 1.0))
    assert found == Trial(8, 2.0, (("a", None), ("b", 1.0)))
    assert found.winner == "b"
    assert "disagrees" in caplog.text
    assert "8 rows, a" in caplog.text


def test_a_tile_that_fails_is_never_used_and_the_log_says_why(caplog: pytest.LogCaptureFixture) -> None:
    def product(tiles: object) -> torch.Tensor:
        if tiles is not None:
            raise RuntimeError("out of shared memory")
        return torch.ones(2, 2)

    with caplog.at_level(logging.WARNING):
        found = trial(64, product, "gate and up", ["a"], clock(3.0))
    assert found == Trial(64, 3.0, (("a", None),))
    assert found.winner is None
    assert "out of shared memory" in caplog.text


def test_the_summary_names_the_sizes_the_kernel_took_and_their_tiles() -> None:
    times = zip((128, 256, 512), (0.5, 0.6, 1.5), ("a", "b", "a"), strict=True)
    trials = [Trial(rows, 1.0, ((tiles, ms),)) for rows, ms, tiles in times]
    line = summary("down", trials)
    assert "2 of 3 pass sizes (rows: 128: a; 256: b)" in line
    assert "at 256 rows 0.600 ms against the grouped GEMM's 1.000 ms" in line
    assert "rows: none" in summary("down", [Trial(128, 1.0, (("a", None),))])
    assert "128 rows failed" in summary("down", [Trial(128, 1.0, (("a", None),))])


def test_timing_starts_with_the_grouped_product() -> None:
    """The grouped GEMM's output is the reference, so it runs (and is timed) before any tile is tried."""
    order: list[object] = []
    counter = itertools.count()

    def product(tiles: object) -> torch.Tensor:
        order.append(tiles)
        return torch.ones(1, 1)

    def timer(call: object) -> float:
        assert callable(call)
        call()
        return float(next(counter) + 1)

    trial(1, product, "down", ["a", "b"], timer)
    assert order == [None, None, "a", "a", "b", "b"]
