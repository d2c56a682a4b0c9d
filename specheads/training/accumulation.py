"""Gradient accumulation weighted by tokens: each assistant token of an optimizer step counts alike, whichever
micro-batch or process it sits in.

An objective returns the mean loss over its micro-batch's tokens. Averaging those means over the ``A`` micro-batches of
a step (what ``accelerator.backward`` does) and over the ``W`` processes (DDP, FSDP and DeepSpeed average gradients)
gives the tokens of a short micro-batch more weight than those of a long one, and makes the update depend on how a
step's samples are split. Scaling micro-batch m's loss by ``n_m * A * W / N`` (``n_m`` its loss tokens, ``N`` those of
the whole step over every micro-batch and process) undoes both averages: the step's gradient is that of the mean
over all ``N`` tokens, as one large batch gives. This is transformers' Trainer fix of 2024 (``num_items_in_batch``,
https://huggingface.co/blog/gradient_accumulation).

The weights are exact for losses that average over the loss tokens (EAGLE-1, the draft model). Medusa head k averages
over the tokens k+1 positions on, and EAGLE-3's training-time steps over shifted tokens inside the draft vocabulary;
for those the micro-batch's loss-token count is a close proxy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any, TypeVar

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

Batch = TypeVar("Batch")


def micro_batches(accelerator: Accelerator, loader: DataLoader, consumed: int) -> Iterator[Any]:
    """The training loader's micro-batches, epoch after epoch without end, from the ``consumed``-th on. Each epoch's
    order is a function of (seed, epoch) (``set_epoch``), so a resumed run reads what an uninterrupted one would."""
    epoch, skip = divmod(consumed, len(loader))
    while True:
        loader.set_epoch(epoch)
        yield from accelerator.skip_first_batches(loader, skip) if skip else loader
        skip = 0
        epoch += 1


def accumulation_rounds(batches: Iterable[Batch], size: int) -> Iterator[list[Batch]]:
    """Consecutive groups of ``size`` micro-batches: the ones one optimizer step accumulates (a step may span an
    epoch's end, as Accelerate's ``sync_with_dataloader=False`` counts them)."""
    batches = iter(batches)
    while group := list(islice(batches, size)):
        yield group


def batch_rows(batch: Any) -> dict[str, torch.Tensor]:
    """A collated batch's token rows (``input_ids``, masks): offline batches are ``(rows, features)`` pairs."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def loss_tokens(batch: Any) -> torch.Tensor:
    """Tokens that carry a loss in a collated batch: a float scalar."""
    return batch_rows(batch)["loss_mask"].sum().float()


def token_weights(
    accelerator: Accelerator, group: list[Any], grad_accum: int, by_tokens: bool = True
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(weight, tokens)`` for each micro-batch of one step: its loss's factor ``n_m * A * W / N`` and its token count
    ``n_m``. ``N`` is summed over every process (one all-reduce per step); a step without loss tokens weighs 0.
    ``by_tokens=False`` weighs every micro-batch 1 (each one's mean counts alike, as the EAGLE reference trainer and
    SpecForge do)."""
    tokens = [loss_tokens(batch).to(accelerator.device) for batch in group]
    if not by_tokens:
        return [(torch.ones_like(n), n) for n in tokens]
    total = accelerator.reduce(torch.stack(tokens).sum(), reduction="sum")  # N, every process's micro-batches
    total = total.clamp_min(1.0)
    return [(n * (grad_accum * accelerator.num_processes) / total, n) for n in tokens]  # exactly 1 when n = N
