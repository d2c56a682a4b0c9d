"""A faster matrix product for the few-token forwards of speculative decoding on CPU.

Verification feeds the target a handful of tokens at once (a tree of 2-64 nodes). On CPU, ``F.linear(x, W)`` with
2-64 rows can go through a GEMM path that costs about twice a one-row forward (MKL, fp32; docs/results.md), which
erases most of what accepting several tokens per forward gains. The same product written as ``(W @ x.T).T`` takes
another kernel that stays close to the one-row cost for a few rows.

Which kernel is faster depends on the CPU and its BLAS build (on some CPUs the swap is slower), so it is measured, not
assumed: ``faster_row_counts`` times both formulations on the model's own weights, once
per process for each set of layer shapes and thread count, and only the row counts where the swap wins use it.

``small_batch_linear(model)`` swaps that formulation into every ``nn.Linear`` of a model for the duration of a
``with`` block, for CPU float32 inputs of those row counts only. The modeling code is untouched (the instance
``forward`` is replaced and then removed again); outputs agree with ``F.linear`` to float rounding, as two GEMM
kernels do. Everything else (GPU, bf16, one row, long prefills) keeps the stock path.
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

MAX_ROWS = 64
PADDED_ROWS = {3: 4}
"""Row counts computed as a larger product: MKL's kernel for 3 columns can be slower than for 4 (docs/results.md),
so a zero row is added."""


ROW_BUCKETS = (2, 4, 8, 16, 32)
"""Row counts timed by ``faster_row_counts``; a count between two is judged by the next one up, above the last the
stock path is kept (from ~32 rows both formulations cost about the same everywhere measured)."""

SWAP_MARGIN = 0.9
"""The swapped product must take under 90% of the stock one's time to be used: a tie keeps the stock kernel."""

_MEASURED: dict[tuple, frozenset[int]] = {}  # (threads, layer shapes) -> row counts to swap, timed once per process
_MEASURE_LOCK = threading.Lock()


def faster_row_counts(model: nn.Module, max_rows: int = MAX_ROWS) -> frozenset[int]:
    """The row counts 2..``max_rows`` for which ``(W @ x.T).T`` beats ``F.linear`` on this CPU, for ``model``'s
    float32 CPU ``nn.Linear`` layers: timed on (a third of) those layers the first time a set of layer shapes is
    seen at the current thread count (~0.8 s for SmolLM2-135M on 2 cores), then remembered for the process."""
    layers = [m for m in model.modules() if type(m) is nn.Linear and _swappable(m.weight)]
    if not layers:
        return frozenset()
    key = (torch.get_num_threads(), tuple(sorted({tuple(layer.weight.shape) for layer in layers})))
    with _MEASURE_LOCK:
        if key not in _MEASURED:
            _MEASURED[key] = _time_row_buckets(layers[::3])
    return frozenset(rows for rows in _MEASURED[key] if rows <= max_rows)


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
    previous = dict(zip(ROW_BUCKETS, (1, *ROW_BUCKETS)))
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


_PATCH_LOCK = threading.Lock()
_PATCH_USERS: weakref.WeakKeyDictionary[nn.Linear, int] = weakref.WeakKeyDictionary()
"""How many open ``small_batch_linear`` blocks use each patched layer: overlapping blocks (threads sharing a
target, or a drafter that shares layers with it) patch a layer once and the last one out restores it."""


@contextlib.contextmanager
def small_batch_linear(model: nn.Module, max_rows: int = MAX_ROWS, rows: Iterable[int] | None = None) -> Iterator[None]:
    """Within the block, ``model``'s ``nn.Linear`` layers compute CPU fp32 products of ``rows`` rows (default: the
    counts up to ``max_rows`` that ``faster_row_counts`` measured faster here) as ``(W @ x.T).T``. Layers whose
    ``forward`` someone else replaced are left alone; where no row count is faster, nothing is patched."""
    rows_to_swap = faster_row_counts(model, max_rows) if rows is None else frozenset(rows) - {0, 1}
    if not rows_to_swap:
        yield
        return
    with _PATCH_LOCK:
        layers = [
            m for m in model.modules() if type(m) is nn.Linear and (m in _PATCH_USERS or "forward" not in m.__dict__)
        ]
        for layer in layers:
            if layer not in _PATCH_USERS:
                layer.forward = partial(_linear, layer, rows_to_swap=rows_to_swap)
            _PATCH_USERS[layer] = _PATCH_USERS.get(layer, 0) + 1
    try:
        yield
    finally:
        with _PATCH_LOCK:
            for layer in layers:
                _PATCH_USERS[layer] -= 1
                if not _PATCH_USERS[layer]:
                    del _PATCH_USERS[layer]
                    del layer.forward
