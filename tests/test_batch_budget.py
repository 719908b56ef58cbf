"""`BatchBudget`: a batch's own budget, and the room beside the batches already running."""

from __future__ import annotations

from canvasread.batch_budget import BatchBudget
from canvasread.types import JobCost

LIMIT = JobCost(tokens=100, pixels=1_000)


def taken(budget: BatchBudget, costs: list[JobCost]) -> list[bool]:
    return [budget.fits(cost) for cost in costs]


def test_a_batch_takes_jobs_while_their_sum_fits_its_budget() -> None:
    budget = BatchBudget(LIMIT, None, 1)
    assert taken(budget, [JobCost(60), JobCost(30), JobCost(20), JobCost(10)]) == [True, True, False, True]


def test_pixels_bound_a_batch_as_tokens_do() -> None:
    budget = BatchBudget(LIMIT, None, 1)
    assert taken(budget, [JobCost(1, 700), JobCost(1, 400), JobCost(1, 300)]) == [True, False, True]


def test_a_job_over_the_budget_runs_alone_when_nothing_else_does() -> None:
    budget = BatchBudget(LIMIT, None, 1)
    assert taken(budget, [JobCost(250), JobCost(1)]) == [True, False]


def test_beside_running_batches_even_the_first_job_must_fit() -> None:
    budget = BatchBudget(LIMIT, JobCost(90), 1)
    assert taken(budget, [JobCost(20), JobCost(10)]) == [False, True]


def test_replicas_give_the_running_batches_a_budget_each() -> None:
    """Two budgets: 150 tokens running leave 50 beside them, though one batch alone could take 100."""
    budget = BatchBudget(LIMIT, JobCost(150), 2)
    assert taken(budget, [JobCost(60), JobCost(50), JobCost(1)]) == [False, True, False]
