"""`Backlog` on its own: waits in cost units at the rate served while busy, never a division by nothing."""

from __future__ import annotations

import pytest

from canvasread.admission import MAX_RETRY_S, RATE_MIN_BATCHES, Backlog


def test_no_rate_no_wait_until_enough_batches_were_served() -> None:
    backlog = Backlog()
    backlog.busy(0.0)
    for n in range(RATE_MIN_BATCHES - 1):
        backlog.served(10.0, 1, float(n + 1))
        assert backlog.wait_s(preparing=5) is None
    backlog.served(10.0, 1, float(RATE_MIN_BATCHES))
    assert backlog.wait_s(preparing=0) == 0.0


def test_the_wait_counts_cost_not_requests() -> None:
    """Served 100 units a second; one queued job of 300 units is a 3 s wait, three of 10 units 0.3 s."""
    heavy, light = Backlog(), Backlog()
    for backlog in (heavy, light):
        backlog.busy(0.0)
        for n in range(RATE_MIN_BATCHES):
            backlog.served(100.0, 2, float(n + 1))
    heavy.add(300.0)
    for _ in range(3):
        light.add(10.0)
    assert heavy.wait_s(preparing=0) == pytest.approx(3.0)
    assert light.wait_s(preparing=0) == pytest.approx(0.3)
    # a request still being prepared counts as the mean served job: 50 units, half a second
    assert light.wait_s(preparing=1) == pytest.approx(0.8)


def test_the_cost_ahead_counts_requests_still_preparing_at_the_mean_cost_with_or_without_a_rate() -> None:
    """Two prepared jobs of 30 and 50 units, and recent jobs of 20 units on average: two requests still being
    prepared count 40 more. The cost ahead needs no rate (a free batch is judged by it before one is measured)."""
    backlog = Backlog()
    backlog.add(30.0)
    backlog.add(50.0)
    assert backlog.cost_ahead(preparing=2) == 80.0  # nothing served yet: no mean cost
    backlog.busy(0.0)
    backlog.served(40.0, 2, 1.0)
    assert backlog.cost_ahead(preparing=2) == pytest.approx(120.0)
    assert backlog.cost_ahead(preparing=-1) == pytest.approx(80.0)


def test_the_rate_is_measured_over_busy_time_only() -> None:
    """Idle time between bursts does not slow the measured rate; overlapping batches count their span once."""
    backlog = Backlog()
    for burst in range(RATE_MIN_BATCHES):
        start = burst * 100.0  # long idle gaps between bursts
        backlog.busy(start)
        backlog.served(10.0, 1, start + 1.0)
        backlog.idle()
    assert backlog.rate() == pytest.approx(10.0)
    backlog.busy(1000.0)
    backlog.served(10.0, 1, 1001.0)
    backlog.served(10.0, 1, 1001.5)  # a second batch in flight finishes half a second later
    assert backlog.rate() == pytest.approx(60.0 / 5.5)


def test_work_that_costs_nothing_gives_no_rate_instead_of_dividing_by_zero() -> None:
    backlog = Backlog()
    backlog.busy(0.0)
    for n in range(RATE_MIN_BATCHES):
        backlog.served(0.0, 1, float(n + 1))
    assert backlog.rate() is None and backlog.wait_s(preparing=3) is None


def test_shed_requests_are_told_to_come_back_one_mean_job_apart() -> None:
    """Served 100 units a second in jobs of 50 (half a second each): three requests shed at once, 0.2 s past the
    budget, come back 0.7, 1.2 and 1.7 s later, not all at once; once those times have passed, the spacing
    starts again from the backlog."""
    backlog = Backlog()
    backlog.busy(0.0)
    for n in range(RATE_MIN_BATCHES):
        backlog.served(100.0, 2, float(n + 1))
    hints = [backlog.retry_after(0.2, now=10.0) for _ in range(3)]
    assert hints == pytest.approx([0.7, 1.2, 1.7])
    assert backlog.retry_after(0.2, now=20.0) == pytest.approx(0.7)


def test_the_spacing_stops_at_the_longest_retry() -> None:
    backlog = Backlog()
    backlog.busy(0.0)
    for n in range(RATE_MIN_BATCHES):
        backlog.served(100.0, 1, float(n + 1))
    hints = [backlog.retry_after(0.0, now=0.0) for _ in range(100)]
    assert max(hints) == MAX_RETRY_S and hints == sorted(hints)
    assert Backlog().retry_after(0.3, now=5.0) == pytest.approx(0.3)  # no rate yet: the wait alone
