"""What the wire accepts, as the official SDK's generated models declare it, over raw HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

ONE_PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="


def ask(base: str, questions: dict[str, Any], **body: Any) -> httpx.Response:
    payload = {"model": "jev-latest", "state": "I was charged twice; refund me.", "questions": questions, **body}
    return httpx.post(base + "/v1/systemone", json=payload, timeout=60)


def test_an_empty_description_reads_as_null(sparrow_server: str) -> None:
    """One popular client sends "" for every undescribed side; the answer must not move because of it."""
    noul = {"type": "noul", "instructions": "Is this about money?"}
    choice = {"type": "choice", "instructions": "Which team?"}
    with_empty = ask(
        sparrow_server,
        {
            "money": {**noul, "criteria": {"true": "The customer wants money back.", "false": ""}},
            "team": {**choice, "criteria": {"billing": "charges", "technical": ""}},
        },
    ).json()["answers"]
    with_null = ask(
        sparrow_server,
        {
            "money": {**noul, "criteria": {"true": "The customer wants money back.", "false": None}},
            "team": {**choice, "criteria": {"billing": "charges", "technical": None}},
        },
    ).json()["answers"]
    assert with_empty == with_null
    nothing_to_ask = ask(sparrow_server, {"q": {"type": "noul", "criteria": {"true": "", "false": ""}}})
    assert nothing_to_ask.status_code == 422
    assert "instructions or at least one described side" in nothing_to_ask.text


@pytest.mark.parametrize(
    ("question", "loc"),
    [
        ({"type": "noul", "instructions": 5}, ["body", "questions", "q", "noul", "instructions"]),
        ({"type": "noul", "instructions": True}, ["body", "questions", "q", "noul", "instructions"]),
        ({"type": "noul", "criteria": {"true": 1}}, ["body", "questions", "q", "noul", "criteria", "true"]),
        (
            {"type": "noul", "criteria": {"true": "yes", "false": False}},
            ["body", "questions", "q", "noul", "criteria", "false"],
        ),
        ({"type": "box", "instructions": 0.5}, ["body", "questions", "q", "box", "instructions"]),
    ],
)
def test_instructions_and_noul_sides_are_text_objects_or_arrays(
    sparrow_server: str, question: dict[str, Any], loc: list[str]
) -> None:
    response = ask(sparrow_server, {"q": question})
    assert response.status_code == 422, response.text
    assert {tuple(problem["loc"][: len(loc)]) for problem in response.json()["detail"]} == {tuple(loc)}


def test_objects_and_arrays_are_fine_and_an_asset_type_may_be_null(sparrow_server: str) -> None:
    question = {"type": "noul", "instructions": {"task": "refund?"}, "criteria": {"true": ["money", "back"]}}
    assert ask(sparrow_server, {"q": question}).status_code == 200
    asset = {"type": None, "format": "png", "data_base64": ONE_PIXEL_PNG}
    response = ask(sparrow_server, {"q": question}, state="<image:1>", assets={"<image:1>": asset})
    # The asset is read (not refused as malformed); the embedded model then says it cannot see images.
    assert response.status_code == 422 and "cannot see images" in response.text


def test_core_errors_locate_fields_in_the_request_and_only_http_says_body(sparrow_server: str) -> None:
    from canvasread.errors import InvalidRequest
    from canvasread.wire import parse_request

    body = {"model": "jev-latest", "state": {"a": 1}, "questions": {"who": {"type": "span", "instructions": "Who?"}}}
    with pytest.raises(InvalidRequest) as caught:
        parse_request(body)
    assert [problem.loc for problem in caught.value.problems] == [("questions", "who", "span")]
    assert "body" not in caught.value.message
    response = httpx.post(sparrow_server + "/v1/systemone", json=body, timeout=60)
    assert response.status_code == 422
    assert [problem["loc"] for problem in response.json()["detail"]] == [["body", "questions", "who", "span"]]
