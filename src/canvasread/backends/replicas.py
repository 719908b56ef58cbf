"""Several replicas of one model (one per GPU) behind a single `Backend`.

The batch queue hands a batch to the replica set, which splits it into
contiguous shares, one per replica, reads them concurrently (each replica
has its own device and worker thread) and returns the results in order. A
batch smaller than the set uses the replicas with the fewest jobs in flight
(with dozens of small batches at once, always starting at the first replica
would pile them onto it). Planning does not depend on the device, so any
replica's `prepare` serves all of them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from canvasread.backends.base import (
    MAX_BATCHES_AT_ONCE,
    AnyBackend,
    Gone,
    HasFingerprint,
    ReadsBatchesAtOnce,
    ReportsCost,
    ReportsCounters,
    never_gone,
)
from canvasread.types import DecisionRequest, DecisionResult, JobCost, ModelCard


class ReplicaSet:
    def __init__(self, replicas: Sequence[AnyBackend]) -> None:
        if not replicas:
            raise ValueError("a replica set needs at least one replica")
        names = {replica.card.name for replica in replicas}
        if len(names) != 1:
            raise ValueError(f"replicas must serve one model, not {sorted(names)}")
        self.replicas = list(replicas)
        # A share of each batch in flight on each replica (threads start as they are needed).
        self._pool = ThreadPoolExecutor(
            max_workers=len(replicas) * MAX_BATCHES_AT_ONCE, thread_name_prefix="canvasread-replica"
        )
        self.batches_per_replica = [0] * len(replicas)
        self._lock = threading.Lock()
        self._jobs_in_flight = [0] * len(replicas)

    @property
    def card(self) -> ModelCard:
        first = self.replicas[0].card
        return ModelCard(
            first.name, f"{first.description} ({len(self.replicas)} replicas)", first.release_date, first.capabilities
        )

    @property
    def fingerprint(self) -> str | None:
        first = self.replicas[0]
        return first.fingerprint if isinstance(first, HasFingerprint) else None

    def load(self) -> None:
        """Load the first replica alone (first imports of transformers are not thread-safe), then the rest at once."""
        first, *others = self.replicas
        first.load()
        for future in [self._pool.submit(replica.load) for replica in others]:
            future.result()

    @property
    def batches_at_once(self) -> int:
        """As many batches at once as every replica takes (each batch is split over all of them)."""
        return min(r.batches_at_once if isinstance(r, ReadsBatchesAtOnce) else 1 for r in self.replicas)

    @property
    def budgets_at_once(self) -> int:
        """Each replica's: every one holds its share of the batches in flight."""
        return sum(r.budgets_at_once if isinstance(r, ReadsBatchesAtOnce) else 1 for r in self.replicas)

    def counters(self) -> Mapping[str, float]:
        totals: dict[str, float] = {}
        for replica in self.replicas:
            if isinstance(replica, ReportsCounters):
                for name, value in replica.counters().items():
                    totals[name] = totals.get(name, 0.0) + value
        return totals

    def cost(self, job: Any) -> JobCost:
        first = self.replicas[0]
        return first.cost(job) if isinstance(first, ReportsCost) else JobCost()

    def prepare(self, request: DecisionRequest) -> Any:
        return self.replicas[0].prepare(request)

    def decide(self, jobs: Sequence[Any], gone: Gone = never_gone) -> list[DecisionResult | None]:
        count = min(len(self.replicas), len(jobs))
        bounds = [round(i * len(jobs) / count) for i in range(count + 1)]
        shares = list(zip(self._take(bounds), range(count), strict=True))  # (replica, share)
        futures = [
            self._pool.submit(self._decide, replica, jobs[bounds[n] : bounds[n + 1]], gone, bounds[n])
            for replica, n in shares
        ]
        results: list[DecisionResult | None] = []
        for (replica, _), future in zip(shares, futures, strict=True):
            results.extend(future.result())
            self.batches_per_replica[replica] += 1
        return results

    def _take(self, bounds: Sequence[int]) -> list[int]:
        """The replicas for the shares between `bounds`: those with the fewest jobs in flight (the first on a
        tie), their shares counted in flight until read."""
        with self._lock:
            order = sorted(range(len(self.replicas)), key=lambda index: self._jobs_in_flight[index])
            chosen = order[: len(bounds) - 1]
            for n, replica in enumerate(chosen):
                self._jobs_in_flight[replica] += bounds[n + 1] - bounds[n]
        return chosen

    def _decide(self, replica: int, share: Sequence[Any], gone: Gone, offset: int) -> list[DecisionResult | None]:
        try:
            return self.replicas[replica].decide(share, functools.partial(_shifted, gone, offset))
        finally:
            with self._lock:
                self._jobs_in_flight[replica] -= len(share)


def _shifted(gone: Gone, offset: int, index: int) -> bool:
    """A replica's share is a slice of the batch: its job `index` is the batch's `offset + index`."""
    return gone(offset + index)
