"""Shared fixtures: a tiny random Llama for unit tests and the real SmolLM2-135M-Instruct target for integration."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

SMOLLM2 = "smollm2-135m-instruct"


def make_tiny_llama(seed: int = 0, vocab_size: int = 128, num_layers: int = 2) -> LlamaForCausalLM:
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
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).eval()
    model.config.name_or_path = "tiny-random-llama"
    model.requires_grad_(False)
    return model


@pytest.fixture
def tiny_llama() -> LlamaForCausalLM:
    return make_tiny_llama()


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the real SmolLM2-135M-Instruct target, fp32 on CPU, loaded once per test session."""
    from specheads.target import load_target

    return load_target(SMOLLM2)
