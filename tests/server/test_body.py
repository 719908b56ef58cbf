"""Body decoding without a server: content encodings with capped output, strict JSON, multipart as the SDK sends it."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator

import pytest
import zstandard

from canvasread.errors import BadRequest, InvalidRequest, PayloadTooLarge
from canvasread.server.body import decode_content, parse_body, read_limited
from canvasread.server.strictjson import parse_json
from canvasread.settings import ServerSettings

SETTINGS = ServerSettings()

PAYLOAD = {"model": "jev-latest", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}
RAW = json.dumps(PAYLOAD).encode()


def multipart(boundary: str, *parts: tuple[str, bytes]) -> bytes:
    lines = []
    for name, data in parts:
        lines.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + data + b"\r\n")
    return b"".join(lines) + f"--{boundary}--\r\n".encode()


def test_read_limited_stops_past_the_limit() -> None:
    async def chunks(count: int) -> AsyncIterator[bytes]:
        for _ in range(count):
            yield b"x" * 10

    assert asyncio.run(read_limited(chunks(3), 30, 10.0)) == b"x" * 30
    with pytest.raises(PayloadTooLarge):
        asyncio.run(read_limited(chunks(4), 30, 10.0))


@pytest.mark.parametrize("encoding", ["zstd", "gzip", "x-gzip", " ZSTD ", "identity", ""])
def test_every_encoding_the_sdk_may_send_round_trips(encoding: str) -> None:
    name = encoding.strip().lower()
    encoded = {"zstd": zstandard.compress, "gzip": gzip.compress, "x-gzip": gzip.compress}.get(name, bytes)(RAW)
    assert decode_content(encoded, encoding, limit=len(RAW)) == RAW


def test_decoding_is_capped_so_a_small_body_cannot_expand_without_limit() -> None:
    bomb = zstandard.compress(b"[" + b"{}," * 1_000_000 + b"{}]")
    assert len(bomb) < 10_000
    with pytest.raises(PayloadTooLarge):
        decode_content(bomb, "zstd", limit=100_000)
    with pytest.raises(PayloadTooLarge):
        decode_content(gzip.compress(b"0" * 200_000), "gzip", limit=100_000)


def test_unknown_or_broken_encodings_are_bad_requests() -> None:
    with pytest.raises(BadRequest, match="unsupported Content-Encoding"):
        decode_content(RAW, "br", limit=10_000)
    with pytest.raises(BadRequest):
        decode_content(b"not zstd at all", "zstd", limit=10_000)
    with pytest.raises(BadRequest):
        decode_content(b"not gzip at all", "gzip", limit=10_000)


def test_json_is_strict() -> None:
    assert parse_json(RAW, 64, 1_000_000) == PAYLOAD
    assert parse_json(b"\xef\xbb\xbf" + RAW, 64, 1_000_000) == PAYLOAD  # a UTF-8 byte order mark is tolerated
    for broken in (b"{", b'{"s": "\xff"}'):
        with pytest.raises(InvalidRequest) as caught:
            parse_json(broken, 64, 1_000_000)
        assert caught.value.problems[0].type == "json_invalid"
    for constant in (b'{"state": NaN}', b'{"state": Infinity}'):
        with pytest.raises(InvalidRequest) as caught:
            parse_json(constant, 64, 1_000_000)
        assert [(p.loc, p.type) for p in caught.value.problems] == [(("body", "state"), "finite_number")]


def test_nesting_is_measured_before_parsing() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_json(b"[" * 10 + b"]" * 10, 5, 1_000_000)
    assert caught.value.problems[0].type == "json_too_deep"
    assert parse_json(b'["[[[[[[[[[["]', 5, 1_000_000) == ["[[[[[[[[[["]  # brackets inside strings do not count


def test_json_bodies_pass_through_whatever_the_content_type_says() -> None:
    assert parse_body(RAW, "application/json", SETTINGS).payload == PAYLOAD
    assert parse_body(RAW, "", SETTINGS).parts == {}


def test_multipart_splits_the_request_part_from_the_assets() -> None:
    data = multipart("b0und", ("request", RAW), ("asset-0", b"\x89PNG..."))
    body = parse_body(data, "multipart/form-data; boundary=b0und", SETTINGS)
    assert body.payload == PAYLOAD and body.parts == {"asset-0": b"\x89PNG..."}


def test_multipart_mistakes_name_the_part() -> None:
    content_type = "multipart/form-data; boundary=b0und"
    with pytest.raises(InvalidRequest) as missing:
        parse_body(multipart("b0und", ("asset-0", b"x")), content_type, SETTINGS)
    assert missing.value.problems[0].loc == ("body", "request")
    with pytest.raises(InvalidRequest) as twice:
        parse_body(multipart("b0und", ("request", RAW), ("asset-0", b"x"), ("asset-0", b"y")), content_type, SETTINGS)
    assert twice.value.problems[0].loc == ("body", "asset-0")
    with pytest.raises(BadRequest, match="boundary"):
        parse_body(RAW, "multipart/form-data", SETTINGS)


def test_an_object_naming_a_key_twice_is_refused_naming_the_key() -> None:
    """Python's parser would keep the last value without a word (which `type` was meant?)."""
    for duplicated, key in (
        (b'{"state": "a", "state": "b"}', "state"),
        (b'{"questions": {"q": {"type": "noul", "type": "choice"}}}', "type"),
    ):
        with pytest.raises(InvalidRequest) as caught:
            parse_json(duplicated, 64, 1_000_000)
        [problem] = caught.value.problems
        assert problem.type == "json_duplicate_key" and f"the key {key!r} appears twice" in problem.msg
    assert parse_json(b'{"a": {"k": 1}, "b": {"k": 2}}', 64, 1_000_000) == {"a": {"k": 1}, "b": {"k": 2}}
