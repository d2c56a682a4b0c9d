"""Targets other than Llama: EAGLE drafters are built from the target's decoder layer only where that layer is a
Llama-style pre-norm block, exports refuse layers the engines would run as Llama layers, and a target that refuses
sdpa attention loads with eager (found by training heads for tiny Gemma, Gemma2, Gemma3 and Phi-3 targets)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from specheads.decoding import SpeculativeGenerator, build_drafter
from specheads.heads import EagleConfig, EagleDrafter, MedusaConfig, MedusaHeads, UnsupportedTargetError
from specheads.heads.interop import ExportError, export_head

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.2,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
ARCHITECTURES = {
    "gemma": dict(head_dim=16),
    "gemma2": dict(head_dim=16, final_logit_softcapping=3.0, attn_logit_softcapping=5.0, query_pre_attn_scalar=16),
    "gemma3_text": dict(head_dim=16, final_logit_softcapping=3.0, query_pre_attn_scalar=16),
    "phi3": {},
    "qwen3": dict(head_dim=16),
}


def tiny(model_type: str, attn: str = "eager"):
    config = AutoConfig.for_model(model_type, **COMMON, **ARCHITECTURES[model_type])
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval().requires_grad_(False)


@pytest.mark.parametrize(
    "model_type, version, refusal",
    [
        ("gemma2", 1, "norms the drafter's pre-norm block would not apply \\(post_feedforward_layernorm"),
        ("gemma2", 3, "norms the drafter's pre-norm block would not apply"),
        ("gemma3_text", 1, "a rotary embedding that also needs \\['layer_type'\\]"),
        ("phi3", 3, "fused attention projections"),
        ("gemma", 1, None),
        ("gemma", 3, None),
        ("phi3", 1, None),
        ("qwen3", 3, None),
    ],
)
def test_eagle_drafters_are_built_only_from_llama_style_layers(model_type, version, refusal):
    """Gemma2's extra feed-forward norms were left at zero (never applied), Gemma3's rotary and Phi-3's fused qkv
    crashed at the first training step: each is now refused when the drafter is built."""
    target = tiny(model_type)
    if refusal is None:
        EagleDrafter(EagleConfig(version=version), target)
        return
    with pytest.raises(UnsupportedTargetError, match=refusal):
        EagleDrafter(EagleConfig(version=version), target)


@pytest.mark.parametrize("version", [1, 3])
def test_gemma_eagle_export_is_refused_not_silently_wrong(tmp_path, version):
    """Gemma's layer has Llama's tensor names but norms of x * (1 + w) and a GELU MLP: exported as a Llama layer, an
    engine computed another drafter (logits off by up to 7 on a tiny model)."""
    target = tiny("gemma")
    options = dict(input_norm=False, fc_bias=False) if version == 1 else {}
    head = EagleDrafter(EagleConfig(version=version, **options), target)
    with pytest.raises(ExportError, match="do not compute x \\* w|is not SiLU"):
        export_head(head, target, tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_target_that_refuses_sdpa_loads_with_eager_and_decodes_losslessly(tmp_path):
    """load_target asked every target for sdpa; Gemma2 (soft-capped attention) refuses it, so no command could load
    it. Eager takes the same additive tree mask: greedy output with a Medusa head is the target's own."""
    from transformers import AutoTokenizer

    from specheads.target import ensure_builtin_converted, load_target

    tiny("gemma2").save_pretrained(tmp_path / "gemma2")
    AutoTokenizer.from_pretrained(ensure_builtin_converted("smollm2-135m-instruct")).save_pretrained(
        tmp_path / "gemma2"
    )
    target, tokenizer = load_target(tmp_path / "gemma2")
    assert target.config._attn_implementation == "eager"
    head = MedusaHeads(MedusaConfig(num_heads=2), target)
    prompt = torch.tensor([[1, 5, 9, 33, 7, 5, 9, 33]])
    result = SpeculativeGenerator(target, tokenizer, build_drafter(head, "chain:2")).generate(prompt, max_new_tokens=12)
    expected = target.generate(prompt, max_new_tokens=12, do_sample=False)[0, 8:].tolist()
    assert result.token_ids == expected[: len(result.token_ids)] and len(result.token_ids) > 0
    assert len(result.token_ids) == 12 or result.token_ids[-1] == tokenizer.eos_token_id
