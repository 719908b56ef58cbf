"""`canvasread mcp`: the decision tools over stdio, for agents that start their tools as subprocesses.

The models are loaded before the first message (a client waits for the handshake), in process as `serve`
loads them, or the tools ask a running server (`--url`) with its API key. Only JSON-RPC goes to stdout;
logs go to stderr.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from canvasread.calibration import Calibration
from canvasread.catalog import open_decider
from canvasread.eval.runner import AskFailed, http_asker, local_asker
from canvasread.mcp.tools import decision_tools


async def serve_stdio(models: Sequence[str], calibrations: Sequence[Path], url: str | None, api_key: str) -> None:
    """Serve until the client closes stdin."""
    if url is not None:
        async with http_asker(url, api_key) as remote:
            await decision_tools(remote.ask, refusals=(AskFailed,)).run_stdio_async()
        return
    decider = open_decider(models)
    for path in calibrations:
        decider.use_calibration(Calibration.load(path))
    async with local_asker(decider) as local:
        await decision_tools(local.ask).run_stdio_async()
