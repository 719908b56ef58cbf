"""The paged prefix KV store: every encoded prompt's keys and values, addressed by slot, shared by reference.

One tensor per layer holds [slots, kv_heads, head_dim] keys (and one values);
a stored prompt is a list of slot indices, allocated a page at a time. A
prompt that continues a cached prefix points at the prefix's slots and owns
only its new pages, so the prefix is never copied per row (vLLM's and
SGLang's block tables). Pages are reference counted: the prompt cache and
the reads of a pass in flight each hold the pages they use, and a page is
reused only once nobody does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch


class StoreFull(RuntimeError):
    """The store cannot hold a pass's prompts even with nothing cached (the pass is too large for it)."""


@dataclass(frozen=True)
class StoredKV:
    """A prompt in the store: its slot indices (CPU int64, one per token) and the pages it holds."""

    slots: torch.Tensor
    pages: tuple[int, ...]

    @property
    def length(self) -> int:
        return int(self.slots.shape[0])


class KVStore:
    """Per-layer key and value tensors addressed by slot, with reference-counted pages."""

    def __init__(
        self, shapes: Sequence[tuple[int, int]], *, pages: int, page: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        """`shapes` gives each layer's (kv_heads, head_dim); the store holds `pages * page` slots."""
        if pages < 1:
            raise ValueError("the KV store needs at least one page")
        self.page = page
        # One slot past the pages is never handed out: a flat pass writes every token's keys, the ones no prompt
        # keeps to this scratch slot, so its writes have one shape whatever its rows.
        self.scratch = pages * page
        # Uninitialised but for slot 0 and the scratch slot, which padding points at: masked keys must still be
        # finite (0 x NaN); the scratch slot only ever takes a pass's own (finite) keys.
        self.keys = [torch.empty(self.scratch + 1, heads, dim, dtype=dtype, device=device) for heads, dim in shapes]
        self.values = [torch.empty(self.scratch + 1, heads, dim, dtype=dtype, device=device) for heads, dim in shapes]
        for tensor in (*self.keys, *self.values):
            tensor[0].zero_()
            tensor[self.scratch].zero_()
        self._free: list[int] = list(range(pages - 1, -1, -1))
        self._holders = [0] * pages

    @staticmethod
    def bytes_per_token(shapes: Sequence[tuple[int, int]], dtype: torch.dtype) -> int:
        """Bytes one token's keys and values take over all layers."""
        size = torch.empty((), dtype=dtype).element_size()
        return sum(2 * heads * dim * size for heads, dim in shapes)

    @property
    def budget(self) -> int:
        """The bytes its pages hold (the scratch slot aside): a store given this budget has as many pages."""
        shapes = [(keys.shape[1], keys.shape[2]) for keys in self.keys]
        return self.pages * self.page * self.bytes_per_token(shapes, self.keys[0].dtype)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def pages(self) -> int:
        return len(self._holders)

    def allocate(self, past: StoredKV | None, tokens: int) -> StoredKV:
        """A new prompt of `past` (shared) plus `tokens` fresh slots on pages of its own; holds both."""
        count = -(-tokens // self.page)
        if count > len(self._free):
            raise StoreFull(f"{tokens} tokens need {count} pages; {len(self._free)} are free")
        own = [self._free.pop() for _ in range(count)]
        for page in own:
            self._holders[page] = 1
        fresh = (torch.tensor(own, dtype=torch.int64)[:, None] * self.page + torch.arange(self.page)).reshape(-1)
        if past is None:
            return StoredKV(fresh[:tokens], tuple(own))
        self.retain(past)
        return StoredKV(torch.cat([past.slots, fresh[:tokens]]), (*past.pages, *own))

    def prefix(self, entry: StoredKV, length: int) -> StoredKV:
        """The first `length` tokens of `entry` and the pages they touch, sharing its slots (not held)."""
        slots = entry.slots[:length]
        return StoredKV(slots, tuple(dict.fromkeys((slots // self.page).tolist())))

    def retain(self, entry: StoredKV) -> None:
        for page in entry.pages:
            self._holders[page] += 1

    def release(self, entry: StoredKV) -> None:
        for page in entry.pages:
            self._holders[page] -= 1
            if self._holders[page] == 0:
                self._free.append(page)


class PromptCache:
    """Stored prompts by token key, least recently used evicted first when the store needs pages."""

    def __init__(self, store: KVStore) -> None:
        self.store = store
        self._entries: OrderedDict[Hashable, StoredKV] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> StoredKV | None:
        """The stored prompt, held for the caller (who releases it), or None."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.store.retain(entry)
        return entry

    def put(self, key: Hashable, entry: StoredKV) -> None:
        """Keep `entry` (the cache holds its own reference); a key already kept stays as it is."""
        if key in self._entries:
            return
        self.store.retain(entry)
        self._entries[key] = entry

    def make_room(self, pages: int) -> None:
        """Evict least recently used prompts until `pages` are free or nothing cached is left."""
        while self.store.free_pages < pages and self._entries:
            _, entry = self._entries.popitem(last=False)
            self.store.release(entry)
