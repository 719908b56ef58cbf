"""Span questions on a canvas: answer with a piece of the state's own text, by character offsets.

A `span` question's answer line is `name:` followed by a *blank*: every
canvas position after the colon holds noise, and everything before it is
pinned. The read gives each blank position a distribution over the
vocabulary, and we ask for it only at the state's own token ids (plus the
end-of-turn and separator ids), so whatever the answer is, it is a run of the
state's tokens, hence a substring of the state, by construction.

Scoring one blank. The state is tokenized on its own (`StateTokens`); write
t_0 … t_{n−1} for its ids and lp_k(x) for the read's log-probability of id x
at blank position k. The candidates are

- *stop*: the blank starts with `<turn|>` (for a span: "not found"; for a
  round of spans: "no more pieces"), scored lp_0(<turn|>);
- *piece (i, j)*: the state's tokens t_i … t_{j−1} written from blank
  position f on, then an end marker, scored
  lead + Σ_{k<j−i} lp_{f+k}(t_{i+k}) + log Σ_{e ∈ ends} exp lp_{f+j−i}(e),
  where f = 0 and lead = 0 on a fresh line, and f = 1 and lead = lp_0(`;`)
  when earlier pieces are already pinned on it (the separator opens the next
  piece); the ends are `<turn|>` for a span, `;` or `<turn|>` for spans.

That is the probability, under the read's per-position distributions, that
the line reads exactly that piece and ends there (what follows the end is not
scored). A piece must start and end on character boundaries (a character the
tokenizer split into byte tokens is taken whole or not at all), hold some
non-space text, never hold `<turn|>` (nor, for spans, `;`, which splits the
list), fit in the blank, and not overlap a piece found before. The answer is
the best-scoring candidate (ties go to stop, then the earliest start, then
the shortest piece); its `confidence` is its share of the candidates' total
probability, and that total (`mass`, at most 1: the candidates are disjoint
events) is how much of the read's probability fell on answers of this form.
Offsets come from the tokenizer's offset mapping of the state, with the
piece's outer whitespace (a token's leading space) trimmed off.

Candidates whose running score falls `PRUNE_MARGIN` nats below the best so
far are not extended (scores only fall as a piece grows): each is below
e^−40 of the best, so with n tokens and a blank of B positions the neglected
share of the total is below n·B·e^−40 (under 1e−9 for a 64k-token state).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from canvasread.canvas.tokenizer import Tokenizer
from canvasread.kinds.base import Blank

# Denoising steps a blank is read with (when the model can take them): the blank's positions must agree with one
# another (where the copy starts, where it ends) and one step predicts each from noise alone, while each further
# step lets them condition on the others' beliefs. The published multi-step replays read hard text items in 2–6
# steps; 3 is the low end that still gives the end marker a settled start to follow, each step costing one decoder
# pass over the canvas (the prompt is encoded once).
SPAN_STEPS = 3
# A blank needs room for a separator, one token and an end marker to hold another piece.
MIN_BLANK = 3
# Stop extending a piece once its running score is this many nats below the best candidate's (see the docstring).
PRUNE_MARGIN = 40.0


@dataclass(frozen=True)
class StateTokens:
    """The state's text tokenized on its own: its ids and each id's character span in the text."""

    text: str
    ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, tokenizer: Tokenizer, text: str) -> StateTokens:
        ids, offsets = tokenizer.encode_with_offsets(text)
        return cls(text, tuple(ids), tuple((int(a), int(b)) for a, b in offsets))

    @property
    def distinct_ids(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.ids)))

    def starts_at(self, i: int) -> bool:
        """Token i begins a character (the token before it ends before it starts: byte tokens share a character)."""
        return i == 0 or self.offsets[i - 1][1] <= self.offsets[i][0]

    def ends_at(self, j: int) -> bool:
        """Token j ends a character."""
        return j == len(self.ids) - 1 or self.offsets[j + 1][0] >= self.offsets[j][1]

    def piece(self, i: int, j: int) -> tuple[str, int, int]:
        """Text and character offsets of tokens i … j−1, outer whitespace trimmed."""
        start, end = self.offsets[i][0], self.offsets[j - 1][1]
        raw = self.text[start:end]
        start += len(raw) - len(raw.lstrip())
        end -= len(raw) - len(raw.rstrip())
        return self.text[start:end], start, end


@dataclass(frozen=True)
class BlankScores:
    """One blank read out: the best piece as a token range (None: stop), its confidence, the candidates' mass."""

    best: tuple[int, int] | None
    confidence: float
    mass: float
    candidates: int


@dataclass(frozen=True)
class Markers:
    """The ids a blank is read with besides the state's: where a line stops, what ends a piece, what opens one."""

    stop: int
    ends: tuple[int, ...]
    separator: int | None = None


class _LogSum:
    """A running log Σ exp, stable whatever the order of the terms."""

    def __init__(self, first: float) -> None:
        self.top, self.total = first, 1.0

    def add(self, value: float) -> None:
        if value > self.top:
            self.total = self.total * math.exp(self.top - value) + 1.0
            self.top = value
        else:
            self.total += math.exp(value - self.top)

    @property
    def log(self) -> float:
        return self.top + math.log(self.total)


def score_blank(
    state: StateTokens,
    rows: Sequence[Mapping[int, float]],
    markers: Markers,
    *,
    continues: bool = False,
    taken: Sequence[tuple[int, int]] = (),
) -> BlankScores:
    """Score every candidate of one blank (see the module docstring) from `rows[k]`, position k's log-probabilities.

    `continues`: pieces are already pinned on the line, so a piece opens with the separator.
    `taken`: token ranges of pieces found before, which a new piece may not overlap.
    """
    first = 1 if continues else 0
    lead = rows[0][markers.separator] if continues and markers.separator is not None else 0.0
    if continues and markers.separator is None:
        raise ValueError("a line that continues needs a separator")
    ends = [_logsumexp([row[e] for e in markers.ends]) for row in rows]
    forbidden = {markers.stop, *markers.ends}
    blocked = {index for i, j in taken for index in range(i, j)}
    blank = [not state.text[a:b].strip() for a, b in state.offsets]
    best_score, best = rows[0][markers.stop], None
    total, count = _LogSum(best_score), 1
    longest = len(rows) - first - 1  # the end marker takes the last position a piece may reach
    for i in range(len(state.ids)):
        if i in blocked or not state.starts_at(i):
            continue
        running, has_text = lead, False
        for j in range(i, min(i + longest, len(state.ids))):
            if j in blocked or state.ids[j] in forbidden:
                break
            running += rows[first + j - i][state.ids[j]]
            if running < best_score - PRUNE_MARGIN:
                break
            has_text = has_text or not blank[j]
            if has_text and state.ends_at(j):
                score = running + ends[first + j - i + 1]
                total.add(score)
                count += 1
                if score > best_score:
                    best_score, best = score, (i, j + 1)
    return BlankScores(best, math.exp(best_score - total.log), min(1.0, math.exp(total.log)), count)


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def mean_rows(reads: Sequence[Sequence[Mapping[int, float]]]) -> list[dict[int, float]]:
    """Several reads of one blank as one: per position and id, the log of the mean probability."""
    if len(reads) == 1:
        return [dict(row) for row in reads[0]]
    shift = math.log(len(reads))
    return [
        {token: _logsumexp([row[token] for row in position]) - shift for token in position[0]}
        for position in zip(*reads, strict=True)
    ]


def markers_for(tokenizer: Tokenizer, blank: Blank, end_text: str) -> Markers:
    """The stop, end and separator ids a blank is read with; each must be one token.

    A blank without a separator holds one piece, ended by `end_text`; with one, a piece also ends at the separator.
    """
    stop = _single(tokenizer, end_text)
    if blank.separator is None:
        return Markers(stop=stop, ends=(stop,))
    separator = _single(tokenizer, blank.separator)
    return Markers(stop=stop, ends=(separator, stop), separator=separator)


def blank_markers(
    tokenizer: Tokenizer, blanks: Mapping[str, Blank], end_text: str
) -> tuple[dict[str, Markers], dict[str, str]]:
    """Each blank kind's markers, and why this tokenizer cannot read the others (a marker that is not one token).

    A tokenizer without `<turn|>` as one token can still read every labelled question: the model loads and
    only the kinds read at a blank are refused, with the reason.
    """
    markers: dict[str, Markers] = {}
    unreadable: dict[str, str] = {}
    for name, blank in blanks.items():
        try:
            markers[name] = markers_for(tokenizer, blank, end_text)
        except ValueError as error:
            unreadable[name] = str(error)
    return markers, unreadable


def _single(tokenizer: Tokenizer, text: str) -> int:
    ids = tokenizer.encode(text)
    if len(ids) != 1:
        raise ValueError(f"{text!r} is {len(ids)} tokens for this tokenizer; span questions need it to be one")
    return ids[0]
