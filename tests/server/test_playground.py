"""The playground page in a real headless Chromium (Debian's `chromium`, driven by Playwright; see conftest.py).

Screenshots land in `artifacts/` (git-ignored) for a person to look at.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from helpers import serve_app
from playwright.sync_api import Browser, Locator, Page, Route

from canvasread.backends.base import FunctionBackend, Gone, never_gone
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.types import DecisionRequest, DecisionResult, Distribution

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


def shown_number(locator: Locator) -> float:
    return float(locator.inner_text())


def check_bars(card: Locator, probabilities: dict[str, float], chosen: str) -> None:
    rows = card.locator(".bar-row")
    assert rows.count() == len(probabilities)
    for index, (name, p) in enumerate(probabilities.items()):
        row = rows.nth(index)
        assert row.get_attribute("data-option") == name
        assert float(row.get_attribute("data-probability") or "nan") == p
        assert shown_number(row.locator(".bar-value")) == pytest.approx(p, abs=5e-4)
        width = row.locator(".bar-fill").evaluate("el => el.style.width")
        assert float(width.removesuffix("%")) == pytest.approx(p * 100, abs=1e-3)
    assert card.locator(".bar-row.chosen").get_attribute("data-option") == chosen


def argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))


def test_an_example_shows_the_returned_distributions(page: Page, sparrow_server: str) -> None:
    open_playground(page, sparrow_server)
    assert page.locator("#model option").first.inner_text() == "sparrow-nano-general-v1.1"
    status, body = send(page)
    assert status == 200

    answers = body["answers"]
    assert page.locator(".answer").count() == len(answers) == 2
    for key, answer in answers.items():
        card = page.locator(f'.answer[data-answer="{key}"]')
        if answer["type"] == "noul":
            p = answer["noul"]
            check_bars(card, {"true": p, "false": 1 - p}, "true" if p >= 0.5 else "false")
            assert shown_number(card.locator('[data-field="noul"]')) == pytest.approx(p, abs=5e-4)
            continue
        probabilities = answer["probabilities"]
        names = list(probabilities)
        chosen = answer["choice"] if answer["type"] == "choice" else names[argmax(list(probabilities.values()))]
        check_bars(card, probabilities, chosen)
        assert shown_number(card.locator('[data-field="confidence"]')) == pytest.approx(answer["confidence"], abs=5e-4)
    assert page.locator('[data-field="model"]').inner_text() == body["model"]
    assert page.locator('[data-field="latency"]').inner_text().endswith(" ms")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)


def test_an_invalid_question_shows_the_api_error(page: Page, sparrow_server: str) -> None:
    open_playground(page, sparrow_server)
    team = page.locator(".question").filter(has=page.locator('.question-id[value="team"]'))
    remove_buttons = team.locator(".option-row button")
    while remove_buttons.count():
        remove_buttons.first.click()
    status, body = send(page)
    assert status == 422

    error = page.locator("#error")
    assert error.is_visible()
    assert "422" in error.locator("strong").inner_text()
    items = error.locator("li")
    assert items.count() == len(body["detail"]) >= 1
    for index, entry in enumerate(body["detail"]):
        item = items.nth(index)
        assert item.locator(".loc").inner_text() == " → ".join(map(str, entry["loc"]))
        assert item.locator(".msg").inner_text() == entry["msg"]
    assert ["body", "questions", "team", "choice", "criteria"] in [e["loc"] for e in body["detail"]]
    assert "invalid" in (team.get_attribute("class") or "")
    assert page.locator(".answer").count() == 0
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground-error.png"), full_page=True)


class DetailedBackend(FunctionBackend):
    """Answers like a canvas backend with diagnostics: reads and label mass per question."""

    def decide(self, jobs: Sequence[DecisionRequest], gone: Gone = never_gone) -> list[DecisionResult | None]:
        results = super().decide(jobs, gone)
        return [
            DecisionResult(
                tuple(Distribution(d.probabilities, {"reads": 2, "label_mass": 0.93}) for d in result.distributions),
                result.usage,
            )
            for result in results
        ]


def uniform(request: DecisionRequest) -> list[list[float]]:
    return [[1 / len(q.options)] * len(q.options) for q in request.questions]


def test_diagnostics_are_shown_when_asked(page: Page) -> None:
    backend = DetailedBackend(uniform, name="detailed")
    with serve_app(create_app(Decider([backend]))) as base:
        open_playground(page, base)
        page.check("#diagnostics")
        status, body = send(page)
    assert status == 200
    for key, answer in body["answers"].items():
        assert answer["diagnostics"]["reads"] == 2
        card = page.locator(f'.answer[data-answer="{key}"]')
        shown = card.locator("[data-diagnostic]")
        assert shown.count() == len(answer["diagnostics"])
        for name, value in answer["diagnostics"].items():
            assert json.loads(card.locator(f'[data-diagnostic="{name}"]').inner_text()) == value
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground-diagnostics.png"), full_page=True)


def example_names(page: Page) -> list[str]:
    return [name.strip() for name in page.locator("#example option").all_inner_texts()]


def test_examples_say_what_the_embedded_model_was_measured_at(page: Page, sparrow_server: str) -> None:
    """Every example carries a note; the yes/no one says the embedded yes/no is at chance."""
    open_playground(page, sparrow_server)
    names = example_names(page)
    assert "noul" not in {q["type"] for q in page_questions(page)}, "the default example leads with choice and score"
    for name in names:
        page.select_option("#example", label=name)
        note = page.locator("#example-note").inner_text()
        assert note.strip(), name
        if "noul" in {q["type"] for q in page_questions(page)}:
            assert "chance" in note, name


def page_questions(page: Page) -> list[dict[str, Any]]:
    questions: list[dict[str, Any]] = page.evaluate(
        "() => [...document.querySelectorAll('.question')].map(c => ({type: c.dataset.kind}))"
    )
    return questions


def test_switching_the_example_clears_the_old_answers(page: Page, sparrow_server: str) -> None:
    open_playground(page, sparrow_server)
    status, _ = send(page)
    assert status == 200
    assert page.locator(".answer").count() > 0
    assert "HTTP 200" in page.locator("#status").inner_text()
    page.select_option("#example", index=1)
    assert page.locator(".answer").count() == 0
    assert "HTTP" not in page.locator("#status").inner_text()
    assert page.locator("#error").is_hidden()
    assert page.locator("#request-json").text_content() == page.locator("#response-json").text_content() == ""


def test_a_state_that_is_not_json_clears_the_stale_status(page: Page, sparrow_server: str) -> None:
    open_playground(page, sparrow_server)
    status, _ = send(page)
    assert status == 200
    sent: list[str] = []
    page.on("request", lambda request: sent.append(request.url) if "systemone" in request.url else None)
    page.click(".segmented label:has(input[value=json])")
    page.fill("#state", '{"message": "unterminated')
    page.click("#send")
    error = page.locator("#error")
    assert error.is_visible()
    assert "not valid JSON" in error.inner_text()
    status_line = page.locator("#status").inner_text()
    assert "HTTP" not in status_line and " ms" not in status_line
    assert "Not sent" in status_line
    assert page.locator(".answer").count() == 0
    assert page.locator("#response-json").text_content() == ""
    assert sent == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground-bad-json.png"), full_page=True)


FIELD_COLOURS = """() => [...document.querySelectorAll('input, textarea, select')]
  .filter(el => el.type !== 'radio' && el.type !== 'checkbox')
  .filter(el => el.offsetParent !== null)
  .map(el => ({
    name: el.getAttribute('aria-label') || el.className || el.id,
    filled: el.value !== '',
    placeholder: el.placeholder || '',
    colour: getComputedStyle(el).color,
    placeholderColour: getComputedStyle(el, '::placeholder').color,
  }))"""


def test_a_prefilled_value_does_not_look_like_placeholder_text(page: Page, sparrow_server: str) -> None:
    """Filled fields draw in the page's text colour; placeholders in a different one, in every example."""
    open_playground(page, sparrow_server)
    text_colour = page.evaluate("() => getComputedStyle(document.body).color")
    for name in example_names(page):
        page.select_option("#example", label=name)
        fields = page.evaluate(FIELD_COLOURS)
        assert any(field["filled"] for field in fields) and any(f["placeholder"] for f in fields)
        for field in fields:
            assert field["colour"] == text_colour, (name, field)
            if field["placeholder"]:
                assert field["placeholderColour"] != field["colour"], (name, field)


# Elements that stick out of the viewport, or out of their parent's box (a field running past its card's
# border), skipping what scrolls or clips on purpose (the JSON panes, ellipsised labels).
OVERFLOWING = """(width) => {
  const out = [];
  const name = (el) => `${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''}.${el.className}`;
  const span = (box) => `${Math.round(box.left)}..${Math.round(box.right)}`;
  for (const el of document.querySelectorAll('body *')) {
    if (el.getClientRects().length === 0 || el.closest('pre, option')) continue;
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;
    if (box.left < -0.5 || box.right > width + 0.5) out.push(`${name(el)} ${span(box)}`);
    const parent = el.parentElement;
    if (parent === document.body || getComputedStyle(parent).overflowX !== 'visible') continue;
    const outer = parent.getBoundingClientRect();
    if (box.left < outer.left - 1 || box.right > outer.right + 1)
      out.push(`${name(el)} ${span(box)} outside ${name(parent)} ${span(outer)}`);
  }
  return out;
}"""


@pytest.mark.parametrize("width", [390])
def test_nothing_overflows_at_a_phones_width(browser: Browser, sparrow_server: str, width: int) -> None:
    context = browser.new_context(viewport={"width": width, "height": 844}, device_scale_factor=1)
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        open_playground(page, sparrow_server)
        ARTIFACTS.mkdir(exist_ok=True)
        for index, name in enumerate(example_names(page)):
            page.select_option("#example", label=name)
            status, _ = send(page)
            assert status == 200
            page.locator("#result details").evaluate_all("nodes => nodes.forEach(d => d.open = true)")
            assert page.evaluate(OVERFLOWING, width) == [], name
            assert page.evaluate("() => document.documentElement.scrollWidth") <= width, name
            page.screenshot(path=str(ARTIFACTS / f"playground-{width}px-{index}.png"), full_page=True)
        page.locator(".question").first.locator(".question-type").select_option("choice")
        page.locator(".question .option-row button").first.click()
        page.locator(".question .option-row button").first.click()
        status, _ = send(page)
        assert status == 422
        assert page.evaluate(OVERFLOWING, width) == []
        page.screenshot(path=str(ARTIFACTS / f"playground-{width}px-error.png"), full_page=True)
    finally:
        context.close()


class GatedBackend(FunctionBackend):
    """Holds every read that holds `held` until the test opens the gate, so a stage can be seen landing alone."""

    def __init__(self, held: str) -> None:
        super().__init__(uniform, name="gated")
        self.held = held
        self.gate = threading.Event()

    def decide(self, jobs: Sequence[DecisionRequest], gone: Gone = never_gone) -> list[DecisionResult | None]:
        if any(q.key == self.held for job in jobs for q in job.questions):
            assert self.gate.wait(60), "the test never opened the gate"
        return super().decide(jobs, gone)


def test_streamed_answers_are_drawn_as_each_stage_lands(page: Page) -> None:
    backend = GatedBackend(held="billing_issue")
    with serve_app(create_app(Decider([backend]))) as base:
        open_playground(page, base)
        page.select_option("#example", label="Pipeline (stages)")
        page.click("#send")
        page.wait_for_selector('.answer[data-answer="team"]')
        assert page.locator('[data-field="stream"]').inner_text() == "streaming…"
        assert page.locator('.answer[data-answer="billing_issue"]').count() == 0
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "playground-streaming.png"), full_page=True)
        backend.gate.set()
        page.wait_for_selector('[data-field="stream"]:text("streamed")')
    assert page.locator('.answer[data-answer="billing_issue"] [data-field="stage"]').inner_text() == "stage 1"
    skipped = page.locator('.answer[data-answer="parcel_issue"]')
    assert skipped.get_attribute("data-skipped") == "condition_not_met"
    payload = json.loads(page.locator("#response-json").text_content() or "")
    assert list(payload["answers"]) == ["team", "billing_issue"] and list(payload["skipped"]) == ["parcel_issue"]
    page.screenshot(path=str(ARTIFACTS / "playground-streamed.png"), full_page=True)


def test_extension_keys_that_are_not_json_are_not_sent(page: Page, sparrow_server: str) -> None:
    open_playground(page, sparrow_server)
    sent: list[str] = []
    page.on("request", lambda request: sent.append(request.url) if "systemone" in request.url else None)
    page.locator(".question-extra").first.fill('{"depends_on": ')
    page.click("#send")
    assert "extension keys of team" in page.locator("#error").inner_text()
    assert "invalid" in (page.locator(".question").first.get_attribute("class") or "")
    assert sent == []


LOOPBACK = {"127.0.0.1", "localhost", "[::1]", "::1"}


def test_the_api_docs_link_works_offline(page: Page, sparrow_server: str) -> None:
    """The playground's "API docs" link renders Swagger UI from this server alone: nothing else is fetched."""
    outside: list[str] = []

    def only_loopback(route: Route) -> None:
        host = urlsplit(route.request.url).hostname or ""
        if route.request.url.startswith(("http:", "https:", "ws:", "wss:")) and host not in LOOPBACK:
            outside.append(route.request.url)
            route.abort("internetdisconnected")
        else:
            route.continue_()

    page.context.route("**/*", only_loopback)
    open_playground(page, sparrow_server)
    with page.expect_navigation():
        page.click("nav >> text=API docs")
    page.wait_for_load_state("load")
    assert outside == [], "the docs page fetched from outside this server"
    page.wait_for_selector(".swagger-ui .info .title")
    assert "canvasread" in page.locator(".swagger-ui .info .title").inner_text().lower()
    operations = page.locator(".swagger-ui .opblock-summary-path")
    operations.first.wait_for()
    assert "/v1/systemone" in operations.all_inner_texts()
    assert outside == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground-api-docs.png"), full_page=True)


def test_the_question_kinds_and_their_editors_come_from_the_servers_schema(page: Page, sparrow_server: str) -> None:
    schema = httpx.get(sparrow_server + "/openapi.json", timeout=10).json()
    union = schema["components"]["schemas"]["SystemOneRequest"]["properties"]["questions"]["additionalProperties"]
    kinds = sorted(union["discriminator"]["mapping"])
    open_playground(page, sparrow_server)
    assert sorted(page.locator(".adders button").evaluate_all("nodes => nodes.map(n => n.dataset.add)")) == kinds
    assert sorted(page.locator(".question-type").first.locator("option").all_inner_texts()) == kinds
    for kind, inputs in (("noul", 2), ("box", 0), ("span", 0)):
        page.click(f'.adders button[data-add="{kind}"]')
        card = page.locator(".question").last
        assert card.get_attribute("data-kind") == kind
        assert card.locator(".criteria input").count() == inputs, kind
    card.locator(".instructions").fill("Who signed?")
    card.locator(".question-type").select_option("choice")
    assert card.locator(".option-row").count() == 2  # a choice's editor: named options


def test_answers_of_every_kind_are_drawn_from_their_fields(page: Page, sparrow_server: str) -> None:
    answers = {
        "logo": {"type": "box", "box": {"top": 0.1, "bottom": 0.4, "left": 0.2, "right": 0.9}, "confidence": 0.7},
        "who": {"type": "span", "found": True, "text": "Zoë", "start": 7, "end": 10, "confidence": 0.9},
        "none": {"type": "span", "found": False, "text": "", "start": 0, "end": 0, "confidence": 0.8},
        "names": {
            "type": "spans",
            "spans": [
                {"text": "Ann", "start": 0, "end": 3, "confidence": 0.6},
                {"text": "Bo", "start": 8, "end": 10, "confidence": 0.5},
            ],
            "confidence": 0.5,
            "complete": False,
        },
    }
    body = {"model": "sparrow-nano-general-v1.1", "answers": answers, "usage": {"input_tokens": 1, "output_tokens": 1}}

    def canned(route: Route) -> None:
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    open_playground(page, sparrow_server)
    page.route("**/v1/systemone", canned)
    send(page)
    assert page.locator("#error").is_hidden()
    logo = page.locator('.answer[data-answer="logo"]')
    assert logo.locator(".bar-row").evaluate_all("rows => rows.map(r => r.dataset.option)") == list(
        answers["logo"]["box"]
    )
    assert "top 0.10" in logo.locator(".headline").inner_text()
    assert page.locator('.answer[data-answer="who"] .headline').inner_text() == "Zoë"
    assert page.locator('.answer[data-answer="none"] .headline').inner_text() == "not found"
    assert page.locator('.answer[data-answer="none"] .bar-row').count() == 0
    names = page.locator('.answer[data-answer="names"]')
    assert names.locator(".bar-row").evaluate_all("rows => rows.map(r => r.dataset.option)") == ["Ann", "Bo"]
    assert shown_number(names.locator('[data-field="confidence"]')) == pytest.approx(0.5)
