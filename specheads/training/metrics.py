"""What a training run measures: held-out statistics (reduced over ranks, with the simulated chain tau), throughput
and a fingerprint of the trained weights."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import torch
from accelerate import Accelerator

from specheads.training.accumulation import batch_rows, loss_tokens
from specheads.training.config import LoraSection, LossSection
from specheads.training.features import FeatureSource
from specheads.training.losses import Stats, add_stats, chain_tau, ratios
from specheads.training.objective import build_objective


class Throughput:
    """Training throughput in target tokens (non-padding positions) per second, summed over ranks.

    Tokens are counted as tensors and only read at log boundaries; eval and checkpoint time is excluded.
    """

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        self.tokens = torch.zeros((), dtype=torch.float64, device=accelerator.device)
        self.start = time.perf_counter()
        self.total_tokens = 0.0
        self.total_seconds = 0.0

    def count(self, batch: Any) -> None:
        self.tokens += batch_rows(batch)["attention_mask"].sum()

    def window_rate(self) -> float:
        seconds = time.perf_counter() - self.start
        tokens = self.accelerator.reduce(self.tokens.clone(), reduction="sum").item()
        self.total_tokens += tokens
        self.total_seconds += seconds
        self.tokens.zero_()
        self.start = time.perf_counter()
        return tokens / max(seconds, 1e-9)

    def overall_rate(self) -> float:
        return self.total_tokens / max(self.total_seconds, 1e-9)

    @contextlib.contextmanager
    def paused(self):
        stopped = time.perf_counter()
        yield
        self.start += time.perf_counter() - stopped


def weights_checksum(module: torch.nn.Module) -> float:
    """A cheap fingerprint of the trainable weights (sum and sum of squares in float64). Call it on every rank:
    FSDP2 parameters are sharded DTensors, gathered here (a collective)."""
    total = 0.0
    for param in module.parameters():
        if param.requires_grad:
            data = param.detach()
            if hasattr(data, "full_tensor"):
                data = data.full_tensor()
            data = data.double()
            total += data.sum().item() + 0.5 * data.square().sum().item()
    return total


def chain_acceptance(metrics: dict[str, float], prefix: str) -> list[float]:
    """Top-1 acceptance per draft position (Medusa head k / EAGLE step k), in chain order."""
    for kind in ("head", "step"):
        found = []
        while f"{prefix}top1/{kind}{len(found) + 1}" in metrics:
            found.append(metrics[f"{prefix}top1/{kind}{len(found) + 1}"])
        if found:
            return found
    return []


def reduce_stats(accelerator: Accelerator, stats: Stats) -> dict[str, float]:
    """Sum ``[numerator, denominator]`` pairs over ranks (same key order everywhere), then take ratios."""
    if not stats:
        return {}
    names = sorted(stats)
    stacked = accelerator.reduce(torch.stack([stats[n] for n in names]).to(accelerator.device), reduction="sum")
    return ratios(dict(zip(names, stacked)))


def with_tau(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    acceptance = chain_acceptance(metrics, prefix)
    return {**metrics, f"{prefix}tau": chain_tau(acceptance)} if acceptance else metrics


def evaluate(accelerator, objective, loader, features: FeatureSource, max_batches: int | None):
    """Held-out per-head/per-step accuracy, loss, and the simulated chain tau. ``max_batches`` counts batches of
    all processes together (each evaluates its share, rounded up)."""
    objective.eval()
    totals: Stats = {}
    per_process = None if max_batches is None else math.ceil(max_batches / accelerator.num_processes)
    with torch.no_grad():
        for index, batch in enumerate(loader):
            if per_process is not None and index >= per_process:
                break
            rows = batch_rows(batch)
            repeated = repeated_eval_rows(accelerator, rows["loss_mask"].shape[0])
            rows["loss_mask"][rows["loss_mask"].shape[0] - repeated :] = 0  # in no loss and no statistic
            loss, stats = objective(*features(batch), 0)  # every process runs it: ZeRO-3/FSDP gather weights
            tokens = loss_tokens(rows).to(loss.device)
            stats["loss"] = torch.stack([loss.detach().float() * tokens, tokens])  # per token, as training weighs it
            if repeated == rows["loss_mask"].shape[0]:  # nothing real here; same keys on every rank for the reduce
                stats = {name: torch.zeros_like(value) for name, value in stats.items()}
            add_stats(totals, stats)
    objective.train()
    metrics = {f"eval/{k}": v for k, v in reduce_stats(accelerator, totals).items()}
    return with_tau(metrics, "eval/")


def repeated_eval_rows(accelerator: Accelerator, rows: int) -> int:
    """How many trailing rows of this process's eval batch repeat samples already evaluated. With several processes
    Accelerate completes the last round of batches with samples from the start of the split (``even_batches``, so
    that every process runs each forward); its ``gradient_state.remainder`` says how many rows of that global batch
    (this process's rows sit at ``process_index * rows``) are real, as ``gather_for_metrics`` reads it."""
    state = accelerator.gradient_state
    if accelerator.num_processes == 1 or not state.end_of_dataloader or state.remainder <= 0:
        return 0
    return rows - min(rows, max(0, state.remainder - accelerator.process_index * rows))


def bar_fields(metrics: dict[str, float]) -> dict[str, str]:
    fields = {"tau": metrics.get("eval/tau"), "acc1": metrics.get("eval/top1/head1", metrics.get("eval/top1/step1"))}
    return {k: f"{v:.3f}" for k, v in fields.items() if v is not None and not math.isnan(v)}


def teacher_forced_acceptance(head, target, loader, depths: int) -> dict[str, float]:
    """A head's acceptance at depths 1..``depths`` on a loader's loss positions, teacher-forced against the target's
    own next-token choice (the training-time test's ``top1/step d``), and the chain tau it implies."""
    objective = build_objective(head, target, LossSection(ttt_steps=depths), LoraSection(), 0)
    features = FeatureSource(target, head.layer_ids, with_logits=objective.needs_logits)
    metrics = evaluate(Accelerator(cpu=True), objective, loader, features, None)
    return {f"depth{d}": metrics[f"eval/top1/step{d}"] for d in range(1, depths + 1)} | {"tau": metrics["eval/tau"]}
