"""Every request limit answers a clear 4xx that names it, and nothing past a limit reaches the model."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zstandard
from helpers import png, post, serve_app, serve_cli
from PIL import Image

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.errors import MAX_PROBLEMS, InvalidRequest
from canvasread.server.app import create_app
from canvasread.server.strictjson import json_shape
from canvasread.settings import ImageLimits, ServerSettings
from canvasread.types import Capabilities, DecisionRequest

NOUL = {"type": "noul", "instructions": "Is this about billing?"}
LIMITS = ServerSettings(
    max_questions=3,
    max_options=4,
    max_levels=3,
    max_json_depth=8,
    images=ImageLimits(max_images=2, max_bytes=4000, max_pixels=10_000),
)


class CountingBackend(FunctionBackend):
    """Sees images, and remembers every state it was asked about: nothing refused may show up here."""

    def __init__(self) -> None:
        super().__init__(self._answer, name="counting", capabilities=Capabilities(images=True))
        self.seen: list[Any] = []

    def _answer(self, request: DecisionRequest) -> list[list[float]]:
        self.seen.append(request.state)
        return [[1.0 / len(q.options)] * len(q.options) for q in request.questions]


@pytest.fixture(scope="module")
def backend() -> CountingBackend:
    return CountingBackend()


@pytest.fixture(scope="module")
def limited(backend: CountingBackend) -> Iterator[str]:
    with serve_app(create_app(Decider([backend]), LIMITS)) as base:
        yield base


def body(state: Any = "I was charged twice.", **extra: Any) -> dict[str, Any]:
    return {"model": "jev-latest", "state": state, "questions": {"q": NOUL}, **extra}


def post_raw(base: str, raw: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        base + "/v1/systemone", content=raw, headers={"content-type": "application/json", **headers}, timeout=30
    )


def problem_at(response: httpx.Response, loc: list[Any]) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    assert response.headers["x-typesafe-request-id"]
    entries = [entry for entry in response.json()["detail"] if entry["loc"] == loc]
    assert entries, response.json()["detail"]
    entry: dict[str, Any] = entries[0]
    return entry


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def image_asset(data: bytes, fmt: str = "png") -> dict[str, str]:
    return {"type": "image", "format": fmt, "data_base64": base64.b64encode(data).decode()}


def png_header(width: int, height: int) -> bytes:
    """Just a PNG signature and IHDR declaring a size: what a decompression bomb looks like to a header reader."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk


# ---- questions, options, levels ---------------------------------------------------------


def test_questions_per_request(limited: str) -> None:
    questions = {f"q{i}": NOUL for i in range(4)}
    entry = problem_at(post(limited, {**body(), "questions": questions}), ["body", "questions"])
    assert entry["type"] == "too_long" and entry["ctx"] == {"max_length": 3}
    assert post(limited, {**body(), "questions": dict(list(questions.items())[:3])}).status_code == 200


def test_too_many_questions_are_counted_before_any_is_validated(limited: str) -> None:
    """Four questions of no known type: one problem, the count, not four type errors (validation's work and its
    422 grow with the questions)."""
    questions = {f"q{i}": {"type": "nope"} for i in range(4)}
    response = post(limited, {**body(), "questions": questions})
    assert [entry["loc"] for entry in response.json()["detail"]] == [["body", "questions"]]


def test_a_422_lists_its_first_problems_and_counts_the_rest(backend: CountingBackend) -> None:
    """A body of many bad questions answers with a bounded list, not with many times its own size."""
    questions = {f"q{i}": {"type": "nope"} for i in range(100)}
    with serve_app(create_app(Decider([backend]))) as base:
        detail = post(base, {**body(), "questions": questions}).json()["detail"]
    assert len(detail) == MAX_PROBLEMS + 1
    assert [entry["loc"][:3] for entry in detail[:2]] == [["body", "questions", "q0"], ["body", "questions", "q1"]]
    assert detail[-1]["loc"] == ["body"] and detail[-1]["type"] == "more_problems"
    assert detail[-1]["msg"] == f"and {100 - MAX_PROBLEMS} more problems (a 422 lists {MAX_PROBLEMS})"


def test_options_per_choice(limited: str) -> None:
    too_many = {"team": {"type": "choice", "criteria": {f"o{i}": None for i in range(5)}}}
    entry = problem_at(
        post(limited, {**body(), "questions": too_many}), ["body", "questions", "team", "choice", "criteria"]
    )
    assert entry["ctx"] == {"max_length": 4} and "4 options" in entry["msg"]
    enough = {"team": {"type": "choice", "criteria": {f"o{i}": None for i in range(4)}}}
    assert post(limited, {**body(), "questions": enough}).status_code == 200


def test_levels_per_score(limited: str) -> None:
    too_many = {"anger": {"type": "score", "criteria": ["calm", "annoyed", "angry", "furious"]}}
    entry = problem_at(
        post(limited, {**body(), "questions": too_many}), ["body", "questions", "anger", "score", "criteria"]
    )
    assert entry["ctx"] == {"max_length": 3} and "3 levels" in entry["msg"]


def test_a_server_cannot_raise_the_apis_own_caps() -> None:
    with pytest.raises(ValueError, match="max_options"):
        ServerSettings(max_options=256)
    with pytest.raises(ValueError, match="max_levels"):
        ServerSettings(max_levels=11)
    with pytest.raises(ValueError, match="max_json_depth"):
        ServerSettings(max_json_depth=900)


# ---- JSON nesting, numbers, encodings ----------------------------------------------------


def test_nesting_up_to_the_limit_is_accepted(limited: str, backend: CountingBackend) -> None:
    state = nested(6)  # the body's own object adds one level
    assert json_shape(json.dumps(body(state)).encode()).depth == 7
    assert post(limited, body(state)).status_code == 200
    assert backend.seen[-1] == state


@pytest.mark.parametrize("depth", [9, 100, 100_000])
def test_deeper_nesting_is_422_never_a_recursion_error(limited: str, backend: CountingBackend, depth: int) -> None:
    seen = len(backend.seen)
    raw = b'{"model": "jev-latest", "questions": {"q": {"type": "noul", "instructions": "?"}}, "state": '
    raw += b"[" * depth + b"]" * depth + b"}"
    entry = problem_at(post_raw(limited, raw), ["body"])
    assert entry["type"] == "json_too_deep" and entry["ctx"] == {"max_depth": 8}
    assert len(backend.seen) == seen


def test_depth_is_checked_after_decompression_and_in_multipart(limited: str) -> None:
    raw = json.dumps(body(nested(50))).encode()
    compressed = post_raw(limited, zstandard.ZstdCompressor().compress(raw), **{"content-encoding": "zstd"})
    assert problem_at(compressed, ["body"])["type"] == "json_too_deep"
    multipart = httpx.post(limited + "/v1/systemone", files={"request": (None, raw, "application/json")}, timeout=30)
    assert problem_at(multipart, ["body"])["type"] == "json_too_deep"


def test_brackets_inside_strings_do_not_count(limited: str) -> None:
    assert post(limited, body('[[[[[[[[[[[[[[ {{{{{{{{{{{{ \\" [[[[[[[[')).status_code == 200


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "jev-latest", "state": "x", "seed": 1' + b"0" * 5000 + b', "questions": {"q": {"type": "noul"}}}',
        json.dumps(body()).encode("utf-16"),
        b'{"model": "jev-latest", "state": "\xff\xfe", "questions": {}}',
    ],
    ids=["5000-digit-number", "utf-16", "not-utf-8"],
)
def test_json_that_python_would_accept_but_cannot_answer_is_422(limited: str, raw: bytes) -> None:
    assert problem_at(post_raw(limited, raw), ["body"])["type"] == "json_invalid"


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        (
            b'{"model": "jev-latest", "state": NaN, "questions": {"q": {"type": "noul", "instructions": "?"}}}',
            ["state"],
        ),
        (
            b'{"model": "jev-latest", "state": "x", "questions": {"q": {"type": "score", "criteria": [-Infinity]}}}',
            ["questions", "q", "score", "criteria", 0],
        ),
    ],
    ids=["nan", "infinity"],
)
def test_nan_and_infinity_are_422_where_they_stand(limited: str, raw: bytes, loc: list[Any]) -> None:
    """Python reads them, JSON has neither: the 422 names the field that holds one, not just the body."""
    entry = problem_at(post_raw(limited, raw), ["body", *loc])
    assert entry["type"] == "finite_number" and "NaN or Infinity" in entry["msg"]


# ---- images -----------------------------------------------------------------------------


def test_a_small_png_and_jpeg_are_accepted(limited: str) -> None:
    jpeg = io.BytesIO()
    Image.new("RGB", (8, 8)).save(jpeg, format="JPEG")
    assets = {"<image:a>": image_asset(png()), "<image:b>": image_asset(jpeg.getvalue(), "jpeg")}
    assert post(limited, body("look at <image:a> and <image:b>", assets=assets)).status_code == 200


def test_image_count_is_checked_before_any_image_is_decoded(limited: str) -> None:
    assets = {f"<image:{i}>": image_asset(b"not an image at all") for i in range(3)}
    response = post(limited, body(assets=assets))
    entry = problem_at(response, ["body", "assets"])
    assert "at most 2 images" in entry["msg"]
    assert len(response.json()["detail"]) == 1  # no per-image decode errors: nothing was decoded


def test_image_count_counts_multipart_parts(limited: str) -> None:
    files = {"request": (None, json.dumps(body()), "application/json")}
    files |= {f"asset-{i}": (f"asset-{i}", png(), "image/png") for i in range(3)}
    response = httpx.post(limited + "/v1/systemone", files=files, timeout=30)
    assert "at most 2 images" in problem_at(response, ["body", "assets"])["msg"]


def test_image_bytes_per_image(limited: str) -> None:
    big = png() + b"\0" * 5000
    entry = problem_at(
        post(limited, body(assets={"<image:a>": image_asset(big)})), ["body", "assets", "<image:a>", "data_base64"]
    )
    assert "larger than 4000 bytes (--max-image-bytes)" in entry["msg"]
    files = {
        "request": (
            None,
            json.dumps(body(assets={"<image:a>": {"type": "image", "part": "asset-0"}})),
            "application/json",
        ),
        "asset-0": ("asset-0", big, "image/png"),
    }
    response = httpx.post(limited + "/v1/systemone", files=files, timeout=30)
    assert "larger than 4000 bytes" in problem_at(response, ["body", "assets", "<image:a>", "part"])["msg"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (png(101, 100), "at most 10000 pixels"),
        (png_header(100_000, 100_000), "not a readable PNG or JPEG"),
        (png_header(0, 5), "not a readable PNG or JPEG"),
    ],
    ids=["too-many-pixels", "bomb-header", "zero-width"],
)
def test_image_dimensions_are_checked_from_the_header(limited: str, data: bytes, message: str) -> None:
    response = post(limited, body(assets={"<image:a>": image_asset(data)}))
    assert message in problem_at(response, ["body", "assets", "<image:a>", "data_base64"])["msg"]


def test_only_png_and_jpeg(limited: str) -> None:
    gif = io.BytesIO()
    Image.new("RGB", (4, 4)).save(gif, format="GIF")
    response = post(limited, body(assets={"<image:a>": image_asset(gif.getvalue())}))
    assert "GIF is not supported" in problem_at(response, ["body", "assets", "<image:a>", "data_base64"])["msg"]


# ---- the model's context ------------------------------------------------------------------


class ContextBackend(FunctionBackend):
    """Checks its context in `prepare`, as the canvas backend does with its tokenizer."""

    def prepare(self, request: DecisionRequest) -> DecisionRequest:
        if request.state == "crash in prepare":
            raise RuntimeError("tokenizer bug")
        tokens = len(str(request.state).split())
        if tokens > 5:
            raise InvalidRequest.at(("body", "state"), f"state is {tokens} tokens; the model reads at most 5")
        return request


def test_a_state_past_the_context_is_422_and_frees_its_place_in_line() -> None:
    backend = ContextBackend(lambda r: [[0.5, 0.5] for _ in r.questions])
    decider = Decider([backend])
    with serve_app(create_app(decider)) as base:
        entry = problem_at(post(base, body("one two three four five six")), ["body", "state"])
        assert "at most 5" in entry["msg"]
        assert post(base, body("one two three")).status_code == 200
        failed = post(base, body("crash in prepare"))
        assert failed.status_code == 500
        assert failed.json()["detail"]["request_id"] == failed.headers["x-typesafe-request-id"]
        assert post(base, body("still serving")).status_code == 200
        assert decider.served[0].queue.pending == 0
        assert backend.batches == [1, 1]


# ---- every limit is a flag on `canvasread serve` -----------------------------------------------


def test_serve_flags_set_every_limit_and_each_refusal_names_its_flag() -> None:
    flags = ("--max-questions", "2", "--max-options", "3", "--max-levels", "2", "--max-json-depth", "5")
    flags += ("--max-json-items", "1000", "--max-images", "1", "--max-image-bytes", "100000")
    flags += ("--max-image-pixels", "100", "--max-body-bytes", "8192")
    with serve_cli(*flags) as base:

        def refused_by(sent: Any, loc: list[Any]) -> str:
            return str(problem_at(post(base, sent), loc)["msg"])

        three = {f"q{i}": NOUL for i in range(3)}
        assert "--max-questions" in refused_by({**body(), "questions": three}, ["body", "questions"])
        choice = {"c": {"type": "choice", "criteria": {"a": None, "b": None, "c": None, "d": None}}}
        at = ["body", "questions", "c", "choice", "criteria"]
        assert "--max-options" in refused_by({**body(), "questions": choice}, at)
        score = {"s": {"type": "score", "criteria": ["a", "b", "c"]}}
        assert "--max-levels" in refused_by(
            {**body(), "questions": score}, ["body", "questions", "s", "score", "criteria"]
        )
        assert "--max-json-depth" in refused_by(body(nested(5)), ["body"])
        assert "--max-json-items" in refused_by(body(list(range(1001))), ["body"])
        two_images = {"<image:a>": image_asset(png()), "<image:b>": image_asset(png())}
        assert "at most 1 images per request (--max-images)" in refused_by(body(assets=two_images), ["body", "assets"])
        big_image = {"<image:a>": image_asset(png(11, 10))}
        assert "at most 100 pixels are accepted (--max-image-pixels)" in post(base, body(assets=big_image)).text
        too_large = post(base, body("x" * 9000))
        assert too_large.status_code == 413 and "--max-body-bytes" in too_large.json()["detail"]["message"]
        assert post(base, body()).status_code == 200
