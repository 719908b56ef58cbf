"""The canvas backend over vLLM: the same planning, labels, canvas and readout, reads sent to upstreams.

Only execution differs from the in-process engine: the tokenizer is loaded
here (so labels are verified and canvases built before anything is sent), and
a `VllmReader` sends each read to the least-loaded healthy upstream. The
backend reports `health_problem()`, so `/ready` answers 503 until an upstream
answers and whenever none does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from canvasread.backends.canvas import CanvasBackend, CanvasRuntime, ReadConfig
from canvasread.readers.vllm import VllmReader
from canvasread.types import Capabilities, ModelCard
from canvasread.upstream import DEFAULT_PROBE_INTERVAL_S, UpstreamPool

logger = logging.getLogger(__name__)

# The canvas the documented vLLM recipe serves (`--diffusion-config '{"canvas_length": 64}'`): room for ~12
# answer lines per canvas, and a small self-conditioning buffer per sequence on the GPU.
DEFAULT_CANVAS_LENGTH = 64
# Per upstream call; a read takes milliseconds, so this only bounds a stuck upstream before failing over.
DEFAULT_UPSTREAM_TIMEOUT_S = 30.0
# Requests in flight at once from one batch: enough to fill vLLM's running batch (`--max-num-seqs`) twice over.
DEFAULT_UPSTREAM_CONCURRENCY = 64


@dataclass(frozen=True)
class UpstreamSettings:
    """How canvasread reaches vLLM (the `serve --upstream…` flags), checked when built."""

    urls: tuple[str, ...]
    tokenizer: str
    model: str = "dgemma"
    canvas_length: int = DEFAULT_CANVAS_LENGTH
    max_model_len: int | None = None
    timeout_s: float = DEFAULT_UPSTREAM_TIMEOUT_S
    concurrency: int = DEFAULT_UPSTREAM_CONCURRENCY
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S
    startup_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("give at least one --upstream URL")
        for url in self.urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"--upstream {url!r} is not an http(s) URL such as http://vllm:8000")
        if len(set(self.urls)) != len(self.urls):
            raise ValueError("an --upstream URL is given twice")
        if not self.tokenizer:
            raise ValueError("--upstream needs --tokenizer: the model's tokenizer folder or hub id")
        if not self.model:
            raise ValueError("--upstream-model must name the model vLLM serves")
        if self.canvas_length < 16:
            raise ValueError("--upstream-canvas-length must be at least 16 (vLLM's --diffusion-config canvas_length)")
        if self.max_model_len is not None and self.max_model_len <= self.canvas_length:
            raise ValueError("--upstream-max-model-len must exceed the canvas length")
        if self.timeout_s <= 0:
            raise ValueError("--upstream-timeout must be positive")
        if self.probe_interval_s <= 0:
            raise ValueError("the upstream probe interval must be positive")
        if self.concurrency < 1:
            raise ValueError("--upstream-concurrency must be at least 1")


class UpstreamCanvasBackend(CanvasBackend):
    """A `CanvasBackend` whose reads go to vLLM; healthy while some upstream answers."""

    def __init__(
        self, card: ModelCard, load: Callable[[], CanvasRuntime], pool: UpstreamPool, config: ReadConfig
    ) -> None:
        super().__init__(card, load, config)
        self.pool = pool

    def health_problem(self) -> str | None:
        return self.pool.health_problem()

    def close(self) -> None:
        """Stop the prober and the request threads (tests and embedders; the server just exits)."""
        reader = self._runtime.reader if self._runtime is not None else None
        if isinstance(reader, VllmReader):
            reader.close()
        else:
            self.pool.close()


def canvas_backend_for_upstream(settings: UpstreamSettings, config: ReadConfig | None = None) -> UpstreamCanvasBackend:
    """The backend `serve --upstream` runs; nothing is loaded or contacted until `load()`.

    `load()` loads the tokenizer, starts probing, and waits until an upstream
    answers `/v1/models` with the model (its context length bounds the
    prompt unless `max_model_len` is given); `/ready` says "loading" meanwhile.
    """
    pool = UpstreamPool(
        settings.urls,
        settings.model,
        timeout_s=settings.timeout_s,
        probe_interval_s=settings.probe_interval_s,
        max_connections=settings.concurrency,
    )
    where = ", ".join(settings.urls)
    card = ModelCard(
        name=settings.model,
        description=f"DiffusionGemma served by vLLM as {settings.model} at {where}: one read-only denoising step "
        "per canvas, label slots read as distributions.",
        release_date=time.strftime("%Y-%m-%d"),
        capabilities=Capabilities(images=False, max_options=255, max_levels=10),
    )

    def load() -> CanvasRuntime:
        from canvasread.tokenizer import HFTokenizer

        tokenizer = HFTokenizer.load(settings.tokenizer)
        tokenizer.chat_prompt("", "")  # a template that cannot render (no jinja2) fails the load, not each request
        pool.start()
        logger.info("waiting for an upstream to serve %s (%s)", settings.model, where)
        served = pool.wait_for_model(settings.startup_timeout_s)
        # vLLM does not expose its weights, so the served checkpoint is identified by the path or hub id it loaded.
        identity = {
            "upstream_root": served.root,
            "canvas_length": settings.canvas_length,
            "tokenizer_vocab": tokenizer.vocab_size,
        }
        return CanvasRuntime(
            reader=VllmReader(pool, settings.model, concurrency=settings.concurrency),
            tokenizer=tokenizer,
            canvas_length=settings.canvas_length,
            max_positions=settings.max_model_len or served.max_model_len,
            fingerprint="sha256:" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest(),
        )

    return UpstreamCanvasBackend(card, load, pool, config or ReadConfig())
