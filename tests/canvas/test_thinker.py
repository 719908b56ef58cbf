"""The thought channel: cutting what a generation wrote, writing it into the read prompt, and `think` on the wire."""

from __future__ import annotations

import pytest
from helpers import post

from canvasread.canvas.prompt import EncodedPrompt
from canvasread.canvas.thinker import Thought, ThoughtChannel, thought_prefix, with_thought
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.types import MAX_THINK_TOKENS

CLOSE, END = 101, 106
QUESTIONS = {"refund": {"type": "noul", "instructions": "Is the customer asking for money back?"}}


@pytest.fixture(scope="module")
def channel(tokenizer: HFTokenizer) -> ThoughtChannel:
    found = ThoughtChannel.of(tokenizer)
    assert found is not None
    return found


def test_the_gemma_tokenizer_ends_thoughts_at_channel_close_and_end_of_turn(channel: ThoughtChannel) -> None:
    assert channel == ThoughtChannel(CLOSE, (CLOSE, END))


def test_the_thought_prompt_is_the_read_prompt_with_the_block_left_open(channel: ThoughtChannel) -> None:
    request = channel.request(EncodedPrompt((2, 105, 100, 45518, 107, CLOSE), 3), 16, seed=3)
    assert request.prompt_ids == (2, 105, 100, 45518, 107) and request.stop_ids == (CLOSE, END)
    assert request.prefix_length == 3, "the thought keeps the prompt's shared prefix, for the prefix cache"
    with pytest.raises(ValueError, match="empty thought block"):
        channel.request(EncodedPrompt((2, 105, 100), 0), 16, seed=3)


@pytest.mark.parametrize(
    ("written", "kept", "closed"),
    [
        pytest.param([7, 8, CLOSE, 9, 9], (7, 8), True, id="closed-by-the-model"),
        pytest.param([7, 8, END, 0, 0], (7, 8), True, id="turn-ended"),
        pytest.param([7, 8, 9, 10, 11, CLOSE], (7, 8, 9, 10), False, id="cut-at-max-tokens"),
        pytest.param([7, 8, 9, 10, CLOSE], (7, 8, 9, 10), True, id="closed-right-at-max-tokens"),
        pytest.param([CLOSE], (), True, id="empty-thought"),
    ],
)
def test_a_generation_is_cut_at_its_first_stop_id_and_at_max_tokens(
    channel: ThoughtChannel, written: list[int], kept: tuple[int, ...], closed: bool
) -> None:
    thought = thought_prefix(channel.request(EncodedPrompt((1, CLOSE), 0), 4, seed=0), written, 12.5)
    assert thought == Thought(kept, closed, 12.5)


def test_the_thought_goes_inside_the_block() -> None:
    assert with_thought((2, 100, 45518, 107, CLOSE), Thought((7, 8), True, 1.0)) == (2, 100, 45518, 107, 7, 8, CLOSE)


@pytest.mark.parametrize("think", [0, -1, MAX_THINK_TOKENS + 1, "8", 2.5, True])
def test_think_outside_one_to_the_maximum_is_a_422_at_think(sparrow_server: str, think: object) -> None:
    response = post(sparrow_server, {"model": "jev-latest", "state": "hi", "questions": QUESTIONS, "think": think})
    assert response.status_code == 422
    assert {tuple(problem["loc"]) for problem in response.json()["detail"]} == {("body", "think")}


def test_the_embedded_model_refuses_think(sparrow_server: str) -> None:
    response = post(sparrow_server, {"model": "jev-latest", "state": "hi", "questions": QUESTIONS, "think": 8})
    assert response.status_code == 422
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", "think"] and "cannot think" in problem["msg"]
