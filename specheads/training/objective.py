"""Objectives: the module Accelerate prepares, turning a batch and the target's features into a loss.

An objective owns the trainable parts (the head; for Medusa-2 also the target's LoRA adapters) as submodules, so
DDP/FSDP/DeepSpeed wrap exactly those. The frozen target is never a submodule: features are computed outside the
objective (online under ``no_grad``, or read from an offline cache) and passed in. Medusa-2 is the exception: its
adapted target must run with gradients, so that objective runs it itself.

``forward(batch, features, draw)``: ``draw`` is a unique index of the micro-batch over steps and ranks; objectives
that add noise seed it from ``draw``, so noise does not depend on the global RNG's history (resume-safe).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from transformers import PreTrainedModel

from specheads.heads import DraftModel, EagleHead, MedusaHeads, padding_causal_mask
from specheads.heads.borrowed import logit_transform
from specheads.training.config import ConfigError, LoraSection, LossSection
from specheads.training.losses import (
    Stats,
    TargetDistribution,
    draft_model_loss,
    eagle1_loss,
    eagle3_ttt_loss,
    lora_distill_loss,
    medusa_loss,
)


def target_distribution(features: Any) -> TargetDistribution | None:
    """The target's next-token distribution from ``TargetFeatures``: full logits, or cached top-k probabilities."""
    if getattr(features, "logits", None) is not None:
        return TargetDistribution.from_logits(features.logits)
    if getattr(features, "topk_indices", None) is not None:
        return TargetDistribution(features.topk_values.float(), features.topk_indices.long())
    return None


def hidden_states_tuple(hidden_states: dict[int, torch.Tensor]) -> list[torch.Tensor | None]:
    """``{index: (B, T, H)}`` -> the HF ``hidden_states`` layout (a list with None at unread indices)."""
    return [hidden_states.get(i) for i in range(max(hidden_states) + 1)]


def _param_dtype(module: nn.Module) -> torch.dtype:
    return next(p.dtype for p in module.parameters() if p.is_floating_point())


class MedusaObjective(nn.Module):
    """Medusa-1: frozen target, heads trained on its last hidden state (https://arxiv.org/abs/2401.10774)."""

    def __init__(self, head: MedusaHeads, loss: LossSection) -> None:
        super().__init__()
        self.head = head
        self.decay = loss.decay
        self.soft_labels = loss.medusa_labels == "soft"

    @property
    def needs_logits(self) -> bool:
        return self.soft_labels

    def forward(self, batch: dict[str, torch.Tensor], features: Any, draw: int) -> tuple[torch.Tensor, Stats]:
        hidden = features.hidden_states[self.head.layer_ids[0]].to(_param_dtype(self.head))  # (B, T, H)
        target = target_distribution(features) if self.soft_labels else None
        return medusa_loss(
            self.head.head_hidden(hidden), batch["input_ids"], batch["loss_mask"], self.decay, target, self.head.project
        )


class Medusa2Objective(nn.Module):
    """Medusa-2: heads + LoRA adapters on the target, trained jointly; the adapted target is distilled towards the
    original (adapters disabled) so that its own predictions do not drift (https://arxiv.org/abs/2401.10774)."""

    def __init__(self, head: MedusaHeads, adapted: nn.Module, loss: LossSection, lora: LoraSection) -> None:
        super().__init__()
        self.head = head
        self.adapted = adapted  # a peft model around the target; only its LoRA parameters require grad
        self.decay = loss.decay
        self.soft_labels = loss.medusa_labels == "soft"
        self.distill_weight = lora.distill_weight

    needs_logits = False
    runs_target = True

    def train(self, mode: bool = True) -> Medusa2Objective:
        """Train mode reaches the heads and the LoRA modules only: the frozen target (also the teacher of the distill
        loss) stays in eval mode, so its dropout never fires and the teacher pass is deterministic."""
        super().train(mode)
        self.adapted.eval()
        for name, module in self.adapted.named_modules():
            if name.rsplit(".", 1)[-1].startswith("lora_"):  # peft's lora_A / lora_B / lora_dropout / ...
                module.train(mode)
        return self

    def forward(self, batch: dict[str, torch.Tensor], features: Any, draw: int) -> tuple[torch.Tensor, Stats]:
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad(), self.adapted.disable_adapter():
            original = TargetDistribution.from_logits(
                self.adapted(input_ids=input_ids, attention_mask=attention_mask).logits
            )
        layer = self.head.layer_ids[0]
        out = self.adapted(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        heads_loss, stats = medusa_loss(
            self.head.head_hidden(out.hidden_states[layer]),
            input_ids,
            batch["loss_mask"],
            self.decay,
            original if self.soft_labels else None,
            self.head.project,
        )
        kl, kl_stats = lora_distill_loss(out.logits, original, attention_mask)
        return heads_loss + self.distill_weight * kl, {**stats, **kl_stats}


def anchor_offset_positions(
    batch: int, length: int, anchor_tokens: int, max_offset: int, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """(B, length) EAGLE training position ids: LongSpec's anchor-offset indices (https://arxiv.org/abs/2502.17421).
    The first ``anchor_tokens`` keep positions 0, 1, ...; every later one is shifted by one offset per sequence,
    uniform in [0, max_offset] (``max_offset`` 0: plain 0, 1, 2, ...)."""
    positions = torch.arange(length, device=device).expand(batch, length)
    if max_offset == 0:
        return positions
    offsets = torch.randint(0, max_offset + 1, (batch, 1), generator=generator).to(device)
    return torch.where(positions < anchor_tokens, positions, positions + offsets)


def training_positions(
    module: nn.Module, loss: LossSection, seed: int, draw: int, batch: int, length: int, device: torch.device
) -> torch.Tensor:
    """An EAGLE objective's position ids: anchor-offset ones (``loss.position_offset``) while training, seeded by the
    micro-batch's draw index (a resumed run draws the same offsets); plain ones in evaluation."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + draw + 1)
    max_offset = loss.position_offset if module.training else 0
    return anchor_offset_positions(batch, length, loss.anchor_tokens, max_offset, generator, device)


class Eagle1Objective(nn.Module):
    """EAGLE-1: feature regression + token CE, with optional uniform input noise (https://arxiv.org/abs/2401.15077)."""

    needs_logits = True

    def __init__(self, head: EagleHead, loss: LossSection, seed: int) -> None:
        super().__init__()
        self.head = head
        self.loss_cfg = loss
        self.seed = seed

    def forward(self, batch: dict[str, torch.Tensor], features: Any, draw: int) -> tuple[torch.Tensor, Stats]:
        fused = self.head.fuse(hidden_states_tuple(features.hidden_states)).to(_param_dtype(self.head))  # (B, T, H)
        inputs = fused[:, :-1]
        noise = self.loss_cfg.input_noise
        if self.training and noise > 0:
            # Seeded by the micro-batch's draw index, not the global RNG: a resumed run draws the same noise.
            generator = torch.Generator(device=inputs.device).manual_seed(self.seed * 1_000_003 + draw)
            uniform = torch.rand(inputs.shape, generator=generator, device=inputs.device, dtype=inputs.dtype)
            inputs = inputs + (2 * uniform - 1) * noise
        length = inputs.shape[1]
        positions = training_positions(self, self.loss_cfg, self.seed, draw, inputs.shape[0], length, inputs.device)
        mask = padding_causal_mask(batch["attention_mask"][:, :length], inputs.dtype)
        hidden, _ = self.head(inputs, batch["input_ids"][:, 1:], positions, attention_mask=mask, with_logits=False)
        target = target_distribution(features).narrow(1, length)  # the target at t+1 predicts token t+2
        valid = batch["loss_mask"][:, 1:].bool() & batch["attention_mask"][:, 1:].bool()
        # The loss reads only the valid rows: project just those through the (full-vocabulary) lm_head.
        rows = hidden[valid]  # (N, H)
        return eagle1_loss(
            rows,
            self.head.logits(rows),
            fused[:, 1:].detach()[valid],
            TargetDistribution(target.probs[valid], None if target.indices is None else target.indices[valid]),
            valid.new_ones(rows.shape[0]),
            self.loss_cfg.feature_weight,
            self.loss_cfg.token_weight,
        )


class Eagle3Objective(nn.Module):
    """EAGLE-3: training-time test over ``ttt_steps`` unrolled drafter steps (https://arxiv.org/abs/2503.01840)."""

    needs_logits = True

    def __init__(self, head: EagleHead, loss: LossSection, seed: int = 0) -> None:
        super().__init__()
        self.head = head
        self.steps = loss.ttt_steps
        self.decay = loss.decay
        self.loss_cfg, self.seed = loss, seed

    def forward(self, batch: dict[str, torch.Tensor], features: Any, draw: int) -> tuple[torch.Tensor, Stats]:
        fused = self.head.fuse(
            [None if h is None else h.to(_param_dtype(self.head)) for h in hidden_states_tuple(features.hidden_states)]
        )
        batch_size, span = batch["input_ids"].shape[0], batch["input_ids"].shape[1] - 1
        positions = training_positions(self, self.loss_cfg, self.seed, draw, batch_size, span, fused.device)
        return eagle3_ttt_loss(
            self.head,
            self.head.new_cache(),
            fused,
            batch["input_ids"],
            batch["attention_mask"],
            batch["loss_mask"],
            target_distribution(features),
            self.head.d2t,
            self.head.t2d,
            self.steps,
            self.decay,
            positions,
        )


class DraftModelObjective(nn.Module):
    """A classic small draft model (https://arxiv.org/abs/2211.17192) distilled towards the frozen target: soft
    cross-entropy against the target's next-token distribution on assistant tokens (``loss.draft_labels=soft``), or
    plain next-token CE on the data (``hard``). Every parameter of the small model trains."""

    def __init__(self, head: DraftModel, loss: LossSection) -> None:
        super().__init__()
        self.head = head
        self.soft_labels = loss.draft_labels == "soft"
        self.depth = loss.chain_depth
        self.finish = logit_transform(head.model)  # the small model's own forward applies it when it drafts

    @property
    def needs_logits(self) -> bool:
        return self.soft_labels

    def forward(self, batch: dict[str, torch.Tensor], features: Any, draw: int) -> tuple[torch.Tensor, Stats]:
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        model = self.head.model
        hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)[0]  # (B, T, H)
        valid = batch["loss_mask"][:, 1:].bool() & attention_mask[:, 1:].bool()  # position s predicts token s+1
        # Only the trained rows go through the (full-vocabulary) lm_head, then the family's finish (Gemma2's soft cap,
        # Granite's scaling), as the small model's own forward gives them when it drafts.
        logits = self.finish(model.get_output_embeddings()(hidden[:, :-1][valid]))  # (N, V)
        target = None
        if self.soft_labels:
            full = target_distribution(features).narrow(0, input_ids.shape[1] - 1)
            target = TargetDistribution(full.probs[valid], None if full.indices is None else full.indices[valid])
        return draft_model_loss(logits, valid, input_ids[:, 1:][valid], target, self.depth)


def parameter_groups(objective: nn.Module, lr: float, lora_lr: float) -> list[dict[str, Any]]:
    """Optimizer groups: the head at ``lr``; Medusa-2's target adapters (if any) at ``lora_lr``."""
    head = [p for p in objective.head.parameters() if p.requires_grad]
    groups = [{"params": head, "lr": lr}]
    adapted = getattr(objective, "adapted", None)
    if adapted is not None:
        groups.append({"params": [p for p in adapted.parameters() if p.requires_grad], "lr": lora_lr})
    return groups


def hold_adapters(scheduler: LambdaLR, hold: int, ramp: int, ticks_per_step: int = 1) -> LambdaLR:
    """Medusa-2's recipe: the heads train alone for ``hold`` optimizer steps (the adapters' learning rate is 0, so
    the target is exactly the original), then the adapters join, their learning rate rising linearly over ``ramp``
    steps on top of their schedule. Heads start from scratch, and their early loss would otherwise flow into the
    target's adapters (Cai et al. 2024, section 2.2.2). ``scheduler`` drives [head group, adapter group] and ticks
    ``ticks_per_step`` times per optimizer step (Accelerate steps a prepared scheduler once per process); the head
    group's schedule is unchanged."""
    head_lambda, adapter_lambda = scheduler.lr_lambdas
    held = partial(_held_back, base=adapter_lambda, hold=hold, ramp=max(1, ramp), ticks=ticks_per_step)
    return LambdaLR(scheduler.optimizer, [head_lambda, held])


def _held_back(tick: int, base: Callable[[int], float], hold: int, ramp: int, ticks: int) -> float:
    step = tick // ticks  # optimizer steps, whatever the number of processes
    if step < hold:
        return 0.0
    return base(tick) * min(1.0, (step - hold + 1) / ramp)


def build_objective(
    head: nn.Module, target: PreTrainedModel, loss: LossSection, lora: LoraSection, seed: int
) -> nn.Module:
    """The objective for this head type. With ``lora.enabled`` the target is wrapped in LoRA adapters (peft)."""
    if isinstance(head, MedusaHeads) and lora.enabled:
        from peft import LoraConfig, get_peft_model

        peft_config = LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules)
        )
        try:
            adapted = get_peft_model(target, peft_config)
        except ValueError as err:  # peft's "Target modules ... not found in the base model"
            linear = sorted({name.rsplit(".", 1)[-1] for name, m in target.named_modules() if isinstance(m, nn.Linear)})
            raise ConfigError(
                f"lora.target_modules={list(lora.target_modules)} names no module of {type(target).__name__} ({err}); "
                f"its Linear layers are named {linear}: set lora.target_modules to some of them (e.g. the attention "
                "projections)."
            ) from None
        return Medusa2Objective(head, adapted, loss, lora)
    if isinstance(head, MedusaHeads):
        return MedusaObjective(head, loss)
    if isinstance(head, EagleHead):
        return Eagle1Objective(head, loss, seed) if head.version == 1 else Eagle3Objective(head, loss, seed)
    if isinstance(head, DraftModel):
        return DraftModelObjective(head, loss)
    raise TypeError(f"no training objective for {type(head).__name__}; expected MedusaHeads, EagleHead or DraftModel.")
