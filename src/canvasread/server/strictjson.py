"""Strict JSON for request bodies: measured before parsing and checked after, so no value surprises a later layer.

Python's parser accepts more than the server can carry through: lone
surrogates (`"\\ud800"`, which no UTF-8 encoder can write back), numbers that
overflow to infinity (`1e999`), NaN and Infinity (not JSON at all), objects that name a key twice (Python keeps
the last value silently) and bodies whose objects cost far more memory
than their bytes (`[{}]` repeated ten million times is 31 MB of text and about
1 GB of Python objects). Each is refused here with a 422 that says where.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.kinds import KINDS

_CHUNK = 1 << 20
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{},:')))
# `\uD800`..`\uDFFF`: the only way a lone surrogate gets past UTF-8 decoding (pairs combine into one character).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
NOT_FINITE = "not a finite number: JSON has no NaN or Infinity (RFC 8259), and a float ends near 1.8e308"
# At most this many problems are listed in one 422; a body can have millions.
_MAX_PROBLEMS = 16


@dataclass(frozen=True)
class JsonShape:
    """How deeply a body nests and how many items it holds (containers plus `,` and `:` separators)."""

    depth: int
    items: int


def json_shape(data: bytes) -> JsonShape:
    """Depth and item count of `data`, measured on the bytes (brackets and commas inside strings do not count).

    Python's parser recurses once per level and allocates one object per
    value; measuring first turns a pathological body into a clear 422 instead
    of a `RecursionError` or a gigabyte of objects. Linear, in C and numpy:
    drop escaped backslashes, then escaped quotes, then every byte but quotes,
    brackets and separators; a byte counts when an even number of quotes
    precede it. Exact for valid JSON.
    """
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")  # the same object when there is nothing to drop
    quotes = depth = deepest = items = 0
    for start in range(0, len(unescaped), _CHUNK):  # in chunks: no body-sized copy, no 8x-sized array
        structure = unescaped[start : start + _CHUNK].translate(None, _NOT_STRUCTURE)
        if not structure:
            continue
        chunk = np.frombuffer(structure, dtype=np.uint8)
        quote_count = quotes + np.cumsum(chunk == ord('"'), dtype=np.int64)
        outside = quote_count % 2 == 0
        opens = outside & ((chunk == ord("[")) | (chunk == ord("{")))
        closes = outside & ((chunk == ord("]")) | (chunk == ord("}")))
        separators = outside & ((chunk == ord(",")) | (chunk == ord(":")))
        levels = depth + np.cumsum(opens.astype(np.int64) - closes)
        deepest = max(deepest, int(levels.max()))
        items += int(np.count_nonzero(opens)) + int(np.count_nonzero(separators))
        quotes, depth = int(quote_count[-1]), int(levels[-1])
    return JsonShape(deepest, items)


def check_json_shape(data: bytes, max_depth: int, max_items: int) -> None:
    shape = json_shape(data)
    if shape.depth > max_depth:
        raise InvalidRequest(
            [
                FieldProblem(
                    ("body",),
                    f"JSON nests {shape.depth} levels deep; at most {max_depth} are accepted (--max-json-depth)",
                    "json_too_deep",
                    ctx={"max_depth": max_depth},
                )
            ]
        )
    if shape.items > max_items:
        raise InvalidRequest(
            [
                FieldProblem(
                    ("body",),
                    f"JSON holds {shape.items} items (arrays, objects and their entries); at most {max_items} "
                    "(--max-json-items)",
                    "json_too_large",
                    ctx={"max_items": max_items},
                )
            ]
        )


def parse_json(data: bytes, max_depth: int, max_items: int) -> Any:
    """Strict JSON: UTF-8, measured first, then no NaN/Infinity, no number past a float, no lone surrogate.

    NaN and Infinity (which Python reads, and RFC 8259 does not have) are parsed and then refused where they
    stand, so the 422 points at the field, as it does for a number past a float.
    """
    check_json_shape(data, max_depth, max_items)
    non_finite = False

    def parse_float(text: str) -> float:
        nonlocal non_finite
        value = float(text)
        non_finite |= not math.isfinite(value)
        return value

    try:
        value = json.loads(
            data.decode("utf-8-sig"), parse_constant=parse_float, parse_float=parse_float, object_pairs_hook=_unique
        )
    except DuplicateKey as duplicate:
        message = f"the key {duplicate.key!r} appears twice in one object: send each key once (RFC 8259)"
        raise InvalidRequest([FieldProblem(("body",), message, "json_duplicate_key")]) from None
    except (ValueError, RecursionError) as error:  # decode errors, bad JSON, integers past 4300 digits
        raise InvalidRequest([FieldProblem(("body",), f"JSON decode error: {error}", "json_invalid")]) from None
    if non_finite or _SURROGATE_ESCAPE.search(data):
        problems = unrepresentable(value)
        if problems:
            raise InvalidRequest(problems)
    return value


class DuplicateKey(ValueError):
    """A JSON object names one key twice; Python's parser would keep the last value without a word."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """One JSON object, refused when it names a key twice (`json.loads`'s `object_pairs_hook`)."""
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return value


def unrepresentable(value: Any) -> list[FieldProblem]:
    """Where `value` holds a non-finite number or a string with a lone surrogate (keys included), located as
    validation's 422s are (a question's kind after its id)."""
    problems: list[FieldProblem] = []
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ("body",))]
    while stack and len(problems) < _MAX_PROBLEMS:
        item, loc = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            problems.append(FieldProblem(loc, NOT_FINITE, "finite_number"))
        elif isinstance(item, str) and not _encodable(item):
            problems.append(FieldProblem(loc, "string holds a lone UTF-16 surrogate (not Unicode)", "string_unicode"))
        elif isinstance(item, list):
            stack.extend((entry, (*loc, index)) for index, entry in enumerate(item))
        elif isinstance(item, dict):
            loc = (*loc, *_question_kind(loc, item))
            for key, entry in item.items():
                if not _encodable(key):
                    problems.append(FieldProblem((*loc, key), "key holds a lone UTF-16 surrogate", "string_unicode"))
                stack.append((entry, (*loc, key)))
    return problems


def _question_kind(loc: tuple[str | int, ...], item: dict[str, Any]) -> tuple[str, ...]:
    """A question's known kind, which its fields' locations carry after its id (`body.questions.q.choice.…`)."""
    kind = item.get("type")
    is_question = len(loc) == 3 and loc[1] == "questions"
    return (kind,) if is_question and isinstance(kind, str) and kind in KINDS else ()


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
