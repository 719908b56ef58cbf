"""`SystemOneSettings`: the systemone wing's settings (the `serve --upstream-systemone…` flags).

They extend the upstream settings every HTTP wing shares (`canvasread.upstream.settings`: replicas, timeouts,
concurrency, the key) with the peer's dialect and the name canvasread serves it under, and build the wing's
backend (`backends`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from canvasread.systemone.peers import PEERS
from canvasread.upstream.settings import UpstreamSettings

# A tournament over groups of 16 reaches 16² = 256 options, past canvasread's 255.
MIN_OPTIONS_PER_CALL = 16

if TYPE_CHECKING:
    from canvasread.backends.base import AnyBackend
    from canvasread.canvas.backend import ReadSettings


@dataclass(frozen=True, kw_only=True)
class SystemOneSettings(UpstreamSettings):
    """Another `/v1/systemone` server: where (the upstream settings), which dialect, and the name served here.

    `peer` is `vllm` (vLLM 0.32+ native), `sglang` (SGLang 0.5.23 native) or `jev` (the hosted API, another
    canvasread, any Jev-compatible server); `name` defaults to `model` (give another when that name is taken
    here, say by an alias such as `jev-latest`).
    """

    peer: str = "jev"
    name: str | None = None
    # Options per choice the peer is asked at once (None: its documented cap). Lower it for an SGLang whose
    # tokenizer has no two-letter labels (it then refuses past 26): the rest goes through the tournament.
    max_options: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.peer not in PEERS:
            raise ValueError(f"--upstream-peer must be one of {', '.join(PEERS)}, not {self.peer!r}")
        if self.name is not None and not self.name.strip():
            raise ValueError("--upstream-name must not be empty")
        cap = PEERS[self.peer].max_options
        if self.max_options is not None and not MIN_OPTIONS_PER_CALL <= self.max_options <= cap:
            raise ValueError(
                f"--upstream-max-options must be between {MIN_OPTIONS_PER_CALL} and {cap} (what a {self.peer} peer "
                "labels)"
            )

    @property
    def options_per_call(self) -> int:
        """Options per choice the peer is asked at once."""
        return self.max_options or PEERS[self.peer].max_options

    @property
    def served_name(self) -> str:
        return self.name or self.model

    def backends(self, reading: ReadSettings) -> list[AnyBackend]:
        """The wing's one backend; nothing is contacted until it loads (reads no canvas, so `reading` is unused)."""
        from canvasread.systemone.backend import SystemOneBackend

        return [SystemOneBackend(self)]
