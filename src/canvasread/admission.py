"""How long a new request would wait behind the work in flight, for admission before any work is spent on it.

Requests differ a hundredfold in what they cost (a one-question ticket, a
2,000-token state with twelve questions, a thought), so the backlog is
counted in cost units (`JobCost.tokens` of each prepared job; 1 a job for a
backend that prices nothing) and the rate is the cost the backend has
finished per second *while it was busy*: the span from the later of the
last completion and the moment the queue went busy, to this completion.
With batches in flight at once this is the backend's real service rate
under the current load; at low load it understates what a full engine does,
but then the backlog is small too. A request that is still being prepared
counts as the mean cost of recent jobs. The wait is the backlog over the
rate: a request past the latency budget is shed (529) instead of waiting
past its budget and taking the engine's time from the requests that can
still be answered.

A shed request is told when to come back (`retry_after`): once the backlog
is back within the budget, and one mean job after the request shed before
it. Telling every shed client "in 50 ms" brings them all back at once, to
be shed again: on the H200 past the knee the server answered 430 529s a
second, and the one event loop that parses and refuses them was the
bottleneck while the engine idled. Spaced, they return at about the rate
they can be served.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Completions the rate is measured over, and how many must have been seen before it is trusted to shed.
RATE_WINDOW = 32
RATE_MIN_BATCHES = 4
# The latest a shed request is asked to come back.
MAX_RETRY_S = 30.0


@dataclass
class Backlog:
    """The cost in flight and the rate it is served at; fed by the batch queue on its event loop."""

    prepared_cost: float = 0.0  # jobs queued or running
    prepared: int = 0
    # (cost, jobs, busy seconds) of each recent completion
    recent: deque[tuple[float, int, float]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    _busy_since: float | None = None
    _last_done: float = 0.0
    _recalled_until: float = 0.0  # the latest time a shed request was told to come back

    def busy(self, now: float) -> None:
        """The queue went from idle to holding a request (the span of the next completion starts here)."""
        if self._busy_since is None:
            self._busy_since = now

    def idle(self) -> None:
        self._busy_since = None

    def add(self, cost: float) -> None:
        self.prepared_cost += cost
        self.prepared += 1

    def remove(self, cost: float) -> None:
        self.prepared_cost -= cost
        self.prepared -= 1

    def served(self, cost: float, jobs: int, now: float) -> None:
        """A batch of `jobs` jobs costing `cost` finished at `now`."""
        start = max(self._last_done, self._busy_since if self._busy_since is not None else now)
        self.recent.append((cost, jobs, max(0.0, now - start)))
        self._last_done = now

    def rate(self) -> float | None:
        """Cost served per busy second over the recent completions (None until enough were seen)."""
        if len(self.recent) < RATE_MIN_BATCHES:
            return None
        seconds = sum(s for _, _, s in self.recent)
        cost = sum(c for c, _, _ in self.recent)
        return cost / seconds if seconds > 0 and cost > 0 else None

    def wait_s(self, preparing: int) -> float | None:
        """Seconds the work in flight takes at the measured rate, `preparing` requests counted at the mean cost
        of the recent ones (None: no rate yet)."""
        rate = self.rate()
        if rate is None:
            return None
        return self.cost_ahead(preparing) / rate

    def cost_ahead(self, preparing: int) -> float:
        """The cost in flight, `preparing` requests counted at the mean cost of the recent ones."""
        return self.prepared_cost + max(0, preparing) * self._mean_cost()

    def retry_after(self, over_s: float, now: float) -> float:
        """Seconds until a request shed now should come back: `over_s` (how far the backlog is past what may
        wait), then one mean job's service time after the request shed before it (at most MAX_RETRY_S)."""
        rate = self.rate()
        spacing = self._mean_cost() / rate if rate else 0.0
        back = min(max(now + max(0.0, over_s), self._recalled_until) + spacing, now + MAX_RETRY_S)
        self._recalled_until = back
        return back - now

    def _mean_cost(self) -> float:
        jobs = sum(n for _, n, _ in self.recent)
        return sum(c for c, _, _ in self.recent) / jobs if jobs else 0.0
