"""From a saved head and a tree setting to a drafter the speculative generator can use.

Tree settings (``--tree``): ``auto``, where the cost model picks size and depth for this device from a short
calibration (``decoding.cost_model``), or any setting ``specheads generate --tree`` takes (``chain:D``,
``dynamic:D,K,N`` for EAGLE, a tree file or name under ``configs/trees/`` for Medusa), built by the same function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.decoding.cost_model import (
    CalibrationStep,
    CostCurve,
    DraftCost,
    RecordingDrafter,
    TreeChoice,
    choose_lookup_solo,
    choose_tree,
)
from specheads.decoding.draft import MedusaDrafter, PromptLookupDrafter
from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.factory import build_drafter
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.lookup_branch import DEFAULT_LOOKUP_MIN_NGRAM, LOOKUP_MAX_NGRAM, LookupBranchDrafter
from specheads.decoding.model_draft import DraftModelDrafter
from specheads.decoding.tree import DynamicTreeConfig, static_tree

CALIBRATION_WIDTH = 4  # guesses per depth tried during calibration (ranks beyond are assumed never accepted)
CALIBRATION_EAGLE_DEPTH = 6
CALIBRATION_CHAIN_DEPTH = 8


@dataclass
class Calibration:
    """What ``auto`` measured, kept to price a lookup branch on the chosen tree (``with_lookup_branch``)."""

    sequences: list[torch.Tensor]  # each calibration prompt with its greedy output
    steps: list[list[CalibrationStep]]
    curve: CostCurve
    draft_cost: DraftCost
    overhead_s: float


@dataclass
class DrafterSpec:
    """A built drafter and how its tree was chosen (for the report)."""

    drafter: Any
    tree: str  # human-readable tree description
    auto: TreeChoice | None = None
    calibration: Calibration | None = None


def fixed_drafter(head: Any, tree: str) -> DrafterSpec:
    """A drafter for ``head`` with a fixed (not ``auto``) tree setting, as ``specheads generate --tree`` builds it."""
    return DrafterSpec(build_drafter(head, tree), tree)


def calibration_drafter(head: Any) -> tuple[Any, int]:
    """A wide drafter that tries several guesses per depth, and the depth it drafts to."""
    kind = head.head_type
    if kind == "medusa":
        depth = head.num_heads
        choices = [[0] * (d - 1) + [r] for d in range(1, depth + 1) for r in range(CALIBRATION_WIDTH)]
        return MedusaDrafter(head, static_tree(choices)), depth
    if kind == "eagle":
        depth = CALIBRATION_EAGLE_DEPTH
        return EagleTreeDrafter(head, DynamicTreeConfig(depth, CALIBRATION_WIDTH, depth * CALIBRATION_WIDTH)), depth
    depth = CALIBRATION_CHAIN_DEPTH
    return DraftModelDrafter(head, depth, min_length=depth, max_length=depth), depth


def auto_drafter(
    head: Any,
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    curve: CostCurve,
    prompts: list[torch.Tensor],
    max_new_tokens: int = 32,
) -> DrafterSpec:
    """Calibrate the head's per-(depth, rank) acceptance on ``prompts`` (greedy), then let the cost model choose."""
    wide, depth = calibration_drafter(head)
    recorder = RecordingDrafter(wide)
    generator = SpeculativeGenerator(target, tokenizer, drafter=recorder, acceptance="greedy")
    draft_s = overhead_s = 0.0
    steps = 0
    sequences = []
    for prompt in prompts:
        result = generator.generate(prompt, max_new_tokens=max_new_tokens)
        stats = result.stats
        sequences.append(torch.cat([prompt.view(-1).cpu(), torch.tensor(result.token_ids, dtype=torch.long)]))
        draft_s += stats.draft_s
        overhead_s += max(stats.bookkeeping_s - curve.at(prompt.numel()), 0.0)  # the prefill is not per-step work
        steps += len(stats.accepted_lengths)
    per_step = draft_s / max(steps, 1)
    draft_cost = DraftCost(fixed_s=per_step) if head.head_type == "medusa" else DraftCost(per_depth_s=per_step / depth)
    max_nodes = 63 if head.head_type != "draft_model" else CALIBRATION_CHAIN_DEPTH
    overhead = overhead_s / max(steps, 1)
    choice = choose_tree(recorder.acceptance(), curve.at, draft_cost, overhead, max_nodes)
    note = "" if choice.num_nodes else " (drafting does not pay here: plain decoding, the head is not used)"
    calibration = Calibration(sequences, recorder.steps, curve, draft_cost, overhead)
    return DrafterSpec(_drafter_for_choice(head, choice), f"auto: {choice.describe()}{note}", choice, calibration)


def _drafter_for_choice(head: Any, choice: TreeChoice) -> Any:
    """The drafter for a chosen tree; None (plain decoding) when the cost model found that no guess pays."""
    choices = choice.choices
    if not choices:
        return None
    depth = max(len(c) for c in choices)
    if head.head_type == "medusa":
        return MedusaDrafter(head, static_tree(choices))
    if head.head_type == "eagle":
        return EagleTreeDrafter(head, DynamicTreeConfig(depth, choice.top_k, len(choices)))
    return DraftModelDrafter(head, depth, min_length=depth, max_length=depth)


def prompt_lookup_drafter(num_tokens: int = 10) -> DrafterSpec:
    return DrafterSpec(PromptLookupDrafter(num_tokens), f"chain of up to {num_tokens} (n-gram lookup)")


def with_lookup_branch(spec: DrafterSpec, num_tokens: int, solo_ngram: int | str | None = None) -> DrafterSpec:
    """``spec``'s drafter with up to ``num_tokens`` prompt-lookup tokens grafted onto its tree; where the head
    drafts nothing (``auto`` chose plain decoding) the lookup chain alone, with the branch's n-gram settings.
    ``solo_ngram``: on steps whose lookup match is at least that long, the lookup chain alone (the head sits out);
    ``"auto"``: the length the cost model prices best on the ``auto`` tree's calibration (``choose_lookup_solo``)."""
    if num_tokens < 1:
        raise ValueError(f"a lookup branch needs num_tokens >= 1, got {num_tokens}")
    branch = f" + lookup branch (up to {num_tokens} tokens, n-gram >= {DEFAULT_LOOKUP_MIN_NGRAM}"
    if spec.drafter is None:
        drafter = PromptLookupDrafter(num_tokens, min_ngram=DEFAULT_LOOKUP_MIN_NGRAM, max_ngram=LOOKUP_MAX_NGRAM)
        return DrafterSpec(drafter, f"no head tree{branch})", spec.auto)
    narrow = "; where it proposes, only the head's first-choice path beside it"
    solo = "" if solo_ngram is None else f"; alone, without the head, on {solo_ngram}-gram or longer matches"
    if solo_ngram == "auto":
        if spec.auto is None or spec.calibration is None:
            raise ValueError(
                f"an automatic solo length is priced from the auto tree's calibration, but this head's tree is fixed "
                f"({spec.tree}); use --tree auto, or give the length (2 or 3)"
            )
        cal = spec.calibration
        priced = choose_lookup_solo(
            cal.sequences,
            cal.steps,
            spec.auto,
            cal.curve.at,
            cal.draft_cost,
            cal.overhead_s,
            num_tokens,
            DEFAULT_LOOKUP_MIN_NGRAM,
            LOOKUP_MAX_NGRAM,
        )
        solo_ngram, solo = priced.solo_ngram, f"; auto: {priced.describe()}"
    elif isinstance(solo_ngram, str):
        raise ValueError(f"solo_ngram must be None, an n-gram length or 'auto', got {solo_ngram!r}")
    drafter = LookupBranchDrafter(spec.drafter, num_tokens, max_ngram=LOOKUP_MAX_NGRAM, solo_ngram=solo_ngram)
    return DrafterSpec(drafter, f"{spec.tree}{branch}{narrow}{solo})", spec.auto, spec.calibration)
