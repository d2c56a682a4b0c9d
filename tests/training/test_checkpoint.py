"""Checkpoint discovery: only folders whose state file was written and renamed count; pruning keeps the last K."""

from __future__ import annotations

import json

import pytest

from specheads.training.checkpoint import (
    STATE_FILE,
    checkpoint_root,
    completed_checkpoints,
    latest_checkpoint,
    prune_checkpoints,
    resolve_resume,
)


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
    assert resolve_resume("no", tmp_path) is None
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        resolve_resume(str(broken), tmp_path)


def test_prune_keeps_the_newest(tmp_path):
    for step in (1, 2, 3, 4):
        _fake(tmp_path, f"step-{step:08d}", step=step)
    prune_checkpoints(checkpoint_root(tmp_path), keep_last=2)
    assert [p.name for p in completed_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
