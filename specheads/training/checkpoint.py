"""Atomic training checkpoints on top of ``accelerator.save_state``.

Every rank writes into ``checkpoints/.tmp-step-N``; once all are done the main process writes ``trainer_state.json``
last and renames the folder to ``checkpoints/step-N``. A rename is atomic, so a run killed mid-save leaves only a
``.tmp-*`` folder that resume ignores (and the next save removes), never a ``step-*`` folder that loads half.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator

PREFIX = "step-"
TMP_PREFIX = ".tmp-"
STATE_FILE = "trainer_state.json"


def checkpoint_root(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / "checkpoints"


def _name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def save_checkpoint(accelerator: Accelerator, output_dir: str | os.PathLike, step: int, keep_last: int) -> Path:
    """Save the full training state (model, optimizer, scheduler, RNG, sampler) atomically; keep the last K."""
    root = checkpoint_root(output_dir)
    final = root / _name(step)
    tmp = root / f"{TMP_PREFIX}{_name(step)}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _write_json_durably(tmp / STATE_FILE, {"step": step})
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        prune_checkpoints(root, keep_last)
    accelerator.wait_for_everyone()
    return final


def completed_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Finished checkpoints, oldest first (a folder counts only once its state file was written and renamed)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: read_step(p))


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    done = completed_checkpoints(output_dir)
    return done[-1] if done else None


def read_step(checkpoint: str | os.PathLike) -> int:
    path = Path(checkpoint) / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{checkpoint} is not a complete checkpoint (no {STATE_FILE}); expected a folder "
            f"{checkpoint_root('OUTPUT_DIR')}/{PREFIX}NNNNNNNN written by a training run."
        )
    return int(json.loads(path.read_text())["step"])


def resolve_resume(resume: str, output_dir: str | os.PathLike) -> Path | None:
    """``no`` -> None; ``auto`` -> the latest checkpoint in ``output_dir`` (None if there is none); else a path."""
    if resume == "no":
        return None
    if resume == "auto":
        return latest_checkpoint(output_dir)
    path = Path(resume)
    read_step(path)  # fails loudly if incomplete
    return path


def prune_checkpoints(root: Path, keep_last: int) -> None:
    for old in completed_checkpoints(root.parent)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def _write_json_durably(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
