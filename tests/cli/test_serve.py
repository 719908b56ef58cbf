"""`canvasread serve` refuses at start a model that can never load, instead of a dead server (issue 15.5)."""

from __future__ import annotations

import socket
import statistics
import time
from pathlib import Path

import httpx
import pytest
import torch
from helpers import assert_one_line_error, canvasread, free_port, serve_cli, wait_until


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("sparrow-nope", "no model 'sparrow-nope'"),
        ("/nonexistent/checkpoint", "no checkpoint folder '/nonexistent/checkpoint'"),
    ],
)
def test_a_model_that_cannot_exist_fails_at_start(model: str, expected: str) -> None:
    # The port is free, so a server that bound anyway would keep running until the timeout.
    result = canvasread("serve", "--model", model, "--port", str(free_port()), timeout=60)
    assert_one_line_error(result, expected)


def test_a_folder_that_is_not_a_checkpoint_fails_at_start(tmp_path: Path) -> None:
    result = canvasread("serve", "--model", str(tmp_path), "--port", str(free_port()), timeout=60)
    assert_one_line_error(result, str(tmp_path), "no config.json")


def test_a_missing_extra_fails_at_start_with_the_install_line() -> None:
    result = canvasread(
        "serve", "--model", "org/checkpoint", "--port", str(free_port()), without=("torch",), timeout=60
    )
    assert_one_line_error(result, "pip install 'canvasread[diffusion]'")


def test_a_real_checkpoint_folder_passes_the_start_checks(tiny_checkpoint: Path) -> None:
    with serve_cli("--model", str(tiny_checkpoint), ready_timeout=240) as base:
        assert wait_until(base + "/ready").json()["status"] == "ready"


def test_a_port_in_use_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = canvasread("serve", "--port", str(port), timeout=60)
    assert_one_line_error(result, f"cannot listen on 127.0.0.1:{port}", "in use", "is a server running there?")
    assert result.stdout == ""  # no banner for a server that never ran, nor a model loaded after it stopped


def test_a_host_that_is_not_this_machine_is_one_line_without_the_port_hint() -> None:
    """192.0.2.1 (TEST-NET-1) is no address of this machine: the hint about a server on the port would mislead."""
    line = assert_one_line_error(canvasread("serve", "--host", "192.0.2.1", timeout=60), "cannot listen on 192.0.2.1")
    assert "is a server running there" not in line


# One device past the GPUs torch counts here: cuda:0 on a CPU machine, as `--device cuda` there.
MISSING_GPU = torch.cuda.device_count()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--dtype", "int7"), ("unknown --dtype 'int7'", "use one of float32")),
        (("--device", f"cuda:{MISSING_GPU}"), (f"no device 'cuda:{MISSING_GPU}' on this machine",)),
        (("--gpus", str(max(2, MISSING_GPU + 1))), (f"no device 'cuda:{max(1, MISSING_GPU)}' on this machine",)),
        (("--device", "gpu"), ("unknown device 'gpu'",)),
        (("--random-weights", "-1"), ("--random-weights must be a finite STD >= 0, not -1",)),
        (("--kv-cache-gib", "0"), ("--kv-cache-gib must be positive",)),
        (("--round", "0"), ("--round must be at least 1",)),
        (("--round", "-1"), ("--round must be at least 1",)),
        (("--timeout", "0"), ("--timeout must be positive",)),
        (("--timeout", "-1"), ("--timeout must be positive",)),
    ],
    ids=[
        "dtype",
        "missing-gpu",
        "too-many-gpus",
        "unknown-device",
        "negative-std",
        "no-kv-store",
        "round-0",
        "round-negative",
        "timeout-0",
        "timeout-negative",
    ],
)
def test_a_setting_that_can_never_work_stops_serve_before_it_binds(
    tiny_checkpoint: Path, flags: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    """Not a server whose /ready says 503 forever (a load that fails) or that answers every request wrongly."""
    result = canvasread("serve", "--model", str(tiny_checkpoint), *flags, "--port", str(free_port()), timeout=60)
    assert_one_line_error(result, *expected)
    assert result.stdout == ""  # no banner: it never bound


def test_max_state_tokens_makes_a_longer_state_a_413_naming_the_flag() -> None:
    question = {"q": {"type": "noul", "instructions": "Is it urgent?"}}
    with serve_cli("--max-state-tokens", "8") as base:
        short = httpx.post(base + "/v1/systemone", json={"model": "default", "state": "a b c", "questions": question})
        long = httpx.post(base + "/v1/systemone", json={"model": "default", "state": "a " * 9, "questions": question})
    assert short.status_code == 200, short.text
    assert long.status_code == 413 and "(--max-state-tokens)" in long.json()["detail"]["message"]


@pytest.mark.parametrize(
    ("tokenizer", "expected"),
    [
        ("org/missing-tokenizer", ("tokenizer 'org/missing-tokenizer' is not a folder and not cached", "hf download")),
        ("/nonexistent/tokenizer", ("tokenizer '/nonexistent/tokenizer' cannot be loaded: no such folder",)),
    ],
    ids=["hub-id-hub-unreachable", "missing-folder"],
)
def test_a_tokenizer_that_cannot_be_found_stops_serve_before_it_binds(
    tmp_path: Path, tokenizer: str, expected: tuple[str, ...]
) -> None:
    """One line and exit 1 at once (the hub's own retries take ~50 s), not a server answering 503 forever.

    The hub is a loopback port nothing listens on, the cache an empty folder: an id that can be nowhere.
    """
    hub = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HOME": str(tmp_path)}
    upstream = ("--upstream", "http://127.0.0.1:9", "--port", str(free_port()))
    result = canvasread("serve", *upstream, "--tokenizer", tokenizer, env=hub, timeout=45)
    assert_one_line_error(result, *expected)
    assert result.stdout == ""  # no banner: it never bound


def test_a_checkpoint_hub_id_that_cannot_be_found_stops_serve_before_it_binds(tmp_path: Path) -> None:
    hub = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HOME": str(tmp_path)}
    result = canvasread("serve", "--model", "org/checkpoint", "--port", str(free_port()), env=hub, timeout=45)
    assert_one_line_error(result, "checkpoint 'org/checkpoint' is not a folder and not cached")


def copy_without(source: Path, target: Path, *names: str) -> Path:
    target.mkdir()
    for path in source.iterdir():
        if path.name not in names:
            (target / path.name).symlink_to(path)
    return target


@pytest.mark.parametrize(
    ("left_out", "expected"),
    [
        (("tokenizer_config.json",), "the folder has no tokenizer_config.json"),
        (("model.safetensors",), "has no weights"),
    ],
    ids=["no-tokenizer", "no-weights"],
)
def test_a_checkpoint_folder_that_can_never_load_stops_serve_before_it_binds(
    tiny_checkpoint: Path, tmp_path: Path, left_out: tuple[str, ...], expected: str
) -> None:
    folder = copy_without(tiny_checkpoint, tmp_path / "checkpoint", *left_out)
    result = canvasread("serve", "--model", str(folder), "--port", str(free_port()), timeout=60)
    assert_one_line_error(result, expected)
    assert result.stdout == ""


def test_a_config_of_another_model_stops_serve_before_it_binds(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    result = canvasread("serve", "--model", str(tmp_path), "--port", str(free_port()), timeout=60)
    assert_one_line_error(result, "holds a 'llama' model, not DiffusionGemma")


def test_answers_on_a_kept_alive_connection_never_wait_for_a_delayed_ack(sparrow_server: str) -> None:
    """Connections to the served socket have TCP_NODELAY: without it an answer on a reused connection (as every
    SDK client keeps one) waited for the client's delayed ACK, at least 40 ms on Linux, where /health takes ~1 ms."""
    times = []
    with httpx.Client(base_url=sparrow_server) as client:
        client.get("/health")
        for _ in range(21):
            start = time.perf_counter()
            assert client.get("/health").status_code == 200
            times.append(time.perf_counter() - start)
    assert statistics.median(times) < 0.040, times
