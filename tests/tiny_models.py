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
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.2,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
"""The shared sizes of ``tiny_family`` models (hidden 64, 2 layers, vocabulary 128)."""


def tiny_family(model_type: str, attn: str = "eager", **options: object):
    """A tiny random, frozen, eval-mode model of any transformers family, with that family's own ``options``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**TINY_FAMILY_CONFIG, **options})  # options override the sizes
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval().requires_grad_(False)


def make_tiny_llama(
    seed: int = 0, vocab_size: int = 128, num_layers: int = 2, tie_word_embeddings: bool = False
) -> LlamaForCausalLM:
    """A tiny random Llama (hidden 64) that behaves like a real target: frozen, eval mode, sdpa attention."""
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


def save_tiny_target(out: Path, num_layers: int = 2, model_type: str = "llama", **config: object) -> Path:
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
