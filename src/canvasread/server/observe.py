"""One record per HTTP request, handed to the metrics and the access log.

`ObserveMiddleware` sits outside every other middleware, so it sees the final
status of every request (401s, 529s and crashes included) and the request id
that `RequestIdMiddleware` assigned. The System One route fills in an
`Exchange` (model, question count, the decision) as it goes, so a request that
fails halfway is still recorded with what was known.

The record is taken just before the last body chunk is sent: by the time a
client has read its response, its metrics and log line exist.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from canvasread.decision import Decision
from canvasread.types import DecisionRequest

UNMATCHED_ROUTE = "unmatched"
# Methods a client of this API sends; any other becomes one label, so random methods cannot grow /metrics.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "other"


def route_label(scope: Scope, root_path: str = "") -> str:
    """The route template that answered (bounded cardinality), or `unmatched`.

    FastAPI's API routes put themselves in the scope; plain Starlette routes
    (`/openapi.json`, `/docs`) and mounts (`/static`) do not, so they are
    matched again here, against the app's own routes, with the `root_path`
    the request arrived with (a mount rewrites it on the way in).
    """
    route = scope.get("route")
    if route is not None:
        return str(getattr(route, "path", UNMATCHED_ROUTE))
    app, arrived = scope.get("app"), {**scope, "root_path": root_path}
    for candidate in getattr(app, "routes", ()):
        match, _ = candidate.matches(arrived)
        if match is Match.FULL:
            return str(getattr(candidate, "path", UNMATCHED_ROUTE))
    return UNMATCHED_ROUTE


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else OTHER_METHOD


@dataclass
class Exchange:
    """What the route learned about one System One request; empty for other routes."""

    model: str | None = None
    request: DecisionRequest | None = None
    decision: Decision | None = None


@dataclass(frozen=True)
class RequestRecord:
    """One finished HTTP request. `route` is the route template (bounded cardinality), `path` the raw path."""

    request_id: str
    method: str
    route: str
    path: str
    status: int
    duration_s: float
    exchange: Exchange = field(default_factory=Exchange)


Sink = Callable[[RequestRecord], None]


def exchange(request: Request) -> Exchange:
    """The request's `Exchange`, created by `ObserveMiddleware` (or here, when the app runs without it)."""
    found = getattr(request.state, "exchange", None)
    if not isinstance(found, Exchange):
        found = Exchange()
        request.state.exchange = found
    return found


class ObserveMiddleware:
    """Times every HTTP request and hands a `RequestRecord` to each sink."""

    def __init__(self, app: ASGIApp, sinks: Sequence[Sink]) -> None:
        self.app = app
        self.sinks = tuple(sinks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        seen = Exchange()
        state = scope.setdefault("state", {})
        state["exchange"] = seen
        started = time.perf_counter()
        root_path = scope.get("root_path", "")
        status = 500
        recorded = False

        def finish() -> None:
            nonlocal recorded
            recorded = True
            record = RequestRecord(
                request_id=str(state.get("request_id", "-")),
                method=scope["method"],
                route=route_label(scope, root_path),
                path=scope["path"],
                status=status,
                duration_s=time.perf_counter() - started,
                exchange=seen,
            )
            for sink in self.sinks:
                sink(record)

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finish()
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            if not recorded:
                finish()
