"""Every random number a canvas read draws, derived from the request's seed in one place, one way.

The root is the request's seed: its `seed` option, or 63 random bits when it
has none (`request_seed`). Every draw below it comes from `derive(seed, read,
*context)`: the first 8 bytes of the SHA-256 of the parts written in decimal
and joined by `|` (a sequence of ids as its ids joined by `,`), read as an
unsigned 64-bit integer (both `random.Random` and torch's generators take it).
The context names what the draw is for, so no two draws share a stream:

| draw | parts | drawn in |
|---|---|---|
| a label slot's noise | seed, read, question digest (and a box digit's index after the first) | `plan.noisy_canvas` |
| a blank's noise in round r | seed, read, question digest, `round{r}` | `span_search.SpanSearch` |
| a multi-step read's samples and renoise | seed, read (0 for a blank), the noisy canvas | `readings`, `span_search` |

Noise is keyed by the question's digest (what it asks, not its key or place),
so the same seed gives the same answer and reordering or rotating the other
questions leaves a question's noise alone. A multi-step read is keyed by its
noisy canvas, so its draws differ wherever its noise does.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Sequence

# A seed the server draws fits a signed 64-bit integer, as a caller's seed may be echoed in JSON.
REQUEST_SEED_BITS = 63

Part = int | str | Sequence[int]


def request_seed(asked: int | None) -> int:
    """The root of a request's draws: the seed it asked for, or a fresh random one."""
    return asked if asked is not None else secrets.randbits(REQUEST_SEED_BITS)


def derive(seed: int, read: int, *context: Part) -> int:
    """The seed of one draw (see the module docstring for the parts each draw passes)."""
    parts = [str(seed), str(read), *(_written(part) for part in context)]
    return int.from_bytes(hashlib.sha256("|".join(parts).encode()).digest()[:8], "big")


def noise(seed: int, read: int, *context: Part) -> random.Random:
    """A generator for one draw's uniform token ids, seeded by `derive`."""
    return random.Random(derive(seed, read, *context))


def _written(part: Part) -> str:
    if isinstance(part, int | str):
        return str(part)
    return ",".join(str(token) for token in part)
