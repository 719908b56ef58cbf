"""The layer math of a fused pass: prompt tokens and canvas tokens through the shared layers in one loop.

DiffusionGemma's encoder and decoder share their weights, and the decoder's
layer l reads only the encoder's layer-l keys and values. So a single loop
over the layers can process, per row, the *uncached* prompt tokens (causal,
writing KV) and the canvas tokens (bidirectional over prompt + canvas) at
once, streaming each layer's weights once instead of twice. The masks
(`masks.py`) mirror `DiffusionGemmaForBlockDiffusion` exactly; tests compare
against it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from canvasread.canvas.engine.experts import Fp8Experts, routed_experts
from canvasread.canvas.engine.masks import attention_mask
from canvasread.canvas.engine.rows import PassInputs, PassOutputs, PassShape, Row

logger = logging.getLogger(__name__)

LayerOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
# Compiled layer bodies are kept per layer kind and shape bucket; more than the default cache of 8.
COMPILED_SHAPES = 64


class LayerStack:
    """The text layers of a loaded `DiffusionGemmaForBlockDiffusion`, run over padded batches of `Row`s.

    `prepare` builds a pass's inputs (host work), `forward` runs the layers
    (device work only, no host synchronisation, so it can be captured in a
    CUDA graph). With `compile` (a backend: "inductor") each layer body
    runs through `torch.compile` (Inductor fuses the fp32 norm chains, rotary and routing
    into a few kernels; layers of one kind share the compiled code); a body
    that fails to compile runs eagerly. With `fp8_experts` the routed
    experts run in FP8 (`experts.py`).
    """

    def __init__(self, model: Any, *, compile: str | None = None, fp8_experts: bool = False) -> None:
        text = model.model.encoder.language_model
        self.layers = text.layers
        self.embed = text.embed_tokens
        self.rotary = text.rotary_emb
        self.self_conditioning = model.model.decoder.self_conditioning
        self.layer_types: list[str] = list(text.config.layer_types)
        self.window = int(text.config.sliding_window)
        self.fp8: list[Fp8Experts | None] = [
            Fp8Experts.of(layer.experts) if fp8_experts else None for layer in self.layers
        ]
        self._layer: Callable[..., LayerOutputs] = _layer
        if compile:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, COMPILED_SHAPES)
            self._layer = torch.compile(_layer, backend=compile, dynamic=None)
        # The real config's "vision": an image's soft tokens attend to each other both ways.
        self.bidirectional_images = getattr(text.config, "use_bidirectional_attention", None) == "vision"

    @property
    def device(self) -> torch.device:
        return torch.device(self.embed.weight.device)

    def prepare(
        self,
        rows: Sequence[Row],
        shape: PassShape,
        *,
        filter_padding: bool,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> PassInputs:
        """Tensors for a pass of `shape` (rows beyond `len(rows)` and tokens beyond a row are padding).

        With `filter_padding` the experts see real tokens only; a CUDA graph
        needs fixed sizes, so it routes padding tokens too (their outputs are
        never read, and no real token attends to them). `past` gives, per
        layer, one [1, heads, shape.past, dim] key and value buffer shared by
        all rows (a graph's static copy of the common prefix).
        """
        batch, max_new, max_past = shape.batch, shape.new, shape.past
        padding_rows = batch - len(rows)
        past_lengths = [row.past.length if row.past is not None else 0 for row in rows] + [max_past] * padding_rows
        prompt_lengths = [len(row.prompt_ids) for row in rows] + [0] * padding_rows
        new_lengths = [len(row.prompt_ids) + len(row.canvas_ids) for row in rows] + [0] * padding_rows
        tokens = torch.zeros(batch, max_new, dtype=torch.long)
        is_canvas = torch.zeros(batch, max_new, dtype=torch.bool)
        for b, row in enumerate(rows):
            ids = [*row.prompt_ids, *row.canvas_ids]
            tokens[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            is_canvas[b, prompt_lengths[b] : new_lengths[b]] = True
        positions = torch.tensor(past_lengths)[:, None] + torch.arange(max_new)[None, :]
        if filter_padding:
            valid = torch.arange(max_new)[None, :] < torch.tensor(new_lengths)[:, None]
            real_tokens = valid.reshape(-1).nonzero().squeeze(1)
        else:
            real_tokens = torch.arange(batch * max_new)
        device = self.device
        lengths = torch.tensor([past_lengths, prompt_lengths, new_lengths]).to(device)
        spans = [[(o, len(f)) for o, f in row.images] for row in rows] if self.bidirectional_images else []
        masks = {
            kind: attention_mask(
                sliding=kind == "sliding_attention",
                window=self.window,
                lengths=lengths,
                max_past=max_past,
                max_new=max_new,
                image_spans=spans,
            )
            for kind in sorted(set(self.layer_types))
        }
        return PassInputs(
            tokens.to(device),
            positions.to(device),
            is_canvas.to(device),
            masks,
            real_tokens.to(device),
            max_past,
            past,
            [(b, offset, features) for b, row in enumerate(rows) for offset, features in row.images] or None,
            self._signal(rows, batch, max_new, prompt_lengths, new_lengths),
        )

    def _signal(
        self, rows: Sequence[Row], batch: int, max_new: int, prompt_lengths: list[int], new_lengths: list[int]
    ) -> torch.Tensor | None:
        """The rows' self-conditioning soft embeddings at their canvas positions, zeros elsewhere (None: all zeros)."""
        if all(row.self_conditioning is None for row in rows):
            return None
        weight = self.embed.weight
        signal: torch.Tensor = weight.new_zeros(batch, max_new, weight.shape[-1])
        for b, row in enumerate(rows):
            if row.self_conditioning is not None:
                signal[b, prompt_lengths[b] : new_lengths[b]] = row.self_conditioning
        return signal

    def forward(self, rows: Sequence[Row], inputs: PassInputs) -> PassOutputs:
        """The layer loop over `inputs`; `rows` supply the cached prefixes when no shared static one is given."""
        hidden = self.embed(inputs.tokens)
        for b, offset, features in inputs.images or ():
            hidden[b, offset : offset + features.shape[0]] = features.to(hidden.dtype)
        # Canvas embeddings pass through self-conditioning: the previous step's soft embeddings, or zeros at a first.
        signal = inputs.self_conditioning if inputs.self_conditioning is not None else torch.zeros_like(hidden)
        conditioned = self.self_conditioning(hidden, signal)
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
            hidden, keys, values = self._run_layer(
                layer, hidden, rope[kind], inputs.masks[kind], past, inputs.real_tokens, self.fp8[index]
            )
            new_keys.append(keys)
            new_values.append(values)
        return hidden, new_keys, new_values

    @property
    def compiled(self) -> bool:
        """Whether layer bodies run compiled (false after a compile failure made them eager)."""
        return self._layer is not _layer

    def _run_layer(self, *args: Any) -> LayerOutputs:
        try:
            return self._layer(*args)
        except Exception:
            if self._layer is _layer:
                raise
            logger.warning("compiling the layer body failed; the engine runs it eagerly", exc_info=True)
            self._layer = _layer
            return _layer(*args)


def _layer(
    layer: Any,
    hidden: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    mask: torch.Tensor,
    past: tuple[torch.Tensor, torch.Tensor] | None,
    real_tokens: torch.Tensor,
    fp8: Fp8Experts | None,
) -> LayerOutputs:
    """One decoder layer as transformers computes it, over prompt and canvas tokens together."""
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
    # K/V repeated to the query heads: grouped-query SDPA with a mask takes the math kernel at head dim 512.
    groups = query.shape[1] // all_keys.shape[1]
    all_keys = all_keys.repeat_interleave(groups, dim=1)
    all_values = all_values.repeat_interleave(groups, dim=1)
    attended = F.scaled_dot_product_attention(query, all_keys, all_values, attn_mask=mask, scale=1.0)
    attended = attention.o_proj(attended.transpose(1, 2).reshape(batch, length, -1))
    hidden = residual + layer.post_attention_layernorm(attended)

    residual = hidden
    dense = layer.post_feedforward_layernorm_1(layer.mlp(layer.pre_feedforward_layernorm(hidden)))
    width = hidden.shape[-1]
    flat = hidden.reshape(-1, width).index_select(0, real_tokens)  # experts only see real tokens
    _, weights, experts = layer.router(flat)
    routed_flat = routed_experts(layer.experts, layer.pre_feedforward_layernorm_2(flat), experts, weights, fp8)
    routed = torch.zeros_like(hidden).reshape(-1, width)
    routed.index_copy_(0, real_tokens, layer.post_feedforward_layernorm_2(routed_flat))
    routed = routed.view_as(hidden)
    hidden = residual + layer.post_feedforward_layernorm(dense + routed)
    hidden = hidden * layer.layer_scalar
    return hidden, keys, values


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
