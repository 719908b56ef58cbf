"""Reading a System One request body the way the official SDK sends it.

The SDK zstd-compresses bodies of 1 KiB and more (multipart ones included)
and switches to `multipart/form-data` when images are attached: the JSON
body is the part named `request`, images follow as `asset-0`, `asset-1`...
Every size is bounded before and after decompression, so a small compressed
body cannot expand without limit; the declared length is checked before a
byte is read, and the whole body must arrive within the body timeout.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import zstandard
from python_multipart.multipart import parse_options_header

from canvasread.errors import (
    BadRequest,
    FieldProblem,
    InvalidRequest,
    PayloadTooLarge,
    RequestTimeout,
    UnsupportedMediaType,
)
from canvasread.server.multipart import split_multipart
from canvasread.server.strictjson import parse_json
from canvasread.settings import ServerSettings

JSON_TYPE = b"application/json"
MULTIPART_TYPE = b"multipart/form-data"
# A JSON body is read as UTF-8: a body declared in another charset is refused rather than read as UTF-8 (its
# non-ASCII text would change silently). ASCII is UTF-8's first half.
JSON_CHARSETS = (b"utf-8", b"utf8", b"us-ascii", b"ascii")
# The flag that raises the body limit, named in every 413 of it.
BODY_FLAG = "--max-body-bytes"


@dataclass(frozen=True)
class RequestBody:
    """The decoded JSON payload and, for multipart requests, the raw bytes of every other part."""

    payload: Any
    parts: dict[str, bytes]


def check_headers(headers: Mapping[str, str], limit: int) -> None:
    """Refuse before reading: a declared length over the limit (413), a body that is not JSON or multipart (415).

    Requiring the media type also keeps browsers honest: a cross-origin page can
    send `text/plain` or a form without a CORS preflight, but not JSON (forms are
    `origin.check_form_origin`'s to refuse).
    """
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; at most {limit} are accepted ({BODY_FLAG})")
    media_type, options = parse_options_header(headers.get("content-type", ""))
    if media_type not in (JSON_TYPE, MULTIPART_TYPE):
        shown = media_type.decode("latin-1")[:100] or "none"
        raise UnsupportedMediaType(f"Content-Type {shown!r}; send application/json or multipart/form-data")
    charset = options.get(b"charset", b"utf-8").lower()
    if media_type == JSON_TYPE and charset not in JSON_CHARSETS:
        shown = charset.decode("latin-1")[:40]
        raise UnsupportedMediaType(f"JSON in charset {shown!r}; send it as UTF-8 (RFC 8259), charset utf-8 or none")


def is_multipart(headers: Mapping[str, str]) -> bool:
    """Whether the body is a form (`multipart/form-data`): the one accepted type a page may post cross-site."""
    media_type, _ = parse_options_header(headers.get("content-type", ""))
    return bool(media_type == MULTIPART_TYPE)


async def read_limited(chunks: AsyncIterator[bytes], limit: int, timeout_s: float) -> bytes:
    """Collect a streamed body within `timeout_s`, refusing it as soon as it passes `limit` bytes."""
    buffer = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in chunks:
                buffer += chunk
                if len(buffer) > limit:
                    raise PayloadTooLarge(f"request body is larger than {limit} bytes ({BODY_FLAG})")
    except TimeoutError:
        raise RequestTimeout(f"the body did not arrive within {timeout_s:g}s (--body-timeout)") from None
    return bytes(buffer)


def decode_content(raw: bytes, encoding: str, limit: int) -> bytes:
    """Undo `Content-Encoding` (zstd, gzip, deflate or identity): one whole stream, at most `limit` bytes decoded.

    A truncated stream, bytes after its end or a second zstd frame are a 400:
    a body is one complete stream, and what a parser would silently drop is
    not read as part of the request.
    """
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding == "zstd":
        return _decode_zstd(raw, limit)
    if encoding in ("gzip", "x-gzip", "deflate"):
        return _decode_zlib(raw, encoding, limit)
    raise BadRequest(f"unsupported Content-Encoding {encoding!r}; send zstd, gzip or none")


def _decode_zstd(raw: bytes, limit: int) -> bytes:
    try:
        with zstandard.ZstdDecompressor().stream_reader(raw) as reader:
            size = len(reader.read(limit + 1))
        if size > limit:
            raise PayloadTooLarge(f"decoded request body is larger than {limit} bytes ({BODY_FLAG})")
        # The first frame is now known to fit: decode it whole, to learn whether it ended and what follows it.
        frame = zstandard.ZstdDecompressor().decompressobj()
        decoded = frame.decompress(raw)
    except zstandard.ZstdError as error:
        raise BadRequest(f"the body is not valid zstd data: {error}") from None
    if not frame.eof:
        raise BadRequest("the zstd body is truncated")
    if frame.unused_data:
        raise BadRequest("the zstd body has data after its frame; send one frame")
    return decoded


def _decode_zlib(raw: bytes, encoding: str, limit: int) -> bytes:
    window = zlib.MAX_WBITS | 16 if "gzip" in encoding else zlib.MAX_WBITS
    decompressor = zlib.decompressobj(window)
    try:
        decoded = decompressor.decompress(raw, limit + 1)
    except zlib.error as error:
        raise BadRequest(f"the body is not valid {encoding} data: {error}") from None
    if len(decoded) > limit:
        raise PayloadTooLarge(f"decoded request body is larger than {limit} bytes ({BODY_FLAG})")
    if not decompressor.eof:
        raise BadRequest(f"the {encoding} body is truncated")
    if decompressor.unused_data:
        raise BadRequest(f"the {encoding} body has data after its end; send one stream")
    return decoded


def parse_body(data: bytes, content_type: str, config: ServerSettings) -> RequestBody:
    """JSON bodies pass through; multipart bodies are split into the JSON `request` part and the rest."""
    media_type, options = parse_options_header(content_type or "application/json")
    if media_type != MULTIPART_TYPE:
        return RequestBody(parse_json(data, config.max_json_depth, config.max_json_items), {})
    boundary = options.get(b"boundary")
    if not boundary:
        raise BadRequest("multipart/form-data without a boundary")
    parts = split_multipart(data, boundary, max_parts=config.images.max_images + 1)
    if "request" not in parts:
        raise InvalidRequest(
            [FieldProblem(("body", "request"), "multipart body has no part named 'request'", "missing")]
        )
    request = parts.pop("request")
    return RequestBody(parse_json(request, config.max_json_depth, config.max_json_items), parts)
