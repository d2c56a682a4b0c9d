"""The EAGLE drafter's decoder layer: which one it gets (the target's own class, or a Llama layer with the target's
sizes), how it is built and initialised, and which target layers the drafter's hand wiring refuses.

The drafter wires a layer's submodules itself (``EagleHead.forward``), never a copy of modeling code, so a layer
whose forward does more than that wiring reproduces is refused when the head is built. What the wiring knows is
data (the tables below); the families each drafter builds on are listed in ``docs/families.md``.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, PretrainedConfig, PreTrainedModel
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from specheads.heads.borrowed import UnsupportedTargetError, decoder_layer_parts
from specheads.heads.config import HeadConfigError, TargetRecord
from specheads.heads.eagle_config import DRAFT_LAYERS, LLAMA_LAYER, TARGET_LAYER, EagleConfig

logger = logging.getLogger(__name__)

FAMILIES_DOC = "docs/families.md"
"""The page that lists the families whose layer each EAGLE drafter wires, named by the refusals."""
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


EAGLE_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
"""What the drafter's forward calls on the target's decoder layer: pre-norm attention, then a pre-norm MLP."""
SANDWICH_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")
"""Gemma2/3's layer also norms the MLP's input and output, and ``post_attention_layernorm`` norms attention's output
(not the MLP's input): the drafter applies them as that layer's own forward does."""
RESIDUAL_MULTIPLIER = "residual_multiplier"
LAYER_SCALES = {
    RESIDUAL_MULTIPLIER: "Granite: attention and the MLP add residual_multiplier * branch",
}
"""Float attributes of a decoder layer that the drafter applies (read once when it is built), and whose they are.
Any other float on a layer is a scale its forward computes with that the hand wiring would skip, so it is refused.
Other plain attributes (ints, strings, flags such as ``training``) are bookkeeping or switches the submodules read
from the config themselves, or are refused by name (``REFUSED_SWITCHES``); refusing them all would refuse every
family on a transformers release that adds such an attribute."""
REFUSED_SWITCHES = {
    "use_parallel_residual": (
        "a parallel attention/MLP block (use_parallel_residual=True: x + attn(ln(x)) + mlp(ln(x)))"
    ),
}
"""Layer attributes that, when true, switch the layer to a block the drafter does not wire (StableLM's parallel one)."""
FULL_ATTENTION = "full_attention"
"""The ``layer_types`` entry (transformers' name) of the drafter's layer: no sliding window, and on Gemma3 the
global rotary embedding."""


@dataclass
class DraftLayer:
    """The drafter's decoder layer, its rotary embedding and how the forward calls them."""

    layer: nn.Module
    rotary: nn.Module
    rotary_args: tuple[str, ...]
    """What the rotary embedding takes after (x, positions): Gemma3's the layer type, others' nothing."""
    residual_multiplier: float
    """Granite's branch scale; 1 for every other family."""


def build_draft_layer(
    config: EagleConfig, target: PreTrainedModel, record: TargetRecord, dtype: torch.dtype
) -> DraftLayer:
    """The decoder layer ``config.draft_layer`` (resolved: ``target`` or ``llama``) names, in ``dtype``, refused
    when the drafter's wiring would get it wrong."""
    if config.draft_layer == LLAMA_LAYER:
        layer_config = llama_layer_config(config.llama_layer, record, target.config._attn_implementation)
        layer = LlamaDecoderLayer(layer_config, 0)  # torch's own init: Linear projections, unit norms
        rotary = LlamaRotaryEmbedding(config=layer_config)
    elif config.draft_layer == TARGET_LAYER:
        if config.llama_layer:
            raise HeadConfigError("llama_layer applies to draft_layer='llama'; drop it or set draft_layer: llama")
        layer, rotary = target_layer(target)
        initialise_as_the_target_does(layer, target)
    else:
        raise HeadConfigError(
            f"EagleConfig.draft_layer must be one of {DRAFT_LAYERS}, found {config.draft_layer!r}: 'target' builds "
            "the drafter's layer from the target's own class, 'llama' builds a Llama layer for any target, 'auto' "
            "(the default) picks the target's own layer when it is dense and wired, a Llama layer otherwise"
        )
    layer.to(dtype)
    rotary_args = check_drafter_layer(layer, rotary, config.version, type(target).__name__)
    return DraftLayer(layer, rotary, rotary_args, float(getattr(layer, RESIDUAL_MULTIPLIER, 1.0)))


def target_layer(target: PreTrainedModel, device: torch.device | str | None = None) -> tuple[nn.Module, nn.Module]:
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


def auto_draft_layer(target: PreTrainedModel, config: EagleConfig) -> str:
    """``draft_layer="auto"``: ``target`` when the target's own layer is dense and the drafter wires it, ``llama``
    otherwise. The target's layer is built on the meta device to look at it, so an MoE layer's experts are never
    allocated."""
    if config.llama_layer:
        return LLAMA_LAYER
    name = type(target).__name__
    try:
        layer, rotary = target_layer(target, device="meta")
    except UnsupportedTargetError as refusal:  # no `.layers` or `.rotary_emb` (GPT-2, Falcon, ...), or no full form
        problems = [str(refusal)]
    else:
        problems, _ = drafter_layer_problems(layer, rotary, config.version)
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


def initialise_as_the_target_does(layer: nn.Module, target: PreTrainedModel) -> None:
    """Transformers modules that hold parameters of their own (fused MoE experts and routers as in Qwen3-MoE,
    Mixtral and GPT-OSS, GPT-OSS's attention sinks) allocate them with ``torch.empty`` and leave them to the model's
    ``_init_weights``, which a layer built on its own never gets: without this the drafter would start from whatever
    memory held, and a drafter started from garbage does not train. Run the target family's own initialisation on
    them; torch.nn modules (the projections) initialise themselves and keep torch's defaults."""
    for module in layer.modules():
        if (
            not type(module).__module__.startswith("torch.")
            and next(module.parameters(recurse=False), None) is not None
        ):
            target._init_weights(module)


def check_drafter_layer(layer: nn.Module, rotary: nn.Module, version: int, target_name: str) -> tuple[str, ...]:
    """The drafter wires the target's decoder layer by hand: a Llama-style pre-norm block, or Gemma2/3's with its
    extra feed-forward norms. Other layers (more norms, post-norm blocks, parallel attention/MLP blocks, settings
    the wiring would not apply, rotary embeddings that need more than a layer type) or, for EAGLE-3's widened
    attention, fused q/k/v projections (Phi-3) would be silently mis-wired or crash mid-training: refuse them here.
    Returns the arguments the rotary embedding takes after (x, positions): Gemma3's the layer type, others' none."""
    problems, rotary_args = drafter_layer_problems(layer, rotary, version)
    if problems:
        eagle1 = "; so does EAGLE-1" if version == 3 and len(problems) == 1 and problems[0].startswith("fused") else ""
        raise UnsupportedTargetError(
            f"EAGLE-{version} cannot wire {target_name}'s decoder layer ({type(layer).__name__}), which has "
            f"{'; '.join(problems)}. Medusa heads and draft models work with this target{eagle1}, and so does an EAGLE "
            f"drafter with a Llama layer: {LLAMA_LAYER_HINT} (the layers each drafter wires: {FAMILIES_DOC})"
        )
    return (FULL_ATTENTION,) if rotary_args else ()


def drafter_layer_problems(layer: nn.Module, rotary: nn.Module, version: int) -> tuple[list[str], list[str]]:
    """What the EAGLE-``version`` wiring would get wrong in the layer (``check_drafter_layer``), and the arguments its
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
    problems += [block for switch, block in REFUSED_SWITCHES.items() if getattr(layer, switch, False)]
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
        if isinstance(value, float) and not name.startswith("_") and name not in LAYER_SCALES
    )
    if settings:
        problems.append(f"scales the drafter's block would not apply ({', '.join(settings)})")
    return problems
