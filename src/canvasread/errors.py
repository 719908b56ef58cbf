"""Errors that cross layers, each knowing the HTTP status and body shape it maps to.

The library raises these; only the server turns them into responses, so the
same error reads the same from the CLI, the library and the API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from canvasread.types import JSONValue


class CanvasreadError(Exception):
    """Base class: a message for people plus a machine-readable `error_type`."""

    status_code = 500
    error_type = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class FieldProblem:
    """One entry of FastAPI's 422 `detail` list.

    `loc` is the field's path inside the request (`("questions", "team")`), never an HTTP path: the
    library and the CLI show it as it is, and only the HTTP layer puts `"body"` before it.
    """

    loc: tuple[str | int, ...]
    msg: str
    type: str = "value_error"
    input: JSONValue = None
    ctx: dict[str, JSONValue] = field(default_factory=dict)


# The most problems one 422 lists; past them, one entry counts the rest. A body of many bad questions would
# otherwise answer with ten times its size.
MAX_PROBLEMS = 64


class InvalidRequest(CanvasreadError):
    """A request the model cannot answer as asked (422, FastAPI's `detail` list shape)."""

    status_code = 422
    error_type = "invalid_request"

    def __init__(self, problems: Sequence[FieldProblem]) -> None:
        listed = tuple(problems[:MAX_PROBLEMS])
        if len(problems) > MAX_PROBLEMS:
            more = len(problems) - MAX_PROBLEMS
            listed += (FieldProblem((), f"and {more} more problems (a 422 lists {MAX_PROBLEMS})", "more_problems"),)
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc))}: {p.msg}" for p in listed))
        self.problems = listed

    @classmethod
    def at(cls, loc: Sequence[str | int], msg: str, input: JSONValue = None) -> InvalidRequest:
        return cls([FieldProblem(tuple(loc), msg, input=input)])


class BadRequest(CanvasreadError):
    """A body that cannot be read at all: broken JSON, an unknown encoding (400)."""

    status_code = 400
    error_type = "bad_request"


class PayloadTooLarge(CanvasreadError):
    status_code = 413
    error_type = "payload_too_large"


class Unauthorized(CanvasreadError):
    """No API key, or one the server does not know (401, `authentication_error` as the hosted API says)."""

    status_code = 401
    error_type = "authentication_error"


class ModelNotFound(CanvasreadError):
    """A model name that is neither served nor an alias: 400 `api_usage_error`, as the hosted API answers it
    (clients map 400 to their bad-request error)."""

    status_code = 400
    error_type = "api_usage_error"


class NotReady(CanvasreadError):
    """The model is still loading, or failed to load (503)."""

    status_code = 503
    error_type = "not_ready"


class Overloaded(CanvasreadError):
    """The queue in front of a backend is full (529, which clients retry)."""

    status_code = 529
    error_type = "overloaded"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(CanvasreadError):
    status_code = 504
    error_type = "deadline_exceeded"


class ClientDisconnected(CanvasreadError):
    """The client hung up before its answer was ready; its queued work is dropped (499, as nginx logs it)."""

    status_code = 499
    error_type = "client_disconnected"


class BackendFailure(CanvasreadError):
    """The model raised while answering; only the requests in that batch fail (500)."""

    status_code = 500
    error_type = "backend_error"


class UpstreamFailure(CanvasreadError):
    """An upstream inference server (vLLM) failed or answered nonsense (502)."""

    status_code = 502
    error_type = "upstream_error"


class MissingExtra(CanvasreadError):
    """An optional dependency is not installed; the message says what to install."""

    error_type = "missing_dependency"


class CalibrationMismatch(CanvasreadError):
    """A calibration file fit for another model (or other weights) than the one served; refused at startup."""

    error_type = "calibration_mismatch"


class RequestTimeout(CanvasreadError):
    """The body did not arrive within the server's body timeout (408)."""

    status_code = 408
    error_type = "request_timeout"


class UriTooLong(CanvasreadError):
    """A request line (method and URI) still unfinished when the HTTP parser's buffer is full (414)."""

    status_code = 414
    error_type = "uri_too_long"


class HeadersTooLarge(CanvasreadError):
    """Request headers still unfinished when the HTTP parser's buffer is full (431)."""

    status_code = 431
    error_type = "request_header_fields_too_large"


class UnsupportedMediaType(CanvasreadError):
    """A body that is neither `application/json` nor `multipart/form-data` (415)."""

    status_code = 415
    error_type = "unsupported_media_type"


class RouteNotFound(CanvasreadError):
    """No route at this path (404); an unknown model is `ModelNotFound`."""

    status_code = 404
    error_type = "not_found"


class MethodNotAllowed(CanvasreadError):
    status_code = 405
    error_type = "method_not_allowed"


class CrossOriginRefused(CanvasreadError):
    """A form a browser posted from a page on another origin, one `--cors-origin` does not allow (403)."""

    status_code = 403
    error_type = "cross_origin_refused"


class HostNotAllowed(CanvasreadError):
    """A `Host` header this server does not answer to: the guard against DNS rebinding (400)."""

    status_code = 400
    error_type = "host_not_allowed"
