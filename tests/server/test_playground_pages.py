"""The playground's links with API keys on, and a form posted from another site, in a real Chromium (issues 26, 28).

The browser is conftest.py's; the servers are real `canvasread serve` processes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from helpers import CliServer, cli_process
from playwright.sync_api import Page, Request, Route

KEY = "playground-key-1"


@pytest.fixture(scope="module")
def keyed() -> Iterator[CliServer]:
    with cli_process("--api-key", KEY) as server:
        yield server


def open_with_key(page: Page, base: str) -> None:
    """Open the playground and give it the key, as a user types it into the API key field."""
    page.goto(base + "/")
    page.fill("#api-key", KEY)
    page.locator("#api-key").dispatch_event("change")
    page.wait_for_selector(".question")  # the cards wait for the schema, which needs the key


def test_the_api_docs_link_opens_swagger_with_the_playgrounds_key(page: Page, keyed: CliServer) -> None:
    open_with_key(page, keyed.base)
    schema_requests: list[Request] = []
    page.on("request", lambda request: schema_requests.append(request) if "openapi.json" in request.url else None)
    with page.expect_navigation():
        page.click("nav >> text=API docs")
    page.wait_for_selector(".swagger-ui .info .title")
    assert "/v1/systemone" in page.locator(".swagger-ui .opblock-summary-path").all_inner_texts()
    assert schema_requests and {r.headers.get("authorization") for r in schema_requests} == {f"Bearer {KEY}"}


def test_try_it_out_sends_the_sdks_example_with_the_key(page: Page, keyed: CliServer) -> None:
    open_with_key(page, keyed.base)
    # The deep link opens the operation once the schema has loaded (`deepLinking`). Opening it here as well raced
    # that: a click while it was opening closed it again.
    page.goto(keyed.base + "/docs#/default/system_one_v1_systemone_post")
    block = page.locator(".opblock-post").first
    block.locator(".try-out__btn").click()
    with page.expect_response("**/v1/systemone") as caught:
        block.locator(".execute").click()
    response = caught.value
    assert response.status == 200, response.text()
    assert response.request.headers["authorization"] == f"Bearer {KEY}"
    assert set(json.loads(response.request.post_data or "{}")["questions"]) and "answers" in response.json()


def test_the_metrics_link_shows_the_metrics_with_the_key(page: Page, keyed: CliServer) -> None:
    open_with_key(page, keyed.base)
    with page.expect_navigation():
        page.click("nav >> text=metrics")
    assert "canvasread_http_requests_total" in page.locator("body").inner_text()


def test_without_a_key_the_docs_say_the_schema_is_refused(page: Page, keyed: CliServer) -> None:
    page.goto(keyed.base + "/docs")
    page.wait_for_selector(".swagger-ui")
    page.wait_for_selector("text=/401|Unauthorized/")


def test_a_form_on_another_site_cannot_make_the_server_work(page: Page, sparrow_server: str) -> None:
    """A page on http://evil.example (served by the test) posts a multipart form to the keyless local server."""
    request = json.dumps({"model": "default", "state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}})
    form = f"""<form method="post" enctype="multipart/form-data" action="{sparrow_server}/v1/systemone">
        <input type="hidden" name="request" value='{request}'><button id="go">go</button></form>"""

    def evil(route: Route) -> None:
        route.fulfill(status=200, content_type="text/html", body=form)

    page.route("http://evil.example/**", evil)
    page.goto("http://evil.example/")
    with page.expect_response("**/v1/systemone") as caught:
        page.click("#go")
    response = caught.value
    assert response.request.headers["content-type"].startswith("multipart/form-data")
    assert response.status == 403
    assert response.json()["detail"]["error_type"] == "cross_origin_refused"
