"""Which product a pass's routed experts run on this GPU, by row count: timed once, at start-up.

The Triton kernel (`expert_kernel.py`) wins where each expert gets few rows
and CUTLASS's grouped GEMM where its wide tiles fill; where one gives way to
the other depends on the GPU, its clocks and the model's shapes. So before
the buckets are compiled and captured, the engine times both products on one
layer's own weights at each bucket's row count (`experts.choose_products`)
and records, per weight, the row counts the kernel wins (`TABLE`); a pass
then looks its row count up. A kernel that fails to build or launch, or
whose output disagrees with the grouped GEMM's, is never used, and the log
says why.
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

# The kernel is kept only where it is at least this much faster: within it, timing noise would pick by chance.
MARGIN = 0.05
# Its largest difference from the grouped GEMM, relative to the output's largest magnitude, above which it is wrong
# (both accumulate in fp32; bf16 outputs round at about 4e-3).
AGREEMENT = 0.02
REPEATS = 5


@dataclass(frozen=True)
class Trial:
    """Both products timed at one row count (GPU ms); `kernel_ms` None: the kernel failed or disagreed."""

    rows: int
    grouped_ms: float
    kernel_ms: float | None

    @property
    def kernel_wins(self) -> bool:
        return self.kernel_ms is not None and self.kernel_ms < (1 - MARGIN) * self.grouped_ms


class KernelTable:
    """Per weight (its device, shape and dtype), the row counts whose product runs the kernel."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # replicas on several GPUs warm up on threads of their own
        self._rows: dict[Hashable, frozenset[int]] = {}

    def record(self, key: Hashable, trials: Sequence[Trial]) -> None:
        with self._lock:
            self._rows[key] = frozenset(trial.rows for trial in trials if trial.kernel_wins)

    def uses_kernel(self, key: Hashable, rows: int) -> bool:
        return rows in self._rows.get(key, frozenset())


TABLE = KernelTable()


def trial(
    rows: int,
    product: Callable[[bool], torch.Tensor],
    name: str,
    timer: Callable[[Callable[[], object]], float] | None = None,
) -> Trial:
    """Time `product(use_kernel)` both ways at `rows` rows (`timer`: GPU ms by CUDA events), after checking the
    kernel's output against the grouped GEMM's."""
    timer = timer or _gpu_ms
    expected = product(False).float()
    grouped_ms = timer(lambda: product(False))
    try:
        got = product(True).float()
    except Exception as error:  # Triton could not build or launch the kernel on this machine
        logger.warning(
            "the routed experts' Triton kernel failed (%s, %d rows); the grouped GEMM runs: %s", name, rows, error
        )
        return Trial(rows, grouped_ms, None)
    difference = float((got - expected).abs().max() / expected.abs().max().clamp(min=1e-30))
    if not difference <= AGREEMENT:
        logger.warning(
            "the routed experts' Triton kernel disagrees with the grouped GEMM (%s, %d rows: %.3g of the largest "
            "output); the grouped GEMM runs",
            name,
            rows,
            difference,
        )
        return Trial(rows, grouped_ms, None)
    return Trial(rows, grouped_ms, timer(lambda: product(True)))


def summary(name: str, trials: Sequence[Trial]) -> str:
    """One log line: the pass sizes whose product runs the kernel, and both times at the largest of them (or at
    the smallest size, where it won none)."""
    won = [trial for trial in trials if trial.kernel_wins]
    shown = won[-1] if won else trials[0]
    kernel = "failed" if shown.kernel_ms is None else f"{shown.kernel_ms:.3f} ms"
    rows = ", ".join(str(trial.rows) for trial in won) or "none"
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
