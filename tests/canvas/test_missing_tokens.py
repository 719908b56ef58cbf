"""A tokenizer without one optional feature's token loads the model and refuses only that feature, with why.

Span and spans questions end their blank at `<turn|>` and a thought ends there too, so each needs it as one
token; every labelled question reads without it. The checkpoint here is the tiny one with `<turn|>` taken
out of its tokenizer's special tokens (it then splits into three), served as the README starts a model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import post, serve_cli

from canvasread.canvas.tokenizer import HFTokenizer

STATE = "Ada Lovelace wrote the first program."


def without_turn_token(source: Path, target: Path) -> Path:
    """A copy of the checkpoint whose tokenizer no longer keeps `<turn|>` as one token."""
    shutil.copytree(source, target)
    tokenizer = json.loads((target / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [entry for entry in tokenizer["added_tokens"] if entry["content"] != "<turn|>"]
    (target / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {
        key: entry for key, entry in config["added_tokens_decoder"].items() if entry["content"] != "<turn|>"
    }
    config["eos_token"] = "<eos>"
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


@pytest.fixture(scope="module")
def split_turn_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = without_turn_token(tiny_checkpoint, tmp_path_factory.mktemp("no-turn") / "no-turn")
    assert len(HFTokenizer.load(str(folder)).encode("<turn|>")) > 1
    return folder


@pytest.fixture(scope="module")
def server(split_turn_checkpoint: Path) -> Iterator[str]:
    with serve_cli("--model", str(split_turn_checkpoint), ready_timeout=240) as base:
        yield base


def ask(base: str, questions: dict[str, Any], **extra: Any) -> Any:
    return post(base, {"model": "jev-latest", "state": STATE, "questions": questions, **extra}, timeout=120)


def test_the_model_loads_and_answers_labelled_questions(server: str) -> None:
    response = ask(server, {"who": {"type": "choice", "criteria": {"Ada": None, "Alan": None}}})
    assert response.status_code == 200, response.text
    assert set(response.json()["answers"]["who"]["probabilities"]) == {"Ada", "Alan"}


@pytest.mark.parametrize("kind", ["span", "spans"])
def test_a_span_question_is_refused_naming_the_token(server: str, kind: str) -> None:
    response = ask(server, {"name": {"type": kind, "instructions": "Who wrote it?"}})
    assert response.status_code == 422, response.text
    [entry] = response.json()["detail"]
    assert entry["loc"] == ["body", "questions", "name", kind]
    assert f"cannot answer {kind} questions" in entry["msg"] and "'<turn|>' is 3 tokens" in entry["msg"]


def test_a_thought_is_refused_naming_the_token(server: str) -> None:
    response = ask(server, {"q": {"type": "noul", "instructions": "Is it about a program?"}}, think=8)
    assert response.status_code == 422, response.text
    [entry] = response.json()["detail"]
    assert entry["loc"] == ["body", "think"] and "does not keep <turn|> as one token" in entry["msg"]
