"""The routed experts' row gather (one opaque op in a compiled graph, equal to `index_select`) and their sum per
token."""

from __future__ import annotations

from typing import Any

import torch

from canvasread.canvas.engine.experts import combined, gather_rows


def test_the_gather_equals_index_select() -> None:
    source = torch.randn(7, 5)
    index = torch.tensor([6, 0, 0, 3, 6, 1])
    assert torch.equal(gather_rows(source, index), source.index_select(0, index))


def test_compiled_the_gather_stays_one_op_for_every_row_count() -> None:
    """The compiler sees the gather as one op it cannot fuse (on the H200 Inductor's fused gather was 6x slower
    than ATen's), and its shape follows the index, so one graph with dynamic sizes serves every bucket."""
    graphs: list[torch.fx.GraphModule] = []

    def capture(graph: torch.fx.GraphModule, inputs: Any) -> Any:
        graphs.append(graph)
        return graph.forward

    def expert_rows(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return gather_rows(hidden * 2, index // 2) + 1

    compiled = torch.compile(expert_rows, backend=capture, dynamic=True)
    for tokens in (4, 9, 16):
        hidden, index = torch.randn(tokens, 3), torch.randint(0, 2 * tokens, (2 * tokens,))
        assert torch.equal(compiled(hidden, index), expert_rows(hidden, index))
    assert len(graphs) == 1
    targets = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert torch.ops.canvasread.gather_rows.default in targets
    assert torch.index_select not in targets


def test_each_token_sums_its_own_experts_rows_by_their_weights() -> None:
    """The rows come in expert order; each token's sum takes its pairs' rows wherever the sort put them."""
    generator = torch.Generator().manual_seed(3)
    tokens, top_k, width = 6, 3, 4
    chosen = torch.stack([torch.randperm(5, generator=generator)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=generator)
    _, order = torch.sort(chosen.reshape(-1))
    down = torch.randn(tokens * top_k, width, generator=generator)
    places = order.tolist()
    for token in range(tokens):
        expected = sum(weights[token, k] * down[places.index(token * top_k + k)] for k in range(top_k))
        assert torch.allclose(combined(down, order, weights)[token], expected, atol=1e-6)
