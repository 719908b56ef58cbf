"""The README's examples run as written and print what the README says they print (on the embedded model)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import serve_cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def shell(command: str, **replacements: str) -> subprocess.CompletedProcess[str]:
    """A README command line run by bash from the repository root, as a user who cloned it types it
    (`canvasread` is this interpreter's console script); each replacement swaps a text such as the URL."""
    for old, new in replacements.items():
        assert old in command, (old, command)
        command = command.replace(old, new)
    environment = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "COLUMNS": "160"}
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_client_example_prints_what_the_readme_says(sparrow_server: str) -> None:
    client = section("Use it from the official client")
    code = code_blocks(client, "python")[0]
    claimed = re.search(r"this prints `([^`]+)`", client)
    assert claimed, "the README says what the example prints"
    assert 'base_url="http://127.0.0.1:8011"' in code
    code = code.replace('base_url="http://127.0.0.1:8011"', f'base_url="{sparrow_server}"')
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == claimed.group(1)


def test_the_shell_example_answers_what_the_readme_says() -> None:
    shell = section("Ask from the shell")
    first = code_blocks(shell, "bash")[0].split("\ncanvasread ", 1)[0]
    argv = shlex.split(first.replace("\\\n", " "))
    assert argv[:2] == ["canvasread", "ask"] and "--url" not in argv
    run = subprocess.run(
        [sys.executable, "-m", "canvasread", *argv[1:], "--json"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    answers = list(json.loads(run.stdout)["answers"].values())
    claim = re.search(r"billing with probability ([\d.]+), tone ([\d.]+)", shell)
    assert claim, "the README says what the embedded model answers"
    [choice] = [a for a in answers if a["type"] == "choice"]
    [score] = [a for a in answers if a["type"] == "score"]
    assert choice["choice"] == "billing"
    assert f"{choice['probabilities']['billing']:.3f}" == claim.group(1)
    assert f"{score['score']:.2f}" == claim.group(2)


def test_the_library_example_runs() -> None:
    [code] = code_blocks(section("Library"), "python")
    embedded = code.split("\ncheckpoint = ", 1)[0]
    run = subprocess.run([sys.executable, "-c", embedded], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_the_example_files_answer_as_the_flags_do() -> None:
    shell_section = section("Ask from the shell")
    [line] = [line for line in code_blocks(shell_section, "bash")[0].splitlines() if "examples/" in line]
    run = shell(line.split("  #")[0])
    assert run.returncode == 0, run.stderr
    answers = json.loads(run.stdout)["answers"]
    claim = re.search(r"billing with probability ([\d.]+), tone ([\d.]+)", shell_section)
    assert claim, "the README says what the embedded model answers"
    assert answers["team"]["choice"] == "billing"
    assert f"{answers['team']['probabilities']['billing']:.3f}" == claim.group(1)
    assert f"{answers['tone']['score']:.2f}" == claim.group(2)


def test_the_streamed_pipeline_example_runs_from_its_file(sparrow_server: str) -> None:
    stages = section("Questions that depend on each other, and streamed answers")
    body = json.loads(code_blocks(stages, "json")[0])
    assert json.loads((ROOT / "examples" / "pipeline.json").read_text()) == body
    [curl] = code_blocks(stages, "bash")
    run = shell(curl.strip(), **{"http://127.0.0.1:8011": sparrow_server})
    assert run.returncode == 0, run.stderr
    events = [line.removeprefix("event: ") for line in run.stdout.splitlines() if line.startswith("event: ")]
    assert events[-1] == "done" and "error" not in events
    assert {"answer", "skipped"} <= set(events)


CPU_SECTION = "Try the DiffusionGemma features on a CPU"
README_URL = "http://127.0.0.1:8011"
KINDS = {"noul": "noul", "choice": "choice", "score": "score", "span": "found", "spans": "spans"}


def cpu_commands() -> tuple[list[str], list[str]]:
    """The section's setup lines (comments dropped) and its curl commands, each with its comment line."""
    setup, reads = code_blocks(section(CPU_SECTION), "bash")
    lines = [line.split("  #")[0].strip() for line in setup.strip().splitlines()]
    return lines, re.split(r"\n(?=# )", reads.strip())


@pytest.fixture(scope="module")
def cpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The section's `tiny-checkpoint` and `serve` lines as written (its folder put under a temp dir)."""
    _, _, write, serve = cpu_commands()[0]
    folder = str(tmp_path_factory.mktemp("readme") / "tiny")
    written = shell(write, **{"./tiny": folder})
    assert written.returncode == 0, written.stderr
    assert f"serve it with: canvasread serve --model {folder}" in written.stdout
    argv = shlex.split(serve.replace("./tiny", folder))
    assert argv[:2] == ["canvasread", "serve"] and "--port" not in argv
    with serve_cli(*argv[2:]) as base:
        yield base


def test_the_cpu_install_lines_pin_the_cpu_torch_before_the_extra() -> None:
    """pip cannot reach PyTorch's index here, so the install lines are checked, not run: the CPU wheel of the
    torch the suite runs on, from PyTorch's CPU index, installed before the extra (which it then satisfies)."""
    import torch

    torch_line, extra_line, _, _ = cpu_commands()[0]
    version = torch.__version__.split("+")[0]
    assert torch_line == f"pip install torch=={version} --index-url https://download.pytorch.org/whl/cpu"
    assert f"TORCH ?= torch=={version}" in (ROOT / "Makefile").read_text()
    assert extra_line == "pip install '.[diffusion]'"


@pytest.mark.parametrize("index", range(len(cpu_commands()[1])))
def test_each_cpu_curl_answers_every_question_in_its_shape(cpu_server: str, index: int) -> None:
    command = cpu_commands()[1][index]
    body = json.loads(re.search(r"-d '(.*)'", command, flags=re.S).group(1))  # type: ignore[union-attr]
    run = shell(command, **{README_URL: cpu_server})
    assert run.returncode == 0, run.stderr
    answered = json.loads(run.stdout)
    answers = answered["answers"]
    assert list(answers) == list(body["questions"]), answered
    for key, question in body["questions"].items():
        answer = answers[key]
        assert answer["type"] == question["type"] and KINDS[question["type"]] in answer, answer
        pieces = answer.get("spans", [answer] if question["type"] == "span" else [])
        assert all(body["state"][p["start"] : p["end"]] == p["text"] for p in pieces), answer
        if "probabilities" in answer:
            assert sum(answer["probabilities"].values()) == pytest.approx(1.0)
    diagnostics = [answer.get("diagnostics", {}) for answer in answers.values()]
    if "steps" in body:
        assert all(d["steps"] == body["steps"] for d in diagnostics)
    if "think" in body:
        assert all(0 < d["thought"]["tokens"] <= body["think"] for d in diagnostics)


def test_the_cpu_box_example_prints_a_box_from_the_sdk(cpu_server: str) -> None:
    [code] = code_blocks(section(CPU_SECTION), "python")
    assert f'base_url="{README_URL}"' in code
    code = code.replace(README_URL, cpu_server)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    edges = dict(re.findall(r"(top|bottom|left|right)=([\d.]+)", run.stdout))
    assert set(edges) == {"top", "bottom", "left", "right"}, run.stdout
    assert (
        0 <= float(edges["top"]) <= float(edges["bottom"]) <= 1
        and 0 <= float(edges["left"]) <= float(edges["right"]) <= 1
    )
    assert 0 <= float(run.stdout.split()[-1]) <= 1
