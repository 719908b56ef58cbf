"""The paged KV store and its prompt cache: pages shared by reference, freed only when nobody holds them."""

from __future__ import annotations

import pytest
import torch

from canvasread.canvas.engine.kvstore import KVStore, PromptCache, StoreFull


def store(pages: int = 8, page: int = 4) -> KVStore:
    return KVStore([(2, 8), (1, 16)], pages=pages, page=page, dtype=torch.float32, device=torch.device("cpu"))


def test_a_prompt_gets_whole_pages_and_its_slots_in_order() -> None:
    kv = store()
    entry = kv.allocate(None, 6)
    assert entry.length == 6 and len(entry.pages) == 2 and kv.free_pages == 6
    assert entry.slots.tolist() == [entry.pages[0] * 4 + i for i in range(4)] + [
        entry.pages[1] * 4 + i for i in range(2)
    ]
    assert KVStore.bytes_per_token([(2, 8), (1, 16)], torch.float32) == 2 * (16 + 16) * 4


def test_a_continuation_shares_the_prefix_slots_and_owns_only_its_new_pages() -> None:
    kv = store()
    prefix = kv.allocate(None, 5)
    longer = kv.allocate(prefix, 3)
    assert longer.slots[:5].tolist() == prefix.slots.tolist() and longer.length == 8
    assert kv.free_pages == 8 - 2 - 1
    kv.release(prefix)  # the continuation still holds the prefix's pages
    assert kv.free_pages == 5
    kv.release(longer)
    assert kv.free_pages == 8


def test_a_prefix_view_holds_the_pages_it_touches() -> None:
    kv = store()
    entry = kv.allocate(None, 9)
    view = kv.prefix(entry, 5)
    assert view.slots.tolist() == entry.slots[:5].tolist() and view.pages == entry.pages[:2]
    assert kv.prefix(entry, 0).pages == ()


def test_the_cache_evicts_least_recently_used_prompts_but_not_pages_a_pass_holds() -> None:
    kv = store(pages=4)
    cache = PromptCache(kv)
    first, second = kv.allocate(None, 4), kv.allocate(None, 4)
    cache.put("first", first)
    cache.put("second", second)
    kv.release(first)
    kv.release(second)
    held = cache.get("first")  # used by a pass: now the most recent, and held
    assert held is first and kv.free_pages == 2
    cache.make_room(4)
    assert len(cache) == 0 and kv.free_pages == 3  # "first" left the cache, but the pass still holds its page
    kv.release(held)
    assert kv.free_pages == 4


def test_putting_a_key_twice_keeps_the_first_entry_and_holds_it_once() -> None:
    kv = store()
    cache = PromptCache(kv)
    entry = kv.allocate(None, 4)
    cache.put("k", entry)
    cache.put("k", kv.allocate(None, 4))
    kv.release(entry)
    cache.make_room(8)
    assert len(cache) == 0 and kv.free_pages == 7  # the second allocation is still held by its caller


def test_a_prompt_larger_than_the_free_store_is_refused() -> None:
    kv = store(pages=2)
    with pytest.raises(StoreFull):
        kv.allocate(None, 9)
    assert kv.free_pages == 2


def test_the_scratch_slot_is_past_every_page_and_never_handed_out() -> None:
    kv = store(pages=2, page=4)
    assert kv.scratch == 8 and all(keys.shape[0] == 9 for keys in kv.keys)
    slots = [kv.allocate(None, 4).slots for _ in range(2)]
    assert kv.scratch not in torch.cat(slots).tolist()
    assert not kv.keys[0][kv.scratch].any()  # zeroed: padding reads it, so it must be finite
