"""The one way a command fails: a user's mistake is one red line on stderr and exit 1.

Commands raise; `guarded` decides how it reads. Tracebacks are for
developers, so they show only with the global `--debug` flag.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, ParamSpec, Protocol, runtime_checkable

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from canvasread.errors import CanvasreadError

P = ParamSpec("P")

console = Console()
# Errors go to stderr so `--json` output stays parseable; soft wrap keeps a long message on one line.
error_console = Console(stderr=True, soft_wrap=True)


class UserError(Exception):
    """A mistake in what the user asked for, already worded for them."""


# What a person can cause by a flag, a file or a server address; anything else is a bug and keeps its traceback.
USER_ERRORS = (UserError, CanvasreadError, ValueError, OSError, httpx.HTTPError)


def describe(error: BaseException) -> str:
    """The sentence to show for a user error."""
    if isinstance(error, CanvasreadError):
        return error.message
    if isinstance(error, httpx.TransportError):
        where = f" {error.request.url}" if _has_request(error) else ""
        return f"cannot reach{where}: {error}"
    if isinstance(error, OSError) and error.strerror and error.filename:
        return f"{error.filename}: {error.strerror}"
    return str(error) or type(error).__name__


def _has_request(error: httpx.TransportError) -> bool:
    try:
        error.request  # noqa: B018 (httpx raises RuntimeError when no request is attached)
    except RuntimeError:
        return False
    return True


def fail(message: str) -> NoReturn:
    """Print `message` as one red line (markup in it is shown as written) and exit 1."""
    error_console.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(1)


def usage_failed(error: typer.TyperException) -> NoReturn:
    """A mistake Click finds before any command runs (an unknown command or flag, a value of the wrong type): one
    red line pointing at the command's help, and Click's exit status for it (2). Click's own "no arguments: here
    is the help" has printed that help already."""
    message = error.format_message() if isinstance(error, ClickError) else str(error)
    if message:
        context = getattr(error, "ctx", None)
        where = f" (see '{context.command_path} -h')" if context is not None else ""
        error_console.print(f"[red]error:[/red] {escape(message)}{where}")
    raise SystemExit(error.exit_code)


@runtime_checkable
class ClickError(Protocol):
    """What Click's exceptions (which Typer vendors under a private module) offer beyond Typer's own."""

    def format_message(self) -> str: ...


def warn(message: str) -> None:
    error_console.print(f"[yellow]warning:[/yellow] {escape(message)}")


@dataclass
class Invocation:
    """What the global flags asked for; the app's callback sets it before each command runs."""

    debug: bool = False


invocation = Invocation()


def guarded(command: Callable[P, None]) -> Callable[P, None]:
    """Wrap a command so user errors end it with `fail` (or their traceback, with `--debug`)."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            command(*args, **kwargs)
        except USER_ERRORS as error:
            if invocation.debug:
                raise
            fail(describe(error))

    return run
