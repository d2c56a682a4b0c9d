"""Atomic training checkpoints on top of ``accelerator.save_state``.

Every rank writes into ``checkpoints/.tmp-step-N``; once all are done the main process writes the run's config and
``trainer_state.json`` last and renames the folder to ``checkpoints/step-N``. A rename is atomic, so a run killed
mid-save leaves only a ``.tmp-*`` folder that resume ignores (and the next save removes), never a ``step-*`` folder
that loads half.

A checkpoint belongs to one run: a new run (``train.resume=no``) refuses an output folder that holds checkpoints, and a
resumed run must keep the settings its restored optimizer, scheduler and data order were made with.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from filelock import FileLock, Timeout
from omegaconf import OmegaConf

from specheads.heads.base import CHECKPOINT_STATE_NAME, WEIGHTS_NAME
from specheads.training.checkpoint_damage import NEEDED_FILES, damaged_files, newest_intact, warn_if_inexact
from specheads.training.config import ConfigError, TrainConfig
from specheads.training.tracking import flatten

logger = logging.getLogger(__name__)

PREFIX = "step-"
TMP_PREFIX = ".tmp-"
STATE_FILE = CHECKPOINT_STATE_NAME
CONFIG_FILE = "train_config.yaml"
RANK_STATE = "rank_state_{rank}.json"
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


RESUME_MAY_CHANGE = frozenset(
    {
        "train.max_steps",  # may only grow
        "train.output_dir",
        "train.resume",
        "train.stop_after",
        "train.log_every",
        "train.eval_every",
        "train.eval_batches",
        "train.eval_batch_size",
        "train.save_every",
        "train.keep_last",
        "train.progress_bar",
        "train.dist_timeout_s",
        "train.log_with",
        "train.project",
        "train.run_name",
        "data.num_proc",  # tokenizing workers: the samples are the same
    }
)
"""Settings a resumed run may change: how long it runs and when and where it logs, evaluates and saves. Every other
setting is either restored by the checkpoint (optimizer and scheduler state, data order) or defines what the run
learns (head, loss, data, features, target), so changing it on resume is an error rather than silently ignored."""


def checkpoint_root(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / "checkpoints"


def _name(step: int) -> str:
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
    final = root / _name(step)
    tmp = root / f"{TMP_PREFIX}{_name(step)}"
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
        _write_json_durably(tmp / STATE_FILE, {"step": step, "data_digest": data_digest})
        if final.exists():
            shutil.rmtree(final)
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
    """``no`` -> None; ``auto`` -> the latest checkpoint in ``output_dir`` (None if there is none); else a path.

    ``no`` refuses an output folder that already holds checkpoints: the new run's saves would be pruned in favour of
    the old run's higher steps, and a later ``auto`` would resume the old run. Both refuse a folder that holds a
    finished head and no checkpoint: training from step 0 would overwrite it.
    """
    if resume == "no":
        found = completed_checkpoints(output_dir)
        if found:
            raise ConfigError(
                f"train.resume=no starts a new run, but {checkpoint_root(output_dir)} already holds checkpoints of a "
                f"run ({', '.join(p.name for p in found)}); expected an output folder without checkpoints. Continue "
                "that run with train.resume=auto (or --resume), or give this run another train.output_dir (or "
                "delete that folder)."
            )
        _refuse_overwriting_a_head(output_dir, "train.resume=no starts a new run")
        return None
    if resume == "auto":
        found = completed_checkpoints(output_dir)
        if not found:
            _refuse_overwriting_a_head(output_dir, "train.resume=auto (--resume) found no checkpoint to resume")
            logger.info("train.resume=auto: no checkpoint in %s yet; starting at step 0", checkpoint_root(output_dir))
            return None
        return warn_if_inexact(newest_intact(found))
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        latest = latest_checkpoint(path) if path.is_dir() else None
        found = "does not exist" if not path.exists() else f"is not a complete checkpoint (no {STATE_FILE})"
        hint = (
            f" {path} is a run's output folder: resume its latest checkpoint with train.resume={latest}, or with "
            f"train.output_dir={path} train.resume=auto."
            if latest is not None
            else ""
        )
        raise FileNotFoundError(
            f"train.resume={resume}: {path} {found}; train.resume takes a checkpoint folder such as "
            f"{checkpoint_root('OUT')}/{_name(200)} written by a training run, or auto (the latest checkpoint in "
            f"train.output_dir).{hint}"
        )
    if path.resolve().parent != Path(checkpoint_root(output_dir)).resolve():
        # another run's checkpoint, continued in this folder: what is already here must not be overwritten or mixed
        found = completed_checkpoints(output_dir)
        if found:
            raise ConfigError(
                f"train.resume={resume} is a checkpoint of another run than {output_dir}'s, whose "
                f"{checkpoint_root(output_dir)} holds checkpoints of its own ({', '.join(p.name for p in found)}); "
                "expected an output folder without checkpoints. Give this run another train.output_dir, or resume "
                f"from a checkpoint of {output_dir}."
            )
        _refuse_overwriting_a_head(output_dir, f"train.resume={resume} continues another run's checkpoint here")
    if damage := damaged_files(path, NEEDED_FILES):
        raise ConfigError(
            f"train.resume={resume}: {damage[0]}; expected a complete checkpoint. Resume from an earlier checkpoint "
            f"of the run (train.resume=auto takes the newest complete one) or start a new run."
        )
    return warn_if_inexact(path)


def _refuse_overwriting_a_head(output_dir: str | os.PathLike, what: str) -> None:
    head = Path(output_dir) / WEIGHTS_NAME
    if head.is_file():
        raise ConfigError(
            f"{what}, but {output_dir} holds a finished head ({head.name}) and no checkpoint: this run would "
            f"overwrite it. To train it further, start from it with head.init_from={output_dir} and another "
            "train.output_dir; to start over, delete it or pick another train.output_dir."
        )


def check_resume_config(checkpoint: str | os.PathLike, config_yaml: str) -> None:
    """Refuse to resume with settings that differ from the run that wrote ``checkpoint`` (see ``RESUME_MAY_CHANGE``).

    ``config_yaml`` is the resuming run's config (``to_yaml``); both sides are read back from YAML, so they compare
    the same way. A key the saved config lacks was added to the schema after the checkpoint was written: that run ran
    with its default, so the default is what it is compared as (a new setting left at its default resumes; set to
    something else, it is refused like any other change). A checkpoint written before checkpoints kept their config
    is resumed with a warning.
    """
    path = Path(checkpoint) / CONFIG_FILE
    if not path.is_file():
        logger.warning(
            "%s has no %s (an older checkpoint): the resumed run's settings cannot be checked", checkpoint, CONFIG_FILE
        )
        return
    defaults = flatten(OmegaConf.to_container(OmegaConf.structured(TrainConfig)))
    saved = {**defaults, **flatten(OmegaConf.to_container(OmegaConf.load(path)))}
    now = flatten(OmegaConf.to_container(OmegaConf.create(config_yaml)))
    changed = [
        f"{key}: {_shown(saved, key)} -> {_shown(now, key)}"
        for key in sorted(set(saved) | set(now))
        if key not in RESUME_MAY_CHANGE and (key in saved, saved.get(key)) != (key in now, now.get(key))
    ]
    if now["train.max_steps"] < saved["train.max_steps"]:
        changed.append(f"train.max_steps: {saved['train.max_steps']} -> {now['train.max_steps']} (it may only grow)")
    if changed:
        raise ConfigError(
            f"resuming from {checkpoint} with settings that differ from the run that wrote it ({'; '.join(changed)}); "
            "expected the same settings: the restored optimizer, scheduler and data order were made with them, so "
            f"the new values would be ignored or mixed. Resume with the values in {path}, or start a new run with "
            f"these settings (another train.output_dir, train.resume=no). Only {sorted(RESUME_MAY_CHANGE)} may "
            "change on resume."
        )


def data_digest(train_dataset: Any, eval_dataset: Any) -> str:
    """A digest of what a run trains and evaluates on: the token ids and loss masks of tokenized data, or the content
    digests feature caches were written with. Files that grew (``data generate`` appends) or changed give another
    digest, even when the config still names the same paths."""
    digest = hashlib.sha256()
    for dataset in (train_dataset, eval_dataset):
        caches = getattr(dataset, "datasets", [dataset])  # a ConcatFeatureCache holds several
        if all(hasattr(cache, "meta") for cache in caches):
            digest.update(json.dumps([[cache.meta.get("data_sha1"), len(cache)] for cache in caches]).encode())
        else:  # a tokenized datasets.Dataset, read in slices (a whole column would be one Python list)
            for start in range(0, len(dataset), 1024):
                rows = dataset[start : start + 1024]
                for ids, mask in zip(rows["input_ids"], rows["loss_mask"]):
                    digest.update(len(ids).to_bytes(8, "little"))
                    digest.update(np.asarray(ids, dtype=np.int64).tobytes())
                    digest.update(np.asarray(mask, dtype=np.int8).tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:16]


def check_resume_data(checkpoint: str | os.PathLike, digest: str) -> None:
    """Refuse to resume on other data than the run that wrote ``checkpoint`` (see ``data_digest``): its data order
    and held-out split were drawn for that data, so held-out samples could be trained on without a word."""
    saved = json.loads((Path(checkpoint) / STATE_FILE).read_text()).get("data_digest")
    if saved is None:
        logger.warning(
            "%s records no data digest (an older checkpoint): the resumed run's data cannot be checked", checkpoint
        )
        return
    if saved != digest:
        raise ConfigError(
            f"resuming from {checkpoint} with other data than the run that wrote it (data digest {saved} -> "
            f"{digest}): a data file grew or changed, or a data setting did. Its data order and held-out split were "
            "drawn for the old data, so held-out samples could now be trained on. Resume with the data it was made "
            "with, or start a new run on the new data (another train.output_dir; head.init_from=... keeps the "
            "trained weights)."
        )


def _shown(flat: dict[str, Any], key: str) -> str:
    return repr(flat[key]) if key in flat else "(unset)"


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
