"""Planning against the real Gemma vocabulary: where the thought block goes, and the pad after end-of-turn."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from canvasread.canvas.layouts import LAYOUTS, layout_named
from canvasread.canvas.plan import Planner
from canvasread.canvas.prompt import THOUGHT_BLOCK
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.wire import parse_request


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
    assert list(plan.prompts[0].ids[-len(thought) :]) == thought
    assert list(plan.prompts[0].ids[-len(thought) - len(generation_prompt) : -len(thought)]) == generation_prompt
    [canvas] = plan.canvases
    assert tokenizer.decode(canvas.ids[: canvas.text_tokens]).startswith("q0: ")
    assert thought[0] not in canvas.ids and thought[-1] not in canvas.ids  # <|channel>, <channel|>


def test_the_thought_on_canvas_layout_keeps_the_old_placement(tokenizer: HFTokenizer) -> None:
    plan = Planner(tokenizer, canvas_length=64, max_positions=None, layout=layout_named("thought-on-canvas")).plan(
        request(nouls(2))
    )
    thought = tokenizer.encode(THOUGHT_BLOCK)
    assert list(plan.prompts[0].ids[-3:]) == tokenizer.encode("<|turn>model\n")[-3:]
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


def test_one_prompt_serves_every_canvas_of_a_request_by_default(tokenizer: HFTokenizer) -> None:
    plan = Planner(tokenizer, canvas_length=48, max_positions=None).plan(request(nouls(8)))
    assert len(plan.canvases) >= 2 and len(plan.prompts) == 1
    assert {canvas.prompt for canvas in plan.canvases} == {0}
    system = tokenizer.decode(list(plan.prompts[0].ids))
    assert all(f"Question `q{i}`" in system for i in range(8))
    assert plan.prompt_tokens == len(plan.prompts[0].ids)


def test_prompt_per_canvas_lists_only_the_questions_on_its_canvas(tokenizer: HFTokenizer) -> None:
    planner = Planner(tokenizer, canvas_length=48, max_positions=None, layout=layout_named("prompt-per-canvas"))
    plan = planner.plan(request(nouls(8)))
    assert len(plan.canvases) >= 2 and len(plan.prompts) == len(plan.canvases)
    for index, canvas in enumerate(plan.canvases):
        assert canvas.prompt == index
        prompt = plan.prompt(canvas)
        listed = {i for i in range(8) if f"Question `q{i}`" in tokenizer.decode(list(prompt.ids))}
        assert listed == set(canvas.questions)
        assert tokenizer.decode(list(prompt.ids)).count("I was charged twice.") == 1
        assert prompt.prefix_length < len(prompt.ids)
    assert plan.prompt_tokens == sum(len(prompt.ids) for prompt in plan.prompts)


def test_bare_single_reads_one_question_as_the_replys_first_token(tokenizer: HFTokenizer) -> None:
    planner = Planner(tokenizer, canvas_length=48, max_positions=None, layout=layout_named("bare-single"))
    plan = planner.plan(request(nouls(1)))
    [canvas], [prompt], [planned] = plan.canvases, plan.prompts, plan.questions
    assert planned.position == 0, "the label is the canvas's first token"
    assert tokenizer.decode(canvas.ids[: canvas.text_tokens]) == f"{planned.labels[0]}<turn|>"
    text = tokenizer.decode(list(prompt.ids))
    state_at, question_at = text.index("I was charged twice."), text.index("Question `q0`")
    assert state_at < question_at < text.index("<|turn>model"), "the question follows the state in the user turn"
    assert "one line per question" not in text
    several = planner.plan(request(nouls(2)))
    assert tokenizer.decode(several.canvases[0].ids[: several.canvases[0].text_tokens]).startswith("q0: ")


def test_an_image_goes_only_into_the_prompts_that_mention_it(tokenizer: HFTokenizer) -> None:
    from canvasread.canvas.prompt import ImageTokens
    from canvasread.errors import InvalidRequest
    from canvasread.types import ImageAsset

    images = ImageTokens(begin_id=255999, token_id=262144, end_id=256000, count=lambda asset: 4)
    planner = Planner(
        tokenizer, canvas_length=48, max_positions=None, images=images, layout=layout_named("prompt-per-canvas")
    )
    questions = nouls(8)
    questions["q7"]["instructions"] = "Does photo.png show the parcel?"
    parsed = request(questions)
    asset = ImageAsset(placeholder="photo.png", format="png", data=b"png", width=2, height=2)
    plan = planner.plan(replace(parsed, assets={"photo.png": asset}))
    seen = [len(plan.prompt(canvas).images) for canvas in plan.canvases]
    assert seen[-1] == 1 and set(seen[:-1]) == {0}
    with pytest.raises(InvalidRequest, match="not referenced"):
        planner.plan(replace(parsed, questions=parsed.questions[:7], assets={"photo.png": asset}))


@pytest.mark.parametrize("layout", ["default", "bare-single"])
def test_questions_too_long_for_the_context_are_refused_at_the_questions(tokenizer: HFTokenizer, layout: str) -> None:
    """A shorter state would not help, so the 422 must not blame it (the bare layout puts the question after the
    state, so its prompt's shared prefix does not tell the parts apart)."""
    from canvasread.errors import InvalidRequest

    planner = Planner(tokenizer, canvas_length=48, max_positions=256, layout=layout_named(layout))
    with pytest.raises(InvalidRequest) as caught:
        planner.plan(request({"q": {"type": "noul", "instructions": "word " * 400}}))
    [problem] = caught.value.problems
    assert problem.loc == ("questions",) and "the questions take" in problem.msg and "without the state" in problem.msg
    with pytest.raises(InvalidRequest) as caught:
        planner.plan(replace(request(nouls(1)), state="word " * 400))
    [problem] = caught.value.problems
    assert problem.loc == ("state",) and "the state and questions take" in problem.msg
