"""The prompts that work in flight reads: each distinct prompt placed in the KV store once, whoever asks for it.

Placing a prompt:
- its whole KV is cached (a re-read, or a later request with the same
  prompt): its reads use the stored slots, no prompt work;
- else the longest cached prefix (the instruction part shared by requests
  with the same questions) is continued: the prompt gets slots of its own
  for the rest only, encoded in rows of at most ENCODE_ROW_TOKENS tokens
  (an image is never cut).
A prompt is shared by every task that reads it, from any work in flight
(reads of several requests, re-reads of one, a thought), and counted by
them: it leaves the table when the last lets go. A prompt whose last
encoding row has run is kept in the prompt cache (LRU by pages) for
re-reads and later requests; one let go half encoded never is.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from canvasread.canvas.engine.kvstore import KVStore, PromptCache, StoredKV
from canvasread.canvas.engine.rows import Row
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.reader import PromptImage

# The longest row one prompt encodes in a pass: bounds a row's attention scores (queries x keys).
ENCODE_ROW_TOKENS = 2048
_placed = itertools.count()


@dataclass
class PlacedPrompt:
    """A prompt in the store: its slots (held while anyone reads it) and its encoding rows not yet run."""

    ids: tuple[int, ...]
    prefix_length: int
    images: tuple[PromptImage, ...]
    entry: StoredKV
    chunks: deque[Row] = field(default_factory=deque)
    fresh: bool = False  # encoded by work in flight: cached once its last chunk has run
    users: int = 0
    order: int = field(default_factory=lambda: next(_placed))  # placing order: older prompts go first

    @property
    def key(self) -> Hashable:
        return prompt_key(self.ids, self.images)


def prompt_key(ids: tuple[int, ...], images: tuple[PromptImage, ...]) -> Hashable:
    return (ids, tuple(image.digest for image in images))


@dataclass
class PromptCounters:
    encoder_runs: int = 0
    prompt_tokens_encoded: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_misses: int = 0
    prompt_cache_hits: int = 0
    images_encoded: int = 0


class PromptTable:
    """The prompts in flight by key, over one store and its prompt cache; used from the engine's thread only."""

    def __init__(self, store: KVStore, cache: PromptCache, runner: FusedRunner) -> None:
        self.store = store
        self.cache = cache
        self.runner = runner
        self.stats = PromptCounters()
        self._placed: dict[Hashable, PlacedPrompt] = {}

    def __len__(self) -> int:
        return len(self._placed)

    def use(self, ids: tuple[int, ...], prefix_length: int, images: tuple[PromptImage, ...]) -> PlacedPrompt:
        """The prompt, placed if no work in flight has it yet, with one more user; raises `StoreFull`."""
        key = prompt_key(ids, images)
        placed = self._placed.get(key)
        if placed is None:
            placed = self._place(ids, prefix_length, images)
            self._placed[key] = placed
        placed.users += 1
        return placed

    def let_go(self, placed: PlacedPrompt) -> None:
        """One user is done with the prompt; the last to let go gives its slots back (the cache may keep them)."""
        placed.users -= 1
        if placed.users == 0:
            del self._placed[placed.key]
            self.store.release(placed.entry)

    def encoded(self, placed: PlacedPrompt) -> None:
        """A pass ran one of the prompt's chunks; after its last, the prompt (and its prefix) go to the cache."""
        if placed.chunks or not placed.fresh:
            return
        placed.fresh = False
        self.cache.put(placed.key, placed.entry)
        if 0 < placed.prefix_length < len(placed.ids):
            prefix = self.store.prefix(placed.entry, placed.prefix_length)
            self.cache.put(("prefix", placed.ids[: placed.prefix_length]), prefix)

    def reserve(self, tokens: int) -> StoredKV:
        """Fresh slots for tokens written later (a thought's blocks), evicting cached prompts for room."""
        self.cache.make_room(-(-tokens // self.store.page))
        return self.store.allocate(None, tokens)

    def _place(self, ids: tuple[int, ...], prefix_length: int, images: tuple[PromptImage, ...]) -> PlacedPrompt:
        cached = self.cache.get(prompt_key(ids, images))
        if cached is not None:
            self.stats.prompt_cache_hits += 1
            return PlacedPrompt(ids, prefix_length, images, cached)
        past = self._cached_prefix(ids, prefix_length)
        start = past.length if past is not None else 0
        self.cache.make_room(-(-(len(ids) - start) // self.store.page))
        try:
            entry = self.store.allocate(past, len(ids) - start)
        finally:
            if past is not None:
                self.store.release(past)  # the entry holds the prefix's pages now
        placed = PlacedPrompt(ids, prefix_length, images, entry, fresh=True)
        placed.chunks.extend(self._chunks(placed, start))
        self.stats.encoder_runs += 1
        self.stats.prompt_tokens_encoded += len(ids) - start
        return placed

    def _chunks(self, placed: PlacedPrompt, start: int) -> list[Row]:
        """Rows encoding `ids[start:]`, each at most ENCODE_ROW_TOKENS long unless an image needs more."""
        ids, entry = placed.ids, placed.entry
        longest = min(ENCODE_ROW_TOKENS, self.runner.buckets.max_tokens)
        images = [image for image in placed.images if image.start >= start]
        features = self.runner.image_features([image.data for image in images]) if images else []
        self.stats.images_encoded += len(images)
        rows = []
        while start < len(ids):
            end = min(start + longest, len(ids))
            for image in images:  # never cut an image: end before it, or (if it starts the row) after it
                if image.start < end < image.start + image.tokens:
                    end = image.start if image.start > start else image.start + image.tokens
            overlays = [
                (image.start - start, tensor)
                for image, tensor in zip(images, features, strict=True)
                if start <= image.start < end
            ]
            rows.append(Row(entry.slots[:start], ids[start:end], entry.slots[start:end], images=overlays))
            start = end
        return rows

    def _cached_prefix(self, ids: tuple[int, ...], prefix_length: int) -> StoredKV | None:
        if prefix_length <= 0 or prefix_length >= len(ids):
            return None
        past = self.cache.get(("prefix", ids[:prefix_length]))
        if past is None:
            self.stats.prefix_cache_misses += 1
        else:
            self.stats.prefix_cache_hits += 1
        return past
