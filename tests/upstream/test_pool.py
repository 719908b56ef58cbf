"""The upstream pool any HTTP wing shares, speaking a dialect other than vLLM's: where a peer says it is healthy and
what it serves, which statuses mean "queue full", and which flag carries the key. The peer is a real server on
loopback that answers as a Jev-style server does (`{"models": [...]}`, 529 when full)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from helpers import eventually, serve_app

from canvasread.upstream.pool import Dialect, UpstreamBusy, UpstreamModel, UpstreamPool, UpstreamUnavailable


def served_by_peer(listing: Any, model: str) -> UpstreamModel | None:
    for entry in listing.get("models", []):
        if entry.get("name") == model:
            return UpstreamModel(str(entry["description"]), None)
    return None


PEER = Dialect(
    served=served_by_peer, key_flag="--peer-key", health_path="/healthz", models_path="/models", busy=frozenset({529})
)


class Peer:
    """A Jev-style peer: answers `full` calls with 529 first, then 200; wants `key` on its models listing if set."""

    def __init__(self) -> None:
        self.full = 0
        self.calls = 0
        self.key: str | None = None
        self.probes = 0
        self.lock = threading.Lock()
        self.stall = threading.Event()  # set: each probe calls `on_stall`, then waits for `released`
        self.released = threading.Event()
        self.on_stall: Callable[[], None] = lambda: None
        self.app = FastAPI()
        self.app.get("/health")(lambda: {"status": "ok"})  # what the test helper waits for
        self.app.get("/healthz")(self.healthz)
        self.app.get("/models")(self.models)
        self.app.post("/v1/systemone")(self.answer)

    def healthz(self) -> Any:
        self.probes += 1
        if self.stall.is_set():
            self.on_stall()
            self.released.wait(60)
        return {"status": "ok"}

    def models(self, request: Request) -> Any:
        if self.key is not None and request.headers.get("authorization") != f"Bearer {self.key}":
            return JSONResponse({"detail": "no key"}, status_code=401)
        return {"models": [{"name": "peer", "description": "weights-1", "release_date": "2026-01-01"}]}

    def answer(self) -> Any:
        with self.lock:
            self.calls += 1
            if self.full:
                self.full -= 1
                return JSONResponse({"detail": {"error_type": "overloaded", "message": "queue full"}}, status_code=529)
        return {"ok": True}


@pytest.fixture
def peer() -> Iterator[tuple[Peer, str]]:
    served = Peer()
    with serve_app(served.app, wait_ready=False) as base:
        yield served, base


def pool_for(base: str, **settings: Any) -> UpstreamPool:
    pool = UpstreamPool((base,), "peer", PEER, probe_interval_s=0.2, busy_backoff_s=(0.01, 0.01), **settings)
    pool.start()
    return pool


def test_a_peer_in_another_dialect_is_probed_where_it_says_and_busy_is_retried(peer: tuple[Peer, str]) -> None:
    served, base = peer
    pool = pool_for(base)
    try:
        assert pool.wait_for_model(30.0) == UpstreamModel("weights-1", None)
        assert served.probes >= 1  # the dialect's health path
        served.full = 2  # two rounds of "full", then an answer
        assert pool.post_json("/v1/systemone", {}) == {"ok": True}
        counters = pool.counters()
        assert counters["upstream_busy"] == 2 and counters["upstream_errors"] == 0
        assert pool.health_problem() is None, "a full peer stays in"
        served.full = 10
        with pytest.raises(UpstreamBusy):  # full through every backoff round: 529 with a retry hint
            pool.post_json("/v1/systemone", {})
    finally:
        pool.close()


def test_a_peer_that_wants_a_key_names_the_wings_flag(peer: tuple[Peer, str]) -> None:
    served, base = peer
    served.key = "k-1"
    keyless = pool_for(base)
    try:
        with pytest.raises(UpstreamUnavailable, match="--peer-key"):
            keyless.wait_for_model(3.0)
    finally:
        keyless.close()
    keyed = pool_for(base, api_key="k-1")
    try:
        assert keyed.wait_for_model(30.0).root == "weights-1"
    finally:
        keyed.close()


def test_one_slow_health_probe_keeps_a_peer_in_and_the_next_one_takes_it_out(peer: tuple[Peer, str]) -> None:
    """Probes time out after 0.5 s here. Each stalled probe records, as it arrives, what the pool thinks: the
    prober files one probe before it sends the next, so at the second stalled probe the first has been filed."""
    served, base = peer
    pool = pool_for(base, timeout_s=0.5)
    seen: list[str | None] = []
    try:
        assert pool.wait_for_model(30.0).root == "weights-1"
        served.on_stall = lambda: seen.append(pool.health_problem())
        served.stall.set()
        eventually(lambda: len(seen) >= 2, timeout=60, what="two stalled probes")
        assert seen[:2] == [None, None], "one slow probe is not a failure"
        eventually(lambda: pool.health_problem() is not None, timeout=60, what="the second slow probe filed")
        assert "ReadTimeout" in str(pool.health_problem())
        served.stall.clear()
        served.released.set()
        eventually(lambda: pool.health_problem() is None, timeout=60, what="back once it answers")
    finally:
        served.released.set()
        pool.close()
