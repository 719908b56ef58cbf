"""Which routed-expert product each pass size runs: the start-up trial's checks and the table a pass reads."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from canvasread.canvas.engine.expert_choice import MARGIN, KernelTable, Trial, summary, trial


def clock(*times: float) -> object:
    """A timer that gives `times` in turn (the grouped GEMM's first), whatever it is asked to time."""
    given = iter(times)

    def timer(call: object) -> float:
        return next(given)

    return timer


def test_the_kernel_is_kept_only_where_it_is_faster_by_the_margin() -> None:
    assert Trial(128, 1.0, 0.5).kernel_wins
    assert not Trial(128, 1.0, 1.0 - MARGIN / 2).kernel_wins
    assert not Trial(128, 1.0, None).kernel_wins


def test_the_table_answers_per_weight_and_row_count() -> None:
    table = KernelTable()
    table.record("gate", [Trial(128, 1.0, 0.5), Trial(1024, 1.0, 0.99), Trial(4096, 1.0, None)])
    assert table.uses_kernel("gate", 128)
    assert not table.uses_kernel("gate", 1024)
    assert not table.uses_kernel("gate", 4096)
    assert not table.uses_kernel("gate", 256)  # a size never tried
    assert not table.uses_kernel("down", 128)  # a weight never tried
    table.record("gate", [Trial(128, 1.0, 2.0)])  # a replica's own trial replaces the record
    assert not table.uses_kernel("gate", 128)


def test_an_agreeing_kernel_is_timed_against_the_grouped_product() -> None:
    out = torch.randn(8, 4)
    found = trial(8, lambda use_kernel: out + (1e-4 if use_kernel else 0.0), "down", clock(2.0, 1.0))
    assert found == Trial(8, 2.0, 1.0)
    assert found.kernel_wins


def test_a_kernel_that_disagrees_is_never_used_and_the_log_says_so(caplog: pytest.LogCaptureFixture) -> None:
    out = torch.randn(8, 4)
    with caplog.at_level(logging.WARNING):
        found = trial(8, lambda use_kernel: out * (1.5 if use_kernel else 1.0), "down", clock(2.0))
    assert found == Trial(8, 2.0, None)
    assert "disagrees" in caplog.text


def test_a_kernel_that_fails_is_never_used_and_the_log_says_why(caplog: pytest.LogCaptureFixture) -> None:
    def product(use_kernel: bool) -> torch.Tensor:
        if use_kernel:
            raise RuntimeError("out of shared memory")
        return torch.ones(2, 2)

    with caplog.at_level(logging.WARNING):
        found = trial(64, product, "gate and up", clock(3.0))
    assert found == Trial(64, 3.0, None)
    assert "out of shared memory" in caplog.text


def test_the_summary_names_the_sizes_the_kernel_took() -> None:
    trials = [Trial(rows, 1.0, ms) for rows, ms in zip((128, 256, 512), (0.5, 0.6, 1.5), strict=True)]
    line = summary("down", trials)
    assert "2 of 3 pass sizes (rows: 128, 256)" in line
    assert "at 256 rows 0.600 ms against the grouped GEMM's 1.000 ms" in line
    assert "rows: none" in summary("down", [Trial(128, 1.0, None)])


def test_timing_starts_with_the_grouped_product() -> None:
    """The grouped GEMM's output is the reference, so it runs (and is timed) before the kernel is tried."""
    order: list[bool] = []
    counter = itertools.count()

    def product(use_kernel: bool) -> torch.Tensor:
        order.append(use_kernel)
        return torch.ones(1, 1)

    def timer(call: object) -> float:
        assert callable(call)
        call()
        return float(next(counter) + 1)

    trial(1, product, "down", timer)
    assert order[:2] == [False, False]
    assert order[2:] == [True, True]
