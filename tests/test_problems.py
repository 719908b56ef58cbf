"""Every 422 names the field path the caller wrote and says what is allowed: no pydantic internals leak.

Table-driven over raw HTTP against the embedded default served as the README starts it: each bad body
must be a 422 whose every `loc` walks through the body as sent (a key or index at each step, the
question's `type` after its id as the hosted API's locations carry it, a missing field last), whose
message is in the caller's words, and whose `ctx` holds no placeholder for a value pydantic did not fill.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx
import pytest
from helpers import post

NOUL = {"type": "noul", "instructions": "Is this about billing?"}
# Words of pydantic's own that a caller never wrote and cannot act on.
INTERNAL = (
    "Unable to extract tag",
    "discriminator",
    "dict[str",
    "constrained-",
    "literal[",
    "after validation",
    "instance of",
)


def body(**changes: Any) -> dict[str, Any]:
    return {"model": "jev-latest", "state": "I was charged twice.", "questions": {"q": NOUL}, **changes}


def question(**fields: Any) -> dict[str, Any]:
    return body(questions={"q": fields})


# (id, body, the loc that must be among the entries, words its msg must hold: what is allowed)
CASES: list[tuple[str, dict[str, Any], list[Any], str]] = [
    ("state-number", body(state=5), ["state"], "a string, an object or an array"),
    ("state-bool", body(state=True), ["state"], "a string, an object or an array"),
    ("state-null", body(state=None), ["state"], "a string, an object or an array"),
    ("document-number", {"model": "jev-latest", "document": 5, "questions": {"q": NOUL}}, ["document"], "an object"),
    ("samples-zero", body(samples=0), ["samples"], "or 'auto'"),
    ("samples-word", body(samples="many"), ["samples"], "an integer or 'auto'"),
    ("samples-float", body(samples=2.5), ["samples"], "an integer or 'auto'"),
    ("samples-17", body(samples=17), ["samples"], "less than or equal to 16"),
    ("think-zero", body(think=0), ["think"], "greater than or equal to 1"),
    ("order", body(order="random"), ["order"], "'as-given' or 'rotate'"),
    ("steps-text", body(steps="2"), ["steps"], "an integer"),
    ("seed-text", body(seed="1"), ["seed"], "an integer"),
    ("diagnostics-text", body(diagnostics="yes"), ["diagnostics"], "true or false"),
    ("model-missing", {"state": "x", "questions": {"q": NOUL}}, ["model"], "Field required"),
    ("questions-list", body(questions=[NOUL]), ["questions"], "an object"),
    ("questions-empty", body(questions={}), ["questions"], "at least 1 entry"),
    ("question-number", body(questions={"q": 5}), ["questions", "q"], "an object"),
    ("type-missing", question(instructions="?"), ["questions", "q", "type"], '"noul", "choice", "score"'),
    ("type-unknown", question(type="maybe"), ["questions", "q", "type"], '"noul", "choice", "score"'),
    (
        "instructions-number",
        question(type="noul", instructions=5),
        ["questions", "q", "noul", "instructions"],
        "a string",
    ),
    (
        "noul-side-number",
        question(type="noul", criteria={"true": 1}),
        ["questions", "q", "noul", "criteria", "true"],
        "a string, an object or an array",
    ),
    ("noul-nothing", question(type="noul"), ["questions", "q", "noul"], "instructions or at least one described side"),
    (
        "noul-blank",
        question(type="noul", instructions=" "),
        ["questions", "q", "noul"],
        "instructions or at least one described side",
    ),
    ("noul-criteria-list", question(type="noul", criteria=["a"]), ["questions", "q", "noul", "criteria"], "an object"),
    ("escalate-list", body(escalate=[0.5]), ["escalate"], "an object"),
    (
        "choice-256",
        question(type="choice", criteria={f"option {i}": None for i in range(256)}),
        ["questions", "q", "choice", "criteria"],
        "at most 255 entries; 256 sent",
    ),
    (
        "choice-list",
        question(type="choice", criteria=["a", "b"]),
        ["questions", "q", "choice", "criteria"],
        "an object",
    ),
    (
        "choice-empty",
        question(type="choice", criteria={}),
        ["questions", "q", "choice", "criteria"],
        "at least 1 entry",
    ),
    (
        "score-11",
        question(type="score", criteria=[str(i) for i in range(11)]),
        ["questions", "q", "score", "criteria"],
        "at most 10 items; 11 sent",
    ),
    ("min-confidence", question(**NOUL, min_confidence=2), ["questions", "q", "noul", "min_confidence"], "1"),
    ("ask-if-empty", question(**NOUL, ask_if={"a": []}), ["questions", "q", "noul", "ask_if", "a"], "at least 1 item"),
    ("depends-on-text", question(**NOUL, depends_on="a"), ["questions", "q", "noul", "depends_on"], "an array"),
    ("alone-text", question(**NOUL, alone="yes"), ["questions", "q", "noul", "alone"], "true or false"),
    ("assets-empty", body(assets={}), ["assets"], "at least 1 entry"),
    ("asset-type", body(assets={"<image:1>": {"type": "video"}}), ["assets", "<image:1>", "type"], "'image'"),
    (
        "asset-format",
        body(assets={"<image:1>": {"format": "gif", "data_base64": "AAAA"}}),
        ["assets", "<image:1>", "format"],
        "'png', 'jpg' or 'jpeg'",
    ),
    ("asset-nothing", body(assets={"<image:1>": {"type": "image"}}), ["assets", "<image:1>"], "data_base64"),
]


def walks_the_body(sent: Any, loc: list[Any], kind: str) -> bool:
    """Whether `loc` (without "body") is a path through `sent`; see the module docstring."""
    here = sent
    for index, segment in enumerate(loc):
        if (isinstance(here, Mapping) and segment in here) or (isinstance(here, list) and isinstance(segment, int)):
            here = here[segment]
        elif isinstance(here, Mapping) and here.get("type") == segment:
            continue
        elif not (index == len(loc) - 1 and kind == "missing"):
            return False
    return True


@pytest.mark.parametrize(("sent", "loc", "allowed"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_422_names_the_path_written_and_what_is_allowed(
    sparrow_server: str, sent: dict[str, Any], loc: list[Any], allowed: str
) -> None:
    response = post(sparrow_server, sent)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    for entry in detail:
        assert entry["loc"][0] == "body"
        assert walks_the_body(sent, entry["loc"][1:], entry["type"]), entry
        assert not any(word in entry["msg"] for word in INTERNAL), entry
        assert "None" not in json.dumps(entry.get("ctx") or {}), entry
    entries = [entry for entry in detail if entry["loc"] == ["body", *loc]]
    assert len(entries) == 1, detail  # one entry per place: a union's members are one entry
    assert allowed in entries[0]["msg"], entries[0]


@pytest.mark.parametrize("kind", ["rating", 5, None, ["noul"]])
def test_the_question_type_is_echoed_as_sent_where_it_is_wrong(sparrow_server: str, kind: Any) -> None:
    [entry] = post(sparrow_server, question(type=kind)).json()["detail"]
    assert entry["input"] == kind and entry["type"] == "literal_error"


@pytest.mark.parametrize("sent", [[1, 2], "a ticket", 5, None])
def test_a_body_that_is_not_an_object_is_told_so_naming_no_class(sparrow_server: str, sent: Any) -> None:
    raw = json.dumps(sent).encode()  # as sent: httpx sends no body at all for json=None
    response = httpx.post(
        sparrow_server + "/v1/systemone", content=raw, headers={"content-type": "application/json"}, timeout=30
    )
    [entry] = response.json()["detail"]
    assert entry["loc"] == ["body"] and entry["msg"] == "the request body should be a JSON object"
    assert "SystemOneRequest" not in response.text


def test_a_nested_object_of_the_wrong_type_names_no_class(sparrow_server: str) -> None:
    response = post(sparrow_server, question(type="noul", criteria=["yes"]))
    [entry] = response.json()["detail"]
    assert entry["msg"] == "Input should be an object" and "NoulCriteria" not in response.text


def test_a_nan_is_refused_at_its_field(sparrow_server: str) -> None:
    raw = json.dumps(question(**NOUL, min_confidence=0.5)).replace("0.5", "NaN").encode()
    response = httpx.post(
        sparrow_server + "/v1/systemone", content=raw, headers={"content-type": "application/json"}, timeout=30
    )
    assert response.status_code == 422
    [entry] = response.json()["detail"]
    assert entry["loc"] == ["body", "questions", "q", "noul", "min_confidence"] and entry["type"] == "finite_number"
