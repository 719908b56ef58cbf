"""Could a large pass attend flat, through FlexAttention's block-sparse kernel, instead of in padded groups?

Usage: python3 bench/flex_attention.py OUT.json [cuda|cpu] [--requests 32]

A pass too large to attend flat attends in groups (`layout.py`): for each
group and layer, its keys are gathered from the store and concatenated with
its rows' own, its queries gathered, SDPA's memory-efficient kernel run over
an additive mask, and the real outputs copied back. On the H200 that took
47 ms of a 32-request pass's 164 ms of kernels
(`bench/results/h200-2026-12-05b`). A flat pass has one attention over every
token, masked to each token's own row (`masks.flat_mask`); with a dense mask
that grows with the square of the pass, so only small passes attend flat.
FlexAttention computes only the blocks its block mask keeps, so a flat
layout's cost would follow the real query-key pairs at any size.

For `--requests` `standard`-shaped requests (a cached 200-token prefix shared
by all, each request a 156-token prompt row and a 16-token canvas row), this
lays the pass out both ways with the engine's own `lay_out`, then times one
layer of each kind at DiffusionGemma-26B-A4B's shapes (sliding: 8 key heads of
256, 16 query heads; full: 2 key heads of 512), bf16 on a GPU:

- `grouped`: the engine's own `LayerStack.attend` over the groups (ms a layer);
- `flex`: the past keys gathered, concatenated with the pass's own, and
  `flex_attention` (compiled, grouped-query) under a block mask whose rule is
  `masks.allowed` (ms a layer, with the first tiles in TILES its kernel can
  hold), and the block mask's making (ms a pass, once for every layer of a
  kind);

and the largest difference between the two outputs on real tokens. Times are
`expert_sum.median_ms`'s. A GPU run sweeps passes of 1, 8 and 32 requests. On
a CPU (float32, 2 requests) it checks that the two agree: about 1e-6 here.
Not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from expert_sum import median_ms
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from canvasread.canvas.engine.layers import LayerStack
from canvasread.canvas.engine.layout import Attention, FlatInputs, PassLayout, lay_out
from canvasread.canvas.engine.masks import allowed
from canvasread.canvas.engine.rows import Row

KINDS = {"sliding_attention": (16, 8, 256), "full_attention": (16, 2, 512)}  # query heads, key heads, head dim
WINDOW = 1024
PREFIX, PROMPT, CANVAS = 200, 156, 16
# Tiles to try at each head dim on a GPU, largest first: the first FlexAttention's kernel can hold is used (512
# needs small ones).
TILES = {
    256: [{"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2}, {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1}],
    512: [{"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1}, {"BLOCK_M": 16, "BLOCK_N": 16, "num_stages": 1}],
}


def rows_of(requests: int) -> tuple[list[Row], int]:
    """`requests` prompt rows over one shared prefix, each followed by its canvas row; the store's size."""
    prefix = torch.arange(PREFIX)
    rows, cursor = [], PREFIX
    for _ in range(requests):
        written = torch.arange(cursor, cursor + PROMPT)
        cursor += PROMPT
        rows.append(Row(prefix, list(range(1, PROMPT + 1)), write=written))
        rows.append(Row(torch.cat([prefix, written]), list(range(1, CANVAS + 1))))
    return rows, cursor + 1  # the last slot is the flat pass's scratch


def grouped(layout: PassLayout, kind: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, store: Any) -> Any:
    """The engine's own `LayerStack.attend` for one layer of `kind`, its store writes included: called on a
    stand-in that holds only what it reads (the layer's kind, the pass's buffers, the store's tensors)."""
    stack = SimpleNamespace(layer_types=[kind])
    views = SimpleNamespace(query={kind: q}, keys={kind: k}, values={kind: v}, attended={kind: torch.empty_like(q)})
    kv = SimpleNamespace(keys=[store[0]], values=[store[1]])
    LayerStack.attend(stack, 0, views, layout, kv)  # type: ignore[arg-type]
    return views.attended[kind]


def block_mask(flat: FlatInputs, kind: str) -> BlockMask:
    """The flat pass's rule (`masks.flat_mask`) as a block mask: own row only, `masks.allowed` within it."""
    past, tokens = flat.past, flat.tokens
    key_row = torch.cat([past[1], tokens[0]])
    key_position = torch.cat([past[2], tokens[1]])
    key_prompt = torch.cat([past[1] >= 0, (tokens[3] > 0) & (tokens[0] >= 0)])
    key_canvas = torch.cat([torch.zeros_like(past[1], dtype=torch.bool), (tokens[3] == 0) & (tokens[0] >= 0)])
    past_keys = past.shape[1]

    def rule(batch: Any, head: Any, query: Any, key: Any) -> Any:
        real = tokens[0][query] >= 0
        mask = allowed(
            query_position=tokens[1][query],
            query_prompt=tokens[3][query] > 0,
            prompt_total=tokens[2][query],
            key_position=key_position[key],
            key_prompt=key_prompt[key],
            key_canvas=key_canvas[key],
            sliding=kind == "sliding_attention",
            window=WINDOW,
        ) & (tokens[0][query] == key_row[key])
        return torch.where(real, mask, key == past_keys + query)

    device = past.device
    size = (tokens.shape[1], past_keys + tokens.shape[1])
    return create_block_mask(rule, None, None, *size, device=str(device), _compile=device.type == "cuda")


def flex(
    flat: FlatInputs, mask: BlockMask, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, store: Any, tiles: Any
) -> Any:
    """One flat attention over every token: the store writes, the past keys' gather, FlexAttention."""
    stored_keys, stored_values = store
    stored_keys.index_copy_(0, flat.tokens[4], k)
    stored_values.index_copy_(0, flat.tokens[4], v)
    past = flat.past[0]
    all_keys = torch.cat([stored_keys.index_select(0, past), k]).transpose(0, 1)[None]
    all_values = torch.cat([stored_values.index_select(0, past), v]).transpose(0, 1)[None]
    out = COMPILED(
        q.transpose(0, 1)[None],
        all_keys,
        all_values,
        block_mask=mask,
        scale=1.0,
        enable_gqa=True,
        kernel_options=tiles,
    )
    return out[0].transpose(0, 1)


COMPILED = torch.compile(flex_attention, dynamic=False)


def measure_kind(
    kind: str, grouped_layout: PassLayout, flat: FlatInputs, slots: int, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    """One layer of `kind` attended both ways over random queries, keys and a random store."""
    query_heads, key_heads, dim = KINDS[kind]
    generator = torch.Generator(device).manual_seed(0)
    bucket = grouped_layout.size
    q = torch.randn(bucket, query_heads, dim, device=device, dtype=dtype, generator=generator) / dim**0.5
    k = torch.randn(bucket, key_heads, dim, device=device, dtype=dtype, generator=generator)
    v = torch.randn(bucket, key_heads, dim, device=device, dtype=dtype, generator=generator)
    store = tuple(torch.randn(slots, key_heads, dim, device=device, dtype=dtype, generator=generator) for _ in "kv")
    mask = block_mask(flat, kind)
    real = torch.arange(grouped_layout.used, device=device)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        expected = grouped(grouped_layout, kind, q, k, v, store)
        row: dict[str, Any] = {
            "grouped_ms": median_ms(lambda: grouped(grouped_layout, kind, q, k, v, store), device),
            "block_mask_ms": median_ms(lambda: block_mask(flat, kind), device),
            "block_mask_sparsity_percent": float(mask.sparsity()),
        }
    for tiles in TILES[dim] if device.type == "cuda" else [None]:
        try:
            got = flex(flat, mask, q, k, v, store, tiles)
        except Exception as error:  # the kernel cannot hold these tiles on this GPU: try smaller ones
            row.setdefault("flex_errors", []).append(f"{tiles}: {type(error).__name__}: {error}"[:300])
            continue
        row["largest_difference"] = float((got[real] - expected[real]).abs().max())
        row["flex_ms"] = median_ms(lambda: flex(flat, mask, q, k, v, store, tiles), device)  # noqa: B023
        row["tiles"] = tiles
        break
    return row


@dataclass(frozen=True)
class StandardPass:
    """One pass of `standard`-shaped requests (`rows_of`) laid out by the engine both ways: in groups, and flat
    over its rows' past keys padded to a multiple of 256; the store's size and the pass's sizes."""

    attention: Attention
    grouped: PassLayout
    flat: PassLayout
    slots: int
    sizes: dict[str, int]

    @classmethod
    def of(cls, requests: int, device: torch.device) -> StandardPass:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        rows, slots = rows_of(requests)
        used = sum(len(row.ids) for row in rows)
        bucket = -(-used // 256) * 256
        heads = {kind: (query_heads, key_heads) for kind, (query_heads, key_heads, _) in KINDS.items()}
        attention = Attention(heads, WINDOW, False, dtype, device)
        past_bucket = -(-sum(len(row.past) for row in rows) // 256) * 256
        grouped = lay_out(rows, bucket=bucket, attention=attention)
        flat = lay_out(rows, bucket=bucket, attention=attention, flat=(past_bucket, slots - 1))
        sizes = {"requests": requests, "tokens": used, "bucket": bucket, "past_keys": past_bucket}
        return cls(attention, grouped, flat, slots, sizes)


def measure(requests: int, device: torch.device) -> dict[str, Any]:
    """Both layouts of one pass of `requests` requests, and each layer kind attended both ways."""
    laid = StandardPass.of(requests, device)
    grouped_layout, flat, slots, dtype = laid.grouped, laid.flat.flat, laid.slots, laid.attention.dtype
    assert flat is not None
    report: dict[str, Any] = {**laid.sizes, "groups": len(grouped_layout.groups)}
    for kind in KINDS:
        report[kind] = measure_kind(kind, grouped_layout, flat, slots, device, dtype)
        print(requests, kind, json.dumps(report[kind]), flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("device", nargs="?", default="cpu")
    parser.add_argument("--requests", type=int, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    sizes = [args.requests] if args.requests else ([1, 8, 32] if device.type == "cuda" else [2])
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__}
    report["passes"] = [measure(requests, device) for requests in sizes]
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
