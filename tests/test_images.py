"""Image checks on their own: the header against the limits, one full decode, and where each problem is reported."""

from __future__ import annotations

import base64
from dataclasses import dataclass

import pytest
from helpers import png

from canvasread.errors import InvalidRequest
from canvasread.images import decode_assets, inspect_image
from canvasread.settings import ImageLimits


@dataclass(frozen=True)
class Asset:
    format: str | None = None
    data_base64: str | None = None
    part: str | None = None


def locs(error: InvalidRequest) -> list[tuple[str | int, ...]]:
    return [problem.loc for problem in error.problems]


def test_a_sound_png_is_measured_and_kept() -> None:
    data = png(6, 3)
    image = inspect_image("photo", data)
    assert (image.placeholder, image.format, image.width, image.height, image.data) == ("photo", "png", 6, 3, data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (png(8, 8)[:-30], "cannot be decoded|not a readable"),  # the header is fine, the data stops short
        (b"GIF89a" + bytes(40), "not a readable"),
        (png(50, 50), "at most 100 pixels"),
    ],
    ids=["truncated", "not-an-image", "too-many-pixels"],
)
def test_images_that_cannot_be_read_within_the_limits_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        inspect_image("photo", data, ImageLimits(max_pixels=100))


def test_every_asset_problem_is_reported_at_its_own_field() -> None:
    assets = {
        "a": Asset(part="missing"),
        "b": Asset(format="png", data_base64="not base64!"),
        "c": Asset(data_base64=base64.b64encode(png()).decode()),
        "d": Asset(part="p1"),
    }
    with pytest.raises(InvalidRequest) as caught:
        decode_assets(assets, {"p1": png(), "stray": png()}, ImageLimits())
    assert locs(caught.value) == [
        ("assets", "a", "part"),
        ("assets", "b", "data_base64"),
        ("assets", "c", "format"),
        ("stray",),
    ]


def test_too_many_images_are_refused_before_any_is_decoded() -> None:
    assets = {str(i): Asset(part=str(i)) for i in range(3)}
    with pytest.raises(InvalidRequest) as caught:
        decode_assets(assets, {}, ImageLimits(max_images=2))
    assert locs(caught.value) == [("assets",)]
