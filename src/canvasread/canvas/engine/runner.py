"""The model runner: one pass over the layers that encodes prompt tokens and reads canvases together.

DiffusionGemma's encoder and decoder share their weights, and the decoder's
layer l reads only the encoder's layer-l keys and values. So a single loop
over the layers can process, per row, the *uncached* prompt tokens (causal,
writing KV) and the canvas tokens (bidirectional over prompt + canvas) at
once, streaming each layer's weights once instead of twice. The LM head runs
only at slot positions, and only the label columns' log-probabilities leave
the device.

Attention semantics mirror `DiffusionGemmaForBlockDiffusion` exactly (tests
compare against it): prompt tokens attend causally, within the sliding window
on sliding layers; canvas tokens attend to the whole prompt on full layers but
only to the last `sliding_window - 1` prompt tokens on sliding layers (what
the decoder sees through a sliding KV cache), and to every canvas token.

This is the only module besides `loader.py` that touches torch.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from canvasread.canvas.engine.graphs import GraphCache
from canvasread.types import ImageAsset


@dataclass
class PromptKV:
    """Keys and values of an encoded prompt (or prefix), per layer, shaped [kv_heads, length, head_dim]."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def prefix(self, length: int) -> PromptKV:
        """A copy of the first `length` positions (a copy, so the full prompt's memory can be freed)."""
        return PromptKV(
            [k[:, :length].clone() for k in self.keys], [v[:, :length].clone() for v in self.values], length
        )


@dataclass(frozen=True)
class Row:
    """One unit of work in a pass: continue `past` with `prompt_ids`, then read `canvas_ids` (if any).

    `slot_positions` index into the canvas; `label_ids[i]` are the token ids
    whose log-probabilities are wanted at slot i. With `keep_kv` the KV of
    past + new prompt tokens is returned for caching. `images` puts each
    image's features (vision tower output) over its soft tokens, given as
    offsets into `prompt_ids`.
    """

    past: PromptKV | None
    prompt_ids: Sequence[int]
    canvas_ids: Sequence[int]
    slot_positions: Sequence[int]
    label_ids: Sequence[Sequence[int]]
    keep_kv: bool = False
    images: Sequence[tuple[int, torch.Tensor]] = ()


@dataclass
class RowOutput:
    """Per slot: the full-vocabulary log-probabilities of its label ids (temperature 1)."""

    label_logprobs: list[torch.Tensor]
    kv: PromptKV | None


@dataclass(frozen=True)
class PassShape:
    """The padded size of one pass: rows, new tokens per row, cached tokens per row."""

    batch: int
    new: int
    past: int

    @classmethod
    def of(cls, rows: Sequence[Row]) -> PassShape:
        return cls(
            len(rows),
            max(len(r.prompt_ids) + len(r.canvas_ids) for r in rows),
            max(r.past.length if r.past is not None else 0 for r in rows),
        )


@dataclass
class PassInputs:
    tokens: torch.Tensor
    positions: torch.Tensor
    is_canvas: torch.Tensor
    masks: dict[str, torch.Tensor]
    real_tokens: torch.Tensor
    max_past: int
    past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    images: list[tuple[int, int, torch.Tensor]] | None = None


class FusedRunner:
    """Runs batches of `Row`s through a loaded `DiffusionGemmaForBlockDiffusion`, reusing its modules."""

    def __init__(self, model: Any, *, cuda_graphs: bool = False, image_processor: Any = None) -> None:
        self.model = model
        self.image_processor = image_processor
        text = model.model.encoder.language_model
        self.layers = text.layers
        self.embed = text.embed_tokens
        self.rotary = text.rotary_emb
        self.norm = text.norm
        self.self_conditioning = model.model.decoder.self_conditioning
        self.lm_head = model.lm_head
        self.config = text.config
        self.softcap = float(model.config.text_config.final_logit_softcapping or 0.0)
        self.layer_types: list[str] = list(self.config.layer_types)
        self.window = int(self.config.sliding_window)
        self.graphs = GraphCache() if cuda_graphs and self.device.type == "cuda" else None

    @property
    def device(self) -> torch.device:
        return torch.device(self.embed.weight.device)

    @torch.inference_mode()
    def run(self, rows: Sequence[Row]) -> list[RowOutput]:
        """One pass over the layers for every row; rows of any lengths are padded into one batch.

        Small batches that share one cached prefix replay CUDA graphs when enabled (`graphs`).
        """
        prompt_lengths = [len(row.prompt_ids) for row in rows]
        graphed = self.graphs.run(self, rows) if self.graphs is not None else None
        if graphed is not None:
            hidden, new_keys, new_values = graphed
        else:
            inputs = self._prepare(rows, PassShape.of(rows), filter_padding=True)
            hidden, new_keys, new_values = self._forward(rows, inputs)
        return self._outputs(rows, hidden, new_keys, new_values, prompt_lengths)

    def image_token_count(self, image: ImageAsset) -> int:
        """How many soft tokens the vision tower writes for this image (its size decides)."""
        return int(self._process([image.data])["num_soft_tokens_per_image"][0])

    @torch.inference_mode()
    def image_features(self, images: Sequence[bytes]) -> list[torch.Tensor]:
        """The vision tower's output for each image, one [soft tokens, hidden] tensor each."""
        processed = self._process(images)
        device = self.device
        encoder = self.model.model.encoder
        dtype = self.embed.weight.dtype
        output = encoder.get_image_features(
            processed["pixel_values"].to(device, dtype), processed["image_position_ids"].to(device)
        )
        counts = [int(n) for n in processed["num_soft_tokens_per_image"]]
        return list(torch.split(output.pooler_output, counts))

    def _process(self, images: Sequence[bytes]) -> Any:
        if self.image_processor is None:
            raise ValueError("this checkpoint has no image processor")
        from PIL import Image

        pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
        return self.image_processor(images=pictures, return_tensors="pt")

    def _prepare(
        self,
        rows: Sequence[Row],
        shape: PassShape,
        *,
        filter_padding: bool,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> PassInputs:
        """Host-side tensors for a pass of `shape` (rows beyond `len(rows)` and tokens beyond a row are padding).

        With `filter_padding` the experts see real tokens only; a CUDA graph
        needs fixed sizes, so it routes padding tokens too (their outputs are
        never read, and no real token attends to them). `past` gives, per
        layer, one [1, heads, shape.past, dim] key and value buffer shared by
        all rows (a graph's static copy of the common prefix).
        """
        batch, max_new, max_past = shape.batch, shape.new, shape.past
        past_lengths = [row.past.length if row.past is not None else 0 for row in rows]
        prompt_lengths = [len(row.prompt_ids) for row in rows]
        new_lengths = [len(row.prompt_ids) + len(row.canvas_ids) for row in rows]
        padding_rows = batch - len(rows)
        past_lengths += [max_past] * padding_rows
        prompt_lengths += [0] * padding_rows
        new_lengths += [0] * padding_rows
        tokens = torch.zeros(batch, max_new, dtype=torch.long)
        positions = torch.zeros(batch, max_new, dtype=torch.long)
        is_canvas = torch.zeros(batch, max_new, dtype=torch.bool)
        for b, row in enumerate(rows):
            ids = [*row.prompt_ids, *row.canvas_ids]
            tokens[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            is_canvas[b, prompt_lengths[b] : new_lengths[b]] = True
        positions += torch.tensor(past_lengths)[:, None] + torch.arange(max_new)[None, :]
        if filter_padding:
            valid = torch.arange(max_new)[None, :] < torch.tensor(new_lengths)[:, None]
            real_tokens = valid.reshape(-1).nonzero().squeeze(1)
        else:
            real_tokens = torch.arange(batch * max_new)
        masks = {
            kind: self._mask(kind, past_lengths, prompt_lengths, new_lengths, max_past, max_new)
            for kind in sorted(set(self.layer_types))
        }
        device = self.device
        return PassInputs(
            tokens.to(device),
            positions.to(device),
            is_canvas.to(device),
            {kind: mask.to(device) for kind, mask in masks.items()},
            real_tokens.to(device),
            max_past,
            past,
            [(b, offset, features) for b, row in enumerate(rows) for offset, features in row.images] or None,
        )

    def _forward(
        self,
        rows: Sequence[Row],
        inputs: PassInputs,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """The layer loop: device work only, no host synchronisation (so it can be captured in a CUDA graph)."""
        hidden = self.embed(inputs.tokens)
        for b, offset, features in inputs.images or ():
            hidden[b, offset : offset + features.shape[0]] = features.to(hidden.dtype)
        # The decoder's first denoising step: canvas embeddings pass through self-conditioning with a zero signal.
        conditioned = self.self_conditioning(hidden, torch.zeros_like(hidden))
        hidden = torch.where(inputs.is_canvas[..., None], conditioned, hidden)
        rope = {kind: self.rotary(hidden, inputs.positions, kind) for kind in inputs.masks}
        new_keys: list[torch.Tensor] = []
        new_values: list[torch.Tensor] = []
        for index, layer in enumerate(self.layers):
            kind = self.layer_types[index]
            past: tuple[torch.Tensor, torch.Tensor] | None = None
            if inputs.past is not None:
                batch = hidden.shape[0]
                past = (
                    inputs.past[index][0].expand(batch, -1, -1, -1),
                    inputs.past[index][1].expand(batch, -1, -1, -1),
                )
            elif inputs.max_past:
                past = _padded_past(rows, index, hidden.shape[0], inputs.max_past)
            hidden, keys, values = self._layer(layer, hidden, rope[kind], inputs.masks[kind], past, inputs.real_tokens)
            new_keys.append(keys)
            new_values.append(values)
        return hidden, new_keys, new_values

    def _mask(
        self,
        kind: str,
        past_lengths: list[int],
        prompt_lengths: list[int],
        new_lengths: list[int],
        max_past: int,
        max_new: int,
    ) -> torch.Tensor:
        """[batch, 1, new, past + new] booleans: which keys each new token may attend to (built on the host)."""
        device = torch.device("cpu")
        past = torch.tensor(past_lengths, device=device)[:, None, None]
        prompt = torch.tensor(prompt_lengths, device=device)[:, None, None]
        new = torch.tensor(new_lengths, device=device)[:, None, None]
        query = torch.arange(max_new, device=device)[None, :, None]
        key = torch.arange(max_past + max_new, device=device)[None, None, :]
        key_is_past = key < max_past
        key_new_index = key - max_past
        key_position = torch.where(key_is_past, key, past + key_new_index)
        key_valid = torch.where(key_is_past, key < past, key_new_index < new)
        key_is_prompt = key_valid & (torch.where(key_is_past, key < past, key_new_index < prompt))
        key_is_canvas = key_valid & ~key_is_past & (key_new_index >= prompt)
        query_position = past + query
        query_is_prompt = query < prompt
        prompt_total = past + prompt
        sliding = kind == "sliding_attention"

        causal = key_is_prompt & (key_position <= query_position)
        if sliding:
            causal &= query_position - key_position < self.window
        reads_prompt = key_is_prompt
        if sliding:
            reads_prompt = reads_prompt & (key_position >= prompt_total - (self.window - 1))
        from_canvas = reads_prompt | key_is_canvas
        mask = torch.where(query_is_prompt, causal, from_canvas)
        # Padding queries attend to themselves only, so no row of the softmax is empty.
        padding_query = query >= new
        return torch.where(padding_query, key == max_past + query, mask)[:, None]

    def _layer(
        self,
        layer: Any,
        hidden: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        real_tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        residual = hidden
        attention = layer.self_attn
        normed = layer.input_layernorm(hidden)
        batch, length, _ = normed.shape
        cos, sin = rope
        query = attention.q_proj(normed).view(batch, length, -1, attention.head_dim)
        query = _rotate(attention.q_norm(query), cos, sin).transpose(1, 2)
        raw_keys = attention.k_proj(normed).view(batch, length, -1, attention.head_dim)
        raw_values = (
            attention.v_proj(normed).view(batch, length, -1, attention.head_dim)
            if attention.v_proj is not None
            else raw_keys
        )
        keys = _rotate(attention.k_norm(raw_keys), cos, sin).transpose(1, 2)
        values = attention.v_norm(raw_values).transpose(1, 2)

        all_keys, all_values = keys, values
        if past is not None:
            all_keys = torch.cat([past[0], keys], dim=2)
            all_values = torch.cat([past[1], values], dim=2)
        attended = F.scaled_dot_product_attention(
            query, all_keys, all_values, attn_mask=mask, scale=1.0, enable_gqa=True
        )
        attended = attention.o_proj(attended.transpose(1, 2).reshape(batch, length, -1))
        hidden = residual + layer.post_attention_layernorm(attended)

        residual = hidden
        dense = layer.post_feedforward_layernorm_1(layer.mlp(layer.pre_feedforward_layernorm(hidden)))
        width = hidden.shape[-1]
        flat = hidden.reshape(-1, width).index_select(0, real_tokens)  # experts only see real tokens
        _, weights, experts = layer.router(flat)
        routed_flat = layer.experts(layer.pre_feedforward_layernorm_2(flat), experts, weights)
        routed = torch.zeros_like(hidden).reshape(-1, width)
        routed.index_copy_(0, real_tokens, layer.post_feedforward_layernorm_2(routed_flat))
        routed = routed.view_as(hidden)
        hidden = residual + layer.post_feedforward_layernorm(dense + routed)
        hidden = hidden * layer.layer_scalar
        return hidden, keys, values

    def _outputs(
        self,
        rows: Sequence[Row],
        hidden: torch.Tensor,
        new_keys: list[torch.Tensor],
        new_values: list[torch.Tensor],
        prompt_lengths: list[int],
    ) -> list[RowOutput]:
        slot_rows = [b for b, row in enumerate(rows) for _ in row.slot_positions]
        slot_columns = [prompt_lengths[b] + p for b, row in enumerate(rows) for p in row.slot_positions]
        logprobs: list[torch.Tensor] = []
        if slot_rows:
            at_slots = self.norm(hidden[slot_rows, slot_columns])
            logits = self.lm_head(at_slots).float()
            if self.softcap:
                logits = torch.tanh(logits / self.softcap) * self.softcap
            full = torch.log_softmax(logits, dim=-1)
            wanted = [ids for row in rows for ids in row.label_ids]
            width = max(len(ids) for ids in wanted)
            index = torch.tensor([[*ids, *([ids[0]] * (width - len(ids)))] for ids in wanted], device=full.device)
            gathered = full.gather(1, index).cpu()
            logprobs = [gathered[i, : len(ids)] for i, ids in enumerate(wanted)]
        outputs = []
        cursor = 0
        for b, row in enumerate(rows):
            count = len(row.slot_positions)
            kv = self._kept_kv(row, b, new_keys, new_values, prompt_lengths[b]) if row.keep_kv else None
            outputs.append(RowOutput(logprobs[cursor : cursor + count], kv))
            cursor += count
        return outputs

    @staticmethod
    def _kept_kv(
        row: Row, b: int, new_keys: list[torch.Tensor], new_values: list[torch.Tensor], prompt_length: int
    ) -> PromptKV:
        keys, values = [], []
        for index in range(len(new_keys)):
            fresh_keys = new_keys[index][b, :, :prompt_length]
            fresh_values = new_values[index][b, :, :prompt_length]
            if row.past is not None:
                fresh_keys = torch.cat([row.past.keys[index], fresh_keys], dim=1)
                fresh_values = torch.cat([row.past.values[index], fresh_values], dim=1)
            keys.append(fresh_keys.clone())
            values.append(fresh_values.clone())
        past_length = row.past.length if row.past is not None else 0
        return PromptKV(keys, values, past_length + prompt_length)


def _padded_past(rows: Sequence[Row], index: int, batch: int, max_past: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `index` of every row's cached KV, padded to `max_past`; a past shared by all rows is not copied."""
    shared = rows[0].past
    if shared is not None and shared.length == max_past and all(row.past is shared for row in rows):
        return (
            shared.keys[index].unsqueeze(0).expand(batch, -1, -1, -1),
            shared.values[index].unsqueeze(0).expand(batch, -1, -1, -1),
        )
    some = next(row.past for row in rows if row.past is not None)
    keys, values = some.keys[index], some.values[index]
    past_keys = keys.new_zeros(batch, keys.shape[0], max_past, keys.shape[-1])
    past_values = values.new_zeros(batch, values.shape[0], max_past, values.shape[-1])
    for b, row in enumerate(rows):
        if row.past is not None:
            past_keys[b, :, : row.past.length] = row.past.keys[index]
            past_values[b, :, : row.past.length] = row.past.values[index]
    return past_keys, past_values


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on [batch, length, heads, dim] (the model's own formula, applied to the rotated part)."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
