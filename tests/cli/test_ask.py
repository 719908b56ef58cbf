from __future__ import annotations

import json
from pathlib import Path

from canvasread_cli import assert_one_line_error, canvasread


def test_ask_with_flags_prints_a_table() -> None:
    result = canvasread(
        "ask",
        "I was charged twice, refund me!",
        "--noul",
        "Is this about money?",
        "--choice",
        "Which team?",
        "-o",
        "billing=charges and refunds",
        "-o",
        "technical",
        "--score",
        "How angry?",
        "-l",
        "calm",
        "-l",
        "angry",
    )
    assert result.returncode == 0, result.stderr
    for text in (
        "Is this about money?",
        "Which team?",
        "How angry?",
        "billing",
        "technical",
        "confidence",
        "█",
        "usage:",
    ):
        assert text in result.stdout


def test_ask_json_from_a_file_and_stdin(tmp_path: Path) -> None:
    questions = {"team": {"type": "choice", "criteria": {"billing": None, "sales": None}}}
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(questions))
    result = canvasread("ask", "-", "--file", str(path), "--json", stdin="I want to buy 40 more seats")
    assert result.returncode == 0, result.stderr
    response = json.loads(result.stdout)
    assert response["model"] == "sparrow-nano-general-v1.1"
    assert list(response["answers"]["team"]["probabilities"]) == ["billing", "sales"]


def test_ask_a_running_server(sparrow_server: str) -> None:
    result = canvasread("ask", "hello", "--noul", "Is this a greeting?", "--url", sparrow_server, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["answers"]["noul"]["type"] == "noul"


def test_ask_reports_invalid_questions_clearly() -> None:
    result = canvasread("ask", "x", "--choice", "Which?")
    assert_one_line_error(result, "criteria")
