"""Question kinds: one module per kind, each one `Kind` (see `base.py`), and the registry the rest asks.

To add a kind, write its module here (a `Kind` subclass with its wire models,
registered in `KINDS` below) and its tests in `tests/kinds/`; nothing outside
this package names a kind.
"""

from __future__ import annotations

from collections.abc import Mapping

from canvasread.kinds import box, choice, noul, score, span, spans
from canvasread.kinds.base import Kind

# In the order the schema lists them (the hosted API's four, then canvasread's extensions).
KINDS: Mapping[str, Kind] = {
    kind.name: kind for kind in (noul.KIND, choice.KIND, score.KIND, box.KIND, span.KIND, spans.KIND)
}


class UnknownKind(ValueError):
    """A question kind no module of this package defines."""


def kind_of(name: str) -> Kind:
    """The kind called `name`; `UnknownKind` naming the known ones otherwise (the edge refuses it first)."""
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownKind(f"unknown question type {name!r}; known: {', '.join(KINDS)}") from None
