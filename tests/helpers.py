"""What the tests share: real servers on loopback, requests, images, waiting on conditions, gated backends."""

from __future__ import annotations

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from canvasread.backends.base import FunctionBackend, never_gone
from canvasread.canvas.backend import CanvasBackend, CanvasRuntime, ReadSettings
from canvasread.canvas.reader import CanvasRead, Reader, Slot, SlotLogProbs
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


def generation_path_logprobs(
    model: Any, prompt_ids: Sequence[int], canvas_ids: Sequence[int], image_token_id: int, features: Any
) -> Any:
    """Log-probabilities at every canvas position from transformers' generation path with one image.

    Uses the encoder masks `generate` builds (soft tokens attend to each other both ways), which a plain
    forward drops: the reference the engine's image reads are held to.
    """
    import torch
    from transformers import DynamicCache

    class Features:
        pooler_output = features

    length = len(prompt_ids)
    soft = torch.tensor([[int(token == image_token_id) for token in prompt_ids]])
    cache = DynamicCache(config=model.config.text_config)
    masks = model.model.encoder.create_masks_for_generate(
        config=model.config,
        inputs_embeds=torch.empty(1, length, 0),
        attention_mask=torch.ones(1, length, dtype=torch.bool),
        cache=cache,
        position_ids=torch.arange(length)[None],
        mm_token_type_ids=soft,
    )
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([list(prompt_ids)]),
            attention_mask=masks,
            cache=cache,
            decoder_input_ids=torch.tensor([list(canvas_ids)]),
            mm_encoder_outputs={"image": Features()},
        )
    return torch.log_softmax(out.logits[0].float(), dim=-1)


class RecordingReader:
    """Reads through another reader and keeps every `CanvasRead` it was given."""

    def __init__(self, inner: Reader) -> None:
        self.inner = inner
        self.reads: list[CanvasRead] = []

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        self.reads.extend(reads)
        return self.inner.read(reads)


class FirstLabel:
    """A reader that puts nearly all of every slot's mass on its first label, and keeps every read it was given."""

    def __init__(self) -> None:
        self.calls: list[list[CanvasRead]] = []

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        self.calls.append(list(reads))
        return [[SlotLogProbs((-0.01, *(-6.0 for _ in slot.label_ids[1:]))) for slot in read.slots] for read in reads]


def transformers_denoising(model: Any, read: CanvasRead) -> tuple[Any, list[list[int]]]:
    """`read` through transformers' own DiffusionGemma denoising loop (`_denoising_step`), every position but the
    slots pinned: the last step's log-probabilities at every canvas position, and the canvas each earlier step left.

    Prepared by transformers' own `_prepare_generation_config` (`max_denoising_steps = read.steps`),
    `_prepare_encoder_inputs`, `_prepare_denoiser_inputs` and logits processors, with one hook: transformers has
    no pins, so the sampler's `renoise_canvas` is wrapped to set every position but the slots back to the read's
    canvas after it renoises. The random draws come from torch's global generator seeded with `read.seed` just
    before the loop (where the engine's per-read generator starts). A recording logits processor, first in the
    list (custom processors run before the temperature schedule), keeps each step's raw logits.
    """
    import torch
    from transformers import LogitsProcessorList

    config, _ = model._prepare_generation_config(None, max_denoising_steps=read.steps)
    sampler, canvases = _pinned_sampler(model, config, read)
    raw: list[torch.Tensor] = []
    processors = model._prepare_logits_processor(config, LogitsProcessorList([_recorder(raw)]))
    prompt = torch.tensor([read.prompt_ids])
    length, width = prompt.shape[1], len(read.canvas_ids)
    with torch.no_grad():
        cache, (canvas, signal, mask_mapping, finished) = _encoded(model, prompt, read.canvas_ids, sampler)
        argmax = canvas
        torch.manual_seed(read.seed)
        for step in reversed(range(1, read.steps + 1)):
            canvas, argmax, signal, finished = model._denoising_step(
                decoder_forward=model.forward,
                current_canvas=canvas,
                argmax_canvas=argmax,
                input_ids=prompt,
                decoder_position_ids=torch.arange(length, length + width, dtype=torch.int32)[None],
                self_conditioning_logits=signal,
                mask_mapping=mask_mapping,
                cache=cache,
                finished_denoising=finished,
                cur_step=step,
                sampler=sampler,
                logits_processor=processors,
                diffusion_stopping_criteria=None,  # the engine runs every step; no adaptive stop
            )
    assert len(raw) == read.steps
    return torch.log_softmax(raw[-1][0].float(), dim=-1), canvases[:-1]


def _pinned_sampler(model: Any, config: Any, read: CanvasRead) -> tuple[Any, list[list[int]]]:
    """transformers' entropy-bound sampler for the read's canvas width, its renoise followed by the pin."""
    import torch
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSampler

    width = len(read.canvas_ids)
    sampler = EntropyBoundSampler(config.sampler_config, width, model.config.text_config.vocab_size, read.steps)
    template = torch.tensor([read.canvas_ids])
    pinned = torch.ones(1, width, dtype=torch.bool)
    pinned[0, [slot.position for slot in read.slots]] = False
    renoise = sampler.renoise_canvas
    canvases: list[list[int]] = []

    def pinned_renoise(accepted: torch.Tensor, step: Any) -> torch.Tensor:
        canvas = torch.where(pinned, template, renoise(accepted, step))
        canvases.append(canvas[0].tolist())
        return canvas

    sampler.renoise_canvas = pinned_renoise
    return sampler, canvases


def _recorder(raw: list[Any]) -> Any:
    """A logits processor that keeps the raw logits it is given."""
    from transformers import LogitsProcessor

    class RawLogits(LogitsProcessor):  # type: ignore[misc]
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            raw.append(scores.clone())
            return scores

    return RawLogits()


def _encoded(model: Any, prompt: Any, canvas_ids: Sequence[int], sampler: Any) -> tuple[Any, Any]:
    """The prompt through transformers' encoder (as `generate` prepares it), and the denoiser's inputs."""
    import torch
    from transformers import DynamicCache

    length, width = prompt.shape[1], len(canvas_ids)
    cache = DynamicCache(config=model.config.text_config)
    attention = torch.ones(1, length, dtype=torch.bool)
    positions = torch.arange(length, dtype=torch.int32)[None]
    ids, masks = model._prepare_encoder_inputs(prompt, attention, positions, cache, True, width, 1)
    cache = model.model.encoder(input_ids=ids, attention_mask=masks, cache=cache, position_ids=positions).cache
    decoder_mask = torch.nn.functional.pad(attention, (0, width), value=True)
    start = {"decoder_input_ids": torch.tensor([list(canvas_ids)])}
    return cache, model._prepare_denoiser_inputs(decoder_mask, cache, sampler, None, 1, prompt.device, start)


# ---- engine reads to compare ----------------------------------------------------------------------


def tiny_model(decider: Decider) -> Any:
    """The transformers model under the decider's in-process engine."""
    return loaded_runtime(canvas_backend(decider)).reader.runner.model  # type: ignore[attr-defined]


def mixed_reads(vocab: int) -> list[CanvasRead]:
    """Two question sets (prefixes) and a prompt without one, states of many lengths, one and three steps."""
    import torch

    generator = torch.Generator().manual_seed(5)

    def ids(length: int) -> tuple[int, ...]:
        return tuple(torch.randint(3, vocab, (length,), generator=generator).tolist())

    prefixes = [ids(23), ids(40)]
    reads = []
    for n, state in enumerate((4, 57, 13, 90, 31, 8)):
        prefix = prefixes[n % 2] if n < 5 else ()
        canvas = ids(16 * (1 + n % 2))
        slots = (Slot(3, (5, 6)), Slot(len(canvas) - 2, (7, 8, 9, 10)))
        reads.append(CanvasRead(prefix + ids(state), len(prefix), canvas, slots, steps=1 + 2 * (n % 2), seed=n))
    # a second canvas of the first prompt: read in the pass that encodes it
    reads.append(CanvasRead(reads[0].prompt_ids, 23, ids(16), (Slot(0, (11, 12)),)))
    return reads


def assert_same_read(read: CanvasRead, got: Sequence[SlotLogProbs], want: Sequence[SlotLogProbs]) -> None:
    """fp32 sums follow the pass's shape, so logits move in the last digits (2e-6 relative); denoising steps
    amplify that (test_steps.py): a row that read another row's keys or canvas would be off by whole units."""
    import pytest

    tolerance = 2e-6 if read.steps == 1 else 1e-3
    for x, y in zip(got, want, strict=True):
        assert x.label_logprobs == pytest.approx(y.label_logprobs, rel=tolerance)
