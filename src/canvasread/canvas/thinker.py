"""The `Thinker` protocol: a thought in the model's thought channel, written before a request's reads.

`think: N` asks the model to think before it answers: an ordinary diffusion
generation, with the chat template's thought channel open, of at most N
tokens. The read's prompt ends with the empty thought block
`<|channel>thought\\n<channel|>`; the thought's prompt is that prompt with the
block left open (everything before `<channel|>`), and the read then holds
`<|channel>thought\\n{thought}<channel|>` where the empty block was, so every
slot conditions on the thought. The splice is done on token ids: the read
sees exactly the ids the model wrote, never a re-tokenisation of their text.

Contract for `think(requests)`:
- each `ThoughtRequest.prompt_ids` ends inside the open thought channel; the
  thinker continues it with the checkpoint's own diffusion sampling (its
  `generation_config.json`: denoising steps, temperature schedule, sampler)
  and no other filtering, for at most `max_tokens` tokens;
- generation stops at the first of `stop_ids` (`<channel|>` closes the
  thought, `<turn|>` ends the turn) or after `max_tokens`; the `Thought`
  holds the ids before the stop, never the stop itself and never more than
  `max_tokens` ids, and whether a stop id ended it;
- `seed` reproduces the thought where the runtime can seed its sampler (in
  process); a runtime that cannot (vLLM refuses seeds for diffusion
  requests) documents that it ignores it;
- the requests of one call belong to one batch and may run concurrently;
  a request for which `gone(i)` is true when its turn comes (its caller has
  left) is skipped: its entry is None; failures are raised as canvasread
  errors, as the `Reader` raises them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas.layouts import ReadLayout
from canvasread.canvas.plan import ReadPlan
from canvasread.canvas.prompt import EncodedPrompt
from canvasread.canvas.reader import PromptImage
from canvasread.canvas.tokenizer import Tokenizer
from canvasread.types import DecisionRequest, JSONValue

THOUGHT_CLOSE = "<channel|>"
END_OF_TURN = "<turn|>"


@dataclass(frozen=True)
class ThoughtRequest:
    """One thought to write: the prompt with the thought channel open, its length cap, its seed."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    stop_ids: tuple[int, ...]
    seed: int
    # The prompt's images, as a read of the same prompt places them (a thinker that cannot see them refuses them).
    images: tuple[PromptImage, ...] = ()
    # The part of the prompt shared by requests that ask the same questions (a reader's cached prefix).
    prefix_length: int = 0


@dataclass(frozen=True)
class Thought:
    """What the model wrote in its thought channel (without the closing token) and how long it took."""

    token_ids: tuple[int, ...]
    closed: bool
    ms: float


class Thinker(Protocol):
    def think(self, requests: Sequence[ThoughtRequest], gone: Gone = never_gone) -> list[Thought | None]: ...


@dataclass(frozen=True)
class ThoughtChannel:
    """The ids that end a thought, for one tokenizer: `<channel|>` (it closes the block) and `<turn|>`."""

    close_id: int
    stop_ids: tuple[int, ...]

    @staticmethod
    def missing(tokenizer: Tokenizer) -> str:
        """Why `of` finds no channel: the markers this tokenizer does not keep as one token each."""
        split = [text for text in (THOUGHT_CLOSE, END_OF_TURN) if len(tokenizer.encode(text)) != 1]
        return f"its tokenizer does not keep {' and '.join(split)} as one token, which ends a thought"

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> ThoughtChannel | None:
        """The tokenizer's channel, or None when it does not keep both markers as single tokens (no thinking)."""
        close, end = tokenizer.encode(THOUGHT_CLOSE), tokenizer.encode(END_OF_TURN)
        if len(close) != 1 or len(end) != 1:
            return None
        return cls(close[0], (close[0], end[0]))

    def request(self, read_prompt: EncodedPrompt, max_tokens: int, seed: int) -> ThoughtRequest:
        """The thought's request: the read prompt with its empty thought block left open (its images where they
        are, its shared prefix kept)."""
        ids = read_prompt.ids
        if not ids or ids[-1] != self.close_id:
            raise ValueError("the read prompt does not end with the empty thought block")
        prefix = min(read_prompt.prefix_length, len(ids) - 1)
        return ThoughtRequest(tuple(ids[:-1]), max_tokens, self.stop_ids, seed, read_prompt.images, prefix)


def with_thought(read_prompt: Sequence[int], thought: Thought) -> tuple[int, ...]:
    """The read prompt (ending with the empty thought block's closing id) with `thought` written into the block."""
    return (*read_prompt[:-1], *thought.token_ids, read_prompt[-1])


def think_refusal(
    request: DecisionRequest, plan: ReadPlan, layout: ReadLayout, max_positions: int | None
) -> str | None:
    """Why this request's `think` cannot be honoured by a model that thinks (None: it can)."""
    think = request.options.think
    if think is None:
        return None
    if layout.thought != "prompt":
        return (
            f"think writes into the prompt's thought block, and this server's read layout {layout.name!r} puts "
            "that block on the canvas; serve with --layout default to think"
        )
    if len(plan.prompts) != 1:
        return (
            f"think writes one thought for the request's prompt, and the read layout {layout.name!r} gives "
            "each canvas a prompt of its own; serve with --layout default to think"
        )
    width = max(len(canvas.ids) for canvas in plan.canvases)
    prompt = len(plan.prompts[0].ids)
    if max_positions is not None and prompt + think + width > max_positions:
        return (
            f"the prompt takes {prompt} tokens and the answer {width}, so a thought of {think} tokens "
            f"would pass the {max_positions} this model reads; ask for at most {max_positions - prompt - width}"
        )
    return None


def thought_prefix(request: ThoughtRequest, tokens: Sequence[int], ms: float) -> Thought:
    """What a generation wrote after the prompt, cut at the first stop id and at `max_tokens`."""
    cut = next((i for i, token in enumerate(tokens) if token in request.stop_ids), None)
    kept = tokens[: request.max_tokens if cut is None else min(cut, request.max_tokens)]
    return Thought(tuple(kept), cut is not None and cut <= request.max_tokens, ms)


def thought_details(thought: Thought, tokenizer: Tokenizer) -> dict[str, JSONValue]:
    """`diagnostics.thought`: the text the model wrote, its length in tokens and the time it took."""
    return {"text": tokenizer.decode(thought.token_ids), "tokens": len(thought.token_ids), "ms": thought.ms}
