"""The in-process reader's prefix cache: LRU by use, bounded in bytes, on plain tensors (no model needed)."""

from __future__ import annotations

import torch

from canvasread.canvas.engine.reader import KVCache
from canvasread.canvas.engine.rows import PromptKV


def kv(length: int, layers: int = 2) -> PromptKV:
    """An encoded prompt of `length` positions: fp32 [1 head, length, 4 dims] per layer, keys and values."""
    return PromptKV(
        [torch.full((1, length, 4), float(i)) for i in range(layers)],
        [torch.full((1, length, 4), -float(i)) for i in range(layers)],
        length,
    )


def test_entries_are_counted_in_bytes() -> None:
    entry = kv(3)
    assert entry.nbytes == 2 * 2 * 3 * 4 * 4  # keys and values, 2 layers, 3 positions, 4 fp32 dims
    cache = KVCache(max_bytes=10_000)
    cache.put(("a",), entry)
    assert cache.nbytes == entry.nbytes
    assert cache.get(("a",)) is entry
    assert cache.get(("b",)) is None


def test_the_least_recently_used_entry_goes_first() -> None:
    size = kv(1).nbytes
    cache = KVCache(max_bytes=2 * size)
    cache.put("a", kv(1))
    cache.put("b", kv(1))
    assert cache.get("a") is not None  # "a" is now the most recent
    cache.put("c", kv(1))
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.nbytes == 2 * size


def test_an_entry_larger_than_the_whole_cache_is_not_kept_and_evicts_nothing() -> None:
    cache = KVCache(max_bytes=kv(2).nbytes)
    cache.put("small", kv(2))
    cache.put("huge", kv(50))
    assert cache.get("huge") is None and cache.get("small") is not None


def test_putting_a_key_twice_keeps_the_first_entry_and_counts_it_once() -> None:
    cache = KVCache(max_bytes=10_000)
    first = kv(2)
    cache.put("a", first)
    cache.put("a", kv(2))
    assert cache.get("a") is first and cache.nbytes == first.nbytes


def test_a_prefix_is_a_copy_so_the_full_prompt_can_be_freed() -> None:
    full = kv(5)
    prefix = full.prefix(2)
    assert prefix.length == 2 and prefix.keys[1].shape == (1, 2, 4)
    full.keys[1][:, 0] = 99.0
    assert prefix.keys[1][0, 0, 0].item() == 1.0
