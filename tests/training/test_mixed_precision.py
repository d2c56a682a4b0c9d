"""bf16 mixed precision on CPU through the real script (its own process: Accelerate's precision is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from specheads.heads import load_head
from specheads.target import load_target
from tests.training.train_helpers import REPO, tiny_overrides

pytestmark = pytest.mark.slow  # minutes on tiny models: in make test, not make test-fast


def test_bf16_autocast_run_trains_and_saves_an_fp32_head(tiny_target_dir, small_chat_file, tmp_path):
    out = tmp_path / "run"
    overrides = tiny_overrides(tiny_target_dir, small_chat_file, out, max_steps=3, batch_size=2, eval_every=3)
    command = [
        sys.executable, str(REPO / "scripts" / "train_heads.py"),
        "--config", str(REPO / "configs" / "eagle3" / "smollm2-135m.yaml"),
        *overrides, "train.mixed_precision=bf16", "head.options.draft_vocab_size=null", "loss.ttt_steps=2",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "mixed_precision: bf16" in (out / "train_config.yaml").read_text()
    target, _ = load_target(tiny_target_dir)
    head = load_head(out, target)
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in head.parameters())
