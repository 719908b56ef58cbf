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
    table = Table("name", "aliases", "release", "description")
    for entry, aliases in _rows(call("GET", url, "/v1/models", api_key)["models"]):
        table.add_row(
            escape(entry["name"]), escape(", ".join(aliases)), entry["release_date"], escape(entry["description"])
        )
    console.print(table)
