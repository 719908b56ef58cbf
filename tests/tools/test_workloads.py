"""The benchmarks' planned reads are the reads a server makes for the same bodies."""

from __future__ import annotations

from canvasread.canvas.plan import Planner
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.tools.workloads import planned_reads, standard_body, steps_body


def test_planned_reads_carry_each_request_s_steps_and_a_seed_each(tokenizer: HFTokenizer) -> None:
    """A `steps4` body's reads take its 4 steps (a benchmark of them once timed one-step reads), each body seeded
    apart, so two bodies' denoising draws differ."""
    planner = Planner(tokenizer, canvas_length=256, max_positions=None)
    standard = planned_reads(planner, [standard_body(0)], tokenizer.vocab_size)
    stepped = planned_reads(planner, [steps_body(0), steps_body(1)], tokenizer.vocab_size)
    assert {read.steps for read in standard} == {1}
    assert {read.steps for read in stepped} == {4}
    assert len({read.seed for read in stepped}) == 2
