"""Plain helpers shared by tests (import them from here, not from a conftest: several conftest modules exist and
``from conftest import ...`` resolves to whichever pytest imported first)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SMOLLM2 = "smollm2-135m-instruct"

TINY_FAMILY_CONFIG = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.2,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
"""The shared sizes of ``tiny_family`` models (hidden 64, vocabulary 128; 4 layers, the fewest EAGLE-3's three
distinct default features come from)."""


def tiny_family(model_type: str, attn: str = "eager", **options: object):
    """A tiny random, frozen, eval-mode model of any transformers family, with that family's own ``options``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**TINY_FAMILY_CONFIG, **options})  # options override the sizes
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval().requires_grad_(False)


ARCHITECTURES = {
    "gemma": dict(head_dim=16),
    "gemma2": dict(head_dim=16, final_logit_softcapping=3.0, attn_logit_softcapping=5.0, query_pre_attn_scalar=16),
    "gemma3_text": dict(head_dim=16, final_logit_softcapping=3.0, query_pre_attn_scalar=16),
    "phi3": {},
    "qwen3": dict(head_dim=16),
    "llama": {},
    "mistral": dict(sliding_window=8),  # the decode runs past the window
    "qwen2": {},  # q/k/v biases
    "glm": dict(head_dim=16),  # partial, interleaved rotary; fused gate_up MLP
    "stablelm": dict(qk_layernorm=True, use_qkv_bias=True),  # LayerNorm with bias, per-head q/k norms, partial rotary
    "starcoder2": {},  # LayerNorm, biases everywhere, GELU MLP without a gate
    # each branch scaled by 0.5 before the residual add; attention scaled by 0.1; embeddings and logits scaled
    "granite": dict(residual_multiplier=0.5, attention_multiplier=0.1, embedding_multiplier=2.0, logits_scaling=2.0),
    "olmo": dict(clip_qkv=1.0),  # non-parametric LayerNorm, clipped q/k/v
    "smollm3": dict(no_rope_layers=[1, 0, 1, 0]),  # SmolLM3's pattern: some layers without rotary (NoPE)
    "qwen3_moe": dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    "seed_oss": dict(head_dim=16),  # q/k/v biases
    "arcee": {},  # ReLU^2 MLP without a gate
    "olmo2": {},  # post-norm: norms after attention and after the MLP, none before
    "cohere": {},  # attention and MLP in parallel off one input norm
    "stablelm_parallel": dict(model_type="stablelm", use_parallel_residual=True),  # x + attn(ln(x)) + mlp(ln(x))
    # Granite with every multiplier at Llama's value (attention 1/sqrt(head_dim)): a Llama layer in all but name
    "granite_llama_numbers": dict(model_type="granite", attention_multiplier=0.25, embedding_multiplier=2.0),
    # attention sinks, alternating sliding/full layers, a sparse MLP that also returns its router scores
    "gpt_oss": dict(num_local_experts=4, head_dim=16, sliding_window=8),
    "mixtral": dict(num_local_experts=4),
    "qwen2_moe": dict(num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32),  # + a shared expert
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "deepseek_v3": dict(  # multi-head latent attention (low-rank q and kv, a split rotary/no-rotary head), MoE
        num_key_value_heads=4,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        kv_lora_rank=16,
        q_lora_rank=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
    ),
    "glm4_moe_lite": dict(  # GLM-4.7-Flash: latent attention with interleaved rotary, MoE after a dense first layer
        num_key_value_heads=4,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        kv_lora_rank=32,
        q_lora_rank=48,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    ),
    "hunyuan_v1_dense": dict(head_dim=16, rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
    "ministral": dict(head_dim=16, rope_parameters=dict(rope_type="default", rope_theta=10000.0), sliding_window=8),
    "helium": dict(head_dim=16),
    "ernie4_5": dict(head_dim=16),
    "nemotron": {},  # LayerNorm1P, ReLU^2 MLP, partial rotary
    "persimmon": {},  # fused q/k/v, per-head q/k LayerNorms
    # families without a Llama-style decoder layer (no EAGLE drafter): Medusa heads and draft models decode them
    "gptj": dict(rotary_dim=8),  # parallel block, interleaved partial rotary
    "codegen": dict(rotary_dim=8),
    "gpt2": {},  # learned absolute positions
    "gpt_bigcode": {},  # multi-query attention, learned absolute positions
    "opt": dict(ffn_dim=128, word_embed_proj_dim=64),  # learned absolute positions
    "gpt_neox": {},
    "falcon": {},  # rotary; Falcon with alibi=True is refused (tests/decoding/test_exactness_probe.py)
    "phi": {},
    "dbrx": dict(
        d_model=64,
        n_heads=4,
        n_layers=4,
        attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
        ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2),
    ),
    "exaone4": dict(head_dim=16, sliding_window=8),  # post-norm
    "olmo3": dict(sliding_window=8),  # post-norm
    "glm4": dict(head_dim=16),  # norms after attention and the MLP as well as before
    "apertus": {},  # xIELU activation
    "cohere2": dict(sliding_window=8),  # parallel attention/MLP block
}
"""``tiny_named`` options per test target: a ``model_type`` (the key unless given) and the settings to exercise."""

EAGLE_REFUSED = {
    1: {"olmo2", "cohere", "stablelm_parallel", "gptj", "codegen", "gpt2", "gpt_bigcode", "opt", "gpt_neox"}
    | {"falcon", "phi", "dbrx", "exaone4", "olmo3", "glm4", "apertus", "cohere2"},
}
EAGLE_REFUSED[3] = EAGLE_REFUSED[1] | {"phi3", "deepseek_v3", "glm4_moe_lite", "persimmon"}  # fused or latent q/k/v
"""Per EAGLE version, the ``ARCHITECTURES`` entries whose decoder layer the drafter does not wire, so it refuses to
build on them (tests/heads/test_architectures.py); it builds on every other one."""


def tiny_named(name: str, attn: str = "eager"):
    """The tiny model of an ``ARCHITECTURES`` entry."""
    options = dict(ARCHITECTURES[name])
    return tiny_family(options.pop("model_type", name), attn, **options)


def make_tiny_llama(
    seed: int = 0, vocab_size: int = 128, num_layers: int = 4, tie_word_embeddings: bool = False
) -> LlamaForCausalLM:
    """A tiny random Llama (hidden 64; 4 layers, which EAGLE-3's default features need) that behaves like a real
    target: frozen, eval mode, sdpa attention."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).eval()
    model.config.name_or_path = "tiny-random-llama"
    model.requires_grad_(False)
    return model


def in_local_hub_cache(folder, repo_id: str, monkeypatch) -> str:
    """Place ``folder`` in a temporary Hub cache as ``repo_id``'s main snapshot, the layout ``snapshot_download``
    reads offline, and point huggingface_hub at that cache. Returns the repo id."""
    import shutil

    from huggingface_hub import constants

    cache = folder.parent / "hub-cache"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(folder, repo / "snapshots" / commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return repo_id


def save_tiny_target(out: Path, num_layers: int = 4, model_type: str = "llama", **config: object) -> Path:
    """A tiny random model (hidden 64; a Llama unless ``model_type`` names another family, with ``config`` for its
    own settings) with SmolLM2's tokenizer and chat template, saved to ``out`` so that it loads by path in any
    process (training launches, CLI runs)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from specheads.target import builtin_cache_dir, ensure_builtin_converted

    ensure_builtin_converted("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(builtin_cache_dir("smollm2-135m-instruct"))
    torch.manual_seed(0)
    settings = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    if model_type == "llama":
        model = LlamaForCausalLM(LlamaConfig(**settings, **config))
    else:  # other families' default special-token ids are not SmolLM2's
        special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        special["pad_token_id"] = tokenizer.pad_token_id
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **settings, **special, **config))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
