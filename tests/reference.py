"""What transformers itself computes, to hold the engine to: its generation path's log-probabilities with an
image, its own denoising loop, and engine reads of mixed prompts to compare pass by pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from helpers import canvas_backend, loaded_runtime

from canvasread.canvas.reader import CanvasRead, Slot, SlotLogProbs
from canvasread.decide import Decider


def generation_path_logprobs(
    model: Any, prompt_ids: Sequence[int], canvas_ids: Sequence[int], image_token_id: int, features: Any
) -> Any:
    """Log-probabilities at every canvas position from transformers' generation path with one image.

    Uses the encoder masks `generate` builds (soft tokens attend to each other both ways), which a plain
    forward drops: the reference the engine's image reads are held to.
    """
    import torch
    from transformers import DynamicCache

    class Features:
        pooler_output = features

    length = len(prompt_ids)
    soft = torch.tensor([[int(token == image_token_id) for token in prompt_ids]])
    cache = DynamicCache(config=model.config.text_config)
    masks = model.model.encoder.create_masks_for_generate(
        config=model.config,
        inputs_embeds=torch.empty(1, length, 0),
        attention_mask=torch.ones(1, length, dtype=torch.bool),
        cache=cache,
        position_ids=torch.arange(length)[None],
        mm_token_type_ids=soft,
    )
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([list(prompt_ids)]),
            attention_mask=masks,
            cache=cache,
            decoder_input_ids=torch.tensor([list(canvas_ids)]),
            mm_encoder_outputs={"image": Features()},
        )
    return torch.log_softmax(out.logits[0].float(), dim=-1)


def transformers_denoising(model: Any, read: CanvasRead) -> tuple[Any, list[list[int]]]:
    """`read` through transformers' own DiffusionGemma denoising loop (`_denoising_step`), every position but the
    slots pinned: the last step's log-probabilities at every canvas position, and the canvas each earlier step left.

    Prepared by transformers' own `_prepare_generation_config` (`max_denoising_steps = read.steps`),
    `_prepare_encoder_inputs`, `_prepare_denoiser_inputs` and logits processors, with one hook: transformers has
    no pins, so the sampler's `renoise_canvas` is wrapped to set every position but the slots back to the read's
    canvas after it renoises. The random draws come from torch's global generator seeded with `read.seed` just
    before the loop (where the engine's per-read generator starts). A recording logits processor, first in the
    list (custom processors run before the temperature schedule), keeps each step's raw logits.
    """
    import torch
    from transformers import LogitsProcessorList

    config, _ = model._prepare_generation_config(None, max_denoising_steps=read.steps)
    sampler, canvases = _pinned_sampler(model, config, read)
    raw: list[torch.Tensor] = []
    processors = model._prepare_logits_processor(config, LogitsProcessorList([_recorder(raw)]))
    prompt = torch.tensor([read.prompt_ids])
    length, width = prompt.shape[1], len(read.canvas_ids)
    with torch.no_grad():
        cache, (canvas, signal, mask_mapping, finished) = _encoded(model, prompt, read.canvas_ids, sampler)
        argmax = canvas
        torch.manual_seed(read.seed)
        for step in reversed(range(1, read.steps + 1)):
            canvas, argmax, signal, finished = model._denoising_step(
                decoder_forward=model.forward,
                current_canvas=canvas,
                argmax_canvas=argmax,
                input_ids=prompt,
                decoder_position_ids=torch.arange(length, length + width, dtype=torch.int32)[None],
                self_conditioning_logits=signal,
                mask_mapping=mask_mapping,
                cache=cache,
                finished_denoising=finished,
                cur_step=step,
                sampler=sampler,
                logits_processor=processors,
                diffusion_stopping_criteria=None,  # the engine runs every step; no adaptive stop
            )
    assert len(raw) == read.steps
    return torch.log_softmax(raw[-1][0].float(), dim=-1), canvases[:-1]


def _pinned_sampler(model: Any, config: Any, read: CanvasRead) -> tuple[Any, list[list[int]]]:
    """transformers' entropy-bound sampler for the read's canvas width, its renoise followed by the pin."""
    import torch
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSampler

    width = len(read.canvas_ids)
    sampler = EntropyBoundSampler(config.sampler_config, width, model.config.text_config.vocab_size, read.steps)
    template = torch.tensor([read.canvas_ids])
    pinned = torch.ones(1, width, dtype=torch.bool)
    pinned[0, [slot.position for slot in read.slots]] = False
    renoise = sampler.renoise_canvas
    canvases: list[list[int]] = []

    def pinned_renoise(accepted: torch.Tensor, step: Any) -> torch.Tensor:
        canvas = torch.where(pinned, template, renoise(accepted, step))
        canvases.append(canvas[0].tolist())
        return canvas

    sampler.renoise_canvas = pinned_renoise
    return sampler, canvases


def _recorder(raw: list[Any]) -> Any:
    """A logits processor that keeps the raw logits it is given."""
    from transformers import LogitsProcessor

    class RawLogits(LogitsProcessor):  # type: ignore[misc]
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            raw.append(scores.clone())
            return scores

    return RawLogits()


def _encoded(model: Any, prompt: Any, canvas_ids: Sequence[int], sampler: Any) -> tuple[Any, Any]:
    """The prompt through transformers' encoder (as `generate` prepares it), and the denoiser's inputs."""
    import torch
    from transformers import DynamicCache

    length, width = prompt.shape[1], len(canvas_ids)
    cache = DynamicCache(config=model.config.text_config)
    attention = torch.ones(1, length, dtype=torch.bool)
    positions = torch.arange(length, dtype=torch.int32)[None]
    ids, masks = model._prepare_encoder_inputs(prompt, attention, positions, cache, True, width, 1)
    cache = model.model.encoder(input_ids=ids, attention_mask=masks, cache=cache, position_ids=positions).cache
    decoder_mask = torch.nn.functional.pad(attention, (0, width), value=True)
    start = {"decoder_input_ids": torch.tensor([list(canvas_ids)])}
    return cache, model._prepare_denoiser_inputs(decoder_mask, cache, sampler, None, 1, prompt.device, start)


# ---- engine reads to compare ----------------------------------------------------------------------


def tiny_model(decider: Decider) -> Any:
    """The transformers model under the decider's in-process engine."""
    return loaded_runtime(canvas_backend(decider)).reader.runner.model  # type: ignore[attr-defined]


def mixed_reads(vocab: int) -> list[CanvasRead]:
    """Two question sets (prefixes) and a prompt without one, states of many lengths, one and three steps."""
    import torch

    generator = torch.Generator().manual_seed(5)

    def ids(length: int) -> tuple[int, ...]:
        return tuple(torch.randint(3, vocab, (length,), generator=generator).tolist())

    prefixes = [ids(23), ids(40)]
    reads = []
    for n, state in enumerate((4, 57, 13, 90, 31, 8)):
        prefix = prefixes[n % 2] if n < 5 else ()
        canvas = ids(16 * (1 + n % 2))
        slots = (Slot(3, (5, 6)), Slot(len(canvas) - 2, (7, 8, 9, 10)))
        reads.append(CanvasRead(prefix + ids(state), len(prefix), canvas, slots, steps=1 + 2 * (n % 2), seed=n))
    # a second canvas of the first prompt: read in the pass that encodes it
    reads.append(CanvasRead(reads[0].prompt_ids, 23, ids(16), (Slot(0, (11, 12)),)))
    return reads


def assert_same_read(read: CanvasRead, got: Sequence[SlotLogProbs], want: Sequence[SlotLogProbs]) -> None:
    """fp32 sums follow the pass's shape, so logits move in the last digits (2e-6 relative); denoising steps
    amplify that (test_steps.py): a row that read another row's keys or canvas would be off by whole units."""
    import pytest

    tolerance = 2e-6 if read.steps == 1 else 1e-3
    for x, y in zip(got, want, strict=True):
        assert x.label_logprobs == pytest.approx(y.label_logprobs, rel=tolerance)
