"""Which questions wait for which: references checked, cycles refused, one stage number per question.

A question's prerequisites are the questions it names in `depends_on` and in
`ask_if`. Its stage is 0 without prerequisites, else one past the latest
stage among them, so independent questions share a stage and each stage is
one batched read. Every problem is a 422 located at the offending key.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.kinds import kind_of
from canvasread.types import Question


def prerequisites(question: Question) -> tuple[str, ...]:
    """The keys a question waits on: `depends_on` first, then `ask_if`, each once, in the order given."""
    return tuple(dict.fromkeys([*question.depends_on, *(condition.key for condition in question.ask_if)]))


def is_staged(questions: Sequence[Question]) -> bool:
    """Whether any question waits on another (a request without the keys is one plain stage)."""
    return any(question.depends_on or question.ask_if for question in questions)


def stage_numbers(questions: Sequence[Question]) -> tuple[int, ...]:
    """Each question's stage, in question order; raises `InvalidRequest` for unknown ids, bad values, cycles."""
    by_key = {question.key: index for index, question in enumerate(questions)}
    problems = [problem for question in questions for problem in _reference_problems(question, questions, by_key)]
    if problems:
        raise InvalidRequest(problems)
    return _levels(questions, by_key)


def _loc(question: Question, *rest: str | int) -> tuple[str | int, ...]:
    return ("questions", question.key, question.kind, *rest)


def _edge_loc(question: Question, prerequisite: str) -> tuple[str | int, ...]:
    """Where a reference is written: its `depends_on` entry if it has one, else its `ask_if` key."""
    if prerequisite in question.depends_on:
        return _loc(question, "depends_on", question.depends_on.index(prerequisite))
    return _loc(question, "ask_if", prerequisite)


def _reference_problems(
    question: Question, questions: Sequence[Question], by_key: Mapping[str, int]
) -> list[FieldProblem]:
    problems = []
    references = [(name, _loc(question, "depends_on", i)) for i, name in enumerate(question.depends_on)]
    references += [(condition.key, _loc(question, "ask_if", condition.key)) for condition in question.ask_if]
    for name, loc in references:
        if name == question.key:
            problems.append(FieldProblem(loc, "a question cannot wait on itself", input=name))
        elif name not in by_key:
            problems.append(FieldProblem(loc, f"there is no question {name!r} in this request", input=name))
    for condition in question.ask_if:
        if condition.key in by_key and condition.key != question.key:
            target = questions[by_key[condition.key]]
            for i, value in enumerate(condition.values):
                if (problem := kind_of(target.kind).ask_if_problem(target, value)) is not None:
                    problems.append(FieldProblem(_loc(question, "ask_if", condition.key, i), problem, input=value))
    return problems


def _levels(questions: Sequence[Question], by_key: Mapping[str, int]) -> tuple[int, ...]:
    """Stage numbers by Kahn's algorithm (no recursion: a chain of 1,000 questions is fine)."""
    waits_on = [[by_key[name] for name in prerequisites(question)] for question in questions]
    dependents: list[list[int]] = [[] for _ in questions]
    for index, before in enumerate(waits_on):
        for prerequisite in before:
            dependents[prerequisite].append(index)
    remaining = [len(before) for before in waits_on]
    levels = [0] * len(questions)
    ready = deque(index for index, count in enumerate(remaining) if count == 0)
    while ready:
        index = ready.popleft()
        for dependent in dependents[index]:
            levels[dependent] = max(levels[dependent], levels[index] + 1)
            remaining[dependent] -= 1
            if remaining[dependent] == 0:
                ready.append(dependent)
    if any(remaining):
        raise _cycle_error(questions, waits_on, remaining)
    return tuple(levels)


def _cycle_error(
    questions: Sequence[Question], waits_on: Sequence[Sequence[int]], remaining: Sequence[int]
) -> InvalidRequest:
    """Name one cycle, located at the reference that closes it.

    Every question left after Kahn's algorithm waits on another one left, so
    following such references from the first of them must come back to a
    question already seen.
    """
    walk = [next(index for index, count in enumerate(remaining) if count)]
    while True:
        step = next(before for before in waits_on[walk[-1]] if remaining[before])
        if step in walk:
            cycle = [*walk[walk.index(step) :], step]
            break
        walk.append(step)
    names = " → ".join(f"`{questions[index].key}`" for index in cycle)
    closing, target = questions[cycle[-2]], questions[cycle[-1]].key
    return InvalidRequest(
        [FieldProblem(_edge_loc(closing, target), f"questions {names} wait on each other in a cycle", input=target)]
    )
