"""The systemone backend: each request's questions asked of a peer `/v1/systemone` server, read back as
distributions.

The decider does everything canvasread adds (rotations are questions here like any other, calibration,
abstention, stages, streaming); this backend only fits the questions into the peer's caps
(`canvasread.systemone.split`), sends every call of a batch at once through the wing's `UpstreamPool`
(least-loaded replica, failover, the peer's "queue full" retried and then a 529), and turns the replies into
one distribution per question. A peer's answer is a pure function of the request (no seed, no noise we
send), so `samples` re-reads would repeat it: one read per question, and the seed changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from canvasread.backends.base import Gone, never_gone
from canvasread.errors import NotReady
from canvasread.settings import MAX_LEVELS
from canvasread.systemone.peers import PEERS, SYSTEMONE_PATH, Ask, Reply
from canvasread.systemone.settings import SystemOneSettings
from canvasread.systemone.split import CERTAIN, QuestionPlan, in_calls, max_options
from canvasread.types import Capabilities, DecisionRequest, DecisionResult, JSONValue, ModelCard, Usage
from canvasread.upstream.calls import wait_all
from canvasread.upstream.pool import UpstreamPool

logger = logging.getLogger(__name__)
# canvasread's own cap on options per question (the hosted API's documented 255).
MOST_OPTIONS = 255


@dataclass(frozen=True)
class SystemOneJob:
    """A prepared request: its state and how each question is asked."""

    state: JSONValue
    plans: tuple[QuestionPlan, ...]


@dataclass
class _Asked:
    """What one round asks of the peer for one job: its asks, and the replies once they come."""

    asks: list[Ask]
    replies: list[Reply]
    usage: Usage


class SystemOneBackend:
    """A `Backend` (and `ReportsHealth`, `ReportsCounters`, `HasFingerprint`) over a wing of peer servers."""

    def __init__(self, settings: SystemOneSettings) -> None:
        self.settings = settings
        self.peer = PEERS[settings.peer]
        capabilities = Capabilities(
            max_options=min(MOST_OPTIONS, max_options(settings.options_per_call)), max_levels=MAX_LEVELS
        )
        where = ", ".join(settings.urls)
        self._card = ModelCard(
            settings.served_name,
            f"{settings.model} served by {self.peer.name} /v1/systemone at {where}, with canvasread's calibration, "
            "rotation, abstention, stages and streaming on top.",
            time.strftime("%Y-%m-%d"),
            capabilities,
        )
        self._pool: UpstreamPool | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._fingerprint: str | None = None
        self._calls = 0

    @property
    def card(self) -> ModelCard:
        return self._card

    @property
    def fingerprint(self) -> str | None:
        """What the peer says it serves (dialect, model, the weights it names), known once an upstream answered."""
        return self._fingerprint

    @property
    def pool(self) -> UpstreamPool | None:
        """The wing's pool once loaded (its replicas, their health, its counters)."""
        return self._pool

    def load(self) -> None:
        """Start probing and wait until an upstream lists the model; a load that fails stops what it started.

        Loading twice (a library caller, then the server's start-up) keeps the first pool."""
        if self._pool is not None:
            return
        pool = self.settings.pool(self.peer.pool)
        pool.start()
        logger.info("waiting for a %s peer to serve %s (%s)", self.peer.name, self.settings.model, pool.model)
        try:
            served = pool.wait_for_model(self.settings.startup_timeout_s)
        except Exception:
            pool.close()
            raise
        identity = {"peer": self.peer.name, "model": self.settings.model, "root": served.root}
        self._fingerprint = "sha256:" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        self._executor = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="canvasread-systemone")
        self._pool = pool

    def close(self) -> None:
        """Stop the request threads, then the pool's probers (tests and embedders; the server just exits)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        if self._pool is not None:
            self._pool.close()

    def health_problem(self) -> str | None:
        return None if self._pool is None else self._pool.health_problem()

    def counters(self) -> Mapping[str, float]:
        pool = {} if self._pool is None else self._pool.counters()
        return {"peer_calls": float(self._calls), **pool}

    def prepare(self, request: DecisionRequest) -> SystemOneJob:
        """Plan each question against the peer's caps (the capabilities check has bounded what it may hold)."""
        return SystemOneJob(
            request.state, tuple(QuestionPlan.of(q, self.settings.options_per_call) for q in request.questions)
        )

    def decide(self, jobs: Sequence[SystemOneJob], gone: Gone = never_gone) -> list[DecisionResult | None]:
        """Two rounds at most (groups, then finals), each one set of concurrent calls over the whole batch."""
        live = [i for i in range(len(jobs)) if not gone(i)]
        firsts = self._round(jobs, {i: [ask for plan in jobs[i].plans for _, ask in plan.first()] for i in live})
        groups = {i: self._group_replies(jobs[i], firsts[i].replies) for i in live}
        live = [i for i in live if not gone(i)]
        finals_of = {
            i: [plan.final(replies) for plan, replies in zip(jobs[i].plans, groups[i], strict=True)] for i in live
        }
        finals = self._round(jobs, {i: [ask for ask in finals_of[i] if ask is not None] for i in live})
        results: list[DecisionResult | None] = [None] * len(jobs)
        engine = f"{self.peer.name}:{self.settings.model}"
        for i in live:
            answered = iter(finals[i].replies)
            final = [None if ask is None else next(answered) for ask in finals_of[i]]
            distributions = tuple(
                plan.combine(replies, last, engine)
                for plan, replies, last in zip(jobs[i].plans, groups[i], final, strict=True)
            )
            results[i] = DecisionResult(distributions, firsts[i].usage.plus(finals[i].usage))
        return results

    @staticmethod
    def _group_replies(job: SystemOneJob, replies: Sequence[Reply]) -> list[list[Reply]]:
        """Each question's reply per option group, in group order (a group of one is certain)."""
        answered = iter(replies)
        grouped = []
        for plan in job.plans:
            asked = dict(plan.first())
            grouped.append([next(answered) if g in asked else CERTAIN for g in range(len(plan.groups))])
        return grouped

    def _round(self, jobs: Sequence[SystemOneJob], asks: Mapping[int, list[Ask]]) -> dict[int, _Asked]:
        """Every job's asks, in calls within the peer's cap, all sent at once; the replies in ask order."""
        if self._pool is None or self._executor is None:
            raise NotReady(f"{self.card.name} is not loaded")
        pool, executor = self._pool, self._executor
        calls = [(i, call) for i, wanted in asks.items() for call in in_calls(wanted, self.peer.max_questions)]
        bodies = [self.peer.body(self.settings.model, jobs[i].state, call) for i, call in calls]
        futures = [executor.submit(pool.post_json, SYSTEMONE_PATH, body) for body in bodies]
        wait_all(futures)
        self._calls += len(calls)
        done = {i: _Asked(wanted, [], Usage()) for i, wanted in asks.items()}
        for (i, call), future in zip(calls, futures, strict=True):
            replies, spent = self.peer.replies(future.result(), call)
            asked = done[i]
            asked.replies.extend(replies)
            asked.usage = asked.usage.plus(spent)
        return done
