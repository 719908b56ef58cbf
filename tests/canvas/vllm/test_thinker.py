"""`think` through vLLM: the thought is one plain diffusion generation sent to the stand-in, and every read
sent upstream holds the ids it wrote, inside the prompt's thought block."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import canvas_backend
from vllm_standin import Standin, load_standin, running

from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.canvas.vllm.settings import VllmSettings
from canvasread.catalog import open_decider
from canvasread.decide import Decider
from canvasread.errors import InvalidRequest
from canvasread.wire import parse_request

STATE = {"ticket": "I was charged twice for order 1182, please refund me.", "channel": "email"}
QUESTIONS: dict[str, Any] = {key: {"type": "noul", "instructions": f"Is statement {key} true?"} for key in "abcdefg"}
# vLLM 0.33's `CompletionRequest` types for the fields a thought sends (completion/protocol.py): `stop_token_ids:
# list[int] | None`, `return_token_ids: bool | None`, the sampling fields as for reads.
GENERATION_FIELDS: dict[str, type] = {
    "model": str,
    "prompt": list,
    "max_tokens": int,
    "stop_token_ids": list,
    "return_token_ids": bool,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
}


@pytest.fixture(scope="module")
def proxy(tiny_thinking_checkpoint: Path) -> Iterator[tuple[Decider, Standin]]:
    """`serve --upstream STANDIN --tokenizer CHECKPOINT --upstream-canvas-length 32`, as a library decider."""
    served = load_standin(str(tiny_thinking_checkpoint), served_name="dgemma")
    with running(served) as base:
        upstream = VllmSettings(urls=(base,), tokenizer=str(tiny_thinking_checkpoint), canvas_length=32)
        decider = open_decider((), wings=[upstream])
        yield decider, served
        backend = canvas_backend(decider)
        backend.close()


def test_the_thought_is_a_generation_and_every_read_holds_it(
    proxy: tuple[Decider, Standin], tokenizer: HFTokenizer
) -> None:
    decider, served = proxy
    before = len(served.requests)
    answer = decider.ask(STATE, QUESTIONS, think=8, seed=5, samples=2, diagnostics=True)
    sent = served.requests[before:]
    [generation] = [body for body in sent if "vllm_xargs" not in body]
    reads = [body for body in sent if "vllm_xargs" in body]
    assert sent.index(generation) == 0  # the thought is written before any read is sent
    assert {key: type(value) for key, value in generation.items()} == GENERATION_FIELDS
    assert generation["max_tokens"] == 8
    assert generation["stop_token_ids"] == [tokenizer.encode("<channel|>")[0], tokenizer.encode("<turn|>")[0]]
    assert tokenizer.decode(generation["prompt"]).endswith("<|turn>model\n<|channel>thought\n")

    thought = answer["answers"]["a"]["diagnostics"]["thought"]
    assert all(a["diagnostics"]["thought"] == thought for a in answer["answers"].values())
    assert len(reads) == 4 and len({tuple(body["vllm_xargs"]["diffusion_seed_canvas"]) for body in reads}) == 4
    for body in reads:
        prompt = body["prompt"]
        written = prompt[len(generation["prompt"]) : -1]
        assert prompt == [*generation["prompt"], *written, generation["stop_token_ids"][0]]
        assert len(written) == thought["tokens"] and tokenizer.decode(written) == thought["text"]


def test_a_thought_past_the_context_is_refused_before_anything_is_sent(proxy: tuple[Decider, Standin]) -> None:
    decider, served = proxy
    before = len(served.requests)
    long_state = {"ticket": "refund " * 16_000}  # the prompt fits the tiny model's 16,384 positions, the thought not
    with pytest.raises(InvalidRequest) as refused:
        decider.ask(long_state, {"refund": QUESTIONS["a"]}, think=1024)
    assert [p.loc for p in refused.value.problems] == [("think",)]
    assert len(served.requests) == before


def test_no_thought_is_sent_for_a_caller_already_gone(proxy: tuple[Decider, Standin]) -> None:
    decider, served = proxy
    backend = canvas_backend(decider)
    _, request = parse_request({"model": "dgemma", "state": STATE, "questions": QUESTIONS, "think": 8})
    before = len(served.requests)
    assert backend.decide([backend.prepare(request)], gone=lambda _: True) == [None]
    assert all("vllm_xargs" in body for body in served.requests[before:])
