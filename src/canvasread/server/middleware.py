"""The middleware stack, outermost first: observe (metrics, access log), request id, host guard, CORS, API keys.

`ObserveMiddleware` is outermost so it sees the final status of every
request, 401s and crashes included; `RequestIdMiddleware` wraps everything
that can answer, so every response carries the id the SDK requires; CORS sits
outside the key check because browsers send preflights without credentials.
The host guard answers only to this machine's names when bound to loopback,
so a page on another site cannot reach the server by rebinding its own DNS
name to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from canvasread.errors import BackendFailure, HostNotAllowed, NotReady
from canvasread.server.auth import ApiKeyMiddleware
from canvasread.server.logs import AccessLog
from canvasread.server.metrics import ServerMetrics
from canvasread.server.observe import ObserveMiddleware
from canvasread.server.responses import REQUEST_ID_HEADER, error_response
from canvasread.settings import ServerSettings

logger = logging.getLogger("canvasread.server")


class InFlight:
    """The request tasks running now, so shutdown can let cancelled ones send their 503 before the process exits."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    async def settled(self, timeout_s: float) -> None:
        """Wait, at most `timeout_s`, until every request task has finished answering."""
        pending = {task for task in self.tasks if task is not asyncio.current_task()}
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)


def add_middleware(app: FastAPI, config: ServerSettings, metrics: ServerMetrics, in_flight: InFlight) -> None:
    """Install the stack; Starlette runs the last one added outermost."""
    app.add_middleware(ApiKeyMiddleware, keys=config.api_keys)
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "content-encoding"],
            expose_headers=[REQUEST_ID_HEADER, "retry-after-ms", "retry-after"],
            max_age=600,
        )
    if config.checks_host:
        app.add_middleware(HostGuardMiddleware, config=config)
    app.add_middleware(RequestIdMiddleware, in_flight=in_flight)
    app.add_middleware(ObserveMiddleware, sinks=(metrics.record, AccessLog(payloads=config.log_payloads)))


class RequestIdMiddleware:
    """Gives every response, errors and crashes included, an `x-typesafe-request-id` (the SDK requires it)."""

    def __init__(self, app: ASGIApp, in_flight: InFlight) -> None:
        self.app = app
        self.in_flight = in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        if task is not None:
            self.in_flight.tasks.add(task)
            task.add_done_callback(self.in_flight.tasks.discard)
        request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        ids = [(REQUEST_ID_HEADER.encode(), request_id.encode()), *client_request_id(scope["headers"])]
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                names = {name for name, _ in ids}
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": [*headers, *ids]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            # Only uvicorn cancels a request: its shutdown deadline passed. Answer a retryable 503 in the API's
            # shape rather than uvicorn's bare 500 (which lacks the request id the SDK requires).
            if started:
                raise
            if (task := asyncio.current_task()) is not None:
                task.uncancel()
            response = error_response(NotReady("the server is shutting down; retry"), request_id)
            await response(scope, receive, send_with_id)
        except Exception:
            logger.exception("unhandled error in request %s", request_id)
            if started:
                raise
            response = error_response(BackendFailure("internal error; see the server log"), request_id)
            await response(scope, receive, send_with_id)


CLIENT_REQUEST_ID_HEADER = b"x-request-id"
_PRINTABLE_ID = re.compile(rb"[\x21-\x7e]{1,200}")
# A `Host` header as RFC 9110 allows it: a bracketed IPv6 literal or a name, then an optional numeric port.
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\[\]:@/\\?#\s]+)(?::[0-9]{1,5})?")


def client_request_id(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's own `X-Request-Id`, to echo (proxies and tracing clients match on it); only a printable
    ASCII token of at most 200 characters is echoed, so no header can be forged through it."""
    value = next((v.strip() for k, v in headers if k == CLIENT_REQUEST_ID_HEADER), b"")
    return [(CLIENT_REQUEST_ID_HEADER, value)] if _PRINTABLE_ID.fullmatch(value) else []


def host_name(value: str) -> str | None:
    """The name in a `Host` header without its port (`[::1]:8011` → `[::1]`); None for a value that is no host.

    `[::1]evil.example` and `localhost:80@evil.example` are not hosts: what follows the name must be a port.
    """
    matched = _HOST.fullmatch(value)
    return matched.group(1) if matched else None


class HostGuardMiddleware:
    """Refuses requests whose `Host` is not one of this server's names (400), before any route runs."""

    def __init__(self, app: ASGIApp, config: ServerSettings) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
            if host is not None and not self.config.allows_host(host_name(host) or ""):
                refused = HostNotAllowed(f"this server does not answer to Host {host!r}; see --allowed-host")
                response = error_response(refused, str(scope.get("state", {}).get("request_id", "-")))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
