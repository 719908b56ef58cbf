"""The served /openapi.json against the official SDK's generated models (typesafe-sdk 0.7.5): same types where
the hosted API declares them, the SDK's own examples valid, our extensions and request forms declared."""

from __future__ import annotations

import gzip
import importlib.metadata
import itertools
import json
import re
import zlib
from typing import Any

import httpx
import jsonschema_rs
import pytest
import zstandard
from pydantic import BaseModel
from typesafe_sdk._schemas import models as sdk

from canvasread.errors import BadRequest
from canvasread.server.body import decode_content

REQUEST_MODELS = {
    "SystemOneRequest": sdk.SystemOneRequest,
    "NoulQuestion": sdk.NoulQuestion,
    "ChoiceQuestion": sdk.ChoiceQuestion,
    "ScoreQuestion": sdk.ScoreQuestion,
    "BoxQuestion": sdk.BoxQuestion,
    "NoulCriteria": sdk.NoulCriteria,
    "WireAsset": sdk.Asset,
}
ANSWER_MODELS = {"NoulAnswer", "ChoiceAnswer", "ScoreAnswer", "BoxAnswer"}


@pytest.fixture(scope="module")
def served(sparrow_server: str) -> dict[str, Any]:
    document: dict[str, Any] = httpx.get(sparrow_server + "/openapi.json", timeout=10).json()
    return document


def validator(document: dict[str, Any], name: str) -> Any:
    return jsonschema_rs.Draft202012Validator({"$ref": f"#/components/schemas/{name}", **document})


def json_types(schema: dict[str, Any], components: dict[str, Any]) -> frozenset[str]:
    """The JSON types a schema admits, through refs and unions (`const`/`enum` values count by their type)."""
    if "$ref" in schema:
        return json_types(components[schema["$ref"].rsplit("/", 1)[-1]], components)
    if "anyOf" in schema or "oneOf" in schema:
        return frozenset().union(*(json_types(s, components) for s in schema.get("anyOf", schema.get("oneOf"))))
    if "type" in schema:
        return frozenset([schema["type"]] if isinstance(schema["type"], str) else schema["type"])
    values = [schema["const"]] if "const" in schema else schema.get("enum", [])
    names = {str: "string", type(None): "null", bool: "boolean", int: "integer", float: "number"}
    return frozenset(names[type(value)] for value in values) or frozenset({"any"})


def sdk_schema(model: type[BaseModel]) -> tuple[dict[str, Any], dict[str, Any]]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    return schema, schema.pop("$defs", {})


@pytest.mark.parametrize("ours", list(REQUEST_MODELS))
def test_request_fields_admit_the_types_the_sdk_declares(served: dict[str, Any], ours: str) -> None:
    components = served["components"]["schemas"]
    theirs, their_components = sdk_schema(REQUEST_MODELS[ours])
    our_properties = components[ours]["properties"]
    for field, their_field in theirs["properties"].items():
        assert field in our_properties, f"{ours}.{field} is not declared"
        assert json_types(our_properties[field], components) == json_types(their_field, their_components), (
            f"{ours}.{field}"
        )
    assert set(theirs.get("required", [])) == set(components[ours].get("required", [])), ours


def test_sdk_request_examples_validate_against_the_served_schema(served: dict[str, Any]) -> None:
    """Every combination of the SDK's example values for a whole request, and for each question type."""
    request = validator(served, "SystemOneRequest")
    fields = sdk.SystemOneRequest.model_fields
    examples = [fields[name].examples or [] for name in ("model", "state", "questions")]
    checked = 0
    for model, state, questions in itertools.product(*examples):
        body = {"model": model, "state": state, "questions": questions}
        assert request.is_valid(body), list(request.iter_errors(body))
        checked += 1
    for name in ("NoulQuestion", "ChoiceQuestion", "ScoreQuestion", "BoxQuestion"):
        question_fields = REQUEST_MODELS[name].model_fields
        kind = question_fields["type"].annotation.__args__[0]  # type: ignore[union-attr]
        per_field = [[(f, e) for e in (info.examples or [])] for f, info in question_fields.items() if f != "type"]
        for chosen in itertools.product(*[options for options in per_field if options]):
            question = {"type": kind, **dict(chosen)}
            body = {"model": "jev-latest", "state": "x", "questions": {"q": question}}
            assert request.is_valid(body), list(request.iter_errors(body))
            checked += 1
    assert checked >= 8


def sdk_quick_start(base: str) -> Any:
    """The Python block of the installed SDK's own README, run against `base`; returns its `response`."""
    readme = importlib.metadata.metadata("typesafe-sdk").get_payload()  # type: ignore[attr-defined]
    [code] = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert "TypeSafeClient()" in code
    scope: dict[str, Any] = {}
    exec(code.replace("TypeSafeClient()", f"TypeSafeClient(base_url={base!r}, api_key='local')"), scope)
    return scope["response"]


def test_request_examples_are_the_sdks_quick_start_and_each_is_answered(
    served: dict[str, Any], sparrow_server: str
) -> None:
    """Swagger's "Try it out" sends the first example as it is: it is the body the SDK's README sends."""
    content = served["paths"]["/v1/systemone"]["post"]["requestBody"]["content"]["application/json"]
    examples = [example["value"] for example in content["examples"].values()]
    sent = sdk_quick_start(sparrow_server).raw_http_response.request
    assert sent.headers["content-type"] == "application/json"
    assert examples[0] == json.loads(sent.content)
    request = validator(served, "SystemOneRequest")
    for body in examples:
        assert request.is_valid(body), list(request.iter_errors(body))
        answered = httpx.post(sparrow_server + "/v1/systemone", json=body, timeout=30)
        assert answered.status_code == 200 and set(answered.json()["answers"]) == set(body["questions"])


def test_sdk_response_examples_validate_against_the_served_schema(served: dict[str, Any]) -> None:
    response = validator(served, "SystemOneResponse")
    fields = sdk.SystemOneResponse.model_fields
    for answers, usage in itertools.product(fields["answers"].examples or [], fields["usage"].examples or []):
        body = {"model": "jev-latest", "answers": answers, "usage": usage}
        assert response.is_valid(body), list(response.iter_errors(body))
    box = {"type": "box", "box": sdk.BoxAnswer.model_fields["box"].examples[0], "confidence": None}  # type: ignore[index]
    assert response.is_valid({"model": "m", "answers": {"b": box}, "usage": {"input_tokens": 1, "output_tokens": 0}})
    assert not response.is_valid({"model": "m", "answers": {}, "usage": {"input_tokens": 1, "output_tokens": 0}})


def test_extensions_are_declared(served: dict[str, Any]) -> None:
    components = served["components"]["schemas"]
    request = components["SystemOneRequest"]["properties"]
    assert {"samples", "seed", "diagnostics", "order", "steps"} <= set(request)
    assert (request["steps"]["minimum"], request["steps"]["maximum"], request["steps"]["default"]) == (1, 8, 1)
    [think] = [kind for kind in request["think"]["anyOf"] if kind.get("type") == "integer"]
    assert (think["minimum"], think["maximum"], request["think"]["default"]) == (1, 1024, None)
    for question in ("NoulQuestion", "ChoiceQuestion", "ScoreQuestion", "BoxQuestion"):
        assert {"order", "min_confidence"} <= set(components[question]["properties"])
    for answer in ANSWER_MODELS:
        assert {"abstain", "diagnostics"} <= set(components[answer]["properties"])
    assert components["ScoreQuestion"]["properties"]["criteria"]["maxItems"] == 10  # as hosted


def test_both_request_forms_and_compression_are_documented(served: dict[str, Any]) -> None:
    operation = served["paths"]["/v1/systemone"]["post"]
    content = operation["requestBody"]["content"]
    assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/SystemOneRequest"}
    multipart = content["multipart/form-data"]
    assert multipart["schema"]["properties"]["request"] == {"$ref": "#/components/schemas/SystemOneRequest"}
    assert multipart["encoding"]["request"]["contentType"] == "application/json"
    [encoding] = [p for p in operation["parameters"] if p["name"] == "Content-Encoding"]
    assert encoding["in"] == "header" and "zstd" in encoding["schema"]["enum"]
    assert "400" in operation["responses"] and "404" not in operation["responses"]


def test_the_documented_encodings_are_the_ones_the_server_decodes(served: dict[str, Any]) -> None:
    """The fuzzer sends values outside the enum and expects a refusal: an empty `Content-Encoding` (no coding,
    read as identity) was accepted while the enum left it out."""
    operation = served["paths"]["/v1/systemone"]["post"]
    [encoding] = [p for p in operation["parameters"] if p["name"] == "Content-Encoding"]
    raw = b'{"state": "x"}'
    coders = {"zstd": zstandard.compress, "gzip": gzip.compress, "x-gzip": gzip.compress, "deflate": zlib.compress}
    documented = set(encoding["schema"]["enum"])
    tried = documented | {"", "identity", "x-gzip", "br", "compress", "none", "x-zstd", "gzip, zstd"}
    for name in sorted(tried):
        try:
            taken = decode_content(coders.get(name, bytes)(raw), name, limit=100) == raw
        except BadRequest as refused:
            assert "unsupported Content-Encoding" in refused.message, name
            taken = False
        assert taken == (name in documented), f"Content-Encoding {name!r}"
