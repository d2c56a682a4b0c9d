"""Reading the Llama EAGLE-3 draft checkpoints the serving engines load (written by SpecForge, the EAGLE authors,
``specheads export`` or in the speculators format) as specheads heads; ``heads/interop.py`` writes them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from transformers import LlamaConfig, PreTrainedModel

from specheads.heads.base import CONFIG_NAME, WEIGHTS_NAME
from specheads.heads.config import HeadConfigError, HeadLoadError
from specheads.heads.eagle import EagleHead
from specheads.heads.eagle_config import LLAMA_LAYER, EagleConfig, check_vocab_maps, default_eagle3_layer_ids
from specheads.heads.eagle_layer import llama_layer_settings
from specheads.heads.files import safetensors_header
from specheads.heads.speculators_format import as_engine_checkpoint, is_speculators_checkpoint

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
"""``architectures`` names of a Llama EAGLE-3 draft checkpoint; the first is what SpecForge and SGLang write."""

EAGLE3_LAYER_PREFIX = "midlayer."
"""The engines' name for the drafter's single decoder layer (``layer.`` here)."""


def is_eagle3_checkpoint(meta: dict[str, Any]) -> bool:
    """Whether a ``config.json`` describes a Llama EAGLE-3 draft checkpoint (SpecForge / vLLM / SGLang layout, or
    the speculators format)."""
    return is_speculators_checkpoint(meta) or any(
        arch in EAGLE3_ARCHITECTURES for arch in meta.get("architectures") or ()
    )


def load_eagle3_checkpoint(
    folder: str | os.PathLike, target: PreTrainedModel, dtype: torch.dtype | None = None
) -> EagleHead:
    """An ``EagleHead`` (v3, eval, frozen) from a Llama EAGLE-3 draft checkpoint folder, strictly: every tensor
    must map onto the drafter and every drafter tensor must be present (the embedding, when shipped, must equal the
    target's, since this drafter reads the target's). The head is in the target's dtype, or ``dtype`` (fp32 to train
    it), cast before loading so that an fp32 file's values arrive unrounded."""
    folder = Path(folder)
    meta = json.loads((folder / CONFIG_NAME).read_text())
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        pickles = sorted(p.name for p in folder.glob("*.bin"))
        hint = f"; found {pickles}, which specheads does not unpickle: convert them to safetensors" if pickles else ""
        raise HeadLoadError(f"{folder} has no {WEIGHTS_NAME}{hint}")
    safetensors_header(weights)  # a truncated or corrupt file: a HeadLoadError that says so
    meta, tensors = as_engine_checkpoint(meta, safetensors.torch.load_file(str(weights)))
    # the engines' EAGLE-3 drafter is a Llama layer whatever the target, with the checkpoint's own settings
    layer = llama_layer_settings(LlamaConfig.from_dict(meta))
    config = EagleConfig(
        version=3, layer_ids=_eagle3_layer_ids(meta, target), draft_layer=LLAMA_LAYER, llama_layer=layer
    )
    config.draft_vocab_size = int(meta.get("draft_vocab_size") or meta["vocab_size"])
    _check_eagle3_shapes(meta, target, folder)
    if "d2t" not in tensors and config.draft_vocab_size != target.config.get_text_config().vocab_size:
        raise HeadLoadError(
            f"{weights} has a {config.draft_vocab_size}-token draft vocabulary but no d2t tensor mapping it onto the "
            f"target's {target.config.get_text_config().vocab_size} tokens; without it every drafted id would name "
            "the wrong token. Export the checkpoint with its d2t (SpecForge and the EAGLE-3 reference both save it)."
        )
    offsets = tensors.pop("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
    d2t = offsets.long() + torch.arange(offsets.numel())  # the engines store each draft id's offset to its token
    check_vocab_maps(weights, d2t, target.config.get_text_config().vocab_size)  # before t2d indexes with it
    head = EagleHead(config, target, d2t=d2t)
    if dtype is not None:
        head.to(dtype)
    tensors.pop("t2d", None)  # rebuilt from d2t
    embedding = tensors.pop("embed_tokens.weight", None)
    own = head.borrowed.embed_tokens.weight.detach()
    if embedding is not None and not _same_embedding(embedding, own):
        raise HeadLoadError(
            f"{weights} ships an embedding that differs from the target's; this drafter reads the target's embedding, "
            "so it would not reproduce the checkpoint. Load it onto the target it was trained for."
        )
    state = {_specheads_name(name): tensor for name, tensor in tensors.items()}
    state["d2t"], state["t2d"] = head.d2t, head.t2d
    expected = {name: tuple(t.shape) for name, t in head.state_dict().items()}
    found = {name: tuple(t.shape) for name, t in state.items()}
    if expected != found:
        raise HeadLoadError(
            f"{weights} does not map onto an EAGLE-3 drafter for this target: "
            f"missing {sorted(set(expected) - set(found))}, unexpected {sorted(set(found) - set(expected))}, "
            f"shapes differing {sorted(n for n in set(found) & set(expected) if found[n] != expected[n])}"
        )
    head.load_state_dict(state, strict=True)
    head.to(target.device).eval().requires_grad_(False)
    return head


def _same_embedding(shipped: torch.Tensor, own: torch.Tensor) -> bool:
    """Whether a checkpoint's embedding is the target's: as it is, or rounded to the checkpoint's dtype (a bf16
    checkpoint, as SpecForge saves, of a target whose weights are fp32)."""
    return torch.equal(shipped.to(own), own) or torch.equal(own.to(shipped.dtype), shipped)


def _specheads_name(name: str) -> str:
    if not name.startswith(EAGLE3_LAYER_PREFIX):
        return name
    rest = name.removeprefix(EAGLE3_LAYER_PREFIX)
    return rest if rest.startswith("hidden_norm.") else "layer." + rest


def _eagle3_layer_ids(meta: dict[str, Any], target: PreTrainedModel) -> list[int]:
    """vLLM's top-level ids are hidden-state indices; SGLang's ``eagle_config`` ids are layer outputs (+1)."""
    if meta.get("eagle_aux_hidden_state_layer_ids"):
        return [int(i) for i in meta["eagle_aux_hidden_state_layer_ids"]]
    sglang_ids = (meta.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if sglang_ids:
        return [int(i) + 1 for i in sglang_ids]
    return default_eagle3_layer_ids(target.config.get_text_config().num_hidden_layers)


def _check_eagle3_shapes(meta: dict[str, Any], target: PreTrainedModel, folder: Path) -> None:
    text = target.config.get_text_config()
    if meta.get("num_hidden_layers", 1) != 1:
        raise HeadLoadError(f"{folder}: {meta['num_hidden_layers']} drafter layers; specheads' EAGLE-3 drafter has one")
    wanted = {"hidden_size": text.hidden_size, "vocab_size": text.vocab_size}
    wrong = [
        f"{key}: checkpoint {meta.get(key)}, target {value}" for key, value in wanted.items() if meta.get(key) != value
    ]
    target_hidden = meta.get("target_hidden_size")
    if target_hidden not in (None, text.hidden_size):
        wrong.append(f"target_hidden_size: checkpoint {target_hidden}, target {text.hidden_size}")
    if wrong:
        raise HeadConfigError(f"{folder} was not trained for this target: " + "; ".join(wrong))
