"""The decision tools through the official `mcp` SDK's own client: over stdio (`canvasread mcp`) and over
streamable HTTP (`/mcp` on a running server, behind its API keys)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from helpers import serve_cli
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

STATE = "I was charged twice for order 1182 and I want my money back!"
KEY = "mcp-key-7a1e"
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("noul", {"state": STATE, "instructions": "Does the customer want money back?"}),
    ("choice", {"state": STATE, "instructions": "Which team?", "options": {"billing": "charges", "technical": None}}),
    ("score", {"state": STATE, "instructions": "How angry?", "levels": ["calm", "annoyed", "furious"]}),
    (
        "decide",
        {
            "request": {
                "state": STATE,
                "questions": {"team": {"type": "choice", "criteria": {"billing": None, "sales": None}}},
                "diagnostics": True,
            }
        },
    ),
]


async def use_tools(client: Client) -> dict[str, Any]:
    """List the tools, call each once and one with a bad request; what came back, by tool."""
    listed = await client.list_tools()
    results: dict[str, Any] = {"tools": sorted(tool.name for tool in listed.tools)}
    for name, arguments in CALLS:
        result = await client.call_tool(name, arguments)
        assert not result.is_error, result.content
        results[name] = result.structured_content
    refused = await client.call_tool("choice", {"state": STATE, "instructions": "Which?", "options": {}})
    results["refused"] = (refused.is_error, refused.content[0].text)  # type: ignore[union-attr]
    return results


def check(results: dict[str, Any]) -> None:
    assert results["tools"] == ["choice", "decide", "noul", "score"]
    assert 0.0 <= results["noul"]["noul"] <= 1.0 and results["noul"]["type"] == "noul"
    assert results["choice"]["choice"] == "billing"
    assert sum(results["choice"]["probabilities"].values()) == pytest.approx(1.0)
    assert results["score"]["legend"] == {"0": "calm", "1": "annoyed", "2": "furious"}
    assert results["noul"]["model"] == "sparrow-nano-general-v1.1" and results["noul"]["usage"]["input_tokens"] > 0
    decided = results["decide"]
    assert list(decided["answers"]) == ["team"] and "diagnostics" in decided["answers"]["team"]
    is_error, message = results["refused"]
    assert is_error and "422" in message and "criteria" in message


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[str]:
    with serve_cli("--api-key", KEY) as base:
        yield base


def stdio(*args: str) -> dict[str, Any]:
    """`canvasread mcp ARGS` started by the SDK's stdio client, every tool used."""
    env = {key: value for key, value in os.environ.items() if key in ("PATH", "PYTHONPATH", "HOME")}
    server = StdioServerParameters(command=sys.executable, args=["-m", "canvasread", "mcp", *args], env=env)

    async def run() -> dict[str, Any]:
        async with Client(server, read_timeout_seconds=60) as client:
            return await use_tools(client)

    return asyncio.run(run())


def test_the_tools_over_stdio_in_process() -> None:
    results = stdio()
    check(results)
    assert "choice: 422 invalid_request: questions.answer.choice.criteria" in results["refused"][1]


def test_the_tools_over_stdio_asking_a_running_server(keyed_server: str) -> None:
    results = stdio("--url", keyed_server, "--api-key", KEY)
    check(results)
    assert "choice: HTTP 422: " in results["refused"][1]


def http_client(base: str, key: str | None) -> Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    transport = streamable_http_client(base + "/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=60))
    return Client(transport)


def test_the_tools_over_streamable_http_with_the_servers_key(keyed_server: str) -> None:
    async def run() -> dict[str, Any]:
        async with http_client(keyed_server, KEY) as client:
            return await use_tools(client)

    check(asyncio.run(run()))


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_mcp_over_http_needs_the_servers_key(keyed_server: str, key: str | None) -> None:
    async def run() -> None:
        async with http_client(keyed_server, key) as client:
            await client.list_tools()

    with pytest.raises((MCPError, httpx2.HTTPStatusError, ExceptionGroup)):
        asyncio.run(run())
    reply = httpx2.post(keyed_server + "/mcp", json={}, headers={"Authorization": f"Bearer {key}"} if key else {})
    assert reply.status_code == 401 and reply.json()["detail"]["error_type"] == "authentication_error"
