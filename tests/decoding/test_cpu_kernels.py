"""``small_batch_linear``: the same products as ``F.linear`` through another CPU kernel, only inside the block, and only
for the row counts where it was measured faster on this machine."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specheads.decoding.tuning import cpu_kernels
from specheads.decoding.tuning.cpu_kernels import ROW_BUCKETS, SmallBatchLinear, small_batch_linear

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


def test_one_row_is_computed_as_two_where_it_was_measured_faster(monkeypatch):
    """On some CPUs a one-row product (the matrix-vector kernel) is slower than the same product padded to two rows;
    plain decoding, transformers' ``generate`` included, then gets the padded product, as multi-token methods get
    theirs. Outputs are F.linear's to float rounding."""
    layer = nn.Linear(16, 24)
    x = torch.randn(1, 1, 16)
    expected = layer(x)
    calls = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: calls.append(b.shape) or real_mm(a, b))
    with small_batch_linear(layer, rows=[1]), torch.no_grad():
        found = layer(x)
        layer(torch.randn(2, 16))  # a count not chosen: the stock path
    assert calls == [torch.Size([16, 2])]
    assert found.shape == expected.shape and found.is_contiguous()
    torch.testing.assert_close(found, expected, atol=1e-5, rtol=1e-5)


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
    stock = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0, 32: 1.0}
    swapped = {1: 0.6, 2: 0.5, 4: 0.95, 8: 0.5, 16: 2.0, 32: 0.89}
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
    assert chosen == frozenset({1, 2, 5, 6, 7, 8, 17, *range(18, 33)})
    assert len(passes) == 3 * len(ROW_BUCKETS) * 2 * len(layers)  # every bucket, both kernels, every layer


def test_the_measurement_is_made_once_per_layer_shapes_and_thread_count(monkeypatch):
    """A kernel choice remembers what it measured (on itself: a new choice measures again; no module-level state)."""
    calls = []
    monkeypatch.setattr(cpu_kernels, "_time_row_buckets", lambda layers: calls.append(len(layers)) or frozenset({2, 3}))
    model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(6)))
    kernels = SmallBatchLinear()
    assert kernels.faster_row_counts(model) == {2, 3} and SmallBatchLinear(max_rows=2).faster_row_counts(model) == {2}
    assert calls == [2, 2]  # a third of the layers, once per choice
    assert kernels.faster_row_counts(nn.Sequential(*(nn.Linear(16, 16) for _ in range(6)))) == {2, 3}  # same shapes
    assert calls == [2, 2]
    kernels.faster_row_counts(nn.Linear(16, 32))
    assert calls == [2, 2, 1]
    assert kernels.faster_row_counts(nn.Linear(16, 16).to(torch.bfloat16)) == frozenset() and calls == [2, 2, 1]
    containers = (dict, set, list, weakref.WeakKeyDictionary)
    constants = {name for name in vars(cpu_kernels) if name.isupper()}  # public, documented, never written
    state = [
        n for n, v in vars(cpu_kernels).items() if isinstance(v, containers) and n[:2] != "__" and n not in constants
    ]
    assert not state, f"module-level mutable state in cpu_kernels: {state}"


def test_each_model_gets_its_own_rows_and_shared_layers_are_patched_once(monkeypatch):
    """The generator enters ``kernels(target, *drafter modules)``: rows are measured per model's layer shapes, a layer
    both models hold is patched by the first and restored once, at the end of the block."""
    monkeypatch.setattr(cpu_kernels, "_time_row_buckets", lambda layers: frozenset({layers[0].in_features // 8}))
    shared = nn.Linear(16, 16)
    target, drafter = nn.Sequential(shared), nn.Sequential(shared, nn.Linear(32, 32))
    with SmallBatchLinear()(target, drafter):
        assert shared.forward.keywords["rows_to_swap"] == {2}
        assert drafter[1].forward.keywords["rows_to_swap"] == {2}  # the drafter's shapes (16 and 32) measured as one
    assert "forward" not in shared.__dict__ and "forward" not in drafter[1].__dict__


def test_where_no_count_is_faster_nothing_is_patched(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_time_row_buckets", lambda layers: frozenset())
    layer = nn.Linear(16, 16)
    with small_batch_linear(layer):
        assert "forward" not in layer.__dict__


def test_a_real_measurement_returns_counts_in_range():
    chosen = cpu_kernels._time_row_buckets([nn.Linear(64, 256) for _ in range(4)])
    assert chosen <= set(range(1, ROW_BUCKETS[-1] + 1))
    buckets = dict(zip(ROW_BUCKETS, (0, *ROW_BUCKETS)))
    assert all(
        set(range(low + 1, high + 1)) <= chosen or not chosen & set(range(low + 1, high + 1))
        for high, low in buckets.items()
    )  # whole buckets only


def test_generate_enters_the_kernels_hook_with_the_target_and_the_drafter(tiny_llama):
    """The caller opts in: the generator enters the hook it was given around each request, with the target and the
    drafter's modules, and runs with stock kernels without one (the same tokens either way)."""
    from specheads.decoding.draft_model_drafter import DraftModelDrafter
    from specheads.decoding.generator import SpeculativeGenerator
    from specheads.heads import DraftModel
    from tests.decoding.helpers import TinyTokenizer

    draft = DraftModel.from_target(tiny_llama, 1).eval()
    drafter = DraftModelDrafter(draft, draft_length=3, min_length=3, max_length=3)
    kernels = SmallBatchLinear(rows=range(2, 65))
    entered = []

    def hook(*models):
        entered.append(models)
        return kernels(*models)

    patched = []
    layer = tiny_llama.lm_head
    handle = layer.register_forward_pre_hook(lambda module, args: patched.append("forward" in module.__dict__))
    stock = SpeculativeGenerator(tiny_llama, TinyTokenizer(), drafter).generate([1, 2, 3, 4], max_new_tokens=12)
    assert patched and not any(patched)
    patched.clear()
    swapped = SpeculativeGenerator(tiny_llama, TinyTokenizer(), drafter, kernels=hook).generate(
        [1, 2, 3, 4], max_new_tokens=12
    )
    handle.remove()
    assert entered == [(tiny_llama, draft.model)] and patched and all(patched)
    assert swapped.token_ids == stock.token_ids and "forward" not in layer.__dict__
