"""One model, several replicas (one per GPU in production): batches are split across them, answers unchanged."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from helpers import serve_app

from canvasread.backends.base import FunctionBackend
from canvasread.backends.replicas import ReplicaSet
from canvasread.canvas.engine.factory import canvas_backend_for_checkpoint
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.types import DecisionRequest
from canvasread.wire import parse_request


def recording_replica(label: float, seen: list[str]) -> FunctionBackend:
    def answer(request: DecisionRequest) -> list[list[float]]:
        seen.append(str(request.state))
        return [[label, 1.0 - label] for _ in request.questions]

    return FunctionBackend(answer, name="model")


def request(state: str) -> DecisionRequest:
    return parse_request({"model": "m", "state": state, "questions": {"q": {"type": "noul", "instructions": "?"}}})[1]


def test_a_batch_is_split_across_replicas_and_results_keep_their_order() -> None:
    first, second = [], []  # type: ignore[var-annotated]
    replicas = ReplicaSet([recording_replica(0.25, first), recording_replica(0.75, second)])
    jobs = [replicas.prepare(request(f"s{i}")) for i in range(5)]
    results = replicas.decide(jobs)
    assert first == ["s0", "s1"] and second == ["s2", "s3", "s4"]
    assert [r.distributions[0].probabilities[0] for r in results] == [0.25, 0.25, 0.75, 0.75, 0.75]
    assert replicas.decide(jobs[:1])[0].distributions[0].probabilities[0] == 0.25


def test_a_batch_smaller_than_the_set_goes_to_the_replicas_with_the_fewest_jobs_in_flight() -> None:
    """While a one-job batch holds the first replica, the next one-job batch is read by the second; once both
    are idle again, a batch of one starts at the first."""
    entered, release = threading.Event(), threading.Event()
    first, second = [], []  # type: ignore[var-annotated]

    def held(request: DecisionRequest) -> list[list[float]]:
        first.append(str(request.state))
        if str(request.state) == "hold":
            entered.set()
            assert release.wait(30), "never released"
        return [[0.25, 0.75] for _ in request.questions]

    replicas = ReplicaSet([FunctionBackend(held, name="model"), recording_replica(0.75, second)])
    with ThreadPoolExecutor(1) as pool:
        holding = pool.submit(replicas.decide, [replicas.prepare(request("hold"))])
        assert entered.wait(30)
        [result] = replicas.decide([replicas.prepare(request("beside"))])
        assert second == ["beside"] and result.distributions[0].probabilities[0] == 0.75
        release.set()
        holding.result()
    replicas.decide([replicas.prepare(request("after"))])
    assert first == ["hold", "after"]


def test_a_set_holds_one_batch_budget_per_replica_in_flight() -> None:
    replicas = ReplicaSet([recording_replica(0.5, []) for _ in range(3)])
    assert replicas.budgets_at_once == 3


def test_replicas_must_serve_one_model() -> None:
    with pytest.raises(ValueError, match="one model"):
        ReplicaSet([FunctionBackend(lambda r: [], name="a"), FunctionBackend(lambda r: [], name="b")])


def test_concurrent_requests_reach_every_replica_through_the_server() -> None:
    first, second = [], []  # type: ignore[var-annotated]
    replicas = ReplicaSet([recording_replica(0.5, first), recording_replica(0.5, second)])
    with serve_app(create_app(Decider([replicas]))) as base:

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                bodies = [
                    {"model": "model", "state": f"s{i}", "questions": {"q": {"type": "noul", "instructions": "?"}}}
                    for i in range(40)
                ]
                return await asyncio.gather(*(client.post("/v1/systemone", json=b) for b in bodies))

        responses = asyncio.run(burst())
    assert all(r.status_code == 200 for r in responses)
    assert sorted(first + second) == sorted(f"s{i}" for i in range(40))
    assert first and second


def test_canvas_replicas_answer_as_one_engine(tiny_checkpoint: Path, tiny_decider: Decider) -> None:
    settings = EngineSettings(device="cpu", dtype="float32")
    replicas = ReplicaSet([canvas_backend_for_checkpoint(str(tiny_checkpoint), settings) for _ in range(2)])
    replicas.load()
    single = tiny_decider.served[0].backend
    questions = {
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": None, "technical": None, "sales": None},
        }
    }
    requests = [
        parse_request({"model": "m", "state": f"ticket {i}", "questions": questions, "seed": i, "samples": 1})[1]
        for i in range(3)
    ]
    split = replicas.decide([replicas.prepare(r) for r in requests])
    alone = single.decide([single.prepare(r) for r in requests])
    # fp32, to the issue's 1e-5: the shared decider may hold these prompts' prefixes from earlier tests, written
    # by passes of other shapes (1.1e-6 apart once in a full run), while the replicas encode them afresh.
    for a, b in zip(split, alone, strict=True):
        assert a.distributions[0].probabilities == pytest.approx(b.distributions[0].probabilities, abs=1e-5)
    assert replicas.batches_per_replica == [1, 1]
