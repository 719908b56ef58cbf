"""The systemone wing through each peer's stand-in: the official typesafe-sdk gets well-formed answers (a
100-option choice and 100 questions included), the peer's caps never show, and calibration fitted on top
changes what is served."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from helpers import serve_app
from systemone_standins import VLLM_LABELS, VLLM_MAX_QUESTIONS, Peer, running
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

from canvasread.calibration import Calibration, bucket, fit_temperature
from canvasread.catalog import open_decider
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.settings import ServerSettings
from canvasread.systemone.backend import SystemOneBackend
from canvasread.systemone.settings import SystemOneSettings

DIALECTS = ("vllm", "sglang", "jev")
STATE = "Ticket: I was charged twice and want a refund. Route it to opt57, the billing desk."
OPTIONS = {f"opt{i}": f"desk number {i}" for i in range(100)}
QUESTIONS = {
    "refund": Noul(instructions="Does the customer want a refund?"),
    "team": Choice(instructions="Which team?", criteria={"billing": "charges", "technical": None, "sales": None}),
    "anger": Score(instructions="How angry?", criteria=["calm", "annoyed", "furious"]),
    "desk": Choice(instructions="Which desk?", criteria=OPTIONS),
}


def wing(urls: tuple[str, ...], dialect: str, **settings: Any) -> Decider:
    upstream = SystemOneSettings(urls=urls, model="decider", peer=dialect, probe_interval_s=0.2, **settings)
    return open_decider((), wings=[upstream])


def backend_of(decider: Decider) -> SystemOneBackend:
    backend = decider.served[0].backend
    assert isinstance(backend, SystemOneBackend)
    return backend


@contextmanager
def front(peer: Peer, **settings: Any) -> Iterator[tuple[str, Decider]]:
    """canvasread serving the stand-in's model through the wing, over HTTP."""
    with running(peer) as url:
        decider = wing((url,), peer.dialect, **settings)
        try:
            with serve_app(create_app(decider, ServerSettings())) as base:
                yield base, decider
        finally:
            backend_of(decider).close()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_sdk_gets_every_type_and_a_100_option_choice(dialect: str) -> None:
    peer = Peer(dialect)
    with front(peer) as (base, _), TypeSafeClient(base_url=base, api_key="local", model="decider") as client:
        result = client.system_one(STATE, QUESTIONS)
    answers = result.answers
    assert list(answers) == ["refund", "team", "anger", "desk"]
    assert answers["refund"].noul > 0.5, "the stand-in sees 'refund' in the state"
    assert answers["team"].choice == "billing"
    assert sum(answers["team"].probabilities.values()) == pytest.approx(1.0)
    assert answers["anger"].legend == {0: "calm", 1: "annoyed", 2: "furious"}
    desk = answers["desk"]
    assert list(desk.probabilities) == list(OPTIONS)
    assert sum(desk.probabilities.values()) == pytest.approx(1.0)
    assert desk.choice == "opt57", "the tournament keeps the option the state names"
    assert result.usage.input_tokens > 0
    sent = [q for body in peer.requests for q in body["questions"].values()]
    if dialect == "vllm":
        assert all(set(body) == {"model", "state", "questions"} for body in peer.requests)
        assert max(len(q["criteria"]) for q in sent if q["type"] == "choice") <= VLLM_LABELS
        assert len(peer.requests) == 2, "one call of groups and small questions, one of the desk's final"
    else:
        assert len(peer.requests) == 1, "one call: the peer takes 100 options"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_100_questions_fit_the_peer_and_come_back_in_order(dialect: str) -> None:
    peer = Peer(dialect)
    questions = {f"q{i:03d}": {"type": "choice", "criteria": {"billing": None, f"other{i}": None}} for i in range(100)}
    with front(peer) as (base, _), TypeSafeClient(base_url=base, api_key="local", model="decider") as client:
        result = client.system_one(STATE, questions)
    assert list(result.answers) == list(questions)
    assert all(answer.choice == "billing" for answer in result.answers.values())
    calls = [len(body["questions"]) for body in peer.requests]
    assert sum(calls) == 100
    if dialect == "vllm":
        assert sorted(calls) == [100 - VLLM_MAX_QUESTIONS, VLLM_MAX_QUESTIONS], "sent at once, so in either order"


def test_canvasread_extensions_work_on_top_and_diagnostics_name_the_engine() -> None:
    peer = Peer("vllm")
    body = {
        "model": "decider",
        "state": STATE,
        "questions": {"team": {"type": "choice", "criteria": {"billing": None, "technical": None, "sales": None}}},
        "order": "rotate",
        "diagnostics": True,
        "seed": 3,
    }
    with front(peer) as (base, _):
        reply = httpx.post(base + "/v1/systemone", json=body, timeout=30)
        stream = httpx.post(base + "/v1/systemone", json=body, headers={"Accept": "text/event-stream"}, timeout=30)
    assert reply.status_code == 200, reply.text
    team = reply.json()["answers"]["team"]
    rotations = team["diagnostics"]["per_rotation"]
    assert team["diagnostics"]["rotations"] == len(rotations) == 3, "rotate asked the options in three orders"
    assert all(read["engine"] == "vllm:decider" and read["label_mass"] == 0.9 for read in rotations)
    assert stream.status_code == 200 and "event: done" in stream.text


def test_a_calibration_fitted_on_top_changes_the_served_probabilities() -> None:
    peer = Peer("jev")
    labels = [("billing", "technical"), ("technical", "billing")]
    with running(peer) as url:
        decider = wing((url,), "jev")
        try:
            ask = {"team": {"type": "choice", "criteria": {"billing": None, "technical": None, "sales": None}}}
            seen = []
            for i in range(40):
                named, right = labels[i % 2]
                answer = decider.ask(f"case {i}: mentions {named}", ask, model="decider")["answers"]["team"]
                seen.append(([answer["probabilities"][n] for n in ("billing", "technical", "sales")], right))
            expected = [("billing", "technical", "sales").index(right) for _, right in seen]
            temperature = fit_temperature([p for p, _ in seen], expected)
            fingerprint = backend_of(decider).fingerprint
            assert fingerprint is not None
            name = bucket("choice", 3)
            assert name is not None
            before = decider.ask("mentions billing", ask, model="decider", diagnostics=True)["answers"]["team"]
            decider.use_calibration(Calibration("decider", fingerprint, {name: temperature}))
            after = decider.ask("mentions billing", ask, model="decider", diagnostics=True)["answers"]["team"]
        finally:
            backend_of(decider).close()
    assert temperature > 1.5, "the stand-in is confidently wrong half the time"
    assert after["probabilities"]["billing"] < before["probabilities"]["billing"] - 0.1
    assert after["diagnostics"]["calibrated"] is True


def test_bad_flags_are_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="--upstream-peer must be one of vllm, sglang, jev"):
        SystemOneSettings(urls=("http://peer:8000",), peer="tgi")
    with pytest.raises(ValueError, match="not an http"):
        SystemOneSettings(urls=("peer:8000",))


def test_an_sglang_without_two_letter_labels_takes_the_tournament_at_26() -> None:
    body = {"model": "decider", "state": STATE, "questions": {"desk": {"type": "choice", "criteria": OPTIONS}}}
    with front(Peer("sglang", pair_labels=False)) as (base, _):
        refused = httpx.post(base + "/v1/systemone", json=body, timeout=30)
    peer = Peer("sglang", pair_labels=False)
    with front(peer, max_options=VLLM_LABELS) as (base, _):
        answered = httpx.post(base + "/v1/systemone", json=body, timeout=30)
    assert refused.status_code == 502 and "more than 26 options needs added tokens" in refused.text
    assert answered.status_code == 200 and answered.json()["answers"]["desk"]["choice"] == "opt57"
    assert max(len(q["criteria"]) for body in peer.requests for q in body["questions"].values()) <= VLLM_LABELS


def test_min_confidence_and_stages_work_on_the_peers_answers() -> None:
    questions = {
        "team": {"type": "choice", "criteria": {"billing": None, "technical": None}},
        "refund": {"type": "noul", "instructions": "Does the customer want a refund?", "ask_if": {"team": ["billing"]}},
        "sales": {"type": "noul", "instructions": "Is it a sale?", "ask_if": {"team": ["technical"]}},
        "unsure": {"type": "choice", "criteria": {"red": None, "blue": None}, "min_confidence": 0.99},
    }
    with front(Peer("vllm")) as (base, _):
        reply = httpx.post(base + "/v1/systemone", json={"model": "decider", "state": STATE, "questions": questions})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["answers"]["team"]["choice"] == "billing" and "refund" in body["answers"]
    assert body["skipped"]["sales"]["reason"] == "condition_not_met"
    assert body["answers"]["unsure"]["abstain"] is True
