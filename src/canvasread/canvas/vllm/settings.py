"""`UpstreamSettings`: how canvasread reaches vLLM (the `serve --upstream…` flags), checked when built."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from canvasread.canvas.vllm.pool import DEFAULT_PROBE_INTERVAL_S

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
    # vLLM's `--api-key`, sent as a Bearer token on every call; kept out of repr so it is never logged.
    api_key: str | None = field(default=None, repr=False)

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
        if self.api_key is not None and (not self.api_key or any(c.isspace() for c in self.api_key)):
            raise ValueError("--upstream-api-key must be a non-empty key without spaces")
        if self.concurrency < 1:
            raise ValueError("--upstream-concurrency must be at least 1")
