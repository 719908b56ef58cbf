"""Planning against the real Gemma vocabulary: where the thought block goes, and the pad after end-of-turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from canvasread.canvas.layouts import LAYOUTS, layout_named
from canvasread.canvas.plan import THOUGHT_BLOCK, Planner
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.wire import parse_request


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint: Path) -> HFTokenizer:
    return HFTokenizer.load(str(tiny_checkpoint))


def request(questions: dict[str, Any]) -> Any:
    return parse_request({"model": "m", "state": "I was charged twice.", "questions": questions})[1]


def nouls(count: int, long: int = 0) -> dict[str, Any]:
    """`count` yes/no questions, the last `long` of them with names a token longer."""
    names = [f"q{i}" if i < count - long else f"qxx{i}" for i in range(count)]
    return {name: {"type": "noul", "instructions": f"Is statement {name} true?"} for name in names}


def test_the_thought_block_ends_the_prompt_and_the_canvas_starts_with_the_answer(tokenizer: HFTokenizer) -> None:
    plan = Planner(tokenizer, canvas_length=64, max_positions=None).plan(request(nouls(2)))
    thought = tokenizer.encode(THOUGHT_BLOCK)
    generation_prompt = tokenizer.encode("<|turn>model\n")
    assert list(plan.prompt_ids[-len(thought) :]) == thought
    assert list(plan.prompt_ids[-len(thought) - len(generation_prompt) : -len(thought)]) == generation_prompt
    [canvas] = plan.canvases
    assert tokenizer.decode(canvas.ids[: canvas.text_tokens]).startswith("q0: ")
    assert thought[0] not in canvas.ids and thought[-1] not in canvas.ids  # <|channel>, <channel|>


def test_the_thought_on_canvas_layout_keeps_the_old_placement(tokenizer: HFTokenizer) -> None:
    plan = Planner(tokenizer, canvas_length=64, max_positions=None, layout=layout_named("thought-on-canvas")).plan(
        request(nouls(2))
    )
    thought = tokenizer.encode(THOUGHT_BLOCK)
    assert list(plan.prompt_ids[-3:]) == tokenizer.encode("<|turn>model\n")[-3:]
    assert list(plan.canvases[0].ids[: len(thought)]) == thought


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_canvas_keeps_a_pad_after_end_of_turn(tokenizer: HFTokenizer, layout: str) -> None:
    """Question sets of every size and mix of name lengths, so some canvases' text lands exactly on a multiple of
    16: each must still end in at least one pad (vLLM: otherwise label mass is lost)."""
    end_of_turn = tokenizer.encode("<turn|>")[0]
    planner = Planner(tokenizer, canvas_length=48, max_positions=None, layout=layout_named(layout))
    on_a_boundary = 0
    for count in range(1, 12):
        for long in range(count + 1):
            for canvas in planner.plan(request(nouls(count, long))).canvases:
                assert canvas.ids[canvas.text_tokens - 1] == end_of_turn
                assert canvas.text_tokens < len(canvas.ids) <= 48
                assert set(canvas.ids[canvas.text_tokens :]) == {tokenizer.pad_id}
                on_a_boundary += canvas.text_tokens % 16 == 0
    assert on_a_boundary, "no canvas text landed on a boundary: the sweep does not exercise the rule"
