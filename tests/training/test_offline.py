"""Offline training reads a feature cache instead of running the target, and sees the same losses as online."""

from __future__ import annotations

import pytest
from train_helpers import REPO, tiny_overrides

from specheads.training.config import load_config
from specheads.training.data_cli import data_main
from specheads.training.loop import train


# eagle1: hidden states + the target distribution; draft_model: the target distribution only
@pytest.mark.parametrize("head", ["eagle1", "draft_model"])
def test_offline_features_give_the_online_losses(head, tiny_target_dir, small_chat_file, tmp_path):
    cache = tmp_path / "cache"
    data_args = ["--data", str(small_chat_file), "--max-length", "64", "--eval-size", "8", "--max-samples", "24"]
    cache_args = ["--target", str(tiny_target_dir), "--out-dir", str(cache), "--layer-ids", "4", "--dtype", "fp32"]
    assert data_main(["cache-features", *data_args, *cache_args]) == 0
    config = REPO / "configs" / head / "smollm2-135m.yaml"
    runs = {}
    for mode in ("online", "offline"):
        overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / mode, max_steps=2, eval_every=2)
        overrides += ["data.max_samples=24", "loss.input_noise=0.0", f"features.mode={mode}"]
        overrides += ["head.options.copy_target_layers=2"] * (head == "draft_model")
        overrides += [f"features.cache_dir={cache}"] * (mode == "offline")
        runs[mode] = train(load_config(config, overrides))
    online, offline = runs["online"].history, runs["offline"].history
    assert [h["step"] for h in offline] == [0, 2]
    for before, after in zip(online, offline):
        assert after["eval/loss"] == pytest.approx(before["eval/loss"], rel=1e-4)
