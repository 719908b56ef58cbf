"""Answers as server-sent events, for requests that send `Accept: text/event-stream`.

A staged request (`depends_on`, `ask_if`) is read stage by stage; the stream
sends each stage's answers the moment the stage (re-reads and rotations
included) is done, so a client can act on the first answer while later
stages are read. Events, each `data` one JSON object:

- `answer`: `{"question", "stage", "answer"}`, the answer exactly as in the JSON response;
- `skipped`: `{"question", "stage", "skipped"}`, as in the response's `skipped` map;
- `done`: the JSON response without its answers (`model`, `usage`, and `skipped` and `warnings` when it has
  them), with `request_id`, last;
- `error`: the API's error body (`{"detail": …}`), last, when a later stage fails.

The first stage is read before the response starts, so validation errors,
overload (529), deadlines and model failures in it come back as plain HTTP
errors, as for a JSON request. Once streaming, a client that disconnects
cancels the stage in flight (its queued read is dropped) and no later stage
is read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse

from canvasread.decide import DecisionRun
from canvasread.decision import StageAnswers
from canvasread.errors import BackendFailure, CanvasreadError
from canvasread.server.disconnect import cancel_on_disconnect
from canvasread.server.observe import Exchange
from canvasread.server.responses import error_body
from canvasread.types import JSONValue

logger = logging.getLogger("canvasread.server")
EVENT_STREAM = "text/event-stream"


def wants_events(accept: str) -> bool:
    """Whether the `Accept` header asks for the event stream: named with a non-zero `q`, and not below JSON.

    A plain `*/*` or JSON client gets JSON; `text/event-stream;q=0` says "not that" (RFC 9110 §12.4.2).
    """
    weights = {media: weight for media, weight in map(_media_range, accept.split(",")) if media}
    events = weights.get(EVENT_STREAM, 0.0)
    return events > 0.0 and events >= weights.get("application/json", 0.0)


def _media_range(part: str) -> tuple[str, float]:
    """One `Accept` entry as (media type, q); a malformed q counts as 0, so it never selects the stream."""
    media, *parameters = (piece.strip() for piece in part.split(";"))
    weight = 1.0
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "q":
            try:
                weight = float(value)
            except ValueError:
                weight = 0.0
            weight = weight if 0.0 <= weight <= 1.0 else 0.0
    return media.lower(), weight


def event(name: str, data: JSONValue) -> bytes:
    """One server-sent event; compact JSON never holds a newline, so `data` is one line."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def stage_events(stage: StageAnswers) -> list[bytes]:
    answered = [event("answer", {"question": k, "stage": stage.number, "answer": a}) for k, a in stage.answers.items()]
    skipped = [event("skipped", {"question": k, "stage": stage.number, "skipped": s}) for k, s in stage.skipped.items()]
    return answered + skipped


async def _first(stages: AsyncIterator[StageAnswers]) -> StageAnswers:
    return await anext(stages)


async def stream_decision(request: Request, run: DecisionRun, request_id: str, seen: Exchange) -> StreamingResponse:
    """Read the first stage (errors are still plain HTTP), then stream the rest (see the module docstring)."""
    stages = run.stages()
    first = await cancel_on_disconnect(request.receive, _first(stages))

    async def events() -> AsyncIterator[bytes]:
        try:
            for chunk in stage_events(first):
                yield chunk
            async for stage in stages:
                for chunk in stage_events(stage):
                    yield chunk
            decision = seen.decision = run.decision()
            done = {key: value for key, value in decision.to_json().items() if key != "answers"}
            yield event("done", {**done, "request_id": request_id})
        except CanvasreadError as error:
            if error.status_code in (500, 502, 504):  # failures; 503 and 529 are load states
                logger.error("request %s failed mid-stream with %d: %s", request_id, error.status_code, error.message)
            yield event("error", error_body(error, request_id))
        except Exception:  # a model bug must end this stream in the API's shape, never kill the server
            logger.exception("request %s failed mid-stream", request_id)
            yield event("error", error_body(BackendFailure("internal error; see the server log"), request_id))

    headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}  # proxies must not buffer the events
    return StreamingResponse(events(), media_type=EVENT_STREAM, headers=headers)
