"""Offline training reads a feature cache instead of running the target, and sees the same losses as online."""

from __future__ import annotations

import pytest
import torch
from train_helpers import REPO, tiny_overrides

from specheads.training.config import load_config
from specheads.training.data_cli import data_main
from specheads.training.features import CachedFeatureDataset, open_feature_caches
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


def test_several_caches_train_as_one_dataset(tiny_target_dir, small_chat_file, tmp_path):
    """Data added later is cached on its own and read after the first cache (features.extra_cache_dirs)."""
    lines = small_chat_file.read_text().splitlines(keepends=True)
    caches = {}
    for name, part in (("a", lines[:16]), ("b", lines[16:32])):
        chats = tmp_path / f"{name}.jsonl"
        chats.write_text("".join(part))
        caches[name] = tmp_path / f"cache-{name}"
        args = ["--data", str(chats), "--max-length", "64", "--eval-size", "4", "--target", str(tiny_target_dir)]
        args += ["--out-dir", str(caches[name]), "--layer-ids", "4", "--dtype", "fp32"]
        assert data_main(["cache-features", *args]) == 0

    both = open_feature_caches([caches["a"] / "train", caches["b"] / "train"])
    first, second = CachedFeatureDataset(caches["a"] / "train"), CachedFeatureDataset(caches["b"] / "train")
    assert len(both) == len(first) + len(second) == 24
    assert both.lengths() == first.lengths() + second.lengths()
    assert torch.equal(both[len(first) + 3]["hidden_states.4"], second[3]["hidden_states.4"])

    # The untrained head's eval loss over both eval splits (one batch of 4 from each) is the mean of each alone.
    step0 = {}
    for name, extra in (("a", []), ("b", []), ("ab", [caches["b"]])):
        cache = caches["a"] if name != "b" else caches["b"]
        overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / f"run-{name}", max_steps=1)
        overrides += ["features.mode=offline", f"features.cache_dir={cache}", "train.eval_every=1"]
        overrides += ["loss.input_noise=0.0", f"features.extra_cache_dirs=[{','.join(map(str, extra))}]"]
        step0[name] = train(load_config(REPO / "configs" / "eagle1" / "smollm2-135m.yaml", overrides)).history[0]
    assert step0["ab"]["eval/loss"] == pytest.approx((step0["a"]["eval/loss"] + step0["b"]["eval/loss"]) / 2, rel=1e-5)
    assert step0["a"]["eval/loss"] != pytest.approx(step0["b"]["eval/loss"], rel=1e-3)


def test_caches_of_different_layers_are_refused(tiny_target_dir, small_chat_file, tmp_path):
    for layer in ("2", "4"):
        args = ["--data", str(small_chat_file), "--max-length", "64", "--max-samples", "4", "--eval-size", "0"]
        args += ["--target", str(tiny_target_dir), "--out-dir", str(tmp_path / layer), "--layer-ids", layer]
        assert data_main(["cache-features", *args]) == 0
    with pytest.raises(ValueError, match=r"cannot be read together \(layer_ids \[2\] vs \[4\]\)"):
        open_feature_caches([tmp_path / "2" / "train", tmp_path / "4" / "train"])
