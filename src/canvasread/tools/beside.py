"""Issue 24's think-beside row: standard clients alone, then beside clients that ask for a thought, and how far
their p95 rose (`canvasread.tools.bench`'s levels and clients)."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import platform
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any

from canvasread.tools.bench import Level, level_plan, measure, numbered, warmup_plan
from canvasread.tools.loadgen import LoadPlan, drive
from canvasread.tools.workloads import answers_every_question, standard_body, think_body

# Issue 24's think-beside row: while this many clients think, the p95 of the standard clients beside them
# may rise by at most this factor over the same clients alone.
THINKERS = 8
BESIDE_P95_RISE_TARGET = 1.2
# The thinking clients start this long before the standard ones, so every measured request has thoughts around it.
BESIDE_LEAD_S = 0.5


@dataclass(frozen=True)
class Beside:
    """The same number of standard clients alone, then beside `thinkers` closed-loop clients of the think
    workload (`think` is those clients' own level: their latency and requests per second)."""

    alone: Level
    beside: Level
    think: Level
    thinkers: int

    def summary(self, target: float = BESIDE_P95_RISE_TARGET) -> dict[str, Any]:
        """Both levels, the thinkers', and how far the standard p50 and p95 rose (beside / alone). The target
        is met when the p95 rose by at most `target`, no standard request failed either time, and thoughts
        were written meanwhile (a thinker that only failed would leave the standard clients alone)."""
        p50_ratio = _ratio(self.beside.p50_ms, self.alone.p50_ms)
        p95_ratio = _ratio(self.beside.p95_ms, self.alone.p95_ms)
        answered = self.alone.errors == 0 and self.beside.errors == 0 and self.think.requests_ok > 0
        return {
            "concurrency": self.alone.concurrency,
            "thinkers": self.thinkers,
            "alone_p50_ms": self.alone.p50_ms,
            "alone_p95_ms": self.alone.p95_ms,
            "beside_p50_ms": self.beside.p50_ms,
            "beside_p95_ms": self.beside.p95_ms,
            "p50_ratio": p50_ratio,
            "p95_ratio": p95_ratio,
            "p95_rise_target": target,
            "meets_target": p95_ratio is not None and p95_ratio <= target and answered,
            "think_p50_ms": self.think.p50_ms,
            "think_p95_ms": self.think.p95_ms,
            "think_requests_per_s": self.think.requests_per_s,
            "alone": vars(self.alone),
            "beside": vars(self.beside),
            "think": vars(self.think),
        }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def run_beside(
    url: str,
    model: str,
    concurrencies: Sequence[int],
    *,
    duration_s: float,
    thinkers: int = THINKERS,
    api_key: str = "local",
    think_timeout_s: float = 120.0,
    on_level: Callable[[Beside], None] | None = None,
) -> list[Beside]:
    """For each number of standard clients: a warm-up, `duration_s` of them alone, then `duration_s` of them
    beside `thinkers` think clients (started `BESIDE_LEAD_S` earlier, stopping with them; a thought still being
    written then is waited for). Beside thinkers every request may take up to `think_timeout_s`: a standard read
    that waits behind thoughts is measured, not cut off. No request repeats a state, across both workloads."""
    numbers = itertools.count()
    standard = numbered(standard_body, model, numbers)
    thinking = numbered(think_body, model, numbers)
    results = []
    for concurrency in concurrencies:
        asyncio.run(drive(warmup_plan(url, concurrency, duration_s, api_key), standard, answers_every_question))
        alone = asyncio.run(measure(level_plan(url, concurrency, duration_s, api_key), standard))
        think_plan = LoadPlan(
            url,
            concurrency=thinkers,
            duration_s=BESIDE_LEAD_S + duration_s,
            timeout_s=think_timeout_s,
            api_key=api_key,
            honour_retry_after=True,
        )
        beside_plan = replace(level_plan(url, concurrency, duration_s, api_key), timeout_s=think_timeout_s)
        beside, think = asyncio.run(_beside(measure(think_plan, thinking), beside_plan, standard))
        result = Beside(alone=alone, beside=beside, think=think, thinkers=thinkers)
        results.append(result)
        if on_level is not None:
            on_level(result)
    return results


async def _beside(
    thoughts: Coroutine[Any, Any, Level], plan: LoadPlan, body: Callable[[int], dict[str, Any]]
) -> tuple[Level, Level]:
    """The standard plan's level, measured `BESIDE_LEAD_S` into the thinkers' run, and the thinkers' level."""
    thinking = asyncio.ensure_future(thoughts)
    await asyncio.sleep(BESIDE_LEAD_S)
    beside = await measure(plan, body)
    return beside, await thinking


def summarise_beside(
    results: Sequence[Beside],
    *,
    command: str,
    gpu: str,
    extra: dict[str, Any] | None = None,
    quantization: str = "bf16",
) -> dict[str, Any]:
    """The think-beside results file: the worst p95 rise over the levels run, whether every level met the
    target, then each level (`Beside.summary`)."""
    levels = [result.summary() for result in results]
    ratios = [level["p95_ratio"] for level in levels if level["p95_ratio"] is not None]
    result: dict[str, Any] = {
        "gpu": gpu,
        "date": dt.date.today().isoformat(),
        "command": command,
        "workload": "think-beside",
        "quantization": quantization,
        "thinkers": results[0].thinkers if results else THINKERS,
        "worst_p95_ratio": max(ratios, default=None),
        "p95_rise_target": BESIDE_P95_RISE_TARGET,
        "meets_target": bool(levels) and all(level["meets_target"] for level in levels),
        "levels": levels,
        "request_example": {"standard": standard_body(0), "think": think_body(0)},
        "host": {"python": platform.python_version(), "machine": platform.machine()},
    }
    result.update(extra or {})
    return result
