"""A bf16 target (the natural choice on a GPU): heads still train with fp32 weights, and the final head is saved in
the target's dtype, as inference runs it. ``train.mixed_precision=auto`` follows ``accelerate launch``."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from specheads.heads import load_head
from specheads.target import load_target
from specheads.training.config import load_config
from specheads.training.launch import resolve_mixed_precision
from specheads.training.loop import train
from tests.training.train_helpers import REPO, tiny_overrides

CASES = {
    # the shipped Medusa config projects through the target's own (bf16) lm_head, as EAGLE-1 does
    "medusa": [],
    "eagle1": [],
    "eagle3": ["head.options.draft_vocab_size=null", "loss.ttt_steps=2"],
    "draft_model": ["head.options.copy_target_layers=1"],
}


@pytest.mark.parametrize("name", list(CASES))
def test_heads_on_a_bf16_target_train_with_fp32_weights(name, tiny_target_dir, small_chat_file, tmp_path):
    """With bf16 weights, AdamW steps of lr * ~1 on weights of ~0.02 are below half a bf16 ulp and round away
    (as they would for a head built in the target's dtype). The checkpoint holds what the optimizer updates: fp32
    values, nearly all of which a bf16 weight could not hold."""
    target, tokenizer = load_target(tiny_target_dir, dtype=torch.bfloat16)
    out = tmp_path / "run"
    overrides = CASES[name] + tiny_overrides(tiny_target_dir, small_chat_file, out, max_steps=3, batch_size=2)
    overrides += ["train.lr=1e-5", "train.scheduler=constant", "train.warmup_steps=0", "train.save_every=3"]
    train(load_config(REPO / "configs" / name / "smollm2-135m.yaml", overrides), target=target, tokenizer=tokenizer)

    state = load_file(out / "checkpoints" / "step-00000003" / "model.safetensors")
    weights = {k: v for k, v in state.items() if v.is_floating_point()}
    assert weights and all(v.dtype == torch.float32 for v in weights.values()), {v.dtype for v in weights.values()}
    flat = torch.cat([v.flatten() for v in weights.values()])
    off_bf16_grid = (flat != flat.to(torch.bfloat16).float()).float().mean().item()
    assert off_bf16_grid > 0.9, f"only {off_bf16_grid:.1%} of the head's weights moved off the bf16 grid"

    head = load_head(out, target)
    assert all(p.dtype == torch.bfloat16 for p in head.parameters() if p.is_floating_point())
    assert load_file(out / "model.safetensors").popitem()[1].dtype == torch.bfloat16  # saved as inference runs it


def test_mixed_precision_auto_follows_the_launch_config(monkeypatch, caplog):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    assert load_config(REPO / "configs" / "eagle3" / "smollm2-135m.yaml").train.mixed_precision == "auto"
    assert resolve_mixed_precision("auto") == "no"  # a plain `python scripts/train_heads.py`
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what `accelerate launch` exports from ddp.yaml
    assert resolve_mixed_precision("auto") == "bf16"
    assert resolve_mixed_precision("bf16") == "bf16" and not caplog.records
    assert resolve_mixed_precision("no") == "no"  # an explicit setting wins, and says so
    assert "train.mixed_precision=no overrides the launch's mixed_precision=bf16" in caplog.text
