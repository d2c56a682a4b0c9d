"""A faster matrix product for the few-token forwards of speculative decoding on CPU.

Verification feeds the target a handful of tokens at once (a tree of 2-64 nodes). On some CPUs, ``F.linear(x, W)``
with 2-64 rows goes through a GEMM path that costs about twice a one-row forward, which erases most of what
accepting several tokens per forward gains; the same product written as ``(W @ x.T).T`` takes another kernel that
stays close to the one-row cost. On some CPUs the one-row product itself (a matrix-vector kernel) is slower than the
same product padded to two rows, which would handicap plain decoding (``generate`` included) against every
multi-token method; so one row is a candidate too, computed as two. On other CPUs the swap is slower (docs/results.md
has both), so it is measured, not assumed: ``SmallBatchLinear`` times both formulations on the model's own weights,
once per set of layer shapes and thread count, and only the row counts where the swap wins use it.

The caller opts in: ``SmallBatchLinear()`` is the ``kernels`` hook ``SpeculativeGenerator`` takes (and a context
of its own, ``with kernels(model): ...``). Within the block it swaps that formulation into every ``nn.Linear`` of
the models given, for CPU float32 inputs of those row counts only. The modeling code is untouched (the instance
``forward`` is replaced and then removed again); outputs agree with ``F.linear`` to float rounding, as two GEMM
kernels do. Everything else (GPU, bf16, long prefills, gradients) keeps the stock path.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from specheads.decoding.tuning.cpu_attention import masked_gqa_attention

MAX_ROWS = 64
PADDED_ROWS = {1: 2, 3: 4}
"""Row counts computed as a larger product, zero rows added: MKL's kernel for 3 columns is slower than for 4 (over 60
distinct 1536x576 matrices, 2 threads: 2 rows 16.9 ms, 3 rows 24.2 ms, 4 rows 18.1 ms), and one column takes the
matrix-vector kernel, slower than two on some CPUs (docs/results.md, "One-row products")."""

ROW_BUCKETS = (1, 2, 4, 8, 16, 32)
"""Row counts timed by ``faster_row_counts``; a count between two is judged by the next one up, above the last the
stock path is kept (from ~32 rows both formulations cost about the same everywhere measured)."""

SWAP_MARGIN = 0.9
"""The swapped product must take under 90% of the stock one's time to be used: a tie keeps the stock kernel."""


def faster_row_counts(model: nn.Module, max_rows: int = MAX_ROWS) -> frozenset[int]:
    """The row counts 1..``max_rows`` for which ``(W @ x.T).T`` beats ``F.linear`` on this CPU for ``model``'s float32
    CPU ``nn.Linear`` layers, timed now on a third of them (``SmallBatchLinear`` remembers what it measured)."""
    layers = _swappable_layers(model)
    return frozenset(r for r in _time_row_buckets(layers[::3]) if r <= max_rows) if layers else frozenset()


def _swappable_layers(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if type(m) is nn.Linear and _swappable(m.weight)]


def _swappable(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32


@torch.no_grad()
def _time_row_buckets(layers: list[nn.Linear], repeats: int = 2) -> frozenset[int]:
    """Time one pass over ``layers`` per bucket with each formulation (a warm-up, then the fastest of ``repeats``;
    the weights, over 100 MB for a real target, come from memory as in a forward), and expand the winning buckets
    to the row counts they judge."""
    generator = torch.Generator().manual_seed(0)
    inputs = {rows: [torch.randn(rows, m.in_features, generator=generator) for m in layers] for rows in ROW_BUCKETS}
    best = {(rows, swap): float("inf") for rows in ROW_BUCKETS for swap in (False, True)}
    for attempt in range(repeats + 1):
        for rows, swap in best:
            start = time.perf_counter()
            for layer, x in zip(layers, inputs[rows]):
                _swapped(layer, x) if swap else F.linear(x, layer.weight, layer.bias)
            if attempt:
                best[rows, swap] = min(best[rows, swap], time.perf_counter() - start)
    winners = [rows for rows in ROW_BUCKETS if best[rows, True] < SWAP_MARGIN * best[rows, False]]
    previous = dict(zip(ROW_BUCKETS, (0, *ROW_BUCKETS)))
    return frozenset(n for rows in winners for n in range(previous[rows] + 1, rows + 1))


def _linear(module: nn.Linear, x: torch.Tensor, rows_to_swap: frozenset[int]) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if rows not in rows_to_swap or x.device.type != "cpu" or x.dtype != torch.float32 or x.requires_grad:
        return F.linear(x, module.weight, module.bias)
    return _swapped(module, x)


def _swapped(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, W, b)`` computed as ``(W @ x.T).T``, row-major."""
    rows = x.numel() // x.shape[-1]
    flat = x.reshape(rows, x.shape[-1])
    if rows in PADDED_ROWS:
        flat = torch.cat([flat, flat.new_zeros(PADDED_ROWS[rows] - rows, flat.shape[1])])
    # (rows, out), made row-major: a transposed view would send the next product down MKL's slow path for a
    # column-major operand and make SDPA's flash kernel refuse q/k/v whose last dimension is strided.
    out = torch.mm(module.weight, flat.t())[:, :rows].t().contiguous()
    if module.bias is not None:
        out = out + module.bias
    return out.reshape(*x.shape[:-1], module.out_features)


class SmallBatchLinear:
    """The CPU kernel choice for few-row products: measured by this object once per thread count and set of layer
    shapes (~1 s for a 135M target on 2 cores), applied to the models given for the duration of a ``with`` block.

    ``rows`` fixes the swapped row counts instead of measuring them. Blocks of one object may overlap (threads
    sharing a target, a drafter sharing layers with it): a layer is patched once and the last block out restores it.
    Layers whose ``forward`` someone else replaced are left alone; where no row count is faster nothing is patched.
    """

    def __init__(self, max_rows: int = MAX_ROWS, rows: Iterable[int] | None = None) -> None:
        self.max_rows = max_rows
        self.rows = None if rows is None else frozenset(rows) - {0}
        self._measured: dict[tuple, frozenset[int]] = {}  # (threads, layer shapes) -> row counts to swap
        self._users: weakref.WeakKeyDictionary[nn.Linear, int] = weakref.WeakKeyDictionary()  # open blocks per layer
        self._lock = threading.Lock()

    def faster_row_counts(self, model: nn.Module) -> frozenset[int]:
        """The row counts this object swaps for ``model``: the fixed ``rows``, else measured on first use."""
        if self.rows is not None:
            return self.rows
        layers = _swappable_layers(model)
        if not layers:
            return frozenset()
        key = (torch.get_num_threads(), tuple(sorted({tuple(layer.weight.shape) for layer in layers})))
        with self._lock:
            if key not in self._measured:
                self._measured[key] = _time_row_buckets(layers[::3])
        return frozenset(rows for rows in self._measured[key] if rows <= self.max_rows)

    @contextlib.contextmanager
    def __call__(self, *models: nn.Module) -> Iterator[None]:
        """Within the block, each model's layers compute CPU fp32 products of its faster row counts as (W @ x.T).T."""
        patched: list[nn.Linear] = []
        try:
            for model in models:
                rows_to_swap = self.faster_row_counts(model)
                if rows_to_swap:
                    patched += self._patch(model, rows_to_swap)
            yield
        finally:
            with self._lock:
                for layer in patched:
                    self._users[layer] -= 1
                    if not self._users[layer]:
                        del self._users[layer]
                        del layer.forward

    def _patch(self, model: nn.Module, rows_to_swap: frozenset[int]) -> list[nn.Linear]:
        with self._lock:
            layers = [
                m for m in model.modules() if type(m) is nn.Linear and (m in self._users or "forward" not in m.__dict__)
            ]
            for layer in layers:
                if layer not in self._users:
                    layer.forward = partial(_linear, layer, rows_to_swap=rows_to_swap)
                self._users[layer] = self._users.get(layer, 0) + 1
        return layers


class CpuKernels(SmallBatchLinear):
    """The CPU kernels ``specheads generate`` and ``bench`` decode with: the few-row products of ``SmallBatchLinear``
    and, for masked few-token forwards, grouped-query attention that does not copy the KV cache
    (``specheads.decoding.tuning.cpu_attention``)."""

    @contextlib.contextmanager
    def __call__(self, *models: nn.Module) -> Iterator[None]:
        with super().__call__(*models), masked_gqa_attention(*models):
            yield


def small_batch_linear(
    model: nn.Module, max_rows: int = MAX_ROWS, rows: Iterable[int] | None = None
) -> contextlib.AbstractContextManager[None]:
    """``SmallBatchLinear(max_rows, rows)(model)``: one model, with a choice measured for this block alone."""
    return SmallBatchLinear(max_rows, rows)(model)
