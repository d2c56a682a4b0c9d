"""EAGLE drafters: feature-level autoregressive draft heads.

- EAGLE-1 (Li et al. 2024, https://arxiv.org/abs/2401.15077): input = fc(concat(embedding of token t+1, target
  feature at t)) -> one decoder layer -> the next feature; the target's frozen lm_head turns features into logits.
  ``input_norm=False`` drops that layer's input norm, as the reference implementation does.
- EAGLE-3 (Li et al. 2025, https://arxiv.org/abs/2503.01840): the target feature is a fusion fc(3H -> H) of a low,
  a middle and a high layer; the decoder layer attends over concat(norm(embedding), norm(feature)) (2H input);
  the drafter has its own final norm and an lm_head over a reduced draft vocabulary (``d2t`` maps draft ids to
  target ids). Trained with training-time test, so it can feed its own outputs back.

The decoder layer is an instance of the target's own decoder-layer class built from the target's config (EAGLE-3
widens q/k/v to 2H), or a Llama layer with the target's sizes (SpecForge's drafters); only the wiring of its
submodules is written here, never a copy of modeling code. By default (``draft_layer="auto"``) a dense target whose
layer the drafter wires gets its own layer, and any other target (an MoE one, or one whose layer is refused) a Llama
layer.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, PretrainedConfig, PreTrainedModel
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from specheads.heads.base import DraftHead
from specheads.heads.borrowed import UnsupportedTargetError, borrow, decoder_layer_parts
from specheads.heads.config import HeadConfig, HeadConfigError, TargetRecord, default_dtype_of
from specheads.heads.masks import causal_additive_mask

logger = logging.getLogger(__name__)

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


class EagleDrafter(DraftHead):
    head_type = "eagle"
    config_class = EagleConfig

    def __init__(self, config: EagleConfig, target: PreTrainedModel, d2t: torch.Tensor | None = None) -> None:
        super().__init__(config)
        if config.version not in (1, 3):
            raise HeadConfigError(f"EagleConfig.version must be 1 or 3, found {config.version}")
        record = TargetRecord.from_model(target)
        if not config.target.name_or_path:
            config.target = record
        if not config.layer_ids:
            n = record.num_hidden_layers
            config.layer_ids = [n] if config.version == 1 else default_eagle3_layer_ids(n)
        self._check_layer_ids(record)
        hidden, dtype = record.hidden_size, default_dtype_of(target)
        self.borrowed = borrow(target, config.layer_ids)
        if config.draft_layer == AUTO_LAYER:
            config.draft_layer = _auto_draft_layer(target, config)
        if config.draft_layer == LLAMA_LAYER:
            config.llama_layer = config.llama_layer or llama_layer_settings(target.config.get_text_config())
            layer_config = llama_layer_config(config.llama_layer, record, target.config._attn_implementation)
            self.layer = LlamaDecoderLayer(layer_config, 0)  # torch's own init: Linear projections, unit norms
            self.rotary = LlamaRotaryEmbedding(config=layer_config)
        elif config.draft_layer == TARGET_LAYER:
            if config.llama_layer:
                raise HeadConfigError("llama_layer applies to draft_layer='llama'; drop it or set draft_layer: llama")
            self.layer, self.rotary = _target_layer(target)
            _initialise_as_the_target_does(self.layer, target)
        else:
            raise HeadConfigError(
                f"EagleConfig.draft_layer must be one of {DRAFT_LAYERS}, found {config.draft_layer!r}: 'target' builds "
                "the drafter's layer from the target's own class, 'llama' builds a Llama layer for any target, 'auto' "
                "(the default) picks the target's own layer when it is dense and wired, a Llama layer otherwise"
            )
        self.layer.to(dtype)
        self.rotary_args = _check_drafter_layer(self.layer, self.rotary, config.version, type(target).__name__)
        self.residual_multiplier = float(getattr(self.layer, RESIDUAL_MULTIPLIER, 1.0))  # Granite's; others' 1
        if config.version == 1:
            if config.draft_vocab_size is not None:
                raise HeadConfigError(
                    f"draft_vocab_size={config.draft_vocab_size} applies to EAGLE-3; EAGLE-1 drafts over the target's "
                    "full vocabulary with the target's own lm_head. Drop draft_vocab_size, or use version=3 for a "
                    "reduced draft vocabulary."
                )
            self.fc = nn.Linear(2 * hidden, hidden, bias=config.fc_bias, dtype=dtype)
            if not config.input_norm:
                self.layer.input_layernorm = nn.Identity()
            return
        if not config.input_norm:
            raise HeadConfigError("input_norm=false applies to EAGLE-1; EAGLE-3's layer normalises both its inputs")
        self.fc = nn.Linear(3 * hidden, hidden, bias=False, dtype=dtype)
        self._widen_attention_inputs(2 * hidden, dtype)
        # the target's own norm (class, epsilon, initial weights) over H, as the layer's input norm is
        self.hidden_norm = copy.deepcopy(self.layer.input_layernorm)
        self.norm = copy.deepcopy(self.layer.input_layernorm)
        vocab_size = record.vocab_size
        draft_vocab = config.draft_vocab_size or vocab_size
        if draft_vocab > vocab_size:
            raise HeadConfigError(
                f"draft_vocab_size={draft_vocab} exceeds the target's vocabulary of {vocab_size} tokens; the draft "
                f"vocabulary is a subset of the target's. Set draft_vocab_size to at most {vocab_size}, or leave it "
                "unset for the full vocabulary."
            )
        config.draft_vocab_size = draft_vocab
        if d2t is None:
            if draft_vocab != vocab_size:
                raise HeadConfigError(
                    f"draft_vocab_size={draft_vocab} < target vocab {vocab_size} needs a d2t map: build one with "
                    "build_vocab_maps(token_ids, target_vocab_size, draft_vocab_size) and pass d2t=..."
                )
            d2t = torch.arange(vocab_size)
        if d2t.shape != (draft_vocab,):
            raise HeadConfigError(f"d2t must have shape ({draft_vocab},), found {tuple(d2t.shape)}")
        self.register_buffer("d2t", d2t.long().clone())
        self.register_buffer("t2d", target_to_draft(self.d2t, vocab_size))
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False, dtype=dtype)
        with torch.no_grad():  # start from the target's own output embedding for the kept tokens
            self.lm_head.weight.copy_(self.borrowed.lm_head.weight[self.d2t])

    def _check_layer_ids(self, record: TargetRecord) -> None:
        expected = 1 if self.config.version == 1 else 3
        ids = self.config.layer_ids
        if len(ids) != expected or not all(0 <= i <= record.num_hidden_layers for i in ids):
            raise HeadConfigError(
                f"EAGLE-{self.config.version} reads {expected} hidden-state indices in [0, "
                f"{record.num_hidden_layers}], found layer_ids={ids}"
            )

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
    def for_loading(cls, config: EagleConfig, target: PreTrainedModel) -> EagleDrafter:
        """An instance whose d2t is a placeholder, to be overwritten by a strict state-dict load."""
        if config.draft_layer == AUTO_LAYER:  # saved heads record their choice: this one predates the field
            config.draft_layer = TARGET_LAYER
        d2t = None
        if config.version == 3 and config.draft_vocab_size not in (None, config.target.vocab_size):
            d2t = torch.arange(config.draft_vocab_size)
        return cls(config, target, d2t=d2t)


AUTO_LAYER, TARGET_LAYER, LLAMA_LAYER = "auto", "target", "llama"
DRAFT_LAYERS = (AUTO_LAYER, TARGET_LAYER, LLAMA_LAYER)
LLAMA_LAYER_HINT = "head.options.draft_layer=llama (EagleConfig(draft_layer='llama'))"
LLAMA_LAYER_SETTINGS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_parameters",
    "max_position_embeddings",
)
"""What ``EagleConfig.llama_layer`` holds: the drafter's Llama layer's shapes, rotary and norm settings. The rest
of the layer is Llama's: SiLU MLP, no biases."""
NORM_EPSILONS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")
"""Config names families give their norms' epsilon (Llama-style, Falcon/StableLM, GPT-2/BLOOM, Nemotron-H)."""


def llama_layer_settings(text: PretrainedConfig) -> dict[str, Any]:
    """A Llama drafter layer's settings (``LLAMA_LAYER_SETTINGS``) for a target (its text config) or read off a
    Llama EAGLE checkpoint's config: the hidden, MLP and head sizes, the query and key/value heads, the rotary base
    and scaling (the full-attention layers' on a family with one set per layer type, Gemma3's; Llama's default where
    the target has none, as GPT-2; partial rotary dropped: a Llama layer rotates whole heads) and the norm epsilon."""
    hidden, heads = int(text.hidden_size), int(text.num_attention_heads)
    rope = dict(getattr(text, "rope_parameters", None) or {})
    if isinstance(rope.get(FULL_ATTENTION), dict):
        rope = dict(rope[FULL_ATTENTION])
    rope.pop("partial_rotary_factor", None)
    if rope.get("rope_type", "default") != "default" and rope.get("rope_type") not in ROPE_INIT_FUNCTIONS:
        rope = {"rope_type": "default", "rope_theta": rope.get("rope_theta", 10000.0)}
    epsilons = [getattr(text, name, None) for name in NORM_EPSILONS]
    return {
        "hidden_size": hidden,
        "intermediate_size": int(getattr(text, "intermediate_size", None) or 4 * hidden),
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(text, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(text, "head_dim", None) or hidden // heads),
        "rms_norm_eps": float(next((e for e in epsilons if isinstance(e, (int, float))), 1e-6)),
        "rope_parameters": rope if "rope_theta" in rope else {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": int(getattr(text, "max_position_embeddings", None) or 4096),
    }


def llama_layer_config(
    settings: dict[str, Any], record: TargetRecord, attn_implementation: str | None = None
) -> LlamaConfig:
    """The one-layer ``LlamaConfig`` of a Llama drafter layer with ``settings`` (``llama_layer_settings``); with an
    ``attn_implementation`` (the target's, for the drafter itself) or transformers' default (for an export)."""
    unknown, missing = (
        sorted(set(settings) - set(LLAMA_LAYER_SETTINGS)),
        sorted(set(LLAMA_LAYER_SETTINGS) - set(settings)),
    )
    if unknown or missing:
        raise HeadConfigError(
            f"EagleConfig.llama_layer: unknown keys {unknown}, missing {missing}; it holds exactly "
            f"{list(LLAMA_LAYER_SETTINGS)} (leave it empty to read them from the target)"
        )
    if settings["hidden_size"] != record.hidden_size:
        raise HeadConfigError(
            f"EagleConfig.llama_layer.hidden_size is {settings['hidden_size']}, the target's hidden size "
            f"{record.hidden_size}: the drafter's layer reads and writes the target's features"
        )
    config = LlamaConfig(
        **settings,
        vocab_size=record.vocab_size,
        num_hidden_layers=1,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    return config


def _target_layer(target: PreTrainedModel, device: torch.device | str | None = None) -> tuple[nn.Module, nn.Module]:
    """A decoder layer and rotary embedding of the target's own classes, from its config with every layer type set
    to full attention (the drafter's layer sees the whole prefix, as EAGLE's); on ``device`` (the default one)."""
    layer_cls, rotary_cls = decoder_layer_parts(target)
    layer_config = copy.deepcopy(target.config.get_text_config())
    if getattr(layer_config, "layer_types", None):
        layer_config.layer_types = [FULL_ATTENTION] * len(layer_config.layer_types)
    try:
        with torch.device(device) if device is not None else contextlib.nullcontext():
            return layer_cls(layer_config, 0), rotary_cls(config=layer_config)
    except (MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as error:  # a family whose layer has no full-attention form (DeepSeek-V4's compressed kinds)
        raise UnsupportedTargetError(
            f"{type(target).__name__}'s decoder layer ({layer_cls.__name__}) does not build as the full-attention "
            f"layer an EAGLE drafter needs ({type(error).__name__}: {error}). Medusa heads and draft models work "
            f"with this target, and so does an EAGLE drafter with a Llama layer: {LLAMA_LAYER_HINT}"
        ) from error


def _auto_draft_layer(target: PreTrainedModel, config: EagleConfig) -> str:
    """``draft_layer="auto"``: ``target`` when the target's own layer is dense and the drafter wires it, ``llama``
    otherwise. The target's layer is built on the meta device to look at it, so an MoE layer's experts are never
    allocated."""
    if config.llama_layer:
        return LLAMA_LAYER
    name = type(target).__name__
    try:
        layer, rotary = _target_layer(target, device="meta")
    except UnsupportedTargetError as refusal:  # no `.layers` or `.rotary_emb` (GPT-2, Falcon, ...), or no full form
        problems = [str(refusal)]
    else:
        problems, _ = _drafter_layer_problems(layer, rotary, config.version)
        experts = sorted({type(m).__name__ for n, m in layer.named_modules() if n.rpartition(".")[2] == "experts"})
        if experts and not problems:
            problems = [f"a mixture-of-experts layer ({', '.join(experts)}) that the drafter would copy whole"]
    if problems:
        logger.info(
            "EAGLE-%d drafter for %s: a dense Llama layer (draft_layer=auto) instead of the target's own: %s",
            config.version,
            name,
            "; ".join(problems),
        )
        return LLAMA_LAYER
    return TARGET_LAYER


def _initialise_as_the_target_does(layer: nn.Module, target: PreTrainedModel) -> None:
    """Transformers modules that hold parameters of their own (fused MoE experts and routers as in Qwen3-MoE,
    Mixtral and GPT-OSS, GPT-OSS's attention sinks) allocate them with ``torch.empty`` and leave them to the model's
    ``_init_weights``, which a layer built on its own never gets: without this the drafter would start from whatever
    memory held (GPT-OSS's drafter output ~1e29 and never trained). Run the target family's own initialisation on
    them; torch.nn modules (the projections) initialise themselves and keep torch's defaults."""
    for module in layer.modules():
        if (
            not type(module).__module__.startswith("torch.")
            and next(module.parameters(recurse=False), None) is not None
        ):
            target._init_weights(module)


def _mlp(layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The layer's MLP output; GPT-OSS's sparse MLP also returns its router scores, which its layer drops."""
    out = layer.mlp(hidden)
    return out[0] if isinstance(out, tuple) else out


def _scaled(branch: torch.Tensor, scale: float) -> torch.Tensor:
    """A residual branch times the layer's multiplier; no extra kernel in the drafter's step when it is 1."""
    return branch if scale == 1.0 else branch * scale


EAGLE_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
"""What the drafter's forward calls on the target's decoder layer: pre-norm attention, then a pre-norm MLP."""
SANDWICH_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")
"""Gemma2/3's layer also norms the MLP's input and output, and ``post_attention_layernorm`` norms attention's output
(not the MLP's input): the drafter applies them as that layer's own forward does."""
RESIDUAL_MULTIPLIER = "residual_multiplier"
"""Granite's layer adds ``residual_multiplier * branch`` (about 0.22 in real checkpoints) for attention and the MLP:
the drafter reads it once when it is built and scales both branches, as that layer's own forward does."""
PARALLEL_RESIDUAL = "use_parallel_residual"
"""StableLM's switch to a parallel block, x + attn(ln(x)) + mlp(ln(x)): the drafter wires only the sequential one."""
LAYER_SCALES_KNOWN = (RESIDUAL_MULTIPLIER,)
"""Float attributes of a decoder layer that the drafter applies. Any other float on a layer is a scale its forward
computes with (as Granite's ``residual_multiplier`` was before it was listed) that the hand wiring would skip, so it
is refused. Other plain attributes (ints, strings, flags such as ``training``) are bookkeeping or switches the
submodules read from the config themselves, or are checked by name (``use_parallel_residual``); refusing them too
would refuse every family on a transformers release that adds such an attribute."""
FULL_ATTENTION = "full_attention"
"""The ``layer_types`` entry (transformers' name) of the drafter's layer: no sliding window, and on Gemma3 the
global rotary embedding."""


def _check_drafter_layer(layer: nn.Module, rotary: nn.Module, version: int, target_name: str) -> tuple[str, ...]:
    """The drafter wires the target's decoder layer by hand: a Llama-style pre-norm block, or Gemma2/3's with its
    extra feed-forward norms. Other layers (more norms, post-norm blocks, parallel attention/MLP blocks, settings
    the wiring would not apply, rotary embeddings that need more than a layer type) or, for EAGLE-3's widened
    attention, fused q/k/v projections (Phi-3) would be silently mis-wired or crash mid-training: refuse them here.
    Returns the arguments the rotary embedding takes after (x, positions): Gemma3's the layer type, others' none."""
    problems, rotary_args = _drafter_layer_problems(layer, rotary, version)
    if problems:
        raise UnsupportedTargetError(
            f"EAGLE-{version} builds its drafter from {target_name}'s decoder layer ({type(layer).__name__}), which "
            f"has {'; '.join(problems)}. Expected a Llama-style pre-norm layer (Llama, Mistral, Qwen2/3 and their MoE, "
            "Mixtral, OLMoE, GPT-OSS, SmolLM/SmolLM3, Granite, GLM, sequential StableLM, Starcoder2, Olmo, Seed-OSS, "
            "Arcee, HunYuan, Helium, ERNIE 4.5, Nemotron, Gemma; EAGLE-1 also Phi-3, DeepSeek-V3, GLM-4.7-Flash, "
            "Persimmon) or Gemma2/3's. Medusa heads and draft models work with this target"
            + ("; so does EAGLE-1" if version == 3 and len(problems) == 1 and problems[0].startswith("fused") else "")
            + f", and so does an EAGLE drafter with a Llama layer: {LLAMA_LAYER_HINT}."
        )
    return (FULL_ATTENTION,) if rotary_args else ()


def _drafter_layer_problems(layer: nn.Module, rotary: nn.Module, version: int) -> tuple[list[str], list[str]]:
    """What the EAGLE-``version`` wiring would get wrong in the layer (``_check_drafter_layer``), and the arguments its
    rotary embedding takes after (x, positions)."""
    problems = _layer_wiring_problems(layer)
    rotary_args = [
        p.name
        for p in list(inspect.signature(rotary.forward).parameters.values())[2:]
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if rotary_args not in ([], ["layer_type"]):
        problems.append(f"a rotary embedding that also needs {rotary_args}")
    attn = getattr(layer, "self_attn", None)
    if version == 3 and attn is not None and not all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj")):
        problems.append("fused attention projections (EAGLE-3 widens separate q_proj/k_proj/v_proj)")
    return problems, rotary_args


def _layer_wiring_problems(layer: nn.Module) -> list[str]:
    """What in the layer's own forward the drafter's hand wiring would not reproduce. A part set to None counts as
    missing (StableLM's parallel block has ``post_attention_layernorm = None``). Layer-level dropout (Phi-3,
    StableLM) is allowed: it is the identity at inference, and EAGLE trains its layer without it."""
    problems = [f"no `{name}`" for name in EAGLE_LAYER_PARTS if getattr(layer, name, None) is None]
    if getattr(layer, PARALLEL_RESIDUAL, False):
        problems.append("a parallel attention/MLP block (use_parallel_residual=True: x + attn(ln(x)) + mlp(ln(x)))")
    known = EAGLE_LAYER_PARTS + (SANDWICH_NORMS if all(hasattr(layer, n) for n in SANDWICH_NORMS) else ())
    children = dict(layer.named_children())
    unused = sorted(name for name in children if name not in known and "norm" in name.lower())
    if unused:
        problems.append(f"norms the drafter's block would not apply ({', '.join(unused)})")
    uncalled = sorted(
        name
        for name, child in children.items()
        if name not in known and name not in unused and not isinstance(child, nn.Dropout)
    )
    if uncalled:
        problems.append(f"submodules the drafter's block would not call ({', '.join(uncalled)})")
    settings = sorted(
        name
        for name, value in vars(layer).items()
        if isinstance(value, float) and not name.startswith("_") and name not in LAYER_SCALES_KNOWN
    )
    if settings:
        problems.append(f"scales the drafter's block would not apply ({', '.join(settings)})")
    return problems
