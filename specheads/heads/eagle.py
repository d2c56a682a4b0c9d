"""EAGLE heads: feature-level autoregressive draft heads.

- EAGLE-1 (Li et al. 2024, https://arxiv.org/abs/2401.15077): input = fc(concat(embedding of token t+1, target
  feature at t)) -> one decoder layer -> the next feature; the target's frozen lm_head turns features into logits.
  ``input_norm=False`` drops that layer's input norm, as the reference implementation does.
- EAGLE-3 (Li et al. 2025, https://arxiv.org/abs/2503.01840): the target feature is a fusion fc(3H -> H) of a low,
  a middle and a high layer; the decoder layer attends over concat(norm(embedding), norm(feature)) (2H input);
  the head has its own final norm and an lm_head over a reduced draft vocabulary (``d2t`` maps draft ids to
  target ids). Trained with training-time test, so it can feed its own outputs back.

The config and vocabulary maps are in ``heads/eagle_config.py``; the decoder layer (the target's own class or a
Llama layer, and which layers are refused) in ``heads/eagle_layer.py``. Only the wiring of the layer's submodules is
written here, never a copy of modeling code.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from specheads.heads.base import DraftHead
from specheads.heads.borrowed import borrow, check_readable_hidden_states
from specheads.heads.config import HeadConfigError, TargetRecord, default_dtype_of
from specheads.heads.eagle_config import (
    AUTO_LAYER,
    LLAMA_LAYER,
    TARGET_LAYER,
    EagleConfig,
    check_vocab_maps,
    default_eagle3_layer_ids,
    target_to_draft,
)
from specheads.heads.eagle_config import EAGLE_TOKEN_OFFSET as EAGLE_TOKEN_OFFSET  # re-exported: the old path
from specheads.heads.eagle_config import build_vocab_maps as build_vocab_maps  # re-exported: the old path
from specheads.heads.eagle_layer import auto_draft_layer, build_draft_layer, llama_layer_settings
from specheads.heads.masks import causal_additive_mask

DEPRECATED_NAMES = {"EagleDrafter": "EagleHead"}
"""Old public names kept for one release; each warns with a DeprecationWarning when it is imported."""


def deprecated_name(module: str, name: str) -> str:
    """The new name of a deprecated one, after warning that it is deprecated; AttributeError for any other name."""
    if name not in DEPRECATED_NAMES:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is renamed {DEPRECATED_NAMES[name]} (a trained head; the decoding-time drafter is "
        f"specheads.decoding.EagleTreeDrafter); import {DEPRECATED_NAMES[name]}, {name} goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return DEPRECATED_NAMES[name]


def __getattr__(name: str) -> Any:
    return globals()[deprecated_name(__name__, name)]


def resolved_config(config: EagleConfig, target: PreTrainedModel, record: TargetRecord) -> EagleConfig:
    """A copy of ``config`` with what it leaves to the target filled in (the target record, the layer ids, the
    draft layer ``auto`` picks, the Llama layer's settings, the draft vocabulary size) and checked; ``config`` itself
    is left as it was given."""
    if config.version not in (1, 3):
        raise HeadConfigError(f"EagleConfig.version must be 1 or 3, found {config.version}")
    resolved = copy.deepcopy(config)
    if not resolved.target.name_or_path:
        resolved.target = record
    if not resolved.layer_ids:
        n = record.num_hidden_layers
        resolved.layer_ids = [n] if resolved.version == 1 else default_eagle3_layer_ids(n)
    _check_layer_ids(resolved, record)
    check_readable_hidden_states(target, resolved.layer_ids)  # before the layer is chosen: no layer reads these
    if resolved.draft_layer == AUTO_LAYER:
        resolved.draft_layer = auto_draft_layer(target, resolved)
    if resolved.draft_layer == LLAMA_LAYER and not resolved.llama_layer:
        resolved.llama_layer = llama_layer_settings(target.config.get_text_config())
    if resolved.version == 1:
        if resolved.draft_vocab_size is not None:
            raise HeadConfigError(
                f"draft_vocab_size={resolved.draft_vocab_size} applies to EAGLE-3; EAGLE-1 drafts over the target's "
                "full vocabulary with the target's own lm_head. Drop draft_vocab_size, or use version=3 for a "
                "reduced draft vocabulary."
            )
        return resolved
    if not resolved.input_norm:
        raise HeadConfigError("input_norm=false applies to EAGLE-1; EAGLE-3's layer normalises both its inputs")
    draft_vocab = resolved.draft_vocab_size or record.vocab_size
    if draft_vocab > record.vocab_size:
        raise HeadConfigError(
            f"draft_vocab_size={draft_vocab} exceeds the target's vocabulary of {record.vocab_size} tokens; the draft "
            f"vocabulary is a subset of the target's. Set draft_vocab_size to at most {record.vocab_size}, or leave "
            "it unset for the full vocabulary."
        )
    resolved.draft_vocab_size = draft_vocab
    return resolved


def _check_layer_ids(config: EagleConfig, record: TargetRecord) -> None:
    expected = 1 if config.version == 1 else 3
    ids = config.layer_ids
    if len(ids) != expected or not all(0 <= i <= record.num_hidden_layers for i in ids):
        raise HeadConfigError(
            f"EAGLE-{config.version} reads {expected} hidden-state indices in [0, {record.num_hidden_layers}], "
            f"found layer_ids={ids}"
        )


def checked_d2t(config: EagleConfig, vocab_size: int, d2t: torch.Tensor | None) -> torch.Tensor:
    """The head's ``d2t``: the one given, checked against the draft vocabulary, or the identity over the full one."""
    draft_vocab = config.draft_vocab_size
    if d2t is None:
        if draft_vocab != vocab_size:
            raise HeadConfigError(
                f"draft_vocab_size={draft_vocab} < target vocab {vocab_size} needs a d2t map: build one with "
                "build_vocab_maps(token_ids, target_vocab_size, draft_vocab_size) and pass d2t=..."
            )
        d2t = torch.arange(vocab_size)
    if d2t.shape != (draft_vocab,):
        raise HeadConfigError(f"d2t must have shape ({draft_vocab},), found {tuple(d2t.shape)}")
    check_vocab_maps("EagleHead(d2t=...)", d2t.long(), vocab_size)  # a repeated id would skew sampled drafting
    return d2t.long().clone()


class EagleHead(DraftHead):
    """An EAGLE-1 or EAGLE-3 head on a frozen target: ``fuse`` turns the target's hidden states into features,
    ``forward`` runs one step of its decoder layer, ``logits`` reads its draft vocabulary."""

    head_type = "eagle"
    config_class = EagleConfig

    def __init__(self, config: EagleConfig, target: PreTrainedModel, d2t: torch.Tensor | None = None) -> None:
        record = TargetRecord.from_model(target)
        config = resolved_config(config, target, record)
        super().__init__(config)
        hidden, dtype = record.hidden_size, default_dtype_of(target)
        self.borrowed = borrow(target, config.layer_ids)
        draft = build_draft_layer(config, target, record, dtype)
        self.layer, self.rotary = draft.layer, draft.rotary
        self.rotary_args, self.residual_multiplier = draft.rotary_args, draft.residual_multiplier
        if config.version == 1:
            self.fc = nn.Linear(2 * hidden, hidden, bias=config.fc_bias, dtype=dtype)
            if not config.input_norm:
                self.layer.input_layernorm = nn.Identity()
            return
        self.fc = nn.Linear(3 * hidden, hidden, bias=False, dtype=dtype)
        self._widen_attention_inputs(2 * hidden, dtype)
        # the target's own norm (class, epsilon, initial weights) over H, as the layer's input norm is
        self.hidden_norm = copy.deepcopy(self.layer.input_layernorm)
        self.norm = copy.deepcopy(self.layer.input_layernorm)
        self.register_buffer("d2t", checked_d2t(config, record.vocab_size, d2t))
        self.register_buffer("t2d", target_to_draft(self.d2t, record.vocab_size))
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False, dtype=dtype)
        with torch.no_grad():  # start from the target's own output embedding for the kept tokens
            self.lm_head.weight.copy_(self.borrowed.lm_head.weight[self.d2t])

    def _widen_attention_inputs(self, in_features: int, dtype: torch.dtype) -> None:
        """EAGLE-3's attention reads concat(embedding, feature): q/k/v take 2H inputs instead of H."""
        attn = self.layer.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            old: nn.Linear = getattr(attn, name)
            setattr(attn, name, nn.Linear(in_features, old.out_features, bias=old.bias is not None, dtype=dtype))

    @property
    def card_tags(self) -> tuple[str, ...]:
        return ("eagle", f"eagle{self.version}")

    @property
    def version(self) -> int:
        return self.config.version

    @property
    def draft_vocab_size(self) -> int:
        return self.config.draft_vocab_size or self.config.target.vocab_size

    def new_cache(self) -> DynamicCache:
        """An empty KV cache for the drafter's single decoder layer."""
        return DynamicCache()

    def fuse(self, hidden_states: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """Target ``hidden_states`` (HF indexing) -> drafter input features (B, T, H)."""
        picked = [hidden_states[i] for i in self.config.layer_ids]
        if any(h is None for h in picked):
            raise ValueError(
                f"the target forward did not return hidden states {self.config.layer_ids}; "
                "call it with output_hidden_states=head.layer_ids"
            )
        if self.version == 1:
            return picked[0]
        return self.fc(torch.cat(picked, dim=-1))  # (B, T, 3H) -> (B, T, H)

    def forward(
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
        with_logits: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One drafter step. features (B, T, H), input_ids (B, T) = token t+1 -> (hidden (B, T, H), logits (B, T, Vd)).

        ``attention_mask`` is an additive float mask (B, 1, T, past + T); None means causal over the new tokens
        plus everything already in ``cache``. ``with_logits=False`` returns ``(hidden, None)``: training computes
        ``logits(hidden[rows])`` only on the rows that carry a loss.
        """
        batch, length = input_ids.shape
        if attention_mask is None:
            past = cache.get_seq_length() if cache is not None else 0
            attention_mask = causal_additive_mask(length, past, features.dtype, features.device).expand(
                batch, 1, -1, -1
            )
        embeds = self.borrowed.embed(input_ids).to(features.dtype)  # (B, T, H), as the engines read it
        position_embeddings = self.rotary(features, position_ids, *self.rotary_args)  # Gemma3: + the layer type
        layer = self.layer
        if self.version == 1:
            residual = self.fc(torch.cat([embeds, features], dim=-1))
            attn_in = layer.input_layernorm(residual)
        else:
            residual = features
            attn_in = torch.cat([layer.input_layernorm(embeds), self.hidden_norm(features)], dim=-1)  # (B, T, 2H)
        attn_out, _ = layer.self_attn(
            hidden_states=attn_in, position_embeddings=position_embeddings, attention_mask=attention_mask, cache=cache
        )
        scale = self.residual_multiplier  # Granite scales each branch before adding it to the residual
        if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma2/3: norms after attention and on both sides of the MLP
            hidden = residual + _scaled(layer.post_attention_layernorm(attn_out), scale)
            mlp_out = layer.post_feedforward_layernorm(_mlp(layer, layer.pre_feedforward_layernorm(hidden)))
            hidden = hidden + _scaled(mlp_out, scale)
        else:  # Llama-style pre-norm block: post_attention_layernorm is the MLP's input norm
            hidden = residual + _scaled(attn_out, scale)
            hidden = hidden + _scaled(_mlp(layer, layer.post_attention_layernorm(hidden)), scale)
        return hidden, self.logits(hidden) if with_logits else None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of drafter features (B, T, H) -> (B, T, Vd)."""
        if self.version == 1:  # the target's lm_head, and its family's finish (Gemma2's soft cap, Granite's scale)
            return self.borrowed.logits(hidden)
        return self.borrowed.logits(self.norm(hidden), self.lm_head)  # its own reduced lm_head, the same finish

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.version == 1 else self.d2t[draft_ids]

    def target_to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids of target ids; -1 where the target token is outside the draft vocabulary."""
        return target_ids if self.version == 1 else self.t2d[target_ids]

    @classmethod
    def for_loading(cls, config: EagleConfig, target: PreTrainedModel) -> EagleHead:
        """An instance whose d2t is a placeholder, to be overwritten by a strict state-dict load."""
        if config.draft_layer == AUTO_LAYER:  # saved heads record their choice: one without it had the target's
            config = copy.deepcopy(config)
            config.draft_layer = TARGET_LAYER
        d2t = None
        if config.version == 3 and config.draft_vocab_size not in (None, config.target.vocab_size):
            d2t = torch.arange(config.draft_vocab_size)
        return cls(config, target, d2t=d2t)


def _mlp(layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The layer's MLP output; GPT-OSS's sparse MLP also returns its router scores, which its layer drops."""
    out = layer.mlp(hidden)
    return out[0] if isinstance(out, tuple) else out


def _scaled(branch: torch.Tensor, scale: float) -> torch.Tensor:
    """A residual branch times the layer's multiplier; no extra kernel in the drafter's step when it is 1."""
    return branch if scale == 1.0 else branch * scale
