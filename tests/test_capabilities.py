"""What a model's card allows, checked before queueing: one 422 listing every field the model cannot serve."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from helpers import png

from canvasread.capabilities import check_capabilities
from canvasread.errors import InvalidRequest
from canvasread.types import Capabilities, ModelCard
from canvasread.wire import parse_request

PLAIN = ModelCard("plain", "no extras", "2026-01-01")
CANVAS = ModelCard("canvas", "all of it", "2026-01-01", Capabilities(images=True, spans=True, max_steps=8, think=True))


def request(questions: dict[str, Any], **extensions: Any) -> Any:
    return parse_request({"model": "m", "state": "Refund Zoë for order 1182.", "questions": questions, **extensions})[1]


def test_a_plain_model_refuses_every_extra_at_its_field_in_one_answer() -> None:
    asked = request(
        {"who": {"type": "span", "instructions": "Who?"}, "ok": {"type": "noul", "instructions": "Ok?"}},
        steps=3,
        think=16,
    )
    with pytest.raises(InvalidRequest) as caught:
        check_capabilities(PLAIN, asked)
    expected = [("questions", "who", "span"), ("steps",), ("think",)]
    assert [p.loc for p in caught.value.problems] == expected
    assert all("model plain" in p.msg for p in caught.value.problems)


def test_a_box_needs_a_model_that_sees_and_exactly_one_image() -> None:
    image = {"format": "png", "data_base64": base64.b64encode(png()).decode()}
    box = {"where": {"type": "box", "instructions": "Where is the parcel? photo"}}
    with pytest.raises(InvalidRequest, match="exactly one image"):
        check_capabilities(CANVAS, request(box))
    check_capabilities(CANVAS, request(box, assets={"photo": image}))
    with pytest.raises(InvalidRequest, match="cannot see images"):
        check_capabilities(PLAIN, request(box, assets={"photo": image}))


def test_options_past_the_models_limit_are_refused_naming_the_model() -> None:
    narrow = ModelCard("narrow", "", "2026-01-01", Capabilities(max_options=2))
    choice = {"team": {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}}
    with pytest.raises(InvalidRequest, match="at most 2 options per question for model narrow"):
        check_capabilities(narrow, request(choice))
    check_capabilities(CANVAS, request(choice))
