"""The app's OpenAPI document, patched in one place.

FastAPI documents what its routes declare; two things it cannot see are added
here: the System One request schema (the route reads its body itself, to
handle zstd and multipart) and, when keys are configured, the bearer scheme
(so generated clients and schema fuzzers send a key).
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


def install_openapi(app: FastAPI, *, bearer: bool) -> None:
    """Replace `app.openapi` with one that builds FastAPI's document once and adds what it cannot see."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            _add_request_schema(schema)
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


def _add_bearer_auth(schema: dict[str, Any]) -> None:
    schema.setdefault("components", {}).setdefault("securitySchemes", {})["apiKey"] = _BEARER
    schema["security"] = [{"apiKey": []}]
    for path in PUBLIC_PATHS & set(schema.get("paths", {})):
        for operation in schema["paths"][path].values():
            operation["security"] = []
