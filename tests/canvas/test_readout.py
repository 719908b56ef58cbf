"""Readout math: label log-probabilities to distributions, averaging reads, and the `samples: "auto"` rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canvasread.canvas.readout import SlotReading, combine, needs_another_read, normalised_entropy, slot_reading


def test_slot_reading_renormalises_over_the_labels_and_keeps_the_off_label_mass() -> None:
    reading = slot_reading([math.log(0.3), math.log(0.1)])
    assert reading.probabilities == pytest.approx((0.75, 0.25))
    assert reading.label_mass == pytest.approx(0.4)


def test_slot_reading_is_stable_for_very_unlikely_labels() -> None:
    reading = slot_reading([-1000.0, -1001.0])  # exp() of either underflows to 0 without the shift
    assert reading.probabilities == pytest.approx((1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))))
    assert reading.label_mass == 0.0


@given(st.lists(st.floats(min_value=-50, max_value=0), min_size=1, max_size=40))
def test_slot_readings_are_distributions_with_mass_at_most_one(logprobs: list[float]) -> None:
    reading = slot_reading(logprobs)
    assert math.fsum(reading.probabilities) == pytest.approx(1.0)
    assert all(0.0 <= p <= 1.0 for p in reading.probabilities)
    assert 0.0 <= reading.label_mass <= 1.0


def test_normalised_entropy_runs_from_certain_to_uniform() -> None:
    assert normalised_entropy([1.0, 0.0, 0.0]) == 0.0
    assert normalised_entropy([0.25] * 4) == pytest.approx(1.0)
    assert normalised_entropy([1.0]) == 0.0  # one option: nothing to be unsure about
    assert 0.0 < normalised_entropy([0.9, 0.1]) < 1.0


def test_combine_averages_reads_and_reports_their_spread() -> None:
    readings = [SlotReading((0.8, 0.2), 0.9), SlotReading((0.6, 0.4), 0.7), SlotReading((0.4, 0.6), 0.5)]
    combined = combine(readings)
    assert combined.probabilities == pytest.approx((0.6, 0.4))
    assert combined.reads == 3
    assert combined.label_mass == pytest.approx(0.7)
    assert combined.agreement == pytest.approx(2 / 3)  # two of three reads put "0" on top, as the mean does
    # standard error of the mean: sample standard deviation 0.2, over sqrt(3)
    assert combined.standard_errors == pytest.approx((0.2 / math.sqrt(3), 0.2 / math.sqrt(3)))


def test_one_read_has_no_spread() -> None:
    combined = combine([SlotReading((0.7, 0.3), 1.0)])
    assert combined.standard_errors == (0.0, 0.0)
    assert combined.agreement == 1.0 and combined.reads == 1


def test_another_read_only_while_uncertain_and_under_the_cap() -> None:
    certain = [SlotReading((0.95, 0.05), 1.0)]
    unsure = [SlotReading((0.55, 0.45), 1.0)]
    assert not needs_another_read(certain, entropy_threshold=0.5, max_reads=4)
    assert needs_another_read(unsure, entropy_threshold=0.5, max_reads=4)
    assert not needs_another_read(unsure * 4, entropy_threshold=0.5, max_reads=4)
    # judged on the average: two confident reads that disagree are uncertain together
    split = [SlotReading((0.95, 0.05), 1.0), SlotReading((0.05, 0.95), 1.0)]
    assert needs_another_read(split, entropy_threshold=0.5, max_reads=4)
