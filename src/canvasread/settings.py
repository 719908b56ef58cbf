"""Checked settings for the server; every default says why it is what it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

DEFAULT_HOST = "127.0.0.1"
# The port the djev recipe and the SDK docs use for a local System One server.
DEFAULT_PORT = 8011
# Third-party limit for the hosted API: 32 MiB per body (images included).
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# The hosted API documents no cap; 800 questions in one call has been reported to work.
DEFAULT_MAX_QUESTIONS = 1024
# The hosted API's documented caps; the wire schema publishes them, so a server may only lower them.
MAX_OPTIONS = 255
MAX_LEVELS = 10
# Real states are documents a few levels deep; past this, JSON is an attack on recursive code, not data.
DEFAULT_MAX_JSON_DEPTH = 64
# Well below Python's recursion limit (1000), which the JSON parser and every renderer of the state share.
MAX_JSON_DEPTH = 256
# Real requests hold thousands of items; a million bounds the Python objects of one parsed body near 100 MB.
DEFAULT_MAX_JSON_ITEMS = 1_000_000
# Long enough for a 32 MiB body over a slow uplink (~1 MB/s), short enough that stalled uploads do not pile up.
DEFAULT_BODY_TIMEOUT_S = 30.0
# A client that has not sent its request line and headers in this long is a slowloris, not a slow network.
DEFAULT_HEADER_TIMEOUT_S = 10.0
# A client that takes none of its response's output in this long is not reading it (a slow network still
# takes some): its connection and the response it holds are dropped.
DEFAULT_SEND_TIMEOUT_S = 30.0
# Idle keep-alive connections are closed after this long (clients reconnect in a millisecond on loopback).
DEFAULT_KEEP_ALIVE_S = 5
# Open connections plus requests in flight before new requests get 503: well above --max-pending's
# default queue per model, well below the file descriptors a default ulimit (1024) allows.
DEFAULT_MAX_CONNECTIONS = 768
# One address may hold half of them, so one client cannot take every connection (behind a proxy every client is
# the proxy: raise it to --max-connections there).
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = DEFAULT_MAX_CONNECTIONS // 2
# Bodies parsed at once, each in its own thread: parsing is CPU-bound, so more than the cores only adds memory.
DEFAULT_PARSE_WORKERS = 2
# Host names that name this machine; a server bound to loopback answers only these (DNS rebinding).
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
# In-flight requests get this long to finish after SIGTERM (a batch on a GPU takes seconds, not minutes).
DEFAULT_SHUTDOWN_TIMEOUT_S = 30
# Access-log line format: logfmt text for people, one JSON object a line for log shippers.
LogFormat = Literal["text", "json"]


@dataclass(frozen=True)
class ImageLimits:
    """What one request may attach; each image is checked from its header before any pixel is decoded."""

    # Each image costs a vision model hundreds of tokens; 16 keep a request's images within a usual context.
    max_images: int = 16
    # Third-party limit for the hosted API: 16 MiB per image.
    max_bytes: int = 16 * 1024 * 1024
    # A 7000x7000 photo; a decompression bomb declares far more (Pillow warns from ~89 M).
    max_pixels: int = 50_000_000

    def __post_init__(self) -> None:
        if min(self.max_images, self.max_bytes, self.max_pixels) < 1:
            raise ValueError("image limits must be at least 1")


@dataclass(frozen=True)
class ServerSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_questions: int = DEFAULT_MAX_QUESTIONS
    max_options: int = MAX_OPTIONS
    max_levels: int = MAX_LEVELS
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_json_items: int = DEFAULT_MAX_JSON_ITEMS
    images: ImageLimits = ImageLimits()
    shutdown_timeout_s: int = DEFAULT_SHUTDOWN_TIMEOUT_S
    api_keys: frozenset[str] = field(default_factory=frozenset, repr=False)
    cors_origins: tuple[str, ...] = ()
    log_format: LogFormat = "text"
    log_payloads: bool = False
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S
    keep_alive_s: int = DEFAULT_KEEP_ALIVE_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    parse_workers: int = DEFAULT_PARSE_WORKERS
    # Extra `Host` names to answer to (a reverse proxy's name); the loopback names are always allowed.
    allowed_hosts: tuple[str, ...] = ()
    # Refuse (422) what is otherwise a warning: unknown keys, an empty state. Off: the hosted API ignores
    # unknown keys, and clients send keys of their own.
    strict: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be 1..65535, not {self.port}")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes below 1 KiB would refuse ordinary requests")
        if self.max_questions < 1:
            raise ValueError("max_questions must be at least 1")
        if not 1 <= self.max_options <= MAX_OPTIONS:
            raise ValueError(f"max_options must be 1..{MAX_OPTIONS} (the API's own cap)")
        if not 1 <= self.max_levels <= MAX_LEVELS:
            raise ValueError(f"max_levels must be 1..{MAX_LEVELS} (the API's own cap)")
        if not 4 <= self.max_json_depth <= MAX_JSON_DEPTH:
            raise ValueError(f"max_json_depth must be 4..{MAX_JSON_DEPTH}")
        if self.shutdown_timeout_s < 0:
            raise ValueError("shutdown_timeout_s cannot be negative")
        if self.max_json_items < 1000:
            raise ValueError("max_json_items below 1000 would refuse ordinary requests")
        if min(self.body_timeout_s, self.header_timeout_s, self.send_timeout_s, self.keep_alive_s) <= 0:
            raise ValueError("body, header, send and keep-alive timeouts must be positive")
        if min(self.max_connections, self.max_connections_per_client, self.parse_workers) < 1:
            raise ValueError("max_connections, max_connections_per_client and parse_workers must be at least 1")

    @property
    def checks_host(self) -> bool:
        """Bound to loopback: only local pages should reach it, so a foreign `Host` is a DNS-rebinding attempt."""
        return self.host in LOOPBACK_HOSTS

    def allows_host(self, host: str) -> bool:
        """Whether a request's `Host` header (port stripped) names this server ("" names nothing)."""
        return host.lower() in LOOPBACK_HOSTS or host.lower() in {h.lower() for h in self.allowed_hosts}
