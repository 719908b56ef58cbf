"""Error responses in the shapes the official SDK reads, with the headers clients act on."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse

from canvasread.errors import CanvasreadError, InvalidRequest, Overloaded
from canvasread.types import JSONValue

REQUEST_ID_HEADER = "x-typesafe-request-id"
# What a 422 echoes of an input: enough to recognise it, never the whole body.
ECHO_CHARS = 256
ECHO_ENTRIES = 16
ECHO_DEPTH = 3


class ErrorDetail(BaseModel):
    message: str
    error_type: str
    request_id: str


class ErrorBody(BaseModel):
    """Every error but a 422: `{"detail": {"message", "error_type", "request_id"}}`."""

    detail: ErrorDetail


class ValidationProblem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str
    input: Any = None
    ctx: dict[str, Any] | None = None


class ValidationErrorBody(BaseModel):
    """A 422: FastAPI's `detail` list, each `loc` starting with "body"."""

    detail: list[ValidationProblem]


_ERROR_MEANINGS = {
    400: "Unknown model (api_usage_error; the message lists the served ones), or a body that cannot be read "
    "(bad_request: broken compression, unknown encoding, malformed multipart)",
    401: "Missing or unknown API key (authentication_error)",
    403: "A form posted by a browser from a page on another origin (cross_origin_refused; see --cors-origin)",
    408: "The body did not arrive within the server's body timeout",
    413: "Body larger than the limit, declared, before or after decompression, or more reading than the model allows",
    415: "Content-Type is neither application/json nor multipart/form-data",
    500: "The model failed on this request; the server log has the details under the request id",
    503: "The model is loading, failed to load, or is unhealthy; retry",
    504: "No answer within the server's deadline; the request was dropped",
    529: "Overloaded: the model's queue is full; retry after retry-after-ms",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for a route's error statuses, so clients and schema checks know every shape."""
    documented: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        if status == 422:
            documented[status] = {"description": "Validation error", "model": ValidationErrorBody}
        else:
            documented[status] = {"description": _ERROR_MEANINGS[status], "model": ErrorBody}
    if 529 in documented:
        documented[529]["headers"] = {
            name: {"description": "How long to wait before retrying", "schema": {"type": "string"}}
            for name in ("retry-after-ms", "Retry-After")
        }
    return documented


def printable(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` as UTF-8 can carry it (lone surrogates as `\\udXXX`), cut to `limit` characters."""
    if len(text) > limit:
        text = f"{text[:limit]}...[{len(text) - limit} more characters]"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def echo(value: JSONValue, depth: int = 0) -> JSONValue:
    """A bounded copy of an input echoed in a 422: long strings cut, containers cut to a few entries, shallow.

    A 422 for a missing `model` would otherwise echo the whole body, which a
    small compressed request can make tens of megabytes.
    """
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list | dict) and depth >= ECHO_DEPTH:
        return f"[{type(value).__name__} of {len(value)} entries]"
    if isinstance(value, list):
        shown = [echo(item, depth + 1) for item in value[:ECHO_ENTRIES]]
        return [*shown, f"...[{len(value) - ECHO_ENTRIES} more entries]"] if len(value) > ECHO_ENTRIES else shown
    if isinstance(value, dict):
        entries = list(value.items())
        bounded = {printable(str(k)): echo(v, depth + 1) for k, v in entries[:ECHO_ENTRIES]}
        if len(entries) > ECHO_ENTRIES:
            bounded["..."] = f"[{len(entries) - ECHO_ENTRIES} more entries]"
        return bounded
    return value


def validation_detail(error: InvalidRequest) -> list[dict[str, JSONValue]]:
    """FastAPI's 422 `detail` list: `loc` starts with "body"; echoed inputs are bounded and printable."""
    detail: list[dict[str, JSONValue]] = []
    for problem in error.problems:
        loc: list[JSONValue] = list(problem.loc) if problem.loc[:1] == ("body",) else ["body", *problem.loc]
        entry: dict[str, JSONValue] = {
            "loc": [printable(part) if isinstance(part, str) else part for part in loc],
            "msg": printable(problem.msg, ECHO_CHARS * 4),
            "type": problem.type,
            "input": echo(problem.input),
        }
        if problem.ctx:
            entry["ctx"] = dict(problem.ctx)
        detail.append(entry)
    return detail


def error_body(error: CanvasreadError, request_id: str) -> dict[str, JSONValue]:
    """The body of an error response (also the data of a stream's `error` event)."""
    if isinstance(error, InvalidRequest):
        return {"detail": list[JSONValue](validation_detail(error))}
    message = printable(error.message, ECHO_CHARS * 4)
    return {"detail": {"message": message, "error_type": error.error_type, "request_id": request_id}}


def request_id(request: Request) -> str:
    """The id `RequestIdMiddleware` gave this request ("-" when the app runs without it)."""
    return str(getattr(request.state, "request_id", "-"))


def error_response(error: CanvasreadError, request_id: str) -> JSONResponse:
    headers: dict[str, str] = {}
    body = error_body(error, request_id)
    if isinstance(error, Overloaded):
        headers["retry-after-ms"] = str(max(1, round(error.retry_after_s * 1000)))
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    return JSONResponse(body, status_code=error.status_code, headers=headers)
