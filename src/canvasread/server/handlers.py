"""What each route answers: the logic behind `/v1/systemone`, `/v1/models`, the probes and `/metrics`.

Routes (`routes.py`) are thin glue that hand the request here; everything a
route decides lives in a `Handlers` method, so it can be read and tested
without the FastAPI decorators around it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from canvasread.decide import Decider
from canvasread.server.body import check_headers, decode_content, is_multipart, parse_body, read_limited
from canvasread.server.disconnect import cancel_on_disconnect
from canvasread.server.events import stream_decision, wants_events
from canvasread.server.limits import check_payload, check_request
from canvasread.server.metrics import ServerMetrics
from canvasread.server.observe import exchange
from canvasread.server.origin import check_form_origin
from canvasread.server.responses import request_id
from canvasread.settings import ServerSettings
from canvasread.types import DecisionRequest
from canvasread.wire import parse_request

# What /ready says of models that are not ready to a caller without a key.
HIDDEN_REASONS = "the models are not ready; send an API key to see which and why"


# Plain JSON bodies up to this size are parsed on the event loop (well under a millisecond of pydantic); larger,
# compressed and multipart ones on a parse thread.
INLINE_PARSE_BYTES = 16 << 10


class Handlers:
    """The answers of every route, around one `Decider` and the server's settings."""

    def __init__(self, decider: Decider, config: ServerSettings, metrics: ServerMetrics) -> None:
        self.decider = decider
        self.config = config
        self.metrics = metrics
        self._parsing = asyncio.Semaphore(config.parse_workers)

    async def system_one(self, request: Request) -> Response:
        """Read the body the way the SDK sends it, check this server's limits, decide, answer (JSON, or
        server-sent events stage by stage when the client accepts `text/event-stream`).

        Decoding and parsing run in a thread, `parse_workers` at a time, so a
        body that takes seconds to parse never stalls the event loop (and
        `/health` with it); a small plain JSON body is parsed on the loop, since
        the hop to a thread and back costs it more than parsing does.
        """
        config = self.config
        check_headers(request.headers, config.max_body_bytes)
        if is_multipart(request.headers):
            check_form_origin(request.headers, config.cors_origins)
        raw = await read_limited(request.stream(), config.max_body_bytes, config.body_timeout_s)
        if (
            len(raw) <= INLINE_PARSE_BYTES
            and not request.headers.get("content-encoding")
            and not is_multipart(request.headers)
        ):
            model, decision_request = self._parse(raw, request.headers)
        else:
            async with self._parsing:
                model, decision_request = await asyncio.to_thread(self._parse, raw, request.headers)
        seen = exchange(request)
        seen.model, seen.request = model, decision_request
        check_request(decision_request, config)
        if wants_events(request.headers.get("accept", "")):
            run = self.decider.begin(model, decision_request)
            return await stream_decision(request, run, request_id(request), seen)
        decision = await cancel_on_disconnect(request.receive, self.decider.decide(model, decision_request))
        seen.decision = decision
        return JSONResponse(decision.to_json())

    async def ask(self, body: dict[str, Any]) -> dict[str, Any]:
        """A System One request that came another way (the `/mcp` tools): this server's parsing, limits, models."""
        config = self.config
        check_payload(body, config)
        model, decision_request = parse_request(body, None, config.images, strict=config.strict)
        check_request(decision_request, config)
        return dict((await self.decider.decide(model, decision_request)).to_json())

    def _parse(self, raw: bytes, headers: Mapping[str, str]) -> tuple[str, DecisionRequest]:
        config = self.config
        data = decode_content(raw, headers.get("content-encoding", ""), config.max_body_bytes)
        body = parse_body(data, headers.get("content-type", ""), config)
        check_payload(body.payload, config)
        return parse_request(body.payload, body.parts, config.images, strict=config.strict)

    def models(self) -> dict[str, Any]:
        cards = self.decider.model_cards()
        return {
            "models": [{"name": c.name, "description": c.description, "release_date": c.release_date} for c in cards]
        }

    def ready(self, request_id: str, *, show_models: bool) -> Response:
        """200 once every model has loaded, 503 before; the models' names and the reasons only to a caller
        with a key (or when keys are off), since probes without one must not learn what is served."""
        decider = self.decider
        if decider.ready:
            if not show_models:
                return JSONResponse({"status": "ready"})
            return JSONResponse({"status": "ready", "models": [s.card.name for s in decider.served]})
        reasons = "; ".join(decider.not_ready_reasons()) if show_models else HIDDEN_REASONS
        return JSONResponse(
            {
                "status": "not_ready",
                "detail": {"message": reasons, "error_type": "not_ready", "request_id": request_id},
            },
            status_code=503,
        )

    def exposition(self) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
