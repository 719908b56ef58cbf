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
