"""`UpstreamSettings`: how canvasread reaches a wing's upstream servers (the `serve --upstream…` flags).

Every HTTP wing's settings extend these (the vLLM wing's `VllmSettings`), so replicas, timeouts, concurrency and
the API key mean the same in every wing, and each builds its `UpstreamPool` the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from canvasread.upstream.pool import DEFAULT_PROBE_INTERVAL_S, Dialect, UpstreamPool

# Per upstream call; a read takes milliseconds, so this only bounds a stuck upstream before failing over.
DEFAULT_UPSTREAM_TIMEOUT_S = 30.0
# Requests in flight at once from one batch: enough to fill vLLM's running batch (`--max-num-seqs`) twice over.
DEFAULT_UPSTREAM_CONCURRENCY = 64


@dataclass(frozen=True, kw_only=True)
class UpstreamSettings:
    """The upstream servers of one wing (replicas of one model) and how to talk to them, checked when built."""

    urls: tuple[str, ...]
    model: str = "dgemma"
    timeout_s: float = DEFAULT_UPSTREAM_TIMEOUT_S
    concurrency: int = DEFAULT_UPSTREAM_CONCURRENCY
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S
    startup_timeout_s: float | None = None
    # The upstream's API key, sent as a Bearer token on every call; kept out of repr so it is never logged.
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
        if not self.model:
            raise ValueError("--upstream-model must name the model the upstream serves")
        if self.timeout_s <= 0:
            raise ValueError("--upstream-timeout must be positive")
        if self.probe_interval_s <= 0:
            raise ValueError("the upstream probe interval must be positive")
        if self.api_key is not None and (not self.api_key or any(c.isspace() for c in self.api_key)):
            raise ValueError("--upstream-api-key must be a non-empty key without spaces")
        if self.concurrency < 1:
            raise ValueError("--upstream-concurrency must be at least 1")

    def pool(self, dialect: Dialect) -> UpstreamPool:
        """The pool over these upstreams, speaking `dialect`; it probes nothing until `start()`."""
        return UpstreamPool(
            self.urls,
            self.model,
            dialect,
            timeout_s=self.timeout_s,
            probe_interval_s=self.probe_interval_s,
            max_connections=self.concurrency,
            api_key=self.api_key,
        )
