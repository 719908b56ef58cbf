"""`JobPlanner`: a request becomes a job, or is refused, on its own thread; the step-limit and `think` refusals name
their field; prompts past the reader's store are a 413 naming its limit; a job's cost is its prompts and first reads."""

from __future__ import annotations

from typing import Any

import pytest

from canvasread.canvas.plan import Planner
from canvasread.canvas.planning import JobPlanner, StoreCapacity, Unreadable
from canvasread.canvas.thinking import Thinking
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.errors import InvalidRequest, PayloadTooLarge
from canvasread.types import DecisionRequest, JobCost
from canvasread.wire import parse_request

NOUL = {"type": "noul", "instructions": "Was the customer charged twice?"}
CHOICE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None, "sales": None}}
SPAN = {"type": "span", "instructions": "Which order?"}


def request(questions: dict[str, Any], **extra: Any) -> DecisionRequest:
    return parse_request({"model": "m", "state": "charged twice for order 1182", "questions": questions, **extra})[1]


def job_planner(
    tokenizer: HFTokenizer, step_label_ids: int | None = None, capacity: StoreCapacity | None = None
) -> JobPlanner:
    planner = Planner(tokenizer, canvas_length=64, max_positions=None)
    return JobPlanner(planner, Thinking(None, tokenizer), step_label_ids, Unreadable("m"), capacity)


def test_a_job_carries_its_plan_its_seed_and_the_state_tokens_only_for_span_questions(tokenizer: HFTokenizer) -> None:
    planning = job_planner(tokenizer)
    job = planning.prepare(request({"money": NOUL}, seed=9))
    assert job.seed == 9 and job.state is None and len(job.plan.questions) == 1
    spans = planning.prepare(request({"money": NOUL, "order": SPAN}))
    assert spans.state is not None and spans.state.text == "charged twice for order 1182"
    assert [spans.is_blank(canvas) for canvas in spans.plan.canvases] == [False, True]


def test_a_multi_step_canvas_past_the_readers_label_ids_is_refused_at_steps(tokenizer: HFTokenizer) -> None:
    questions = {"money": NOUL, "team": CHOICE}  # one canvas
    planned = job_planner(tokenizer).prepare(request(questions)).plan.questions
    asked = len({token for question in planned for slot in question.slots for token in slot.read_ids})
    planning = job_planner(tokenizer, step_label_ids=asked - 1)
    with pytest.raises(InvalidRequest) as refused:
        planning.prepare(request(questions, steps=2))
    [problem] = refused.value.problems
    assert problem.loc == ("steps",) and f"at most {asked - 1} label ids" in problem.msg
    assert f"this canvas asks {asked}" in problem.msg and problem.msg.endswith("ask with steps 1")
    assert planning.prepare(request(questions, steps=1)).request.options.steps == 1
    assert job_planner(tokenizer, step_label_ids=asked).prepare(request(questions, steps=2)).request.options.steps == 2


def test_think_is_refused_at_think_by_a_model_that_cannot(tokenizer: HFTokenizer) -> None:
    with pytest.raises(InvalidRequest) as refused:
        job_planner(tokenizer).prepare(request({"money": NOUL}, think=8))
    [problem] = refused.value.problems
    assert problem.loc == ("think",) and problem.msg == "this model cannot think before it reads"


def test_the_cost_is_the_prompts_and_every_canvas_of_the_first_reads(tokenizer: HFTokenizer) -> None:
    planning = job_planner(tokenizer)
    job = planning.prepare(request({"money": NOUL, "team": CHOICE}, samples=3))
    canvases = sum(len(canvas.ids) for canvas in job.plan.canvases)
    assert job.first_reads == 3 and planning.cost(job) == JobCost(job.plan.prompt_tokens + 3 * canvases, 0)
    auto = planning.prepare(request({"money": NOUL}))
    assert auto.first_reads == 1, "samples auto reads once at first"


def test_prompts_past_the_readers_store_are_a_413_naming_its_limit(tokenizer: HFTokenizer) -> None:
    """Each prompt counts its pages rounded up, plus one where a cached prefix may end mid-page."""
    job = job_planner(tokenizer).prepare(request({"money": NOUL}))
    [prompt] = job.plan.prompts
    needed = -(-len(prompt.ids) // 16) + 1
    job_planner(tokenizer, capacity=StoreCapacity(needed, 16, "the store flag")).prepare(request({"money": NOUL}))
    with pytest.raises(PayloadTooLarge) as refused:
        job_planner(tokenizer, capacity=StoreCapacity(needed - 1, 16, "the store flag")).prepare(
            request({"money": NOUL})
        )
    message = refused.value.message
    assert f"need {needed} pages of 16 tokens" in message and f"holds {needed - 1}" in message
    assert "the store flag" in message


def test_a_store_too_small_for_the_smallest_request_is_refused_at_load_naming_its_limit(
    tokenizer: HFTokenizer,
) -> None:
    """Such a store would answer every request with a 413; a store that holds the smallest request is kept."""
    smallest = job_planner(tokenizer).prepare(request({"q": {"type": "noul", "instructions": "?"}}, state="."))
    [prompt] = smallest.plan.prompts
    needed = -(-len(prompt.ids) // 16) + 1
    job_planner(tokenizer, capacity=StoreCapacity(needed, 16, "the store flag")).check_capacity()
    with pytest.raises(ValueError) as refused:
        job_planner(tokenizer, capacity=StoreCapacity(needed - 1, 16, "the store flag")).check_capacity()
    message = str(refused.value)
    assert f"holds {needed - 1} pages of 16 tokens (the store flag)" in message
    assert f"smallest request's prompt needs {needed} ({len(prompt.ids)} tokens)" in message
    job_planner(tokenizer).check_capacity()  # no store bound: nothing to check
