"""``small_batch_linear``: the same products as ``F.linear`` through another CPU kernel, only inside the block, and only
for the row counts where it was measured faster on this machine."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specheads.decoding import cpu_kernels
from specheads.decoding.cpu_kernels import ROW_BUCKETS, faster_row_counts, small_batch_linear

EVERY_COUNT = range(2, 65)


@pytest.mark.parametrize("shape", [(2, 48), (1, 3, 48), (1, 7, 48), (3, 5, 48), (1, 64, 48)])
@pytest.mark.parametrize("bias", [False, True])
def test_outputs_match_f_linear(shape, bias):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 80, bias=bias), nn.ReLU(), nn.Linear(80, 48, bias=bias))
    x = torch.randn(shape)
    expected = model(x)
    with small_batch_linear(model, rows=EVERY_COUNT):
        found = model(x)
    assert found.shape == expected.shape
    torch.testing.assert_close(found, expected, atol=1e-5, rtol=1e-5)


def test_forward_is_swapped_only_inside_the_block_and_only_for_few_rows(monkeypatch):
    layer = nn.Linear(16, 16)
    calls = []
    monkeypatch.setattr(torch, "mm", lambda a, b: calls.append(b.shape) or a @ b)
    with small_batch_linear(layer, rows=range(2, 9)):
        assert "forward" in layer.__dict__
        layer(torch.randn(1, 16))  # one row: the stock path
        layer(torch.randn(5, 16))  # few rows: (W @ x.T).T
        layer(torch.randn(3, 16))  # 3 rows are computed as 4 (a faster MKL kernel)
        layer(torch.randn(9, 16))  # a count not chosen: the stock path
        with torch.no_grad():
            layer(torch.randn(2, 16).to(torch.bfloat16).float())
    assert calls == [torch.Size([16, 5]), torch.Size([16, 4]), torch.Size([16, 2])]
    assert "forward" not in layer.__dict__  # restored: the class's forward again
    layer(torch.randn(3, 16))
    assert len(calls) == 3


def test_gradients_keep_the_stock_path():
    layer = nn.Linear(8, 8)
    x = torch.randn(3, 8, requires_grad=True)
    with small_batch_linear(layer, rows=EVERY_COUNT):
        out = layer(x)
    out.sum().backward()
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))
    assert x.grad is not None


def test_outputs_are_row_major_like_f_linear():
    """A transposed-view output would send the next layer's product and SDPA (strided q/k/v) to slow kernels."""
    layer = nn.Linear(48, 80)
    x = torch.randn(1, 4, 48)
    with small_batch_linear(layer, rows=EVERY_COUNT), torch.no_grad():
        out = layer(x)
    assert out.is_contiguous() and out.stride() == F.linear(x, layer.weight, layer.bias).stride()


def test_only_the_row_counts_measured_faster_are_swapped(monkeypatch):
    """Which kernel wins depends on the CPU (on some the swap is slower for every row count): buckets
    where the swap takes under 90% of the stock time are swapped, with the counts they judge, and nothing else."""
    stock, swapped = {2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0, 32: 1.0}, {2: 0.5, 4: 0.95, 8: 0.5, 16: 2.0, 32: 0.89}
    clock = iter(())

    def fake_timer():  # a timed pass reads start, then end: 0, then the pass's cost
        return next(clock)

    passes = []
    real_swapped, real_linear = cpu_kernels._swapped, cpu_kernels.F.linear
    monkeypatch.setattr(cpu_kernels, "_swapped", lambda m, x: passes.append((x.shape[0], True)) or real_swapped(m, x))
    monkeypatch.setattr(
        cpu_kernels.F, "linear", lambda x, w, b=None: passes.append((x.shape[0], False)) or real_linear(x, w, b)
    )
    layers = [nn.Linear(8, 8) for _ in range(3)]
    warm_up = [0.0] * len(ROW_BUCKETS) * 2  # not timed: its passes read the clock once, when they start
    timed = [
        value for rows in ROW_BUCKETS for swap in (False, True) for value in (0.0, (swapped if swap else stock)[rows])
    ]
    costs = warm_up + timed + timed  # two timed repeats
    clock = iter(costs)
    monkeypatch.setattr(cpu_kernels.time, "perf_counter", fake_timer)
    chosen = cpu_kernels._time_row_buckets(layers)
    assert chosen == frozenset({2, 5, 6, 7, 8, 17, *range(18, 33)})
    assert len(passes) == 3 * len(ROW_BUCKETS) * 2 * len(layers)  # every bucket, both kernels, every layer


def test_the_measurement_is_made_once_per_layer_shapes_and_thread_count(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_kernels, "_MEASURED", {})
    monkeypatch.setattr(cpu_kernels, "_time_row_buckets", lambda layers: calls.append(len(layers)) or frozenset({2, 3}))
    model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(6)))
    assert faster_row_counts(model) == {2, 3} and faster_row_counts(model, max_rows=2) == {2}
    assert faster_row_counts(nn.Sequential(*(nn.Linear(16, 16) for _ in range(6)))) == {2, 3}  # same shapes
    assert calls == [2]  # a third of the layers, timed once
    faster_row_counts(nn.Linear(16, 32))
    assert calls == [2, 1]
    assert faster_row_counts(nn.Linear(16, 16).to(torch.bfloat16)) == frozenset() and calls == [2, 1]


def test_where_no_count_is_faster_nothing_is_patched(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_MEASURED", {})
    monkeypatch.setattr(cpu_kernels, "_time_row_buckets", lambda layers: frozenset())
    layer = nn.Linear(16, 16)
    with small_batch_linear(layer):
        assert "forward" not in layer.__dict__


def test_a_real_measurement_returns_counts_in_range():
    chosen = cpu_kernels._time_row_buckets([nn.Linear(64, 256) for _ in range(4)])
    assert chosen <= set(range(2, ROW_BUCKETS[-1] + 1))
    buckets = dict(zip(ROW_BUCKETS, (1, *ROW_BUCKETS)))
    assert all(
        set(range(low + 1, high + 1)) <= chosen or not chosen & set(range(low + 1, high + 1))
        for high, low in buckets.items()
    )  # whole buckets only
