"""A layer's projections merged into one product (`layers.merged_rows`): the same outputs, the same parameters."""

from __future__ import annotations

import pytest
import torch

from canvasread.canvas.engine.layers import merged_rows


def _linears(*outputs: int, bias: bool = False) -> list[torch.nn.Linear]:
    torch.manual_seed(0)
    return [torch.nn.Linear(12, out, bias=bias) for out in outputs]


@pytest.mark.parametrize("bias", [False, True])
def test_one_product_gives_each_linears_output(bias: bool) -> None:
    linears = _linears(8, 4, 4, bias=bias)
    expected_weights = [linear.weight.detach().clone() for linear in linears]
    merged = merged_rows(linears)
    x = torch.randn(5, 12)
    for part, linear, weight in zip(merged(x), linears, expected_weights, strict=True):
        assert torch.equal(linear.weight, weight)
        torch.testing.assert_close(part, linear(x), rtol=1e-6, atol=1e-6)
    assert [part.shape[-1] for part in merged(x)] == [8, 4, 4]


def test_the_linears_weights_become_views_of_the_merged_matrix_so_ties_hold_and_no_memory_is_added() -> None:
    """DiffusionGemma's decoder shares each encoder weight as the same parameter object: merging one side's
    linears must keep that object, and leave its data inside the merged matrix."""
    linears = _linears(6, 2)
    tied = torch.nn.Linear(12, 6, bias=False)
    tied.weight = linears[0].weight  # as transformers ties the decoder's weight to the encoder's
    merged = merged_rows(linears)
    assert tied.weight is linears[0].weight
    start = merged.weight.data_ptr()
    size = merged.weight.element_size()
    assert [linear.weight.data_ptr() for linear in linears] == [start, start + 6 * 12 * size]
    with torch.no_grad():
        merged.weight[0, 0] = 7.0
    assert tied.weight[0, 0] == 7.0


def test_linears_that_mix_biases_are_refused() -> None:
    linears = [torch.nn.Linear(4, 2, bias=True), torch.nn.Linear(4, 2, bias=False)]
    with pytest.raises(ValueError, match="biases"):
        merged_rows(linears)
