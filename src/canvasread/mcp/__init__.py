"""canvasread's decisions as MCP tools for agents (the official `mcp` SDK): `tools.py` builds them over any way
to answer a System One request, `http.py` mounts them at `/mcp` on the server (streamable HTTP, the server's API
keys), and `canvasread mcp` serves them over stdio."""
