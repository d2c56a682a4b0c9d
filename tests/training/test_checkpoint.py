"""Checkpoint discovery: only folders whose state file was written and renamed count; pruning keeps the last K;
a new run never shares an output folder with another run's checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specheads.training.checkpoint import (
    CONFIG_FILE,
    STATE_FILE,
    checkpoint_root,
    completed_checkpoints,
    latest_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from specheads.training.checkpoint_damage import file_sha256
from specheads.training.config import load_config
from specheads.training.loop import train
from specheads.training.resume import resolve_resume
from tests.training.train_helpers import REPO, tiny_overrides


def _fake(output_dir, name, step=None):
    folder = checkpoint_root(output_dir) / name
    folder.mkdir(parents=True)
    if step is not None:
        (folder / STATE_FILE).write_text(json.dumps({"step": step}))
    return folder


def test_half_written_checkpoints_are_ignored(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    assert resolve_resume("auto", tmp_path) is None  # nothing to resume: start fresh
    _fake(tmp_path, "step-00000002", step=2)
    _fake(tmp_path, "step-00000010", step=10)
    _fake(tmp_path, ".tmp-step-00000012", step=12)  # killed before the rename
    broken = _fake(tmp_path, "step-00000011")  # no state file
    assert latest_checkpoint(tmp_path).name == "step-00000010"
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        resolve_resume(str(broken), tmp_path)


def test_prune_keeps_the_newest(tmp_path):
    for step in (1, 2, 3, 4):
        _fake(tmp_path, f"step-{step:08d}", step=step)
    prune_checkpoints(checkpoint_root(tmp_path), keep_last=2)
    assert [p.name for p in completed_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]


def test_a_new_run_refuses_an_output_folder_holding_checkpoints(tiny_target_dir, small_chat_file, tmp_path):
    """With train.resume=no the new run's low steps would be pruned in favour of the old run's higher ones, and a
    later train.resume=auto would continue the old run: refuse before anything runs, naming the two ways out."""
    assert resolve_resume("no", tmp_path) is None
    _fake(tmp_path, "step-00000004", step=4)
    _fake(tmp_path, ".tmp-step-00000001", step=1)  # a half-written save alone would not count
    expected = r"checkpoints already holds checkpoints of a run \(step-00000004\).*train.resume=auto.*train.output_dir"
    with pytest.raises(ValueError, match=expected):
        resolve_resume("no", tmp_path)
    cfg = load_config(
        REPO / "configs" / "medusa" / "smollm2-135m.yaml", tiny_overrides(tiny_target_dir, small_chat_file, tmp_path)
    )
    assert cfg.train.resume == "no"
    with pytest.raises(ValueError, match=expected):
        train(cfg)
    assert [p.name for p in completed_checkpoints(tmp_path)] == ["step-00000004"]


def test_a_save_removes_half_written_checkpoints_of_any_step(tmp_path):
    from accelerate import Accelerator

    accelerator = Accelerator()
    _fake(tmp_path, ".tmp-step-00000005")  # a save killed half-way at step 5
    for step in (6, 8):
        save_checkpoint(accelerator, tmp_path, step, keep_last=1, config_yaml="train:\n  lr: 0.001\n")
    assert sorted(p.name for p in checkpoint_root(tmp_path).iterdir()) == ["step-00000008"]
    assert (checkpoint_root(tmp_path) / "step-00000008" / CONFIG_FILE).read_text() == "train:\n  lr: 0.001\n"


def test_resume_refuses_a_checkpoint_whose_weights_do_not_fit_the_model(tiny_target_dir, small_chat_file, tmp_path):
    """The load-state hook loads the checkpoint's weights non-strictly (frozen weights are left out of it), then
    checks: a trainable tensor missing from the file, or a tensor the model does not have, is an error instead of a
    resumed run that silently keeps a fresh initialisation or ignores trained weights."""
    import re

    from safetensors.torch import load_file, save_file

    from specheads.training.config import ConfigError

    medusa = REPO / "configs" / "medusa" / "smollm2-135m.yaml"
    kw = dict(max_steps=2, batch_size=2, save_every=1)

    def run(**changes):
        overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path, **{**kw, **changes})
        return train(load_config(medusa, ["data.max_samples=16", "head.options.num_heads=1", *overrides]))

    assert run(stop_after=1).step == 1
    weights_file = latest_checkpoint(tmp_path) / "model.safetensors"
    saved = load_file(str(weights_file))
    dropped = sorted(saved)[0]
    stray = {**saved, "head.stray.weight": torch.zeros(3)}
    for edited, found in [
        ({k: v for k, v in saved.items() if k != dropped}, rf"missing trainable tensors \['{re.escape(dropped)}'\]"),
        (stray, r"missing trainable tensors \[\], unexpected tensors \['head.stray.weight'\]"),
    ]:
        save_file(edited, str(weights_file))
        _record_as_written(weights_file)  # a whole file of other tensors, as another config's checkpoint holds
        with pytest.raises(ConfigError, match=rf"model.safetensors does not match the model being trained \({found}"):
            run(resume="auto")
    save_file(saved, str(weights_file))  # the checkpoint as it was written resumes
    _record_as_written(weights_file)
    resumed = run(resume="auto")
    assert resumed.finished and resumed.step == 2


def _record_as_written(path: Path) -> None:
    """Record ``path``'s size and digest in its checkpoint's list of written files (else a resume reads it as
    damaged)."""
    state_file = path.parent / STATE_FILE
    state = json.loads(state_file.read_text())
    state["files"][path.name] = path.stat().st_size
    state["sha256"][path.name] = file_sha256(path)
    state_file.write_text(json.dumps(state))
