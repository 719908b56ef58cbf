"""The access log: one line per request with its request id, and no state unless payloads are asked for."""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import httpx
import pytest
from helpers import even, free_port, serve_app, wait_until

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.server.logs import ACCESS_LOGGER, logfmt
from canvasread.settings import ServerSettings

SECRET = "card 4111-1111-1111-1111 belongs to Ada"
QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Is this a refund request?"},
    "team": {"type": "choice", "criteria": {"billing": None, "technical": None}},
}


def post(base: str, model: str = "jev-latest", questions: dict[str, Any] = QUESTIONS) -> httpx.Response:
    return helpers.post(base, {"model": model, "state": SECRET, "questions": questions})


def access_lines(caplog: pytest.LogCaptureFixture, request_id: str) -> list[dict[str, Any]]:
    lines = [vars(record)["fields"] for record in caplog.records if record.name == ACCESS_LOGGER]
    return [line for line in lines if line["request_id"] == request_id]


def test_each_request_logs_one_line_with_its_request_id(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    with serve_app(create_app(Decider([FunctionBackend(even, name="even")]))) as base:
        answered = post(base)
        unknown_model = post(base, model="no-such-model")
        invalid = post(base, questions={"team": {"type": "choice", "criteria": {}}})

    [line] = access_lines(caplog, answered.headers["x-typesafe-request-id"])
    assert line["method"] == "POST" and line["path"] == "/v1/systemone" and line["status"] == 200
    assert line["model"] == "even" and line["questions"] == 2
    assert line["input_tokens"] == 1 and line["output_tokens"] == 2
    assert line["duration_ms"] >= line["decide_ms"] >= 0

    # A request that fails still says what it asked for, as far as it got.
    [line] = access_lines(caplog, unknown_model.headers["x-typesafe-request-id"])
    assert (line["status"], line["model"], line["questions"]) == (400, "no-such-model", 2)
    assert "decide_ms" not in line
    [line] = access_lines(caplog, invalid.headers["x-typesafe-request-id"])
    assert line["status"] == 422 and "model" not in line

    # The whole card number and the words around it: a record's timestamps and timings are digits too.
    logged = " ".join(record.getMessage() + json.dumps(vars(record), default=str) for record in caplog.records)
    assert "4111-1111" not in logged and "belongs to" not in logged


def test_payloads_are_logged_only_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    app = create_app(Decider([FunctionBackend(even, name="even")]), ServerSettings(log_payloads=True))
    with serve_app(app) as base:
        response = post(base)
    [line] = access_lines(caplog, response.headers["x-typesafe-request-id"])
    assert line["state"] == SECRET
    assert line["answers"] == response.json()["answers"]


def test_logfmt_quotes_what_would_break_a_line() -> None:
    fields = {"id": "ab12", "path": "/v1/systemone", "status": 200, "state": 'said "hi" = bye', "nested": {"a": 1}}
    assert logfmt(fields) == 'id=ab12 path=/v1/systemone status=200 state="said \\"hi\\" = bye" nested="{\\"a\\": 1}"'


@contextlib.contextmanager
def serve_logging(log: Path, *args: str) -> Iterator[str]:
    """`canvasread serve` with its output in a file (the shared helper keeps output in a pipe)."""
    port = free_port()
    command = [sys.executable, "-m", "canvasread", "serve", "--port", str(port), "--log-level", "info", *args]
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True)
        try:
            try:
                wait_until(f"http://127.0.0.1:{port}/ready", timeout=120)
            except TimeoutError:
                raise AssertionError(f"server did not become ready:\n{log.read_text()}") from None
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_serve_writes_json_lines_without_the_state(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serve_logging(log, "--log-format", "json") as base:
        request_id = post(base).headers["x-typesafe-request-id"]
    output = log.read_text()
    entries = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    [entry] = [e for e in entries if e.get("request_id") == request_id]
    assert entry["logger"] == ACCESS_LOGGER and entry["level"] == "info"
    assert (entry["status"], entry["questions"], entry["model"]) == (200, 2, "sparrow-nano-general-v1.1")
    assert any(e["logger"].startswith("uvicorn") for e in entries), "uvicorn's own lines share the format"
    assert "4111-1111" not in output and "belongs to" not in output


def test_serve_logs_text_lines_and_payloads_when_asked(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serve_logging(log, "--log-payloads") as base:
        request_id = post(base).headers["x-typesafe-request-id"]
    [line] = [line for line in log.read_text().splitlines() if f"request_id={request_id}" in line]
    assert " canvasread.access POST /v1/systemone 200 " in line
    assert "status=200" in line and "questions=2" in line
    assert f"state={json.dumps(SECRET)}" in line
