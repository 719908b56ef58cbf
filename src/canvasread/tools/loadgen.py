"""A closed-loop HTTP load driver for a canvasread server on this machine.

`drive(plan)` runs `plan.concurrency` clients, each sending one
`POST /v1/systemone` at a time until the plan's time or request budget is
spent, and reports every outcome: status counts, latencies, transport errors,
and answers that do not belong to their request. Each request carries its
sequence number in its question key, so a server that lost, mixed up or
duplicated answers shows up as a mismatch or a missing answer.

Shared by `bench/soak.py` (overload and memory soak) and `canvasread bench`
(a concurrency sweep). It refuses any host but loopback: it is built to
overload whatever it points at.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from canvasread.eval.metrics import quantile

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# What a server under overload may answer: an answer or a clean "retry later".
SHEDDING_STATUSES = frozenset({200, 529})
# Idle connections are dropped before uvicorn's 5 s keep-alive ends: reusing one the server is closing loses the
# request (a POST is not retried), which would count against the server for the client's own race.
KEEPALIVE_EXPIRY_S = 2.0

BodyFactory = Callable[[int], dict[str, Any]]


@dataclass(frozen=True)
class LoadPlan:
    """How hard and how long to push; both budgets bound the run, whichever ends first."""

    url: str
    concurrency: int = 64
    duration_s: float = 30.0
    max_requests: int | None = None
    timeout_s: float = 60.0
    api_key: str = "local"
    # Off, a client answered 529 sends its next request at once (the soak's worst case: retries are load); on, it
    # first waits as long as the answer asks (`retry_delay_s`), as the SDK's clients do, within the plan's time.
    honour_retry_after: bool = False

    def __post_init__(self) -> None:
        host = urlsplit(self.url).hostname
        if host not in LOOPBACK_HOSTS:
            raise ValueError(f"the load driver only targets loopback (127.0.0.1, localhost, ::1), not {host!r}")
        if self.concurrency < 1 or self.duration_s <= 0 or self.timeout_s <= 0:
            raise ValueError("concurrency, duration_s and timeout_s must be positive")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError("max_requests must be positive")


def tagged_body(sequence: int) -> dict[str, Any]:
    """A small request whose only question key carries its sequence number (see `belongs`)."""
    return {
        "model": "jev-latest",
        "state": f"Ticket {sequence}: I was charged twice for my order and want a refund.",
        "questions": {f"r{sequence}": {"type": "noul", "instructions": "Is the customer asking for money back?"}},
    }


def retry_delay_s(headers: Mapping[str, str]) -> float | None:
    """How long a 529 asks its client to wait: `retry-after-ms`, else `Retry-After` in seconds; None if neither
    is a number. `headers` must look names up without regard to case, as httpx's do."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return max(0.0, float(headers[name]) * scale)
        except (KeyError, ValueError):
            continue
    return None


def belongs(body: dict[str, Any], answer: dict[str, Any]) -> bool:
    """A 200 answers exactly the questions its own request asked, in order."""
    answers = answer.get("answers")
    return isinstance(answers, dict) and list(answers) == list(body["questions"])


@dataclass
class LoadReport:
    """Everything that happened; `problems()` lists what a server under overload must never do."""

    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    transport_errors: Counter[str] = field(default_factory=Counter)
    mismatched: list[int] = field(default_factory=list)
    answered_ok: list[int] = field(default_factory=list)
    shed_without_retry_hint: int = 0
    latencies_s: dict[int, list[float]] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())

    @property
    def lost(self) -> int:
        """Requests that got no HTTP answer at all (reset, timeout)."""
        return self.sent - self.answered

    def rate(self, status: int = 200) -> float:
        return self.statuses[status] / self.elapsed_s if self.elapsed_s else 0.0

    def latency_quantiles(self, status: int = 200) -> dict[str, float]:
        samples = self.latencies_s.get(status, [])
        if len(samples) < 2:
            return {}
        cuts = {"p50": 0.50, "p90": 0.90, "p99": 0.99}
        return {name: quantile(samples, q) for name, q in cuts.items()} | {"max": max(samples)}

    def problems(self, allowed: frozenset[int] = SHEDDING_STATUSES) -> list[str]:
        found = []
        if unexpected := {s: n for s, n in self.statuses.items() if s not in allowed}:
            found.append(f"statuses other than {sorted(allowed)}: {unexpected}")
        if self.lost:
            found.append(f"{self.lost} requests got no answer: {dict(self.transport_errors)}")
        if self.mismatched:
            found.append(f"{len(self.mismatched)} answers did not match their request (first: {self.mismatched[:5]})")
        if self.shed_without_retry_hint:
            found.append(f"{self.shed_without_retry_hint} 529s lacked retry-after-ms or Retry-After")
        return found

    def summary(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "statuses": {str(s): n for s, n in sorted(self.statuses.items())},
            "lost": self.lost,
            "mismatched": len(self.mismatched),
            "elapsed_s": round(self.elapsed_s, 3),
            "answers_per_s": round(self.rate(200), 2),
            "latency_200_s": {k: round(v, 4) for k, v in self.latency_quantiles(200).items()},
        }


def merged(reports: Sequence[LoadReport]) -> LoadReport:
    """Several drivers' reports as one run's (driven at once, from several processes: the slowest's time)."""
    total = LoadReport()
    for report in reports:
        total.sent += report.sent
        total.statuses.update(report.statuses)
        total.transport_errors.update(report.transport_errors)
        total.mismatched += report.mismatched
        total.answered_ok += report.answered_ok
        total.shed_without_retry_hint += report.shed_without_retry_hint
        for status, latencies in report.latencies_s.items():
            total.latencies_s.setdefault(status, []).extend(latencies)
        total.elapsed_s = max(total.elapsed_s, report.elapsed_s)
    return total


async def drive(
    plan: LoadPlan,
    make_body: BodyFactory = tagged_body,
    check: Callable[[dict[str, Any], dict[str, Any]], bool] = belongs,
) -> LoadReport:
    """Run the plan and report; never raises for what the server does, only for a bad plan."""
    report = LoadReport()
    sequence = itertools.count()
    started = time.monotonic()
    stop_at = started + plan.duration_s

    def next_sequence() -> int | None:
        number = next(sequence)
        if time.monotonic() >= stop_at or (plan.max_requests is not None and number >= plan.max_requests):
            return None
        return number

    async def client_loop(client: httpx.AsyncClient) -> None:
        while (number := next_sequence()) is not None:
            body = make_body(number)
            report.sent += 1
            sent_at = time.monotonic()
            try:
                response = await client.post("/v1/systemone", json=body)
            except httpx.HTTPError as error:
                report.transport_errors[type(error).__name__] += 1
                continue
            report.statuses[response.status_code] += 1
            report.latencies_s.setdefault(response.status_code, []).append(time.monotonic() - sent_at)
            if response.status_code == 200:
                report.answered_ok.append(number)
                if not check(body, response.json()):
                    report.mismatched.append(number)
            if response.status_code == 529 and not {"retry-after-ms", "retry-after"} <= set(response.headers):
                report.shed_without_retry_hint += 1
            if response.status_code == 529 and plan.honour_retry_after:
                wait = retry_delay_s(response.headers) or 0.0
                await asyncio.sleep(min(wait, max(0.0, stop_at - time.monotonic())))

    async with httpx.AsyncClient(
        base_url=plan.url,
        headers={"Authorization": f"Bearer {plan.api_key}"},
        timeout=plan.timeout_s,
        limits=httpx.Limits(
            max_connections=plan.concurrency,
            max_keepalive_connections=plan.concurrency,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        ),
        trust_env=False,  # no proxy from the environment: loopback stays loopback
    ) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(plan.concurrency)))
    report.elapsed_s = time.monotonic() - started
    return report
