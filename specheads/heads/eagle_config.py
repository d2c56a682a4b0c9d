"""What an EAGLE head is configured with: ``EagleConfig``, the EAGLE-3 feature layers and the draft vocabulary maps.

The head itself is in ``heads/eagle.py``; its decoder layer (the target's own or a Llama one) in
``heads/eagle_layer.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specheads.heads.config import HeadConfig, HeadConfigError, HeadLoadError

AUTO_LAYER, TARGET_LAYER, LLAMA_LAYER = "auto", "target", "llama"
DRAFT_LAYERS = (AUTO_LAYER, TARGET_LAYER, LLAMA_LAYER)
"""The values of ``EagleConfig.draft_layer``."""

EAGLE_TOKEN_OFFSET = 1
"""The drafter's position t reads the target feature at t and the token at t + 1, and predicts token t + 2."""


MIN_EAGLE3_TARGET_LAYERS = 4
"""The fewest target layers EAGLE-3's three features can come from: the serving engines capture the inputs of layers
1..N-1 (index 0 is the embeddings, index N the output after the final norm), and three distinct ones need N >= 4."""


def default_eagle3_layer_ids(num_hidden_layers: int) -> list[int]:
    """HF ``hidden_states`` indices of the low/mid/high features EAGLE-3 fuses: {2, N//2, N-3}, as the EAGLE-3
    reference and the engines default to, moved apart where they would meet (N < 10) so the three stay distinct,
    ascending and in [1, N - 1], the layer inputs the engines capture (each listed layer once, in ascending order).
    """
    n = num_hidden_layers
    if n < MIN_EAGLE3_TARGET_LAYERS:
        raise HeadConfigError(
            f"EAGLE-3 fuses three distinct layer inputs among 1..N-1 (what serving engines capture), so it needs a "
            f"target with at least {MIN_EAGLE3_TARGET_LAYERS} layers; this one has {n}: pass explicit layer_ids "
            f"(three distinct ascending indices in 0..{n}) for a head that is not exported, or use EAGLE-1 or Medusa"
        )
    low = min(2, n - 3)
    mid = min(max(n // 2, low + 1), n - 2)
    return [low, mid, min(max(n - 3, mid + 1), n - 1)]


def eagle3_layer_order_problem(layer_ids: Sequence[int]) -> str | None:
    """Why EAGLE-3 ``layer_ids`` would be misread by a serving engine, or None: vLLM and SGLang capture each listed
    layer once, in ascending order, and concatenate them, so ids given unsorted or repeated feed ``fc`` other
    features (or fewer) than the head was trained on."""
    ids = list(layer_ids)
    if ids == sorted(set(ids)):
        return None
    return (
        f"EAGLE-3 layer_ids {ids} are not distinct and ascending; serving engines capture each listed layer once, in "
        f"ascending order ({sorted(set(ids))}), so they would feed fc other features than the head was trained on"
    )


@dataclass
class EagleConfig(HeadConfig):
    version: int = 3
    draft_vocab_size: int | None = None
    """EAGLE-3 only: size of the reduced draft vocabulary (None = the target's full vocabulary)."""
    input_norm: bool = True
    """EAGLE-1 only: apply the decoder layer's input RMSNorm to fc's output. The EAGLE-1 reference, vLLM and SGLang
    skip it (``false``, needed by ``specheads export``); heads measured in docs/results.md kept it."""
    fc_bias: bool = True
    """EAGLE-1 only: a bias on fc, as in the reference and SGLang; vLLM's EAGLE-1 drafter has none (``false``)."""
    draft_layer: str = "auto"
    """The drafter's decoder layer. ``target``: an instance of the target's own decoder-layer class (Llama-style and
    Gemma2/3 layers; others are refused). ``llama``: a Llama layer with the target's sizes and rotary settings, as
    SpecForge and the EAGLE-3 reference give every target: it builds on any family (MoE, GPT-2, Falcon, ...), is a
    dense layer on an MoE target, and exports to vLLM and SGLang whatever the family. The same layer on Llama
    targets. ``auto`` (the default): ``target`` for a dense target whose layer the drafter wires, ``llama`` for any
    other (an MoE target, whose own layer would copy every expert; a layer ``target`` refuses). The choice is written
    back here, so a saved head records ``target`` or ``llama``; a config.json without the field loads as
    ``target``."""
    llama_layer: dict[str, Any] = field(default_factory=dict)
    """``draft_layer=llama`` only: the layer's ``LlamaConfig`` settings (``LLAMA_LAYER_SETTINGS``), read from the
    target when left empty and saved with the head."""

    def __post_init__(self) -> None:  # here, so training's config check refuses it before the target loads
        if isinstance(self.draft_vocab_size, int) and self.draft_vocab_size < 1:
            raise HeadConfigError(
                f"EagleConfig.draft_vocab_size={self.draft_vocab_size}: expected a token count >= 1, or unset for "
                "the target's full vocabulary"
            )
        if self.version == 3 and (problem := eagle3_layer_order_problem(self.layer_ids)):
            raise HeadConfigError(
                f"EagleConfig.{problem}: give three distinct indices in ascending order, e.g. "
                f"{sorted(set(self.layer_ids))} (or leave layer_ids unset for the default)"
            )

    @classmethod
    def from_saved(cls, data: dict[str, Any]) -> EagleConfig:
        """A saved head's config: one whose EAGLE-3 ids are unsorted or repeated (saved before they were checked)
        still loads, since specheads' own decoding reads them in the order saved; exporting it is refused."""
        ids = data.get("layer_ids") if isinstance(data, dict) else None
        legacy = isinstance(ids, list) and all(type(i) is int for i in ids) and data.get("version", 3) == 3
        if not legacy or not eagle3_layer_order_problem(ids):
            return cls.from_dict(data)
        config = cls.from_dict({**data, "layer_ids": []})
        config.layer_ids = list(ids)
        return config


def build_vocab_maps(
    token_ids: torch.Tensor | Sequence[Sequence[int]], target_vocab_size: int, draft_vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the ``draft_vocab_size`` most frequent target tokens of a dataset.

    Returns ``d2t`` (Vd,) target id of each draft id, sorted ascending, and ``t2d`` (V,) draft id of each target id
    or -1 when the token is outside the draft vocabulary. Ties in frequency go to the lower token id.
    """
    if not 0 < draft_vocab_size <= target_vocab_size:
        raise ValueError(f"draft_vocab_size must be in [1, {target_vocab_size}], found {draft_vocab_size}")
    if isinstance(token_ids, torch.Tensor):
        flat = token_ids.reshape(-1)
    else:
        flat = torch.tensor([t for seq in token_ids for t in seq], dtype=torch.long)
    flat = flat[(flat >= 0) & (flat < target_vocab_size)].long()
    counts = torch.bincount(flat, minlength=target_vocab_size)
    order = torch.argsort(-counts, stable=True)  # most frequent first, lower id first on ties
    d2t = order[:draft_vocab_size].sort().values
    return d2t, target_to_draft(d2t, target_vocab_size)


def target_to_draft(d2t: torch.Tensor, target_vocab_size: int) -> torch.Tensor:
    """``t2d`` for a ``d2t`` map: the draft id of each target id, -1 for tokens outside the draft vocabulary."""
    t2d = torch.full((target_vocab_size,), -1, dtype=torch.long, device=d2t.device)
    t2d[d2t] = torch.arange(d2t.numel(), device=d2t.device)
    return t2d


def check_vocab_maps(
    source: object, d2t: torch.Tensor, target_vocab_size: int, t2d: torch.Tensor | None = None
) -> None:
    """A loaded ``d2t`` names distinct target tokens and ``t2d``, when stored, is its inverse: a hand-made, edited or
    foreign map that is not would draft other tokens than the head scored (a repeated id also skews the draft
    distribution that sampled decoding corrects against, so its output would not follow the target's)."""
    if d2t.numel() and (
        int(d2t.min()) < 0 or int(d2t.max()) >= target_vocab_size or d2t.unique().numel() != d2t.numel()
    ):
        raise HeadLoadError(
            f"{source}: d2t must name {d2t.numel()} distinct target token ids in [0, {target_vocab_size}); it holds "
            f"ids from {int(d2t.min())} to {int(d2t.max())}, {d2t.unique().numel()} distinct: the map was edited or "
            "built for another target; rebuild it with build_vocab_maps for this one"
        )
    inverse = target_to_draft(d2t, target_vocab_size)
    if t2d is not None and not torch.equal(inverse, t2d):
        raise HeadLoadError(
            f"{source}: t2d is not the inverse of d2t ({int((inverse != t2d).sum())} entries differ); both are "
            "written by save_pretrained from one vocabulary map: rebuild them with build_vocab_maps"
        )
