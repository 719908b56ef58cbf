"""The playground's form in a real headless Chromium: examples, editors, input refused unsent, layout, the docs link."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playground_page import ARTIFACTS, open_playground, send
from playwright.sync_api import Browser, Page, Route


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
