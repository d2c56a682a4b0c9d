"""Which target families the serving engines run an EAGLE-3 drafter beside.

An EAGLE-3 drafter needs the target's forward to hand it the hidden states of the listed layers; each engine wires
that into some model classes only, and refuses (vLLM at start-up) or cannot serve the others. EAGLE-1 and Medusa read
the last hidden state, which every engine's target hands its drafter, so they need nothing of the family.

Sources (the engines' own code):
- vLLM: ``vllm/config/speculative.py``, ``SpeculativeConfig._verify_args``: ``eagle3_target_supported``, matched
  as a substring of the target's ``model_type`` (so ``qwen`` covers qwen2, qwen3, qwen3_moe, ...). The speculators
  format is served by vLLM, so the same list holds for it.
- SGLang: the model classes in ``python/sglang/srt/models/`` that define ``set_eagle3_layers_to_capture`` (Llama
  and the classes built on it, such as Mistral's; Qwen2/Qwen3/Qwen3-MoE; GPT-OSS; DeepSeek-V2/V3; MiniMax-M2).
"""

from __future__ import annotations

EAGLE3_TARGETS = {
    "vllm": ("llama", "qwen", "minicpm", "gpt_oss", "hunyuan_vl", "hunyuan_v1_dense", "afmoe"),
    "sglang": (
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "gpt_oss",
        "deepseek_v2",
        "deepseek_v3",
        "minimax_m2",
    ),
}
"""Per engine, the target ``model_type``s its EAGLE-3 drafter is served beside (vLLM: substrings, as it matches)."""

ENGINE_OF_FORMAT = {"vllm": "vllm", "sglang": "sglang", "speculators": "vllm"}
"""Which engine serves each export format."""


def serves_eagle3_beside(engine_format: str, model_type: str) -> bool:
    """Whether the engine serving ``engine_format`` runs an EAGLE-3 drafter beside a ``model_type`` target."""
    engine = ENGINE_OF_FORMAT[engine_format]
    if engine == "vllm":
        return any(name in model_type for name in EAGLE3_TARGETS[engine])
    return model_type in EAGLE3_TARGETS[engine]


def eagle3_target_warning(engine_format: str, model_type: str) -> str | None:
    """Why an EAGLE-3 export in ``engine_format`` would not be served beside a ``model_type`` target, or None."""
    if serves_eagle3_beside(engine_format, model_type):
        return None
    engine = ENGINE_OF_FORMAT[engine_format]
    others = [f for f in ENGINE_OF_FORMAT if f != engine_format and serves_eagle3_beside(f, model_type)]
    return (
        f"{engine}'s EAGLE-3 support covers targets of types {list(EAGLE3_TARGETS[engine])}, not {model_type!r}: it "
        f"would refuse to serve this drafter beside the target (specheads.heads.engine_targets names the source). "
        + (f"The {' and '.join(others)} format{'s' if len(others) > 1 else ''} would serve it; " if others else "")
        + "the files stay valid for an engine that adds the support"
    )
