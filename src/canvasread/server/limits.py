"""Per-request limits the server enforces on top of the wire schema, each failing with a 4xx that names the limit.

The body size is checked while reading (`body.read_limited`) and the images
while decoding (`wire.parse_request`); this module checks what is cheapest to
check before the JSON is parsed (its nesting depth) and after (questions,
options and levels, which a server may set below the API's own caps). The
model's context length is the backend's to check in `prepare`, where the
tokenizer is.
"""

from __future__ import annotations

import numpy as np

from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.settings import ServerSettings
from canvasread.types import DecisionRequest
from canvasread.wire import check_option_counts

_CHUNK = 1 << 20
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{}')))


def json_depth(data: bytes) -> int:
    """How deeply arrays and objects nest in `data`, measured on the bytes (brackets inside strings do not count).

    Python's parser recurses once per level, and so does every layer after it;
    measuring first turns a pathologically deep body into a clear 422 instead of
    a `RecursionError`. Linear, in C and numpy: drop escaped backslashes, then
    escaped quotes, then every byte but quotes and brackets; a bracket counts
    when an even number of quotes precede it; the depth is the running sum's
    maximum. Exact for valid JSON.
    """
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = np.frombuffer(unescaped.translate(None, _NOT_STRUCTURE), dtype=np.uint8)
    quotes = depth = deepest = 0
    for start in range(0, len(structure), _CHUNK):  # in chunks: a body of brackets needs no 8x-sized array
        chunk = structure[start : start + _CHUNK]
        quote_count = quotes + np.cumsum(chunk == ord('"'), dtype=np.int64)
        outside = quote_count % 2 == 0
        opens = outside & ((chunk == ord("[")) | (chunk == ord("{")))
        closes = outside & ((chunk == ord("]")) | (chunk == ord("}")))
        levels = depth + np.cumsum(opens.astype(np.int64) - closes)
        deepest = max(deepest, int(levels.max()))
        quotes, depth = int(quote_count[-1]), int(levels[-1])
    return deepest


def check_json_depth(data: bytes, max_depth: int) -> None:
    depth = json_depth(data)
    if depth > max_depth:
        raise InvalidRequest(
            [
                FieldProblem(
                    ("body",),
                    f"JSON nests {depth} levels deep; at most {max_depth} are accepted",
                    "json_too_deep",
                    ctx={"max_depth": max_depth},
                )
            ]
        )


def check_request(request: DecisionRequest, config: ServerSettings) -> None:
    """Questions per request, options per choice and levels per score, against this server's limits."""
    if len(request.questions) > config.max_questions:
        raise InvalidRequest(
            [
                FieldProblem(
                    ("body", "questions"),
                    f"at most {config.max_questions} questions per request",
                    "too_long",
                    ctx={"max_length": config.max_questions},
                )
            ]
        )
    check_option_counts(request, config.max_options, config.max_levels)
