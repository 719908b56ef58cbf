"""The ASGI app: routes are glue between the wire (`body`, `wire`) and the `Decider`.

The port is bound before the models load: loading runs in a thread started
by the lifespan, `/health` answers at once and `/ready` turns 200 only when
every model has loaded.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from canvasread import __version__
from canvasread.decide import Decider
from canvasread.errors import (
    BackendFailure,
    CanvasreadError,
    ClientDisconnected,
    FieldProblem,
    InvalidRequest,
    NotReady,
)
from canvasread.server.auth import ApiKeyMiddleware, document_bearer_auth
from canvasread.server.body import decode_content, parse_body, read_limited
from canvasread.server.disconnect import cancel_on_disconnect
from canvasread.server.limits import check_request
from canvasread.server.logs import AccessLog
from canvasread.server.metrics import ServerMetrics
from canvasread.server.observe import ObserveMiddleware, exchange
from canvasread.server.responses import REQUEST_ID_HEADER, error_response, error_responses
from canvasread.settings import ServerSettings
from canvasread.wire import ModelList, SystemOneRequest, SystemOneResponse, parse_request

logger = logging.getLogger("canvasread.server")
STATIC_DIR = Path(__file__).parent / "static"


class RequestIdMiddleware:
    """Gives every response, errors and crashes included, an `x-typesafe-request-id` (the SDK requires it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER.encode()]
                message = {
                    **message,
                    "headers": [*headers, (REQUEST_ID_HEADER.encode(), request_id.encode())],
                }
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            # Only uvicorn cancels a request: its shutdown deadline passed. Answer a retryable 503 in the API's
            # shape rather than uvicorn's bare 500 (which lacks the request id the SDK requires).
            if started:
                raise
            if (task := asyncio.current_task()) is not None:
                task.uncancel()
            response = error_response(NotReady("the server is shutting down; retry"), request_id)
            await response(scope, receive, send_with_id)
        except Exception:
            logger.exception("unhandled error in request %s", request_id)
            if started:
                raise
            response = error_response(BackendFailure("internal error; see the server log"), request_id)
            await response(scope, receive, send_with_id)


def _request_id(request: Request) -> str:
    return str(getattr(request.state, "request_id", "-"))


def create_app(decider: Decider, config: ServerSettings = ServerSettings()) -> FastAPI:
    """Build the app around a `Decider`; nothing is loaded until the lifespan starts."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        decider.start()
        loading = asyncio.create_task(asyncio.to_thread(decider.load), name="load-models")
        try:
            yield
        finally:
            await decider.stop(config.shutdown_timeout_s)
            if not loading.done():
                logger.warning("shutting down while models are still loading")

    app = FastAPI(
        title="canvasread",
        version=__version__,
        lifespan=lifespan,
        description="A self-hosted System One decision server.",
    )
    app.add_middleware(ApiKeyMiddleware, keys=config.api_keys)
    if config.cors_origins:  # outside the key check: browsers send preflights without credentials
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "content-encoding"],
            expose_headers=[REQUEST_ID_HEADER, "retry-after-ms", "retry-after"],
            max_age=600,
        )
    app.add_middleware(RequestIdMiddleware)
    metrics = ServerMetrics(decider)
    app.add_middleware(ObserveMiddleware, sinks=(metrics.record, AccessLog(payloads=config.log_payloads)))

    @app.exception_handler(CanvasreadError)
    async def on_canvasread_error(request: Request, error: CanvasreadError) -> Response:
        if error.status_code in (500, 502, 504):  # failures; 503 and 529 are load states, counted by /metrics
            logger.error("request %s failed with %d: %s", _request_id(request), error.status_code, error.message)
        return error_response(error, _request_id(request))

    @app.exception_handler(ClientDisconnect)
    async def on_client_gone(request: Request, error: ClientDisconnect) -> Response:
        return error_response(ClientDisconnected("the client closed the connection mid-body"), _request_id(request))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, error: RequestValidationError) -> Response:
        problems = [FieldProblem(tuple(e["loc"]), e["msg"], e["type"]) for e in error.errors()]
        return error_response(InvalidRequest(problems), _request_id(request))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, error: StarletteHTTPException) -> Response:
        return JSONResponse({"detail": error.detail}, status_code=error.status_code, headers=error.headers)

    @app.post(
        "/v1/systemone",
        response_model=SystemOneResponse,
        responses=error_responses(400, 401, 404, 413, 422, 500, 503, 504, 529),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SystemOneRequest"}}},
            }
        },
    )
    async def system_one(request: Request) -> Response:
        raw = await read_limited(request.stream(), config.max_body_bytes)
        data = decode_content(raw, request.headers.get("content-encoding", ""), config.max_body_bytes)
        body = parse_body(data, request.headers.get("content-type", ""), config.max_json_depth)
        model, decision_request = parse_request(body.payload, body.parts, config.images)
        seen = exchange(request)
        seen.model, seen.request = model, decision_request
        check_request(decision_request, config)
        decision = await cancel_on_disconnect(request.receive, decider.decide(model, decision_request))
        seen.decision = decision
        return JSONResponse(decision.to_json())

    @app.get("/v1/models", response_model=ModelList, responses=error_responses(401))
    async def list_models() -> dict[str, Any]:
        cards = decider.model_cards()
        return {
            "models": [{"name": c.name, "description": c.description, "release_date": c.release_date} for c in cards]
        }

    @app.get("/health")
    async def health() -> dict[str, str]:
        """The process is up (it says nothing of the models: see /ready)."""
        return {"status": "ok"}

    @app.get("/ready", responses={503: {"description": "Models are loading or failed to load"}})
    async def ready() -> Response:
        if decider.ready:
            return JSONResponse({"status": "ready", "models": [s.card.name for s in decider.served]})
        reasons = decider.not_ready_reasons()
        return JSONResponse(
            {"status": "not_ready", "detail": {"message": "; ".join(reasons), "error_type": "not_ready"}},
            status_code=503,
        )

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        """Prometheus text format; async so the scrape reads the batch queues on their own event loop."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        """The playground page; it calls /v1/systemone like any client."""
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    _document_request_schema(app)
    if config.api_keys:
        document_bearer_auth(app)
    return app


def _document_request_schema(app: FastAPI) -> None:
    """The System One route reads its body itself (zstd, multipart); publish the JSON schema it validates."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            request_schema = SystemOneRequest.model_json_schema(
                ref_template="#/components/schemas/{model}", by_alias=True
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(request_schema.pop("$defs", {}))
            components["SystemOneRequest"] = request_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
