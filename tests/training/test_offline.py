"""Offline training reads a feature cache instead of running the target, and sees the same losses as online."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch

from specheads.target import load_target
from specheads.training.config import ConfigError, load_config
from specheads.training.data_cli import data_main
from specheads.training.feature_cache import CachedFeatureDataset, open_feature_caches
from specheads.training.features import cache_features
from specheads.training.loop import train
from tests.training.train_helpers import REPO, tiny_overrides


# eagle1: hidden states + the target distribution; draft_model: the target distribution only; eagle3: three layers
# and a draft vocabulary counted from the training tokens (read from the cache's token columns offline)
@pytest.mark.parametrize("head", ["eagle1", "draft_model", "eagle3"])
def test_offline_features_give_the_online_losses(head, tiny_target_dir, small_chat_file, tmp_path):
    cache = tmp_path / "cache"
    data_args = ["--data", str(small_chat_file), "--max-length", "64", "--eval-size", "8", "--max-samples", "24"]
    layers = ["1", "2", "3"] if head == "eagle3" else ["4"]
    cache_args = ["--target", str(tiny_target_dir), "--out-dir", str(cache), "--layer-ids", *layers, "--dtype", "fp32"]
    assert data_main(["cache-features", *data_args, *cache_args]) == 0
    config = REPO / "configs" / head / "smollm2-135m.yaml"
    runs = {}
    for mode in ("online", "offline"):
        overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / mode, max_steps=2, eval_every=2)
        overrides += ["data.max_samples=24", "loss.input_noise=0.0", f"features.mode={mode}"]
        overrides += ["head.options.copy_target_layers=2"] * (head == "draft_model")
        overrides += ["head.options.layer_ids=[1,2,3]", "head.options.draft_vocab_size=512", "loss.ttt_steps=2"] * (
            head == "eagle3"
        )
        overrides += [f"features.cache_dir={cache}"] * (mode == "offline")
        runs[mode] = train(load_config(config, overrides))
    online, offline = runs["online"].history, runs["offline"].history
    assert [h["step"] for h in offline] == [0, 2]
    for before, after in zip(online, offline, strict=True):
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
    # what an EAGLE-3 draft vocabulary is counted from, read without loading the features
    every = [both[i] for i in range(len(both))]
    assert both.loss_tokens() == [s["input_ids"][s["loss_mask"].bool()].tolist() for s in every]
    assert both.loss_tokens() == first.loss_tokens() + second.loss_tokens()
    # what resume checks the data with: the caches' content digests, read without loading a feature
    from specheads.training.resume import data_digest

    held_out = CachedFeatureDataset(caches["a"] / "eval")
    assert data_digest(first, held_out) == data_digest(CachedFeatureDataset(caches["a"] / "train"), held_out)
    assert data_digest(both, held_out) != data_digest(first, held_out) != data_digest(second, held_out)

    # The untrained head's eval loss over both eval splits (one batch of 4 from each) is the per-token mean of both.
    step0 = {}
    for name, extra in (("a", []), ("b", []), ("ab", [caches["b"]])):
        cache = caches["a"] if name != "b" else caches["b"]
        overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / f"run-{name}", max_steps=1)
        overrides += ["features.mode=offline", f"features.cache_dir={cache}", "train.eval_every=1"]
        overrides += ["loss.input_noise=0.0", f"features.extra_cache_dirs=[{','.join(map(str, extra))}]"]
        step0[name] = train(load_config(REPO / "configs" / "eagle1" / "smollm2-135m.yaml", overrides)).history[0]
    tokens = {name: sum(map(len, CachedFeatureDataset(caches[name] / "eval").loss_tokens())) for name in "ab"}
    assert tokens["a"] != tokens["b"]  # so that the plain mean of the two would differ
    weighted = sum(step0[name]["eval/loss"] * tokens[name] for name in "ab") / sum(tokens.values())
    assert step0["ab"]["eval/loss"] == pytest.approx(weighted, rel=1e-5)
    assert step0["a"]["eval/loss"] != pytest.approx(step0["b"]["eval/loss"], rel=1e-3)


def test_caches_of_different_layers_are_refused(tiny_target_dir, small_chat_file, tmp_path):
    for layer in ("2", "4"):
        args = ["--data", str(small_chat_file), "--max-length", "64", "--max-samples", "4", "--eval-size", "0"]
        args += ["--target", str(tiny_target_dir), "--out-dir", str(tmp_path / layer), "--layer-ids", layer]
        assert data_main(["cache-features", *args]) == 0
    with pytest.raises(ConfigError, match=r"cannot be read together \(layer_ids \[2\] vs \[4\]\)"):
        open_feature_caches([tmp_path / "2" / "train", tmp_path / "4" / "train"])


def _cache(target_dir, chats, out, *extra):
    args = ["--data", str(chats), "--max-length", "64", "--max-samples", "12", "--eval-size", "4", "--dtype", "fp32"]
    assert data_main(["cache-features", *args, "--target", str(target_dir), "--out-dir", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def four_layer_cache(tiny_target_dir, small_chat_file, tmp_path_factory):
    """Hidden states 2 and 4 of the 4-layer tiny target: also valid indices for a 2-layer target."""
    return _cache(tiny_target_dir, small_chat_file, tmp_path_factory.mktemp("cache"), "--layer-ids", "2", "4")


def _offline_medusa(target_dir, chats, out, cache, *extra):
    overrides = tiny_overrides(target_dir, chats, out, max_steps=1, batch_size=2)
    overrides += ["features.mode=offline", f"features.cache_dir={cache}", *extra]
    return load_config(REPO / "configs" / "medusa" / "smollm2-135m.yaml", overrides)


def test_default_cache_layers_fit_a_two_layer_target(tiny_two_layer_target_dir, small_chat_file, tmp_path):
    """The default layer ids are EAGLE-3's plus the last hidden state; a target too shallow for EAGLE-3's three
    distinct features gets the last hidden state alone (what EAGLE-1 and Medusa read)."""
    cache = _cache(tiny_two_layer_target_dir, small_chat_file, tmp_path, "--no-logits")
    assert CachedFeatureDataset(cache / "train").layer_ids == [2]


def test_a_cache_of_another_target_is_refused(
    tiny_target_dir, tiny_two_layer_target_dir, small_chat_file, four_layer_cache, tmp_path, caplog
):
    """Cached features must come from the training target: other shapes are an error (index 2 of a 4-layer target
    is not the 2-layer target's last hidden state); the same shapes with other weights are a warning, and a renamed
    copy of the same weights passes silently."""
    two_layers = _offline_medusa(tiny_two_layer_target_dir, small_chat_file, tmp_path / "a", four_layer_cache)
    with pytest.raises(ConfigError, match=r"written by target .*\(num_hidden_layers 4 vs 2\).*cache-features --target"):
        train(two_layers)

    renamed, tokenizer = load_target(tiny_target_dir)
    renamed.config.name_or_path = "a-renamed-copy"
    with caplog.at_level(logging.WARNING, logger="specheads.training.feature_cache"):
        assert train(
            _offline_medusa(tiny_target_dir, small_chat_file, tmp_path / "b", four_layer_cache), renamed, tokenizer
        ).finished
    assert "written by target" not in caplog.text

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a fine-tune, say: every weight moved by ~2%
        for param in renamed.parameters():
            param.mul_(1 + 0.02 * torch.randn(param.shape, generator=generator))
    with caplog.at_level(logging.WARNING, logger="specheads.training.feature_cache"):
        assert train(
            _offline_medusa(tiny_target_dir, small_chat_file, tmp_path / "c", four_layer_cache), renamed, tokenizer
        ).finished
    assert re.search(
        r"written by target '.*tiny-target.*', and 'a-renamed-copy' has other weights \(sampled weights differ by",
        caplog.text,
    )


def test_offline_training_warns_about_the_data_settings_it_ignores(
    tiny_target_dir, small_chat_file, four_layer_cache, tmp_path, caplog
):
    """Offline training reads the cached samples: data.* settings that differ from the cache's are named."""
    extra = ["data.max_length=16", "data.paths=[/does/not/exist.jsonl]", "data.max_samples=12", "data.eval_size=4"]
    cfg = _offline_medusa(tiny_target_dir, small_chat_file, tmp_path, four_layer_cache, *extra)
    with caplog.at_level(logging.WARNING, logger="specheads.training.feature_cache"):
        assert train(cfg).finished
    warning = next(r.getMessage() for r in caplog.records if "these settings are ignored" in r.getMessage())
    assert "data.paths=['/does/not/exist.jsonl'] (cache: [" in warning
    assert "data.max_length=16 (cache: 64)" in warning
    assert "max_samples" not in warning and "eval_size" not in warning  # equal to the cache's: not named


def test_a_cache_that_does_not_fit_the_head_is_one_line_from_the_command(
    tiny_target_dir, small_chat_file, tmp_path, capsys
):
    """A cache without the head's layers, or one its writer did not finish, ended `specheads train` in a traceback
    (a ValueError the command does not expect); both are configuration errors now, said in one line."""
    import json

    from specheads.training.train_cli import train_main

    cache = _cache(tiny_target_dir, small_chat_file, tmp_path / "cache", "--layer-ids", "2")
    config = str(REPO / "configs" / "medusa" / "smollm2-135m.yaml")
    overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "run", max_steps=1, batch_size=2)
    overrides += ["features.mode=offline", f"features.cache_dir={cache}"]
    capsys.readouterr()  # what writing the cache printed
    assert train_main(["--config", config, *overrides]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds hidden states [2] and a target distribution; this head needs" in err
    assert "Re-run `specheads data cache-features` --layer-ids " in err and "into a new --out-dir" in err
    assert "--no-logits" not in err  # the distribution is there: only the layers are missing
    meta_path = cache / "train" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "complete": False}))  # as a killed `cache-features` leaves it
    with pytest.raises(ConfigError, match="is incomplete \\(its writer was stopped\\): rerun the same"):
        CachedFeatureDataset(cache / "train")


def test_a_cache_resumes_whatever_spelling_of_its_target_folder(
    tiny_target_dir, tiny_two_layer_target_dir, small_chat_file, tmp_path, monkeypatch, capsys
):
    """The same target folder named relatively was "a cache made with other settings"; the weights decide, so
    another target is still refused."""
    _cache(tiny_target_dir, small_chat_file, tmp_path / "cache", "--no-logits")
    monkeypatch.chdir(tiny_target_dir.parent)
    args = ["--data", str(small_chat_file), "--max-length", "64", "--max-samples", "12", "--eval-size", "4"]
    args += ["--dtype", "fp32", "--no-logits", "--out-dir", str(tmp_path / "cache")]
    assert data_main(["cache-features", *args, "--target", tiny_target_dir.name]) == 0
    assert data_main(["cache-features", *args, "--target", str(tiny_two_layer_target_dir)]) == 2
    assert "holds a cache made with other settings or data (layer_ids, target differ)" in capsys.readouterr().err


def test_caches_of_one_target_under_two_spellings_read_together(
    tiny_target_dir, tiny_two_layer_target_dir, small_chat_file, tmp_path, monkeypatch
):
    """Two caches of the same weights, the folder named absolutely and relatively, were refused as two targets;
    another target's cache still is."""
    _cache(tiny_target_dir, small_chat_file, tmp_path / "absolute", "--no-logits")
    monkeypatch.chdir(tiny_target_dir.parent)
    _cache(tiny_target_dir.name, small_chat_file, tmp_path / "relative", "--no-logits")
    both = open_feature_caches([tmp_path / "absolute" / "train", tmp_path / "relative" / "train"])
    assert len(both) == 2 * len(CachedFeatureDataset(tmp_path / "absolute" / "train"))
    _cache(tiny_two_layer_target_dir, small_chat_file, tmp_path / "other", "--no-logits", "--layer-ids", "2")
    differ = r"target \(name_or_path .* num_hidden_layers 4 vs 2, other weights\), layer_ids"
    with pytest.raises(ConfigError, match=differ):
        open_feature_caches([tmp_path / "absolute" / "train", tmp_path / "other" / "train"])


def test_a_cache_is_not_resumed_with_other_loss_masks(tiny_target_dir, tmp_path):
    """Only the token ids were hashed: data whose masks changed (a cut answer now marked, a masking fix) resumed
    into shards written with the old masks. A cache from before the masks were hashed still resumes."""
    target, _ = load_target(tiny_target_dir)
    samples = [{"input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 1]} for _ in range(3)]
    out = tmp_path / "cache"
    cache_features(target, samples, [2], out, with_logits=False, shard_size=1)
    (out / "shard-00002.safetensors").unlink()
    changed = [*samples[:2], {"input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 0]}]
    with pytest.raises(ValueError, match=r"other settings or data \(loss_mask_sha1 differ\)"):
        cache_features(target, changed, [2], out, with_logits=False, shard_size=1)
    meta = json.loads((out / "meta.json").read_text())
    del meta["loss_mask_sha1"]
    (out / "meta.json").write_text(json.dumps(meta))
    cache_features(target, samples, [2], out, with_logits=False, shard_size=1)
    assert CachedFeatureDataset(out)[2]["loss_mask"].tolist() == [0, 0, 1, 1, 1]


def test_a_cache_without_the_distribution_asks_for_one_not_for_layers(tmp_path):
    """A cache written with --no-logits for a head that distils from the target: the message named the layer ids."""
    from types import SimpleNamespace

    from specheads.training.run_setup import check_cache

    cache = SimpleNamespace(out_dir=tmp_path, layer_ids=[2, 15, 27, 30], meta={"with_logits": False, "topk": None})
    check_cache(cache, [2, 15, 27], needs_logits=False)  # hidden states alone are enough for this head
    with pytest.raises(ConfigError, match=r"Re-run `specheads data cache-features` without --no-logits \(full lo"):
        check_cache(cache, [2, 15, 27], needs_logits=True)
    with pytest.raises(ConfigError, match=r"--layer-ids 1 2 3 and without --no-logits .* into a new --out-dir"):
        check_cache(cache, [1, 2, 3], needs_logits=True)


def test_a_cache_dir_that_is_not_a_finished_cache_is_refused_before_the_target_loads(
    four_layer_cache, tiny_target_dir, small_chat_file, tmp_path, monkeypatch
):
    """A mistyped, one-level-too-deep or unfinished features.cache_dir was found only after the target had loaded."""
    import shutil

    import specheads.training.loop as loop

    monkeypatch.setattr(loop, "load_target", lambda *a, **k: pytest.fail("the target loaded before the cache check"))
    unfinished = tmp_path / "unfinished"
    shutil.copytree(four_layer_cache, unfinished)
    meta = json.loads((unfinished / "eval" / "meta.json").read_text())
    (unfinished / "eval" / "meta.json").write_text(json.dumps({**meta, "complete": False}))
    for cache, message in [
        (tmp_path / "typo", r"typo/train/meta.json not found; expected the folder `specheads data cache-features"),
        (four_layer_cache / "train", r"train/train/meta.json not found; .* is a split itself: name the folder above"),
        (unfinished, r"unfinished/eval is incomplete \(its writer was stopped\)"),
    ]:
        with pytest.raises(ConfigError, match=message):
            train(_offline_medusa(tiny_target_dir, small_chat_file, tmp_path / "run", cache))
