"""How this process joins a launch: its device, process group and precision, decided before the Accelerator exists
and checked after it, for one CPU, GPUs, several CPU processes (gloo) and DeepSpeed alike."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, parse_flag_from_env

from specheads.training.config import ConfigError

logger = logging.getLogger(__name__)


def resolve_mixed_precision(setting: str) -> str:
    """``train.mixed_precision``: ``auto`` takes what ``accelerate launch`` was given (its config file's
    ``mixed_precision`` or ``--mixed_precision``, exported as ``ACCELERATE_MIXED_PRECISION``), else ``no``. An
    explicit value wins over the launch's, with a warning when they differ: the launch config would otherwise be
    ignored without a word."""
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if setting == "auto":
        return launched or "no"
    if launched and launched != setting:
        logger.warning(
            "train.mixed_precision=%s overrides the launch's mixed_precision=%s; set train.mixed_precision=auto "
            "to follow the launch config",
            setting,
            launched,
        )
    return setting


def sync_deepspeed_config(config: dict[str, Any], max_grad_norm: float, grad_accum: int) -> None:
    """DeepSpeed clips and accumulates inside its engine, with the JSON's ``gradient_clipping`` and
    ``gradient_accumulation_steps``; Accelerate fills an ``auto`` clipping with 1.0 and lets a set accumulation count
    override ``train.grad_accum`` with only a warning (each micro-batch would then be an optimizer step). Put
    ``train.max_grad_norm`` (0 = no clipping, as in DeepSpeed) and ``train.grad_accum`` where they are ``auto``, and
    refuse a config that sets other values."""
    synced = (
        ("gradient_clipping", "train.max_grad_norm", float(max_grad_norm)),
        ("gradient_accumulation_steps", "train.grad_accum", int(grad_accum)),
    )
    for key, setting, value in synced:
        given = config.get(key, "auto")
        if given == "auto":
            config[key] = value
        elif type(value)(given) != value:
            raise ConfigError(
                f'the DeepSpeed config sets {key}={given} but {setting}={value}; set {key} to "auto" in the '
                f"DeepSpeed JSON (it then follows {setting}) or make them equal (an `accelerate config` file's "
                "deepspeed_config sets gradient_accumulation_steps too)"
            )


def check_accumulation(accelerator: Accelerator, grad_accum: int) -> None:
    """After ``prepare``: the launch accumulates ``train.grad_accum`` micro-batches per step. An engine that kept a
    count of its own would step the optimizer and the schedule on other micro-batches than the loop's rounds."""
    if accelerator.gradient_accumulation_steps != grad_accum:
        raise ConfigError(
            f"the launch accumulates {accelerator.gradient_accumulation_steps} micro-batches per optimizer step but "
            f'train.grad_accum={grad_accum}; set the launch config\'s gradient_accumulation_steps to "auto" or to '
            "train.grad_accum"
        )


def has_accelerator() -> bool:
    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def launch_device() -> torch.device:
    """Where this process will train, known before the Accelerator exists: its local GPU under a launcher (as
    Accelerate picks it), else the CPU. The frozen target loads straight onto it."""
    if torch.cuda.is_available() and not parse_flag_from_env("ACCELERATE_USE_CPU"):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def launched_with_deepspeed() -> bool:
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def launched_world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def cpu_processes() -> bool:
    """Several launched processes on a machine without a GPU (DeepSpeed aside: it finds its CPU accelerator itself).
    Accelerate starts them from a MULTI_GPU launch config (configs/accelerate/cpu-2proc.yaml), but unless the
    Accelerator is told ``cpu=True`` (or ``ACCELERATE_USE_CPU=1``) each trains alone, as a world of one, in the
    same output folder."""
    return launched_world() > 1 and not has_accelerator() and not launched_with_deepspeed()


def check_world(accelerator: Accelerator) -> None:
    """Every launched process must be one rank of one group: separate worlds of one would train the same run
    independently and remove each other's checkpoints."""
    if accelerator.num_processes != launched_world():
        raise RuntimeError(
            f"launched {launched_world()} processes (WORLD_SIZE) but Accelerate formed a group of "
            f"{accelerator.num_processes} ({accelerator.distributed_type}); expected one group of all of them. On a "
            "machine without a GPU, launch with configs/accelerate/cpu-2proc.yaml or a DeepSpeed config."
        )


def process_group_kwargs(timeout_s: int) -> list[InitProcessGroupKwargs]:
    """How long a collective waits for a hung rank (a dead one ends the launch at once), and the backend under
    DeepSpeed on a CPU-only machine: Accelerate picks one only for accelerator devices, and would silently run every
    rank as a world of one there. Name gloo (DeepSpeed's CPU accelerator talks gloo)."""
    timeout = timedelta(seconds=timeout_s)
    if launched_with_deepspeed() and not torch.cuda.is_available():
        return [InitProcessGroupKwargs(backend="gloo", timeout=timeout)]
    return [InitProcessGroupKwargs(timeout=timeout)]
