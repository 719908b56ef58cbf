"""Every bad input gets a 4xx in the documented shape (raw HTTP against live servers), never a 500."""

from __future__ import annotations

import base64
import gzip
import json
import threading
from typing import Any

import httpx
import pytest
import zstandard
from helpers import png, post, serve_app, wait_until

from canvasread.backends.base import FunctionBackend
from canvasread.backends.sparrow import SparrowBackend
from canvasread.decide import Decider, DeciderSettings
from canvasread.server.app import create_app
from canvasread.types import DecisionRequest

NOUL = {"type": "noul", "instructions": "Is this about billing?"}


def request_body(**questions: Any) -> dict[str, Any]:
    return {"model": "jev-latest", "state": "I was charged twice.", "questions": questions or {"q": NOUL}}


def assert_422_at(response: httpx.Response, loc: list[Any]) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    assert response.headers["x-typesafe-request-id"]
    detail = response.json()["detail"]
    assert isinstance(detail, list) and detail
    for entry in detail:
        assert {"loc", "msg", "type"} <= set(entry)
    locs = [entry["loc"] for entry in detail]
    assert loc in locs, locs
    return next(entry for entry in detail if entry["loc"] == loc)


def test_256_options_points_at_the_criteria(sparrow_server: str) -> None:
    criteria = {f"option {i}": None for i in range(256)}
    entry = assert_422_at(
        post(sparrow_server, request_body(team={"type": "choice", "criteria": criteria})),
        ["body", "questions", "team", "choice", "criteria"],
    )
    assert entry["type"] == "too_long"


def test_255_options_are_accepted(sparrow_server: str) -> None:
    criteria = {f"option {i}": None for i in range(255)}
    response = post(sparrow_server, request_body(team={"type": "choice", "criteria": criteria}))
    assert response.status_code == 200
    assert len(response.json()["answers"]["team"]["probabilities"]) == 255


def test_11_levels_points_at_the_criteria(sparrow_server: str) -> None:
    body = request_body(urgency={"type": "score", "criteria": [f"level {i}" for i in range(11)]})
    assert_422_at(post(sparrow_server, body), ["body", "questions", "urgency", "score", "criteria"])


def test_empty_questions(sparrow_server: str) -> None:
    body = {"model": "jev-latest", "state": "x", "questions": {}}
    assert_422_at(post(sparrow_server, body), ["body", "questions"])


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"model": "jev-latest", "state": 5, "questions": {"q": NOUL}}, ["body", "state"]),
        ({"model": "jev-latest", "state": "x", "questions": [NOUL]}, ["body", "questions"]),
        (
            {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "choice", "criteria": ["a", "b"]}}},
            ["body", "questions", "q", "choice", "criteria"],
        ),
        (
            {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "maybe"}}},
            ["body", "questions", "q", "type"],
        ),
        ({"model": "jev-latest", "questions": {"q": NOUL}}, ["body", "state"]),
        ({"state": "x", "questions": {"q": NOUL}}, ["body", "model"]),
        (
            {"model": "jev-latest", "state": "x", "questions": {"q": NOUL}, "samples": 0},
            ["body", "samples"],
        ),
        (
            {"model": "jev-latest", "state": "x", "questions": {"q": {**NOUL, "min_confidence": 2}}},
            ["body", "questions", "q", "noul", "min_confidence"],
        ),
    ],
)
def test_wrong_types_point_at_the_field(sparrow_server: str, body: dict[str, Any], loc: list[Any]) -> None:
    assert_422_at(post(sparrow_server, body), loc)


@pytest.mark.parametrize("steps", [0, 9, -1, "2", True, 2.5, None])
def test_steps_outside_1_to_8_point_at_steps(sparrow_server: str, steps: Any) -> None:
    assert_422_at(post(sparrow_server, {**request_body(), "steps": steps}), ["body", "steps"])


def test_the_embedded_model_refuses_more_than_one_step(sparrow_server: str) -> None:
    entry = assert_422_at(post(sparrow_server, {**request_body(), "steps": 2}), ["body", "steps"])
    assert "at most 1 step" in entry["msg"] and "DiffusionGemma" in entry["msg"]
    assert post(sparrow_server, {**request_body(), "steps": 1}).status_code == 200


def test_noul_with_neither_instructions_nor_criteria(sparrow_server: str) -> None:
    body = request_body(q={"type": "noul", "criteria": {"true": None, "false": None}})
    entry = assert_422_at(post(sparrow_server, body), ["body", "questions", "q", "noul"])
    assert "instructions" in entry["msg"]
    described = request_body(q={"type": "noul", "criteria": {"true": "it is about billing"}})
    assert post(sparrow_server, described).status_code == 200


def test_bad_base64_asset(sparrow_server: str) -> None:
    body = {**request_body(), "assets": {"<image:1>": {"type": "image", "format": "png", "data_base64": "@@@"}}}
    assert_422_at(post(sparrow_server, body), ["body", "assets", "<image:1>", "data_base64"])


def test_base64_that_is_not_an_image(sparrow_server: str) -> None:
    data = base64.b64encode(b"hello, not an image").decode()
    body = {**request_body(), "assets": {"<image:1>": {"type": "image", "format": "png", "data_base64": data}}}
    entry = assert_422_at(post(sparrow_server, body), ["body", "assets", "<image:1>", "data_base64"])
    assert "PNG or JPEG" in entry["msg"]


def test_empty_assets_is_rejected(sparrow_server: str) -> None:
    assert_422_at(post(sparrow_server, {**request_body(), "assets": {}}), ["body", "assets"])


def test_unclaimed_multipart_part(sparrow_server: str) -> None:
    body = {**request_body(), "assets": {"<image:a>": {"type": "image", "part": "asset-0"}}}
    files = {
        "request": (None, json.dumps(body), "application/json"),
        "asset-0": ("asset-0", png(), "image/png"),
        "asset-1": ("asset-1", png(), "image/png"),
    }
    response = httpx.post(sparrow_server + "/v1/systemone", files=files, timeout=30)
    assert_422_at(response, ["body", "asset-1"])


def test_asset_naming_a_missing_part(sparrow_server: str) -> None:
    body = {**request_body(), "assets": {"<image:a>": {"type": "image", "part": "asset-7"}}}
    files = {"request": (None, json.dumps(body), "application/json")}
    response = httpx.post(sparrow_server + "/v1/systemone", files=files, timeout=30)
    assert_422_at(response, ["body", "assets", "<image:a>", "part"])


def test_malformed_json_is_a_4xx_not_a_500(sparrow_server: str) -> None:
    for raw in (b"{bad", b"", b"\xff\xfe", b"[1, 2", b"null", b"42"):
        response = httpx.post(
            sparrow_server + "/v1/systemone", content=raw, headers={"content-type": "application/json"}, timeout=30
        )
        assert response.status_code in (400, 422), (raw, response.status_code)
        assert response.headers["x-typesafe-request-id"]


def test_gzip_and_zstd_bodies_are_decoded(sparrow_server: str) -> None:
    raw = json.dumps(request_body()).encode()
    for encoding, data in (("gzip", gzip.compress(raw)), ("zstd", zstandard.ZstdCompressor().compress(raw))):
        response = httpx.post(
            sparrow_server + "/v1/systemone",
            content=data,
            timeout=30,
            headers={"content-type": "application/json", "content-encoding": encoding},
        )
        assert response.status_code == 200, (encoding, response.text)


def test_broken_or_unknown_encodings_are_400(sparrow_server: str) -> None:
    for encoding, data in (("zstd", b"not zstd at all"), ("gzip", b"nope"), ("br", b"x")):
        response = httpx.post(
            sparrow_server + "/v1/systemone",
            content=data,
            timeout=30,
            headers={"content-type": "application/json", "content-encoding": encoding},
        )
        assert response.status_code == 400, encoding
        assert response.json()["detail"]["error_type"] == "bad_request"


def test_unknown_keys_are_ignored_and_document_is_an_alias(sparrow_server: str) -> None:
    body = {
        "model": "jev-latest",
        "document": {"text": "charged twice"},
        "questions": {"q": NOUL},
        "future_field": {"anything": 1},
    }
    response = post(sparrow_server, body)
    assert response.status_code == 200
    assert list(response.json()["answers"]) == ["q"]


def test_single_option_and_single_level(sparrow_server: str) -> None:
    body = request_body(
        only={"type": "choice", "criteria": {"yes": None}}, level={"type": "score", "criteria": ["the only level"]}
    )
    answers = post(sparrow_server, body).json()["answers"]
    assert answers["only"] == {"type": "choice", "choice": "yes", "confidence": 1.0, "probabilities": {"yes": 1.0}}
    assert answers["level"]["score"] == 0.0 and answers["level"]["confidence"] == 1.0


def test_every_response_carries_a_request_id(sparrow_server: str) -> None:
    responses = [
        httpx.get(sparrow_server + "/no/such/route"),
        httpx.get(sparrow_server + "/v1/systemone"),
        httpx.get(sparrow_server + "/v1/models"),
        httpx.get(sparrow_server + "/openapi.json"),
        post(sparrow_server, request_body()),
        post(sparrow_server, {"bad": True}),
    ]
    ids = [r.headers["x-typesafe-request-id"] for r in responses]
    assert len(set(ids)) == len(ids)


def test_openapi_documents_the_request_body(sparrow_server: str) -> None:
    schema = httpx.get(sparrow_server + "/openapi.json").json()
    body = schema["paths"]["/v1/systemone"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/SystemOneRequest"
    assert "questions" in schema["components"]["schemas"]["SystemOneRequest"]["properties"]


def test_round_2_reproduces_hosted_precision() -> None:
    decider = Decider([SparrowBackend()], DeciderSettings(decimals=2))
    with serve_app(create_app(decider)) as base:
        body = request_body(
            q=NOUL,
            team={"type": "choice", "criteria": {"a": "first", "b": "second", "c": "third"}},
            level={"type": "score", "criteria": ["low", "mid", "high"]},
        )
        answers = post(base, body).json()["answers"]
    numbers = [
        answers["q"]["noul"],
        answers["team"]["confidence"],
        answers["level"]["score"],
        *answers["team"]["probabilities"].values(),
        *answers["level"]["probabilities"].values(),
    ]
    assert all(round(n, 2) == n for n in numbers)


def test_port_binds_before_a_slow_model_loads() -> None:
    release = threading.Event()

    class SlowBackend(FunctionBackend):
        def load(self) -> None:
            release.wait(30)

    backend = SlowBackend(lambda request: [[0.5, 0.5] for _ in request.questions], name="slow")
    with serve_app(create_app(Decider([backend])), wait_ready=False) as base:
        assert httpx.get(base + "/health").status_code == 200
        assert httpx.get(base + "/ready").status_code == 503
        busy = post(base, request_body())
        assert busy.status_code == 503 and busy.json()["detail"]["error_type"] == "not_ready"
        release.set()
        wait_until(base + "/ready")
        assert post(base, request_body()).status_code == 200


def test_a_backend_that_fails_to_load_keeps_ready_at_503() -> None:
    class Broken(FunctionBackend):
        def load(self) -> None:
            raise OSError("weights are missing")

    with serve_app(create_app(Decider([Broken(lambda r: [], name="broken")])), wait_ready=False) as base:
        wait_until(base + "/ready", status=503)
        assert "weights are missing" in httpx.get(base + "/ready").text


def test_body_size_limit_is_413() -> None:
    from canvasread.settings import ServerSettings

    backend = FunctionBackend(lambda request: [[1.0, 0.0] for _ in request.questions])
    with serve_app(create_app(Decider([backend]), ServerSettings(max_body_bytes=4096))) as base:
        big = {**request_body(), "state": "x" * 10_000}
        assert post(base, big).status_code == 413
        bomb = zstandard.ZstdCompressor().compress(json.dumps(big).encode())
        response = httpx.post(
            base + "/v1/systemone",
            content=bomb,
            headers={"content-type": "application/json", "content-encoding": "zstd"},
        )
        assert len(bomb) < 4096 and response.status_code == 413


def test_backend_errors_fail_only_their_request() -> None:
    def answer(request: DecisionRequest) -> list[list[float]]:
        if request.state == "explode":
            raise RuntimeError("model bug")
        return [[1.0, 0.0] for _ in request.questions]

    with serve_app(create_app(Decider([FunctionBackend(answer)]))) as base:
        failed = post(base, {**request_body(), "state": "explode"})
        assert failed.status_code == 500
        assert failed.json()["detail"]["request_id"] == failed.headers["x-typesafe-request-id"]
        assert post(base, request_body()).status_code == 200
