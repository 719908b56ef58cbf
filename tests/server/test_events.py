"""Answers streamed as server-sent events, read by a plain HTTP client (httpx) from live servers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers import eventually, serve_app

from canvasread.backends.base import FunctionBackend
from canvasread.batching import BatchSettings
from canvasread.decide import Decider, DeciderSettings
from canvasread.server.app import create_app
from canvasread.types import DecisionRequest

SSE = {"accept": "text/event-stream"}
BUG = {"type": "noul", "instructions": "Is this a bug report?"}
PIPELINE = {
    "bug": BUG,
    "tone": {"type": "score", "instructions": "How upset?", "criteria": ["calm", "upset", "furious"]},
    "component": {
        "type": "choice",
        "instructions": "Which component?",
        "criteria": {"ui": None, "api": None},
        "depends_on": ["bug"],
        "ask_if": {"bug": [True]},
    },
    "refund": {"type": "noul", "instructions": "Refund wanted?", "ask_if": {"bug": [False]}},
    "severity": {"type": "score", "criteria": ["low", "high"], "depends_on": ["component", "tone"]},
}


def read_events(response: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """Parse `event:`/`data:` blocks as they arrive (what any SSE client does)."""
    name, data = "message", ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data += line.removeprefix("data: ")
        elif not line and data:
            yield name, json.loads(data)
            name, data = "message", ""


def body(questions: dict[str, Any], **extensions: Any) -> dict[str, Any]:
    return {"model": "default", "state": "The app crashes when I press save.", "questions": questions, **extensions}


def stream(base: str, payload: dict[str, Any]) -> tuple[httpx.Response, list[tuple[str, dict[str, Any]]]]:
    with httpx.stream("POST", base + "/v1/systemone", json=payload, headers=SSE, timeout=60) as response:
        if response.status_code != 200:
            response.read()
            return response, []
        return response, list(read_events(response))


def test_every_answer_arrives_in_stage_order_before_done(sparrow_server: str) -> None:
    payload = body(PIPELINE, diagnostics=True)
    response, events = stream(sparrow_server, payload)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    names = [name for name, _ in events]
    assert names[-1] == "done" and names.count("done") == 1 and "error" not in names
    streamed = {data["question"]: data for name, data in events if name in ("answer", "skipped")}
    assert set(streamed) == set(PIPELINE) and len(streamed) == len(events) - 1  # each question once
    stages = [data["stage"] for _, data in events[:-1]]
    assert stages == sorted(stages) and stages[0] == 0 and max(stages) == 2
    plain = httpx.post(sparrow_server + "/v1/systemone", json=payload, timeout=60).json()
    answers = {key: data["answer"] for key, data in streamed.items() if "answer" in data}
    assert answers == plain["answers"]  # the same answers as the JSON response, stage in diagnostics included
    assert {key: data["skipped"] for key, data in streamed.items() if "skipped" in data} == plain["skipped"]
    done = events[-1][1]
    assert done == {
        "model": plain["model"],
        "usage": plain["usage"],
        "request_id": response.headers["x-typesafe-request-id"],
        "skipped": plain["skipped"],
    }


def test_done_carries_the_warnings_of_the_json_response(sparrow_server: str) -> None:
    payload = {**body(PIPELINE), "state": "word " * 600}  # past the 512 tokens the embedded model reads
    _, events = stream(sparrow_server, payload)
    plain = httpx.post(sparrow_server + "/v1/systemone", json=payload, timeout=60).json()
    assert plain["warnings"][0]["loc"] == ["state"]
    assert events[-1][0] == "done" and events[-1][1]["warnings"] == plain["warnings"]


def test_a_request_without_stages_streams_too_and_json_stays_json(sparrow_server: str) -> None:
    questions = {"bug": BUG, "other": {**BUG, "instructions": "Is it urgent?"}}
    _, events = stream(sparrow_server, body(questions))
    assert [(name, data.get("stage")) for name, data in events] == [("answer", 0), ("answer", 0), ("done", None)]
    assert set(events[-1][1]) == {"model", "usage", "request_id"}
    for accept in ("application/json", "*/*"):
        response = httpx.post(sparrow_server + "/v1/systemone", json=body(questions), headers={"accept": accept})
        assert response.headers["content-type"] == "application/json" and "skipped" not in response.json()


@pytest.mark.parametrize(
    "accept",
    [
        "text/event-stream;q=0",
        "text/event-stream; q=0.0, application/json",
        "application/json, text/event-stream;q=0.5",
        "text/event-stream;q=nonsense",
        "text/event-stream;q=2",
    ],
)
def test_an_event_stream_refused_or_preferred_less_than_json_is_json(sparrow_server: str, accept: str) -> None:
    response = httpx.post(sparrow_server + "/v1/systemone", json=body({"bug": BUG}), headers={"accept": accept})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    "accept", ["text/event-stream;q=0.1", "Text/Event-Stream", "application/json;q=0.5, text/event-stream"]
)
def test_an_event_stream_asked_for_streams(sparrow_server: str, accept: str) -> None:
    payload = body({"bug": BUG})
    with httpx.stream("POST", sparrow_server + "/v1/systemone", json=payload, headers={"accept": accept}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")


def test_validation_errors_come_back_before_the_stream(sparrow_server: str) -> None:
    for questions, loc in [
        ({"a": {**BUG, "depends_on": ["ghost"]}}, ["body", "questions", "a", "noul", "depends_on", 0]),
        ({"a": {**BUG, "ask_if": {"a": [True]}}}, ["body", "questions", "a", "noul", "ask_if", "a"]),
    ]:
        response, _ = stream(sparrow_server, body(questions))
        assert response.status_code == 422
        assert response.headers["content-type"] == "application/json"
        assert [entry["loc"] for entry in response.json()["detail"]] == [loc]


class StageGate(FunctionBackend):
    """Answers 0.8 true; a batch asking `wait_key` blocks until `release`, one asking `fail_key` raises."""

    def __init__(self, wait_key: str = "", fail_key: str = "") -> None:
        super().__init__(self._answer, name="gated")
        self.asked: list[list[str]] = []
        self.wait_key, self.fail_key = wait_key, fail_key
        self.entered = threading.Event()
        self.release = threading.Event()

    def _answer(self, request: DecisionRequest) -> list[list[float]]:
        keys = [q.key for q in request.questions]
        self.asked.append(keys)
        if self.wait_key in keys:
            self.entered.set()
            assert self.release.wait(30), "the test never released the gate"
        if self.fail_key in keys:
            raise RuntimeError("secret model internals")
        return [[0.8, 0.2] for _ in keys]


CHAIN = {"one": BUG, "two": {**BUG, "depends_on": ["one"]}, "three": {**BUG, "depends_on": ["two"]}}


def test_an_answer_is_sent_while_later_stages_are_still_being_read() -> None:
    backend = StageGate(wait_key="two")
    with (
        serve_app(create_app(Decider([backend]))) as base,
        httpx.stream("POST", base + "/v1/systemone", json=body(CHAIN), headers=SSE, timeout=30) as response,
    ):
        events = read_events(response)
        assert next(events)[1]["question"] == "one"  # arrives while stage 1 cannot finish
        assert backend.entered.wait(60) and not backend.release.is_set()
        backend.release.set()
        rest = [(name, data.get("question")) for name, data in events]
    assert rest == [("answer", "two"), ("answer", "three"), ("done", None)]


def test_a_client_that_disconnects_mid_stream_stops_the_remaining_stages() -> None:
    backend = StageGate(wait_key="two")
    decider = Decider([backend])
    with serve_app(create_app(decider)) as base:
        with httpx.stream("POST", base + "/v1/systemone", json=body(CHAIN), headers=SSE, timeout=30) as response:
            events = read_events(response)  # held open: a dropped reader may close the stream, hanging up early
            assert next(events)[1]["question"] == "one"
            assert backend.entered.wait(60)
        # The running stage keeps its place until its batch ends (issue 16, item 6); then nothing follows it.
        assert decider.served[0].queue.pending == 1
        backend.release.set()
        eventually(lambda: decider.served[0].queue.pending == 0)  # the server noticed and let go of the request
        assert httpx.post(base + "/v1/systemone", json=body({"probe": BUG}), timeout=30).status_code == 200
    assert backend.asked == [["one"], ["two"], ["probe"]]  # stage 2 (`three`) was never read


def test_a_failure_in_a_later_stage_is_an_error_event() -> None:
    backend = StageGate(fail_key="two")
    with serve_app(create_app(Decider([backend]))) as base:
        response, events = stream(base, body(CHAIN))
    assert [name for name, _ in events] == ["answer", "error"]
    detail = events[-1][1]["detail"]
    assert detail["error_type"] == "backend_error" and "secret" not in detail["message"]
    assert detail["request_id"] == response.headers["x-typesafe-request-id"]


@pytest.mark.parametrize("status", [529, 500])
def test_overload_and_a_failing_first_stage_are_plain_http_errors(status: int) -> None:
    backend = StageGate(wait_key="hold", fail_key="one")
    decider = Decider([backend], DeciderSettings(batch=BatchSettings(max_pending=1)))
    with serve_app(create_app(decider)) as base:
        if status == 529:
            held = {"json": body({"hold": BUG}), "timeout": 30}
            holder = threading.Thread(target=httpx.post, args=(base + "/v1/systemone",), kwargs=held)
            holder.start()
            assert backend.entered.wait(60)
        response, _ = stream(base, body(CHAIN))
        backend.release.set()
        if status == 529:
            holder.join(30)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert response.json()["detail"]["request_id"] == response.headers["x-typesafe-request-id"]
