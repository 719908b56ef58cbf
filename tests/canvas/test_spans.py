"""Span scoring: the best candidate of a blank is a run of the state's tokens, so its text is a substring by
construction; offsets, found/not found, unicode and the spans rules checked against a brute-force enumeration."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canvasread.canvas.spans import Markers, StateTokens, mean_rows, score_blank

STOP, SEP = 1000, 1001
SPAN = Markers(stop=STOP, ends=(STOP,))
SPANS = Markers(stop=STOP, ends=(SEP, STOP), separator=SEP)


def words(text: str) -> StateTokens:
    """A word tokenizer that keeps each word's leading space, as Gemma's does; ids are the words' first letters."""
    ids, offsets, cursor = [], [], 0
    for index, word in enumerate(text.split(" ")):
        start = cursor - (1 if index else 0)
        cursor += len(word) + 1
        ids.append(ord(word[0]) if word else ord(" "))
        offsets.append((max(start, 0), cursor - 1))
    return StateTokens(text, tuple(ids), tuple(offsets))


def rows_for(state: StateTokens, width: int, favour: Mapping[tuple[int, int], float] = {}) -> list[dict[int, float]]:
    """Per-position log-probabilities over the state's ids and the markers: uniform, raised where `favour` says."""
    wanted = [*state.distinct_ids, STOP, SEP]
    rows = []
    for position in range(width):
        scores = {token: favour.get((position, token), 0.0) for token in wanted}
        norm = math.log(sum(math.exp(s) for s in scores.values()) + 50.0)  # some mass off the state's ids
        rows.append({token: s - norm for token, s in scores.items()})
    return rows


def brute_force(
    state: StateTokens,
    rows: Sequence[Mapping[int, float]],
    markers: Markers,
    *,
    continues: bool = False,
    taken: Sequence[tuple[int, int]] = (),
) -> tuple[tuple[int, int] | None, float]:
    """Every candidate scored without pruning: the best and its share."""
    first = 1 if continues else 0
    lead = rows[0][SEP] if continues else 0.0
    scores: list[tuple[float, int, int, tuple[int, int] | None]] = [(rows[0][STOP], 0, 0, None)]
    forbidden = {STOP, *markers.ends}
    for i in range(len(state.ids)):
        for j in range(i + 1, len(state.ids) + 1):
            if j - i + first >= len(rows) or any(t in forbidden for t in state.ids[i:j]):
                continue
            if not state.starts_at(i) or not state.ends_at(j - 1) or not state.piece(i, j)[0]:
                continue
            if any(a < j and i < b for a, b in taken):
                continue
            body = sum(rows[first + k][state.ids[i + k]] for k in range(j - i))
            end = math.log(sum(math.exp(rows[first + j - i][e]) for e in markers.ends))
            scores.append((lead + body + end, -i - 1, -(j - i), (i, j)))
    best = max(scores, key=lambda s: (s[0], s[1] == 0, s[1], s[2]))
    total = math.log(sum(math.exp(s[0]) for s in scores))
    return best[3], math.exp(best[0] - total)


def test_the_favoured_piece_is_found_with_its_offsets() -> None:
    state = words("The capital of France is Paris.")
    paris = state.ids.index(ord("P"))
    rows = rows_for(state, 8, {(0, ord("P")): 9.0, (1, STOP): 9.0})
    scores = score_blank(state, rows, SPAN)
    assert scores.best == (paris, paris + 1)
    assert state.piece(*scores.best) == ("Paris.", 25, 31)  # the leading space is trimmed, offsets follow
    assert (scores.best, pytest.approx(scores.confidence)) == brute_force(state, rows, SPAN)
    assert 0.0 < scores.mass <= 1.0


def test_a_blank_that_starts_with_the_end_is_not_found() -> None:
    state = words("nothing to see here")
    scores = score_blank(state, rows_for(state, 8, {(0, STOP): 12.0}), SPAN)
    assert scores.best is None
    assert scores.confidence > 0.9


def test_a_longer_piece_needs_every_token_and_its_end() -> None:
    state = words("ship to 12 Rue de Rivoli please")
    start = state.ids.index(ord("1"))
    favour = {(0, ord("1")): 8.0, (1, ord("R")): 8.0, (2, ord("d")): 8.0, (3, ord("R")): 8.0, (4, STOP): 8.0}
    rows = rows_for(state, 10, favour)
    scores = score_blank(state, rows, SPAN)
    assert state.piece(*scores.best) == ("12 Rue de Rivoli", 8, 24)
    assert scores.best == (start, start + 4)
    assert scores.confidence == pytest.approx(brute_force(state, rows, SPAN)[1])


def test_a_piece_never_splits_a_character_the_tokenizer_wrote_as_bytes() -> None:
    # "a🫨b": the emoji is four byte tokens that share its one-character span.
    state = StateTokens("a🫨b", (7, 11, 12, 13, 14, 8), ((0, 1), (1, 2), (1, 2), (1, 2), (1, 2), (2, 3)))
    favour = {(0, 12): 20.0, (1, 13): 20.0, (2, STOP): 20.0}  # the middle bytes alone would score best
    rows = [{**row, 11: row.get(11, -5.0)} for row in rows_for(state, 8, favour)]
    scores = score_blank(state, rows, SPAN)
    assert scores.best is None or (state.starts_at(scores.best[0]) and state.ends_at(scores.best[1] - 1))
    favour = {(0, 11): 9.0, (1, 12): 9.0, (2, 13): 9.0, (3, 14): 9.0, (4, STOP): 9.0}
    whole = score_blank(state, rows_for(state, 8, favour), SPAN)
    assert whole.best == (1, 5) and state.piece(*whole.best) == ("🫨", 1, 2)


def test_spans_pieces_never_hold_the_separator_and_later_pieces_open_with_it() -> None:
    state = words("red ; green")
    sep_state = StateTokens(state.text, tuple(SEP if t == ord(";") else t for t in state.ids), state.offsets)
    rows = rows_for(sep_state, 8, {(0, ord("r")): 9.0, (1, SEP): 9.0, (2, ord("g")): 9.0, (3, STOP): 9.0})
    first = score_blank(sep_state, rows, SPANS)
    assert sep_state.piece(*first.best) == ("red", 0, 3)  # "red ; green" would hold the separator
    later = rows_for(sep_state, 8, {(0, SEP): 9.0, (1, ord("g")): 9.0, (2, STOP): 9.0})
    second = score_blank(sep_state, later, SPANS, continues=True, taken=[first.best])
    assert sep_state.piece(*second.best) == ("green", 6, 11)
    assert (second.best, pytest.approx(second.confidence)) == brute_force(
        sep_state, later, SPANS, continues=True, taken=[first.best]
    )
    # A piece found before cannot be found again.
    again = rows_for(sep_state, 8, {(0, SEP): 9.0, (1, ord("r")): 9.0, (2, STOP): 9.0})
    assert score_blank(sep_state, again, SPANS, continues=True, taken=[first.best]).best != first.best


def test_several_reads_average_their_probabilities() -> None:
    one = [{5: math.log(0.2), 6: math.log(0.8)}]
    two = [{5: math.log(0.6), 6: math.log(0.4)}]
    [mean] = mean_rows([one, two])
    assert math.exp(mean[5]) == pytest.approx(0.4) and math.exp(mean[6]) == pytest.approx(0.6)


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(st.sampled_from("ab Zé李🫨;\n"), min_size=1, max_size=12),
    seed=st.integers(0, 2**32),
    width=st.integers(2, 9),
)
def test_any_read_answers_a_substring_and_matches_the_brute_force(text: str, seed: int, width: int) -> None:
    """Whatever the read says, the answer is `state[start:end]`; best and confidence equal the enumeration's."""
    rng = random.Random(seed)
    ids, offsets = [], []
    for index, char in enumerate(text):  # one token per character, the emoji as two byte tokens
        parts = 2 if char == "🫨" else 1
        ids += [SEP if char == ";" else ord(char) % 50 + (p * 60) for p in range(parts)]
        offsets += [(index, index + 1)] * parts
    state = StateTokens(text, tuple(ids), tuple(offsets))
    wanted = [*state.distinct_ids, STOP, SEP]
    rows = [{token: -rng.uniform(0.0, 6.0) for token in wanted} for _ in range(width)]
    cut = rng.randrange(len(ids))
    taken = [(cut, rng.randrange(cut, len(ids)) + 1)]  # a piece found before, in a later round of spans
    for markers, continues, before in ((SPAN, False, []), (SPANS, False, []), (SPANS, True, taken)):
        scores = score_blank(state, rows, markers, continues=continues, taken=before)
        expected_best, expected_share = brute_force(state, rows, markers, continues=continues, taken=before)
        assert scores.best == expected_best
        assert scores.confidence == pytest.approx(expected_share, rel=1e-9)
        if scores.best is not None:
            piece, start, end = state.piece(*scores.best)
            assert piece == text[start:end] and piece.strip() == piece and piece
            assert not any(a < scores.best[1] and scores.best[0] < b for a, b in before)
