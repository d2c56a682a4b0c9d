"""Damaged checkpoints: which files of a checkpoint do not read back whole, and what a resume does about it.

A checkpoint folder is renamed into place only once complete (``checkpoint.save_checkpoint``), so damage comes later:
a disk that filled, a copy cut short, a bit flipped. A resume names the damaged file and falls back to the newest
checkpoint whose weights, optimizer and schedule read back; damaged random or sampler state only costs exactness,
which the run says in a warning.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import safetensors.torch

from specheads.training.config import ConfigError

logger = logging.getLogger("specheads.training.checkpoint")

NEEDED_FILES = ("model*.safetensors", "optimizer*.bin", "scheduler*.bin", "pytorch_model*.bin", "scaler.pt")
"""What ``accelerator.save_state`` writes that a resume cannot go on without: weights, optimizer and schedule."""
EXACTNESS_FILES = ("random_states_*.pkl", "sampler*.bin")
"""What a resume can go on without, no longer exactly: the random generators' and the data sampler's state."""


def damaged_files(checkpoint: Path, patterns: tuple[str, ...]) -> list[str]:
    """``FILE is damaged (why)`` for each file under ``patterns`` in ``checkpoint`` that does not read back whole.
    Torch's files are zip archives whose CRCs cover every byte; a safetensors file reads all its tensors."""
    found = []
    for path in sorted(p for pattern in patterns for p in checkpoint.glob(pattern) if p.is_file()):
        try:
            if path.suffix == ".safetensors":
                safetensors.torch.load_file(str(path))
            else:
                with zipfile.ZipFile(path) as archive:
                    if bad := archive.testzip():
                        raise zipfile.BadZipFile(f"member {bad} fails its CRC check")
        except Exception as err:  # noqa: BLE001 - each reader has its own error types for a corrupt file
            found.append(f"{path} is damaged ({type(err).__name__}: {(str(err).splitlines() or [''])[0]})")
    return found


def newest_intact(found: list[Path]) -> Path:
    """The newest checkpoint of ``found`` (oldest first) whose needed files read back; each damaged newer one is a
    warning that names its file. None intact is an error: starting over would discard the run silently."""
    problems = []
    for checkpoint in reversed(found):
        damage = damaged_files(checkpoint, NEEDED_FILES)
        if not damage:
            if problems:
                logger.warning("resuming from %s instead, the newest complete checkpoint", checkpoint)
            return checkpoint
        logger.warning("train.resume=auto: skipping checkpoint %s: %s", checkpoint.name, "; ".join(damage))
        problems.extend(damage)
    raise ConfigError(
        f"train.resume=auto: no checkpoint in {found[0].parent} reads back whole ({'; '.join(problems)}); expected "
        "at least one complete checkpoint. Start a new run in another train.output_dir."
    )


def warn_if_inexact(checkpoint: Path) -> Path:
    if damage := damaged_files(checkpoint, EXACTNESS_FILES):
        logger.warning(
            "resuming from %s will not be exact: %s; training goes on from its weights and optimizer state with "
            "fresh random and data-order state, so it will not reproduce an uninterrupted run",
            checkpoint,
            "; ".join(damage),
        )
    return checkpoint
