"""Keys a request holds that its pydantic models do not read, found by walking the models beside the JSON.

The wire ignores unknown keys, as the hosted API does, so `ask_iff` or
`min_confidense` would be dropped without a word and the question asked as if
they were absent. This walk finds each such key with its place (located as a
422 would locate it: a question's kind after its id) and the known key it
resembles (difflib), so `wire.parse_request` can warn about it, or refuse it
under `serve --strict`.
"""

from __future__ import annotations

import difflib
import functools
import types
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AliasChoices, BaseModel

Loc = tuple[str | int, ...]
# How alike a key and a known one must be (difflib's ratio) to be named as what was meant: `sample` and
# `samples` are 0.92, `ask_iff` and `ask_if` 0.92; `stream` and `steps` (0.55) are unrelated.
NEAR_MISS = 0.8


@dataclass(frozen=True)
class UnknownKey:
    """A key no model reads: where it is (`loc`, its own name last), the keys read there, the one it resembles."""

    loc: Loc
    known: tuple[str, ...]
    resembles: str | None

    @property
    def key(self) -> str:
        return str(self.loc[-1])


def unknown_keys(value: Any, model: type[BaseModel], loc: Loc = ()) -> Iterator[UnknownKey]:
    """Every key of `value` (JSON, as sent) and of what it nests that `model` and its field models do not read."""
    if not isinstance(value, Mapping):
        return
    known = known_keys(model)
    for key, inner in value.items():
        field = _field_named(model, key)
        if field is None:
            yield UnknownKey((*loc, key), known, near_miss(key, known))
        else:
            yield from _in_annotation(inner, field, (*loc, key))


def known_keys(model: type[BaseModel]) -> tuple[str, ...]:
    """The keys `model` reads: its fields' names and their validation aliases."""
    return tuple(_annotations_by_key(model))


def near_miss(key: str, known: tuple[str, ...]) -> str | None:
    """The known key `key` most resembles, when it is close enough to be a slip of the keyboard."""
    lowered = {name.lower(): name for name in known}
    matches = difflib.get_close_matches(key.lower(), lowered, n=1, cutoff=NEAR_MISS)
    return lowered[matches[0]] if matches else None


def _field_named(model: type[BaseModel], key: str) -> Any:
    """The annotation of the field that reads `key` (None: no field does)."""
    return _annotations_by_key(model).get(key)


@functools.cache
def _annotations_by_key(model: type[BaseModel]) -> dict[str, Any]:
    """Each key `model` reads (field names, then their aliases) and its field's annotation; worked out once a
    model, as every mapping of every request is checked against it."""
    by_key: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        for key in (name, *_aliases(field.validation_alias)):
            by_key.setdefault(key, field.annotation)
    return by_key


def _aliases(alias: Any) -> tuple[str, ...]:
    if isinstance(alias, AliasChoices):
        return tuple(choice for choice in alias.choices if isinstance(choice, str))
    return (alias,) if isinstance(alias, str) else ()


def _in_annotation(value: Any, annotation: Any, loc: Loc) -> Iterator[UnknownKey]:
    """The unknown keys inside `value`, read as `annotation` says: a model, a map or list of them, a union."""
    origin = get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield from unknown_keys(value, annotation, loc)
    elif origin is Annotated:
        yield from _in_annotation(value, get_args(annotation)[0], loc)
    elif origin is dict and isinstance(value, Mapping):
        for key, inner in value.items():
            yield from _in_annotation(inner, get_args(annotation)[1], (*loc, key))
    elif origin is list and isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _in_annotation(inner, get_args(annotation)[0], (*loc, index))
    elif origin in (Union, types.UnionType):
        members = tuple(member for member in get_args(annotation) if member is not type(None))
        if len(members) == 1:
            yield from _in_annotation(value, members[0], loc)
            return
        member = _member_for(value, members)
        if member is not None:  # a discriminated member is located under its tag, as pydantic's errors are
            yield from unknown_keys(value, member, (*loc, value["type"]) if _tag_of(member) else loc)


def _member_for(value: Any, members: tuple[Any, ...]) -> Any:
    """The model member of a union that `value` is meant for: the one its `type` names, else the only model."""
    if not isinstance(value, Mapping):
        return None
    by_tag, only = _union_models(members)
    if by_tag:
        tag = value.get("type")
        return by_tag.get(tag) if isinstance(tag, Hashable) else None
    return only


@functools.cache
def _union_models(members: tuple[Any, ...]) -> tuple[dict[Any, type[BaseModel]], type[BaseModel] | None]:
    """A union's models by each `type` value that names one (first member first), and its one model when none is
    tagged; worked out once a union, as every question of every request is checked against the questions'."""
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    by_tag: dict[Any, type[BaseModel]] = {}
    for model in models:
        for tag in _tag_of(model) or ():
            by_tag.setdefault(tag, model)
    return by_tag, models[0] if len(models) == 1 and not by_tag else None


@functools.cache
def _tag_of(model: type[BaseModel]) -> tuple[Any, ...] | None:
    """The values a model's `type` field may take when it is a literal (a discriminated union's member)."""
    field = model.model_fields.get("type")
    if field is None or get_origin(field.annotation) is not Literal:
        return None
    return get_args(field.annotation)
