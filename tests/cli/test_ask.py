from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error, canvasread, serve_app

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.types import DecisionRequest


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


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--choice", "Which?"), "--choice 'Which?' has no options: add -o/--option after it"),
        (("--score", "How?"), "--score 'How?' has no options: add -l/--level after it"),
        (("--noul", "Ok?", "--samples", "lots"), "--samples takes a number of reads or auto, not 'lots'"),
    ],
)
def test_ask_reports_invalid_questions_in_the_words_of_its_flags(args: tuple[str, ...], expected: str) -> None:
    line = assert_one_line_error(canvasread("ask", "x", *args), expected)
    assert "criteria" not in line


def test_one_token_is_one_token() -> None:
    result = canvasread("ask", "hi", "--noul", "Is this a greeting?")
    assert result.returncode == 0, result.stderr
    [usage] = [line for line in result.stdout.splitlines() if line.startswith("usage:")]
    assert usage.endswith(", 1 output token")


def test_the_request_flags_reach_the_server() -> None:
    seen: list[DecisionRequest] = []

    def answer(request: DecisionRequest) -> list[list[float]]:
        seen.append(request)
        return [[0.6, 0.4] for _ in request.questions]

    with serve_app(create_app(Decider([FunctionBackend(answer)]))) as base:
        flags = ("--seed", "7", "--samples", "3", "--diagnostics", "--order", "rotate", "--min-confidence", "0.99")
        result = canvasread("ask", "x", "--choice", "Team?", "-o", "a", "-o", "b", *flags, "--url", base, "--json")
        table = canvasread("ask", "x", "--noul", "Ok?", "--diagnostics", "--url", base)
    assert result.returncode == 0, result.stderr
    options = seen[0].options
    assert (options.seed, options.samples, options.diagnostics) == (7, 3, True)
    assert len(seen[0].questions) == 2  # as-given and one rotation, in one read
    answer_json = json.loads(result.stdout)["answers"]["choice"]
    assert answer_json["abstain"] is True and answer_json["diagnostics"]["rotations"] == 2
    assert "diagnostics of noul: {" in table.stdout


def test_a_state_argument_that_replaces_the_files_says_so(tmp_path: Path) -> None:
    path = tmp_path / "body.json"
    path.write_text(json.dumps({"state": "from the file", "questions": {"q": {"type": "noul", "instructions": "?"}}}))
    result = canvasread("ask", "-", "--file", str(path), "--json", stdin="from standard input")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "warning: the state from standard input replaces the state in --file"
    quiet = canvasread("ask", "--file", str(path), "--json")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_several_choices_and_scores_each_keep_their_own_options() -> None:
    result = canvasread(
        "ask", "I was charged twice and I am furious",
        "--choice", "Which team?", "-o", "billing", "-o", "technical",
        "--score", "How angry?", "-l", "calm", "-l", "furious",
        "--choice", "Which language?", "-o", "english", "-o", "french",
        "--score", "How urgent?", "-l", "low", "-l", "high",
        "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)["answers"]
    assert list(answers) == ["choice_1", "score_1", "choice_2", "score_2"]
    assert list(answers["choice_1"]["probabilities"]) == ["billing", "technical"]
    assert list(answers["choice_2"]["probabilities"]) == ["english", "french"]
    assert answers["score_1"]["legend"] == {"0": "calm", "1": "furious"}
    assert answers["score_2"]["legend"] == {"0": "low", "1": "high"}


def test_the_table_names_questions_and_levels_not_types_and_indices() -> None:
    result = canvasread(
        "ask",
        "I am furious",
        "--noul",
        "Is the customer upset?",
        "--score",
        "How angry?",
        "-l",
        "calm",
        "-l",
        "furious",
    )
    assert result.returncode == 0, result.stderr
    assert "Is the customer upset?" in result.stdout and "How angry?" in result.stdout
    assert "noul" not in result.stdout and "score_" not in result.stdout
    bars = [line for line in result.stdout.splitlines() if "█" in line or "·····" in line]
    labels = [line.split("│")[-2].split()[0] for line in bars]
    assert labels == ["yes", "no", "calm", "furious"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("-o", "billing"), "-o/--option 'billing' needs a --choice question before it"),
        (("--choice", "Team?", "-l", "calm"), "-l/--level 'calm' needs a --score question before it"),
        (("--score", "Angry?", "-o", "billing"), "-o/--option 'billing' needs a --choice question before it"),
    ],
)
def test_an_option_or_level_without_its_question_says_so(args: tuple[str, ...], expected: str) -> None:
    assert_one_line_error(canvasread("ask", "x", *args), expected)


def test_span_answers_from_a_served_model_print_as_pieces(tiny_thinking_server: str, tmp_path: Path) -> None:
    questions = {
        "who": {"type": "span", "instructions": "Who is refunded?"},
        "names": {"type": "spans", "instructions": "Every name"},
    }
    path = tmp_path / "request.json"
    path.write_text(json.dumps({"questions": questions, "seed": 4}))  # the same reads for the table and the JSON
    state = "Refund Zoë for order 1182."
    result = canvasread("ask", state, "--file", str(path), "--url", tiny_thinking_server)
    assert result.returncode == 0, result.stderr
    assert "Who is refunded?" in result.stdout and "Every name" in result.stdout
    assert result.stdout.count("confidence") == 2
    raw = json.loads(canvasread("ask", state, "--file", str(path), "--url", tiny_thinking_server, "--json").stdout)
    for answer in raw["answers"].values():
        pieces = answer["spans"] if answer["type"] == "spans" else [answer] if answer["found"] else []
        shown = [f"{p['text']!r} at {p['start']}:{p['end']}" for p in pieces] or ["not found"]
        assert all(text in result.stdout for text in shown)


def test_the_responses_warnings_are_printed_below_the_table(tmp_path: Path) -> None:
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"questions": {"q": {"type": "noul", "instructions": "Refund?", "ask_iff": {}}}}))
    result = canvasread("ask", "   ", "--file", str(body))
    assert result.returncode == 0, result.stderr
    assert "warning: questions.q.noul.ask_iff: unknown key 'ask_iff' (did you mean 'ask_if'?)" in result.stderr
    assert "warning: state: the state is empty" in result.stderr
