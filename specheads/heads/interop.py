"""Serving-engine formats: export trained heads to the checkpoints vLLM and SGLang load (EAGLE-3 checkpoints in
that format, by SpecForge or the EAGLE authors, load back as specheads heads: ``heads/eagle3_checkpoint.py``).

- **EAGLE-3** -> the Llama EAGLE-3 draft checkpoint that SpecForge writes and both engines read (vLLM
  ``Eagle3LlamaForCausalLM``, SGLang ``LlamaForCausalLMEagle3``): ``config.json`` is a ``LlamaConfig`` with one
  hidden layer, ``draft_vocab_size`` and untied embeddings; the weights are ``midlayer.*`` (the decoder layer, its
  ``hidden_norm`` included), ``fc``, ``norm``, ``lm_head``, ``d2t`` as offsets (target id = draft id + ``d2t[id]``)
  and ``t2d`` as a boolean mask over the target vocabulary. The embedding is left out: both engines then share the
  target's, which is what the head was trained with.
- **Medusa** -> vLLM's ``MedusaModel`` checkpoint: ``blocks.{k}.layers.{l}`` residual blocks and ``lm_heads.{k}``
  (with ``original_lm_head`` and the target's matrix as ``lm_heads.0`` when the heads share it).
- **Draft model** -> a plain transformers model folder with the tokenizer: every engine's draft-model mode and
  transformers' ``assistant_model=`` load it.
- **EAGLE-1** -> the EAGLE authors' layout both engines read (a one-layer Llama config, ``architectures``
  ``LlamaForCausalLM`` for vLLM and ``LlamaForCausalLMEagle`` for SGLang; ``layers.0.*`` without an input norm,
  ``fc``; embedding and lm_head shared with the target). The engines' drafter
  has no input norm on its layer (``EagleConfig(input_norm=False)``), and vLLM's has no bias on ``fc``
  (``fc_bias=False``); a head trained otherwise is refused, since no weight mapping reproduces it.

The target-feature layers are named differently by the two engines: vLLM's top-level
``eagle_aux_hidden_state_layer_ids`` index hidden states as transformers does (``hidden_states[i]`` = the input
of layer i), SGLang's ``eagle_config.eagle_aux_hidden_state_layer_ids`` name the layer whose *output* is taken
(one less). An EAGLE-3 export writes both, so one folder serves in either engine.
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.heads.base import CONFIG_NAME, WEIGHTS_NAME, DraftHead, make_readable
from specheads.heads.card import base_model_id
from specheads.heads.draft_model import DraftModel
from specheads.heads.eagle import EagleHead
from specheads.heads.eagle3_checkpoint import EAGLE3_ARCHITECTURES, EAGLE3_LAYER_PREFIX
from specheads.heads.eagle_config import LLAMA_LAYER, eagle3_layer_order_problem
from specheads.heads.eagle_layer import llama_layer_config, llama_layer_settings
from specheads.heads.engine_targets import eagle3_target_warning
from specheads.heads.export_checks import (
    ExportError,
    check_computes_as_llama,
    check_llama_layer,
    check_no_logit_finish,
    check_reads_last_hidden_state,
)
from specheads.heads.medusa import MedusaHeads
from specheads.heads.speculators_format import (
    SPECULATORS_ENGINE,
    speculators_checkpoint,
)

ENGINES = ("vllm", "sglang", SPECULATORS_ENGINE)
SHARED_LAYOUT_ENGINES = ("vllm", "sglang")
"""The engines that read the same EAGLE-3, EAGLE-1 and draft-model folders."""
ENGINES_FOR = {
    "eagle3": ENGINES,
    "eagle": SHARED_LAYOUT_ENGINES,
    "medusa": ("vllm",),
    "draft_model": SHARED_LAYOUT_ENGINES,
}
"""The engines ``export_head`` writes each kind of drafter for, by vLLM's ``method`` name."""
SGLANG_EAGLE1_ARCHITECTURE = "LlamaForCausalLMEagle"
"""SGLang's EAGLE-1 drafter for a Llama layer, the ``architectures`` name its EAGLE-1 checkpoints carry: SGLang loads
the class a draft's config names (vLLM maps a ``LlamaForCausalLM`` draft to its EAGLE drafter itself)."""

_LLAMA_LAYER_TENSORS = frozenset(
    f"{EAGLE3_LAYER_PREFIX}{name}.weight"
    for name in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
        "input_layernorm",
        "post_attention_layernorm",
        "hidden_norm",
    )
)


def export_head(
    head: DraftHead,
    target: PreTrainedModel,
    out_dir: str | os.PathLike,
    engine: str = "vllm",
    dtype: torch.dtype | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> list[str]:
    """Write ``head`` (built on ``target``) in the format ``engine`` loads; returns the files written.

    ``dtype`` casts floating-point weights (None keeps the head's); ``tokenizer`` is saved beside a draft model,
    where engines look for it."""
    if engine not in ENGINES:
        raise ExportError(f"engine must be one of {ENGINES}, found {engine!r}")
    out = Path(out_dir)
    _check_speculators_holds(head, engine)
    if isinstance(head, DraftModel):
        return _export_draft_model(head, out, dtype, tokenizer)
    config, tensors = serving_checkpoint(head, target, engine)
    family = target.config.get_text_config().model_type
    if isinstance(head, EagleHead) and head.version == 3:
        if reason := eagle3_target_warning(engine, family, list(head.layer_ids)):
            warnings.warn(reason, stacklevel=2)
    tensors = {name: _cast(t, dtype) for name, t in tensors.items()}
    config["dtype"] = str(dtype or next(head.parameters()).dtype).removeprefix("torch.")
    config["torch_dtype"] = config["dtype"]  # the name transformers 4.x (the engines' config reader) looks for
    if engine == SPECULATORS_ENGINE:
        config, tensors = speculators_checkpoint(config, tensors, list(target.config.architectures or []))
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    safetensors.torch.save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    make_readable(out / CONFIG_NAME)
    make_readable(out / WEIGHTS_NAME)
    return [CONFIG_NAME, WEIGHTS_NAME]


def serving_checkpoint(
    head: DraftHead, target: PreTrainedModel, engine: str = "vllm"
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The config and tensors ``export_head`` writes for an EAGLE head or Medusa heads, after every check that the
    engine computes what the head does; raises ``ExportError`` with the reason where it would not."""
    _check_speculators_holds(head, engine)
    if isinstance(head, EagleHead) and head.version == 1:
        config, tensors = _eagle1_checkpoint(head, target, engine)
    elif isinstance(head, EagleHead):
        config, tensors = _eagle3_checkpoint(head, target, engine)
    elif isinstance(head, MedusaHeads):
        if engine != "vllm":
            raise ExportError(
                "specheads exports Medusa heads for vLLM only (its MedusaModel format); use --engine vllm"
            )
        config, tensors = _medusa_checkpoint(head)
    else:
        raise ExportError(f"no serving format for {type(head).__name__}")
    check_no_logit_finish(head, target)
    return config, tensors


def export_obstacle(head: DraftHead, target: PreTrainedModel, engine: str = "vllm") -> str | None:
    """Why ``specheads export`` would refuse ``head`` for ``engine``, or None when it would write it: training says
    so before a run, so that a head meant for serving is trained with settings that export."""
    if isinstance(head, DraftModel):  # a plain transformers model folder: every engine loads it
        return None
    try:
        serving_checkpoint(head, target, engine)
    except ExportError as error:
        return str(error)
    except Exception as error:  # advice only: a check that cannot run here must not stop the training it advises
        return f"the export checks fail on it ({type(error).__name__}: {error})"
    return None


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    tensor = tensor.detach().cpu().contiguous()
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


def _eagle3_checkpoint(
    head: EagleHead, target: PreTrainedModel, engine: str
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    tensors = {}
    for name, tensor in head.state_dict().items():
        if name.startswith("layer."):
            tensors[EAGLE3_LAYER_PREFIX + name.removeprefix("layer.")] = tensor
        elif name == "hidden_norm.weight":
            tensors[EAGLE3_LAYER_PREFIX + name] = tensor
        elif name in ("fc.weight", "norm.weight", "lm_head.weight"):
            tensors[name] = tensor
    draft_vocab = head.draft_vocab_size
    tensors["d2t"] = head.d2t - torch.arange(draft_vocab, device=head.d2t.device)  # offsets, as the engines read them
    tensors["t2d"] = head.t2d >= 0
    config = _eagle3_config(head, target, engine)
    _check_runs_as_llama(head, tensors, EAGLE3_LAYER_PREFIX, _LLAMA_LAYER_TENSORS, config)
    return config, tensors


def _eagle1_checkpoint(
    head: EagleHead, target: PreTrainedModel, engine: str
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    if head.config.input_norm:
        raise ExportError(
            "this EAGLE-1 head normalises fc's output before its decoder layer (input_norm=true); the engines' "
            "EAGLE-1 drafter, like the reference, does not, so no weight mapping reproduces it. Train with "
            "head.options.input_norm=false (and fc_bias=false for vLLM) to export EAGLE-1, or use an EAGLE-3 head."
        )
    check_reads_last_hidden_state(head)
    if engine == "vllm" and head.config.fc_bias:
        raise ExportError(
            "vLLM's EAGLE-1 drafter has no bias on fc and would drop this head's; train with "
            "head.options.fc_bias=false, or export with --engine sglang"
        )
    tensors = {
        name.replace("layer.", "layers.0.", 1): t for name, t in head.state_dict().items() if name.startswith("layer.")
    }
    expected = {
        name.replace(EAGLE3_LAYER_PREFIX, "layers.0.")
        for name in _LLAMA_LAYER_TENSORS
        if not name.endswith(("hidden_norm.weight", "input_layernorm.weight"))
    }
    tensors["fc.weight"] = head.fc.weight
    if head.fc.bias is not None:
        tensors["fc.bias"] = head.fc.bias
    elif engine == "sglang":  # SGLang's fc always has a bias
        tensors["fc.bias"] = head.fc.weight.new_zeros(head.fc.out_features)
    architecture = SGLANG_EAGLE1_ARCHITECTURE if engine == "sglang" else "LlamaForCausalLM"
    config = _llama_draft_config(head, target, [architecture])
    config["specheads"] = specheads_record(head, version=1, layer_ids=list(head.layer_ids))
    _check_runs_as_llama(head, tensors, "layers.0.", expected, config)
    return config, tensors


def _check_runs_as_llama(
    head: EagleHead, tensors: dict[str, torch.Tensor], prefix: str, expected: set | frozenset, config: dict
) -> None:
    """The engines run the drafter's layer as a Llama layer: its tensors, then its numbers, must be one's. A layer
    built from the target's class that is not says how to train one that exports."""
    try:
        check_llama_layer(head, tensors, prefix, expected)
        check_computes_as_llama(head, config)
    except ExportError as error:
        if head.config.draft_layer == LLAMA_LAYER:
            raise
        raise ExportError(
            f"{error}. Train the head with head.options.draft_layer=llama (a Llama layer with this target's sizes, "
            "as SpecForge's drafters are) to export it for this target"
        ) from error


def _eagle3_config(head: EagleHead, target: PreTrainedModel, engine: str) -> dict[str, Any]:
    config = _llama_draft_config(head, target, [EAGLE3_ARCHITECTURES[0]])
    config["draft_vocab_size"] = head.draft_vocab_size
    layer_ids = list(head.layer_ids)
    layers = head.config.target.num_hidden_layers
    if problem := eagle3_layer_order_problem(layer_ids):
        raise ExportError(
            f"this head was saved with {problem}. specheads still decodes with it; to serve it, retrain with "
            f"head.options.layer_ids={sorted(set(layer_ids))} or another distinct ascending set (or the default)"
        )
    if max(layer_ids) >= layers:
        raise ExportError(
            f"the engines capture EAGLE-3's features at the inputs of the target's layers 0..{layers - 1} "
            f"(hidden_states[i] for i < {layers}); layer_ids {layer_ids} include hidden_states[{layers}], the "
            "output after the final norm, which no engine hands the drafter. Train with layer ids below "
            f"{layers} (the default, [2, N // 2, N - 3], is)"
        )
    if min(layer_ids) < 1:
        raise ExportError(
            f"layer_ids {layer_ids} include hidden_states[0], the embeddings: SGLang names features by the layer whose "
            "output they are, and vLLM's Llama forward adds the residual at layer 0's input before there is one. "
            f"Train with layer ids from 1 to {layers - 1} (the default, [2, N // 2, N - 3], is)"
        )
    # both engines' keys, so the folder serves in either: each falls back to its own default layers without its key
    config["eagle_aux_hidden_state_layer_ids"] = layer_ids
    config["eagle_config"] = {
        "use_aux_hidden_state": True,
        "eagle_aux_hidden_state_layer_ids": [i - 1 for i in layer_ids],
    }
    config["specheads"] = specheads_record(head, version=3, layer_ids=layer_ids)
    return config


def _llama_draft_config(head: EagleHead, target: PreTrainedModel, architectures: list[str]) -> dict[str, Any]:
    """A one-layer ``LlamaConfig`` (as a dict) with the drafter layer's shapes, rotary and norm settings: its own
    (``draft_layer=llama``) or those a Llama layer for the target would have (``draft_layer=target``, whose layer
    ``check_computes_as_llama`` then holds to them)."""
    text = target.config.get_text_config()
    settings = head.config.llama_layer or llama_layer_settings(text)
    config = llama_layer_config(settings, head.config.target).to_dict()
    config.update(
        tie_word_embeddings=False,  # SGLang would otherwise use the embedding as the (draft-vocabulary) lm_head
        bos_token_id=text.bos_token_id,
        eos_token_id=text.eos_token_id,
        pad_token_id=text.pad_token_id,
    )
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        # transformers 4.x, which the engines read configs with, knows only the flat keys: without them it would
        # fall back to rope_theta 10000 and the drafter would run with another rotary base (and accept little)
        config["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default":
            config["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    config["architectures"] = architectures
    record = head.config.target
    config["base_model_name_or_path"] = base_model_id(record.name_or_path) or record.name_or_path
    return config


def specheads_record(head: DraftHead, **fields: Any) -> dict[str, Any]:
    """What an export records of the head it came from, under ``specheads`` in its ``config.json``: the head's type,
    ``fields``, and the target by the name specheads loads it with (``specheads push`` names the target from it)."""
    return {"head_type": head.head_type, **fields, "target": {"name_or_path": head.config.target.name_or_path}}


def _check_speculators_holds(head: DraftHead, engine: str) -> None:
    """The speculators format is written for EAGLE-3 drafters only; anything else is refused with the engines that
    serve it (vLLM would otherwise serve a draft model's folder as the main model, with no speculation)."""
    if engine == SPECULATORS_ENGINE and not (isinstance(head, EagleHead) and head.version == 3):
        method = (
            "medusa" if isinstance(head, MedusaHeads) else "eagle" if isinstance(head, EagleHead) else "draft_model"
        )
        fix = " or ".join(ENGINES_FOR[method])
        raise ExportError(
            f"the speculators format holds EAGLE-3 drafters here, not {type(head).__name__}"
            f"{' (EAGLE-1)' if isinstance(head, EagleHead) else ''}; use --engine {fix}"
        )


def _medusa_checkpoint(head: MedusaHeads) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    check_reads_last_hidden_state(head)
    record = head.config.target
    tensors = {}
    for k, blocks in enumerate(head.blocks):
        for layer, block in enumerate(blocks):
            tensors[f"blocks.{k}.layers.{layer}.weight"] = block.linear.weight
            tensors[f"blocks.{k}.layers.{layer}.bias"] = block.linear.bias
    shared = head.lm_heads is None
    if shared:
        tensors["lm_heads.0.weight"] = head.borrowed.lm_head.weight  # vLLM loads the shared matrix from here
    else:
        for k, lm_head in enumerate(head.lm_heads):
            tensors[f"lm_heads.{k}.weight"] = lm_head.weight
    config = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": record.hidden_size,
        "vocab_size": record.vocab_size,
        "truncated_vocab_size": record.vocab_size,
        "num_heads": head.num_heads,
        "num_hidden_layers": head.config.num_layers,
        "medusa_fc_bias": True,
        "original_lm_head": shared,
        "base_model_name_or_path": base_model_id(record.name_or_path) or record.name_or_path,
        "specheads": specheads_record(head, layer_ids=list(head.layer_ids)),
    }
    return config, tensors


def _export_draft_model(
    head: DraftModel, out: Path, dtype: torch.dtype | None, tokenizer: PreTrainedTokenizerBase | None
) -> list[str]:
    model = head.model if dtype is None else copy.deepcopy(head.model).to(dtype)  # the caller's head stays as it is
    model.save_pretrained(out)
    config = json.loads((out / CONFIG_NAME).read_text())  # the engines ignore keys they do not know
    (out / CONFIG_NAME).write_text(json.dumps({**config, "specheads": specheads_record(head)}, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return sorted(p.name for p in out.iterdir())
