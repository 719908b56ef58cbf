"""The sparrow static model's read, split so that each text is tokenised once per request, never once per question.

`sparrow_decider.static.StaticModel.probs(state, instructions, kind, options)`
renders and tokenises the whole state for every question (pure Python, about
a second per megabyte), though it pools only the first `max_len` tokens of
each text. Here the same numbers come from two steps:

- `pool_request` (the request's own thread, before queueing): every text —
  the state, each instructions, each option — rendered once and tokenised
  only as far as the model reads it (`bounded_ids`), pooled to vectors, and
  the state's key-value pairs read once;
- `probabilities` (the model's worker): numpy only, per question.

The math mirrors `StaticModel.features`/`logits`/`probs` of the pinned
sparrow-decider 0.2.0 line by line; `tests/backends/test_sparrow.py` holds the
two to equality on both bundled models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sparrow_decider import _options
from sparrow_decider.engine import gelu, softmax
from sparrow_decider.static import KINDS, _content, kv_pairs, value_features

from canvasread.backends.base import stop_if_left
from canvasread.errors import PayloadTooLarge

# Text is tokenised in chunks of about this many characters, each cut where normalisation and pre-tokenisation
# start afresh, so a long text costs only what the model reads of it, and a preparation can stop between chunks.
CHUNK_CHARS = 4096
SPACES = (" ", "\n", "\t", "\r")
# Inside a run without spaces a chunk may end before one of these: punctuation is a word of its own, and the one
# context-dependent step of normalising (lowercasing's final sigma) does not look through them as it does
# through ' . : ^ `, so each side normalises as it does within the whole text.
BREAKS = tuple('!"#$%&()*+,-/;<=>?@[\\]_{|}~')


def bounded_ids(tokenizer: Any, text: str, limit: int) -> list[int]:
    """`tokenizer.encode(text, limit)`, normalising no more of `text` than its first `limit` tokens need.

    Exact, except inside a run of more than `CHUNK_CHARS` characters with neither a space nor a break: it is cut
    every `CHUNK_CHARS` characters, so a text without spaces costs what is read of it, not its whole length.
    Such a run is a word the model reads as one [UNK] (it reads words of at most 100 characters), cut into
    several. Stops between chunks once the request's caller has gone (`stop_if_left`).
    """
    ids: list[int] = []
    start = 0
    while start < len(text) and len(ids) < limit:
        stop_if_left()
        end = _chunk_end(text, start)
        ids.extend(tokenizer.encode(text[start:end], limit - len(ids)))
        start = end
    return ids[:limit]


def _chunk_end(text: str, start: int) -> int:
    """Just past the last space within `CHUNK_CHARS` of `start`, else before the last break there, else there."""
    window = start + CHUNK_CHARS
    if window >= len(text):
        return len(text)
    space = max(text.rfind(mark, start, window) for mark in SPACES)
    if space >= start:
        return space + 1
    cut = max(text.rfind(mark, start + 1, window) for mark in BREAKS)
    return cut if cut > start else window


@dataclass(frozen=True)
class PooledState:
    vector: np.ndarray
    pair_values: np.ndarray | None  # per key-value pair: emb(key) * g(value), normalised keys [P x H]
    pair_labels: np.ndarray | None  # per pair: the normalised pooled label of its line [P x H]
    cut: bool = False  # the text is longer than the `max_len` tokens pooled: only its beginning was read


@dataclass(frozen=True)
class PooledQuestion:
    kind: str
    names: tuple[str, ...]  # sparrow's option order (its noul is false, true)
    instructions: np.ndarray
    options: np.ndarray  # [K x H]
    cut: tuple[str, ...] = ()  # the texts read only in part: "instructions" and option names, in sparrow's order


@dataclass(frozen=True)
class PooledRequest:
    state: PooledState
    questions: tuple[PooledQuestion, ...]
    tokens: int  # what the model read: the pooled tokens of every text


class _Budget:
    """Counts pooled tokens, refusing the request as soon as it reads more than `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, count: int) -> None:
        self.used += count
        if self.used > self.limit:
            raise PayloadTooLarge(
                f"the request needs more than {self.limit} tokens of reading (state, instructions and every "
                "option); send a shorter state or fewer or shorter options, or split the questions over requests"
            )


def _normalised(z: np.ndarray) -> np.ndarray:
    scaled: np.ndarray = z / np.maximum(np.linalg.norm(z, axis=-1, keepdims=True), 1e-12)
    return scaled


class StaticReader:
    """Pools texts and reads questions with the weights of one loaded `StaticModel`.

    Each text is tokenised one token past what the model pools, so a text it reads only in part is known
    (`cut`) for the price of one token.
    """

    def __init__(self, model: Any) -> None:
        self.model = model

    @property
    def max_len(self) -> int:
        """The tokens of each text the model pools; the rest of a longer text is not read."""
        return int(self.model.max_len)

    def _pool(self, text: str, budget: _Budget, ids: list[int] | None = None) -> tuple[np.ndarray, bool]:
        """The text's pooled vector (`ids`: its tokens, when already known), and whether it was cut."""
        limit = self.max_len
        ids = bounded_ids(self.model.tok, text, limit + 1) if ids is None else ids
        kept = ids[:limit]
        budget.take(max(1, len(kept)))
        result: np.ndarray = self.model.emb[kept or [0]].mean(0)
        return result, len(ids) > limit

    def state_tokens(self, state: Any, limit: int) -> list[int]:
        """The state's first `limit` tokens (a state with more has more than `limit`)."""
        return bounded_ids(self.model.tok, _content(state), limit)

    def pool_request(
        self, state: Any, questions: list[dict[str, Any]], max_tokens: int, state_ids: list[int] | None = None
    ) -> PooledRequest:
        """Everything text-shaped about one request, read once; raises `PayloadTooLarge` past `max_tokens`.

        `state_ids` are the state's tokens when the caller has them (`state_tokens`), at least one past `max_len`.
        """
        budget = _Budget(max_tokens)
        text = _content(state)
        vector, cut = self._pool(text, budget, state_ids)
        pair_values = pair_labels = None
        pairs = kv_pairs(text) if self.model.kv else []
        if pairs:
            w = self.model.w
            keys = _normalised(np.stack([self._pool(key, budget)[0] for key, _, _ in pairs]))
            pair_labels = _normalised(np.stack([self._pool(label, budget)[0] for _, label, _ in pairs]))
            numbers = np.array([value_features(value) for _, _, value in pairs], np.float32)
            pair_values = keys * np.tanh(numbers @ w["g.weight"].T + w["g.bias"])
        pooled = tuple(self._pool_question(question, budget) for question in questions)
        return PooledRequest(PooledState(vector, pair_values, pair_labels, cut), pooled, budget.used)

    def _pool_question(self, question: dict[str, Any], budget: _Budget) -> PooledQuestion:
        kind, options = _options(question)
        instructions, cut = self._pool(_content(question.get("instructions")), budget)
        cuts = ["instructions"] if cut else []
        vectors = []
        for name, description in options:
            vector, cut = self._pool(f"{name} {description or ''}", budget)
            vectors.append(vector)
            cuts += [name] if cut else []
        names = tuple(name for name, _ in options)
        return PooledQuestion(kind, names, instructions, np.stack(vectors), tuple(cuts))

    def probabilities(self, state: PooledState, question: PooledQuestion) -> np.ndarray:
        """`StaticModel.probs` from pooled vectors: softmax of the MLP's option logits over the temperature."""
        w = self.model.w
        s = _normalised(state.vector)
        q = _normalised(question.instructions + w["kind.weight"][KINDS[question.kind]])
        o = _normalised(question.options)
        mean = o.mean(0, keepdims=True)
        blocks = [o, s * o, q * o, s * q * o, o - mean, (s - mean) * o]
        if self.model.kv:
            if state.pair_values is None or state.pair_labels is None:
                pairs_mean, bound = np.zeros(o.shape[-1], np.float32), np.zeros_like(o)
            else:
                attention = softmax(float(w["tau"][0]) * (o @ state.pair_labels.T), -1)
                pairs_mean, bound = state.pair_values.mean(0), attention @ state.pair_values
            blocks += [pairs_mean * o, pairs_mean * q * o, bound, bound * q]
        features = np.concatenate([np.broadcast_to(block, o.shape) for block in blocks], -1)
        hidden = gelu(features @ w["mlp.0.weight"].T + w["mlp.0.bias"])
        hidden = gelu(hidden @ w["mlp.2.weight"].T + w["mlp.2.bias"])
        logits = (hidden @ w["mlp.4.weight"].T + w["mlp.4.bias"])[:, 0]
        temperature = float(self.model.cfg.get("temperature_by_kind", {}).get(question.kind, 1.0))
        result: np.ndarray = softmax(logits / temperature)
        return result
