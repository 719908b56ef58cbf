"""Replicas of a peer behave as the vLLM wing's do (one `UpstreamPool`): failover when one dies, "queue full"
retried and then a 529 with a retry hint, the key on every call; and `serve --upstream-systemone` end to end."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from helpers import eventually, serve_app, serve_cli
from systemone_standins import Peer, running
from typesafe_sdk import TypeSafeClient

from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.settings import ServerSettings
from canvasread.systemone.backend import SystemOneBackend
from canvasread.systemone.settings import SystemOneSettings
from canvasread.upstream.pool import UpstreamPool, UpstreamUnavailable

BODY = {
    "model": "decider",
    "state": "Please route this to billing.",
    "questions": {"team": {"type": "choice", "criteria": {"billing": None, "technical": None}}},
}
KEY = "peer-key-41d2"


def backend_pool(backend: SystemOneBackend) -> UpstreamPool:
    pool = backend.pool
    assert pool is not None, "the backend has loaded"
    return pool


def wing_backend(urls: tuple[str, ...], dialect: str, **settings: Any) -> SystemOneBackend:
    """The wing's backend, not loaded."""
    upstream = SystemOneSettings(urls=urls, model="decider", peer=dialect, probe_interval_s=0.2, **settings)
    return SystemOneBackend(upstream)


def loaded(urls: tuple[str, ...], dialect: str) -> tuple[Decider, SystemOneBackend]:
    backend = wing_backend(urls, dialect)
    decider = Decider([backend])
    decider.load()
    return decider, backend


def test_a_dead_replica_is_taken_out_and_no_request_is_lost() -> None:
    first, second = Peer("sglang"), Peer("sglang")
    with running(second) as second_url:
        with running(first) as first_url:
            decider, backend = loaded((first_url, second_url), "sglang")
            eventually(lambda: all(u.healthy for u in backend_pool(backend).upstreams), timeout=10)
            for _ in range(4):
                decider.ask(BODY["state"], BODY["questions"], model="decider")
            assert first.requests and second.requests, "requests are spread over both replicas"
        try:
            before = len(second.requests)
            answers = [decider.ask(BODY["state"], BODY["questions"], model="decider") for _ in range(4)]
            counters = backend.counters()
        finally:
            backend.close()
    assert all(a["answers"]["team"]["choice"] == "billing" for a in answers)  # type: ignore[index]
    assert len(second.requests) == before + 4
    assert counters["upstream_requests"] >= 8


@pytest.mark.parametrize("dialect", ["vllm", "jev"])
def test_a_full_replica_is_retried_and_a_full_wing_is_a_529(dialect: str) -> None:
    busy, free = Peer(dialect, full=1), Peer(dialect, full=10**6)
    with running(busy) as busy_url, running(free) as full_url:
        (once, once_backend), (always, always_backend) = loaded((busy_url,), dialect), loaded((full_url,), dialect)
        try:
            with serve_app(create_app(once, ServerSettings())) as base:
                answered = httpx.post(base + "/v1/systemone", json=BODY, timeout=30)
                busy_counters = once_backend.counters()
            with serve_app(create_app(always, ServerSettings())) as base:
                refused = httpx.post(base + "/v1/systemone", json=BODY, timeout=30)
                ready = httpx.get(base + "/ready", timeout=10)
        finally:
            once_backend.close()
            always_backend.close()
    assert answered.status_code == 200, answered.text
    assert busy_counters["upstream_busy"] == 1 and busy_counters["upstream_errors"] == 0
    assert refused.status_code == 529, refused.text
    assert refused.json()["detail"]["error_type"] == "upstream_overloaded"
    assert int(refused.headers["retry-after-ms"]) >= 1 and "Retry-After" in refused.headers
    assert ready.status_code == 200, "a full peer is still up"
    assert len(free.requests) == 4, "one try and three backoff rounds"


@pytest.mark.parametrize("dialect", ["vllm", "jev"])
def test_the_key_goes_with_every_call_and_a_missing_one_names_the_flag(dialect: str) -> None:
    peer = Peer(dialect, api_key=KEY)
    with running(peer) as url:
        keyed = wing_backend((url,), dialect, api_key=KEY)
        keyed.load()
        bare = wing_backend((url,), dialect, startup_timeout_s=1.0)
        try:
            with pytest.raises(UpstreamUnavailable, match="--upstream-api-key"):
                bare.load()
        finally:
            keyed.close()
            bare.close()
    assert keyed.fingerprint is not None


def test_serve_upstream_systemone_end_to_end_with_the_sdk() -> None:
    peer = Peer("sglang")
    with running(peer) as url:
        flags = ["--upstream-systemone", url, "--upstream-peer", "sglang", "--upstream-model", "decider"]
        with serve_cli(*flags, "--upstream-name", "clef") as base:
            models = httpx.get(base + "/v1/models", timeout=10).json()["models"]
            with TypeSafeClient(base_url=base, api_key="local", model="clef") as client:
                result = client.system_one(BODY["state"], BODY["questions"])  # type: ignore[arg-type]
    assert models[0]["name"] == "clef"
    assert result.model == "clef" and result.answers["team"].choice == "billing"
    assert all(body["model"] == "decider" for body in peer.requests)
