"""uvicorn's h11 protocol with what a public server needs: a header timeout, a connection cap, JSON errors.

uvicorn bounds idle keep-alive connections but not a client that sends its
request line and headers a byte at a time (slowloris): each such connection
is held forever. Here every connection waiting for a request has
`header_timeout_s` to deliver its headers, on the first request and on every
keep-alive one after, and past `max_connections` open connections a new one
is answered 503 and closed. uvicorn's own 400 (unparseable HTTP) and 503
(its concurrency limit) are plain text without the request id the SDK
reads; these are the API's JSON error bodies.
"""

from __future__ import annotations

import asyncio
import http
import json
import uuid

from uvicorn.protocols.http.h11_impl import H11Protocol

from canvasread.server.responses import REQUEST_ID_HEADER


class GuardedH11Protocol(H11Protocol):
    """Closes connections that do not deliver their headers in time; answers broken HTTP with a JSON 400."""

    header_timeout_s: float = 10.0
    max_connections: int = 768

    _header_timer: asyncio.TimerHandle | None = None
    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._refused = len(self.connections) > self.max_connections
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:  # answered whatever it asks: the first bytes of a request are enough to reply to
            self._send_error(503, "too many connections; retry", "overloaded", {b"retry-after": b"1"})
            return
        if self._waiting_for_request():
            self._arm_header_timer()  # keep-alive: the next request's headers are on the clock too
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # the headers arrived and a request began
            self._disarm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is not None and not self.cycle.response_complete:  # a pipelined request began
            self._disarm_header_timer()

    def _waiting_for_request(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self._waiting_for_request() and not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._send_error(400, f"{msg} (not HTTP/1.1)", "bad_request")

    def _send_error(self, status: int, message: str, error_type: str, extra: dict[bytes, bytes] | None = None) -> None:
        """Write one JSON error response on the raw connection and close it (no request cycle is running)."""
        request_id = uuid.uuid4().hex
        body = json.dumps({"detail": {"message": message, "error_type": error_type, "request_id": request_id}})
        head = [
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            f"{REQUEST_ID_HEADER}: {request_id}",
            "connection: close",
            *(f"{k.decode()}: {v.decode()}" for k, v in (extra or {}).items()),
        ]
        self.transport.write(("\r\n".join(head) + "\r\n\r\n" + body).encode())
        self.transport.close()


def guarded_protocol(header_timeout_s: float, max_connections: int) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn builds per connection, with this server's header timeout and connection cap."""
    limits = {"header_timeout_s": header_timeout_s, "max_connections": max_connections}
    return type("GuardedH11Protocol", (GuardedH11Protocol,), limits)
