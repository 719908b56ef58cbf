"""The `Tokenizer` protocol that planning needs, and its adapter over a Hugging Face tokenizer.

Planning (labels, prompt, canvas) only needs text → ids with character
offsets and the chat template, so the vLLM proxy and the in-process engine
share it, and tests can reason about the real Gemma vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Tokenizer(Protocol):
    @property
    def vocab_size(self) -> int:
        """The base vocabulary: ids the model's embedding table covers (canvas noise is drawn from it)."""
        ...

    @property
    def pad_id(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """Ids of `text` with special tokens written in it parsed, and nothing added."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and each id's character span in `text`."""
        ...

    def chat_prompt(self, system: str, user: str) -> str:
        """The model's chat template for a system and a user turn, ending where the model's turn begins."""
        ...


class HFTokenizer:
    """Adapts a `transformers` fast tokenizer (loaded from the checkpoint folder or a hub id)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        # Not len(tokenizer): added tokens may lie past the model's vocabulary (Gemma 3's image token is id 262,144).
        self._vocab_size = int(tokenizer.vocab_size)
        pad = tokenizer.pad_token_id
        self._pad_id = int(pad if pad is not None else 0)

    @classmethod
    def load(cls, name_or_path: str) -> HFTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(name_or_path))

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def pad_id(self) -> int:
        return self._pad_id

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(ids) for ids in self._tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids)))

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        encoded = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(encoded["input_ids"]), [(int(a), int(b)) for a, b in encoded["offset_mapping"]]

    def chat_prompt(self, system: str, user: str) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        rendered = self._tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, enable_thinking=False
        )
        return str(rendered)
