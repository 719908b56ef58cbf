"""The ASGI app, assembled: middleware, exception handlers, routes and the OpenAPI document around a `Decider`.

The port is bound before the models load: loading runs in a thread started
by the lifespan, `/health` answers at once and `/ready` turns 200 only when
every model has loaded. What each route answers is in `handlers.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from canvasread import __version__
from canvasread.decide import Decider
from canvasread.mcp.http import mount_tools
from canvasread.server.docs import add_docs
from canvasread.server.exceptions import add_exception_handlers
from canvasread.server.handlers import Handlers
from canvasread.server.metrics import ServerMetrics
from canvasread.server.middleware import InFlight, add_middleware
from canvasread.server.openapi import install_openapi
from canvasread.server.routes import add_routes
from canvasread.settings import ServerSettings

logger = logging.getLogger("canvasread.server")


def create_app(decider: Decider, config: ServerSettings = ServerSettings()) -> FastAPI:
    """Build the app around a `Decider`; nothing is loaded until the lifespan starts."""
    in_flight = InFlight()
    serving: list[AbstractAsyncContextManager[None]] = []
    app = FastAPI(
        title="canvasread",
        version=__version__,
        lifespan=_lifespan(decider, in_flight, config.shutdown_timeout_s, serving),
        description="A self-hosted System One decision server.",
        docs_url=None,  # `docs.py` serves Swagger UI from the package, not a CDN
        redoc_url=None,
    )
    metrics = ServerMetrics(decider)
    add_middleware(app, config, metrics, in_flight)
    add_exception_handlers(app)
    handlers = Handlers(decider, config, metrics)
    add_routes(app, handlers)
    serving.append(mount_tools(app, handlers.ask, config.max_body_bytes))
    add_docs(app)
    install_openapi(app, bearer=bool(config.api_keys))
    return app


def _lifespan(
    decider: Decider, in_flight: InFlight, shutdown_timeout_s: float, serving: list[AbstractAsyncContextManager[None]]
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start the batch loops, load the models in a thread, hold `serving` open (the `/mcp` sessions); on the way
    out, stop without waiting for the model.

    uvicorn has already given requests in flight `--shutdown-timeout` and
    cancelled the rest (their queued jobs are dropped): what is left is to let
    those send their 503, not to wait for a batch nobody awaits.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        decider.start()
        loading = asyncio.create_task(asyncio.to_thread(decider.load), name="load-models")
        try:
            async with AsyncExitStack() as held:
                for context in serving:
                    await held.enter_async_context(context)
                yield
        finally:
            await in_flight.settled(shutdown_timeout_s)
            await decider.stop(0.0)
            if not loading.done():
                logger.warning("shutting down while models are still loading")

    return lifespan
