"""`/mcp` on the server: the decision tools over streamable HTTP, answering as `POST /v1/systemone` does.

Stateless and JSON (no session to keep, no event stream to hold open: every tool call is one decision), so
any replica behind a load balancer answers any call. The server's middleware runs first, so the same API keys
guard `/mcp`, and its `Host` guard replaces the SDK's DNS-rebinding check; the body limit is `--max-body-bytes`.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

from fastapi import FastAPI
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from canvasread.mcp.tools import Ask, decision_tools

MCP_PATH = "/mcp"


def mount_tools(app: FastAPI, ask: Ask, max_body_bytes: int) -> AbstractAsyncContextManager[None]:
    """Add `/mcp` to `app`; returns what the app's lifespan must hold open while it serves."""
    tools: MCPServer = decision_tools(ask)
    served = tools.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        json_response=True,
        max_request_body_size=max_body_bytes,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    app.router.routes.extend(served.routes)
    return tools.session_manager.run()
