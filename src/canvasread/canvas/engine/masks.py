"""Attention masks of a fused pass: which keys each new token may attend to.

Prompt tokens attend causally (within the sliding window on sliding layers);
canvas tokens attend to the whole prompt on full layers but only to the last
`window - 1` prompt tokens on sliding layers (what DiffusionGemma's decoder
sees through a sliding KV cache), and to every canvas token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def attention_mask(
    *,
    sliding: bool,
    window: int,
    past_lengths: Sequence[int],
    prompt_lengths: Sequence[int],
    new_lengths: Sequence[int],
    max_past: int,
    max_new: int,
) -> torch.Tensor:
    """[batch, 1, new, past + new] booleans, keys laid out as the padded past then the padded new tokens."""
    past = torch.tensor(past_lengths)[:, None, None]
    prompt = torch.tensor(prompt_lengths)[:, None, None]
    new = torch.tensor(new_lengths)[:, None, None]
    query = torch.arange(max_new)[None, :, None]
    key = torch.arange(max_past + max_new)[None, None, :]
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
    mask = torch.where(query_is_prompt, causal, reads_prompt | key_is_canvas)
    # Padding queries attend to themselves only, so no row of the softmax is empty.
    padding_query = query >= new
    return torch.where(padding_query, key == max_past + query, mask)[:, None]
