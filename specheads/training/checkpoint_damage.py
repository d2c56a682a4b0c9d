"""Damaged checkpoints: which files of a checkpoint do not read back whole, and what a resume does about it.

A checkpoint folder is renamed into place only once complete (``checkpoint.save_checkpoint``), so damage comes later:
a disk that filled, a copy cut short, a file removed. A resume names the damaged file and falls back to the newest
checkpoint whose weights, optimizer and schedule read back; damaged random or sampler state only costs exactness,
which the run says in a warning. Every file is checked against the size and SHA-256 recorded when it was written
(a bit flipped inside a tensor keeps a safetensors file's size and header, and FSDP's shards carry no checksum); in
a checkpoint from before the digests, the top-level weights, optimizer and schedule files read back instead: torch's
zip files against their CRCs, safetensors files tensor by tensor.
"""

from __future__ import annotations

import json
import logging
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import safetensors.torch

from specheads.heads.base import CHECKPOINT_STATE_NAME
from specheads.heads.files import hash_file
from specheads.training.config import ConfigError

logger = logging.getLogger("specheads.training.checkpoint")

NEEDED_FILES = ("model*.safetensors", "optimizer*.bin", "scheduler*.bin", "pytorch_model*.bin", "scaler.pt")
"""What ``accelerator.save_state`` writes that a resume cannot go on without: weights, optimizer and schedule."""
EXACTNESS_FILES = ("random_states_*.pkl", "sampler*.bin")
"""What a resume can go on without, no longer exactly: the random generators' and the data sampler's state."""
CONFIG_FILE = "train_config.yaml"
RANK_STATE = "rank_state_{rank}.json"
"""Each rank's logging window: like the config, read with a warning of its own, never a reason to fall back."""


def file_sha256(path: Path) -> str:
    return hash_file(path).hexdigest()


def needed_damage(checkpoint: Path) -> list[str]:
    """What is wrong with the files a resume cannot go on without (``NEEDED_FILES``, and every file the checkpoint
    recorded writing outside ``EXACTNESS_FILES``: FSDP and DeepSpeed write folders of their own)."""
    return damaged_files(checkpoint, NEEDED_FILES, exactness=False)


def exactness_damage(checkpoint: Path) -> list[str]:
    """What is wrong with the random and data-sampler states (``EXACTNESS_FILES``)."""
    return damaged_files(checkpoint, EXACTNESS_FILES, exactness=True)


def damaged_files(checkpoint: Path, patterns: tuple[str, ...], exactness: bool) -> list[str]:
    """``FILE is missing`` or ``FILE is damaged (why)`` for each file of one kind in ``checkpoint``: a recorded file
    that is gone or another size than written, and a file under ``patterns`` that does not read back whole (torch's
    files are zip archives whose CRCs cover every byte; a safetensors file reads all its tensors). A file whose
    recorded SHA-256 matches holds the bytes written, so it is not read a second time."""
    found, verified = _against_record(checkpoint, exactness)
    candidates = {p for pattern in patterns for p in checkpoint.glob(pattern) if p.is_file()}
    for path in sorted(candidates - set(found) - verified):
        try:
            if path.suffix == ".safetensors":
                safetensors.torch.load_file(str(path))
            else:
                with zipfile.ZipFile(path) as archive:
                    if bad := archive.testzip():
                        raise zipfile.BadZipFile(f"member {bad} fails its CRC check")
        except Exception as err:  # noqa: BLE001 - each reader has its own error types for a corrupt file
            found[path] = f"{path} is damaged ({type(err).__name__}: {(str(err).splitlines() or [''])[0]})"
    return list(found.values())


def _against_record(checkpoint: Path, exactness: bool) -> tuple[dict[Path, str], set[Path]]:
    """The files of one kind the checkpoint records writing (the random and sampler states, or everything else a
    resume reads) that are gone, another size than written or, where a digest was recorded, other bytes; none for a
    checkpoint from before the record. A record of another shape is damage to the state file itself. Second: the
    files whose recorded digest matched."""
    state_file = checkpoint / CHECKPOINT_STATE_NAME
    try:
        state = json.loads(state_file.read_text())
        recorded, digests = state.get("files") or {}, state.get("sha256") or {}
    except (OSError, ValueError, AttributeError):
        return {}, set()  # read_step names an unreadable state file
    if not (isinstance(recorded, dict) and isinstance(digests, dict)):
        why = f"{state_file} is damaged (its files and sha256 entries are not name -> value maps)"
        return ({} if exactness else {state_file: why}), set()
    found, verified = {}, set()
    for name, size in recorded.items():
        if fnmatch(name, RANK_STATE.format(rank="*")) or name == CONFIG_FILE:
            continue  # the logging window and the config: each read with its own warning
        if any(fnmatch(name, pattern) for pattern in EXACTNESS_FILES) != exactness:
            continue
        path = checkpoint / name
        if not path.is_file():
            found[path] = f"{path} is missing"
        elif path.stat().st_size != size:
            found[path] = f"{path} is damaged ({path.stat().st_size} bytes, written as {size})"
        elif name in digests:
            if file_sha256(path) != digests[name]:
                found[path] = f"{path} is damaged or replaced (its SHA-256 differs from the one recorded when written)"
            else:
                verified.add(path)
    return found, verified


def newest_intact(found: list[Path]) -> Path:
    """The newest checkpoint of ``found`` (oldest first) whose needed files read back; each damaged newer one is a
    warning that names its file. None intact is an error: starting over would discard the run silently."""
    problems = []
    for checkpoint in reversed(found):
        damage = needed_damage(checkpoint)
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
    if damage := exactness_damage(checkpoint):
        logger.warning(
            "resuming from %s will not be exact: %s; training goes on from its weights and optimizer state with "
            "fresh random and data-order state, so it will not reproduce an uninterrupted run",
            checkpoint,
            "; ".join(damage),
        )
    return checkpoint
