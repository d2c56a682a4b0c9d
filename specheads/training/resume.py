"""Whether and where a training run resumes: ``train.resume`` resolved to a checkpoint (or a new run), and the
refusals of a resume whose settings or data differ from the run that wrote the checkpoint. Checkpoints themselves
are written and read by ``training/checkpoint.py``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from specheads.heads.base import WEIGHTS_NAME
from specheads.training.checkpoint import (
    CONFIG_FILE,
    STATE_FILE,
    checkpoint_name,
    checkpoint_root,
    completed_checkpoints,
    latest_checkpoint,
    read_step,
    saved_checkpoints,
)
from specheads.training.checkpoint_damage import needed_damage, newest_intact, warn_if_inexact
from specheads.training.config import ConfigError, TrainConfig
from specheads.training.tracking import flatten

logger = logging.getLogger(__name__)

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


DIGEST_CHECKED = frozenset({"data.paths"})
"""Settings a resume may change when the checkpoint records a data digest: the files may move or be renamed (another
machine, a packed copy joined on reading), and ``check_resume_data`` then refuses any change of what they hold."""

LENGTH_FREE_SCHEDULES = frozenset({"constant", "constant_with_warmup", "inverse_sqrt"})
"""Schedules whose learning rate at a step does not depend on ``train.max_steps``."""


def resolve_resume(resume: str, output_dir: str | os.PathLike) -> Path | None:
    """``no`` -> None; ``auto`` -> the latest checkpoint in ``output_dir`` (None if there is none); else a path.

    ``no`` refuses an output folder that already holds checkpoints: the new run's saves would be pruned in favour of
    the old run's higher steps, and a later ``auto`` would resume the old run. Both refuse a folder that holds a
    finished head and no checkpoint: training from step 0 would overwrite it.
    """
    if resume == "no":
        found = saved_checkpoints(output_dir)  # one whose state no longer reads is still another run's
        if found:
            readable = completed_checkpoints(output_dir)
            way_on = "Continue that run with train.resume=auto (or --resume), or" if readable else "None reads back:"
            raise ConfigError(
                f"train.resume=no starts a new run, but {checkpoint_root(output_dir)} already holds checkpoints of a "
                f"run ({', '.join(p.name for p in found)}); expected an output folder without checkpoints. {way_on} "
                "give this run another train.output_dir (or delete that folder)."
            )
        _refuse_overwriting_a_head(output_dir, "train.resume=no starts a new run")
        return None
    if resume == "auto":
        found = completed_checkpoints(output_dir)
        if not found and (unreadable := saved_checkpoints(output_dir)):
            raise ConfigError(
                f"train.resume=auto: no checkpoint in {checkpoint_root(output_dir)} has a readable {STATE_FILE} "
                f"({', '.join(p.name for p in unreadable)}); expected at least one complete checkpoint, and starting "
                "over here would overwrite them. Start a new run in another train.output_dir."
            )
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
            f"{checkpoint_root('OUT')}/{checkpoint_name(200)} written by a training run, or auto (the latest "
            f"checkpoint in train.output_dir).{hint}"
        )
    if path.resolve().parent != Path(checkpoint_root(output_dir)).resolve():
        # another run's checkpoint, continued in this folder: what is already here must not be overwritten or mixed
        found = saved_checkpoints(output_dir)
        if found:
            raise ConfigError(
                f"train.resume={resume} is a checkpoint of another run than {output_dir}'s, whose "
                f"{checkpoint_root(output_dir)} holds checkpoints of its own ({', '.join(p.name for p in found)}); "
                "expected an output folder without checkpoints. Give this run another train.output_dir, or resume "
                f"from a checkpoint of {output_dir}."
            )
        _refuse_overwriting_a_head(output_dir, f"train.resume={resume} continues another run's checkpoint here")
    read_step(path)  # a state file that does not read is named here, before the target loads
    if damage := needed_damage(path):
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
    is resumed with a warning. ``DIGEST_CHECKED`` settings may change where the checkpoint records a data digest.
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
    may_change = RESUME_MAY_CHANGE | (DIGEST_CHECKED if _saved_data_digest(checkpoint) is not None else frozenset())
    differs = [
        key for key in sorted(set(saved) | set(now)) if (key in saved, saved.get(key)) != (key in now, now.get(key))
    ]
    for key in DIGEST_CHECKED.intersection(differs).intersection(may_change):
        logger.info(
            "%s: %s -> %s; the data digest checks they hold the same data", key, _shown(saved, key), _shown(now, key)
        )
    changed = [f"{key}: {_shown(saved, key)} -> {_shown(now, key)}" for key in differs if key not in may_change]
    if now["train.max_steps"] < saved["train.max_steps"]:
        changed.append(f"train.max_steps: {saved['train.max_steps']} -> {now['train.max_steps']} (it may only grow)")
    elif now["train.max_steps"] > saved["train.max_steps"] and now["train.scheduler"] not in LENGTH_FREE_SCHEDULES:
        logger.warning(
            "train.max_steps grows %d -> %d under train.scheduler=%s: the schedule is recomputed for the new length "
            "at the restored step, so the learning rate jumps up at the resume (a constant schedule does not)",
            saved["train.max_steps"], now["train.max_steps"], now["train.scheduler"],
        )  # fmt: skip
    if changed:
        raise ConfigError(
            f"resuming from {checkpoint} with settings that differ from the run that wrote it ({'; '.join(changed)}); "
            "expected the same settings: the restored optimizer, scheduler and data order were made with them, so "
            f"the new values would be ignored or mixed. Resume with the values in {path}, or start a new run with "
            f"these settings (another train.output_dir, train.resume=no). Only {sorted(may_change)} may "
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
    saved = _saved_data_digest(checkpoint)
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


def _saved_data_digest(checkpoint: str | os.PathLike) -> str | None:
    state = Path(checkpoint) / STATE_FILE
    return json.loads(state.read_text()).get("data_digest") if state.is_file() else None


def check_resume_world(checkpoint: str | os.PathLike, num_processes: int) -> None:
    """Refuse to resume with another number of processes than wrote ``checkpoint``: its schedule counts one tick per
    process per step and its data position is per process, so the learning rate and the samples would jump."""
    saved = json.loads((Path(checkpoint) / STATE_FILE).read_text()).get("num_processes")
    if saved is not None and saved != num_processes:
        raise ConfigError(
            f"resuming from {checkpoint} with {num_processes} processes, but a launch of {saved} wrote it: its "
            "learning-rate schedule and data position are counted for that many, so both would jump. Resume with "
            f"{saved} processes (accelerate launch --num_processes {saved}), or start a new run."
        )


def _shown(flat: dict[str, Any], key: str) -> str:
    return repr(flat[key]) if key in flat else "(unset)"
