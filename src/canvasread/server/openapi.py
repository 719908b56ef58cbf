"""The app's OpenAPI document, patched in one place.

FastAPI documents what its routes declare; what it cannot see is added here:
the System One request schema (the route reads its body itself, to handle
zstd and multipart), request examples that Swagger's "Try it out" sends as
they are, and, when keys are configured, the bearer scheme (so generated
clients and schema fuzzers send a key).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from canvasread.server.auth import PUBLIC_PATHS
from canvasread.wire import SystemOneRequest

_BEARER = {
    "type": "http",
    "scheme": "bearer",
    "description": "One of the server's API keys (--api-key, CANVASREAD_API_KEYS or --api-keys-file).",
}


# Bodies Swagger's "Try it out" sends as they are: the official SDK's quick start (the body its README's call sends),
# then one question of each answer type.
REQUEST_EXAMPLES: dict[str, Any] = {
    "sdk-quickstart": {
        "summary": "The official SDK's quick start",
        "value": {
            "model": "jev-latest",
            "state": {"document": "I was charged twice. Please fix this ASAP."},
            "questions": {
                "category": {
                    "type": "choice",
                    "instructions": "What is this ticket about?",
                    "criteria": {"billing": None, "technical": None, "other": None},
                }
            },
        },
    },
    "three-types": {
        "summary": "A yes/no, a choice and a score about one ticket",
        "value": {
            "model": "jev-latest",
            "state": "I was charged twice for order 1182. I want my money back!",
            "questions": {
                "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
                "team": {
                    "type": "choice",
                    "instructions": "Which team should handle this?",
                    "criteria": {"billing": "charges, refunds", "technical": "bugs, outages"},
                },
                "tone": {
                    "type": "score",
                    "instructions": "How positive is the customer?",
                    "criteria": ["negative", "neutral", "positive"],
                },
            },
        },
    },
}


def install_openapi(app: FastAPI, *, bearer: bool) -> None:
    """Replace `app.openapi` with one that builds FastAPI's document once and adds what it cannot see."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            _add_request_schema(schema)
            _add_request_examples(schema)
            if bearer:
                _add_bearer_auth(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _add_request_schema(schema: dict[str, Any]) -> None:
    request_schema = SystemOneRequest.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(request_schema.pop("$defs", {}))
    components["SystemOneRequest"] = request_schema


def _add_request_examples(schema: dict[str, Any]) -> None:
    """Added after FastAPI's encoding, which drops every null, and so the examples' null descriptions."""
    body = schema["paths"]["/v1/systemone"]["post"]["requestBody"]["content"]["application/json"]
    body["examples"] = REQUEST_EXAMPLES


def _add_bearer_auth(schema: dict[str, Any]) -> None:
    schema.setdefault("components", {}).setdefault("securitySchemes", {})["apiKey"] = _BEARER
    schema["security"] = [{"apiKey": []}]
    for path in PUBLIC_PATHS & set(schema.get("paths", {})):
        for operation in schema["paths"][path].values():
            operation["security"] = []
