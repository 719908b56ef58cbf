"""`Thinking`: one thinker call writes a batch's thoughts before any read, a caller who has gone gets none, the reads
see the thought in the prompt's block, and the results report it and count its tokens."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from helpers import FirstLabel, scripted_backend

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas.backend import ReadSettings
from canvasread.canvas.layouts import layout_named
from canvasread.canvas.thinker import Thought, ThoughtRequest, with_thought
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.errors import InvalidRequest
from canvasread.wire import parse_request

QUESTIONS = {"refund": {"type": "noul", "instructions": "Is the customer asking for money back?"}}


class Writer:
    """A thinker that writes two tokens for every request whose caller waits, and keeps each call's requests."""

    def __init__(self) -> None:
        self.calls: list[list[ThoughtRequest]] = []

    def think(self, requests: Sequence[ThoughtRequest], gone: Gone = never_gone) -> list[Thought | None]:
        self.calls.append(list(requests))
        return [None if gone(i) else Thought((236770, 236771), True, 2.0) for i in range(len(requests))]


def test_a_batch_thinks_in_one_call_and_reads_with_its_thoughts(tokenizer: HFTokenizer) -> None:
    reader, writer = FirstLabel(), Writer()
    backend = scripted_backend(reader, tokenizer, thinker=writer)
    bodies = [{"model": "m", "state": "refund me", "questions": QUESTIONS, "think": 4, "seed": s} for s in (1, 2)]
    bodies.append({"model": "m", "state": "refund me", "questions": QUESTIONS})
    jobs = [backend.prepare(parse_request(body)[1]) for body in bodies]
    results = backend.decide(jobs, lambda j: j == 1)
    [call] = writer.calls
    assert [request.seed for request in call] == [1, 2] and all(r.max_tokens == 4 for r in call)
    assert results[1] is None
    [read_call] = reader.calls
    thought = Thought((236770, 236771), True, 2.0)
    assert read_call[0].prompt_ids == with_thought(jobs[0].plan.prompts[0].ids, thought)
    assert read_call[2].prompt_ids == jobs[2].plan.prompts[0].ids, "a job that does not think reads its own prompt"
    first, last = results[0], results[2]
    assert first is not None and last is not None
    details = first.distributions[0].details["thought"]
    assert details == {"text": tokenizer.decode(thought.token_ids), "tokens": 2, "ms": 2.0}
    assert first.usage.input_tokens == last.usage.input_tokens + 2 and "thought" not in last.distributions[0].details


@pytest.mark.parametrize("layout", ["thought-on-canvas", "prompt-per-canvas"])
def test_a_layout_without_one_prompt_thought_block_refuses_think(tokenizer: HFTokenizer, layout: str) -> None:
    settings = ReadSettings(layout=layout_named(layout))
    backend = scripted_backend(FirstLabel(), tokenizer, thinker=Writer(), settings=settings)
    questions = {**QUESTIONS, "other": {"type": "noul", "instructions": "Is it urgent?", "alone": True}}
    with pytest.raises(InvalidRequest) as refused:
        backend.prepare(parse_request({"model": "m", "state": "refund me", "questions": questions, "think": 4})[1])
    [problem] = refused.value.problems
    assert problem.loc == ("think",) and f"{layout!r}" in problem.msg and "--layout default" in problem.msg
