"""Schema fuzzing of the live server from its own /openapi.json (schemathesis): no 5xx, nothing off the schema.

The real `canvasread serve` process runs with an API key, so the fuzzer also
checks that every operation declared as secured refuses requests without it.
Valid and invalid bodies are generated (`--mode all`, coverage and fuzzing
phases) and every check runs except `positive_data_acceptance`: the schema
cannot say that `data_base64` must hold a PNG or JPEG, or that a noul needs
instructions or a described side, so schema-valid requests are rightly
refused with a 422. CI runs a few hundred cases; `make fuzz` thousands
(CANVASREAD_FUZZ_EXAMPLES). A failure prints schemathesis's report, with a
curl command and the seed to replay it.

What a schema cannot express is fuzzed with hypothesis on raw bytes: lone
surrogates and numbers past a float anywhere in a body, odd multipart
boundaries, and real images made to lie (cut short, a byte flipped, the size
in the header inflated). None may be a 5xx.
"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import cli_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

KEY = "fuzz-key"
EXAMPLES = os.environ.get("CANVASREAD_FUZZ_EXAMPLES", "100")
TESTS = Path(__file__).parent
JSON_HEADERS = {"content-type": "application/json"}


def test_the_server_holds_to_its_own_schema(tmp_path: Path) -> None:
    with cli_process("--api-key", KEY) as server:
        fuzz = subprocess.run(
            [
                *(sys.executable, "-m", "schemathesis.cli", "run", server.base + "/openapi.json"),
                *("--header", f"Authorization: Bearer {KEY}", "--request-timeout", "60", "--workers", "1"),
                *("--checks", "all", "--exclude-checks", "positive_data_acceptance", "--max-examples", EXAMPLES),
                "--no-color",
            ],
            env={**os.environ, "SCHEMATHESIS_HOOKS": "fuzz_hooks", "PYTHONPATH": str(TESTS)},
            cwd=tmp_path,  # schemathesis keeps its example database in the working directory
            capture_output=True,
            text=True,
            timeout=3600,
        )
        log = server.output()
    assert fuzz.returncode == 0, fuzz.stdout[-20000:] + fuzz.stderr[-5000:]
    assert "Traceback" not in log, log[-20000:]


# ---- hostile bodies the schema cannot express (issue 16): raw bytes, never a 5xx -----------------

NOUL = {"type": "noul", "instructions": "Is this about billing?"}
# Where a hostile value goes: the state, inside it, a question id, a choice label, a score level, an extension.
PLACES = ("state", "nested", "question_id", "label", "level", "diagnostics", "min_confidence")


def hostile_body(place: str, value: str) -> bytes:
    """A valid request with `value` (raw JSON text: a string or a number) written at `place`."""
    criteria_label, level, question_id, state = '"a"', '"low"', '"q"', '"ticket"'
    extra = ""
    if place == "state":
        state = value
    elif place == "nested":
        state = f'{{"items": [1, {{"x": {value}}}]}}'
    elif place == "question_id" and value.startswith('"'):
        question_id = value
    elif place == "label" and value.startswith('"'):
        criteria_label = value
    elif place == "level":
        level = value
    else:
        extra = f', "{place}": {value}'
    choice = f'{{"type": "choice", "criteria": {{{criteria_label}: null, "b": null}}}}'
    score = f'{{"type": "score", "criteria": [{level}, "high"]}}'
    questions = f'{{{question_id}: {json.dumps(NOUL)}, "c": {choice}, "s": {score}}}'
    return f'{{"model": "jev-latest", "state": {state}, "questions": {questions}{extra}}}'.encode()


surrogates = st.builds(
    lambda prefix, code, suffix: json.dumps(prefix)[:-1] + f"\\u{code:04x}" + json.dumps(suffix)[1:],
    st.text(max_size=8),
    st.integers(0xD800, 0xDFFF),
    st.text(max_size=8),
)
non_finite = st.builds(
    lambda sign, mantissa, exponent: f"{sign}{mantissa}e{exponent}",
    st.sampled_from(["", "-"]),
    st.sampled_from(["1", "9.99", "0.5"]),
    st.integers(309, 100_000),
)
# Boundary characters RFC 2046 allows, and some it does not; lengths around the 70 it allows and 256 parsers do.
boundaries = st.text(alphabet="abcXYZ0189'()+_,-./:=? \"\\\t\u00e9", min_size=0, max_size=600) | st.integers(
    60, 600
).map(lambda n: "b" * n)


def lying_image(kind: str, data: bytes, cut: int, flip: int) -> bytes:
    """A real image made to lie: cut short, a byte flipped, or the size in its header inflated."""
    if kind == "cut":
        return data[: cut % len(data)]
    if kind == "flip":
        index = flip % len(data)
        return data[:index] + bytes([data[index] ^ 0xFF]) + data[index + 1 :]
    return data[:16] + struct.pack(">II", 3000, 3000) + data[24:]  # PNG IHDR width and height; CRC now wrong


def real_image(fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (24, 16), "teal").save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[str]:
    with cli_process() as server:
        yield server.base


def assert_4xx_or_ok(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    assert response.headers["x-typesafe-request-id"]
    if response.status_code >= 400:
        detail = response.json()["detail"]
        assert isinstance(detail, list) or {"message", "error_type", "request_id"} <= set(detail)


HOSTILE = settings(max_examples=max(20, int(EXAMPLES) // 2), deadline=None, suppress_health_check=list(HealthCheck))


@HOSTILE
@given(place=st.sampled_from(PLACES), value=surrogates | non_finite)
def test_surrogates_and_non_finite_numbers_are_never_a_5xx(hostile_server: str, place: str, value: str) -> None:
    response = httpx.post(
        hostile_server + "/v1/systemone", content=hostile_body(place, value), headers=JSON_HEADERS, timeout=60
    )
    assert_4xx_or_ok(response)
    assert response.status_code == 422, response.text[:500]  # wherever it is written, the body is refused


@HOSTILE
@given(boundary=boundaries)
def test_odd_multipart_boundaries_are_never_a_5xx(hostile_server: str, boundary: str) -> None:
    part = hostile_body("state", '"ticket"')
    raw = f'--{boundary}\r\nContent-Disposition: form-data; name="request"\r\n\r\n'.encode() + part
    raw += f"\r\n--{boundary}--\r\n".encode()
    quoted = '"' + boundary.replace("\\", "\\\\").replace('"', '\\"') + '"'
    headers = {"content-type": f"multipart/form-data; boundary={quoted}".encode()}
    response = httpx.post(hostile_server + "/v1/systemone", content=raw, headers=headers, timeout=60)
    assert_4xx_or_ok(response)


@HOSTILE
@given(
    fmt=st.sampled_from(["PNG", "JPEG"]),
    kind=st.sampled_from(["cut", "flip", "inflate"]),
    cut=st.integers(0, 10_000),
    flip=st.integers(0, 10_000),
)
def test_images_whose_headers_lie_are_never_a_5xx(
    hostile_server: str, fmt: str, kind: str, cut: int, flip: int
) -> None:
    data = lying_image(kind, real_image(fmt), cut, flip)
    asset = {"type": "image", "format": fmt.lower(), "data_base64": base64.b64encode(data).decode()}
    body = {"model": "jev-latest", "state": "see <img>", "questions": {"q": NOUL}, "assets": {"img": asset}}
    response = httpx.post(hostile_server + "/v1/systemone", json=body, timeout=60)
    assert_4xx_or_ok(response)
