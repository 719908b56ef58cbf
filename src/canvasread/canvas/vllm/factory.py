"""The canvas backend over vLLM: the same planning, labels, canvas and readout, reads sent to upstreams.

Only execution differs from the in-process engine: the tokenizer is loaded
here (so labels are verified and canvases built before anything is sent), and
a `VllmReader` sends each read (a `VllmThinker` each thought) to the
least-loaded healthy upstream. The backend reports `health_problem()`, so
`/ready` answers 503 until an upstream answers and whenever none does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable

from canvasread.canvas.backend import CanvasBackend, CanvasRuntime, ReadSettings
from canvasread.canvas.vllm.pool import UpstreamPool
from canvasread.canvas.vllm.reader import VllmReader
from canvasread.canvas.vllm.settings import UpstreamSettings
from canvasread.canvas.vllm.thinker import VllmThinker
from canvasread.types import MAX_STEPS, Capabilities, ModelCard

logger = logging.getLogger(__name__)


class UpstreamCanvasBackend(CanvasBackend):
    """A `CanvasBackend` whose reads go to vLLM; healthy while some upstream answers."""

    def __init__(
        self, card: ModelCard, load: Callable[[], CanvasRuntime], pool: UpstreamPool, settings: ReadSettings
    ) -> None:
        super().__init__(card, load, settings)
        self.pool = pool

    def health_problem(self) -> str | None:
        return self.pool.health_problem()

    def close(self) -> None:
        """Stop the prober and the request threads (tests and embedders; the server just exits)."""
        runtime = self._runtime
        if runtime is not None and isinstance(runtime.thinker, VllmThinker):
            runtime.thinker.close()
        if runtime is not None and isinstance(runtime.reader, VllmReader):
            runtime.reader.close()
        else:
            self.pool.close()


def canvas_backend_for_upstream(
    settings: UpstreamSettings, reading: ReadSettings = ReadSettings()
) -> UpstreamCanvasBackend:
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
        api_key=settings.api_key,
    )
    where = ", ".join(settings.urls)
    card = ModelCard(
        name=settings.model,
        description=f"DiffusionGemma served by vLLM as {settings.model} at {where}: label slots read as "
        "distributions from one read-only denoising step per canvas (or `steps`, pinned).",
        release_date=time.strftime("%Y-%m-%d"),
        capabilities=Capabilities(
            images=False, spans=True, max_options=255, max_levels=10, max_steps=MAX_STEPS, think=True
        ),
    )

    def load() -> CanvasRuntime:
        from canvasread.canvas.tokenizer import HFTokenizer

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
            thinker=VllmThinker(pool, settings.model, concurrency=settings.concurrency),
        )

    return UpstreamCanvasBackend(card, load, pool, reading)
