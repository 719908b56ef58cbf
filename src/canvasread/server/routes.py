"""The routes: thin glue from a path and method to a `Handlers` method, with what OpenAPI publishes about it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles

from canvasread.server.auth import authorized
from canvasread.server.handlers import Handlers
from canvasread.server.responses import error_responses, request_id
from canvasread.wire import ModelList, SystemOneResponse

STATIC_DIR = Path(__file__).parent / "static"

_REQUEST_REF = {"$ref": "#/components/schemas/SystemOneRequest"}
# The route reads its body itself (zstd, multipart): `openapi.py` publishes the schema it validates under this name.
# Both forms the official SDK sends are declared: JSON, and multipart when images are attached (the JSON body in
# the part `request`, each image in the part an asset names with `part`), either of them possibly compressed.
_SYSTEM_ONE_BODY = {
    "parameters": [
        {
            "name": "Content-Encoding",
            "in": "header",
            "required": False,
            "description": "The body's compression (the SDK sends zstd for bodies of 1 KiB and more); empty or "
            "identity: none. Case and surrounding spaces do not matter.",
            # Every value `body.decode_content` takes, the empty one included (an empty list of codings: none).
            "schema": {"type": "string", "enum": ["zstd", "gzip", "x-gzip", "deflate", "identity", ""]},
        }
    ],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _REQUEST_REF},  # `openapi.py` adds the examples
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["request"],
                    "properties": {"request": _REQUEST_REF},
                    "additionalProperties": {
                        "type": "string",
                        "format": "binary",
                        "description": "An image (PNG or JPEG) claimed by exactly one asset's `part` (asset-0, ...).",
                    },
                },
                "encoding": {"request": {"contentType": "application/json"}},
            },
        },
    },
}

# With `Accept: text/event-stream` the answers come as server-sent events (`events.py` says which).
_EVENT_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The answers; as server-sent events (answer, skipped, done, error) with "
        "`Accept: text/event-stream`",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


def add_routes(app: FastAPI, handlers: Handlers) -> None:
    """Every route of the API, the probes, `/metrics` and the playground."""

    @app.post(
        "/v1/systemone",
        response_model=SystemOneResponse,
        responses={**_EVENT_STREAM, **error_responses(400, 401, 403, 408, 413, 415, 422, 500, 503, 504, 529)},
        openapi_extra=_SYSTEM_ONE_BODY,
    )
    async def system_one(request: Request) -> Response:
        return await handlers.system_one(request)

    @app.get("/v1/models", response_model=ModelList, responses=error_responses(401))
    async def list_models() -> dict[str, Any]:
        return handlers.models()

    @app.get("/health")
    async def health() -> dict[str, str]:
        """The process is up (it says nothing of the models: see /ready)."""
        return {"status": "ok"}

    @app.get("/ready", responses={503: {"description": "Models are loading or failed to load"}})
    async def ready(request: Request) -> Response:
        return handlers.ready(request_id(request), show_models=authorized(request))

    # Load balancers probe with HEAD: the same answers, their bodies dropped (by uvicorn, as HTTP has it).
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)
    app.add_api_route("/ready", ready, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        """Prometheus text format; async so the scrape reads the batch queues on their own event loop."""
        return handlers.exposition()

    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        """The playground page; it calls /v1/systemone like any client."""
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
