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
    key_valid = torch.where(key_is_past, key < past, key_new_index < new)
    both_ways = None
    if any(image_spans):
        both_ways = same_image(image_spans, int(lengths.shape[1]), max_past, max_new).to(lengths.device)
    mask = allowed(
        query_position=past + query,
        query_prompt=query < prompt,
        prompt_total=past + prompt,
        key_position=torch.where(key_is_past, key, past + key_new_index),
        key_prompt=key_valid & torch.where(key_is_past, key < past, key_new_index < prompt),
        key_canvas=key_valid & ~key_is_past & (key_new_index >= prompt),
        sliding=sliding,
        window=window,
        both_ways=both_ways,
    )
    # Padding queries attend to themselves only, so no row of the softmax is empty.
    padding_query = query >= new
    return torch.where(padding_query, key == max_past + query, mask)[:, None]


def flat_mask(*, past: torch.Tensor, tokens: torch.Tensor, sliding: bool, window: int) -> torch.Tensor:
    """[new, past + new] booleans for one attention over a whole pass. `tokens` [4, new] gives each new token's
    row (-1: padding), position, prompt total (its row's cached plus new prompt tokens) and whether it is a
    prompt token (1) or a canvas token (0); `past` [2, past] gives each past key's row (-1: padding) and
    position. Keys are the past keys, then the new tokens; a query sees only its own row's.

    Built from small tensors where they are, so a captured pass builds its masks inside its graph."""
    row, position, total, prompt = tokens[0], tokens[1], tokens[2], tokens[3] > 0
    real = row >= 0
    key_row = torch.cat([past[0], row])[None, :]
    key_prompt = torch.cat([past[0] >= 0, prompt & real])[None, :]
    mask = allowed(
        query_position=position[:, None],
        query_prompt=prompt[:, None],
        prompt_total=total[:, None],
        key_position=torch.cat([past[1], position])[None, :],
        key_prompt=key_prompt,
        key_canvas=torch.cat([torch.zeros_like(past[0], dtype=torch.bool), real & ~prompt])[None, :],
        sliding=sliding,
        window=window,
    ) & (row[:, None] == key_row)
    # Padding queries attend to themselves only, as in `attention_mask`.
    query = torch.arange(row.shape[0], device=row.device)[:, None]
    key = torch.arange(past.shape[1] + row.shape[0], device=row.device)[None, :]
    return torch.where(real[:, None], mask, key == past.shape[1] + query)


def allowed(
    *,
    query_position: torch.Tensor,
    query_prompt: torch.Tensor,
    prompt_total: torch.Tensor,
    key_position: torch.Tensor,
    key_prompt: torch.Tensor,
    key_canvas: torch.Tensor,
    sliding: bool,
    window: int,
    both_ways: torch.Tensor | None = None,
) -> torch.Tensor:
    """The module docstring's rules for one row's real queries over its keys, broadcast over whatever shapes the
    arguments share: prompt queries causally (and within the window), canvas queries the prompt (its last
    `window - 1` tokens on sliding layers) and every canvas key; `both_ways` adds pairs an image joins."""
    causal = key_prompt & (key_position <= query_position)
    reads_prompt = key_prompt
    if sliding:
        causal = causal & (query_position - key_position < window)
        reads_prompt = reads_prompt & (key_position >= prompt_total - (window - 1))
    if both_ways is not None:
        causal = causal | both_ways
    return torch.where(query_prompt, causal, reads_prompt | key_canvas)


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
