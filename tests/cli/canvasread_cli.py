"""Run the real `canvasread` command in a subprocess, as a user's shell would."""

from __future__ import annotations

import os
import subprocess
import sys

# `python -c` stand-in for the console script, with some packages made unimportable first.
WITHOUT = "import sys; sys.modules.update(dict.fromkeys({blocked!r})); sys.argv[0] = 'canvasread'; " + (
    "from canvasread.cli import main; main()"
)


def canvasread(
    *args: str, stdin: str | None = None, timeout: float = 300, without: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """`python -m canvasread ARGS` with a clean environment (PYTHONPATH kept, so a worktree's sources win).

    `without` names packages to hide, as on a machine where that extra is not installed.
    """
    env = {"COLUMNS": "160", "PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    start = ["-c", WITHOUT.format(blocked=list(without))] if without else ["-m", "canvasread"]
    return subprocess.run(
        [sys.executable, *start, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    """A user error: exit 1, no traceback, one line on stderr that says each of `expected`; returns that line."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for text in expected:
        assert text in lines[0], output
    return lines[0]
