"""``small_batch_linear``: the same products as ``F.linear`` through another CPU kernel, only inside the block."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specheads.decoding.cpu_kernels import small_batch_linear


@pytest.mark.parametrize("shape", [(2, 48), (1, 3, 48), (1, 7, 48), (3, 5, 48), (1, 64, 48)])
@pytest.mark.parametrize("bias", [False, True])
def test_outputs_match_f_linear(shape, bias):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 80, bias=bias), nn.ReLU(), nn.Linear(80, 48, bias=bias))
    x = torch.randn(shape)
    expected = model(x)
    with small_batch_linear(model):
        found = model(x)
    assert found.shape == expected.shape
    torch.testing.assert_close(found, expected, atol=1e-5, rtol=1e-5)


def test_forward_is_swapped_only_inside_the_block_and_only_for_few_rows(monkeypatch):
    layer = nn.Linear(16, 16)
    calls = []
    monkeypatch.setattr(torch, "mm", lambda a, b: calls.append(b.shape) or a @ b)
    with small_batch_linear(layer, max_rows=8):
        assert "forward" in layer.__dict__
        layer(torch.randn(1, 16))  # one row: the stock path
        layer(torch.randn(5, 16))  # few rows: (W @ x.T).T
        layer(torch.randn(3, 16))  # 3 rows are computed as 4 (a faster MKL kernel)
        layer(torch.randn(9, 16))  # more than max_rows: the stock path
        with torch.no_grad():
            layer(torch.randn(2, 16).to(torch.bfloat16).float())
    assert calls == [torch.Size([16, 5]), torch.Size([16, 4]), torch.Size([16, 2])]
    assert "forward" not in layer.__dict__  # restored: the class's forward again
    layer(torch.randn(3, 16))
    assert len(calls) == 3


def test_gradients_keep_the_stock_path():
    layer = nn.Linear(8, 8)
    x = torch.randn(3, 8, requires_grad=True)
    with small_batch_linear(layer):
        out = layer(x)
    out.sum().backward()
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))
    assert x.grad is not None


def test_outputs_are_row_major_like_f_linear():
    """A transposed-view output would send the next layer's product and SDPA (strided q/k/v) to slow kernels."""
    layer = nn.Linear(48, 80)
    x = torch.randn(1, 4, 48)
    with small_batch_linear(layer), torch.no_grad():
        out = layer(x)
    assert out.is_contiguous() and out.stride() == F.linear(x, layer.weight, layer.bias).stride()
