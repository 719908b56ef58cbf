"""The canvas backend over vLLM: the same planning, labels, canvas and readout, reads sent to upstreams.

Only execution differs from the in-process engine: the tokenizer is loaded
here (so labels are verified and canvases built before anything is sent), and
a `VllmReader` sends each read (a `VllmThinker` each thought) to the
least-loaded healthy upstream of the wing's `UpstreamPool`. The runtime
reports the pool's health, so `/ready` answers 503 whenever no upstream
answers, and closes the pool, the reader and the thinker with the backend.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time

from canvasread.canvas.backend import CanvasBackend, CanvasRuntime, ReadSettings
from canvasread.canvas.tokenizer import locate
from canvasread.canvas.vllm.reader import VllmReader
from canvasread.canvas.vllm.settings import VLLM, VllmSettings
from canvasread.canvas.vllm.thinker import VllmThinker
from canvasread.extras import require
from canvasread.types import MAX_STEPS, Capabilities, ModelCard
from canvasread.upstream.pool import UpstreamModel, UpstreamPool, UpstreamUnavailable

logger = logging.getLogger(__name__)
# While no upstream serves the model, one log line this often says why (vLLM often starts after canvasread).
WAIT_LOG_S = 10.0


def vllm_backend(settings: VllmSettings, reading: ReadSettings = ReadSettings()) -> CanvasBackend:
    """The backend `serve --upstream` runs; nothing is loaded or contacted until `load()`.

    `load()` loads the tokenizer, starts probing, and waits until an upstream
    answers `/v1/models` with the model (its context length bounds the
    prompt unless `max_model_len` is given); `/ready` says "loading" meanwhile.
    A load that fails stops what it started.
    """
    require(("transformers",), "reading through vLLM (the model's tokenizer)", "upstream")
    locate(settings.tokenizer)  # before the port binds: a tokenizer that cannot be found is one line, exit 1
    where = ", ".join(settings.urls)

    def load() -> CanvasRuntime:
        from canvasread.canvas.tokenizer import HFTokenizer

        tokenizer = HFTokenizer.load(settings.tokenizer)
        tokenizer.chat_prompt("", "")  # a template that cannot render (no jinja2) fails the load, not each request
        pool = settings.pool(VLLM)
        pool.start()
        logger.info("waiting for an upstream to serve %s (%s)", settings.model, where)
        try:
            served = _wait_for_upstream(pool, settings.startup_timeout_s)
        except Exception:
            pool.close()
            raise
        # vLLM does not expose its weights, so the served checkpoint is identified by the path or hub id it loaded.
        identity = {
            "upstream_root": served.root,
            "canvas_length": settings.canvas_length,
            "tokenizer_vocab": tokenizer.vocab_size,
        }
        reader = VllmReader(pool, settings.model, concurrency=settings.concurrency)
        thinker = VllmThinker(pool, settings.model, concurrency=settings.concurrency)

        def close() -> None:
            """Stop the request threads, then the pool's probers (tests and embedders; the server just exits)."""
            thinker.close()
            reader.close()
            pool.close()

        return CanvasRuntime(
            reader=reader,
            tokenizer=tokenizer,
            canvas_length=settings.canvas_length,
            max_positions=settings.max_model_len or served.max_model_len,
            fingerprint="sha256:" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest(),
            thinker=thinker,
            health=pool.health_problem,
            close=close,
        )

    return CanvasBackend(_card(settings.model, where), load, reading)


def _card(model: str, where: str) -> ModelCard:
    """What the wing's model answers: everything but images (the proxy sends token ids, and refuses images)."""
    return ModelCard(
        name=model,
        description=f"DiffusionGemma served by vLLM as {model} at {where}: label slots read as "
        "distributions from one read-only denoising step per canvas (or `steps`, pinned).",
        release_date=time.strftime("%Y-%m-%d"),
        capabilities=Capabilities(
            images=False, spans=True, max_options=255, max_levels=10, max_steps=MAX_STEPS, think=True
        ),
    )


def _wait_for_upstream(pool: UpstreamPool, timeout_s: float | None) -> UpstreamModel:
    """`pool.wait_for_model`, one log line per `WAIT_LOG_S` attempt saying why no upstream serves the model yet."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        remaining = WAIT_LOG_S if deadline is None else min(WAIT_LOG_S, deadline - time.monotonic())
        try:
            return pool.wait_for_model(max(0.0, remaining))
        except UpstreamUnavailable:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            why = pool.health_problem() or "an upstream answers, but does not serve it"
            logger.warning("no upstream serves %s yet (%s); still trying", pool.model, why)
