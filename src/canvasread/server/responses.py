"""Error responses in the shapes the official SDK reads, with the headers clients act on."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel
from starlette.responses import JSONResponse

from canvasread.errors import CanvasreadError, InvalidRequest, Overloaded
from canvasread.types import JSONValue

REQUEST_ID_HEADER = "x-typesafe-request-id"


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
    413: "Body larger than the limit, before or after decompression, or more reading than the model allows",
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


def validation_detail(error: InvalidRequest) -> list[dict[str, JSONValue]]:
    """FastAPI's 422 `detail` list: `loc` starts with "body"."""
    detail: list[dict[str, JSONValue]] = []
    for problem in error.problems:
        loc: list[JSONValue] = list(problem.loc) if problem.loc[:1] == ("body",) else ["body", *problem.loc]
        entry: dict[str, JSONValue] = {
            "loc": loc,
            "msg": problem.msg,
            "type": problem.type,
            "input": problem.input,
        }
        if problem.ctx:
            entry["ctx"] = dict(problem.ctx)
        detail.append(entry)
    return detail


def error_body(error: CanvasreadError, request_id: str) -> dict[str, JSONValue]:
    """The body of an error response (also the data of a stream's `error` event)."""
    if isinstance(error, InvalidRequest):
        return {"detail": list[JSONValue](validation_detail(error))}
    return {"detail": {"message": error.message, "error_type": error.error_type, "request_id": request_id}}


def error_response(error: CanvasreadError, request_id: str) -> JSONResponse:
    headers: dict[str, str] = {}
    body = error_body(error, request_id)
    if isinstance(error, Overloaded):
        headers["retry-after-ms"] = str(max(1, round(error.retry_after_s * 1000)))
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    return JSONResponse(body, status_code=error.status_code, headers=headers)
