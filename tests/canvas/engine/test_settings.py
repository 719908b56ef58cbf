"""`Buckets`, the engine's one shape policy: which passes attend flat, and the shapes start-up captures whole."""

from __future__ import annotations

import pytest

from canvasread.canvas.engine.settings import Buckets


def test_a_small_pass_attends_flat_in_the_smallest_buckets_that_hold_it() -> None:
    buckets = Buckets((16, 32, 64, 128), flat_tokens=32, flat_past=(64, 256))
    assert buckets.flat_shape(20, 0) == (32, 64)
    assert buckets.flat_shape(16, 65) == (16, 256)
    assert buckets.flat == [(16, 64), (16, 256), (32, 64), (32, 256)]


def test_a_large_pass_or_a_long_past_attends_in_groups() -> None:
    buckets = Buckets((16, 32, 64, 128), flat_tokens=32, flat_past=(64, 256))
    assert buckets.flat_shape(33, 0) is None
    assert buckets.flat_shape(8, 257) is None
    assert Buckets(flat_tokens=0).flat == [] and Buckets(flat_tokens=0).flat_shape(1, 0) is None


@pytest.mark.parametrize(
    "settings",
    [{"flat_past": ()}, {"flat_past": (512, 256)}, {"flat_tokens": -1}, {"tokens": (32, 16)}],
    ids=["no-past-buckets", "unsorted-past", "negative-flat", "unsorted-tokens"],
)
def test_a_shape_policy_that_cannot_work_is_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"bucket|flat"):
        Buckets(**settings)  # type: ignore[arg-type]
