"""What the server and its engine process say to each other over their pipe (`client.py` and `worker.py`).

Plain picklable values, no torch: calls go one way (`Call`, the items a
caller has left since, `Left`; `Close`), answers the other (`Ready` once
the engine is warm, or `Unloadable`; an `Answer` per call, carrying the
engine's counters at that moment so reading them costs no round trip).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from canvasread.canvas.engine.settings import EngineSettings

CallKind = Literal["read", "think"]


@dataclass(frozen=True)
class Start:
    """What the engine process loads: the checkpoint and how to run it (sent as its argument)."""

    spec: str
    settings: EngineSettings


@dataclass(frozen=True)
class Ready:
    """The engine is loaded and warm: what the server needs to know of it to plan and refuse (`store_bytes`: its
    KV store's budget, which an engine started in its place is given, so the server's page count stays true)."""

    fingerprint: str
    pages: int
    page: int
    counters: Mapping[str, float]
    store_bytes: int


@dataclass(frozen=True)
class Unloadable:
    """The engine could not load; `reason` is the one line to report."""

    reason: str


@dataclass(frozen=True)
class Call:
    """A `read` of canvas reads or a `think` of thought requests, numbered by the server; `left`: the items whose
    callers had already gone when it was sent (never admitted)."""

    number: int
    kind: CallKind
    items: Sequence[Any]
    left: tuple[int, ...] = ()


@dataclass(frozen=True)
class Left:
    """The callers of these items of call `number` have gone since it was sent: drop their work between passes."""

    number: int
    indices: tuple[int, ...]


@dataclass(frozen=True)
class Close:
    """Stop: the server is shutting down."""


@dataclass(frozen=True)
class Answer:
    """Call `number`'s results in order (None where the caller left), or what failed it."""

    number: int
    results: Sequence[Any] | None
    error: BaseException | None
    counters: Mapping[str, float]
