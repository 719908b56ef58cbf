"""The decision tools: `decide` (a whole System One request) and `noul`, `choice`, `score` (one question).

Each tool builds the very JSON a client sends to `POST /v1/systemone` and hands it to `ask` (the server's own
parsing, limits and models over HTTP, a decider in process or a running server over stdio), so an agent gets
exactly what the API answers: the answer with its probabilities, `usage`, and with `diagnostics` the read's
details. A request the API would refuse is a tool error carrying the API's message, never a crash.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from canvasread import __version__
from canvasread.errors import CanvasreadError

# Answers one System One request body with the response JSON; raises what the API would answer instead.
Ask = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
# What a state, instructions and descriptions may be on the wire: text or any JSON object or array.
Content = str | dict[str, Any] | list[Any]

INSTRUCTIONS = (
    "Typed decisions about a state (a text or a JSON value): noul answers yes/no with P(yes), choice picks one "
    "option with a probability for each, score rates on an ordered scale; decide takes a whole System One "
    "request with several questions."
)


def decision_tools(ask: Ask, model: str = "default", refusals: tuple[type[Exception], ...] = ()) -> MCPServer:
    """An MCP server whose tools answer through `ask`; `model` is what the one-question tools ask by default.

    `ask` raises a `CanvasreadError`, or one of `refusals` (a running server's refusal, its status and body),
    for a request it will not answer: the tool call is then an error with that message.
    """
    asked = _Asked(ask, refusals)
    server: MCPServer = MCPServer("canvasread", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    @server.tool(
        description="Answer a System One request: {model, state, questions: {id: question}, ...}, as "
        "POST /v1/systemone takes it (canvasread's extension keys included)."
    )
    async def decide(request: dict[str, Any]) -> dict[str, Any]:
        return await asked({"model": model, **request})

    @server.tool(description="Yes or no about the state: P(yes) as `noul`. `true`/`false` say what each side means.")
    async def noul(
        state: Content, instructions: Content, true: Content | None = None, false: Content | None = None
    ) -> dict[str, Any]:
        sides = {name: side for name, side in (("true", true), ("false", false)) if side is not None}
        question: dict[str, Any] = {"type": "noul", "instructions": instructions}
        return await _one(asked, model, state, {**question, **({"criteria": sides} if sides else {})})

    @server.tool(
        description="Pick one of the options for the state: `choice`, its `confidence` and a probability "
        "per option. `options` maps each name to what it means (or null), or lists names."
    )
    async def choice(
        state: Content, instructions: Content, options: dict[str, Content | None] | list[str]
    ) -> dict[str, Any]:
        criteria = dict.fromkeys(options) if isinstance(options, list) else options
        return await _one(asked, model, state, {"type": "choice", "instructions": instructions, "criteria": criteria})

    @server.tool(
        description="Rate the state on an ordered scale: `levels` from lowest (0) to highest; answers "
        "the expected level as `score`, with a probability per level."
    )
    async def score(state: Content, instructions: Content, levels: list[Content]) -> dict[str, Any]:
        return await _one(asked, model, state, {"type": "score", "instructions": instructions, "criteria": levels})

    return server


async def _one(asked: Ask, model: str, state: Content, question: dict[str, Any]) -> dict[str, Any]:
    """One question's answer, with the model that gave it and the request's usage."""
    response = await asked({"model": model, "state": state, "questions": {"answer": question}})
    return {"model": response["model"], **response["answers"]["answer"], "usage": response["usage"]}


class _Asked:
    """`ask`, its refusals turned into tool errors that carry the API's message."""

    def __init__(self, ask: Ask, refusals: tuple[type[Exception], ...]) -> None:
        self._ask = ask
        self._refusals = refusals

    async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self._ask(body)
        except CanvasreadError as error:
            raise ToolError(f"{error.status_code} {error.error_type}: {error.message}") from None
        except self._refusals as error:
            raise ToolError(str(error)) from None
