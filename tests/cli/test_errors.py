"""Ordinary mistakes end in one red line and exit 1, never a traceback; `--debug` shows the traceback (issue 15.4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error, canvasread, serve_cli

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens there


@pytest.mark.parametrize(
    "args",
    [("models", "--url", CLOSED), ("ask", "hi", "--noul", "Greeting?", "--url", CLOSED)],
    ids=["models", "ask"],
)
def test_connection_refused_is_one_line(args: tuple[str, ...]) -> None:
    assert_one_line_error(canvasread(*args), "cannot reach http://127.0.0.1:9", "refused")


def test_debug_shows_the_traceback_instead() -> None:
    result = canvasread("--debug", "models", "--url", CLOSED)
    assert result.returncode == 1 and "Traceback" in result.stderr and "ConnectError" in result.stderr


def test_a_401_from_models_says_so() -> None:
    with serve_cli("--api-key", "right") as base:
        result = canvasread("models", "--url", base, "--api-key", "wrong")
    assert_one_line_error(result, "HTTP 401", "/v1/models")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "is not valid JSON"),
        (json.dumps([{"type": "noul", "instructions": "?"}]), "holds a JSON list"),
        (None, "No such file or directory"),
    ],
    ids=["bad-json", "array", "missing"],
)
def test_ask_file_mistakes(tmp_path: Path, content: str | None, expected: str) -> None:
    path = tmp_path / "questions.json"
    if content is not None:
        path.write_text(content)
    assert_one_line_error(canvasread("ask", "x", "--file", str(path)), str(path), expected)


def test_ask_an_unknown_sparrow_model() -> None:
    assert_one_line_error(canvasread("ask", "x", "--noul", "?", "--model", "sparrow-nope"), "sparrow-nope")


def test_install_hints_keep_their_extra() -> None:
    """rich would read `[diffusion]` as markup and print `pip install 'canvasread'` (issue 15.3)."""
    result = canvasread("ask", "x", "--noul", "?", "--model", "org/checkpoint", without=("torch",))
    assert_one_line_error(result, "pip install 'canvasread[diffusion]'")


def test_no_questions_and_no_state() -> None:
    assert_one_line_error(canvasread("ask", "x"), "no questions")
    assert_one_line_error(canvasread("ask", "--noul", "?"), "no state")


def test_a_bad_setting_is_one_line() -> None:
    assert_one_line_error(canvasread("serve", "--port", "0"), "port must be 1..65535")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("serve", "--port", "abc"), "Invalid value for '--port'"),
        (("serve", "--log-format", "xml"), "'xml' is not one of"),
        (("serve", "--bogus"), "No such option: --bogus"),
        (("nosuch",), "No such command 'nosuch'"),
    ],
    ids=["wrong-type", "not-a-choice", "unknown-flag", "unknown-command"],
)
def test_a_mistake_click_finds_is_one_line_too(args: tuple[str, ...], expected: str) -> None:
    """Before any command runs, Click refuses it: one red line naming the help to read, not a boxed panel; its
    exit status stays Click's for a usage mistake (2)."""
    result = canvasread(*args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert lines[0].endswith(f"{' serve' if args[0] == 'serve' else ''} -h')") and "(see '" in lines[0]


def test_no_arguments_show_the_help() -> None:
    result = canvasread()
    assert "Usage:" in result.stdout and "serve" in result.stdout and "error" not in result.stderr
