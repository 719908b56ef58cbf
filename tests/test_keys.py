"""Keys no model reads and empty states: a warning naming what was meant, or a 422 under `serve --strict`.

Over raw HTTP against the embedded default (as the README starts it) and a second one started with
`--strict`; the keys are the misspellings users sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers import post, serve_cli

from canvasread.keys import near_miss, unknown_keys
from canvasread.wire import SystemOneRequest

NOUL = {"type": "noul", "instructions": "Is this about billing?"}


def body(question: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    return {"model": "jev-latest", "state": "I was charged twice.", "questions": {"q": question or NOUL}, **top}


@pytest.fixture(scope="module")
def strict_server() -> Iterator[str]:
    with serve_cli("--strict") as base:
        yield base


def warnings_of(base: str, sent: dict[str, Any]) -> list[dict[str, Any]]:
    response = post(base, sent)
    assert response.status_code == 200, response.text
    return list(response.json().get("warnings", []))


@pytest.mark.parametrize(
    ("question", "loc", "meant"),
    [
        ({**NOUL, "ask_iff": {"other": [True]}}, ["questions", "q", "noul", "ask_iff"], "ask_if"),
        ({**NOUL, "min_confidense": 0.9}, ["questions", "q", "noul", "min_confidense"], "min_confidence"),
        ({**NOUL, "Order": "rotate"}, ["questions", "q", "noul", "Order"], "order"),
        ({"type": "noul", "instructions": "?", "criteria": {"true": "x", "yes": "y"}}, None, None),
    ],
    ids=["ask_iff", "min_confidense", "Order", "noul-criteria-yes"],
)
def test_a_misspelled_question_key_is_a_warning_naming_the_key_meant(
    sparrow_server: str, question: dict[str, Any], loc: list[Any] | None, meant: str | None
) -> None:
    [warning] = warnings_of(sparrow_server, body(question))
    assert warning["type"] == "extra_forbidden"
    if meant is None:  # no near miss: the warning lists the keys read there
        assert warning["loc"] == ["questions", "q", "noul", "criteria", "yes"]
        assert "true, false" in warning["msg"]
    else:
        assert warning["loc"] == loc and f"did you mean {meant!r}" in warning["msg"]


@pytest.mark.parametrize("key", ["sample", "diagnostic"])
def test_a_question_key_that_belongs_at_the_top_says_what_a_question_reads(sparrow_server: str, key: str) -> None:
    [warning] = warnings_of(sparrow_server, body({**NOUL, key: 3}))
    assert warning["loc"] == ["questions", "q", "noul", key] and "min_confidence" in warning["msg"]


@pytest.mark.parametrize(("key", "meant"), [("sample", "samples"), ("diagnostic", "diagnostics"), ("sed", "seed")])
def test_a_near_miss_of_a_top_level_key_is_a_warning(sparrow_server: str, key: str, meant: str) -> None:
    [warning] = warnings_of(sparrow_server, body(**{key: 1}))
    assert warning["loc"] == [key] and f"did you mean {meant!r}" in warning["msg"]


def test_other_unknown_top_level_keys_stay_ignored_as_the_hosted_api_does(sparrow_server: str) -> None:
    response = post(sparrow_server, body(metadata={"user": "a"}, stream=False, user="u"))
    assert response.status_code == 200 and "warnings" not in response.json()
    # A client's own key that only looks like one the wire reads, sent beside that key, is its own business.
    assert warnings_of(sparrow_server, body(seed=1, seeds=[1, 2])) == []


@pytest.mark.parametrize("state", ["", "   \n", {}, [], {"text": ""}, [[], {}]])
def test_an_empty_state_is_a_warning(sparrow_server: str, state: Any) -> None:
    [warning] = warnings_of(sparrow_server, body(state=state))
    assert warning["loc"] == ["state"] and warning["type"] == "empty_state"


def test_a_state_with_something_in_it_is_no_warning(sparrow_server: str) -> None:
    assert warnings_of(sparrow_server, body(state={"amount": 0})) == []
    assert warnings_of(sparrow_server, body(state=["ok"])) == []


@pytest.mark.parametrize(
    ("sent", "loc"),
    [
        (body(metadata={"user": "a"}), ["body", "metadata"]),
        (body(sample=2), ["body", "sample"]),
        (body({**NOUL, "ask_iff": {"x": [True]}}), ["body", "questions", "q", "noul", "ask_iff"]),
        (body(state="  "), ["body", "state"]),
        (body(state=[]), ["body", "state"]),
    ],
    ids=["unknown-top", "near-miss-top", "question-key", "blank-state", "empty-array"],
)
def test_strict_refuses_what_is_otherwise_a_warning(strict_server: str, sent: dict[str, Any], loc: list[Any]) -> None:
    response = post(strict_server, sent)
    assert response.status_code == 422, response.text
    [entry] = response.json()["detail"]
    assert entry["loc"] == loc and "--strict" in entry["msg"]


def test_strict_lists_unknown_keys_beside_validation_errors_and_answers_clean_requests(strict_server: str) -> None:
    detail = post(strict_server, body(samples=0, extra=1)).json()["detail"]
    assert [entry["loc"] for entry in detail] == [["body", "samples"], ["body", "extra"]]
    assert post(strict_server, body()).status_code == 200


def test_keys_are_found_beside_the_models_with_their_near_misses() -> None:
    sent = body({**NOUL, "alon": True}, assets={"<image:1>": {"type": "image", "data": "x"}}, steps=1)
    found = {unknown.loc: unknown.resembles for unknown in unknown_keys(sent, SystemOneRequest)}
    assert found == {("questions", "q", "noul", "alon"): "alone", ("assets", "<image:1>", "data"): None}
    assert near_miss("stream", ("steps", "seed", "state")) is None
