"""A faster matrix product for the few-token forwards of speculative decoding on CPU.

Verification feeds the target a handful of tokens at once (a tree of 2-64 nodes). On CPU, ``F.linear(x, W)`` with
2-64 rows goes through a GEMM path that costs about twice a one-row forward (MKL, fp32; measured on the 2-core
machine of docs/results.md: 100 matrices 1536x576, 1 row 28 ms, 2 rows 52 ms, 8 rows 58 ms), which erases most of
what accepting several tokens per forward gains. The same product written as ``(W @ x.T).T`` takes another kernel
that stays close to the one-row cost for a few rows (22 ms, 46 ms).

``small_batch_linear(model)`` swaps that formulation into every ``nn.Linear`` of a model for the duration of a
``with`` block, for CPU float32 inputs of 2..``max_rows`` rows only. The modeling code is untouched (the instance
``forward`` is replaced and then removed again); outputs agree with ``F.linear`` to float rounding, as two GEMM
kernels do. Everything else (GPU, bf16, one row, long prefills) keeps the stock path.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

MAX_ROWS = 64
PADDED_ROWS = {3: 4}
"""Row counts computed as a larger product: MKL's kernel for 3 columns is slower than for 4 on this machine (over
60 distinct 1536x576 matrices, 2 threads: 2 rows 16.9 ms, 3 rows 24.2 ms, 4 rows 18.1 ms), so a zero row is added."""


def _linear(module: nn.Linear, x: torch.Tensor, max_rows: int) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if not 2 <= rows <= max_rows or x.device.type != "cpu" or x.dtype != torch.float32 or x.requires_grad:
        return F.linear(x, module.weight, module.bias)
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
def small_batch_linear(model: nn.Module, max_rows: int = MAX_ROWS) -> Iterator[None]:
    """Within the block, ``model``'s ``nn.Linear`` layers compute few-row CPU fp32 products as ``(W @ x.T).T``.
    Layers whose ``forward`` someone else replaced are left alone."""
    with _PATCH_LOCK:
        layers = [
            m for m in model.modules() if type(m) is nn.Linear and (m in _PATCH_USERS or "forward" not in m.__dict__)
        ]
        for layer in layers:
            if layer not in _PATCH_USERS:
                layer.forward = partial(_linear, layer, max_rows=max_rows)
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
