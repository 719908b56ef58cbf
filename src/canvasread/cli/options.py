"""Options more than one command takes, spelled once, with defaults read from the library."""

from __future__ import annotations

import dataclasses
import inspect
import shlex
import sys
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer

from canvasread.eval.pipeline import RunOptions
from canvasread.settings import DEFAULT_HOST, DEFAULT_PORT
from canvasread.types import OrderMode

# Where `canvasread serve` listens when started without flags.
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
# A server started without API keys accepts any bearer token; this one says where it came from.
DEFAULT_API_KEY = RunOptions.api_key
# The alias every server resolves to its first model; in process, the embedded one.
DEFAULT_MODEL = RunOptions.model

ServerUrl = Annotated[str, typer.Option(metavar="URL", help="The running server.")]
ApiKey = Annotated[str, typer.Option(envvar="TYPESAFE_API_KEY", metavar="KEY", help="API key for the server.")]
RemoteUrl = Annotated[
    str | None, typer.Option("--url", metavar="URL", help="Ask a running server instead of a model in process.")
]
ModelSpec = Annotated[
    str,
    typer.Option(
        metavar="MODEL",
        help="Model name; in process, a model spec as for serve (default: the embedded model).",
    ),
]
Order = Annotated[OrderMode | None, typer.Option(help="Send this order mode with every request.")]
Concurrency = Annotated[int, typer.Option(metavar="N", help="Decisions asked at once.")]
Limit = Annotated[int | None, typer.Option(metavar="N", help="Only the first N decisions.")]


def command_line() -> str:
    """The command as typed, for reports that must say how to reproduce them."""
    return shlex.join(["canvasread", *sys.argv[1:]])


def flag_groups(command: Callable[..., None]) -> Callable[..., None]:
    """Let a command take dataclasses of flags, each with its own builder; typer sees one flat list of options.

    Every parameter of `command` is annotated with a dataclass whose fields are
    `Annotated[…, typer.Option(…)]` with defaults; field names are the flags.
    """
    groups = {name: group for name, group in typing.get_type_hints(command).items() if name != "return"}
    parameters: list[inspect.Parameter] = []
    for group in groups.values():
        hints = typing.get_type_hints(group, include_extras=True)
        for field in dataclasses.fields(group):
            parameters.append(
                inspect.Parameter(
                    field.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[field.name], default=field.default
                )
            )
    names = [parameter.name for parameter in parameters]
    if len(set(names)) != len(names):
        raise TypeError(f"{command.__name__}: two flag groups share a field name")

    def run(**flags: Any) -> None:
        built = {
            name: group(**{f.name: flags[f.name] for f in dataclasses.fields(group)}) for name, group in groups.items()
        }
        command(**built)

    run.__name__, run.__doc__, run.__module__ = command.__name__, command.__doc__, command.__module__
    run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return run
