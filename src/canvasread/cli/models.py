"""`canvasread models`: what a running server serves, one row per model with its aliases beside it."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from canvasread.cli.client import call
from canvasread.cli.errors import console
from canvasread.cli.options import DEFAULT_API_KEY, DEFAULT_URL, ApiKey, ServerUrl


def _rows(entries: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[str]]]:
    """One row per model with its aliases; the API lists an alias as a model described "Alias of NAME. …"."""
    rows: dict[str, tuple[dict[str, Any], list[str]]] = {entry["name"]: (entry, []) for entry in entries}
    for entry in entries:
        for name, (target, aliases) in rows.items():
            if entry["description"] == f"Alias of {name}. {target['description']}":
                aliases.append(entry["name"])
                del rows[entry["name"]]
                break
    return list(rows.values())


def models(url: ServerUrl = DEFAULT_URL, api_key: ApiKey = DEFAULT_API_KEY) -> None:
    """List the models a running server serves."""
    rows = _rows(call("GET", url, "/v1/models", api_key)["models"])
    names = [entry["name"] for entry, _ in rows]
    aliases = [alias for _, named in rows for alias in named]
    table = Table()
    # Names are what a user copies into requests: never cut or wrapped; the description wraps instead.
    table.add_column("name", no_wrap=True, min_width=max(map(len, names)))
    table.add_column("aliases", no_wrap=True, min_width=max(map(len, aliases), default=0))
    table.add_column("release", no_wrap=True)
    table.add_column("description", ratio=1, overflow="fold")
    for entry, named in rows:
        table.add_row(
            escape(entry["name"]), escape("\n".join(named)), entry["release_date"], escape(entry["description"])
        )
    console.print(table)
