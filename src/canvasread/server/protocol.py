"""uvicorn's h11 protocol with what a public server needs: header and send timeouts, connection caps, JSON errors.

uvicorn bounds idle keep-alive connections but not a client that sends its
request line and headers a byte at a time (slowloris), nor one that never
reads its response: each such connection, and the response it holds, is kept
forever. Here:

- every connection waiting for a request has `header_timeout_s` to deliver
  its headers, on the first request and on every keep-alive one after;
- output the client does not take is on the clock: a connection whose unsent
  output has not shrunk for `send_timeout_s` is aborted, which frees it (JSON
  and event streams alike; a slow reader that keeps reading is left alone);
- past `max_connections` open connections, or `max_connections_per_client`
  from one address, a new connection first evicts the connection (of that
  client, for its own cap) that has waited longest without a request in
  flight: idle keep-alive connections and half-sent headers make room for
  clients with work. Only when every connection is busy is the new one
  answered 503 and closed.

uvicorn's own 400 (unparseable HTTP) and 503 (its concurrency limit) are
plain text without the request id the SDK reads; these are the API's JSON
error bodies. Unparseable HTTP says what h11 found wrong, and a request whose
head outgrows h11's buffer is a 414 (its request line) or a 431 (its headers).
"""

from __future__ import annotations

import asyncio
import http
import json
import sys
import time
import uuid
from collections import Counter
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from canvasread.errors import BadRequest, HeadersTooLarge, UriTooLong
from canvasread.server.responses import REQUEST_ID_HEADER, printable
from canvasread.settings import ServerSettings


class GuardedH11Protocol(H11Protocol):
    """Closes connections that do not deliver their headers or take their output in time; evicts idle ones
    first when connections pile up; answers broken HTTP with a JSON 400."""

    header_timeout_s: float = 10.0
    send_timeout_s: float = 30.0
    max_connections: int = 768
    max_connections_per_client: int = 384
    # Open connections per client address, shared by every connection of one server (`guarded_protocol`).
    per_client: ClassVar[Counter[str]] = Counter()

    _header_timer: asyncio.TimerHandle | None = None
    _send_timer: asyncio.TimerHandle | None = None
    _unsent = 0
    _refused = False
    # Since when the connection has had no request in flight; None while one is.
    _idle_since: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._idle_since = time.monotonic()
        self.per_client[self._address] += 1
        self._refused = not self._make_room()
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        self.per_client[self._address] -= 1
        if self.per_client[self._address] <= 0:
            del self.per_client[self._address]
        super().connection_lost(exc)

    @property
    def _address(self) -> str:
        return self.client[0] if self.client else ""

    def _make_room(self) -> bool:
        """Within both caps, evicting the longest-idle connection (the client's own, for its cap) as needed."""
        if self.per_client[self._address] > self.max_connections_per_client and not self._evict(self._address):
            return False
        return len(self.connections) <= self.max_connections or self._evict(None)

    def _evict(self, address: str | None) -> bool:
        """Close the connection (of `address`, if given) idle longest; False when every one has work in flight."""
        idle = [
            other
            for other in self.connections
            if isinstance(other, GuardedH11Protocol)
            and other is not self
            and other._idle_since is not None
            and (address is None or other._address == address)
            and not other.transport.is_closing()
        ]
        if not idle:
            return False
        oldest = min(idle, key=lambda other: other._idle_since or 0.0)
        oldest.transport.abort()  # nothing of a request is lost: none is in flight there
        return True

    def data_received(self, data: bytes) -> None:
        if self._refused:  # answered whatever it asks: the first bytes of a request are enough to reply to
            self._send_error(503, "too many connections; retry", "overloaded", {b"retry-after": b"1"})
            return
        if self._waiting_for_request():
            self._arm_header_timer()  # keep-alive: the next request's headers are on the clock too
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # the headers arrived and a request began
            self._began_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._idle_since = time.monotonic()
        self._watch_output()  # the response's tail may still wait for the client to read it
        if self.cycle is not None and not self.cycle.response_complete:  # a pipelined request began
            self._began_request()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_output()

    def _began_request(self) -> None:
        self._disarm_header_timer()
        self._idle_since = None

    def _watch_output(self) -> None:
        """Put unsent output on the send clock, unless it already is."""
        if self._send_timer is None and self.transport.get_write_buffer_size() > 0:
            self._unsent = self.transport.get_write_buffer_size()
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._on_send_timeout)

    def _on_send_timeout(self) -> None:
        """Abort a connection whose output has not shrunk in `send_timeout_s`; keep watching one that has."""
        self._send_timer = None
        unsent = self.transport.get_write_buffer_size()
        if unsent == 0:
            return
        if unsent < self._unsent:
            self._watch_output()
            return
        self.transport.abort()  # `close` would wait for the client to read what it never will

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
        """uvicorn calls this while it handles h11's `RemoteProtocolError`, which says what was wrong."""
        error = sys.exception()
        if (
            isinstance(error, h11.RemoteProtocolError)
            and error.error_status_hint == 431
            and self._waiting_for_request()
        ):
            self._send_error(*_head_too_large(self.conn.trailing_data[0]))
            return
        reason = f": {printable(str(error))}" if error is not None else ""
        self._send_error(BadRequest.status_code, f"{msg.removesuffix('.')}{reason}", BadRequest.error_type)

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


def _head_too_large(unread: bytes) -> tuple[int, str, str]:
    """h11's one 431 (a request head past its buffer), as 414 while the request line has not ended yet."""
    if b"\n" not in unread:
        return UriTooLong.status_code, "the request line (method and URI) is too long", UriTooLong.error_type
    return HeadersTooLarge.status_code, "the request headers are too large", HeadersTooLarge.error_type


def guarded_protocol(config: ServerSettings) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn builds per connection, with this server's timeouts and connection caps."""
    limits = {
        "header_timeout_s": config.header_timeout_s,
        "send_timeout_s": config.send_timeout_s,
        "max_connections": config.max_connections,
        "max_connections_per_client": config.max_connections_per_client,
        "per_client": Counter[str](),
    }
    return type("GuardedH11Protocol", (GuardedH11Protocol,), limits)
