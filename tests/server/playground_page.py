"""The playground page as its browser tests drive it: open it, send its request; screenshots land in `artifacts/`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playwright.sync_api import Page

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def open_playground(page: Page, base: str) -> None:
    page.goto(base + "/")
    page.wait_for_selector("body.ready")


def send(page: Page) -> tuple[int, Any]:
    """Click Send and return the status and the body the page received from /v1/systemone.

    A streamed answer's body is what the page assembled from the events (its Response JSON pane),
    read once the stream is done; the streaming tests check it against the events themselves.
    """
    with page.expect_response("**/v1/systemone") as caught:
        page.click("#send")
    response = caught.value
    if response.ok and response.headers.get("content-type", "").startswith("text/event-stream"):
        page.wait_for_selector('[data-field="stream"]:text-matches("^(streamed|stream ended)")')
        return response.status, json.loads(page.locator("#response-json").text_content() or "")
    body = response.json()
    page.wait_for_selector("#answers .answer, #error:not([hidden])")
    return response.status, body
