"""The fused pass's masks against transformers' diffusion generation path (`create_masks_for_generate`).

transformers' plain forward drops the vision mask, so these compare with the
masks `DiffusionGemmaForBlockDiffusion.generate` builds for the encoder, on
the tiny config with the real checkpoint's `use_bidirectional_attention: "vision"`.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaEncoderModel

from canvasread.canvas.engine.masks import attention_mask, flat_mask
from canvasread.tools.checkpoints import tiny_config

PROMPT = 120
# Two images, the first wider than the tiny config's sliding window of 24.
IMAGES = ((10, 40), (70, 12))


def generation_masks(images: tuple[tuple[int, int], ...]) -> dict[str, torch.Tensor]:
    """transformers' encoder masks for a PROMPT-token prompt whose `images` are (offset, soft tokens)."""
    config = tiny_config()
    config.text_config._attn_implementation = "sdpa"
    types = torch.zeros(1, PROMPT, dtype=torch.long)
    for offset, tokens in images:
        types[0, offset : offset + tokens] = 1  # what Gemma 4's processor marks: the soft tokens, not the markers
    masks: dict[str, torch.Tensor] = DiffusionGemmaEncoderModel.create_masks_for_generate(
        config=config,
        inputs_embeds=torch.empty(1, PROMPT, 0),
        attention_mask=torch.ones(1, PROMPT, dtype=torch.bool),
        cache=DynamicCache(config=config.text_config),
        position_ids=torch.arange(PROMPT)[None],
        mm_token_type_ids=types,
    )
    return masks


def test_the_tiny_checkpoints_attend_bidirectionally_within_images_as_the_real_one() -> None:
    assert tiny_config().text_config.use_bidirectional_attention == "vision"


@pytest.mark.parametrize("past", [0, 6], ids=["no-prefix", "cached-prefix"])
@pytest.mark.parametrize("canvas", [0, 32], ids=["prompt-only", "with-canvas"])
def test_prompt_masks_equal_the_generation_paths(past: int, canvas: int) -> None:
    """Every prompt query attends to exactly the keys transformers lets it see, on both layer kinds; images
    sit in the uncached part (the planner never caches an image), and no prompt token sees the canvas."""
    expected = generation_masks(IMAGES)
    new = PROMPT - past
    for kind, theirs in expected.items():
        ours = attention_mask(
            sliding=kind == "sliding_attention",
            window=tiny_config().text_config.sliding_window,
            lengths=torch.tensor([[past], [new], [new + canvas]]),
            max_past=past,
            max_new=new + canvas,
            image_spans=[[(offset - past, tokens) for offset, tokens in IMAGES]],
        )[0, 0]
        assert torch.equal(ours[:new, :PROMPT], theirs[0, 0, past:]), kind
        assert not ours[:new, PROMPT:].any(), kind


def test_without_image_spans_the_masks_are_causal_and_differ() -> None:
    """The comparison above can fail: leaving the spans out gives the plain forward's causal mask."""
    for kind, theirs in generation_masks(IMAGES).items():
        causal = attention_mask(
            sliding=kind == "sliding_attention",
            window=tiny_config().text_config.sliding_window,
            lengths=torch.tensor([[0], [PROMPT], [PROMPT]]),
            max_past=0,
            max_new=PROMPT,
        )[0, 0]
        assert not torch.equal(causal, theirs[0, 0])
        assert torch.equal(causal, generation_masks(())[kind][0, 0])


@pytest.mark.parametrize("sliding", [False, True], ids=["full", "sliding"])
def test_a_flat_mask_allows_for_each_row_what_its_group_mask_allows(sliding: bool) -> None:
    """Three rows in one flat pass (a prompt continuing a cached prefix, a canvas over the same prompt, a canvas
    with no past) against each row's own group mask: the same keys, none of another row's, padding on itself."""
    window = 6
    rows = [(5, 7, True), (12, 4, False), (0, 3, False)]  # (cached keys, new tokens, prompt)
    bucket, past_bucket = 16, 32
    tokens = torch.tensor([[-1], [0], [0], [0]]).repeat(1, bucket)
    past = torch.tensor([[-1], [0]]).repeat(1, past_bucket)
    start = cursor = 0
    for number, (cached, new, prompt) in enumerate(rows):
        tokens[:, start : start + new] = torch.stack(
            [
                torch.full((new,), number),
                torch.arange(cached, cached + new),
                torch.full((new,), cached + (new if prompt else 0)),
                torch.full((new,), int(prompt)),
            ]
        )
        past[:, cursor : cursor + cached] = torch.stack([torch.full((cached,), number), torch.arange(cached)])
        start, cursor = start + new, cursor + cached
    flat = flat_mask(past=past, tokens=tokens, sliding=sliding, window=window)
    assert flat.shape == (bucket, past_bucket + bucket)
    start = cursor = 0
    for number, (cached, new, prompt) in enumerate(rows):
        group = attention_mask(
            sliding=sliding,
            window=window,
            lengths=torch.tensor([[cached], [new if prompt else 0], [new]]),
            max_past=cached,
            max_new=new,
        )[0, 0]
        mine = flat[start : start + new]
        assert torch.equal(mine[:, cursor : cursor + cached], group[:, :cached])
        assert torch.equal(mine[:, past_bucket + start : past_bucket + start + new], group[:, cached:])
        assert int(mine.sum()) == int(group.sum()), f"row {number} sees another row's keys"
        start, cursor = start + new, cursor + cached
    padding = torch.arange(start, bucket)
    assert torch.equal(flat[start:].nonzero()[:, 1], past_bucket + padding)
