"""`ServedModel`: one backend with its load state, its prepare pool and its batch queues.

A model that can think has two queues, two lanes into the same backend: a
thought is dozens of denoising passes (seconds), a read is one (tens of
milliseconds). The engine interleaves them pass by pass, but in one queue
they would share its batches in flight and its backlog: batches holding
thoughts would keep reads waiting for a slot, and a thought's long span with
few tokens would make the measured service rate collapse, so that admission
shed the reads. Each lane has its own batches in flight, backlog and
admission; the queue metrics add them up.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from canvasread.backends.base import AnyBackend, ReportsCost, ReportsHealth
from canvasread.batching import BatchQueue, BatchSettings
from canvasread.calibration import Calibration
from canvasread.preparing import PreparePool
from canvasread.types import DecisionRequest, DecisionResult, ModelCard

Queue = BatchQueue[Any, DecisionResult]


@dataclass
class ServedModel:
    """A backend with its load state, its prepare pool and its batch queues (`queue` for reads, `thoughts` for
    requests that think, on a model that can)."""

    backend: AnyBackend
    queue: Queue
    preparing: PreparePool
    thoughts: Queue | None = None
    loaded: threading.Event = field(default_factory=threading.Event)
    load_error: str | None = None
    load_seconds: float | None = None
    calibration: Calibration | None = None

    @classmethod
    def of(cls, backend: AnyBackend, batch: BatchSettings, prepare_workers: int) -> ServedModel:
        """The backend behind its queues: a lane for thoughts only where the backend can think."""
        name = backend.card.name
        cost = backend.cost if isinstance(backend, ReportsCost) else None
        queue: Queue = BatchQueue(backend.decide, batch, name=name, cost=cost)
        thoughts: Queue | None = None
        if backend.card.capabilities.think:
            thoughts = BatchQueue(backend.decide, batch, name=f"{name} thoughts", cost=cost)
        return cls(backend, queue, PreparePool(prepare_workers, name), thoughts)

    @property
    def card(self) -> ModelCard:
        return self.backend.card

    @property
    def queues(self) -> list[Queue]:
        return [self.queue] if self.thoughts is None else [self.queue, self.thoughts]

    def not_ready_reason(self) -> str | None:
        """Why this model cannot answer now: still loading, failed to load, or its backend reports it has died."""
        if self.load_error is not None:
            return f"{self.card.name} failed to load: {self.load_error}"
        if not self.loaded.is_set():
            return f"{self.card.name} is loading"
        if isinstance(self.backend, ReportsHealth) and (problem := self.backend.health_problem()) is not None:
            return f"{self.card.name} is unhealthy: {problem}"
        return None

    def queue_for(self, request: DecisionRequest) -> Queue:
        """The lane a request waits in: the thoughts' when it thinks."""
        if request.options.think is not None and self.thoughts is not None:
            return self.thoughts
        return self.queue
