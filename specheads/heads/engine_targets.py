"""Which target families the serving engines run an EAGLE-3 drafter beside, and how they read its layer ids.

An EAGLE-3 drafter needs the target's forward to hand it the hidden states of the listed layers; each engine wires
that into some model classes only, picked by the target checkpoint's ``architectures``, and refuses the others at
start-up. EAGLE-1 and Medusa read the last hidden state, which every engine's target hands its drafter, so they need
nothing of the family.

Sources, read in the engines' released code (vLLM 0.34.0 and SGLang 0.5.23, the PyPI wheels):
- vLLM: ``vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py``, ``set_eagle3_aux_hidden_state_layers``, raises
  "Model does not support EAGLE3 interface" unless the target's class implements ``SupportsEagle3``
  (``vllm/model_executor/models/interfaces.py``, whose ``EagleModelMixin`` keeps each listed hidden-state index once,
  ascending). ``vllm/model_executor/models/registry.py`` names a class for each architecture it knows, its own or its
  Transformers backend (``vllm/model_executor/models/transformers/base.py``, which implements the interface), and runs
  an architecture it does not know on that backend. The speculators format is served by vLLM, so the same holds for
  it.
- SGLang: ``python/sglang/srt/model_executor/model_runner_components/attention_backend_setup.py``,
  ``configure_aux_hidden_state_capture``, raises unless the target's class has ``set_eagle3_layers_to_capture``;
  the listed types are those whose class in ``python/sglang/srt/models/`` defines or inherits it (``llama.py``'s is
  inherited by Mistral, Ministral3, Phi-3, InternLM3, ...). Most add one to each ``eagle_config`` id (which names the
  layer whose output is taken) to get the layer whose input they capture; ``deepseek_v2.py``'s class (inherited by
  DeepSeek-V3, V3.2, GLM-MoE-DSA) and ``glm4_moe_lite.py``'s add one only when the first id is 1.

Each engine's class name is mapped to the ``model_type`` whose checkpoints carry it through transformers'
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``; types whose checkpoints name another class than transformers' are left out.
"""

from __future__ import annotations

from collections.abc import Sequence

EAGLE3_TARGETS = {
    "vllm": (
        "afmoe", "apertus", "arcee", "cohere2_moe", "cwm", "deepseek_v2", "deepseek_v3", "ernie4_5", "flex_olmo",
        "gemma", "gemma4", "gemma4_text", "gemma4_unified", "glm", "glm_moe_dsa", "gpt_bigcode", "gpt_neox",
        "gpt_oss", "granite", "granite_swa", "granitemoe", "granitemoe_swa", "granitemoeshared", "hunyuan_v1_dense",
        "hunyuan_v1_moe", "internlm3", "iquestcoder", "jais2", "kolibri1", "laguna", "llama", "llama4", "llama4_text",
        "mellum", "mimo_v2_flash", "minicpm3", "minimax_m2", "ministral3", "mistral", "nemotron_h", "olmo", "olmo2",
        "olmo3", "olmoe", "phi", "phi3", "qwen2", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text",
        "qwen3_5_text", "qwen3_moe", "qwen3_next", "sarvam_mla", "seed_oss", "smollm3", "stablelm", "starcoder2",
        "vaultgemma",
    ),
    "sglang": (
        "apertus", "deepseek_v2", "deepseek_v3", "deepseek_v32", "exaone_moe", "gemma3", "gemma3_text", "gemma4",
        "gemma4_text", "gemma4_unified", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "gpt_oss", "internlm3",
        "iquestcoder", "llama", "llama4", "llama4_text", "longcat_flash", "mellum", "minimax_m2", "ministral3",
        "mistral", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text",
        "qwen3_moe", "qwen3_next", "sarvam_moe",
    ),
}  # fmt: skip
"""Per engine, the target ``model_type``s (the text config's) whose engine class captures the layers."""

VLLM_CLASSES_WITHOUT_EAGLE3 = (
    "axk1", "bamba", "beam", "bloom", "cohere", "cohere2", "dbrx", "deepseek_v32", "deepseek_v4", "dory", "dots1",
    "dots3_note", "dots3_note_text", "ernie4_5_moe", "exaone4", "exaone_moe", "falcon", "falcon_h1", "falcon_mamba",
    "flint", "fuyu", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "glm4", "glm4_moe",
    "glm4_moe_lite", "gpt-sw3", "gpt2", "gptj", "granitemoehybrid", "hrm_text", "hy_v3", "hy_v4", "hyperclovax",
    "inkling_text", "jamba", "kimi_linear", "lfm2", "lfm2_moe", "lfm3", "longcat_flash", "mamba", "mamba2", "minimax",
    "mixtral", "moss_transcribe_diarize", "mpt", "nemotron", "olmo_hybrid", "opt", "persimmon", "phi4_multimodal",
    "qwen2_moe", "qwen4_exp", "qwen4_exp_text", "zamba2", "zaya",
)  # fmt: skip
"""Target types vLLM runs on a class of its own that lacks ``SupportsEagle3``; a type in neither vLLM list has no vLLM
class and runs on its Transformers backend, which captures the layers."""

SGLANG_ONE_ADDED_ONLY_AFTER_1 = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa")
"""Target types whose SGLang class adds one to the ``eagle_config`` ids only when the first is 1 and otherwise
captures the inputs of the layers named: an export (ids one less than the hidden-state indices) is read as meant
only when its first hidden-state index is 2."""

ENGINE_OF_FORMAT = {"vllm": "vllm", "sglang": "sglang", "speculators": "vllm"}
"""Which engine serves each export format."""


def serves_eagle3_beside(engine_format: str, model_type: str) -> bool:
    """Whether the engine serving ``engine_format`` runs an EAGLE-3 drafter beside a ``model_type`` target."""
    engine = ENGINE_OF_FORMAT[engine_format]
    if engine == "vllm":
        return model_type not in VLLM_CLASSES_WITHOUT_EAGLE3
    return model_type in EAGLE3_TARGETS[engine]


def eagle3_target_warning(engine_format: str, model_type: str, layer_ids: Sequence[int] = ()) -> str | None:
    """Why an EAGLE-3 export in ``engine_format`` (hidden-state indices ``layer_ids``) would not be served as trained
    beside a ``model_type`` target, or None."""
    engine = ENGINE_OF_FORMAT[engine_format]
    others = [f for f in ENGINE_OF_FORMAT if f != engine_format and serves_eagle3_beside(f, model_type)]
    served_by = f"the {' and '.join(others)} format{'s' if len(others) > 1 else ''} would serve it" if others else ""
    if not serves_eagle3_beside(engine_format, model_type):
        fix = (
            "serve with --model-impl transformers (vLLM's Transformers backend captures the layers)"
            + (f", or {served_by}" if others else "")
            if engine == "vllm"
            else served_by or "the files stay valid for an engine that adds the support"
        )
        return (
            f"{engine}'s model class for {model_type!r} targets does not capture the hidden states an EAGLE-3 drafter "
            f"reads, so {engine} would refuse this drafter at start-up (specheads.heads.engine_targets lists the "
            f"families): {fix}"
        )
    if engine == "sglang" and model_type in SGLANG_ONE_ADDED_ONLY_AFTER_1 and layer_ids and layer_ids[0] != 2:
        return (
            f"SGLang's {model_type} class adds one to eagle_config's layer ids only when the first is 1, so it would "
            f"feed this drafter hidden states {[i - 1 for i in layer_ids]}, not the {list(layer_ids)} it was trained "
            f"on (docs/serving.md): {served_by + ' as trained, or ' if others else ''}train with the first layer id 2"
        )
    return None
