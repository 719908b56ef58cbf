"""Forms a browser posts from another site are refused (issue 28); the official SDK's multipart still works.

Against a live server with a vision backend, so a form that got through would be read; the same form from a
real browser page on another origin is in `test_playground.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import httpx
import pytest
from helpers import png, serve_app
from typesafe_sdk import Image, Noul, TypeSafeClient

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.errors import CrossOriginRefused
from canvasread.server.app import create_app
from canvasread.server.origin import check_form_origin
from canvasread.settings import ServerSettings
from canvasread.types import Capabilities, DecisionRequest

ALLOWED = "https://app.example"
BODY = {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "Damaged?"}}}


@pytest.fixture(scope="module")
def vision() -> Iterator[tuple[str, list[DecisionRequest]]]:
    seen: list[DecisionRequest] = []

    def answer(request: DecisionRequest) -> Sequence[Sequence[float]]:
        seen.append(request)
        return [[0.25, 0.75] for _ in request.questions]

    backend = FunctionBackend(answer, name="vision-fake", capabilities=Capabilities(images=True))
    with serve_app(create_app(Decider([backend]), ServerSettings(cors_origins=(ALLOWED,)))) as base:
        yield base, seen


def form_post(base: str, headers: dict[str, str]) -> httpx.Response:
    """What an HTML form with `enctype="multipart/form-data"` sends: a `request` field, no Authorization."""
    files = {"request": (None, json.dumps(BODY), "application/json")}
    return httpx.post(base + "/v1/systemone", files=files, headers=headers, timeout=30)


def test_the_official_sdk_still_posts_images_as_multipart(vision: tuple[str, list[DecisionRequest]]) -> None:
    base, seen = vision
    photo = Image(png(16, 16))
    with TypeSafeClient(base_url=base, api_key="local") as client, client.attach_assets(photo):
        result = client.system_one(f"Photo: {photo}", {"damaged": Noul(instructions="Is it damaged?")})
    assert result.raw_http_response.request.headers["content-type"].startswith("multipart/form-data")
    assert result.answers["damaged"].noul == pytest.approx(0.25)
    assert str(photo) in seen[-1].assets


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"},
        {"Origin": "https://evil.example"},  # a browser without Fetch Metadata
        {"Origin": "null", "Sec-Fetch-Site": "cross-site"},  # a sandboxed frame or a local file
        {"Origin": "null"},
        {"Sec-Fetch-Site": "same-site"},  # another port or subdomain of the same site is another origin
        {"Origin": "http://127.0.0.1:1"},
    ],
)
def test_a_form_from_another_origin_is_refused_unread(
    vision: tuple[str, list[DecisionRequest]], headers: dict[str, str]
) -> None:
    base, seen = vision
    before = len(seen)
    response = form_post(base, headers)
    assert response.status_code == 403, response.text
    detail = response.json()["detail"]
    assert detail["error_type"] == "cross_origin_refused" and "--cors-origin" in detail["message"]
    assert detail["request_id"] == response.headers["x-typesafe-request-id"]
    assert len(seen) == before


def test_forms_from_this_server_or_an_allowed_origin_are_read(vision: tuple[str, list[DecisionRequest]]) -> None:
    base, _ = vision
    own = base.removeprefix("http://")
    for headers in (
        {"Origin": base, "Sec-Fetch-Site": "same-origin"},
        {"Origin": base},
        {"Sec-Fetch-Site": "none"},
        {"Origin": ALLOWED, "Sec-Fetch-Site": "cross-site"},
        {"Host": own.upper(), "Origin": f"http://{own}"},
    ):
        assert form_post(base, headers).status_code == 200, headers


def test_json_from_another_origin_is_left_to_cors(vision: tuple[str, list[DecisionRequest]]) -> None:
    """A page cannot send JSON cross-site without a preflight, which the server refuses for other origins."""
    base, _ = vision
    headers = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
    assert httpx.post(base + "/v1/systemone", json=BODY, headers=headers, timeout=30).status_code == 200
    preflight = httpx.options(
        base + "/v1/systemone", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    )
    assert "access-control-allow-origin" not in preflight.headers


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({}, False),
        ({"origin": "http://a:1", "host": "a:1"}, False),
        ({"origin": "http://a:1", "host": "a:2"}, True),
        ({"origin": "https://a", "host": "a"}, False),
        ({"origin": "ftp://a", "host": "a"}, True),
        ({"origin": "http://[::1", "host": "[::1"}, True),
        ({"origin": "http://a", "host": "a", "sec-fetch-site": "cross-site"}, True),
        ({"origin": "http://b", "host": "a", "sec-fetch-site": "same-origin"}, False),
        ({"sec-fetch-site": "Same-Origin"}, False),
        ({"sec-fetch-site": "bogus"}, True),
    ],
)
def test_the_origin_rule(headers: dict[str, str], refused: bool) -> None:
    if refused:
        with pytest.raises(CrossOriginRefused):
            check_form_origin(headers, ())
    else:
        check_form_origin(headers, ())
