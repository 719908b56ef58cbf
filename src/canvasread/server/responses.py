"""Error responses in the shapes the official SDK reads, with the headers clients act on."""

from __future__ import annotations

import math

from starlette.responses import JSONResponse

from canvasread.errors import CanvasreadError, InvalidRequest, Overloaded
from canvasread.types import JSONValue

REQUEST_ID_HEADER = "x-typesafe-request-id"


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


def error_response(error: CanvasreadError, request_id: str) -> JSONResponse:
    headers: dict[str, str] = {}
    body: dict[str, JSONValue]
    if isinstance(error, InvalidRequest):
        body = {"detail": list[JSONValue](validation_detail(error))}
    else:
        body = {"detail": {"message": error.message, "error_type": error.error_type, "request_id": request_id}}
    if isinstance(error, Overloaded):
        headers["retry-after-ms"] = str(max(1, round(error.retry_after_s * 1000)))
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    return JSONResponse(body, status_code=error.status_code, headers=headers)
