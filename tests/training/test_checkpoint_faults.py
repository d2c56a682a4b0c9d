"""Damaged checkpoints on resume: the damaged file is named, the run falls back to the newest complete checkpoint,
and damage that only costs exactness (random or sampler state) is a warning. Docs: docs/reliability.md."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specheads.training.checkpoint import checkpoint_root, completed_checkpoints
from specheads.training.checkpoint_damage import exactness_damage, needed_damage
from specheads.training.config import ConfigError, load_config
from specheads.training.loop import train
from specheads.training.resume import resolve_resume
from tests.training.train_helpers import REPO, tiny_overrides

MEDUSA = REPO / "configs" / "medusa" / "smollm2-135m.yaml"


def _train(target: Path, chats: Path, out: Path, **changes: object):
    settings = dict(max_steps=3, batch_size=2, save_every=1, keep_last=3) | changes
    overrides = tiny_overrides(target, chats, out, **settings)
    return train(load_config(MEDUSA, ["data.max_samples=16", "head.options.num_heads=1", *overrides]))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.fixture(scope="module")
def runs(tiny_target_dir, small_chat_file, tmp_path_factory) -> dict[str, Path]:
    """An uninterrupted 3-step run, and one stopped after step 2 with checkpoints at steps 1 and 2."""
    root = tmp_path_factory.mktemp("faults")
    assert _train(tiny_target_dir, small_chat_file, root / "whole").finished
    assert _train(tiny_target_dir, small_chat_file, root / "stopped", stop_after=2).step == 2
    return {"root": root, "whole": root / "whole", "stopped": root / "stopped"}


def _copy(runs: dict[str, Path], name: str) -> Path:
    out = runs["root"] / name
    shutil.copytree(runs["stopped"], out)
    return out


@pytest.mark.parametrize("damaged", ["model.safetensors", "optimizer.bin"])
def test_a_truncated_file_in_the_newest_checkpoint_falls_back_with_a_warning_naming_it(
    runs, damaged, tiny_target_dir, small_chat_file, caplog
):
    """Before: a SafetensorError or a PytorchStreamReader error, naming neither the file nor a way out."""
    out = _copy(runs, f"truncated-{damaged}")
    newest = checkpoint_root(out) / "step-00000002"
    _truncate(newest / damaged)
    with pytest.raises(ConfigError, match=rf"train.resume={newest}: {newest / damaged} is damaged"):
        resolve_resume(str(newest), out)  # named explicitly: an error, with the way out
    caplog.set_level(logging.INFO)
    resumed = _train(tiny_target_dir, small_chat_file, out, resume="auto")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"skipping checkpoint step-00000002: {newest / damaged} is damaged" in w for w in warnings), warnings
    assert any("resuming from" in w and "step-00000001" in w for w in warnings), warnings
    assert resumed.finished and resumed.step == 3
    # resumed from the complete step-1 checkpoint, the run ends where the uninterrupted one did
    whole, fallback = load_file(str(runs["whole"] / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(torch.equal(whole[name], fallback[name]) for name in whole)


def test_a_bit_flipped_inside_a_safetensors_tensor_falls_back_like_a_truncated_file(runs, caplog):
    """A flipped bit keeps the file's size and header, so it read back whole and resumed wrong weights silently;
    each checkpoint now records its safetensors files' SHA-256."""
    out = _copy(runs, "bit-flip")
    newest = checkpoint_root(out) / "step-00000002"
    weights = newest / "model.safetensors"
    recorded = json.loads((newest / "trainer_state.json").read_text())
    assert set(recorded["sha256"]) == set(recorded["files"])  # every file: FSDP's shards carry no checksum either
    assert len(recorded["sha256"]["model.safetensors"]) == 64
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # the last byte of the last tensor: the header and size are unchanged
    weights.write_bytes(bytes(data))
    load_file(str(weights))  # still loads: only the recorded digest tells
    with pytest.raises(ConfigError, match=rf"{weights} is damaged or replaced \(its SHA-256 differs"):
        resolve_resume(str(newest), out)
    caplog.set_level(logging.WARNING)
    assert resolve_resume("auto", out) == checkpoint_root(out) / "step-00000001"
    assert any(f"skipping checkpoint step-00000002: {weights} is damaged" in r.getMessage() for r in caplog.records)


def test_damaged_random_state_resumes_with_a_warning_that_it_is_not_exact(runs, caplog):
    out = _copy(runs, "damaged-rng")
    newest = checkpoint_root(out) / "step-00000002"
    _truncate(newest / "random_states_0.pkl")
    caplog.set_level(logging.WARNING)
    assert resolve_resume("auto", out) == newest  # weights and optimizer are whole: no fallback
    assert any(
        "will not be exact" in r.getMessage() and "random_states_0.pkl is damaged" in r.getMessage()
        for r in caplog.records
    )


def test_no_complete_checkpoint_left_is_an_error_naming_each_damaged_file(runs):
    out = _copy(runs, "all-damaged")
    for checkpoint in completed_checkpoints(out):
        _truncate(checkpoint / "optimizer.bin")
    with pytest.raises(ConfigError, match=r"no checkpoint in .* reads back whole .*step-00000002/optimizer.bin"):
        resolve_resume("auto", out)


def test_an_intact_checkpoint_has_no_damaged_files(runs):
    newest = completed_checkpoints(runs["stopped"])[-1]
    assert needed_damage(newest) == [] and exactness_damage(newest) == []
    assert {p.name for p in newest.iterdir()} >= {"model.safetensors", "optimizer.bin", "random_states_0.pkl"}


def test_a_file_whose_recorded_digest_matches_is_not_read_a_second_time(runs, monkeypatch):
    """Before: a resume hashed model.safetensors and then loaded all its tensors as well; a checkpoint from before
    the digests (no sha256 record) is still read back whole."""
    import specheads.training.checkpoint_damage as damage

    loaded = []
    monkeypatch.setattr(damage.safetensors.torch, "load_file", lambda path: loaded.append(Path(path).name) or {})
    newest = completed_checkpoints(runs["stopped"])[-1]
    assert needed_damage(newest) == [] and loaded == []
    out = _copy(runs, "no-digests")
    older = completed_checkpoints(out)[-1]
    state = json.loads((older / "trainer_state.json").read_text())
    del state["sha256"]
    (older / "trainer_state.json").write_text(json.dumps(state))
    assert needed_damage(older) == [] and loaded == ["model.safetensors"]


def test_a_missing_file_falls_back_like_a_damaged_one(runs, tiny_target_dir, small_chat_file, caplog):
    """Before: only files present were checked, so a checkpoint without its optimizer.bin counted as intact and the
    resume failed instead of falling back. Checkpoints record what they wrote (any engine's layout)."""
    out = _copy(runs, "missing-optimizer")
    newest = checkpoint_root(out) / "step-00000002"
    recorded = json.loads((newest / "trainer_state.json").read_text())
    assert recorded["num_processes"] == 1 and recorded["files"]["optimizer.bin"] > 0
    (newest / "optimizer.bin").unlink()
    with pytest.raises(ConfigError, match=rf"train.resume={newest}: {newest / 'optimizer.bin'} is missing"):
        resolve_resume(str(newest), out)
    caplog.set_level(logging.WARNING)
    assert resolve_resume("auto", out) == checkpoint_root(out) / "step-00000001"
    assert any(f"{newest / 'optimizer.bin'} is missing" in r.getMessage() for r in caplog.records)


def test_after_a_fallback_the_newer_checkpoint_is_set_aside_not_kept_in_place_of_the_runs_saves(
    runs, tiny_target_dir, small_chat_file
):
    """Before: pruning ranked by step, so a damaged newer checkpoint outlived the resumed run's own saves: with
    keep_last=1 each save deleted the one before it, and the next resume found nothing whole."""
    out = runs["root"] / "set-aside"
    shutil.copytree(runs["whole"], out)
    shutil.rmtree(checkpoint_root(out) / "step-00000002")  # steps 1 and 3 left; 3 is damaged
    _truncate(checkpoint_root(out) / "step-00000003" / "model.safetensors")
    resumed = _train(tiny_target_dir, small_chat_file, out, resume="auto", keep_last=1)  # from step 1, saves 2 and 3
    assert resumed.finished and resumed.step == 3
    assert [p.name for p in completed_checkpoints(out)] == ["step-00000003"]
    assert needed_damage(checkpoint_root(out) / "step-00000003") == []  # the resumed run's own save
    assert (checkpoint_root(out) / "abandoned-step-00000003" / "model.safetensors").is_file()  # kept, not resumed
    whole, again = load_file(str(runs["whole"] / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(torch.equal(whole[name], again[name]) for name in whole)


def test_a_resume_with_another_number_of_processes_is_refused(runs, tiny_target_dir, small_chat_file, monkeypatch):
    """Before: a 2-process checkpoint resumed on 1 process read its schedule (ticked once per process per step) as
    twice as far along, and skipped to another data position, without a word. Refused before the target loads."""
    import specheads.training.loop as loop

    out = _copy(runs, "other-world")
    state_file = checkpoint_root(out) / "step-00000002" / "trainer_state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "num_processes": 2}))
    monkeypatch.setattr(loop, "load_target", lambda *a, **k: pytest.fail("the target loaded before the refusal"))
    with pytest.raises(ConfigError, match=r"with 1 processes, but a launch of 2 wrote it.*--num_processes 2"):
        _train(tiny_target_dir, small_chat_file, out, resume="auto")


def test_a_state_file_that_does_not_read_is_skipped_by_auto_and_named_when_given(runs, caplog):
    """A trainer_state.json cut short was a JSONDecodeError traceback out of every resume, `auto` included, instead
    of a fallback to the checkpoint before it."""
    out = _copy(runs, "damaged-state")
    newest = checkpoint_root(out) / "step-00000002"
    (newest / "trainer_state.json").write_text("{")
    caplog.set_level(logging.WARNING)
    assert resolve_resume("auto", out) == checkpoint_root(out) / "step-00000001"
    assert any(f"{newest / 'trainer_state.json'} is damaged" in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigError, match=rf"{newest / 'trainer_state.json'} is damaged \(JSONDecodeError"):
        resolve_resume(str(newest), out)


@pytest.mark.parametrize("state", ["{", None])
def test_no_run_starts_over_a_folder_whose_only_checkpoint_no_longer_reads(runs, state):
    """Before: completed_checkpoints skipped the unreadable checkpoint, so train.resume=no and auto started a new run
    beside it, whose save of that step then deleted it. A folder without its state file is a checkpoint too."""
    out = _copy(runs, f"unreadable-new-run-{state is None}")
    shutil.rmtree(checkpoint_root(out) / "step-00000001")
    state_file = checkpoint_root(out) / "step-00000002" / "trainer_state.json"
    if state is None:
        state_file.unlink()
    else:
        state_file.write_text(state)
    assert completed_checkpoints(out) == []
    with pytest.raises(ConfigError, match=r"resume=no starts a new run, but .* holds checkpoints .*step-00000002"):
        resolve_resume("no", out)
    with pytest.raises(ConfigError, match=r"resume=auto: no checkpoint .* has a readable trainer_state.json"):
        resolve_resume("auto", out)


def test_a_record_of_another_shape_is_damage_to_the_state_file(runs, caplog):
    out = _copy(runs, "misshapen-record")
    newest = checkpoint_root(out) / "step-00000002"
    state_file = newest / "trainer_state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "sha256": ["not", "a", "map"]}))
    with pytest.raises(ConfigError, match=rf"{state_file} is damaged \(its files and sha256 entries are not"):
        resolve_resume(str(newest), out)
    caplog.set_level(logging.WARNING)
    assert resolve_resume("auto", out) == checkpoint_root(out) / "step-00000001"


def test_a_save_over_a_checkpoint_whose_state_no_longer_reads_keeps_it_aside(runs, tiny_target_dir, small_chat_file):
    out = _copy(runs, "unreadable-same-step")
    (checkpoint_root(out) / "step-00000002" / "trainer_state.json").write_text("{")
    assert _train(tiny_target_dir, small_chat_file, out, resume="auto").finished  # from step 1, saves 2 and 3
    assert (checkpoint_root(out) / "abandoned-step-00000002" / "model.safetensors").is_file()
    assert [p.name for p in completed_checkpoints(out)] == ["step-00000001", "step-00000002", "step-00000003"]


def test_resuming_an_earlier_checkpoint_sets_the_later_one_of_the_same_step_aside(
    runs, tiny_target_dir, small_chat_file
):
    """A save at a step whose checkpoint was already there deleted it, while later ones were kept aside."""
    out = _copy(runs, "named-earlier")
    earlier = checkpoint_root(out) / "step-00000001"
    assert _train(tiny_target_dir, small_chat_file, out, resume=str(earlier)).finished
    assert (checkpoint_root(out) / "abandoned-step-00000002" / "model.safetensors").is_file()
    assert [p.name for p in completed_checkpoints(out)] == ["step-00000001", "step-00000002", "step-00000003"]
