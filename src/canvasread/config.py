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
# Access-log line format: logfmt text for people, one JSON object a line for log shippers.
LogFormat = Literal["text", "json"]


@dataclass(frozen=True)
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_questions: int = DEFAULT_MAX_QUESTIONS
    api_keys: frozenset[str] = field(default_factory=frozenset, repr=False)
    cors_origins: tuple[str, ...] = ()
    log_format: LogFormat = "text"
    log_payloads: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be 1..65535, not {self.port}")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes below 1 KiB would refuse ordinary requests")
        if self.max_questions < 1:
            raise ValueError("max_questions must be at least 1")
