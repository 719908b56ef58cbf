"""Which product a pass's routed experts run on this GPU, by row count: timed once, at start-up.

The Triton kernel (`expert_kernel.py`) wins where each expert gets few rows
and CUTLASS's grouped GEMM where its wide tiles fill; where one gives way to
the other, and which of the kernel's tiles is fastest, depend on the GPU,
its clocks and the model's shapes (on an H100, the best tile for gate and
up at 172 tokens was 11% slower than another at 16 tokens, and the H200's
start-up picked differently, `bench/results/h100-2026-12-05f`). So before
the buckets are compiled and captured, the engine times the grouped GEMM
and each candidate tile on one layer's own weights at each bucket's row
count (`experts.choose_products`) and records, per weight, the tile that
won each row count (`TABLE`); a pass then looks its row count up. A tile
that fails to build or launch, or whose output disagrees with the grouped
GEMM's, is never used, and the log says why.
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

# A tile is kept only where it is at least this much faster: within it, timing noise would pick by chance.
MARGIN = 0.05
# Its largest difference from the grouped GEMM, relative to the output's largest magnitude, above which it is wrong
# (both accumulate in fp32; bf16 outputs round at about 4e-3).
AGREEMENT = 0.02
REPEATS = 5


@dataclass(frozen=True)
class Trial:
    """Every product timed at one row count (GPU ms): the grouped GEMM's, and each candidate tile's (None: it
    failed or disagreed)."""

    rows: int
    grouped_ms: float
    tiles: tuple[tuple[Hashable, float | None], ...] = ()

    @property
    def fastest(self) -> tuple[Hashable, float] | None:
        """The fastest tile that ran and agreed, and its time."""
        timed = [(tiles, ms) for tiles, ms in self.tiles if ms is not None]
        return min(timed, key=lambda pair: pair[1]) if timed else None

    @property
    def winner(self) -> Hashable | None:
        """The fastest tile, where it beats the grouped GEMM by MARGIN; None: the grouped GEMM runs."""
        fastest = self.fastest
        return fastest[0] if fastest is not None and fastest[1] < (1 - MARGIN) * self.grouped_ms else None


class KernelTable:
    """Per weight (its device, shape and dtype), the tile each row count's product runs (absent: the grouped
    GEMM)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # replicas on several GPUs warm up on threads of their own
        self._tiles: dict[Hashable, dict[int, Hashable]] = {}

    def record(self, key: Hashable, trials: Sequence[Trial]) -> None:
        with self._lock:
            self._tiles[key] = {trial.rows: trial.winner for trial in trials if trial.winner is not None}

    def tiles(self, key: Hashable, rows: int) -> Hashable | None:
        return self._tiles.get(key, {}).get(rows)


TABLE = KernelTable()


def trial(
    rows: int,
    product: Callable[[Hashable | None], torch.Tensor],
    name: str,
    candidates: Sequence[Hashable],
    timer: Callable[[Callable[[], object]], float] | None = None,
) -> Trial:
    """Time `product(tiles)` at `rows` rows for the grouped GEMM (`tiles` None) and each of `candidates`
    (`timer`: GPU ms by CUDA events), each tile after checking its output against the grouped GEMM's."""
    timer = timer or _gpu_ms
    expected = product(None).float()
    grouped_ms = timer(lambda: product(None))
    timed = tuple((tiles, _timed_tiles(rows, product, tiles, expected, name, timer)) for tiles in candidates)
    return Trial(rows, grouped_ms, timed)


def _timed_tiles(
    rows: int,
    product: Callable[[Hashable | None], torch.Tensor],
    tiles: Hashable,
    expected: torch.Tensor,
    name: str,
    timer: Callable[[Callable[[], object]], float],
) -> float | None:
    """One tile's GPU ms, or None (logged) where it cannot run or disagrees with `expected`."""
    try:
        got = product(tiles).float()
    except Exception as error:  # Triton could not build or launch the kernel on this machine
        logger.warning(
            "the routed experts' Triton kernel failed (%s, %d rows, %s); the grouped GEMM runs: %s",
            name,
            rows,
            tiles,
            error,
        )
        return None
    difference = float((got - expected).abs().max() / expected.abs().max().clamp(min=1e-30))
    if not difference <= AGREEMENT:
        logger.warning(
            "the routed experts' Triton kernel disagrees with the grouped GEMM (%s, %d rows, %s: %.3g of the "
            "largest output); the grouped GEMM runs",
            name,
            rows,
            tiles,
            difference,
        )
        return None
    return timer(lambda: product(tiles))


def summary(name: str, trials: Sequence[Trial]) -> str:
    """One log line: the pass sizes whose product runs the kernel and with which tile, and the times at the
    largest of them (or at the smallest size, where it won none)."""
    won = [trial for trial in trials if trial.winner is not None]
    shown = won[-1] if won else trials[0]
    fastest = shown.fastest
    kernel = "failed" if fastest is None else f"{fastest[1]:.3f} ms"
    rows = "; ".join(f"{trial.rows}: {trial.winner}" for trial in won) or "none"
    return (
        f"routed experts' {name}: the Triton kernel at {len(won)} of {len(trials)} pass sizes (rows: {rows}); "
        f"at {shown.rows} rows {kernel} against the grouped GEMM's {shown.grouped_ms:.3f} ms"
    )


def _gpu_ms(call: Callable[[], object]) -> float:
    """The median GPU time of `call` over REPEATS runs after one (CUDA events on the current stream)."""
    call()
    times: list[float] = []
    for _ in range(REPEATS):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return statistics.median(times)
