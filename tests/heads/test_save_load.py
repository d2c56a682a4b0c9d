"""Round trips through config.json + model.safetensors, and every strict-load error."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from specheads.heads import (
    DraftModel,
    EagleConfig,
    EagleHead,
    HeadConfigError,
    HeadLoadError,
    MedusaConfig,
    MedusaHeads,
    build_vocab_maps,
    load_head,
)
from tests.tiny_models import in_local_hub_cache, make_tiny_llama


def _perturb(head):
    """Give every trainable tensor non-trivial values so a round trip proves the weights really travel."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in head.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.01)
    return head


def _outputs(head, target):
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (1, 6))
    if isinstance(head, MedusaHeads):
        return head(torch.randn(1, 6, 64))
    if isinstance(head, DraftModel):
        return head(ids).logits
    features = head.fuse(target(ids, output_hidden_states=True).hidden_states)
    return head(features, ids, torch.arange(6)[None])[1]


def _heads(target):
    d2t, _ = build_vocab_maps(torch.randint(0, 60, (400,)), 128, 48)
    return {
        "medusa": MedusaHeads(MedusaConfig(num_heads=2, num_layers=2), target),
        "medusa-shared": MedusaHeads(MedusaConfig(num_heads=2, share_lm_head=True), target),
        "eagle1": EagleHead(EagleConfig(version=1), target),
        "eagle3-reduced": EagleHead(EagleConfig(version=3, draft_vocab_size=48), target, d2t=d2t),
        "draft-model": DraftModel.from_target(target, num_layers=1),
    }


@pytest.mark.parametrize("name", ["medusa", "medusa-shared", "eagle1", "eagle3-reduced", "draft-model"])
def test_round_trip_gives_identical_outputs(tiny_llama, tmp_path, name):
    head = _perturb(_heads(tiny_llama)[name])
    expected = _outputs(head, tiny_llama)
    head.save_pretrained(tmp_path / "head", card={"metrics": {"top1": 0.5}})
    assert sorted(p.name for p in (tmp_path / "head").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    loaded = load_head(tmp_path / "head", tiny_llama)
    assert type(loaded) is type(head) and not loaded.training
    assert not any(p.requires_grad for p in loaded.parameters())
    torch.testing.assert_close(_outputs(loaded, tiny_llama), expected, rtol=0, atol=0)
    saved = load_file(tmp_path / "head" / "model.safetensors")
    assert not any("embed_tokens" in k for k in saved) or name == "draft-model"


def test_draft_model_with_tied_embeddings_round_trips(tmp_path):
    """SmolLM2 ties its embedding and lm_head: safetensors stores the pair once, under the alphabetically first name
    (``model.lm_head.weight``); loading must accept either name of the pair."""
    target = make_tiny_llama(tie_word_embeddings=True)
    head = _perturb(DraftModel.from_target(target, num_layers=1))
    model = head.model
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    head.save_pretrained(tmp_path / "head")
    assert "model.model.embed_tokens.weight" not in load_file(tmp_path / "head" / "model.safetensors")
    loaded = load_head(tmp_path / "head", target)
    torch.testing.assert_close(_outputs(loaded, target), _outputs(head, target), rtol=0, atol=0)


def test_config_json_records_target(tiny_llama, tmp_path):
    EagleHead(EagleConfig(version=3), tiny_llama).save_pretrained(tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    assert meta["head_type"] == "eagle" and meta["format_version"] == 1
    target = meta["config"]["target"]
    assert target["name_or_path"] == "tiny-random-llama"
    assert (target["hidden_size"], target["vocab_size"], target["num_hidden_layers"]) == (64, 128, 4)
    assert meta["config"]["layer_ids"] == [1, 2, 3]


@pytest.fixture
def saved_medusa(tiny_llama, tmp_path):
    folder = tmp_path / "medusa"
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(folder)
    return folder


def _edit_config(folder, edit):
    meta = json.loads((folder / "config.json").read_text())
    edit(meta)
    (folder / "config.json").write_text(json.dumps(meta))


def test_missing_tensor_is_an_error(tiny_llama, saved_medusa):
    tensors = load_file(saved_medusa / "model.safetensors")
    del tensors["blocks.1.0.linear.bias"]
    save_file(tensors, saved_medusa / "model.safetensors")
    with pytest.raises(HeadLoadError, match=r"missing tensors \['blocks.1.0.linear.bias'\]"):
        load_head(saved_medusa, tiny_llama)


def test_unexpected_tensor_is_an_error(tiny_llama, saved_medusa):
    tensors = load_file(saved_medusa / "model.safetensors")
    tensors["extra.weight"] = torch.zeros(2)
    save_file(tensors, saved_medusa / "model.safetensors")
    with pytest.raises(HeadLoadError, match=r"unexpected tensors \['extra.weight'\]"):
        load_head(saved_medusa, tiny_llama)


def test_shape_mismatch_is_an_error(tiny_llama, saved_medusa):
    tensors = load_file(saved_medusa / "model.safetensors")
    tensors["blocks.0.0.linear.bias"] = torch.zeros(65)
    save_file(tensors, saved_medusa / "model.safetensors")
    with pytest.raises(HeadLoadError, match=r"blocks.0.0.linear.bias: expected \(64,\), found \(65,\)"):
        load_head(saved_medusa, tiny_llama)


def test_config_disagreeing_with_weights_is_an_error(tiny_llama, saved_medusa):
    _edit_config(saved_medusa, lambda m: m["config"].update(num_heads=3))
    with pytest.raises(HeadLoadError, match="missing tensors"):
        load_head(saved_medusa, tiny_llama)


def test_unknown_head_type_and_format_version(tiny_llama, saved_medusa):
    _edit_config(saved_medusa, lambda m: m.update(head_type="hydra"))
    with pytest.raises(HeadLoadError, match=r"unknown head_type 'hydra'; expected one of"):
        load_head(saved_medusa, tiny_llama)
    _edit_config(saved_medusa, lambda m: m.update(head_type="medusa", format_version=99))
    with pytest.raises(HeadLoadError, match="format_version 99 is not supported"):
        load_head(saved_medusa, tiny_llama)


def test_unknown_config_key_lists_valid_keys(tiny_llama, saved_medusa):
    _edit_config(saved_medusa, lambda m: m["config"].update(num_hedas=3))
    with pytest.raises(HeadConfigError, match=r"unknown keys \['num_hedas'\]; valid keys are"):
        load_head(saved_medusa, tiny_llama)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vocab_size": 256}, "vocab_size: head was built for 128, target has 256"),
        ({"num_layers": 3}, "num_hidden_layers: head was built for 4, target has 3"),
    ],
)
def test_target_with_other_shapes_is_an_error(saved_medusa, kwargs, message):
    other = make_tiny_llama(**kwargs)
    with pytest.raises(HeadConfigError, match=message):
        load_head(saved_medusa, other)


def test_a_draft_model_loads_onto_another_size_of_target_with_its_vocabulary(tmp_path):
    """A draft model reads token ids only: one for a family's small member drafts for a deeper one, with a word
    about acceptance; another vocabulary is still refused."""
    from specheads.decoding import DraftModelDrafter, SpeculativeGenerator
    from tests.decoding.helpers import TinyTokenizer

    DraftModel.from_target(make_tiny_llama(num_layers=2), 1).save_pretrained(tmp_path)
    deeper = make_tiny_llama(num_layers=4, seed=1)
    with pytest.warns(UserWarning, match=r"num_hidden_layers: head was built for 2, target has 4.*it loads"):
        draft = load_head(tmp_path, deeper)
    prompt = torch.randint(0, 128, (9,), generator=torch.Generator().manual_seed(2))
    plain = SpeculativeGenerator(deeper, TinyTokenizer()).generate(prompt, max_new_tokens=8)
    drafted = SpeculativeGenerator(deeper, TinyTokenizer(), DraftModelDrafter(draft)).generate(prompt, 8)
    assert drafted.token_ids == plain.token_ids
    with pytest.raises(HeadConfigError, match="vocab_size: head was built for 128, target has 256"):
        load_head(tmp_path, make_tiny_llama(vocab_size=256))


def test_other_hidden_size_is_an_error(saved_medusa):
    _edit_config(saved_medusa, lambda m: m["config"]["target"].update(hidden_size=32))
    with pytest.raises(HeadConfigError, match="hidden_size: head was built for 32, target has 64") as refused:
        load_head(saved_medusa, make_tiny_llama())
    assert "; load it with the target it was trained on (" in str(refused.value)  # and what to do about it


def test_other_weights_with_same_shapes_warn_whatever_the_name(saved_medusa):
    """A same-shape target with other weights (another seed here; a fine-tune or the base model in practice) warns,
    under the head's own target name too: the weight probe tells them apart, not the name."""
    other = make_tiny_llama(seed=3)
    with pytest.warns(UserWarning, match=r"'tiny-random-llama', and 'tiny-random-llama' has other weights"):
        load_head(saved_medusa, other)
    other.config.name_or_path = "another-tiny-llama"
    with pytest.warns(UserWarning, match=r"'another-tiny-llama' has other weights \(sampled weights differ by"):
        load_head(saved_medusa, other)


def test_same_weights_load_silently_under_another_name_or_dtype(saved_medusa):
    """A renamed copy (a local folder of the model the head was trained on) and a 16-bit copy are the same target."""
    import warnings

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        same = make_tiny_llama().to(dtype)
        same.config.name_or_path = "/some/local/copy"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_head(saved_medusa, same)


def test_a_record_without_a_weight_probe_compares_names(saved_medusa):
    """A target record without a weight probe: the target's name decides."""
    _edit_config(saved_medusa, lambda m: m["config"]["target"].pop("weight_probe"))
    renamed = make_tiny_llama()
    renamed.config.name_or_path = "another-tiny-llama"
    with pytest.warns(UserWarning, match=r"target 'tiny-random-llama', not 'another-tiny-llama'"):
        load_head(saved_medusa, renamed)


def test_weight_probe_reads_every_dtype_and_skips_what_it_cannot_read():
    from specheads.heads.config import PROBE_TOLERANCE, TargetRecord, weight_probe

    model = make_tiny_llama()
    probe = weight_probe(model)
    assert len(probe) == 64 and len(set(probe)) > 32
    record = TargetRecord.from_model(model)
    assert record.weight_probe == probe
    assert record.weight_distance(TargetRecord.from_model(make_tiny_llama().to(torch.bfloat16))) < PROBE_TOLERANCE
    assert record.weight_distance(TargetRecord.from_model(make_tiny_llama(seed=1))) > 0.5
    with torch.device("meta"):
        assert weight_probe(make_tiny_llama()) == []
    assert TargetRecord(name_or_path="a").weight_distance(record) is None


@pytest.mark.parametrize("damage", ["truncate", "garbage", "bad-json", "no-weights"])
def test_corrupt_files_give_clear_errors(tiny_llama, saved_medusa, damage):
    weights = saved_medusa / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        weights.write_bytes(b"not a safetensors file at all")
    elif damage == "bad-json":
        (saved_medusa / "config.json").write_text('{"head_type": "medusa", ')
    else:
        weights.unlink()
    with pytest.raises(HeadLoadError, match="corrupt or truncated|has no model.safetensors"):
        load_head(saved_medusa, tiny_llama)


def test_missing_folder_offline_is_a_clear_error(tiny_llama, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from specheads.heads.hub import HubError

    with pytest.raises(HubError, match="is not a local folder and could not be fetched"):
        load_head("nobody/no-such-head", tiny_llama)


def test_a_missing_local_folder_is_a_local_path_error_not_a_hub_one(tiny_llama, tmp_path, monkeypatch):
    """A path that cannot be a Hub id was answered with a Hub hint ("HF_HUB_OFFLINE is set: unset it")."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for missing in (tmp_path / "nope", "./runs/nope", "runs/medusa/nope"):
        with pytest.raises(HeadLoadError, match=f"head folder {missing} does not exist; expected a folder written"):
            load_head(missing, tiny_llama)


def test_a_killed_saves_partial_files_are_removed_by_the_next_save(tiny_llama, tmp_path):
    """A kill during ``save_pretrained`` leaves ``.NAME.partial-PID`` behind (the rename never came); the next save
    into the folder removes those of processes that no longer run, and keeps a live one's."""
    import subprocess

    folder = tmp_path / "head"
    folder.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (folder / f".model.safetensors.partial-{dead.pid}").write_bytes(b"x" * 1000)
    (folder / f".lora.partial-{dead.pid}").mkdir()
    live = folder / f".notes.partial-{os.getpid()}"  # a process that still runs (this one)
    live.write_text("{}")
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == [live.name, "README.md", "config.json", "model.safetensors"]


def test_a_medusa2_head_records_its_adapter_and_refuses_to_load_without_it(tmp_path):
    """A Medusa-2 head whose lora/ folder was lost decoded the bare target without a word."""
    from peft import LoraConfig, get_peft_model

    from specheads.heads import apply_lora_adapter

    folder = tmp_path / "head"
    adapted = get_peft_model(make_tiny_llama(), LoraConfig(r=4, target_modules=["q_proj"]))
    MedusaHeads(MedusaConfig(num_heads=2), make_tiny_llama()).save_pretrained(
        folder, write_adapter=lambda path: adapted.save_pretrained(path)
    )
    assert json.loads((folder / "config.json").read_text())["lora_adapter"] is True
    target, applied = apply_lora_adapter(make_tiny_llama(), folder)
    assert applied and load_head(folder, target, adapter_applied=applied).num_heads == 2
    import shutil

    shutil.rmtree(folder / "lora")
    for load in (lambda: apply_lora_adapter(make_tiny_llama(), folder), lambda: load_head(folder, make_tiny_llama())):
        with pytest.raises(HeadLoadError, match=r"says lora_adapter: true\), but its lora/ folder is missing"):
            load()
    plain = tmp_path / "plain"
    MedusaHeads(MedusaConfig(num_heads=2), make_tiny_llama()).save_pretrained(plain)
    assert "lora_adapter" not in json.loads((plain / "config.json").read_text())
    untouched = make_tiny_llama()
    assert apply_lora_adapter(untouched, plain) == (untouched, False)


def test_the_checkpoint_marker_has_one_home():
    """``trainer_state.json`` is named in heads/files.py alone; training and decoding import it from heads."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "specheads"
    homes = [p.relative_to(package) for p in package.rglob("*.py") if '"trainer_state.json"' in p.read_text()]
    assert homes == [Path("heads/files.py")]
    assert "ADAPTER_MARK" not in "".join(p.read_text() for p in package.rglob("*.py"))


def test_save_over_a_run_folder_touches_only_the_head_and_drops_an_earlier_adapter(tiny_llama, tmp_path):
    """Training saves the final head into its output folder, beside checkpoints and logs: those stay as they are,
    also when the folder is a symlink (it was once deleted whole); a LoRA adapter left by an earlier head goes
    (Medusa-2 training saves its own with the heads), or decoding would merge a stale adapter into the target."""
    real = tmp_path / "disk" / "exp"
    (real / "checkpoints" / "step-00000100").mkdir(parents=True)
    (real / "checkpoints" / "step-00000100" / "optimizer.bin").write_bytes(b"state")
    (real / "train_config.yaml").write_text("train: {}\n")
    (real / "lora").mkdir()
    (real / "lora" / "adapter_config.json").write_text("{}")
    folder = tmp_path / "exp"
    folder.symlink_to(real)
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(folder)
    MedusaHeads(MedusaConfig(num_heads=3), tiny_llama).save_pretrained(folder)
    assert folder.is_symlink() and load_head(folder, tiny_llama).num_heads == 3
    assert (real / "checkpoints" / "step-00000100" / "optimizer.bin").read_bytes() == b"state"
    assert (real / "train_config.yaml").is_file() and not (real / "lora").exists()
    assert sorted(p.name for p in real.iterdir()) == [
        "README.md",
        "checkpoints",
        "config.json",
        "model.safetensors",
        "train_config.yaml",
    ]  # no temporary files left


def test_a_failed_save_leaves_the_previous_head_whole(tiny_llama, tmp_path, monkeypatch):
    import specheads.heads.base

    folder = tmp_path / "head"
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def killed(path, head, card):
        raise KeyboardInterrupt  # stopped while writing the card: after the weights, before anything is renamed

    monkeypatch.setattr(specheads.heads.base, "write_model_card", killed)
    with pytest.raises(KeyboardInterrupt):
        MedusaHeads(MedusaConfig(num_heads=3), tiny_llama).save_pretrained(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert load_head(folder, tiny_llama).num_heads == 2


def test_saved_files_follow_the_umask(tiny_llama, tmp_path):
    """safetensors writes owner-only files; a serving process under another user must be able to read a head."""
    import os

    old = os.umask(0o022)
    try:
        folder = MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(tmp_path / "head")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert modes == {"README.md": 0o644, "config.json": 0o644, "model.safetensors": 0o644}
    assert folder.stat().st_mode & 0o777 == 0o755


def test_a_head_and_its_adapter_are_replaced_together_or_not_at_all(tiny_llama, tmp_path):
    """Medusa-2 saves its LoRA adapter with the heads. The adapter is written aside first: a save that dies while
    writing it (here: the writer raises halfway) leaves the previous head and adapter as they were and no partial
    folder; a completed save replaces both."""
    folder = tmp_path / "head"

    def adapter(tag: str, fail: bool = False):
        def write(path):
            path.mkdir()
            (path / "adapter_config.json").write_text(tag)
            if fail:
                raise OSError("disk full")
            (path / "adapter_model.safetensors").write_bytes(tag.encode())

        return write

    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(folder, write_adapter=adapter("first"))
    with pytest.raises(OSError, match="disk full"):
        MedusaHeads(MedusaConfig(num_heads=3), tiny_llama).save_pretrained(folder, write_adapter=adapter("2nd", True))
    assert load_head(folder, tiny_llama).num_heads == 2
    assert (folder / "lora" / "adapter_config.json").read_text() == "first"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "lora", "model.safetensors"]
    MedusaHeads(MedusaConfig(num_heads=3), tiny_llama).save_pretrained(folder, write_adapter=adapter("second"))
    assert load_head(folder, tiny_llama).num_heads == 3
    assert (folder / "lora" / "adapter_model.safetensors").read_bytes() == b"second"


def test_lora_adapter_beside_a_head_is_merged_into_the_target(tmp_path, monkeypatch):
    """Medusa-2: the adapted target saved in <head>/lora is what decoding runs; merging must not change outputs."""
    from peft import LoraConfig, get_peft_model

    from specheads.heads import load_lora_adapter

    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    adapted = get_peft_model(make_tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # B starts at zero; make the adapter matter
        expected = adapted(ids).logits
        plain = make_tiny_llama()(ids).logits
    folder = tmp_path / "head"
    MedusaHeads(MedusaConfig(num_heads=2), make_tiny_llama()).save_pretrained(folder)
    adapted.save_pretrained(folder / "lora")
    merged = load_lora_adapter(make_tiny_llama(), folder)
    with torch.no_grad():
        got = merged(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, plain)
    assert not any(p.requires_grad for p in merged.parameters())
    untouched = make_tiny_llama()
    MedusaHeads(MedusaConfig(num_heads=2), untouched).save_pretrained(tmp_path / "no-adapter")
    assert load_lora_adapter(untouched, tmp_path / "no-adapter") is untouched

    # The same head as a Hub id (from the local Hub cache: no network here): its adapter is found and merged too.
    hub_merged = load_lora_adapter(make_tiny_llama(), in_local_hub_cache(folder, "someone/medusa2-head", monkeypatch))
    with torch.no_grad():
        torch.testing.assert_close(hub_merged(ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_a_pickled_lora_adapter_is_refused_and_never_unpickled(tmp_path, monkeypatch):
    """peft falls back to ``adapter_model.bin`` (a pickle) when a folder has no safetensors adapter: refused first,
    with how to convert it, and torch.load is never called."""
    from peft import LoraConfig, get_peft_model

    from specheads.heads import load_lora_adapter

    folder = tmp_path / "head"
    MedusaHeads(MedusaConfig(num_heads=2), make_tiny_llama()).save_pretrained(folder)
    adapted = get_peft_model(make_tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    adapted.save_pretrained(folder / "lora", safe_serialization=False)
    assert (folder / "lora" / "adapter_model.bin").is_file()
    assert not (folder / "lora" / "adapter_model.safetensors").exists()

    def no_unpickling(*args, **kwargs):
        raise AssertionError(f"torch.load was called on {args[0] if args else kwargs}")

    monkeypatch.setattr(torch, "load", no_unpickling)
    expected = r"has no adapter_model.safetensors \(found \[.*'adapter_model.bin'\]\); specheads reads adapter weights"
    with pytest.raises(HeadLoadError, match=expected + r" only from safetensors.*safe_serialization=True"):
        load_lora_adapter(make_tiny_llama(), folder)


def test_lora_adapter_on_a_bf16_target_stays_unmerged_so_small_updates_survive(tmp_path):
    """A trained LoRA update is small next to the weights it adapts: merged into bf16 weights it would mostly round
    away. On a bf16 target the adapter stays injected, and the loaded model computes what the adapted one did."""
    from peft import LoraConfig, get_peft_model

    from specheads.heads import load_lora_adapter

    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    adapted = get_peft_model(make_tiny_llama().to(torch.bfloat16), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 2e-3)  # an update of ~1e-3 of the weights' size, below half a bf16 step
        expected = adapted(ids).logits
        plain = make_tiny_llama().to(torch.bfloat16)(ids).logits
    folder = tmp_path / "head"
    MedusaHeads(MedusaConfig(num_heads=2), make_tiny_llama()).save_pretrained(folder)
    adapted.save_pretrained(folder / "lora")
    loaded = load_lora_adapter(make_tiny_llama().to(torch.bfloat16), folder)
    with torch.no_grad():
        got = loaded(ids).logits
    assert type(loaded).__name__ == "LlamaForCausalLM"  # a stock model, its layers carrying the adapter
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert not torch.equal(got, plain)
    assert not any(p.requires_grad for p in loaded.parameters())


@pytest.mark.parametrize(
    "where, value, message",
    [
        ((), "whole", "expected a JSON object, found a list"),
        (("config", "target"), None, "target: expected a mapping"),
        (("config", "num_heads"), "2", "num_heads: expected int, found str"),
        (("config", "target", "vocab_size"), "128", "target.vocab_size: expected int, found str"),
        (("config", "layer_ids"), [99], "one hidden-state index in \\[0, 4\\]"),
        (("head_type",), ["medusa"], "unknown head_type \\['medusa'\\]"),
        (("config", "num_heads"), 0, "needs num_heads >= 1 and num_layers >= 0, found num_heads=0, num_layers=1$"),
        (("config", "target", "weight_probe"), ["a"] * 4, "weight_probe: expected list\\[float\\], found list"),
    ],
)
def test_hand_edited_config_values_are_clear_errors(saved_medusa, tiny_llama, where, value, message):
    """Values of the wrong type or out of range were raw AttributeError/TypeError, or loaded silently."""
    path = saved_medusa / "config.json"
    meta = json.loads(path.read_text())
    if where:
        node = meta
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value
    path.write_text(json.dumps(meta if where else [meta]))
    with pytest.raises((HeadLoadError, HeadConfigError), match=message):
        load_head(saved_medusa, tiny_llama)


@pytest.mark.parametrize(
    "edit, message",
    [
        (dict(intermediate_size="128"), r"cannot be built \(StrictDataclassFieldValidationError: .*intermediate_size"),
        (dict(num_attention_heads=3), r"cannot be built .*not a multiple of the number of attention heads \(3\)"),
        (dict(head_dim=0), r"describes a EagleHead that cannot be built \(ZeroDivisionError"),
    ],
)
def test_a_hand_edited_llama_layer_that_builds_no_layer_is_a_config_error(tiny_llama, tmp_path, edit, message):
    """Values no Llama layer takes came out of transformers' config validation or the rotary setup as tracebacks
    (through `specheads generate` and `export` too, which print config errors as one line)."""
    EagleHead(EagleConfig(version=3, draft_layer="llama"), tiny_llama).save_pretrained(tmp_path)
    _edit_config(tmp_path, lambda meta: meta["config"]["llama_layer"].update(edit))
    with pytest.raises(HeadConfigError, match=message):
        load_head(tmp_path, tiny_llama)


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("fc.weight", lambda t: (t * 100).to(torch.int8), "fc.weight: expected float, found integer"),
        ("fc.weight", lambda t: t > 0, "fc.weight: expected float, found bool"),
        ("d2t", lambda t: t.float() + 0.6, "d2t: expected integer, found float"),
        ("t2d", lambda t: torch.roll(t, 1), r"t2d is not the inverse of d2t \(\d+ entries differ\)"),
        ("d2t", lambda t: torch.zeros_like(t), "d2t must name 48 distinct target token ids in \\[0, 128\\)"),
    ],
)
def test_tensors_of_another_kind_or_inconsistent_vocabulary_maps_are_refused(
    tiny_llama, tmp_path, name, change, message
):
    """The strict loader checked names and shapes only: an int8 or bool weight, or a float d2t, were converted on
    load without a word, and a t2d that contradicts d2t scored drafts against other tokens than it proposed."""
    _heads(tiny_llama)["eagle3-reduced"].save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors[name] = change(tensors[name])
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(HeadLoadError, match=message):
        load_head(tmp_path, tiny_llama)


def test_a_head_saved_in_another_float_width_still_loads(tiny_llama, tmp_path):
    head = _heads(tiny_llama)["eagle3-reduced"]
    head.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    save_file(
        {k: v.bfloat16() if v.is_floating_point() else v for k, v in tensors.items()}, tmp_path / "model.safetensors"
    )
    assert torch.equal(load_head(tmp_path, tiny_llama).d2t, head.d2t)


def test_medusa_heads_rebuilt_for_loading_do_not_read_the_targets_lm_head(tiny_llama):
    """The final save of a Medusa-2 run rebuilds the heads on the adapted target, which ZeRO-3 (or FSDP) holds as a
    partition: an lm_head weight of shape (0,). A rebuild for loading must not copy from it; the load sets it."""
    import copy

    heads = MedusaHeads(MedusaConfig(num_heads=2, share_lm_head=False), tiny_llama)
    partitioned = make_tiny_llama()
    partitioned.lm_head.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    with pytest.raises(RuntimeError):
        MedusaHeads(copy.deepcopy(heads.config), partitioned)  # a fresh head does copy the target's lm_head
    rebuilt = MedusaHeads.for_loading(copy.deepcopy(heads.config), partitioned)
    rebuilt.load_state_dict(heads.state_dict(), strict=True)
    for name, tensor in heads.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[name], tensor), name


def test_a_loaded_medusa2_head_saves_with_its_adapter(tmp_path):
    """Saving a loaded Medusa-2 head (into another folder, or back into its own to cast it) wrote no adapter and
    deleted the folder's own lora/: the head then loaded onto the bare target as Medusa-1, without a word."""
    from peft import LoraConfig, get_peft_model

    from specheads.heads import apply_lora_adapter

    folder = tmp_path / "head"
    adapted = get_peft_model(make_tiny_llama(), LoraConfig(r=4, target_modules=["q_proj"]))
    MedusaHeads(MedusaConfig(num_heads=2), make_tiny_llama()).save_pretrained(
        folder, write_adapter=lambda path: adapted.save_pretrained(path)
    )
    adapter = (folder / "lora" / "adapter_model.safetensors").read_bytes()
    target, applied = apply_lora_adapter(make_tiny_llama(), folder)
    head = load_head(folder, target, adapter_applied=applied)
    for out in (tmp_path / "copy", folder):
        head.save_pretrained(out)
        assert json.loads((out / "config.json").read_text())["lora_adapter"] is True
        assert (out / "lora" / "adapter_model.safetensors").read_bytes() == adapter
        assert "# Medusa-2 heads" in (out / "README.md").read_text()
        with pytest.warns(UserWarning, match="trained jointly with a LoRA adapter"):
            load_head(out, make_tiny_llama())
