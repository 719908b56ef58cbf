"""`canvasread models`: one row per served model, its aliases beside it, the description once (issue 15.10)."""

from __future__ import annotations

from helpers import canvasread


def test_each_description_is_shown_once(sparrow_server: str) -> None:
    result = canvasread("models", "--url", sparrow_server)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("the small CPU decision model") == 1
    assert "Alias of" not in result.stdout
    for name in ("sparrow-nano-general-v1.1", "jev-latest", "default"):
        assert name in result.stdout


def test_names_and_aliases_are_whole_at_80_columns(sparrow_server: str) -> None:
    result = canvasread("models", "--url", sparrow_server, columns=80)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    cells = {cell.strip() for line in lines for cell in line.split("│")}
    assert {"sparrow-nano-general-v1.1", "jev-latest", "jev-1.14.0", "openjev-latest"} <= cells
