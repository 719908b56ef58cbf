"""`static/stream.js` in a real headless Chromium: a browser reads streamed answers as they land."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright
from serving import serve_app

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.types import DecisionRequest

CHROMIUM = Path("/usr/bin/chromium")
NOUL = {"type": "noul", "instructions": "Is this a bug report?"}
CHAIN = {
    "one": NOUL,
    "two": {**NOUL, "depends_on": ["one"]},
    "never": {**NOUL, "ask_if": {"one": [False]}},
    "three": {**NOUL, "depends_on": ["two"]},
}
# Streams a request from the page and records, per answer, what had already arrived when it landed.
READ = """async ([questions]) => {
  const { readAnswerStream } = await import("/static/stream.js");
  const response = await fetch("/v1/systemone", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify({ model: "default", state: "The app crashes", questions }),
  });
  const landed = [];
  try {
    const payload = await readAnswerStream(response, (key, answer, stage) => landed.push([key, stage, answer.noul]));
    return { landed, payload };
  } catch (error) {
    return { landed, error: error.body };
  }
}"""


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make install-browser` (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        yield browser.new_page()
        browser.close()


def answer(request: DecisionRequest) -> list[list[float]]:
    if any(q.key == "three" for q in request.questions):
        raise RuntimeError("stage three fails")
    return [[0.75, 0.25] for _ in request.questions]


def read(page: Page, questions: dict[str, Any]) -> dict[str, Any]:
    with serve_app(create_app(Decider([FunctionBackend(answer)]))) as base:
        page.goto(base + "/")
        result: dict[str, Any] = page.evaluate(READ, [questions])
    return result


def test_answers_land_in_stage_order_and_the_payload_is_the_json_one(page: Page) -> None:
    questions = {key: question for key, question in CHAIN.items() if key != "three"}
    result = read(page, questions)
    assert result["landed"] == [["one", 0, 0.75], ["two", 1, 0.75]]
    payload = result["payload"]
    assert set(payload) == {"model", "usage", "answers", "skipped"} and list(payload["answers"]) == ["one", "two"]
    assert payload["skipped"]["never"]["reason"] == "condition_not_met"


def test_an_error_event_rejects_with_the_api_error_body(page: Page) -> None:
    result = read(page, CHAIN)
    assert [key for key, _, _ in result["landed"]] == ["one", "two"]
    assert result["error"]["detail"]["error_type"] == "backend_error"
