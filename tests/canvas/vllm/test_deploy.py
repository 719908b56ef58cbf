"""The deployment recipes under deploy/: they install, parse, point at real routes, and start in the right order.

There is no Docker engine or GPU here, so the Dockerfile's Python layer is
built as its RUN line says (in a clean virtual environment) and then serves
through the vLLM stand-in; every canvasread flag in the manifests is parsed by
the real CLI; and the Cloud Run entrypoint runs with the stand-in as `vllm`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from helpers import free_port, wait_until
from typer.main import get_command
from vllm_standin import Standin, create_app, load_standin, running

from canvasread.backends.base import FunctionBackend
from canvasread.cli import app as cli_app
from canvasread.decide import Decider
from canvasread.server.app import create_app as create_canvasread_app

REPO = Path(__file__).parents[3]
DEPLOY = REPO / "deploy"
STANDIN = Path(__file__).parent / "vllm_standin.py"
QUESTIONS = {"refund": {"type": "noul", "instructions": "Is the customer asking for money back?"}}
# The `vllm serve` flags the recipes use, as vLLM documents them (engine arguments and the OpenAI server's).
VLLM_FLAGS = {
    "--served-model-name",
    "--diffusion-config",
    "--max-num-seqs",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--host",
    "--port",
}


# Flags that change nothing for canvasread's reads in vLLM 0.33 (read in its source), so the recipes leave them out.
NO_EFFECT = {
    # completions passes `logprobs=None` to SamplingParams when `logprob_token_ids` is given, and only `logprobs`
    # is checked against max_logprobs (sampling_params.py `_validate_logprobs`).
    "--max-logprobs",
    # CacheConfig.enable_prefix_caching defaults to True for generative decoder models (config/cache.py, model.py).
    "--enable-prefix-caching",
    # async scheduling is on by default where supported (config/vllm.py); since 0.32 the diffusion scheduler
    # accepts a narrower canvas with or without it (DiffusionScheduler trims the draft to the request's width).
    "--async-scheduling",
}
VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"


def canvasread_routes() -> set[str]:
    app = create_canvasread_app(Decider([FunctionBackend(lambda request: [])]))
    return {getattr(route, "path", "") for route in app.routes}


def vllm_routes() -> set[str]:
    return {getattr(route, "path", "") for route in create_app(Standin(None, "dgemma", "m", 64, 4096)).routes}


def serve_flags(args: list[str]) -> dict[str, Any]:
    """Parse `canvasread serve ARGS` with the real CLI (unknown or malformed flags raise) and return its values."""
    serve = get_command(cli_app).commands["serve"]  # type: ignore[attr-defined]
    return dict(serve.make_context("serve", list(args)).params)


def vllm_flags(args: list[str]) -> tuple[str, dict[str, str]]:
    """The model and the `--flag=value` / `--flag value` options of a `vllm serve` command line."""
    model, options, rest = args[0], {}, list(args[1:])
    while rest:
        flag = rest.pop(0)
        name, _, value = flag.partition("=")
        if not value and rest and not rest[0].startswith("--"):
            value = rest.pop(0)
        options[name] = value
    assert set(options) <= VLLM_FLAGS, set(options) - VLLM_FLAGS
    return model, options


def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    steps, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        instruction, arguments = (pending + line).split(None, 1)
        steps.append((instruction.upper(), arguments))
        pending = ""
    return steps


def entrypoint_args(path: Path) -> list[str]:
    [arguments] = [arguments for instruction, arguments in dockerfile(path) if instruction == "ENTRYPOINT"]
    parsed: list[str] = json.loads(arguments)
    return parsed


@pytest.fixture(scope="module")
def standin(tiny_checkpoint: Path) -> Iterator[str]:
    with running(load_standin(str(tiny_checkpoint), served_name="dgemma")) as base:
        yield base


def build_python_layer(path: Path, context: Path, venv: Path) -> None:
    """Run the build stage's WORKDIR, COPY and RUN steps as Docker would, the image's /opt/canvasread at `venv`."""
    steps = dockerfile(path)
    build = steps[1 : [i for i, (instruction, _) in enumerate(steps) if instruction == "FROM"][1]]
    workdir = context / next(a for i, a in build if i == "WORKDIR").lstrip("/")
    workdir.mkdir(parents=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # uv comes from the test extra
    for instruction, arguments in build:
        if instruction == "ENV":
            env.update(pair.split("=", 1) for pair in arguments.split())
        elif instruction == "COPY" and not arguments.startswith("--from="):
            *sources, target = arguments.split()
            for source in sources:
                destination = workdir / target / Path(source).name if target.endswith("/") else workdir / target
                if (REPO / source).is_dir():  # what Dockerfile.dockerignore leaves out stays out
                    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
                    shutil.copytree(REPO / source, destination, ignore=skip)
                else:
                    shutil.copy(REPO / source, destination)
        elif instruction == "RUN":
            command = re.sub(r"--mount=\S+\s*", "", arguments).replace("/opt/canvasread", str(venv))
            subprocess.run(["bash", "-c", command], cwd=workdir, check=True, timeout=1200, env=env)


def test_the_dockerfile_python_layer_installs_without_torch_and_serves(
    tmp_path: Path, tiny_checkpoint: Path, standin: str
) -> None:
    venv = tmp_path / "venv"
    build_python_layer(DEPLOY / "Dockerfile", tmp_path / "context", venv)
    assert subprocess.run([venv / "bin" / "python", "-c", "import torch"], capture_output=True).returncode != 0
    entrypoint = entrypoint_args(DEPLOY / "Dockerfile")
    assert entrypoint[:2] == ["canvasread", "serve"]
    port = free_port()
    upstream = ["--upstream", standin, "--tokenizer", str(tiny_checkpoint), "--upstream-canvas-length", "256"]
    args = [*entrypoint[2:], *upstream]
    args[args.index("--host") + 1], args[args.index("--port") + 1] = "127.0.0.1", str(port)
    process = subprocess.Popen(
        [venv / "bin" / "canvasread", "serve", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(base + "/ready", timeout=120)
        body = {"model": "dgemma", "state": "I was charged twice", "questions": QUESTIONS}
        reply = httpx.post(base + "/v1/systemone", json=body, timeout=120)
        assert reply.status_code == 200 and 0.0 <= reply.json()["answers"]["refund"]["noul"] <= 1.0
    finally:
        process.terminate()
        process.wait(timeout=30)


def check_pairing(canvasread: dict[str, Any], vllm: dict[str, str], upstream_host: str, vllm_port: int) -> None:
    """canvasread's upstream flags agree with the vLLM it points at."""
    assert canvasread["upstream_model"] == vllm["--served-model-name"]
    assert canvasread["upstream_canvas_length"] == json.loads(vllm["--diffusion-config"])["canvas_length"]
    assert not NO_EFFECT & vllm.keys()
    assert int(vllm["--port"]) == vllm_port
    for url in canvasread["upstream"]:
        parts = urlsplit(url)
        assert parts.port == vllm_port and parts.hostname is not None and parts.hostname.endswith(upstream_host)


def http_probe_path(test: list[str]) -> tuple[str, int]:
    """The path and port a `python -c "urlopen('http://127.0.0.1:PORT/PATH')"` healthcheck asks."""
    url = test[-1].split("urlopen('", 1)[1].split("'", 1)[0]
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1" and parts.port is not None
    return parts.path, parts.port


def test_compose_runs_vllm_with_the_diffusion_config_beside_canvasread() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    vllm, canvasread = compose["services"]["vllm"], compose["services"]["canvasread"]
    assert (DEPLOY / canvasread["build"]["context"] / canvasread["build"]["dockerfile"]).resolve() == (
        DEPLOY / "Dockerfile"
    ).resolve()
    model, options = vllm_flags(vllm["command"])
    assert model == "google/diffusiongemma-26B-A4B-it" and vllm["image"] == VLLM_IMAGE
    assert vllm["environment"]["VLLM_BATCH_INVARIANT"] == "1"
    entrypoint = entrypoint_args(DEPLOY / "Dockerfile")
    flags = serve_flags([*entrypoint[2:], *canvasread["command"]])
    check_pairing(flags, options, "vllm", 8000)
    assert http_probe_path(canvasread["healthcheck"]["test"]) == ("/ready", flags["port"])
    assert "/ready" in canvasread_routes()
    assert canvasread["ports"] == [f"{flags['port']}:{flags['port']}"]
    assert http_probe_path(vllm["healthcheck"]["test"]) == ("/health", int(options["--port"]))
    assert "/health" in vllm_routes()
    assert vllm["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_the_kubernetes_manifest_pairs_every_vllm_pod_with_canvasread_probes() -> None:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()))
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    vllm_set = by_kind["StatefulSet", "vllm"]
    headless = by_kind["Service", vllm_set["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    [vllm] = vllm_set["spec"]["template"]["spec"]["containers"]
    model, options = vllm_flags(vllm["args"])
    assert model == "google/diffusiongemma-26B-A4B-it" and vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert vllm["image"] == VLLM_IMAGE
    assert {"name": "VLLM_BATCH_INVARIANT", "value": "1"} in vllm["env"]
    vllm_port = vllm["ports"][0]["containerPort"]
    assert headless["spec"]["ports"][0]["port"] == vllm_port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": vllm_port}
    assert "/health" in vllm_routes()

    deployment = by_kind["Deployment", "canvasread"]
    [canvasread] = deployment["spec"]["template"]["spec"]["containers"]
    flags = serve_flags([*entrypoint_args(DEPLOY / "Dockerfile")[2:], *canvasread["args"]])
    check_pairing(flags, options, headless["metadata"]["name"], vllm_port)
    pods = {f"vllm-{i}.{headless['metadata']['name']}" for i in range(vllm_set["spec"]["replicas"])}
    assert {urlsplit(url).hostname for url in flags["upstream"]} == pods, "one --upstream per vLLM pod"
    assert canvasread["ports"][0]["containerPort"] == flags["port"]
    assert canvasread["readinessProbe"]["httpGet"] == {"path": "/ready", "port": flags["port"]}
    assert canvasread["livenessProbe"]["httpGet"] == {"path": "/health", "port": flags["port"]}
    assert {"/ready", "/health"} <= canvasread_routes()
    service = by_kind["Service", "canvasread"]
    assert service["spec"]["ports"][0]["targetPort"] == flags["port"]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]


def write_shim(folder: Path, body: str) -> Path:
    shim = folder / "vllm"
    shim.write_text("#!/usr/bin/env bash\n" + body)
    shim.chmod(0o755)
    return shim


def entrypoint_env(tmp_path: Path, vllm_bin: Path, **extra: str) -> tuple[dict[str, str], int, int]:
    port, vllm_port = free_port(), free_port()
    env = {
        **os.environ,
        "PORT": str(port),
        "VLLM_PORT": str(vllm_port),
        "CANVASREAD_BIN": str(Path(sys.executable).parent / "canvasread"),
        "VLLM_BIN": str(vllm_bin),
        "CANVASREAD_ARGS": "--log-level warning",
        **extra,
    }
    return env, port, vllm_port


def closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_the_cloud_run_entrypoint_starts_canvasread_first_then_vllm(tmp_path: Path, tiny_checkpoint: Path) -> None:
    marker, pid_file = tmp_path / "canvasread-was-listening", tmp_path / "vllm.pid"
    shim = write_shim(
        tmp_path,
        f'(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && touch {marker}\n'
        f"echo $$ > {pid_file}\n"
        f'exec {shlex.quote(sys.executable)} {shlex.quote(str(STANDIN))} "$@"\n',
    )
    env, port, vllm_port = entrypoint_env(tmp_path, shim, MODEL=str(tiny_checkpoint))
    entrypoint = subprocess.Popen(["bash", str(DEPLOY / "cloudrun" / "entrypoint.sh")], env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(base + "/health", timeout=60)
        wait_until(base + "/ready", timeout=180)
        assert marker.exists(), "vLLM was started before canvasread listened"
        body = {"model": "dgemma", "state": "I was charged twice", "questions": QUESTIONS}
        assert httpx.post(base + "/v1/systemone", json=body, timeout=120).status_code == 200
        os.kill(int(pid_file.read_text()), signal.SIGKILL)  # vLLM dies: the container must stop, not limp on
        assert entrypoint.wait(timeout=60) != 0
        assert closed(port) and closed(vllm_port)
    finally:
        if entrypoint.poll() is None:
            os.killpg(entrypoint.pid, signal.SIGKILL)
            entrypoint.wait()


def test_the_cloud_run_entrypoint_stops_both_on_sigterm(tmp_path: Path, tiny_checkpoint: Path) -> None:
    shim = write_shim(tmp_path, "exec sleep 600\n")
    env, port, _ = entrypoint_env(tmp_path, shim, MODEL=str(tiny_checkpoint))
    entrypoint = subprocess.Popen(["bash", str(DEPLOY / "cloudrun" / "entrypoint.sh")], env=env, start_new_session=True)
    try:
        wait_until(f"http://127.0.0.1:{port}/health", timeout=60)
        assert httpx.get(f"http://127.0.0.1:{port}/ready", timeout=10).status_code == 503
        entrypoint.send_signal(signal.SIGTERM)
        entrypoint.wait(timeout=60)
        deadline = time.monotonic() + 30
        while not closed(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert closed(port)
        sleepers = subprocess.run(["pgrep", "-s", str(entrypoint.pid)], capture_output=True, text=True).stdout.split()
        assert not sleepers, "every process of the container has exited"
    finally:
        if entrypoint.poll() is None:
            os.killpg(entrypoint.pid, signal.SIGKILL)
            entrypoint.wait()


def test_the_cloud_run_image_installs_canvasread_apart_from_vllm() -> None:
    steps = dockerfile(DEPLOY / "cloudrun" / "Dockerfile")
    arguments = {instruction: [a for i, a in steps if i == instruction] for instruction, _ in steps}
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert arguments["ARG"] == [f"VLLM_IMAGE={compose['services']['vllm']['image']}"] == [f"VLLM_IMAGE={VLLM_IMAGE}"]
    assert "VLLM_BATCH_INVARIANT=1" in arguments["ENV"][0].split()
    assert not [flag for flag in NO_EFFECT if flag in (DEPLOY / "cloudrun" / "entrypoint.sh").read_text()]
    copied: dict[str, str] = {}
    for copy in arguments["COPY"]:
        *sources, target = [word for word in copy.split() if not word.startswith("--chmod=")]
        if not sources[0].startswith("--from="):
            assert all((REPO / source).exists() for source in sources), sources
            copied.update({source: target for source in sources})
    assert json.loads(arguments["ENTRYPOINT"][0]) == [copied["deploy/cloudrun/entrypoint.sh"]]
    [install] = arguments["RUN"]
    venv = re.search(r"uv venv \S+ \S+ (\S+)", install)
    assert venv is not None and "[upstream]" in install
    assert f"CANVASREAD_BIN={venv.group(1)}/bin/canvasread" in arguments["ENV"][0]
