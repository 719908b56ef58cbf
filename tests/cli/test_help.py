"""`--help` speaks in metavars and shows defaults, never Python types (issue 15.10)."""

from __future__ import annotations

import re

import pytest
from helpers import canvasread

COMMANDS = ("serve", "ask", "models", "eval", "calibrate", "banking77", "bench", "tiny-checkpoint", "version")
# Option values show a metavar such as MODEL or N. typer itself marks flags `<bool>` (its own --help too) and
# types positional arguments beside their name (`STATE <str>`); those it offers no way to change.
PYTHON_TYPES = re.compile(r"<(list\[|str>|int>|float>|path>)")


@pytest.mark.parametrize("command", [*COMMANDS, None])
def test_help_has_no_python_types(command: str | None) -> None:
    result = canvasread(*([command] if command else []), "--help")
    assert result.returncode == 0, result.stderr
    options = [line for line in result.stdout.splitlines() if line.lstrip("│ ").startswith("-")]
    assert options and PYTHON_TYPES.findall("\n".join(options)) == [], result.stdout


def test_serve_help_shows_the_default_model() -> None:
    result = canvasread("serve", "--help")
    assert "[default: (sparrow-nano-general-v1.1)]" in result.stdout


@pytest.mark.parametrize("command", [*COMMANDS, None])
def test_dash_h_is_help(command: str | None) -> None:
    result = canvasread(*([command] if command else []), "-h")
    assert result.returncode == 0, result.stderr
    assert result.stdout == canvasread(*([command] if command else []), "--help").stdout


def test_dash_dash_version_prints_the_version() -> None:
    from canvasread import __version__

    result = canvasread("--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{__version__}\n", "")
    assert canvasread("version").stdout == result.stdout
