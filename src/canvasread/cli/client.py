"""The HTTP calls `ask --url` and `models` make; a refused call becomes one line saying what the server said."""

from __future__ import annotations

from typing import Any

import httpx

from canvasread.cli.errors import UserError


def server_message(reply: httpx.Response) -> str:
    """The server's own words from the API's error shape (`detail` message or 422 list), else the body's text."""
    try:
        detail = reply.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, dict) and "message" in detail:
        return str(detail["message"])
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(part) for part in entry.get('loc', [])[1:])}: {entry.get('msg')}"
            for entry in detail
            if isinstance(entry, dict)
        )
    return " ".join(reply.text.split())[:300] or reply.reason_phrase


def call(
    method: str, url: str, path: str, api_key: str, *, body: dict[str, Any] | None = None, timeout_s: float = 30.0
) -> dict[str, Any]:
    """One API call; any status but 200 raises `UserError` with the status and the server's message."""
    reply = httpx.request(
        method,
        url.rstrip("/") + path,
        json=body,
        timeout=timeout_s,
        headers={"Authorization": f"Bearer {api_key}"},
    )
    if reply.status_code != 200:
        raise UserError(f"{reply.request.url}: HTTP {reply.status_code}: {server_message(reply)}")
    result: dict[str, Any] = reply.json()
    return result
