"""Attention masks of a fused pass: which keys each new token may attend to.

Prompt tokens attend causally (within the sliding window on sliding layers);
canvas tokens attend to the whole prompt on full layers but only to the last
`window - 1` prompt tokens on sliding layers (what DiffusionGemma's decoder
sees through a sliding KV cache), and to every canvas token. With
`use_bidirectional_attention: "vision"` (DiffusionGemma's real config) an
image's soft tokens also see each other both ways, on every layer and beyond
the sliding window, as transformers' generation path builds it
(`create_masks_for_generate` with `block_sequence_ids`: (causal ∧ window) ∨
same image).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def attention_mask(
    *,
    sliding: bool,
    window: int,
    lengths: torch.Tensor,
    max_past: int,
    max_new: int,
    image_spans: Sequence[Sequence[tuple[int, int]]] = (),
) -> torch.Tensor:
    """[batch, 1, new, past + new] booleans, keys laid out as the padded past then the padded new tokens.

    `lengths` is [3, batch]: each row's cached, new prompt and new total
    token counts; the mask is built where `lengths` is (on the GPU: a few
    kernels instead of a host-built tensor the size of the mask). `image_spans[b]`
    lists row b's images as (offset, soft tokens) into its new tokens; give them
    only when the model attends bidirectionally within images.
    """
    past, prompt, new = (lengths[i][:, None, None] for i in range(3))
    query = torch.arange(max_new, device=lengths.device)[None, :, None]
    key = torch.arange(max_past + max_new, device=lengths.device)[None, None, :]
    key_is_past = key < max_past
    key_new_index = key - max_past
    key_position = torch.where(key_is_past, key, past + key_new_index)
    key_valid = torch.where(key_is_past, key < past, key_new_index < new)
    key_is_prompt = key_valid & (torch.where(key_is_past, key < past, key_new_index < prompt))
    key_is_canvas = key_valid & ~key_is_past & (key_new_index >= prompt)
    query_position = past + query
    query_is_prompt = query < prompt
    prompt_total = past + prompt

    causal = key_is_prompt & (key_position <= query_position)
    reads_prompt = key_is_prompt
    if sliding:
        causal &= query_position - key_position < window
        reads_prompt = reads_prompt & (key_position >= prompt_total - (window - 1))
    if any(image_spans):
        causal |= same_image(image_spans, int(lengths.shape[1]), max_past, max_new).to(lengths.device)
    mask = torch.where(query_is_prompt, causal, reads_prompt | key_is_canvas)
    # Padding queries attend to themselves only, so no row of the softmax is empty.
    padding_query = query >= new
    return torch.where(padding_query, key == max_past + query, mask)[:, None]


def same_image(
    image_spans: Sequence[Sequence[tuple[int, int]]], batch: int, max_past: int, max_new: int
) -> torch.Tensor:
    """[batch, new, past + new] booleans: query and key are soft tokens of the same image (images are new tokens)."""
    block = torch.full((batch, max_new), -1)
    for b, spans in enumerate(image_spans):
        for number, (offset, tokens) in enumerate(spans):
            block[b, offset : offset + tokens] = number
    key_block = torch.cat([torch.full((batch, max_past), -1), block], dim=1)
    return (block[:, :, None] == key_block[:, None, :]) & (block[:, :, None] >= 0)
