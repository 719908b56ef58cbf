"""Several upstreams: failover when one dies or sticks, probing until it is back, and `/ready` that follows them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import canvas_backend, eventually, free_port, serve_cli, upstream_pool, wait_until
from vllm_standin import load_standin, running

from canvasread.canvas.vllm.settings import VllmSettings
from canvasread.catalog import open_decider
from canvasread.decide import Decider
from canvasread.upstream.pool import UpstreamUnavailable

STANDIN = Path(__file__).parent / "vllm_standin.py"
QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "charges", "technical": None}},
    "anger": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]},
}
STATE = "I was charged twice for order 1182. I want my money back!"
# One read per request: a CPU forward of the tiny checkpoint takes a second or two here.
ONE_READ = {"samples": 1}


def probabilities(answers: dict[str, Any]) -> list[float]:
    """Every number a Jev answer set carries, in a fixed order, for approximate comparison."""
    flat: list[float] = []
    for answer in answers.values():
        flat.extend([answer["noul"]] if answer["type"] == "noul" else answer["probabilities"].values())
    return flat


def expected_answers(tiny_wide_decider: Decider, seeds: range) -> dict[int, list[float]]:
    answers = {seed: tiny_wide_decider.ask(STATE, QUESTIONS, seed=seed, **ONE_READ)["answers"] for seed in seeds}
    return {seed: probabilities(answer) for seed, answer in answers.items()}  # type: ignore[arg-type]


def proxy_over(urls: tuple[str, ...], tiny_wide_checkpoint: Path, timeout_s: float = 30.0) -> Decider:
    settings = VllmSettings(
        urls=urls, tokenizer=str(tiny_wide_checkpoint), canvas_length=256, timeout_s=timeout_s, probe_interval_s=0.2
    )
    return open_decider((), wings=[settings])


@contextlib.contextmanager
def standin_process(tiny_wide_checkpoint: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The stand-in as its own process, started the way `vllm serve` is, so it can be killed for real."""
    port = free_port()
    command = [sys.executable, str(STANDIN), "serve", str(tiny_wide_checkpoint), "--port", str(port)]
    command += ["--served-model-name", "dgemma", "--enable-prefix-caching"]
    quiet = {**os.environ, "OMP_NUM_THREADS": "1"}  # two model processes on a small machine: no thread oversubscription
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=quiet)
    try:
        yield f"http://127.0.0.1:{port}", process
    finally:
        process.kill()
        process.wait()


def test_killing_one_of_two_upstreams_mid_run_loses_no_request(
    tiny_wide_checkpoint: Path, tiny_wide_decider: Decider
) -> None:
    expected = expected_answers(tiny_wide_decider, range(3))
    survivor = load_standin(str(tiny_wide_checkpoint), served_name="dgemma")
    # The survivor's port is bound before the stand-in process's is picked: a process still starting holds none,
    # so a port picked first could be handed to the survivor too, and both URLs would be one server's.
    with running(survivor) as second, standin_process(tiny_wide_checkpoint) as (first, victim):
        wait_until(first + "/health", timeout=120)
        assert victim.poll() is None and first != second
        flags = ["--upstream", first, "--upstream", second, "--tokenizer", str(tiny_wide_checkpoint)]
        # No latency budget: on a loaded machine the reads the kill cut short made the measured rate look slow
        # enough to shed a request (529), which is admission's call, not a lost request.
        flags += ["--max-queue-delay", "0"]
        with serve_cli(*flags, "--upstream-canvas-length", "256") as base:
            answered = 0

            def ask(seed: int) -> tuple[int, int, list[float]]:
                nonlocal answered
                body = {"model": "dgemma", "state": STATE, "questions": QUESTIONS, "seed": seed, **ONE_READ}
                reply = httpx.post(base + "/v1/systemone", json=body, timeout=120)
                answered += 1
                return seed, reply.status_code, probabilities(reply.json().get("answers", {}))

            with ThreadPoolExecutor(max_workers=4) as clients:
                futures = [clients.submit(ask, i % 3) for i in range(12)]
                eventually(lambda: answered >= 2, timeout=120)
                victim.send_signal(signal.SIGKILL)
                results = [future.result(timeout=180) for future in futures]
            served_by_survivor = len(survivor.requests)
            after = [ask(seed) for seed in range(3)]
            assert httpx.get(base + "/ready", timeout=10).status_code == 200
    # Whether the kill caught reads in flight (then retried) or the prober saw it first is a matter of timing;
    # either way nothing is lost and the survivor takes every read from then on.
    assert len(survivor.requests) >= served_by_survivor + 3
    for seed, status, got in results + after:
        assert status == 200
        assert got == pytest.approx(expected[seed], abs=1e-5)


def test_a_failed_upstream_is_probed_until_it_is_back(tiny_wide_checkpoint: Path) -> None:
    first, second = (load_standin(str(tiny_wide_checkpoint), served_name="dgemma") for _ in range(2))
    with running(second) as second_url:
        with running(first) as first_url:
            port = int(first_url.rsplit(":", 1)[1])
            decider = proxy_over((first_url, second_url), tiny_wide_checkpoint)
            pool = upstream_pool(canvas_backend(decider))
            eventually(lambda: all(u.healthy for u in pool.upstreams), timeout=30)
            for seed in range(4):
                decider.ask(STATE, QUESTIONS, seed=seed, **ONE_READ)
            assert first.requests and second.requests, "requests are spread over both upstreams"
        try:
            served_before = len(second.requests)
            for seed in range(4):
                decider.ask(STATE, QUESTIONS, seed=seed, **ONE_READ)
            assert len(second.requests) == served_before + 4
            assert not pool.upstreams[0].healthy and pool.health_problem() is None
            with running(first, port):
                eventually(lambda: pool.upstreams[0].healthy, timeout=30)
                before = len(first.requests)
                for seed in range(4):
                    decider.ask(STATE, QUESTIONS, seed=seed, **ONE_READ)
                assert len(first.requests) > before, "the upstream is back in rotation"
        finally:
            canvas_backend(decider).close()


def test_a_stuck_upstream_costs_one_timeout_then_fails_over(
    tiny_wide_checkpoint: Path, tiny_wide_decider: Decider
) -> None:
    expected = expected_answers(tiny_wide_decider, range(3))
    stuck = load_standin(str(tiny_wide_checkpoint), served_name="dgemma", stall_s=20.0)
    good = load_standin(str(tiny_wide_checkpoint), served_name="dgemma")
    with running(stuck) as stuck_url, running(good) as good_url:
        # The stuck upstream sits 20 s on a read; 5 s is the timeout, so the good upstream (a tiny forward) has
        # ample time to answer even on a loaded machine, and the stuck one still times out.
        decider = proxy_over((stuck_url, good_url), tiny_wide_checkpoint, timeout_s=5.0)
        alone = proxy_over((stuck_url,), tiny_wide_checkpoint, timeout_s=5.0)
        try:
            for seed in range(3):
                answers = decider.ask(STATE, QUESTIONS, seed=seed, **ONE_READ)["answers"]
                assert probabilities(answers) == pytest.approx(expected[seed], abs=1e-5)  # type: ignore[arg-type]
            assert stuck.requests, "the stuck upstream was tried"
            with pytest.raises(UpstreamUnavailable) as failure:
                alone.ask(STATE, QUESTIONS, seed=0, **ONE_READ)
            assert failure.value.status_code == 503 and "ReadTimeout" in failure.value.message
        finally:
            canvas_backend(decider).close()
            canvas_backend(alone).close()


@contextlib.contextmanager
def canvasread_process(*args: str) -> Iterator[str]:
    """`canvasread serve` without waiting for /ready (this test watches it turn)."""
    port = free_port()
    command = [sys.executable, "-m", "canvasread", "serve", "--port", str(port), "--log-level", "warning", *args]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, env=os.environ.copy())
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_ready_follows_the_upstreams_and_the_port_is_bound_at_once(
    tiny_wide_checkpoint: Path, tiny_wide_decider: Decider
) -> None:
    [expected] = expected_answers(tiny_wide_decider, range(1)).values()
    port = free_port()
    flags = ["--upstream", f"http://127.0.0.1:{port}", "--tokenizer", str(tiny_wide_checkpoint)]
    body = {"model": "jev-latest", "state": STATE, "questions": QUESTIONS, "seed": 0, **ONE_READ}
    with canvasread_process(*flags, "--upstream-canvas-length", "256") as base:
        wait_until(base + "/health", timeout=60)
        waiting = httpx.get(base + "/ready", timeout=10)
        assert waiting.status_code == 503 and "dgemma" in waiting.json()["detail"]["message"]
        assert httpx.post(base + "/v1/systemone", json=body, timeout=30).status_code == 503
        with running(load_standin(str(tiny_wide_checkpoint), served_name="dgemma"), port):
            wait_until(base + "/ready", timeout=60)
            reply = httpx.post(base + "/v1/systemone", json=body, timeout=60)
            assert reply.status_code == 200
            assert probabilities(reply.json()["answers"]) == pytest.approx(expected, abs=1e-5)
        down = wait_until(base + "/ready", status=503, timeout=60)
        assert "no upstream answers" in down.json()["detail"]["message"]
        refused = httpx.post(base + "/v1/systemone", json=body, timeout=30)
        assert refused.status_code == 503 and refused.json()["detail"]["error_type"] == "not_ready"
