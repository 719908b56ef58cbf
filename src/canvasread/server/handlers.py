"""What each route answers: the logic behind `/v1/systemone`, `/v1/models`, the probes and `/metrics`.

Routes (`routes.py`) are thin glue that hand the request here; everything a
route decides lives in a `Handlers` method, so it can be read and tested
without the FastAPI decorators around it.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from canvasread.decide import Decider
from canvasread.server.body import decode_content, parse_body, read_limited
from canvasread.server.disconnect import cancel_on_disconnect
from canvasread.server.events import stream_decision, wants_events
from canvasread.server.exceptions import request_id
from canvasread.server.limits import check_request
from canvasread.server.metrics import ServerMetrics
from canvasread.server.observe import exchange
from canvasread.settings import ServerSettings
from canvasread.wire import parse_request


class Handlers:
    """The answers of every route, around one `Decider` and the server's settings."""

    def __init__(self, decider: Decider, config: ServerSettings, metrics: ServerMetrics) -> None:
        self.decider = decider
        self.config = config
        self.metrics = metrics

    async def system_one(self, request: Request) -> Response:
        """Read the body the way the SDK sends it, check this server's limits, decide, answer (JSON, or
        server-sent events stage by stage when the client accepts `text/event-stream`)."""
        config = self.config
        raw = await read_limited(request.stream(), config.max_body_bytes)
        data = decode_content(raw, request.headers.get("content-encoding", ""), config.max_body_bytes)
        body = parse_body(data, request.headers.get("content-type", ""), config.max_json_depth)
        model, decision_request = parse_request(body.payload, body.parts, config.images)
        seen = exchange(request)
        seen.model, seen.request = model, decision_request
        check_request(decision_request, config)
        if wants_events(request.headers.get("accept", "")):
            run = self.decider.begin(model, decision_request)
            return await stream_decision(request, run, request_id(request), seen)
        decision = await cancel_on_disconnect(request.receive, self.decider.decide(model, decision_request))
        seen.decision = decision
        return JSONResponse(decision.to_json())

    def models(self) -> dict[str, Any]:
        cards = self.decider.model_cards()
        return {
            "models": [{"name": c.name, "description": c.description, "release_date": c.release_date} for c in cards]
        }

    def ready(self) -> Response:
        """200 with the served models once every one has loaded; 503 with the reasons before."""
        decider = self.decider
        if decider.ready:
            return JSONResponse({"status": "ready", "models": [s.card.name for s in decider.served]})
        reasons = decider.not_ready_reasons()
        return JSONResponse(
            {"status": "not_ready", "detail": {"message": "; ".join(reasons), "error_type": "not_ready"}},
            status_code=503,
        )

    def exposition(self) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
