"""Escalation: unsure answers re-asked of another model, in the decider and end to end between two canvasread
servers (the front reads the target through the systemone wing), with `eval --escalate` over HTTP."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import canvasread, serve_cli

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider, DeciderSettings
from canvasread.errors import InvalidRequest
from canvasread.types import DecisionRequest
from canvasread.wire import parse_request

QUESTIONS = {
    "sure": {"type": "choice", "criteria": {"a": None, "b": None}},
    "unsure": {"type": "choice", "criteria": {"a": None, "b": None, "c": None}},
}
TARGET = "big"


def small(request: DecisionRequest) -> list[list[float]]:
    """Sure of two-option questions, unsure of the rest."""
    return [[0.95, 0.05] if len(q.options) == 2 else [0.4, 0.3, 0.3] for q in request.questions]


def big(request: DecisionRequest) -> list[list[float]]:
    if str(request.state) == "fail":
        raise RuntimeError("the big model broke")
    return [[0.0] * (len(q.options) - 1) + [1.0] for q in request.questions]


def decider(**settings: object) -> Decider:
    backends = [FunctionBackend(small, name="small"), FunctionBackend(big, name=TARGET)]
    served = Decider(backends, DeciderSettings(**settings))  # type: ignore[arg-type]
    served.load()
    return served


def test_answers_below_the_threshold_come_from_the_target_and_say_so() -> None:
    answer = decider(escalate_to=TARGET, escalate_below=0.5).ask("x", QUESTIONS, model="small", diagnostics=True)
    answers = answer["answers"]
    assert answers["sure"]["choice"] == "a" and answers["sure"]["diagnostics"]["answered_by"] == "small"  # type: ignore[index]
    unsure = answers["unsure"]  # type: ignore[index]
    assert unsure["choice"] == "c" and unsure["diagnostics"]["answered_by"] == TARGET
    assert unsure["diagnostics"]["escalated_from"] == {"model": "small", "confidence": pytest.approx(0.1)}
    assert answer["usage"] == {
        "input_tokens": 2,
        "output_tokens": 3,
        "escalation": {"model": TARGET, "questions": 1, "input_tokens": 1, "output_tokens": 1},
    }


def test_a_request_sets_its_own_threshold_and_target() -> None:
    plain = decider()
    assert "escalation" not in plain.ask("x", QUESTIONS, model="small")["usage"]  # type: ignore[operator]
    everything = plain.ask("x", QUESTIONS, model="small", escalate={"below": 1.0, "to": TARGET})
    assert everything["usage"]["escalation"]["questions"] == 2  # type: ignore[index]
    served = decider(escalate_to=TARGET, escalate_below=0.5)
    off = served.ask("x", QUESTIONS, model="small", escalate={"below": 0})
    assert "escalation" not in off["usage"]  # type: ignore[operator]
    direct = served.ask("x", QUESTIONS, model=TARGET)
    assert "escalation" not in direct["usage"], "a request to the target itself is not escalated"  # type: ignore[operator]
    with pytest.raises(InvalidRequest, match="no model to escalate to"):
        plain.ask("x", QUESTIONS, model="small", escalate={"below": 0.5})


def test_a_failing_target_leaves_the_first_answers_with_the_reason() -> None:
    served = decider(escalate_to=TARGET, escalate_below=0.5)
    _, request = parse_request({"model": "small", "state": "fail", "questions": QUESTIONS, "diagnostics": True})

    async def through_the_queues() -> dict[str, Any]:
        served.start()
        try:
            return dict((await served.decide("small", request)).to_json())
        finally:
            await served.stop()

    answer = asyncio.run(through_the_queues())
    unsure = answer["answers"]["unsure"]  # type: ignore[index]
    assert unsure["choice"] == "a" and unsure["diagnostics"]["answered_by"] == "small"
    assert "the big model broke" not in json.dumps(answer), "the target's internals stay inside"
    assert unsure["diagnostics"]["escalation_failed"].startswith(f"{TARGET}: ")
    assert answer["usage"]["escalation"]["questions"] == 0  # type: ignore[index]


def test_bad_escalation_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="--escalate-below needs --escalate"):
        DeciderSettings(escalate_below=0.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        DeciderSettings(escalate_to=TARGET, escalate_below=1.5)
    with pytest.raises(ValueError, match="--escalate nowhere"):
        decider(escalate_to="nowhere")


@pytest.fixture(scope="module")
def two_servers() -> tuple[str, str]:
    """The embedded general model behind a front that serves the robot model and escalates to the general one."""
    with serve_cli() as back:
        flags = ["--model", "sparrow-nano-robot-v1.2", "--upstream-systemone", back]
        flags += ["--upstream-model", "sparrow-nano-general-v1.1", "--upstream-name", "general"]
        with serve_cli(*flags, "--escalate", "general", "--escalate-below", "0.9") as front:
            yield front, back


def test_escalation_end_to_end_between_two_servers(two_servers: tuple[str, str]) -> None:
    front, _ = two_servers
    body = {
        "model": "sparrow-nano-robot-v1.2",
        "state": "I was charged twice, refund me now!",
        "questions": {
            "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None}},
            "refund": {"type": "noul", "instructions": "Does the customer want money back?"},
        },
        "diagnostics": True,
    }
    reply = httpx.post(front + "/v1/systemone", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    answers, usage = reply.json()["answers"], reply.json()["usage"]
    engines = {key: answer["diagnostics"]["answered_by"] for key, answer in answers.items()}
    escalated = [key for key, engine in engines.items() if engine == "general"]
    assert escalated, f"at 0.9 the small model is unsure of something: {engines}"
    for key in escalated:
        assert answers[key]["diagnostics"]["engine"] == "jev:sparrow-nano-general-v1.1"
        assert answers[key]["diagnostics"]["escalated_from"]["confidence"] < 0.9
    assert usage["escalation"]["model"] == "general" and usage["escalation"]["questions"] == len(escalated)
    assert usage["input_tokens"] > usage["escalation"]["input_tokens"] > 0
    metrics = httpx.get(front + "/metrics", timeout=10).text
    line = 'canvasread_escalated_questions_total{model="sparrow-nano-robot-v1.2",target="general"}'
    assert f"{line} {float(len(escalated))}" in metrics
    sdk_style = {**body, "escalate": {"below": 0}}
    assert "escalation" not in httpx.post(front + "/v1/systemone", json=sdk_style, timeout=60).json()["usage"]


def test_eval_escalate_sweeps_thresholds_over_http(two_servers: tuple[str, str], tmp_path: Path) -> None:
    front, _ = two_servers
    data = tmp_path / "decisions.jsonl"
    lines = [
        {"id": f"d{i}", "state": text, "question": {"type": "noul", "instructions": "Is it about money?"}}
        for i, text in enumerate(["I was charged twice", "The app crashes", "Refund please", "Login fails"] * 3)
    ]
    expected = ["true" if i % 2 == 0 else "false" for i in range(len(lines))]
    data.write_text(
        "".join(json.dumps({**line, "expected": e}) + "\n" for line, e in zip(lines, expected, strict=True))
    )
    out = tmp_path / "escalation"
    flags = ["--url", front, "--model", "sparrow-nano-robot-v1.2", "--escalate", "general", "--out", str(out)]
    result = canvasread("eval", str(data), *flags)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((out / "escalation.json").read_text())
    rows = report["thresholds"]
    assert report["n"] == 12 and rows[0]["below"] == 0 and rows[-1]["below"] == 1
    assert rows[0]["escalated"] == 0 and rows[-1]["share_escalated"] == pytest.approx(1.0)
    assert rows[-1]["accuracy"] == pytest.approx(report["target_alone"]["accuracy"])
    assert [row["share_escalated"] for row in rows] == sorted(row["share_escalated"] for row in rows)
    assert (out / "escalation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| below |" in (out / "escalation.md").read_text()
