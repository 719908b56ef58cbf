"""Reading a System One request body the way the official SDK sends it.

The SDK zstd-compresses bodies of 1 KiB and more (multipart ones included)
and switches to `multipart/form-data` when images are attached: the JSON
body is the part named `request`, images follow as `asset-0`, `asset-1`...
Every size is bounded before and after decompression, so a small compressed
body cannot expand without limit.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import zstandard
from python_multipart import MultipartParser
from python_multipart.multipart import parse_options_header

from canvasread.errors import BadRequest, FieldProblem, InvalidRequest, PayloadTooLarge
from canvasread.server.limits import check_json_depth
from canvasread.settings import DEFAULT_MAX_JSON_DEPTH


@dataclass(frozen=True)
class RequestBody:
    """The decoded JSON payload and, for multipart requests, the raw bytes of every other part."""

    payload: Any
    parts: dict[str, bytes]


async def read_limited(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """Collect a streamed body, refusing it as soon as it passes `limit` bytes."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        if len(buffer) > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
    return bytes(buffer)


def decode_content(raw: bytes, encoding: str, limit: int) -> bytes:
    """Undo `Content-Encoding` (zstd, gzip, deflate or identity) with a cap on the decoded size."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    try:
        if encoding == "zstd":
            with zstandard.ZstdDecompressor().stream_reader(raw) as reader:
                decoded = reader.read(limit + 1)
        elif encoding in ("gzip", "x-gzip", "deflate"):
            window = zlib.MAX_WBITS | 16 if "gzip" in encoding else zlib.MAX_WBITS
            decompressor = zlib.decompressobj(window)
            decoded = decompressor.decompress(raw, limit + 1)
        else:
            raise BadRequest(f"unsupported Content-Encoding {encoding!r}; send zstd, gzip or none")
    except (zstandard.ZstdError, zlib.error) as error:
        raise BadRequest(f"the body is not valid {encoding} data: {error}") from None
    if len(decoded) > limit:
        raise PayloadTooLarge(f"decoded request body is larger than {limit} bytes")
    return decoded


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def parse_json(data: bytes, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> Any:
    """Strict JSON: UTF-8, no NaN/Infinity (they could not be sent back), nesting measured before parsing."""
    check_json_depth(data, max_depth)
    try:
        return json.loads(data.decode("utf-8-sig"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:  # decode errors, bad JSON, NaN, integers past 4300 digits
        raise InvalidRequest([FieldProblem(("body",), f"JSON decode error: {error}", "json_invalid")]) from None


def parse_body(data: bytes, content_type: str, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> RequestBody:
    """JSON bodies pass through; multipart bodies are split into the JSON `request` part and the rest."""
    media_type, options = parse_options_header(content_type or "application/json")
    if media_type != b"multipart/form-data":
        return RequestBody(parse_json(data, max_depth), {})
    boundary = options.get(b"boundary")
    if not boundary:
        raise BadRequest("multipart/form-data without a boundary")
    parts = _split_multipart(data, boundary)
    if "request" not in parts:
        raise InvalidRequest(
            [FieldProblem(("body", "request"), "multipart body has no part named 'request'", "missing")]
        )
    request = parts.pop("request")
    return RequestBody(parse_json(request, max_depth), parts)


def _split_multipart(data: bytes, boundary: bytes) -> dict[str, bytes]:
    parts: dict[str, bytes] = {}
    state: dict[str, Any] = {
        "name": None,
        "chunks": [],
        "header_field": b"",
        "header_value": b"",
        "headers": {},
    }

    def on_part_begin() -> None:
        state.update(name=None, chunks=[], headers={})

    def on_header_field(buf: bytes, start: int, end: int) -> None:
        state["header_field"] += buf[start:end]

    def on_header_value(buf: bytes, start: int, end: int) -> None:
        state["header_value"] += buf[start:end]

    def on_header_end() -> None:
        state["headers"][state["header_field"].lower()] = state["header_value"]
        state.update(header_field=b"", header_value=b"")

    def on_headers_finished() -> None:
        _, options = parse_options_header(state["headers"].get(b"content-disposition", b""))
        name = options.get(b"name")
        state["name"] = name.decode("utf-8", "replace") if name else None

    def on_part_data(buf: bytes, start: int, end: int) -> None:
        state["chunks"].append(buf[start:end])

    def on_part_end() -> None:
        name = state["name"]
        if name is None:
            raise BadRequest("a multipart part has no name")
        if name in parts:
            raise InvalidRequest([FieldProblem(("body", name), f"multipart part {name!r} appears twice")])
        parts[name] = b"".join(state["chunks"])

    callbacks: Any = {
        "on_part_begin": on_part_begin,
        "on_header_field": on_header_field,
        "on_header_value": on_header_value,
        "on_header_end": on_header_end,
        "on_headers_finished": on_headers_finished,
        "on_part_data": on_part_data,
        "on_part_end": on_part_end,
    }
    parser = MultipartParser(boundary, callbacks)
    try:
        parser.write(data)
        parser.finalize()
    except (BadRequest, InvalidRequest):
        raise
    except Exception as error:  # python-multipart raises several unrelated error types on broken input
        raise BadRequest(f"malformed multipart body: {error}") from None
    return parts
