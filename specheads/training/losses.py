"""Losses and acceptance statistics for Medusa, Medusa-2, EAGLE-1 and EAGLE-3 heads and small draft models.

Conventions (see ``docs/design.md``): the target's distribution at position s predicts token s+1; Medusa head k
(1-based) at position t predicts token t+k+1; an EAGLE drafter at position t reads the feature of t and token t+1 and
predicts token t+2. ``loss_mask[s] = 1`` marks assistant tokens. Medusa heads and draft models train the rows that
predict an assistant token; EAGLE rows are kept by the mask of the token they read (t+1), as in the EAGLE reference:
the row predicting the first assistant token from the prompt is skipped (decoding never drafts it, the target's
prefill makes it), and the row after the last one learns the target's own next-token distribution there.

Statistics are returned as ``Stats``: name -> ``tensor([numerator, denominator])``, so batches and ranks add up
exactly and ratios are taken once, at a loop boundary (``ratios``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

Stats = dict[str, torch.Tensor]


@dataclass
class TargetDistribution:
    """The target's next-token distribution at each position: dense ``probs (B, T, V)`` or top-k ``probs (B, T, k)``
    with ``indices (B, T, k)`` (offline caches may keep only the top-k; their probabilities need not sum to 1)."""

    probs: torch.Tensor
    indices: torch.Tensor | None = None

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> TargetDistribution:
        return cls(torch.softmax(logits.float(), dim=-1))

    def argmax(self) -> torch.Tensor:  # (B, T) token ids
        best = self.probs.argmax(dim=-1)
        return best if self.indices is None else self.indices.gather(-1, best[..., None])[..., 0]

    def narrow(self, start: int, length: int) -> TargetDistribution:
        """Positions ``start .. start+length-1`` along T."""
        return TargetDistribution(
            self.probs[:, start : start + length],
            None if self.indices is None else self.indices[:, start : start + length],
        )

    def to_draft_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> TargetDistribution:
        """Restrict to the draft vocabulary and renormalise (EAGLE-3 trains on the target's mass inside it)."""
        if self.indices is None:
            probs = self.probs[..., d2t]
            return TargetDistribution(probs / probs.sum(-1, keepdim=True).clamp_min(1e-12))
        draft_ids = t2d[self.indices]  # (B, T, k), -1 outside the draft vocabulary
        probs = torch.where(draft_ids >= 0, self.probs, torch.zeros_like(self.probs))
        return TargetDistribution(probs / probs.sum(-1, keepdim=True).clamp_min(1e-12), draft_ids.clamp_min(0))


def soft_cross_entropy(logits: torch.Tensor, target: TargetDistribution) -> torch.Tensor:
    """``-sum_v p(v) log q(v)`` per position: logits (B, T, V) of q, ``target`` p over the same positions -> (B, T)."""
    log_q = torch.log_softmax(logits.float(), dim=-1)
    if target.indices is not None:
        log_q = log_q.gather(-1, target.indices)
    return -(target.probs * log_q).sum(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def _ratio(hits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.bool()
    return torch.stack([(hits & mask).sum().float(), mask.sum().float()])


def _per_token(mean: torch.Tensor, count: torch.Tensor | int) -> torch.Tensor:
    """A loss statistic from a mean over ``count`` tokens: sums over batches and ranks give the per-token mean."""
    count = torch.as_tensor(count, dtype=torch.float32, device=mean.device)
    return torch.stack([mean.detach().float() * count, count])


def ratios(stats: Stats) -> dict[str, float]:
    """Turn accumulated ``[numerator, denominator]`` pairs into floats (a device sync: call at loop boundaries)."""
    return {name: (pair[0] / pair[1].clamp_min(1.0)).item() for name, pair in stats.items()}


def add_stats(total: Stats, new: Stats) -> Stats:
    for name, pair in new.items():
        total[name] = total[name] + pair.detach() if name in total else pair.detach().clone()
    return total


def chain_tau(acceptance: list[float]) -> float:
    """Expected tokens per verification step of a single draft chain: ``1 + sum_k prod_{i<=k} acc_i``.

    ``acceptance[i]`` is the top-1 acceptance of draft position i+1 given the earlier ones were accepted
    (approximated by its marginal accuracy); the leading 1 is the bonus token, so tau counts it.
    """
    tau, survive = 1.0, 1.0
    for acc in acceptance:
        survive *= acc
        tau += survive
    return tau


def medusa_loss(
    outputs: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    decay: float,
    target: TargetDistribution | None = None,
    project: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, Stats]:
    """Sum over heads of ``decay**(k-1) x CE(head k at t, token t+k+1)`` (https://arxiv.org/abs/2401.10774).

    ``outputs`` (K, B, T, V) logits, or (K, B, T, H) head features with ``project(k - 1, rows) -> logits`` (e.g.
    ``MedusaHeads.project``): the vocabulary projection, the costly part, then runs only on rows inside the loss
    mask. Hard labels are the data tokens; with ``target`` (the target's distribution at every position) the labels
    are soft: head k at t learns the target's distribution at t+k, which predicts t+k+1. Accuracy is measured against
    the target's greedy token when ``target`` is given (what verification accepts), otherwise against the data token.
    """
    num_heads, _, length, _ = outputs.shape
    reference = input_ids if target is None else torch.cat([input_ids[:, :1], target.argmax()[:, :-1]], dim=1)
    loss = outputs.new_zeros((), dtype=torch.float32)
    stats: Stats = {}
    for k in range(1, num_heads + 1):
        offset = k + 1  # head k at t predicts t + k + 1
        span = length - offset
        if span <= 0:
            break
        valid = loss_mask[:, offset:].bool()  # (B, span)
        rows = outputs[k - 1, :, :span][valid]  # (N, V) or (N, H)
        pred = rows if project is None else project(k - 1, rows)  # (N, V)
        if target is None:
            per_token = F.cross_entropy(pred.float(), input_ids[:, offset:][valid], reduction="none")
        else:
            step = target.narrow(k, span)
            per_token = soft_cross_entropy(
                pred, TargetDistribution(step.probs[valid], None if step.indices is None else step.indices[valid])
            )
        head_loss = per_token.mean() if len(per_token) else pred.sum() * 0.0
        loss = loss + decay ** (k - 1) * head_loss
        labels = reference[:, offset:][valid]  # (N,)
        top5 = pred.topk(min(5, pred.shape[-1]), dim=-1).indices  # (N, 5)
        count = valid.sum().float()
        stats[f"loss/head{k}"] = _per_token(head_loss, count)
        stats[f"top1/head{k}"] = torch.stack([(top5[:, 0] == labels).sum().float(), count])
        stats[f"top5/head{k}"] = torch.stack([(top5 == labels[:, None]).any(-1).sum().float(), count])
    return loss, stats


def lora_distill_loss(
    adapted_logits: torch.Tensor, original: TargetDistribution, valid: torch.Tensor
) -> tuple[torch.Tensor, Stats]:
    """Medusa-2 self-distillation: KL(original target || adapted target) per position, so adapters that help the
    heads do not change what the target says (https://arxiv.org/abs/2401.10774, section 2.3.2)."""
    cross = soft_cross_entropy(adapted_logits, original)
    entropy = -(original.probs * original.probs.clamp_min(1e-12).log()).sum(-1)
    kl = masked_mean(cross - entropy, valid)
    agree = adapted_logits.argmax(-1) == original.argmax()
    return kl, {"lora/kl": _per_token(kl, valid.sum()), "lora/top1_agree": _ratio(agree, valid)}


def eagle1_loss(
    hidden: torch.Tensor,
    logits: torch.Tensor,
    next_features: torch.Tensor,
    target: TargetDistribution,
    valid: torch.Tensor,
    feature_weight: float,
    token_weight: float,
) -> tuple[torch.Tensor, Stats]:
    """EAGLE-1 (https://arxiv.org/abs/2401.15077): SmoothL1 regression of the drafter's output feature at t to the
    target's feature at t+1, plus ``token_weight`` x CE of the drafter's distribution against the target's at t+1.

    hidden, next_features (B, L, H); logits (B, L, V); target over the same L positions; valid (B, L).
    """
    regression = masked_mean(F.smooth_l1_loss(hidden.float(), next_features.float(), reduction="none").mean(-1), valid)
    token = masked_mean(soft_cross_entropy(logits, target), valid)
    loss = feature_weight * regression + token_weight * token
    count = valid.sum()
    return loss, {
        "loss/feature": _per_token(regression, count),
        "loss/token": _per_token(token, count),
        "top1/step1": _ratio(logits.argmax(-1) == target.argmax(), valid),
    }


def draft_model_loss(
    logits: torch.Tensor,
    valid: torch.Tensor,
    labels: torch.Tensor,
    target: TargetDistribution | None,
    depth: int,
) -> tuple[torch.Tensor, Stats]:
    """A small draft model trained towards the target: soft cross-entropy against the target's next-token
    distribution (distillation, as in DistillSpec https://arxiv.org/abs/2310.08461), or plain CE on ``labels``.

    ``valid`` (B, L) marks the positions trained (assistant tokens); ``logits`` (N, V), ``labels`` (N,) and ``target``
    hold the N valid positions in row-major order. ``top1/step{k}`` (k = 1..depth) is the acceptance of a greedy
    chain's k-th guess given the first k-1 were accepted, measured teacher-forced along each sequence: a guess counts
    when it equals the target's greedy token (the data token without ``target``). On data that is the target's own
    greedy output this is exactly what chain verification accepts, so ``chain_tau`` of these is the chain's tau.
    """
    if target is None:
        per_token = F.cross_entropy(logits.float(), labels, reduction="none")
        reference = labels
    else:
        per_token = soft_cross_entropy(logits, target)
        reference = target.argmax()
    loss = per_token.mean() if len(per_token) else logits.sum() * 0.0
    top5 = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # (N, 5)
    matched = torch.zeros_like(valid, dtype=torch.bool)
    matched[valid] = top5[:, 0] == reference
    stats: Stats = {
        "loss/token": _per_token(loss, len(per_token)),
        "top5/step1": _ratio((top5 == reference[:, None]).any(-1), torch.ones_like(reference, dtype=torch.bool)),
    }
    accepted_so_far = torch.ones_like(matched)  # chains from position s whose guesses so far were all accepted
    for k in range(1, depth + 1):
        at_k = shift_left(valid.bool(), k - 1, False)  # the chain's k-th guess is a trained position
        hit_k = shift_left(matched, k - 1, False)
        stats[f"top1/step{k}"] = torch.stack(
            [(accepted_so_far & hit_k).sum().float(), (accepted_so_far & at_k).sum().float()]
        )
        accepted_so_far = accepted_so_far & hit_k
    return loss, stats


def ttt_attention_mask(attention_mask: torch.Tensor, step: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``(B, 1, L, (step+1) L)`` for training-time-test step ``step`` over the drafter's grown cache.

    The cache holds step 0's keys (the real context) followed by one block of L keys per later step. The query at
    position t attends causally to step-0 keys at positions <= t (minus padding), and to the key at the same position
    t of each step 1..step: the drafter's own earlier guesses along t's chain (https://arxiv.org/abs/2503.01840).
    """
    batch, length = attention_mask.shape
    device = attention_mask.device
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()  # (L, L) query t, key s <= t
    context = causal[None] & attention_mask.bool()[:, None, :]  # (B, L, L)
    diagonal = torch.eye(length, dtype=torch.bool, device=device).expand(batch, length, length)
    allowed = torch.cat([context] + [diagonal] * step, dim=-1)  # (B, L, (step+1) L)
    blocked = torch.finfo(dtype).min
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, blocked)[:, None]


def shift_left(x: torch.Tensor, by: int, fill: int | float = 0) -> torch.Tensor:
    """``x[:, by:]`` padded back to length T with ``fill`` (B, T, ...) -> (B, T, ...)."""
    if by == 0:
        return x
    pad = x.new_full((x.shape[0], by, *x.shape[2:]), fill)
    return torch.cat([x[:, by:], pad], dim=1)


DrafterStep = Any  # an EagleHead: forward(..., with_logits=False) -> (hidden, None) and logits(hidden)


def eagle3_ttt_loss(
    drafter: DrafterStep,
    cache: DynamicCache,
    features: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    target: TargetDistribution,
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    steps: int,
    decay: float,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """EAGLE-3 training-time test (https://arxiv.org/abs/2503.01840): unroll the drafter ``steps`` times.

    Step j at position t reads token t+1+j (id ``t+j``) and the drafter's own hidden output of step j-1 at t (the
    fused target feature at step 0), and predicts token t+2+j: soft CE against the target's distribution at t+1+j
    restricted to the draft vocabulary, weighted ``decay**j``. As in EAGLE-3, the loss counts a position only where
    the target's greedy token lies inside the draft vocabulary; the acceptance statistics ``top1/step*`` count every
    trained position, those outside as misses, since decoding can never propose them. features (B, T, H) fused;
    ``target`` the target's distribution over its full vocabulary at all T positions; ``d2t`` (Vd,) / ``t2d`` (V,)
    map draft <-> target ids. ``positions`` (B, T-1): the rows' position ids at step 0 (step j adds j); None: 0, 1, ...
    """
    batch, length = input_ids.shape
    span = length - 1  # positions t = 0 .. T-2 have a next token at step 0
    rows = torch.arange(span, device=input_ids.device).expand(batch, span)
    positions = rows if positions is None else positions
    target_draft_ids = t2d[target.argmax()]  # (B, T), -1 outside the draft vocabulary
    target = target.to_draft_vocab(d2t, t2d)
    hidden = features[:, :span]
    loss = features.new_zeros((), dtype=torch.float32)
    stats: Stats = {}
    for j in range(steps):
        ids = shift_left(input_ids, 1 + j)[:, :span]
        mask = ttt_attention_mask(attention_mask[:, :span], j, hidden.dtype)
        hidden, _ = drafter(hidden, ids, positions + j, attention_mask=mask, cache=cache, with_logits=False)
        trained = (rows + 1 + j < length) & shift_left(loss_mask, 1 + j)[:, :span].bool()
        valid = trained & (shift_left(target_draft_ids, 1 + j, fill=-1)[:, :span] >= 0)
        # The inputs are the data's tokens, not the drafter's guesses, so logits are needed only where a loss is
        # taken: the draft lm_head on the valid rows (N, Vd) instead of every (padded) position.
        logits = drafter.logits(hidden[valid])  # (N, Vd)
        step_target = TargetDistribution(
            shift_left(target.probs, 1 + j)[:, :span][valid],
            None if target.indices is None else shift_left(target.indices, 1 + j)[:, :span][valid],
        )
        step_loss = soft_cross_entropy(logits, step_target).mean() if len(logits) else logits.sum()
        loss = loss + decay**j * step_loss
        hits = logits.argmax(-1) == shift_left(target_draft_ids, 1 + j, fill=-1)[:, :span][valid]
        stats[f"loss/step{j + 1}"] = _per_token(step_loss, len(logits))
        # acceptance over every trained position: a token outside the draft vocabulary can never be proposed, so it
        # counts as a miss (only the loss leaves it out)
        stats[f"top1/step{j + 1}"] = torch.stack([hits.sum().float(), trained.sum().float()])
    return loss, stats
