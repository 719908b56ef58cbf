"""A pool of upstream servers that one HTTP wing reads: least-loaded choice, failover, health probing, overload.

Every HTTP wing (the vLLM wing; any wing that reads another inference server)
sends its requests through one `UpstreamPool`, told what its servers speak by
a `Dialect` (where they report health and the models they serve, which status
means "queue full"). Every request goes to the healthy upstream with the
fewest requests in flight from this process. A connection error, a timeout or
a 5xx that is not the dialect's "busy" takes that upstream out and the request
is retried on another one (a wing sends only requests that are safe to send
twice: a canvas read is read-only and seeded); a 4xx or a malformed answer is
the request's own problem and becomes a 502 at once. A busy status (vLLM's
503 from its admission control, `QueueOverflowError`, `MaxQueuedTokensError`)
is overload, not a fault: the upstream stays in, the request tries the others,
and once every healthy upstream has said "full" it waits a short, growing
backoff and tries them again; when they are still full it fails with
`UpstreamBusy` (529 with a retry hint). A prober thread per upstream checks its
health path (and once, its models path, to see that it serves the model)
every few seconds, so a failed upstream comes back as soon as it answers, and
`health_problem()` tells `/ready` whether any upstream can answer now. A probe
that times out takes a healthy upstream out only when the next one does too
(`SLOW_PROBES_TO_FAIL`): slow is not gone.

Timeouts bound every call, so an upstream that accepts a connection and never
answers costs one timeout, never a hang. With an API key every call, probes
included, carries it as `Authorization: Bearer` (vLLM guards every `/v1`
route when started with `--api-key`); the key is never logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from canvasread.errors import Overloaded, UpstreamFailure

logger = logging.getLogger(__name__)

# Probes are cheap (`/health` is a constant answer), so a failed upstream is back within a couple of seconds.
DEFAULT_PROBE_INTERVAL_S = 2.0
# A health probe that takes longer than this is slow: a healthy vLLM answers in milliseconds.
PROBE_TIMEOUT_S = 5.0
# Slow probes in a row that take a healthy upstream out. A probe that times out says the upstream is slow, not gone
# (vLLM answers `/health` on the event loop that also takes its requests, and a burst can hold that loop), while its
# requests have timeouts of their own; a refused connection or a wrong answer takes it out at once.
SLOW_PROBES_TO_FAIL = 2
# Connecting takes milliseconds on a working network; waiting longer only delays the failover.
CONNECT_TIMEOUT_S = 5.0
# Waits between rounds over upstreams that all answered "full" (busy): a vLLM queue drains in tens of milliseconds
# per batch, so three short rounds ride out a burst, and a longer overload reaches the client as a 529 quickly.
BUSY_BACKOFF_S = (0.05, 0.2, 0.5)
# The retry hint of a 529 when every upstream stayed full: about one more backoff round.
BUSY_RETRY_AFTER_S = 1.0


class UpstreamBusy(Overloaded):
    """Every healthy upstream answered 503 "queue full", through every backoff round: 529, retried later."""

    error_type = "upstream_overloaded"


class UpstreamUnavailable(UpstreamFailure):
    """No upstream can answer now (all down, or every one failed this request): 503, which clients retry."""

    status_code = 503
    error_type = "upstream_unavailable"


@dataclass(frozen=True)
class UpstreamModel:
    """What an upstream's models listing says about the served model: the weights it loaded (`root`, compared
    across peers) and its context length, where it says."""

    root: str
    max_model_len: int | None


@dataclass(frozen=True)
class Dialect:
    """What the servers of one wing speak, as far as the pool cares.

    `served(listing, model)` finds `model` in the JSON a `GET models_path` answered (None: not served there);
    `busy` are the statuses that mean "my queue is full" (overload, retried after a backoff, never a fault);
    `key_flag` is what the operator sets when an upstream wants an API key.
    """

    served: Callable[[Any, str], UpstreamModel | None]
    key_flag: str
    health_path: str = "/health"
    models_path: str = "/v1/models"
    busy: frozenset[int] = frozenset({503})


@dataclass(eq=False)
class Upstream:
    """One upstream server and what this process knows of it; mutated only under the pool's lock (compared by id)."""

    url: str
    healthy: bool = False
    problem: str = "not probed yet"
    in_flight: int = 0
    model: UpstreamModel | None = None
    out_since: float = 0.0
    slow_probes: int = 0  # health probes in a row that timed out while it was healthy


class UpstreamPool:
    """Routes JSON posts to the least-loaded healthy upstream; see the module docstring for the policy."""

    def __init__(
        self,
        urls: Sequence[str],
        model: str,
        dialect: Dialect,
        *,
        timeout_s: float = 30.0,
        probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
        max_connections: int = 64,
        api_key: str | None = None,
        busy_backoff_s: Sequence[float] = BUSY_BACKOFF_S,
    ) -> None:
        if not urls:
            raise ValueError("an upstream pool needs at least one URL")
        self.model = model
        self.dialect = dialect
        self.upstreams = [Upstream(url.rstrip("/")) for url in urls]
        self.probe_interval_s = probe_interval_s
        self._busy_backoff_s = tuple(busy_backoff_s)
        self._client = httpx.Client(
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
            timeout=httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
            limits=httpx.Limits(max_connections=max_connections + len(urls), max_keepalive_connections=max_connections),
        )
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._probe_timeout_s = min(PROBE_TIMEOUT_S, timeout_s)
        self._probers: list[threading.Thread] = []
        self._turn = 0
        self._counts = {"upstream_requests": 0, "upstream_failovers": 0, "upstream_errors": 0, "upstream_busy": 0}

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Start probing, one thread per upstream so a stuck one delays no other (idempotent).

        Until its first probe answers, every upstream counts as down.
        """
        with self._lock:
            if not self._probers:
                self._probers = [
                    threading.Thread(target=self._probe_forever, args=(u,), name=f"probe {u.url}", daemon=True)
                    for u in self.upstreams
                ]
                for prober in self._probers:
                    prober.start()

    def close(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        for prober in self._probers:
            prober.join(timeout=2 * self._probe_timeout_s + 1.0)
        self._client.close()

    # ---- state --------------------------------------------------------------------------
    def health_problem(self) -> str | None:
        """None while some upstream can answer, else why none can (cheap: reads flags the prober sets)."""
        with self._lock:
            if any(u.healthy for u in self.upstreams):
                return None
            return "no upstream answers: " + "; ".join(f"{u.url}: {u.problem}" for u in self.upstreams)

    def counters(self) -> dict[str, float]:
        with self._lock:
            return {key: float(value) for key, value in self._counts.items()}

    def wait_for_model(self, timeout_s: float | None = None) -> UpstreamModel:
        """Block until an upstream has answered `/v1/models` with the model; `UpstreamUnavailable` past the timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            while True:
                known = [u.model for u in self.upstreams if u.model is not None and u.healthy]
                if known:
                    return known[0]
                remaining = None if deadline is None else deadline - time.monotonic()
                if (remaining is not None and remaining <= 0) or self._stop.is_set():
                    problems = "; ".join(f"{u.url}: {u.problem}" for u in self.upstreams)
                    raise UpstreamUnavailable(f"no upstream served {self.model!r} in time ({problems})")
                self._changed.wait(
                    self.probe_interval_s if remaining is None else min(remaining, self.probe_interval_s)
                )

    # ---- requests -----------------------------------------------------------------------
    def post_json(self, path: str, body: Mapping[str, Any]) -> Any:
        """POST `body` to `path` on the least-loaded healthy upstream, failing over; returns the parsed JSON."""
        failures: list[str] = []
        for backoff_s in (*self._busy_backoff_s, None):
            busy: list[str] = []
            answer = self._try_upstreams(path, body, failures, busy)
            if answer is not _ALL_TRIED:
                return answer
            if not busy:
                reasons = "; ".join(failures) or self.health_problem() or "no healthy upstream"
                raise UpstreamUnavailable(f"no upstream could answer: {reasons}")
            if backoff_s is None or self._stop.wait(backoff_s):
                raise UpstreamBusy("every upstream's queue is full: " + "; ".join(busy), BUSY_RETRY_AFTER_S)
        raise AssertionError("unreachable: the last round has no backoff")

    def _try_upstreams(self, path: str, body: Mapping[str, Any], failures: list[str], busy: list[str]) -> Any:
        """One round over the healthy upstreams: the first answer, or `_ALL_TRIED` with the reasons filed."""
        tried: list[Upstream] = []
        while True:
            with self._lease(tried) as upstream:
                if upstream is None:
                    return _ALL_TRIED
                tried.append(upstream)
                try:
                    response = self._client.post(upstream.url + path, json=body)
                except httpx.HTTPError as error:
                    failures.append(self._take_out(upstream, f"{type(error).__name__}: {error}".rstrip(": ")))
                    continue
                if response.status_code in self.dialect.busy:
                    self._count("upstream_busy")
                    busy.append(f"{upstream.url}: {_message(response)}")
                    continue
                if response.status_code >= 500:
                    failures.append(self._take_out(upstream, f"HTTP {response.status_code}: {_message(response)}"))
                    continue
                if response.status_code != 200:
                    self._count("upstream_errors")
                    raise UpstreamFailure(
                        f"{upstream.url} refused the request (HTTP {response.status_code}): {_message(response)}"
                        + (f" (check {self.dialect.key_flag})" if response.status_code == 401 else "")
                    )
                try:
                    return response.json()
                except ValueError:
                    self._count("upstream_errors")
                    raise UpstreamFailure(f"{upstream.url} answered with a body that is not JSON") from None

    @contextmanager
    def _lease(self, tried: Sequence[Upstream]) -> Iterator[Upstream | None]:
        """The healthy, untried upstream with the fewest requests in flight (ties rotate), counted while held."""
        with self._lock:
            count = len(self.upstreams)
            candidates = [(u.in_flight, (i - self._turn) % count, u) for i, u in enumerate(self.upstreams)]
            ready = [c for c in candidates if c[2].healthy and c[2] not in tried]
            chosen = min(ready, key=lambda c: c[:2])[2] if ready else None
            if chosen is not None:
                self._turn += 1
                chosen.in_flight += 1
                self._counts["upstream_requests"] += 1
                if tried:
                    self._counts["upstream_failovers"] += 1
        try:
            yield chosen
        finally:
            if chosen is not None:
                with self._lock:
                    chosen.in_flight -= 1

    def _take_out(self, upstream: Upstream, reason: str) -> str:
        with self._lock:
            if upstream.healthy:
                logger.warning("upstream %s taken out: %s", upstream.url, reason)
            upstream.healthy = False
            upstream.problem = reason
            upstream.out_since = time.monotonic()
            self._counts["upstream_errors"] += 1
        return f"{upstream.url}: {reason}"

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    # ---- probing ------------------------------------------------------------------------
    def _probe_forever(self, upstream: Upstream) -> None:
        while not self._stop.is_set():
            self._probe(upstream)
            self._stop.wait(self.probe_interval_s)

    def _probe(self, upstream: Upstream) -> None:
        started = time.monotonic()
        problem: str | None
        model = upstream.model
        slow = False
        try:
            health = self._client.get(upstream.url + self.dialect.health_path, timeout=self._probe_timeout_s)
            if health.status_code != 200:
                problem = f"{self.dialect.health_path} answered HTTP {health.status_code}" + self._key_hint(health)
            else:
                if model is None:
                    model = self._served_model(upstream)
                problem = self._mismatch(upstream, model)
        except (httpx.HTTPError, ValueError) as error:
            problem = f"{type(error).__name__}: {error}".rstrip(": ")
            slow = isinstance(error, httpx.TimeoutException)
        with self._changed:
            if problem is None:
                upstream.model = model
                if started >= upstream.out_since:  # a failure seen after this probe began outranks it
                    if not upstream.healthy:
                        logger.info("upstream %s is healthy", upstream.url)
                    upstream.healthy, upstream.problem, upstream.slow_probes = True, "", 0
            elif slow and upstream.healthy and upstream.slow_probes + 1 < SLOW_PROBES_TO_FAIL:
                upstream.slow_probes += 1
                logger.warning("upstream %s was slow to answer its health check: %s", upstream.url, problem)
            else:
                if upstream.healthy:
                    logger.warning("upstream %s failed its health check: %s", upstream.url, problem)
                upstream.healthy, upstream.problem, upstream.slow_probes = False, problem, 0
            self._changed.notify_all()

    def _key_hint(self, response: httpx.Response) -> str:
        """Why a 401 happened (a Jev API guards its health path, its models listing, with the key too)."""
        return (
            f": the upstream wants an API key; give it with {self.dialect.key_flag}"
            if response.status_code == 401
            else ""
        )

    def _served_model(self, upstream: Upstream) -> UpstreamModel | None:
        path = self.dialect.models_path
        listing = self._client.get(upstream.url + path, timeout=self._probe_timeout_s)
        if listing.status_code == 401:
            raise ValueError(
                f"{path} answered 401: the upstream wants an API key; give it with {self.dialect.key_flag}"
            )
        listing.raise_for_status()
        return self.dialect.served(listing.json(), self.model)

    def _mismatch(self, upstream: Upstream, model: UpstreamModel | None) -> str | None:
        """Why this upstream must not serve reads: not serving the model, or serving other weights than its peers."""
        if model is None:
            return f"does not serve a model named {self.model!r} (see its {self.dialect.models_path})"
        with self._lock:
            peers = {u.model for u in self.upstreams if u is not upstream and u.model is not None}
        if peers and model not in peers:
            other = next(iter(peers))
            return f"serves {model}, its peers serve {other}: answers would depend on which one is asked"
        return None


_ALL_TRIED = object()


def _message(response: httpx.Response) -> str:
    """The upstream's error message (vLLM's `{"error": {"message"}}` or flat `{"message"}`, FastAPI's `detail`), else
    the raw text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:500]
        if isinstance(error, str):  # vLLM's API-key middleware: {"error": "Unauthorized"}
            return error[:500]
        for key in ("message", "detail"):
            if key in body:
                return str(body[key])[:500]
    return response.text[:500]
