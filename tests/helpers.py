"""What the tests share: real servers on loopback, requests, images, waiting on conditions, gated backends."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from canvasread.backends.base import FunctionBackend, never_gone
from canvasread.canvas.backend import CanvasBackend, CanvasRuntime, ReadSettings
from canvasread.canvas.reader import CanvasRead, Reader, SlotLogProbs
from canvasread.canvas.tokenizer import Tokenizer
from canvasread.canvas.vllm.reader import VllmReader
from canvasread.decide import Decider
from canvasread.server.run import uvicorn_config
from canvasread.settings import ServerSettings
from canvasread.types import Capabilities, DecisionRequest, ModelCard
from canvasread.upstream.pool import UpstreamPool


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(url: str, *, status: int = 200, timeout: float = 60.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url, timeout=2)
            if response.status_code == status:
                return response
        except httpx.HTTPError as error:
            last = error
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer {status} within {timeout}s ({last})")


@contextlib.contextmanager
def serve_app(app: FastAPI, *, wait_ready: bool = True, settings: ServerSettings | None = None) -> Iterator[str]:
    """Run an ASGI app under uvicorn in a thread on a free loopback port; yields the base URL.

    With `settings`, uvicorn runs as `canvasread serve` runs it (its protocol, timeouts and connection limit).
    """
    with run_uvicorn(app, wait_ready=wait_ready, settings=settings) as (base, _):
        yield base


@contextlib.contextmanager
def run_uvicorn(
    app: FastAPI, *, wait_ready: bool = True, settings: ServerSettings | None = None
) -> Iterator[tuple[str, uvicorn.Server]]:
    """`serve_app`, also yielding the uvicorn server, for tests that look at its connections."""
    port = free_port()
    if settings is None:
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    else:
        config = uvicorn_config(
            app, dataclasses.replace(settings, port=port), log_level="warning", configure_logging=False
        )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(base + "/health")
        if wait_ready:
            wait_until(base + "/ready")
        yield base, server
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@dataclass
class CliServer:
    """A running `canvasread serve` process; its output goes to a file so a chatty server never blocks on a pipe."""

    base: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def cli_process(*args: str, ready_timeout: float = 120.0, env: dict[str, str] | None = None) -> Iterator[CliServer]:
    """Run `canvasread serve` as a real process; yields it once /ready is 200, and stops it (SIGTERM) after."""
    port = free_port()
    command = [sys.executable, "-m", "canvasread", "serve", "--port", str(port), "--log-level", "warning", *args]
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "server.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=sink, stderr=sink)
        server = CliServer(f"http://127.0.0.1:{port}", process, log)
        try:
            try:
                wait_until(server.base + "/ready", timeout=ready_timeout)
            except TimeoutError:
                process.kill()
                process.wait()
                raise AssertionError(f"server did not become ready:\n{server.output()}") from None
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def serve_cli(*args: str, ready_timeout: float = 120.0, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run `canvasread serve` as a real process; yields the base URL once /ready is 200."""
    with cli_process(*args, ready_timeout=ready_timeout, env=env) as server:
        yield server.base


# ---- requests, images, waiting -----------------------------------------------------------------


def post(base: str, body: Any, **kwargs: Any) -> httpx.Response:
    """POST a JSON body to `/v1/systemone` of the server at `base`."""
    return httpx.post(base + "/v1/systemone", json=body, **{"timeout": 30, **kwargs})


def png(width: int = 4, height: int = 4, colour: tuple[int, int, int] = (0, 0, 0)) -> bytes:
    """A real PNG of one colour, encoded by Pillow."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def eventually(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Wait for `condition` to hold, polling; a deadline, not a sleep that races the code under test."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} never became true within {timeout}s"
        time.sleep(0.01)


def ready(job: str) -> Callable[[], Awaitable[str]]:
    """A `BatchQueue.submit` preparation that gives `job` at once."""

    async def prepare() -> str:
        return job

    return prepare


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until `condition` holds (bounded, so a bug fails instead of hanging)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.001)


# ---- backends that answer on cue ---------------------------------------------------------------


def canvas_backend(decider: Decider, index: int = 0) -> CanvasBackend:
    """The decider's `index`-th served model's backend, which must be a canvas backend."""
    backend = decider.served[index].backend
    assert isinstance(backend, CanvasBackend), f"{backend!r} is not a canvas backend"
    return backend


def scripted_backend(
    reader: Reader, tokenizer: Tokenizer, *, settings: ReadSettings = ReadSettings(), **runtime: Any
) -> CanvasBackend:
    """A loaded canvas backend reading through `reader` (usually scripted) with `tokenizer`; `runtime` overrides the
    other `CanvasRuntime` fields (a 64-token canvas, no position limit by default)."""
    fields: dict[str, Any] = {"canvas_length": 64, "max_positions": None, "fingerprint": "sha256:0", **runtime}
    card = ModelCard("canvas", "a canvas backend over a scripted reader", "2026-01-01")
    backend = CanvasBackend(card, lambda: CanvasRuntime(reader, tokenizer, **fields), settings)
    backend.load()
    return backend


def loaded_runtime(backend: CanvasBackend) -> CanvasRuntime:
    """The backend's runtime (its reader, tokenizer and sizes), which must have loaded."""
    runtime = backend.runtime
    assert runtime is not None, "the backend has not loaded"
    return runtime


def upstream_pool(backend: CanvasBackend) -> UpstreamPool:
    """The upstream pool a vLLM wing's loaded backend reads through."""
    reader = loaded_runtime(backend).reader
    assert isinstance(reader, VllmReader), f"{reader!r} does not read through vLLM"
    return reader.pool


def even(request: DecisionRequest) -> list[list[float]]:
    """Every question answered with the uniform distribution over its options."""
    return [[1 / len(q.options)] * len(q.options) for q in request.questions]


class GatedBackend(FunctionBackend):
    """Answers at once, except: a state starting with "hold" blocks its batch until `release`, "poison" raises."""

    def __init__(self, name: str = "gated", capabilities: Capabilities = Capabilities()) -> None:
        super().__init__(self._answer, name=name, capabilities=capabilities)
        self.seen: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.problem: str | None = None

    def health_problem(self) -> str | None:
        return self.problem

    def _answer(self, request: DecisionRequest) -> list[list[float]]:
        state = str(request.state)
        self.seen.append(state)
        if state.startswith("hold"):
            self.entered.set()
            self.release.wait(30)
        if state.startswith("poison"):
            raise RuntimeError("secret model internals")
        return [[0.25, 0.75] for _ in request.questions]


class Gate:
    """A batch function for `BatchQueue` that blocks until released, recording the batches it ran."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.batches: list[list[str]] = []
        self.entered_jobs: list[str] = []  # every job of every batch that has started, released or not

    def __call__(self, jobs: Sequence[str], gone: Callable[[int], bool] = never_gone) -> list[str]:
        self.entered_jobs.extend(jobs)
        self.entered.set()
        assert self.release.wait(30), "the gate was never released"
        self.batches.append(list(jobs))
        return [job.upper() for job in jobs]

    @property
    def ran(self) -> list[str]:
        return [job for batch in self.batches for job in batch]


# Run the real `canvasread` command in a subprocess, as a user's shell would.

# A `python -c` stand-in for the console script, with some packages made unimportable first.
WITHOUT = "import sys; sys.modules.update(dict.fromkeys({blocked!r})); sys.argv[0] = 'canvasread'; " + (
    "from canvasread.cli import main; main()"
)


def canvasread(
    *args: str,
    stdin: str | None = None,
    timeout: float = 300,
    without: tuple[str, ...] = (),
    columns: int = 160,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m canvasread ARGS` with a clean environment (PYTHONPATH kept, so a worktree's sources win).

    `without` names packages to hide, as on a machine where that extra is not installed; `columns` is the
    terminal's width; `env` adds variables.
    """
    env = {"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", **(env or {})}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    start = ["-c", WITHOUT.format(blocked=list(without))] if without else ["-m", "canvasread"]
    return subprocess.run(
        [sys.executable, *start, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    """A user error: exit 1, no traceback, one line on stderr that says each of `expected`; returns that line."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for text in expected:
        assert text in lines[0], output
    return lines[0]


class RecordingReader:
    """Reads through another reader and keeps every call's `CanvasRead`s, in the order the calls came."""

    def __init__(self, inner: Reader) -> None:
        self.inner = inner
        self.calls: list[list[CanvasRead]] = []
        self._lock = threading.Lock()  # batches call from threads of their own

    @property
    def reads(self) -> list[CanvasRead]:
        """Every read of every call, in order."""
        return [read for call in self.calls for read in call]

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        self.recorded(reads)
        return self.inner.read(reads)

    def recorded(self, reads: Sequence[CanvasRead]) -> int:
        """Keep this call's reads; its number, counting from 1."""
        with self._lock:
            self.calls.append(list(reads))
            return len(self.calls)


class FirstLabelAnswers:
    """A reader that puts nearly all of every slot's mass on its first label."""

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        return [[SlotLogProbs((-0.01, *(-6.0 for _ in slot.label_ids[1:]))) for slot in read.slots] for read in reads]


class FirstLabel(RecordingReader):
    """`FirstLabelAnswers`, keeping every call's reads."""

    def __init__(self) -> None:
        super().__init__(FirstLabelAnswers())
