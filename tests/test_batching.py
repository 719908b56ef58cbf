"""Batch formation: closed-loop clients are read together instead of falling out of step."""

from __future__ import annotations

import threading
import time

import httpx
from helpers import serve_app

from canvasread.backends.base import FunctionBackend
from canvasread.batching import BatchSettings
from canvasread.decide import Decider, DeciderSettings
from canvasread.server.app import create_app
from canvasread.types import DecisionRequest

BODY = {"model": "jev-latest", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}


def slow(request: DecisionRequest) -> list[list[float]]:
    time.sleep(0.03)  # a model pass; requests that arrive meanwhile form the next batch
    return [[0.5, 0.5] for _ in request.questions]


def closed_loop_clients(base: str, clients: int, requests_each: int) -> None:
    def client() -> None:
        with httpx.Client(base_url=base, timeout=30) as http:
            for _ in range(requests_each):
                assert http.post("/v1/systemone", json=BODY).status_code == 200

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_two_closed_loop_clients_share_batches() -> None:
    backend = FunctionBackend(slow)
    config = DeciderSettings(batch=BatchSettings(linger_s=0.05))
    with serve_app(create_app(Decider([backend], config))) as base:
        closed_loop_clients(base, clients=2, requests_each=8)
    assert sum(backend.batches) == 16
    assert backend.batches.count(2) >= 5, backend.batches  # without lingering: 1, 1, 1, ... (each waits a pass)


def test_a_lone_client_is_never_held_back() -> None:
    backend = FunctionBackend(slow)
    config = DeciderSettings(batch=BatchSettings(linger_s=5.0))  # would stall every request if it applied to them
    with serve_app(create_app(Decider([backend], config))) as base:
        started = time.monotonic()
        closed_loop_clients(base, clients=1, requests_each=5)
        elapsed = time.monotonic() - started
    assert backend.batches == [1, 1, 1, 1, 1]
    assert elapsed < 5.0, "a lone request waited for company that was never coming"
