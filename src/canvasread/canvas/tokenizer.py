"""The `Tokenizer` protocol that planning needs, and its adapter over a Hugging Face tokenizer.

Planning (labels, prompt, canvas) only needs text → ids with character
offsets and the chat template, so the vLLM proxy and the in-process engine
share it, and tests can reason about the real Gemma vocabulary.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from canvasread.errors import ModelNotFound

# One request to the hub, when a hub id is not cached: long enough for a slow link, short of its retries' ~50 s.
HUB_TIMEOUT_S = 10.0
# The file every tokenizer folder (and cached hub repository) holds.
TOKENIZER_FILE = "tokenizer_config.json"


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
        """The tokenizer of a folder or hub id; one that cannot be found fails at once (see `locate`)."""
        locate(name_or_path)
        return cls(pretrained(name_or_path))

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


# The files a tokenizer folder may hold; a folder's tokenizer is loaded again when one of them changes.
TOKENIZER_FILES = (
    "tokenizer.json",
    TOKENIZER_FILE,
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
)


def pretrained(name_or_path: str) -> Any:
    """transformers' tokenizer of a folder or hub id, loaded once a process while its files stay as they are.

    Reading the Gemma tokenizer takes seconds (its 262k-token JSON is parsed twice), and one process asks for
    it once per model, replica and baseline; they only read it (encode, decode, the chat template).
    """
    folder = Path(name_or_path).expanduser()
    stamp: tuple[tuple[str, int, int], ...] = ()
    if folder.is_dir():  # a hub id is stamped by its name alone
        stamp = tuple(
            (name, state.st_mtime_ns, state.st_size)
            for name in TOKENIZER_FILES
            if (state := _stat(folder / name)) is not None
        )
    return _pretrained(name_or_path, stamp)


def _stat(path: Path) -> os.stat_result | None:
    return path.stat() if path.is_file() else None


@functools.lru_cache(maxsize=8)
def _pretrained(name_or_path: str, stamp: tuple[tuple[str, int, int], ...]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path)


def locate(name_or_path: str, marker: str = TOKENIZER_FILE, what: str = "tokenizer") -> None:
    """Fail fast, in one sentence, for a tokenizer (or checkpoint) that cannot be found: `ModelNotFound`.

    Hugging Face's loader retries an unreachable hub for about 50 s before it says so; a server would then
    be up with nothing to serve. A path must be a folder holding `marker`; a hub id must be in the local
    cache, or else exist on the hub, asked once (`HUB_TIMEOUT_S`, no retries), which also tells an
    unreachable hub (offline, a proxy) from a name that is wrong.
    """
    folder = Path(name_or_path).expanduser()
    if name_or_path.startswith(("/", "./", "../", "~")) or folder.exists():
        if not (folder / marker).is_file():
            shown = "no such folder" if not folder.is_dir() else f"the folder has no {marker}"
            raise ModelNotFound(f"{what} {name_or_path!r} cannot be loaded: {shown}")
        return
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    try:
        if isinstance(try_to_load_from_cache(name_or_path, marker), str):
            return
        if constants.HF_HUB_OFFLINE:
            raise ModelNotFound(f"{what} {name_or_path!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set")
        HfApi().model_info(name_or_path, timeout=HUB_TIMEOUT_S)
    except HFValidationError:
        raise ModelNotFound(f"{what} {name_or_path!r} is neither a folder nor a hub id (owner/name)") from None
    except GatedRepoError:
        raise ModelNotFound(
            f"{what} {name_or_path!r} is gated on the hub: set HF_TOKEN to a token with access"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(f"{what} {name_or_path!r} is not a folder, not cached, and not on the hub") from None
    except ModelNotFound:
        raise
    except Exception as error:  # the hub's client raises its own transport errors (httpx's, under another name)
        raise ModelNotFound(
            f"{what} {name_or_path!r} is not a folder and not cached, and {constants.ENDPOINT} cannot be reached "
            f"({type(error).__name__}: {error}); give its folder, or download it first: hf download {name_or_path}"
        ) from None
