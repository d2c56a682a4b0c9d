"""Atomic training checkpoints on top of ``accelerator.save_state``.

Every rank writes into ``checkpoints/.tmp-step-N``; once all are done the main process writes the run's config and
``trainer_state.json`` last and renames the folder to ``checkpoints/step-N``. A rename is atomic, so a run killed
mid-save leaves only a ``.tmp-*`` folder that resume ignores (and the next save removes), never a ``step-*`` folder
that loads half.

A checkpoint belongs to one run: a new run (``train.resume=no``) refuses an output folder that holds checkpoints, and a
resumed run must keep the settings its restored optimizer, scheduler and data order were made with
(``training/resume.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from filelock import FileLock, Timeout

from specheads.heads.base import CHECKPOINT_STATE_NAME
from specheads.training.checkpoint_damage import CONFIG_FILE, RANK_STATE, file_sha256
from specheads.training.config import ConfigError

logger = logging.getLogger(__name__)

PREFIX = "step-"
TMP_PREFIX = ".tmp-"
ABANDONED_PREFIX = "abandoned-"
STATE_FILE = CHECKPOINT_STATE_NAME
WEIGHTS_FILE = "model.safetensors"  # what ``accelerator.save_state`` names the first model's weights

LOCK_NAME = ".specheads-train.lock"


@contextlib.contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """One live training run per output folder. The launch's rank 0 holds an OS file lock in it for the whole run;
    the OS drops it when the process ends, however it ends, so a killed run leaves nothing to clean up. A second run
    into the same folder (a relaunch while a killed launcher's ranks still train, or two runs given one
    ``train.output_dir``) stops at once instead of interleaving its checkpoints and head with the other's."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out / LOCK_NAME), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise ConfigError(
            f"{out} is being written by another training run, which holds {out / LOCK_NAME}; wait for it to end or "
            "stop it (a launcher killed with SIGKILL can leave its ranks running: see `ps`), or choose another "
            "train.output_dir"
        ) from None
    try:
        yield
    finally:
        lock.release()


def checkpoint_root(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / "checkpoints"


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def save_checkpoint(
    accelerator: Accelerator,
    output_dir: str | os.PathLike,
    step: int,
    keep_last: int,
    config_yaml: str,
    data_digest: str | None = None,
    rank_state: dict[str, Any] | None = None,
) -> Path:
    """Save the full training state (model, optimizer, scheduler, RNG, sampler), the run's config (``to_yaml``), a
    digest of its data (``data_digest``) and each rank's own JSON state (``rank_state``: the logging window)
    atomically; keep the last K. Half-written ``.tmp-*`` folders of killed saves are removed first."""
    root = checkpoint_root(output_dir)
    final = root / checkpoint_name(step)
    tmp = root / f"{TMP_PREFIX}{checkpoint_name(step)}"
    if accelerator.is_main_process:
        for stale in root.glob(f"{TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), **_engine_kwargs(accelerator, exclude_frozen_parameters=True))
    if rank_state is not None:
        (tmp / RANK_STATE.format(rank=accelerator.process_index)).write_text(json.dumps(rank_state))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / CONFIG_FILE).write_text(config_yaml)
        _fsync_tree(tmp)  # every file on disk before the marker: a power loss cannot leave a "complete" half
        files = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
        digests = {name: file_sha256(tmp / name) for name in files}
        state = {
            "step": step,
            "data_digest": data_digest,
            "num_processes": accelerator.num_processes,
            "files": files,
            "sha256": digests,
        }
        _write_json_durably(tmp / STATE_FILE, state)
        set_aside_later_checkpoints(root, step - 1)  # this step's own earlier save too: kept, not deleted
        if final.exists():  # its state no longer reads (a copy cut short): kept aside too, for whatever still reads
            _set_aside(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        prune_checkpoints(root, keep_last)
    accelerator.wait_for_everyone()
    return final


def read_rank_state(checkpoint: str | os.PathLike, rank: int) -> dict[str, Any]:
    """This rank's ``rank_state`` from ``save_checkpoint`` ({} for checkpoints written before it was kept)."""
    path = Path(checkpoint) / RANK_STATE.format(rank=rank)
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:  # the logging window only: training goes on exactly
        logger.warning("%s is damaged (%s); the first logged loss after the resume covers fewer steps", path, err)
        return {}


def saved_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Every ``step-*`` folder, whether its state reads or not: only a finished save renames a folder so, so each one
    is some run's checkpoint (one without a readable state was damaged or copied short since)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(PREFIX) and p.is_dir())


def completed_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Finished checkpoints whose state reads, oldest first (a folder counts only once its state file was written
    and renamed)."""
    steps = {}
    for path in (p for p in saved_checkpoints(output_dir) if (p / STATE_FILE).is_file()):
        try:
            steps[path] = read_step(path)
        except ConfigError as err:  # the others still resume; a save of this step replaces it
            logger.warning("%s; skipped", err)
    return sorted(steps, key=steps.__getitem__)


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
    try:
        return int(json.loads(path.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError) as err:  # a copy cut short, or edited
        raise ConfigError(
            f"{path} is damaged ({type(err).__name__}: {err}); expected the JSON state a training run writes: resume "
            "from another checkpoint (train.resume=auto takes the newest readable one)"
        ) from None


def load_checkpoint(accelerator: Accelerator, checkpoint: str | os.PathLike, model: torch.nn.Module) -> None:
    """Restore a checkpoint written by ``save_checkpoint``. DeepSpeed's holds no frozen weights, so only a model
    with frozen parameters (Medusa-2's adapted target) is loaded non-strictly; every other one stays strict."""
    frozen = any(not p.requires_grad for p in model.parameters())
    try:
        accelerator.load_state(str(checkpoint), **_engine_kwargs(accelerator, load_module_strict=not frozen))
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - a file that passed damaged_files and still does not load
        reason = (str(err).splitlines() or [""])[0]
        raise ConfigError(
            f"checkpoint {checkpoint} could not be loaded ({type(err).__name__}: {reason}); "
            "expected a checkpoint written by this run's config: resume from an earlier one or start a new run"
        ) from err


def _engine_kwargs(accelerator: Accelerator, **deepspeed: Any) -> dict[str, Any]:
    """Options for DeepSpeed's own save/load (Accelerate hands them to ``engine.save_checkpoint`` /
    ``load_checkpoint``): frozen weights are left out of its checkpoints, as the save-state hook does elsewhere."""
    return deepspeed if accelerator.distributed_type == DistributedType.DEEPSPEED else {}


def keep_trainable_state_only(accelerator: Accelerator) -> None:
    """Checkpoints hold what training changes, not frozen weights the run rebuilds identically from its config.

    Medusa-2's objective holds the whole adapted target (~0.5 GB for SmolLM2) of which only the LoRA adapters train.
    Accelerate's save-state hook drops parameters that do not require grad from the saved model state; its load-state
    hook loads the weights itself, checking that nothing but those is missing and nothing is unexpected (a checkpoint
    that still holds them loads too). This covers the plain and DDP paths; DeepSpeed saves through its own engine,
    told to leave frozen parameters out (``save_checkpoint``); FSDP saves through its own and keeps every tensor.
    """
    accelerator.register_save_state_pre_hook(_drop_frozen_weights)
    accelerator.register_load_state_pre_hook(_load_weights_checked)


def _frozen_names(model: torch.nn.Module) -> set[str]:
    return {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def _drop_frozen_weights(models: list[torch.nn.Module], weights: list[dict[str, Any]], output_dir: str) -> None:
    if len(weights) != len(models):  # FSDP / DeepSpeed: the engines saved the models themselves
        return
    for model, state in zip(models, weights):
        for name in _frozen_names(model):
            state.pop(name, None)


def _load_weights_checked(models: list[torch.nn.Module], input_dir: str) -> None:
    for index, model in enumerate(models):
        path = Path(input_dir) / (WEIGHTS_FILE if index == 0 else WEIGHTS_FILE.replace(".", f"_{index}."))
        missing, unexpected = safetensors.torch.load_model(model, path, strict=False)
        wrong = sorted(set(missing) - _frozen_names(model))
        if wrong or unexpected:
            raise ConfigError(
                f"{path} does not match the model being trained (missing trainable tensors {wrong[:5]}, unexpected "
                f"tensors {sorted(unexpected)[:5]}); expected a checkpoint of this run's head. Resume with the config "
                "that wrote it, or start a new run."
            )
    models.clear()  # loaded here: Accelerate must not load them again


def set_aside_later_checkpoints(root: Path, step: int) -> None:
    """Checkpoints of later steps than the one just saved are from before a resume to an earlier one (the newer were
    damaged, or an older one was named): renamed ``abandoned-step-N``, they are neither pruned in place of this
    run's own saves nor resumed by ``auto``, and stay on disk for whoever wants what still reads in them."""
    for later in [c for c in completed_checkpoints(root.parent) if read_step(c) > step]:
        logger.warning("%s is from before this run resumed at an earlier step: renamed %s", later, _set_aside(later))


def _set_aside(checkpoint: Path) -> str:
    aside = checkpoint.with_name(f"{ABANDONED_PREFIX}{checkpoint.name}")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(checkpoint, aside)
    return aside.name


def prune_checkpoints(root: Path, keep_last: int) -> None:
    for old in completed_checkpoints(root.parent)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def _write_json_durably(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (the ranks' files are visible to the main process on a shared or
    local file system once every rank has finished writing)."""
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        elif path.is_dir():
            _fsync_dir(path)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
