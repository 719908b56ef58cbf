"""A pass's layout: flat tokens, and attention groups whose masks are laid out for folded grouped-query heads."""

from __future__ import annotations

import torch

from canvasread.canvas.engine.layout import Attention, flat_masks, lay_out
from canvasread.canvas.engine.masks import attention_mask
from canvasread.canvas.engine.rows import NO_PAST, Row

ATTENTION = Attention(
    heads={"sliding_attention": (4, 2), "full_attention": (4, 1)},
    window=8,
    image_blocks=False,
    dtype=torch.float32,
    device=torch.device("cpu"),
)


def test_a_groups_mask_is_additive_and_repeated_once_per_folded_head() -> None:
    prompt = Row(NO_PAST, list(range(3, 13)), write=torch.arange(10))
    canvas = Row(torch.arange(10), list(range(20, 26)))
    layout = lay_out([prompt, canvas], bucket=32, attention=ATTENTION)
    assert layout.used == 16 and layout.size == 32
    for group in layout.groups:
        rows, new = group.queries.shape
        for kind, (heads, kv_heads) in ATTENTION.heads.items():
            fold = heads // kv_heads
            mask = group.masks[kind]
            keys = mask.shape[-1]
            assert mask.shape == (rows, 1, fold * new, keys)
            assert mask.dtype == torch.float32
            first = mask[:, :, :new]
            assert torch.equal(mask, first.repeat(1, 1, fold, 1))
            assert set(first.unique().tolist()) <= {0.0, float("-inf")}


def test_the_additive_mask_allows_exactly_what_the_boolean_mask_allows() -> None:
    rows = [Row(torch.arange(5), list(range(3, 9))), Row(torch.arange(5), list(range(30, 34)))]
    layout = lay_out(rows, bucket=16, attention=ATTENTION)
    (group,) = layout.groups
    new = group.queries.shape[1]
    past = group.masks["full_attention"].shape[-1] - new
    lengths = torch.tensor([[5, 5], [0, 0], [6, 4]])
    allowed = attention_mask(sliding=False, window=8, lengths=lengths, max_past=past, max_new=new)
    assert torch.equal(group.masks["full_attention"][:, :, :new] == 0, allowed)


def test_a_flat_layout_has_its_buckets_shapes_and_writes_what_no_prompt_keeps_to_the_scratch_slot() -> None:
    scratch = 999
    prompt = Row(torch.arange(4), list(range(3, 9)), write=torch.arange(40, 46))
    canvas = Row(torch.arange(10, 13), list(range(20, 25)))
    layout = lay_out([prompt, canvas], bucket=16, attention=ATTENTION, flat=(32, scratch))
    assert layout.groups == [] and layout.flat is not None
    past, tokens = layout.flat.past, layout.flat.tokens
    assert past.shape == (3, 32) and tokens.shape == (6, 16)
    assert past[0, :7].tolist() == [0, 1, 2, 3, 10, 11, 12] and set(past[0, 7:].tolist()) == {scratch}
    assert past[1].tolist() == [0] * 4 + [1] * 3 + [-1] * 25
    assert past[2, :7].tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert tokens[0].tolist() == [0] * 6 + [1] * 5 + [-1] * 5
    assert tokens[1, :11].tolist() == [4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7]
    assert tokens[2, :11].tolist() == [10] * 6 + [3] * 5  # a prompt's total counts its new tokens, a canvas's not
    assert tokens[3].tolist() == [1] * 6 + [0] * 10
    assert tokens[4].tolist() == list(range(40, 46)) + [scratch] * 10
    assert layout.flat.ids.tolist() == list(range(3, 9)) + list(range(20, 25)) + [0] * 5
    assert layout.flat.is_canvas.tolist() == [False] * 6 + [True] * 5 + [False] * 5  # padding is no canvas
    grouped = lay_out([prompt, canvas], bucket=16, attention=ATTENTION)
    for name in ("tokens", "positions", "is_canvas"):  # a flat pass's rows are its inputs', the same values
        assert torch.equal(getattr(layout, name), getattr(grouped, name)), name
    masks = flat_masks(layout.flat, ATTENTION)
    for kind, (heads, kv_heads) in ATTENTION.heads.items():
        assert masks[kind].shape == (1, 1, heads // kv_heads * 16, 48)
