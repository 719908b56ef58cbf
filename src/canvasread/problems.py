"""Pydantic's validation errors as the 422 entries a user reads: the path they wrote, what is allowed.

Pydantic locates an error inside a union by the member it tried (`state.str`,
`samples.constrained-int`), reports one entry per member, names a missing
discriminator in its own words and leaves `None` in a context it did not fill.
Here each location is walked through the input the caller sent: a segment that
is neither a key nor an index there (nor the question's own `type`, which the
hosted API's locations carry, nor a missing field at the end) is a member's
label and is dropped; the members' entries at one place become one entry that
lists what each member allows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized
from typing import Any

from pydantic import ValidationError

from canvasread.errors import FieldProblem
from canvasread.kinds import KINDS
from canvasread.types import JSONValue

Loc = tuple[str | int, ...]
# pydantic's prefix on a model validator's message.
_VALUE_ERROR = "Value error, "
_SHOULD_BE = "Input should be "
# ctx keys that describe pydantic's own types, not the input.
_INTERNAL_CTX = frozenset({"field_type", "discriminator", "class_name"})
_JSON_WORDS = {
    "a valid dictionary or object to extract fields from": "an object",
    "a valid dictionary": "an object",
    "a valid list": "an array",
    "a valid string": "a string",
    "a valid integer": "an integer",
    "a valid number": "a number",
    "a valid boolean": "true or false",
}


def problems_from(error: ValidationError, payload: Any) -> list[FieldProblem]:
    """The errors of validating `payload`, one entry per place in it, located as the caller wrote it."""
    merged: dict[Loc, list[FieldProblem]] = {}
    for entry in error.errors(include_url=False):
        problem = _one(entry, payload)
        merged.setdefault(problem.loc, []).append(problem)
    return [_merge(problems) if len(problems) > 1 else problems[0] for problems in merged.values()]


def _one(entry: Mapping[str, Any], payload: Any) -> FieldProblem:
    loc, kind = _user_loc(payload, tuple(entry["loc"]), entry["type"]), str(entry["type"])
    if kind.startswith("union_tag"):
        return _type_problem(entry, loc)
    msg = _in_json_words(str(entry["msg"]).removeprefix(_VALUE_ERROR))
    ctx = {k: _scalar(v) for k, v in entry.get("ctx", {}).items() if v is not None and k not in _INTERNAL_CTX}
    if kind in ("too_short", "too_long"):
        msg = _length_message(kind, ctx, entry.get("input"))
    elif kind == "model_type":  # pydantic's message names the model class ("or instance of SystemOneRequest")
        msg = f"{_SHOULD_BE}an object" if loc else "the request body should be a JSON object"
    return FieldProblem(loc, msg, kind, json_safe(entry.get("input")), ctx)


def _type_problem(entry: Mapping[str, Any], loc: Loc) -> FieldProblem:
    """A question's discriminator, missing or not a kind: located at its `type`, listing the kinds."""
    tags = ", ".join(f'"{name}"' for name in KINDS)
    ctx: dict[str, JSONValue] = {"expected": tags}
    if entry["type"] == "union_tag_invalid":  # echoed as sent: pydantic's ctx holds the tag as text ("5" for 5)
        tag = json_safe(entry["input"].get("type"))
        return FieldProblem(
            (*loc, "type"), f"{_SHOULD_BE}one of {tags} (the question types)", "literal_error", tag, ctx
        )
    msg = f"Field required: a question's type, one of {tags}"
    return FieldProblem((*loc, "type"), msg, "missing", json_safe(entry.get("input")), ctx)


def _user_loc(payload: Any, loc: Loc, kind: str) -> Loc:
    """`loc` without the segments that are not in `payload` (union members' labels); see the module docstring."""
    kept: list[str | int] = []
    here = payload
    for index, segment in enumerate(loc):
        if _holds(here, segment):
            kept.append(segment)
            here = here[segment]
        elif isinstance(here, Mapping) and here.get("type") == segment:
            kept.append(segment)  # a question's kind: the hosted API's locations carry it
        elif index == len(loc) - 1 and kind == "missing":
            kept.append(segment)
    return tuple(kept)


def _holds(value: Any, segment: str | int) -> bool:
    if isinstance(value, Mapping):
        return segment in value
    return isinstance(value, list) and isinstance(segment, int) and 0 <= segment < len(value)


def _merge(problems: Sequence[FieldProblem]) -> FieldProblem:
    """The entries of a union's members at one place as one: the member the input came closest to, and every
    member's allowance in its message."""
    closest = next((p for p in problems if not p.type.endswith("_type")), problems[0])
    allowed = list(dict.fromkeys(p.msg.removeprefix(_SHOULD_BE) for p in problems))
    if all(p.msg.startswith(_SHOULD_BE) for p in problems):
        msg = _SHOULD_BE + (f"{', '.join(allowed[:-1])} or {allowed[-1]}" if len(allowed) > 1 else allowed[0])
    else:
        msg = "; or ".join(dict.fromkeys(p.msg for p in problems))
    return FieldProblem(closest.loc, msg, closest.type, closest.input, closest.ctx)


def _in_json_words(msg: str) -> str:
    """pydantic's Python words for JSON's types ("a valid dictionary") as a JSON user says them ("an object")."""
    for python, json in _JSON_WORDS.items():
        msg = msg.replace(python, json)
    return msg


def _length_message(kind: str, ctx: Mapping[str, JSONValue], value: Any) -> str:
    """pydantic's "should have at most 10 items after validation, not more" as the limit and the count sent."""
    limit = ctx.get("max_length") if kind == "too_long" else ctx.get("min_length")
    what = ("entry" if limit == 1 else "entries") if isinstance(value, Mapping) else ("item" if limit == 1 else "items")
    sent = f"; {len(value)} sent" if isinstance(value, Sized) else ""
    return f"Input should have {'at most' if kind == 'too_long' else 'at least'} {limit} {what}{sent}"


def _scalar(value: Any) -> JSONValue:
    return value if isinstance(value, str | int | float | bool) else str(value)


def json_safe(value: Any) -> JSONValue:
    """An input as JSON: mappings and sequences kept, anything else as its text (ctx may hold exceptions)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return str(value)
