"""The `canvasread` command: one module per subcommand; flags become settings, settings go to the library.

Every command runs inside `guarded`, so a user's mistake reads as one red
line and exit 1; `canvasread --debug …` shows the traceback instead. A
mistake Click finds first (an unknown flag, a value of the wrong type) is one
red line too, with Click's exit status 2.
"""

from __future__ import annotations

from typing import Annotated

import typer

from canvasread import __version__
from canvasread.cli.ask import OrderedCommand, ask
from canvasread.cli.banking77 import banking77
from canvasread.cli.bench import bench
from canvasread.cli.calibrate import calibrate
from canvasread.cli.errors import fail, guarded, invocation, usage_failed
from canvasread.cli.eval import eval_command
from canvasread.cli.mcp import mcp
from canvasread.cli.models import models
from canvasread.cli.serve import serve
from canvasread.cli.tiny_checkpoint import tiny_checkpoint

app = typer.Typer(
    help="canvasread: a self-hosted System One decision server.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def _print_version(asked: bool) -> None:
    if asked:
        version()
        raise typer.Exit()


@app.callback()
def _options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")] = False,
    _version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """canvasread: a self-hosted System One decision server."""
    invocation.debug = debug


app.command()(guarded(serve))
app.command(cls=OrderedCommand)(guarded(ask))
app.command()(guarded(models))
app.command("eval")(guarded(eval_command))
app.command()(guarded(calibrate))
app.command()(guarded(banking77))
app.command()(guarded(bench))
app.command()(guarded(mcp))
app.command("tiny-checkpoint")(guarded(tiny_checkpoint))
app.command()(version)


def main() -> None:
    """Run a command; Click's usage mistakes read as one line too (`usage_failed`), not as its boxed panel."""
    try:
        status = app(standalone_mode=False)
    except typer.Abort:
        fail("aborted")
    except typer.TyperException as error:  # Click's exceptions, as Typer raises them
        usage_failed(error)
    raise SystemExit(status if isinstance(status, int) else 0)
