"""The ``speculators`` format (vllm-project/speculators): an EAGLE-3 head as a folder vLLM serves in one line
(``vllm serve DIR``: the target comes from the config's verifier) and speculators' own classes load.

Its ``config.json`` (speculators ``Eagle3SpeculatorConfig``, read by vLLM's
``transformers_utils/configs/speculators``) holds ``speculators_model_type: "eagle3"``, the drafter layer's
``LlamaConfig`` as ``transformer_layer_config`` (``vocab_size`` there is the target's), ``draft_vocab_size``, the
feature layers as ``eagle_aux_hidden_state_layer_ids`` (hidden-state indices, as vLLM's top-level key) and
``speculators_config`` with the proposal method (greedy, ``speculative_tokens``, which vLLM takes as its default
``num_speculative_tokens``) and the ``verifier`` (the target's ``name_or_path`` and ``architectures``).
``norm_before_residual`` is written explicitly: vLLM's ``algos.py`` takes True when the key is absent, and
specheads' heads add the un-normed feature to the attention output (False). The weights are the engines' EAGLE-3
checkpoint with ``midlayer.`` named ``layers.0.`` (speculators' converter does the same renaming); ``d2t``/``t2d``
are left out when the draft vocabulary is the target's, where speculators' drafter has no such buffers.
"""

from __future__ import annotations

from typing import Any

import torch

from specheads.heads.config import HeadLoadError

SPECULATORS_ENGINE = "speculators"
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
"""The ``architectures`` name speculators writes for an EAGLE-3 drafter (vLLM maps the folder to its own class)."""
SPECULATORS_LAYER_PREFIX = "layers.0."
SPECULATIVE_TOKENS = 3
"""The chain length the greedy proposal method records: vLLM's default ``num_speculative_tokens`` for the folder."""

_LLAMA_LAYER_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "attention_bias",
    "mlp_bias",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "torch_dtype",
    "dtype",
)
"""What the drafter layer's ``LlamaConfig`` carries into ``transformer_layer_config``."""

_SPECHEADS_VARIANT = {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False}
"""speculators' EAGLE-3 options as specheads' drafter computes them (an absent ``norm_before_residual`` is True in
vLLM's reader, so it is always written)."""

_VLLM_ABSENT_VARIANT = {**_SPECHEADS_VARIANT, "norm_before_residual": True}
"""What vLLM's reader takes for an option a config leaves out: a folder is read as the drafter vLLM would serve."""


def speculators_checkpoint(
    engine_config: dict[str, Any], tensors: dict[str, torch.Tensor], verifier_architectures: list[str]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The speculators-format config and tensors of an EAGLE-3 head from its engines' checkpoint (``engine_config``
    and ``tensors`` as ``interop`` writes them for vLLM), with the target's ``architectures`` for the verifier."""
    layer = {key: engine_config[key] for key in _LLAMA_LAYER_KEYS if engine_config.get(key) is not None}
    draft_vocab = int(engine_config["draft_vocab_size"])
    config = {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": draft_vocab,
        **_SPECHEADS_VARIANT,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(engine_config["eagle_aux_hidden_state_layer_ids"]),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": SPECULATIVE_TOKENS, "verifier_accept_k": 1}
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": engine_config["base_model_name_or_path"],
                "architectures": list(verifier_architectures),
            },
        },
        "dtype": engine_config.get("dtype"),
        "torch_dtype": engine_config.get("torch_dtype"),
        "specheads": engine_config["specheads"],
    }
    full_vocab = draft_vocab == int(engine_config["vocab_size"])
    renamed = {}
    for name, tensor in tensors.items():
        if full_vocab and name in ("d2t", "t2d"):
            continue
        renamed[SPECULATORS_LAYER_PREFIX + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name] = (
            tensor
        )
    return config, renamed


def is_speculators_checkpoint(meta: dict[str, Any]) -> bool:
    """Whether a ``config.json`` is in the speculators format."""
    return "speculators_model_type" in meta


def as_engine_checkpoint(
    meta: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A speculators EAGLE-3 folder's config and tensors in the engines' layout (the reverse of
    ``speculators_checkpoint``), so that one loader reads both; other configs pass through unchanged."""
    if not is_speculators_checkpoint(meta):
        return meta, tensors
    missing = [key for key in ("transformer_layer_config", "draft_vocab_size") if key not in meta]
    if missing:
        raise HeadLoadError(
            f"this speculators config.json has no {', '.join(missing)}, which every speculators EAGLE-3 config has: "
            "the folder is incomplete, or written by another tool; export it again"
        )
    variants = {key: meta.get(key, absent) for key, absent in _VLLM_ABSENT_VARIANT.items()}
    if meta["speculators_model_type"] != "eagle3" or variants != _SPECHEADS_VARIANT:
        raise HeadLoadError(
            f"specheads loads speculators EAGLE-3 drafters with {_SPECHEADS_VARIANT}; found speculators_model_type="
            f"{meta['speculators_model_type']!r} with {variants} (an absent norm_before_residual means True, as in "
            "vLLM): load it with speculators' own classes"
        )
    flat = {
        **meta["transformer_layer_config"],
        "draft_vocab_size": meta["draft_vocab_size"],
        "eagle_aux_hidden_state_layer_ids": meta.get("eagle_aux_hidden_state_layer_ids"),
        "target_hidden_size": meta.get("target_hidden_size"),
    }
    renamed = {
        "midlayer." + name.removeprefix(SPECULATORS_LAYER_PREFIX)
        if name.startswith(SPECULATORS_LAYER_PREFIX)
        else name: t
        for name, t in tensors.items()
    }
    return flat, renamed
