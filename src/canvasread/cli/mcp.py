"""`canvasread mcp`: serve the decision tools (decide, noul, choice, score) to an agent over stdio."""

from __future__ import annotations

import asyncio
from pathlib import Path

from canvasread.backends.sparrow import DEFAULT_SPARROW_MODEL
from canvasread.cli.model_flags import Calibrations, Models
from canvasread.cli.options import DEFAULT_API_KEY, ApiKey, RemoteUrl


def mcp(
    model: Models = None,
    calibration: Calibrations = None,
    url: RemoteUrl = None,
    api_key: ApiKey = DEFAULT_API_KEY,
) -> None:
    """Serve decide, noul, choice and score over stdio (MCP): models in process, or a running server (--url)."""
    from canvasread.mcp.stdio import serve_stdio

    if url is not None and (model or calibration):
        raise ValueError("--url asks a running server: give its models and calibrations to `serve`, not here")
    models = tuple(model or (DEFAULT_SPARROW_MODEL,))
    calibrations: tuple[Path, ...] = tuple(calibration or ())
    asyncio.run(serve_stdio(models, calibrations, url, api_key))
