"""Images sent with a request: their bytes found (base64 or a multipart part) and checked before any model sees them.

A header can lie (a truncated PNG, a size its data cannot fill), so an image
is checked against the limits from its header first, then decoded once in
full: a bad image is a 422 at its asset, never a failure inside a model.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping
from typing import Any, Protocol

from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.settings import ImageLimits
from canvasread.types import ImageAsset, ImageFormat


class AssetSource(Protocol):
    """Where an asset's bytes are, as the wire states it (`canvasread.wire.WireAsset`)."""

    @property
    def format(self) -> str | None: ...

    @property
    def data_base64(self) -> str | None: ...

    @property
    def part(self) -> str | None: ...


def decode_assets(
    assets: Mapping[str, AssetSource], parts: Mapping[str, bytes], limits: ImageLimits
) -> dict[str, ImageAsset]:
    """Every asset's bytes (base64 or a multipart part) checked as an image; one 422 listing every problem."""
    if max(len(assets), len(parts)) > limits.max_images:  # before any decoding: counting is free, decoding is not
        raise InvalidRequest.at(
            ("assets",),
            f"at most {limits.max_images} images per request (--max-images)",
            input=len(assets) or len(parts),
        )
    problems: list[FieldProblem] = []
    decoded: dict[str, ImageAsset] = {}
    claimed: set[str] = set()
    for placeholder, asset in assets.items():
        loc: tuple[str | int, ...] = ("assets", placeholder)
        if asset.part is not None:
            if asset.part not in parts:
                problems.append(
                    FieldProblem((*loc, "part"), f"no multipart part named {asset.part!r}", input=asset.part)
                )
                continue
            if asset.part in claimed:
                problems.append(
                    FieldProblem((*loc, "part"), f"part {asset.part!r} is claimed by two assets", input=asset.part)
                )
                continue
            claimed.add(asset.part)
            data = parts[asset.part]
        else:
            if asset.format is None:
                problems.append(FieldProblem((*loc, "format"), "format is required with data_base64 (png or jpeg)"))
                continue
            encoded = "".join((asset.data_base64 or "").split())
            if len(encoded) // 4 * 3 > limits.max_bytes:
                problems.append(
                    FieldProblem(
                        (*loc, "data_base64"), f"image is larger than {limits.max_bytes} bytes (--max-image-bytes)"
                    )
                )
                continue
            try:
                data = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                problems.append(FieldProblem((*loc, "data_base64"), "data_base64 is not valid base64"))
                continue
        try:
            decoded[placeholder] = inspect_image(placeholder, data, limits)
        except ValueError as error:
            problems.append(FieldProblem((*loc, "part" if asset.part else "data_base64"), str(error)))
    for name in sorted(set(parts) - claimed):
        problems.append(FieldProblem((name,), f"multipart part {name!r} is not claimed by any asset"))
    if problems:
        raise InvalidRequest(problems)
    return decoded


def inspect_image(placeholder: str, data: bytes, limits: ImageLimits = ImageLimits()) -> ImageAsset:
    """Check that bytes are a PNG or JPEG of sane size: the header against the limits, then one full decode.

    The decode runs only once the header is within the limits, and catches
    files whose header lies (truncated data, a size the data cannot fill) here,
    as a 422 at the asset, instead of in the model.
    """
    from PIL import Image, UnidentifiedImageError

    if len(data) > limits.max_bytes:
        raise ValueError(f"image is larger than {limits.max_bytes} bytes (--max-image-bytes)")
    formats: dict[str, ImageFormat] = {"PNG": "png", "JPEG": "jpeg"}
    try:
        with Image.open(io.BytesIO(data)) as image:
            kind = image.format
            width, height = image.size
            if kind not in formats:
                raise ValueError(f"image format {kind} is not supported; send PNG or JPEG")
            if width < 1 or height < 1 or width * height > limits.max_pixels:
                raise ValueError(
                    f"image is {width}x{height}; at most {limits.max_pixels} pixels are accepted (--max-image-pixels)"
                )
            _decode(image)
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as error:
        raise ValueError(f"not a readable PNG or JPEG image ({type(error).__name__})") from None
    return ImageAsset(placeholder, formats[kind], data, width, height)


def _decode(image: Any) -> None:
    """Decode every pixel once; Pillow's decoders raise many unrelated types on corrupt data."""
    try:
        image.load()
    except Exception as error:
        raise ValueError(f"the image data cannot be decoded ({type(error).__name__}: {error})") from None
