"""How exceptions raised inside a route become responses in the API's error shapes."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from canvasread.errors import (
    CanvasreadError,
    ClientDisconnected,
    FieldProblem,
    InvalidRequest,
    MethodNotAllowed,
    RouteNotFound,
)
from canvasread.server.responses import error_response, request_id

logger = logging.getLogger("canvasread.server")


async def on_canvasread_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, CanvasreadError)
    if error.status_code in (500, 502, 504):  # failures; 503 and 529 are load states, counted by /metrics
        logger.error("request %s failed with %d: %s", request_id(request), error.status_code, error.message)
    return error_response(error, request_id(request))


async def on_client_gone(request: Request, error: Exception) -> Response:
    return error_response(ClientDisconnected("the client closed the connection mid-body"), request_id(request))


async def on_validation_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, RequestValidationError)
    problems = [FieldProblem(tuple(e["loc"]), e["msg"], e["type"]) for e in error.errors()]
    return error_response(InvalidRequest(problems), request_id(request))


async def on_http_error(request: Request, error: Exception) -> Response:
    """Starlette's own 404 and 405 (no route, wrong method), in the API's error shape."""
    assert isinstance(error, StarletteHTTPException)
    known: CanvasreadError
    if error.status_code == 404:
        known = RouteNotFound(f"no route {request.url.path!r}; the API is POST /v1/systemone and GET /v1/models")
    elif error.status_code == 405:
        known = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
    else:
        known = CanvasreadError(str(error.detail))
        known.status_code = error.status_code
    response = error_response(known, request_id(request))
    response.headers.update(error.headers or {})
    return response


def add_exception_handlers(app: FastAPI) -> None:
    app.add_exception_handler(CanvasreadError, on_canvasread_error)
    app.add_exception_handler(ClientDisconnect, on_client_gone)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
