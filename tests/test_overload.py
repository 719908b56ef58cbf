"""Load and faults against live servers: 529 shedding, deadlines, backend exceptions, dead backends, disconnects."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helpers
import httpx
import pytest
from helpers import GatedBackend, eventually, serve_app

from canvasread.backends.base import FunctionBackend
from canvasread.batching import BatchSettings
from canvasread.decide import Decider, DeciderSettings
from canvasread.server.app import create_app
from canvasread.tools.loadgen import LoadPlan, drive
from canvasread.types import DecisionRequest

ROOT = Path(__file__).resolve().parents[1]


def body(state: str) -> dict[str, Any]:
    return {"model": "jev-latest", "state": state, "questions": {"q": {"type": "noul", "instructions": "Money?"}}}


def post(base: str, state: str, timeout: float = 30) -> httpx.Response:
    return helpers.post(base, body(state), timeout=timeout)


# ---- 529 shedding ------------------------------------------------------------------------------


def test_overload_sheds_529_and_every_answer_reaches_its_own_request() -> None:
    seen: list[str] = []

    def answer(request: DecisionRequest) -> list[list[float]]:
        time.sleep(0.005)  # a slow model: the queue, not HTTP, is the bottleneck
        seen.extend(q.key for q in request.questions)
        return [[0.5, 0.5] for _ in request.questions]

    decider = Decider([FunctionBackend(answer)], DeciderSettings(batch=BatchSettings(max_batch=4, max_pending=8)))
    with serve_app(create_app(decider)) as base:
        report = asyncio.run(drive(LoadPlan(base, concurrency=48, max_requests=800, duration_s=120)))
    assert report.problems() == []
    assert report.sent == 800 and report.statuses[200] > 0 and report.statuses[529] > 0
    # Each 200 was read by the model exactly once; no shed request ever reached it.
    assert sorted(seen) == sorted(f"r{n}" for n in report.answered_ok)
    assert decider.served[0].queue.pending == 0


def test_a_shed_request_does_no_work() -> None:
    prepared: list[str] = []

    class Preparing(GatedBackend):
        def prepare(self, request: DecisionRequest) -> DecisionRequest:
            prepared.append(str(request.state))
            return request

    backend = Preparing()
    decider = Decider([backend], DeciderSettings(batch=BatchSettings(max_pending=1)))
    with serve_app(create_app(decider)) as base, ThreadPoolExecutor(1) as pool:
        held = pool.submit(post, base, "hold")
        assert backend.entered.wait(10)
        shed = post(base, "shed")
        assert shed.status_code == 529
        assert shed.json()["detail"]["error_type"] == "overloaded"
        assert "--max-pending" in shed.json()["detail"]["message"]  # the flag that raises the limit
        assert int(shed.headers["retry-after-ms"]) >= 1 and int(shed.headers["retry-after"]) >= 1
        backend.release.set()
        assert held.result().status_code == 200
    assert prepared == ["hold"]


# ---- deadlines --------------------------------------------------------------------------------


def test_a_deadline_answers_504_and_drops_the_queued_work() -> None:
    backend = GatedBackend()
    decider = Decider([backend], DeciderSettings(timeout_s=0.5))
    with serve_app(create_app(decider)) as base, ThreadPoolExecutor(1) as pool:
        held = pool.submit(post, base, "hold")
        assert backend.entered.wait(10)
        queued = post(base, "queued")
        assert queued.status_code == 504
        assert queued.json()["detail"]["error_type"] == "deadline_exceeded"
        assert "(--timeout)" in queued.json()["detail"]["message"]
        assert held.result().status_code == 504
        backend.release.set()
        assert post(base, "after").status_code == 200
    assert "queued" not in backend.seen
    assert decider.served[0].queue.stats.dropped == 1


# ---- backend exceptions and dead backends ------------------------------------------------------------


def test_a_backend_exception_fails_only_the_request_that_raised(caplog: pytest.LogCaptureFixture) -> None:
    backend = GatedBackend()
    decider = Decider([backend], DeciderSettings(batch=BatchSettings(max_batch=8)))
    states = ["good 1", "poison", "good 2", "good 3"]
    with serve_app(create_app(decider)) as base, ThreadPoolExecutor(len(states) + 1) as pool:
        held = pool.submit(post, base, "hold")
        assert backend.entered.wait(10)
        futures = [pool.submit(post, base, state) for state in states]
        eventually(lambda: decider.served[0].queue.pending == len(states) + 1)
        backend.release.set()
        responses = dict(zip(states, (f.result() for f in futures), strict=True))
        assert held.result().status_code == 200
        assert post(base, "after").status_code == 200
    assert backend.batches[:2] == [1, 4]  # the four queued together, and their batch raised...
    assert backend.batches[2:6] == [1, 1, 1, 1]  # ...so each ran alone
    assert [responses[s].status_code for s in states] == [200, 500, 200, 200]
    failed = responses["poison"]
    request_id = failed.headers["x-typesafe-request-id"]
    assert failed.json()["detail"]["request_id"] == request_id
    assert failed.json()["detail"]["error_type"] == "backend_error"
    assert "secret model internals" not in failed.text  # the details stay in the log
    assert any(request_id in r.getMessage() for r in caplog.records)
    assert any(r.exc_info and "secret model internals" in str(r.exc_info[1]) for r in caplog.records)


def test_a_dead_backend_makes_ready_503_until_it_is_back() -> None:
    backend = GatedBackend()
    with serve_app(create_app(Decider([backend]))) as base:
        assert post(base, "fine").status_code == 200
        backend.problem = "CUDA device lost"
        ready = httpx.get(base + "/ready")
        assert ready.status_code == 503 and "CUDA device lost" in ready.text
        refused = post(base, "while dead")
        assert refused.status_code == 503 and refused.json()["detail"]["error_type"] == "not_ready"
        assert httpx.get(base + "/health").status_code == 200
        backend.problem = None
        assert httpx.get(base + "/ready").status_code == 200
        assert post(base, "back").status_code == 200
    assert "while dead" not in backend.seen


# ---- client disconnects ------------------------------------------------------------------------


def test_a_client_that_hangs_up_has_its_queued_work_dropped() -> None:
    backend = GatedBackend()
    decider = Decider([backend])
    with serve_app(create_app(decider)) as base, ThreadPoolExecutor(1) as pool:
        held = pool.submit(post, base, "hold")
        assert backend.entered.wait(10)
        with pytest.raises(httpx.ReadTimeout):
            post(base, "abandoned", timeout=0.5)
        eventually(lambda: decider.served[0].queue.pending == 1)  # the server noticed and let go
        backend.release.set()
        assert held.result().status_code == 200
        assert post(base, "after").status_code == 200
    assert "abandoned" not in backend.seen
    assert decider.served[0].queue.stats.dropped == 1


def test_a_client_that_hangs_up_mid_body_is_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    backend = GatedBackend()
    with serve_app(create_app(Decider([backend]))) as base:
        url = urlsplit(base)
        with socket.create_connection((url.hostname, url.port)) as sock:
            sock.sendall(b'POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{"model": ')
            time.sleep(0.2)
        assert post(base, "after").status_code == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# ---- the soak script, short ---------------------------------------------------------------------------


def test_soak_for_15_seconds_past_saturation() -> None:
    """What `make soak` runs for 10 minutes: the real server, overloaded, answers only 200 or 529."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--duration", "15"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"problems": []' in result.stdout
