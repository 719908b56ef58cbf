"""Clients that never read, and connections that pile up (issue 28), against uvicorn run as `canvasread serve` runs it.

Raw sockets: a client that never reads sets a small receive buffer, so a few megabytes of answers fill the
server's socket and stay in its memory until the send timeout frees them. Sources 127.0.0.2 and 127.0.0.3
are two clients (every 127/8 address is loopback on Linux).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from helpers import GatedBackend, assert_one_line_error, canvasread, cli_process, eventually, free_port, run_uvicorn

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.settings import ServerSettings

# 1000 choices of 255 options: 6 MB of answers, past the 4 MB a loopback socket's send buffer grows to.
LABELS = [f"{a}{b}" for a in "abcdefghijklmnop" for b in "abcdefghijklmnop"][:255]
ANSWER_BYTES = 1_000_000
WIDE = {
    "model": "jev-latest",
    "state": "x",
    "questions": {f"q{i}": {"type": "choice", "criteria": dict.fromkeys(LABELS)} for i in range(1000)},
}
NEVER_READ = ServerSettings(send_timeout_s=2, header_timeout_s=5, keep_alive_s=1)
CAPPED = ServerSettings(header_timeout_s=60, keep_alive_s=60, max_connections=6, max_connections_per_client=3)
CLIENTS = 3


def request_bytes(body: dict[str, object], *, accept: str = "application/json") -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: {accept}\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def connect(base: str, source: str = "127.0.0.1", *, receive_buffer: int | None = None) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(30)
    sock.bind((source, 0))
    sock.connect((host, int(port)))
    return sock


def connections(server: uvicorn.Server) -> list[Any]:
    """The server's open connections (its protocol objects), read from its own state."""
    while True:
        try:
            return list(server.server_state.connections)
        except RuntimeError:  # the event loop changed the set while it was copied
            continue


def held(server: uvicorn.Server) -> list[int]:
    """The bytes of output each open connection holds unsent."""
    return [connection.transport.get_write_buffer_size() for connection in connections(server)]


def all_at_work(server: uvicorn.Server, count: int) -> None:
    """Wait until `count` connections are open and each has a request in flight."""

    def working() -> bool:
        open_now = connections(server)
        return len(open_now) == count and all(c.cycle is not None and not c.cycle.response_complete for c in open_now)

    eventually(working, timeout=30, what=f"{count} requests in flight")


def closed_by_server(sock: socket.socket) -> bool:
    """Read what is left until the server closes or resets the connection (the socket timeout fails the test
    if it never does); True when what arrived was not a whole response (it was cut off)."""
    received = b""
    try:
        while chunk := sock.recv(1 << 20):
            received += chunk
    except ConnectionResetError:
        pass
    head, _, body = received.partition(b"\r\n\r\n")
    declared = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    return not declared or len(body) < int(declared[0].split(b":")[1])


@pytest.fixture(scope="module")
def wide() -> Iterator[tuple[str, uvicorn.Server]]:
    backend = FunctionBackend(lambda r: [[1 / len(q.options)] * len(q.options) for q in r.questions])
    with run_uvicorn(create_app(Decider([backend]), NEVER_READ), settings=NEVER_READ) as served:
        yield served


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream"])
def test_answers_nobody_reads_are_dropped_after_the_send_timeout(wide: tuple[str, uvicorn.Server], accept: str) -> None:
    base, server = wide
    sockets = [connect(base, receive_buffer=4096) for _ in range(CLIENTS)]
    try:
        for sock in sockets:
            sock.sendall(request_bytes(WIDE, accept=accept))
        # The most output each connection was seen holding unsent. Not all at once: on a loaded machine the first
        # answer may pass its send timeout before the last one is written, and that must not fail the test.
        unsent: dict[int, int] = {}

        def stuck() -> bool:
            for connection in connections(server):
                size = connection.transport.get_write_buffer_size()
                if size > 0:
                    unsent[id(connection)] = max(unsent.get(id(connection), 0), size)
            return len(unsent) == CLIENTS

        eventually(stuck, timeout=60, what="every client's answer waiting to be read")
        if accept == "application/json":  # the whole answer waits in memory (a stream's events wait one by one)
            assert sum(unsent.values()) > CLIENTS * ANSWER_BYTES
        # Bound: once the send timeout has passed, no connection is left and not one byte of output is held.
        eventually(lambda: held(server) == [], timeout=60, what="unread answers dropped")
        assert all(closed_by_server(sock) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()
    assert httpx.get(base + "/health").status_code == 200


@dataclass
class Capped:
    base: str
    backend: GatedBackend
    server: uvicorn.Server


@pytest.fixture
def capped() -> Iterator[Capped]:
    backend = GatedBackend()
    with run_uvicorn(create_app(Decider([backend]), CAPPED), settings=CAPPED) as (base, server):
        yield Capped(base, backend, server)
        backend.release.set()


HOLD = {"model": "jev-latest", "state": "hold", "questions": {"q": {"type": "noul", "instructions": "?"}}}


def half_sent(base: str, source: str = "127.0.0.1") -> socket.socket:
    """A connection trickling its headers: it has sent some and may send the rest any second."""
    sock = connect(base, source)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return sock


def busy(base: str, source: str = "127.0.0.1") -> socket.socket:
    """A connection whose request is in flight (the gated backend holds it)."""
    sock = connect(base, source)
    sock.sendall(request_bytes(HOLD))
    return sock


def answer(base: str, source: str) -> httpx.Response:
    """`GET /health` from `source`, on a connection of its own."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source)) as client:
        return client.get(base + "/health", timeout=30)


OK = (200, '{"status":"ok"}')


def outcome(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.text


def test_idle_connections_make_room_for_a_client_with_work(capped: Capped) -> None:
    base = capped.base
    trickling = []
    try:
        for index in range(CAPPED.max_connections):  # each opens after the one before it, so they age in turn
            trickling.append(half_sent(base, f"127.0.0.{2 + index % 2}"))
            eventually(lambda: len(connections(capped.server)) == len(trickling), what="the connection open")
        assert outcome(answer(base, "127.0.0.4")) == OK
        assert closed_by_server(trickling[0])  # the one that had waited longest
        trickling.append(half_sent(base, "127.0.0.4"))  # the cap is full again
        eventually(lambda: len(connections(capped.server)) == CAPPED.max_connections, what="the cap full again")
        assert outcome(answer(base, "127.0.0.5")) == OK
        assert closed_by_server(trickling[1])
    finally:
        for sock in trickling:
            sock.close()


def test_when_every_connection_has_work_a_new_one_gets_503(capped: Capped) -> None:
    base, backend = capped.base, capped.backend
    working = [busy(base, f"127.0.0.{2 + i % 2}") for i in range(CAPPED.max_connections)]
    try:
        all_at_work(capped.server, CAPPED.max_connections)
        refused = answer(base, "127.0.0.4")
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        detail = refused.json()["detail"]
        assert detail["error_type"] == "overloaded" and detail["request_id"] == refused.headers["x-typesafe-request-id"]
    finally:
        backend.release.set()
        for sock in working:
            sock.close()


def test_one_client_cannot_take_every_connection(capped: Capped) -> None:
    base, backend = capped.base, capped.backend
    working = [busy(base, "127.0.0.2") for _ in range(CAPPED.max_connections_per_client)]
    try:
        all_at_work(capped.server, CAPPED.max_connections_per_client)
        assert answer(base, "127.0.0.2").status_code == 503  # its own cap: all of its connections have work
        assert outcome(answer(base, "127.0.0.3")) == OK  # another client has room
    finally:
        backend.release.set()
        for sock in working:
            sock.close()


def test_a_client_at_its_cap_gives_up_its_own_idle_connection(capped: Capped) -> None:
    base, backend = capped.base, capped.backend
    own = [busy(base, "127.0.0.2") for _ in range(CAPPED.max_connections_per_client - 1)]
    all_at_work(capped.server, len(own))
    other = half_sent(base, "127.0.0.3")
    idle = half_sent(base, "127.0.0.2")
    try:
        eventually(lambda: len(connections(capped.server)) == len(own) + 2, what="the idle connections open")
        assert outcome(answer(base, "127.0.0.2")) == OK
        assert closed_by_server(idle)
        other.sendall(b"1\r\n\r\n")  # the other client's older idle connection was left alone
        assert other.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        backend.release.set()
        for sock in (*own, other, idle):
            sock.close()


def test_serve_flags_set_the_per_client_cap_and_the_send_timeout() -> None:
    with cli_process("--max-connections-per-client", "1") as server:
        idle = half_sent(server.base, "127.0.0.2")
        try:
            assert outcome(answer(server.base, "127.0.0.2")) == OK
            assert closed_by_server(idle)
        finally:
            idle.close()
    refused = canvasread("serve", "--send-timeout", "0", "--port", str(free_port()), timeout=60)
    assert_one_line_error(refused, "send", "timeouts must be positive")
