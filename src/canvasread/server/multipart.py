"""Splitting a `multipart/form-data` body into named parts, counting them as they are parsed.

The count is checked in the parser's callbacks, so a body of half a million
empty parts stops at the first part past the limit instead of being parsed
whole before anything looks at it.
"""

from __future__ import annotations

from typing import Any

from python_multipart import MultipartParser
from python_multipart.multipart import parse_options_header

from canvasread.errors import BadRequest, FieldProblem, InvalidRequest


class _Parts:
    """The parser's callbacks: they collect each part's name and bytes."""

    def __init__(self, max_parts: int) -> None:
        self.max_parts = max_parts
        self.parts: dict[str, bytes] = {}
        self.count = 0
        self.name: str | None = None
        self.chunks: list[bytes] = []
        self.headers: dict[bytes, bytes] = {}
        self.field = b""
        self.value = b""

    def on_part_begin(self) -> None:
        self.count += 1
        if self.count > self.max_parts:
            images = self.max_parts - 1
            raise InvalidRequest(
                [
                    FieldProblem(
                        ("body", "assets"),
                        f"at most {images} images per request (--max-images)",
                        "too_long",
                        input=images,
                    )
                ]
            )
        self.name, self.chunks, self.headers = None, [], {}

    def on_header_field(self, buf: bytes, start: int, end: int) -> None:
        self.field += buf[start:end]

    def on_header_value(self, buf: bytes, start: int, end: int) -> None:
        self.value += buf[start:end]

    def on_header_end(self) -> None:
        self.headers[self.field.lower()] = self.value
        self.field = self.value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        name = options.get(b"name")
        self.name = name.decode("utf-8", "replace") if name else None

    def on_part_data(self, buf: bytes, start: int, end: int) -> None:
        self.chunks.append(buf[start:end])

    def on_part_end(self) -> None:
        if self.name is None:
            raise BadRequest("a multipart part has no name")
        if self.name in self.parts:
            raise InvalidRequest([FieldProblem(("body", self.name), f"multipart part {self.name!r} appears twice")])
        self.parts[self.name] = b"".join(self.chunks)


def split_multipart(data: bytes, boundary: bytes, *, max_parts: int) -> dict[str, bytes]:
    """The parts of `data` by name; 400 for a body the parser cannot read, 422 past `max_parts` or for duplicates."""
    collected = _Parts(max_parts)
    names = ("part_begin", "header_field", "header_value", "header_end", "headers_finished", "part_data", "part_end")
    callbacks: Any = {f"on_{name}": getattr(collected, f"on_{name}") for name in names}
    try:
        parser = MultipartParser(boundary, callbacks)  # inside the guard: it refuses long boundaries as it is built
        parser.write(data)
        parser.finalize()
    except (BadRequest, InvalidRequest):
        raise
    except Exception as error:  # python-multipart raises several unrelated error types on broken input
        raise BadRequest(f"malformed multipart body: {error}") from None
    return collected.parts
