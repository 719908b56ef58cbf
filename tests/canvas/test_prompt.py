"""The prompt's encoding: its cacheable prefix found once per system turn, the same as found afresh."""

from __future__ import annotations

from collections.abc import Sequence

from canvasread.canvas.prompt import PromptEncoder, PromptText
from canvasread.canvas.tokenizer import HFTokenizer


class CountingTokenizer:
    """A tokenizer that counts its chat template renders."""

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self.tokenizer = tokenizer
        self.renders = 0
        self.vocab_size, self.pad_id = tokenizer.vocab_size, tokenizer.pad_id

    def chat_prompt(self, system: str, user: str) -> str:
        self.renders += 1
        return self.tokenizer.chat_prompt(system, user)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tokenizer.encode_batch(texts)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        return self.tokenizer.encode_with_offsets(text)


def test_a_system_turns_prefix_is_found_once_and_as_it_would_be_afresh(tokenizer: HFTokenizer) -> None:
    counting = CountingTokenizer(tokenizer)
    encoder = PromptEncoder(counting, None, thought_in_prompt=True)
    prompts = [PromptText("Answer the questions.\nQuestion a: yes or no"), PromptText("Another system turn.")]
    states = ["I was charged twice for order 1182.", "Where is my parcel?", "Hello"]
    encoded = [encoder.encode_all(prompts, state, {}) for state in states]
    assert counting.renders == len(states) * len(prompts) + len(prompts)  # each text, then each prefix once
    for state, prompts_encoded in zip(states, encoded, strict=True):
        for prompt, got in zip(prompts, prompts_encoded, strict=True):
            fresh = PromptEncoder(tokenizer, None, thought_in_prompt=True).encode_all([prompt], state, {})[0]
            assert got == fresh
            assert 0 < got.prefix_length < len(got.ids)
            assert state not in tokenizer.decode(got.ids[: got.prefix_length])
