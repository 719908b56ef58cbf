"""What one batch may take: its own cost budget, and room beside the batches a backend is already reading.

A batch takes jobs while their summed cost stays within one batch's budget
(`BatchSettings.max_batch_tokens`, `max_batch_pixels`), so peak memory
follows the budget whatever the mix. A backend that reads several batches at
once merges them into its passes, so what the running batches hold together
is bounded too: by `budgets` budgets (one per replica). The first job of a
batch always fits while no batch runs, so a job over the budget alone still
runs, alone.
"""

from __future__ import annotations

from canvasread.types import JobCost


class BatchBudget:
    """What one batch has taken of its budget (`limit`), and what it holds with the running batches (`running`,
    None when none runs) of `budgets` budgets."""

    def __init__(self, limit: JobCost, running: JobCost | None, budgets: int) -> None:
        self._limit = limit
        self._budgets = budgets
        self._batch = JobCost()
        self._held = running if running is not None else JobCost()
        self._taken = running is not None

    def fits(self, cost: JobCost) -> bool:
        """Take a job of `cost` into the batch if it fits (True), else leave the budget as it was (False)."""
        batch, held = self._batch.plus(cost), self._held.plus(cost)
        if self._taken and (self._over(batch, 1) or self._over(held, self._budgets)):
            return False
        self._batch, self._held, self._taken = batch, held, True
        return True

    def _over(self, cost: JobCost, budgets: int) -> bool:
        limit = self._limit
        return cost.tokens > limit.tokens * budgets or cost.pixels > limit.pixels * budgets
