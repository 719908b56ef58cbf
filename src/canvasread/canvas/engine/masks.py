"""Attention masks of a fused pass: which keys each new token may attend to.

Prompt tokens attend causally (within the sliding window on sliding layers);
canvas tokens attend to the whole prompt on full layers but only to the last
`window - 1` prompt tokens on sliding layers (what DiffusionGemma's decoder
sees through a sliding KV cache), and to every canvas token.
"""

from __future__ import annotations

import torch


def attention_mask(*, sliding: bool, window: int, lengths: torch.Tensor, max_past: int, max_new: int) -> torch.Tensor:
    """[batch, 1, new, past + new] booleans, keys laid out as the padded past then the padded new tokens.

    `lengths` is [3, batch]: each row's cached, new prompt and new total
    token counts; the mask is built where `lengths` is (on the GPU: a few
    kernels instead of a host-built tensor the size of the mask).
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
    mask = torch.where(query_is_prompt, causal, reads_prompt | key_is_canvas)
    # Padding queries attend to themselves only, so no row of the softmax is empty.
    padding_query = query >= new
    return torch.where(padding_query, key == max_past + query, mask)[:, None]
