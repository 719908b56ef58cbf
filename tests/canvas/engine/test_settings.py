"""`Buckets`, the engine's one shape policy: which passes attend flat, and the shapes start-up captures whole;
`EngineSettings.batches`, the batches read at once on each kind of device; settings no load could use."""

from __future__ import annotations

import re

import pytest

from canvasread.backends.base import MAX_BATCHES_AT_ONCE
from canvasread.canvas.engine.settings import (
    CPU_BATCHES_IN_FLIGHT,
    DTYPES,
    GPU_BATCHES_IN_FLIGHT,
    Buckets,
    EngineSettings,
)


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


def test_the_batches_read_at_once_default_by_device_and_a_flag_overrides_both() -> None:
    assert EngineSettings().batches(on_gpu=True) == GPU_BATCHES_IN_FLIGHT
    assert EngineSettings().batches(on_gpu=False) == CPU_BATCHES_IN_FLIGHT
    assert GPU_BATCHES_IN_FLIGHT > CPU_BATCHES_IN_FLIGHT
    for on_gpu in (True, False):
        assert EngineSettings(batches_in_flight=7).batches(on_gpu=on_gpu) == 7


@pytest.mark.parametrize("batches", [0, MAX_BATCHES_AT_ONCE + 1])
def test_batches_in_flight_past_what_the_batch_queue_runs_are_refused(batches: int) -> None:
    with pytest.raises(ValueError, match=f"between 1 and {MAX_BATCHES_AT_ONCE}"):
        EngineSettings(batches_in_flight=batches)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"dtype": "int7"}, "unknown --dtype 'int7'; use one of float32, fp32, bfloat16, bf16, float16, fp16"),
        ({"random_init_std": -1.0}, "--random-weights must be a finite STD >= 0, not -1"),
        ({"random_init_std": float("nan")}, "--random-weights must be a finite STD >= 0, not nan"),
        ({"cache_bytes": 0}, "--kv-cache-gib must be positive"),
        ({"cache_bytes": -1}, "--kv-cache-gib must be positive"),
    ],
    ids=["dtype", "negative-std", "nan-std", "no-kv-store", "negative-kv-store"],
)
def test_settings_a_load_could_never_use_are_refused_before_it(settings: dict[str, object], message: str) -> None:
    """Refused here, without torch, so `serve` says so before it binds instead of failing the load behind the port."""
    with pytest.raises(ValueError, match=re.escape(message)):
        EngineSettings(**settings)  # type: ignore[arg-type]


def test_every_named_dtype_and_a_zero_std_are_accepted() -> None:
    for name in DTYPES:
        assert EngineSettings(dtype=name).dtype == name
    assert EngineSettings(random_init_std=0.0, cache_bytes=1).random_init_std == 0.0
