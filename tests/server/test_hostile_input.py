"""Hostile bodies (issue 16): each refused with a 4xx in the API's shape at the field it concerns, never a 500."""

from __future__ import annotations

import base64
import gzip
import io
import json
import struct
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zstandard
from helpers import serve_app
from PIL import Image

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider
from canvasread.errors import BadRequest, InvalidRequest
from canvasread.server import handlers
from canvasread.server.multipart import split_multipart
from canvasread.server.strictjson import json_shape
from canvasread.settings import ImageLimits, ServerSettings
from canvasread.types import Capabilities, DecisionRequest

NOUL = {"type": "noul", "instructions": "Is this about billing?"}
SETTINGS = ServerSettings(images=ImageLimits(max_images=2, max_pixels=100_000), max_json_items=5000)


class Recorder(FunctionBackend):
    """Sees images and records every state it is asked about: nothing refused may reach it."""

    def __init__(self) -> None:
        super().__init__(self._answer, name="recorder", capabilities=Capabilities(images=True))
        self.states: list[Any] = []

    def _answer(self, request: DecisionRequest) -> list[list[float]]:
        self.states.append(request.state)
        return [[1.0 / len(q.options)] * len(q.options) for q in request.questions]


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def base(recorder: Recorder) -> Iterator[str]:
    from canvasread.server.app import create_app

    with serve_app(create_app(Decider([recorder]), SETTINGS)) as url:
        yield url


def raw_post(base: str, raw: bytes, content_type: str = "application/json", **headers: str) -> httpx.Response:
    return httpx.post(
        base + "/v1/systemone", content=raw, headers={"content-type": content_type, **headers}, timeout=30
    )


def body_text(state: str = '"I was charged twice."', questions: str | None = None, extra: str = "") -> bytes:
    questions = questions or json.dumps({"q": NOUL})
    return f'{{"model": "jev-latest", "state": {state}, "questions": {questions}{extra}}}'.encode()


def problems(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 422, response.text
    assert response.headers["x-typesafe-request-id"]
    detail: list[dict[str, Any]] = response.json()["detail"]
    return detail


# ---- 1: lone surrogates --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        (body_text(state='"\\ud800"'), ["body", "state"]),
        (body_text(state='{"note": ["ok", "\\udfff tail"]}'), ["body", "state", "note", 1]),
        (body_text(questions='{"\\ud800": {"type": "noul", "instructions": "x"}}'), ["body", "questions", "\\ud800"]),
        (
            body_text(questions='{"q": {"type": "choice", "criteria": {"a": null, "b\\udbff": null}}}'),
            ["body", "questions", "q", "choice", "criteria", "b\\udbff"],
        ),
        (body_text(questions='{"q": {"type": "score", "criteria": ["low", "\\ud800"]}}'), None),
    ],
)
def test_lone_surrogates_are_422_at_parsing(base: str, recorder: Recorder, raw: bytes, loc: list[Any] | None) -> None:
    seen = len(recorder.states)
    detail = problems(raw_post(base, raw))
    assert all(entry["type"] == "string_unicode" for entry in detail)
    if loc is not None:
        assert loc in [entry["loc"] for entry in detail]
    assert len(recorder.states) == seen  # refused before the model


def test_a_surrogate_pair_is_an_ordinary_character(base: str, recorder: Recorder) -> None:
    response = raw_post(base, body_text(state='"refund \\ud83d\\ude00"'))
    assert response.status_code == 200, response.text
    assert recorder.states[-1] == "refund \U0001f600"


def test_a_key_named_twice_is_422_naming_it(base: str, recorder: Recorder) -> None:
    """Not the last value kept silently: which `type` the caller meant is not the server's guess."""
    seen = len(recorder.states)
    questions = '{"q": {"type": "noul", "instructions": "Refund?", "type": "choice"}}'
    [entry] = problems(raw_post(base, body_text(questions=questions)))
    assert entry["type"] == "json_duplicate_key" and entry["loc"] == ["body"] and "'type'" in entry["msg"]
    assert len(recorder.states) == seen


# ---- 2: non-finite numbers -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        (body_text(state="1e999"), ["body", "state"]),
        (body_text(state='{"x": -1e999}'), ["body", "state", "x"]),
        (body_text(extra=', "diagnostics": 1e999'), ["body", "diagnostics"]),
        (body_text(extra=', "min_confidence": 1e400'), ["body", "min_confidence"]),
        (body_text(questions='{"q": {"type": "score", "criteria": {"1e999": null, "2": null}}}'), None),
        (
            body_text(questions='{"q": {"type": "score", "criteria": [1e999, 2]}}'),
            ["body", "questions", "q", "score", "criteria", 0],
        ),
        (
            body_text(questions='{"q": {"type": "choice", "criteria": {"a": null}, "min_confidence": NaN}}'),
            ["body", "questions", "q", "choice", "min_confidence"],
        ),
        (
            body_text(questions='{"q": {"type": "maybe", "min_confidence": -Infinity}}'),
            ["body", "questions", "q", "min_confidence"],
        ),
    ],
)
def test_numbers_past_a_float_are_422(base: str, recorder: Recorder, raw: bytes, loc: list[Any] | None) -> None:
    seen = len(recorder.states)
    response = raw_post(base, raw)
    if loc is None:  # a key is a string: whatever the schema says of it, no 500
        assert response.status_code in (200, 422), response.text
        return
    detail = problems(response)
    assert loc in [entry["loc"] for entry in detail]
    assert len(recorder.states) == seen


def test_large_finite_numbers_are_accepted(base: str, recorder: Recorder) -> None:
    assert raw_post(base, body_text(state='{"x": 1.7e308, "y": -1e-400}')).status_code == 200
    assert recorder.states[-1] == {"x": 1.7e308, "y": -0.0}


# ---- 3, 7: multipart -----------------------------------------------------------------------------


def multipart(boundary: str, parts: list[tuple[str, bytes]]) -> bytes:
    chunks = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + data + b"\r\n"
        for name, data in parts
    ]
    return b"".join(chunks) + f"--{boundary}--\r\n".encode()


@pytest.mark.parametrize("length", [71, 257, 5000])
def test_long_multipart_boundaries_are_4xx(base: str, length: int) -> None:
    boundary = "b" * length
    raw = multipart(boundary, [("request", body_text())])
    response = raw_post(base, raw, f"multipart/form-data; boundary={boundary}")
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert response.json()["detail"]["error_type"] == "bad_request"


def test_part_count_is_checked_while_parsing() -> None:
    parts = [("request", b"{}"), ("asset-0", b"x"), ("asset-1", b"y")]
    nameless_tail = b"--B\r\n\r\nno name\r\n--B--\r\n"
    raw = multipart("B", parts).removesuffix(b"--B--\r\n") + nameless_tail
    # Enough parts allowed: the parser reaches the nameless part at the end, and says so.
    with pytest.raises(BadRequest, match="no name"):
        split_multipart(raw, b"B", max_parts=10)
    # Two allowed: the third part stops the parser before it reaches the tail.
    with pytest.raises(InvalidRequest) as refused:
        split_multipart(raw, b"B", max_parts=2)
    assert refused.value.problems[0].loc == ("body", "assets")


def test_half_a_million_empty_parts_are_refused_at_the_first_one_too_many(base: str) -> None:
    raw = multipart("B", [("request", body_text())] + [(f"p{i}", b"") for i in range(500_000)])
    packed = zstandard.ZstdCompressor().compress(raw)
    response = raw_post(base, packed, "multipart/form-data; boundary=B", **{"content-encoding": "zstd"})
    assert ["body", "assets"] in [entry["loc"] for entry in problems(response)]


def test_bodies_are_parsed_off_the_event_loop(base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A parse held in its thread does not stop the event loop: /health answers while it is held (a compressed
    body always parses in a thread; only a small plain JSON one is parsed on the loop)."""
    entered, release = threading.Event(), threading.Event()
    parse = handlers.parse_request

    def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(60)
        return parse(*args, **kwargs)

    monkeypatch.setattr(handlers, "parse_request", held)
    packed = zstandard.ZstdCompressor().compress(body_text())
    with httpx.Client(base_url=base, timeout=60) as client:
        outcome: list[httpx.Response] = []
        poster = threading.Thread(target=lambda: outcome.append(raw_post(base, packed, **{"content-encoding": "zstd"})))
        poster.start()
        try:
            assert entered.wait(30)
            assert client.get("/health", timeout=10).status_code == 200
        finally:
            release.set()
            poster.join(60)
    assert outcome[0].status_code == 200


# ---- 4: images whose headers lie -----------------------------------------------------------------


def png(width: int = 8, height: int = 8) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(buffer, format="PNG")
    return buffer.getvalue()


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_claiming(width: int, height: int) -> bytes:
    """A well-formed PNG (valid CRCs) whose one data chunk holds far fewer pixels than its header declares."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 100)) + chunk(b"IEND", b"")
    )


def jpeg_size_marker_only() -> bytes:
    sof = struct.pack(">BHHHB", 8, 64, 64, 1, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + b"\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof + b"\xff\xd9"


@pytest.mark.parametrize(
    "data",
    [png()[:-30], png()[: len(png()) // 2], png_claiming(300, 300), jpeg_size_marker_only()],
    ids=["truncated-end", "truncated-half", "short-data", "jpeg-marker-only"],
)
def test_images_whose_headers_lie_are_422_at_the_asset(base: str, recorder: Recorder, data: bytes) -> None:
    seen = len(recorder.states)
    asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(data).decode()}
    raw = body_text(extra=f', "assets": {json.dumps({"img": asset})}')
    detail = problems(raw_post(base, raw))
    assert ["body", "assets", "img", "data_base64"] in [entry["loc"] for entry in detail]
    assert len(recorder.states) == seen


def test_an_honest_image_is_accepted(base: str) -> None:
    asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(png()).decode()}
    assert raw_post(base, body_text(extra=f', "assets": {json.dumps({"img": asset})}')).status_code == 200


# ---- 8: parsed size ------------------------------------------------------------------------------


def test_items_are_counted_outside_strings_only() -> None:
    assert json_shape(b'[{}, {"a": [1, 2]}]').items == 7  # 4 containers, 2 commas, 1 colon
    assert json_shape(b'["[{,:}]", "\\"[,"]').items == 2


def test_a_body_of_many_small_objects_is_422_before_parsing(base: str, recorder: Recorder) -> None:
    seen = len(recorder.states)
    bomb = zstandard.ZstdCompressor().compress(body_text(state="[" + ",".join(["{}"] * 10_000) + "]"))
    detail = problems(raw_post(base, bomb, **{"content-encoding": "zstd"}))
    assert detail[0]["type"] == "json_too_large" and detail[0]["ctx"] == {"max_items": 5000}
    assert len(recorder.states) == seen


# ---- 12: echoed inputs ---------------------------------------------------------------------------


def test_a_422_echoes_a_bounded_input(base: str) -> None:
    raw = json.dumps({"state": "x" * 1_000_000, "questions": {f"q{i}": NOUL for i in range(500)}}).encode()
    response = raw_post(base, raw)
    detail = problems(response)
    assert ["body", "model"] in [entry["loc"] for entry in detail]
    assert len(response.content) < 16_384


# ---- 14: compression -----------------------------------------------------------------------------


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=False).compress(data)


@pytest.mark.parametrize(
    ("encoding", "raw", "says"),
    [  # named ids and gzip's mtime 0: pytest-xdist's workers must collect the same test names
        pytest.param("zstd", zstd(body_text())[:-8], "truncated", id="zstd-truncated"),
        pytest.param("zstd", zstd(body_text()) + zstd(b"trailing"), "after its frame", id="zstd-trailing"),
        pytest.param("gzip", gzip.compress(body_text(), mtime=0)[:-6], "truncated", id="gzip-truncated"),
        pytest.param("gzip", gzip.compress(body_text(), mtime=0) + b"garbage", "after its end", id="gzip-garbage"),
        pytest.param(
            "gzip",
            gzip.compress(body_text(), mtime=0) + gzip.compress(b"{}", mtime=0),
            "after its end",
            id="gzip-two-members",
        ),
        pytest.param("deflate", zlib.compress(body_text())[:-3], "truncated", id="deflate-truncated"),
    ],
)
def test_incomplete_or_padded_compression_is_400(base: str, encoding: str, raw: bytes, says: str) -> None:
    response = raw_post(base, raw, **{"content-encoding": encoding})
    assert response.status_code == 400, response.text
    assert says in response.json()["detail"]["message"]


def test_complete_streams_are_decoded(base: str) -> None:
    for encoding, raw in [("zstd", zstd(body_text())), ("gzip", gzip.compress(body_text()))]:
        assert raw_post(base, raw, **{"content-encoding": encoding}).status_code == 200


# ---- 17: media types -----------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "", "application/jsonx"])
def test_only_json_or_multipart_bodies_are_read(base: str, recorder: Recorder, content_type: str) -> None:
    seen = len(recorder.states)
    response = httpx.post(
        base + "/v1/systemone", content=body_text(), headers={"content-type": content_type} if content_type else {}
    )
    assert response.status_code == 415, response.text
    assert response.json()["detail"]["error_type"] == "unsupported_media_type"
    assert len(recorder.states) == seen


def test_json_with_a_charset_is_json(base: str) -> None:
    assert raw_post(base, body_text(), "application/json; charset=utf-8").status_code == 200
    assert raw_post(base, body_text(), 'application/json; charset="UTF-8"').status_code == 200


@pytest.mark.parametrize("charset", ["latin-1", "ISO-8859-1", "utf-16"])
def test_json_declared_in_another_charset_is_refused_not_misread(base: str, recorder: Recorder, charset: str) -> None:
    """Read as UTF-8, its non-ASCII text would change silently (`é` in latin-1 is one byte UTF-8 does not read as
    `é`): the declared charset is refused by name, before any model reads the request."""
    seen = len(recorder.states)
    raw = body_text('"caf\u00e9"').decode().encode(charset)
    response = raw_post(base, raw, f"application/json; charset={charset}")
    assert response.status_code == 415, response.text
    assert charset.lower() in response.json()["detail"]["message"] and "UTF-8" in response.json()["detail"]["message"]
    assert len(recorder.states) == seen
