"""The layer math of a fused pass over flat tokens: token-wise pieces around a row-wise attention.

DiffusionGemma's encoder and decoder share their weights, and the decoder's
layer l reads only the encoder's layer-l keys and values. So one loop over
the layers processes prompt tokens (causal, their keys written to the
store) and canvas tokens (bidirectional over prompt and canvas) at once,
streaming each layer's weights once. Each layer is three pieces:

- `pre`: norm, projections, q/k/v norms and rotary, per token;
- `attend`: the store writes, then each attention group's SDPA (`layout.py`),
  or, for a small pass, `attend_flat`: one SDPA over the whole pass;
- `post`: output projection, dense MLP and routed experts, per token.

A layer's products that read one input run as one matrix product: queries,
keys and values, and the dense MLP's gate and up (`merged_rows`). A small
pass's products are short, so each costs a launch, a split-K reduction and
its gaps more than its weights' bytes.

`pre` and `post` have one shape per bucket, so they are compiled (with the
token count dynamic) and captured as CUDA graphs (`graphs.py`); `attend`
runs eagerly between them, as vLLM's piecewise graphs do. A flat pass has
the bucket's shapes throughout, so it is captured whole, as vLLM captures
small decode batches whole. The pieces read
and write `Buffers`, fixed tensors sliced to the pass's bucket. The masks
(`masks.py`) mirror `DiffusionGemmaForBlockDiffusion` exactly; tests
compare against it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from canvasread.canvas.engine.experts import Fp8Experts, choose_products, routed_experts
from canvasread.canvas.engine.kvstore import KVStore
from canvasread.canvas.engine.layout import Attention, FlatInputs, PassLayout

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
# Not cuDNN's attention: it builds a plan for every new shape (about 60 ms on an H100), and a pass's group shapes
# follow its rows; a 32-request pass took 214.5 against 172.5 ms (bench/results/h100-2026-12-05d). Memory-efficient
# where the head dim allows it, else the math kernel: tried in this order.
ATTENTION_KERNELS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass(frozen=True)
class Buffers:
    """The fixed tensors a pass's pieces read and write, per layer kind where shapes differ by kind."""

    hidden: torch.Tensor  # [tokens, width]
    rope: dict[str, tuple[torch.Tensor, torch.Tensor]]  # cos, sin: [tokens, head_dim]
    query: dict[str, torch.Tensor]  # [tokens, heads, head_dim]
    keys: dict[str, torch.Tensor]  # [tokens, kv_heads, head_dim]
    values: dict[str, torch.Tensor]
    attended: dict[str, torch.Tensor]  # [tokens, heads, head_dim]
    signal: torch.Tensor  # [tokens, width]: canvas tokens' self-conditioning input (zeros where a row has none)

    def view(self, tokens: int) -> Buffers:
        """The first `tokens` rows of every buffer (the same memory: what a graph of that bucket captured)."""
        return Buffers(
            self.hidden[:tokens],
            {kind: (cos[:tokens], sin[:tokens]) for kind, (cos, sin) in self.rope.items()},
            {kind: t[:tokens] for kind, t in self.query.items()},
            {kind: t[:tokens] for kind, t in self.keys.items()},
            {kind: t[:tokens] for kind, t in self.values.items()},
            {kind: t[:tokens] for kind, t in self.attended.items()},
            self.signal[:tokens],
        )


class LayerStack:
    """The text layers of a loaded `DiffusionGemmaForBlockDiffusion`, run piece by piece over flat passes.

    With `compile` (a backend: "inductor") `pre` and `post` run through
    `torch.compile` (Inductor fuses the fp32 norm chains, rotary and routing
    into a few kernels; layers of one kind share the compiled code). With
    `fp8_experts` the routed experts run in FP8 (`experts.py`).
    """

    def __init__(self, model: Any, *, compile: str | None = None, fp8_experts: bool = False) -> None:
        text = model.model.encoder.language_model
        self.layers = text.layers
        self.embed = text.embed_tokens
        self.rotary = text.rotary_emb
        self.norm = text.norm
        self.self_conditioning = model.model.decoder.self_conditioning
        self.layer_types: list[str] = list(text.config.layer_types)
        self.top_k = int(text.config.top_k_experts)
        self.kinds = sorted(set(self.layer_types))
        self.qkv = [merged_rows(_qkv(layer.self_attn)) for layer in self.layers]
        self.gate_up = [merged_rows([layer.mlp.gate_proj, layer.mlp.up_proj]) for layer in self.layers]
        self.fp8: list[Fp8Experts | None] = [
            Fp8Experts.of(layer.experts) if fp8_experts else None for layer in self.layers
        ]
        self.compiled = bool(compile)
        self._pre: Callable[..., QKV] = torch.compile(_pre, backend=compile) if compile else _pre
        self._post: Callable[..., torch.Tensor] = torch.compile(_post, backend=compile) if compile else _post
        # What a pass's layout needs to build its attention groups; the real config's "vision": an image's soft
        # tokens attend to each other both ways.
        self.attention = Attention(
            {kind: _heads(self.layers[self.layer_types.index(kind)])[:2] for kind in self.kinds},
            int(text.config.sliding_window),
            getattr(text.config, "use_bidirectional_attention", None) == "vision",
            self.embed.weight.dtype,
            self.device,
        )

    @property
    def device(self) -> torch.device:
        return torch.device(self.embed.weight.device)

    def choose_expert_products(self, buckets: Sequence[int]) -> None:
        """Pick each pass size's routed-expert product on this device (`expert_choice`), timed on the first
        layer's experts: every layer's have its shapes."""
        choose_products(self.layers[0].experts, self.fp8[0], [tokens * self.top_k for tokens in buckets])

    def kv_shapes(self) -> list[tuple[int, int]]:
        """Each layer's (kv_heads, head_dim): the KV store's layout."""
        return [_heads(layer)[1:] for layer in self.layers]

    def buffers(self, tokens: int) -> Buffers:
        """Zeroed buffers for passes of up to `tokens` tokens."""
        weight = self.embed.weight
        first = {kind: self.layers[self.layer_types.index(kind)] for kind in self.kinds}
        shapes = {kind: _heads(layer) for kind, layer in first.items()}

        def zeros(*shape: int) -> torch.Tensor:
            zeroed: torch.Tensor = weight.new_zeros(tokens, *shape)
            return zeroed

        return Buffers(
            zeros(weight.shape[-1]),
            {kind: (zeros(dim), zeros(dim)) for kind, (_, _, dim) in shapes.items()},
            {kind: zeros(heads, dim) for kind, (heads, _, dim) in shapes.items()},
            {kind: zeros(kv, dim) for kind, (_, kv, dim) in shapes.items()},
            {kind: zeros(kv, dim) for kind, (_, kv, dim) in shapes.items()},
            {kind: zeros(heads, dim) for kind, (heads, _, dim) in shapes.items()},
            zeros(weight.shape[-1]),
        )

    def embed_into(self, layout: PassLayout, views: Buffers) -> None:
        """A grouped pass's inputs into `views`: its canvas rows' self-conditioning, then `embed_tokens` (images
        too)."""
        self.signals_into(layout, views)
        self.embed_tokens(layout.tokens, layout.positions, layout.is_canvas, views, layout.images)

    def signals_into(self, layout: PassLayout, views: Buffers) -> None:
        """Each canvas row's self-conditioning input at its tokens, zeros elsewhere (a row's first step has none).
        Eager before a flat pass's graph: the rows that carry one, and where, change from pass to pass."""
        views.signal.zero_()
        for offset, soft in layout.signals:
            views.signal[offset : offset + soft.shape[0]] = soft.to(views.signal.dtype)

    def embed_flat(self, flat: FlatInputs, views: Buffers) -> None:
        """A flat pass's embedding, from its inputs alone: inside its graph (it holds no image)."""
        self.embed_tokens(flat.ids, flat.positions, flat.is_canvas, views)

    def embed_tokens(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        is_canvas: torch.Tensor,
        views: Buffers,
        images: Sequence[tuple[int, torch.Tensor]] = (),
    ) -> None:
        """Token embeddings (image features in place of their soft tokens), the canvas tokens passed through
        self-conditioning on `views.signal`, and each layer kind's rotary, into `views`."""
        hidden = self.embed(ids[None])
        for offset, features in images:
            hidden[0, offset : offset + features.shape[0]] = features.to(hidden.dtype)
        conditioned = self.self_conditioning(hidden, views.signal[None])
        views.hidden.copy_(torch.where(is_canvas[None, :, None], conditioned, hidden)[0])
        for kind in self.kinds:
            cos, sin = self.rotary(hidden, positions[None], kind)
            views.rope[kind][0].copy_(cos[0])
            views.rope[kind][1].copy_(sin[0])

    def pre(self, index: int, views: Buffers) -> None:
        kind = self.layer_types[index]
        cos, sin = views.rope[kind]
        self._dynamic(views.hidden, cos, sin)
        query, keys, values = self._pre(self.layers[index], self.qkv[index], views.hidden, cos, sin)
        views.query[kind].copy_(query)
        views.keys[kind].copy_(keys)
        views.values[kind].copy_(values)

    @staticmethod
    def attending() -> AbstractContextManager[None]:
        """The attention kernels `attend` may use, entered once a pass: each entry sets and restores the
        backends' flags (about 10 us), and a pass attends once per layer and group."""
        return sdpa_kernel(ATTENTION_KERNELS, set_priority=True)

    def attend(self, index: int, views: Buffers, layout: PassLayout, store: KVStore) -> None:
        """Write this layer's prompt keys to the store, then attend every group (eager: shapes follow the rows).

        Runs inside `attending()`."""
        kind = self.layer_types[index]
        query, keys, values = views.query[kind], views.keys[kind], views.values[kind]
        stored_keys, stored_values = store.keys[index], store.values[index]
        stored_keys.index_copy_(0, layout.slots, keys.index_select(0, layout.written))
        stored_values.index_copy_(0, layout.slots, values.index_select(0, layout.written))
        query_rows = query.view(-1, query.shape[-1])  # [tokens * heads, dim]: what `group.folded` indexes
        out_rows = views.attended[kind].view(-1, query.shape[-1])
        for group in layout.groups:
            all_keys = torch.cat([stored_keys[group.past], keys[group.queries]], dim=1).transpose(1, 2)
            all_values = torch.cat([stored_values[group.past], values[group.queries]], dim=1).transpose(1, 2)
            attended = F.scaled_dot_product_attention(
                query_rows[group.folded[kind]], all_keys, all_values, attn_mask=group.masks[kind], scale=1.0
            )
            out_rows.index_copy_(0, group.targets[kind], attended[group.picks[kind]])

    def attend_flat(
        self, index: int, views: Buffers, flat: FlatInputs, masks: dict[str, torch.Tensor], store: KVStore
    ) -> None:
        """`attend` for a flat pass (`layout.py`): every token's keys to the store, then one attention of every
        token over the past keys and the pass's own, each key head's query heads folded along the queries.
        Its shapes are the bucket's, so a graph can hold it. Runs inside `attending()`."""
        kind = self.layer_types[index]
        query, keys, values = views.query[kind], views.keys[kind], views.values[kind]
        stored_keys, stored_values = store.keys[index], store.values[index]
        stored_keys.index_copy_(0, flat.tokens[4], keys)
        stored_values.index_copy_(0, flat.tokens[4], values)
        tokens, heads, dim = query.shape
        kv_heads = keys.shape[1]
        fold = heads // kv_heads
        past = flat.past[0]
        all_keys = torch.cat([stored_keys.index_select(0, past), keys]).transpose(0, 1)[None]
        all_values = torch.cat([stored_values.index_select(0, past), values]).transpose(0, 1)[None]
        folded = query.view(tokens, kv_heads, fold, dim).permute(1, 2, 0, 3).reshape(1, kv_heads, fold * tokens, dim)
        attended = F.scaled_dot_product_attention(folded, all_keys, all_values, attn_mask=masks[kind], scale=1.0)
        out = views.attended[kind].view(tokens, kv_heads, fold, dim)
        out.copy_(attended.view(kv_heads, fold, tokens, dim).permute(2, 0, 1, 3))

    def post(self, index: int, views: Buffers) -> None:
        kind = self.layer_types[index]
        self._dynamic(views.hidden, views.attended[kind])
        hidden = self._post(
            self.layers[index], self.gate_up[index], views.hidden, views.attended[kind], self.fp8[index]
        )
        views.hidden.copy_(hidden)

    def _dynamic(self, *tensors: torch.Tensor) -> None:
        """Compile the token count as a size, so one compiled piece serves every bucket."""
        if self.compiled:
            for tensor in tensors:
                torch._dynamo.maybe_mark_dynamic(tensor, 0)


def _heads(layer: Any) -> tuple[int, int, int]:
    """(query heads, kv heads, head_dim) of one layer's attention."""
    attention = layer.self_attn
    dim = int(attention.head_dim)
    return attention.q_proj.out_features // dim, attention.k_proj.out_features // dim, dim


def _qkv(attention: Any) -> list[torch.nn.Linear]:
    """A layer's query, key and (where it has them: not on full-attention layers) value projections."""
    projections = [attention.q_proj, attention.k_proj]
    return projections if attention.v_proj is None else [*projections, attention.v_proj]


def merged_rows(linears: Sequence[torch.nn.Linear]) -> Merged:
    """The linears' weights (and biases) stacked into one matrix that one product serves. Each linear's weight
    then views its rows: the same parameter, so a weight tied elsewhere (the decoder's) stays tied, the model
    still runs as transformers wrote it, and no memory is added."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    has_bias = [linear.bias is not None for linear in linears]
    if any(has_bias) and not all(has_bias):
        raise ValueError("merged projections either all have biases or none do")
    bias = torch.cat([linear.bias.detach() for linear in linears]) if all(has_bias) else None
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = weight[start : start + rows]
        if bias is not None:
            linear.bias.data = bias[start : start + rows]
        start += rows
    return Merged(weight, bias, tuple(linear.out_features for linear in linears))


@dataclass(frozen=True)
class Merged:
    """Linears that read one input, as one [sum of outputs, input] matrix, and each one's outputs."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    sizes: tuple[int, ...]

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each linear's output of `x`, from one product."""
        return torch.split(F.linear(x, self.weight, self.bias), list(self.sizes), dim=-1)


def _pre(layer: Any, qkv: Merged, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> QKV:
    """Queries, keys and values of one layer as transformers computes them, [tokens, heads, head_dim]."""
    attention = layer.self_attn
    normed = layer.input_layernorm(hidden)
    tokens = normed.shape[0]
    projected = [part.view(tokens, -1, attention.head_dim) for part in qkv(normed)]
    query = _rotate(attention.q_norm(projected[0]), cos, sin)
    raw_keys = projected[1]
    raw_values = projected[2] if len(projected) == 3 else raw_keys
    keys = _rotate(attention.k_norm(raw_keys), cos, sin)
    return query, keys, attention.v_norm(raw_values)


def _post(
    layer: Any, gate_up: Merged, hidden: torch.Tensor, attended: torch.Tensor, fp8: Fp8Experts | None
) -> torch.Tensor:
    """The rest of one layer after attention: output projection, dense MLP and routed experts, per token."""
    attended = layer.self_attn.o_proj(attended.reshape(attended.shape[0], -1))
    hidden = hidden + layer.post_attention_layernorm(attended)
    residual = hidden
    gate, up = gate_up(layer.pre_feedforward_layernorm(hidden))
    dense = layer.post_feedforward_layernorm_1(layer.mlp.down_proj(layer.mlp.act_fn(gate) * up))
    _, weights, experts = layer.router(hidden)
    routed = routed_experts(layer.experts, layer.pre_feedforward_layernorm_2(hidden), experts, weights, fp8)
    hidden = residual + layer.post_feedforward_layernorm(dense + layer.post_feedforward_layernorm_2(routed))
    scaled: torch.Tensor = hidden * layer.layer_scalar
    return scaled


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on [tokens, heads, dim] (the model's own formula, applied to the rotated part)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
