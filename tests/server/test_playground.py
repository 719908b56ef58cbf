"""The playground's answers in a real headless Chromium: distributions, API errors, diagnostics, streams, every kind."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

import pytest
from helpers import serve_app
from playground_page import ARTIFACTS, open_playground, send
from playwright.sync_api import Locator, Page, Route

from canvasread.backends.base import FunctionBackend, Gone, never_gone
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.types import DecisionRequest, DecisionResult, Distribution


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
