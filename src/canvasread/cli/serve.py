"""`canvasread serve`: flags become settings objects, settings go to `open_decider` and `create_app`.

Each group of flags (a help panel) has one builder that turns it into the
settings object the library checks; `serve` only wires them together.
"""

from __future__ import annotations

import errno

from canvasread import __version__
from canvasread.calibration import Calibration
from canvasread.catalog import open_decider
from canvasread.cli.errors import UserError, console, warn
from canvasread.cli.escalation_flags import EscalationFlags
from canvasread.cli.model_flags import ModelFlags
from canvasread.cli.options import flag_groups
from canvasread.cli.serve_flags import LOOPBACK, BatchFlags, LimitFlags, ServerFlags
from canvasread.cli.upstream_flags import UpstreamFlags
from canvasread.decide import Decider
from canvasread.settings import ImageLimits, ServerSettings


def _server_settings(server: ServerFlags, limits: LimitFlags) -> ServerSettings:
    from canvasread.server.auth import collect_api_keys

    return ServerSettings(
        host=server.host,
        port=server.port,
        log_format=server.log_format,
        log_payloads=server.log_payloads,
        api_keys=collect_api_keys(server.api_key or (), keys_file=server.api_keys_file),
        cors_origins=tuple(server.cors_origin or ()),
        max_body_bytes=limits.max_body_bytes,
        max_questions=limits.max_questions,
        max_options=limits.max_options,
        max_levels=limits.max_levels,
        max_json_depth=limits.max_json_depth,
        max_json_items=limits.max_json_items,
        images=ImageLimits(limits.max_images, limits.max_image_bytes, limits.max_image_pixels),
        shutdown_timeout_s=server.shutdown_timeout,
        header_timeout_s=server.header_timeout,
        body_timeout_s=server.body_timeout,
        send_timeout_s=server.send_timeout,
        keep_alive_s=server.keep_alive,
        max_connections=server.max_connections,
        max_connections_per_client=server.max_connections_per_client,
        parse_workers=server.parse_workers,
        allowed_hosts=tuple(server.allowed_host or ()),
        strict=limits.strict,
    )


@flag_groups
def serve(
    models: ModelFlags,
    upstream: UpstreamFlags,
    escalation: EscalationFlags,
    batching: BatchFlags,
    server: ServerFlags,
    limits: LimitFlags,
) -> None:
    """Start the HTTP server (binds at once; /ready turns 200 when the models have loaded)."""
    wings = upstream.wings()
    settings = escalation.settings(batching.settings(models.aliases(), limits.max_body_bytes))
    decider = open_decider(
        models.specs(wings),
        settings,
        wings=wings,
        engine=models.engine(),
        load=False,
        reading=models.reading(),
        sparrow=limits.sparrow(),
    )
    for path in models.calibration or []:
        decider.use_calibration(Calibration.load(path))
    _run(decider, _server_settings(server, limits), server.log_level)


def _run(decider: Decider, server: ServerSettings, log_level: str) -> None:
    """Bind, say what is served and to whom, then serve: models load behind the open port."""
    import uvicorn

    from canvasread.server.app import create_app
    from canvasread.server.run import listening_socket, uvicorn_config

    try:
        listener = listening_socket(server)
    except OSError as error:
        where = f"{server.host}:{server.port}"
        hint = " (is a server running there?)" if error.errno == errno.EADDRINUSE else ""
        raise UserError(f"cannot listen on {where}: {error.strerror or error}{hint}") from None
    names = ", ".join(served.card.name for served in decider.served)
    console.print(f"canvasread {__version__} on http://{server.host}:{server.port} serving {names}")
    if server.api_keys:
        console.print(f"API keys required ({len(server.api_keys)} configured)")
    elif server.host not in LOOPBACK:
        warn(f"no API keys: anyone who can reach {server.host}:{server.port} can use it")
    uvicorn.Server(uvicorn_config(create_app(decider, server), server, log_level=log_level)).run(sockets=[listener])
