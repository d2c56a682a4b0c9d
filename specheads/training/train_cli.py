"""``specheads train`` / ``scripts/train_heads.py``: parse a config path and dotted overrides, then train.

    accelerate launch --config_file configs/accelerate/cpu-2proc.yaml scripts/train_heads.py \
        --config configs/eagle3/smollm2-135m.yaml train.max_steps=200 train.resume=auto
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

from specheads.training.config import ConfigError, TrainConfig, load_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specheads train",
        allow_abbrev=False,  # "--resum" must not start a run as --resume
        description="Train a draft head on a frozen target. Any config key can be overridden as key.sub=value.",
    )
    parser.add_argument("--config", required=True, help="YAML file, e.g. configs/medusa/smollm2-135m.yaml")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint (train.resume=auto)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.max_steps=200 train.lr=3e-4")
    return parser


def _apply_resume_flag(cfg: TrainConfig, overrides: list[str], resume: bool) -> None:
    """``--resume`` is ``train.resume=auto``. Given together with a checkpoint named by ``train.resume`` (an override
    or the YAML file) it is an error rather than one silently replacing the other."""
    if not resume:
        return
    explicit = [o for o in overrides if o.split("=", 1)[0].strip() == "train.resume"]
    if explicit:
        raise ConfigError(
            f"--resume (train.resume=auto) and {explicit[-1]} were both given; expected one of them. Keep --resume "
            "to continue from the latest checkpoint in train.output_dir, or the override to resume from that one."
        )
    if cfg.train.resume not in ("no", "auto"):
        raise ConfigError(
            f"--resume (train.resume=auto) was given, but the config file sets train.resume={cfg.train.resume!r}; "
            "expected one of them. Drop --resume to resume from that checkpoint, or pass train.resume=auto to "
            "continue from the latest checkpoint in train.output_dir instead."
        )
    cfg.train.resume = "auto"


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    # a second SIGTERM (a launcher forwarding the scheduler's) must not cut the unwinding of the first short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _exit_with_launcher() -> None:
    """Under ``accelerate launch``/torchrun each rank runs in its own session, so a SIGKILLed launcher would leave
    the ranks training on unseen, writing into the output folder of a relaunch. Ask Linux to SIGTERM this process
    when its launcher dies."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def train_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)  # options and overrides in any order
    # Other ranks log warnings only (transformers' Trainer does the same with log_level_replica): the data summary and
    # "saved head to ..." are said once, by the launch's rank 0.
    main_rank = int(os.environ.get("RANK", "0")) == 0
    logging.basicConfig(
        level=logging.INFO if main_rank else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from specheads.heads.load import HeadLoadError, refuse_checkpoint_as_head

    try:
        cfg = load_config(args.config, list(args.overrides))
        _apply_resume_flag(cfg, list(args.overrides), args.resume)
        if cfg.head.init_from:  # before the target loads: a checkpoint is the likely mix-up
            refuse_checkpoint_as_head(cfg.head.init_from, "head.init_from")
    except (ConfigError, HeadLoadError) as err:
        return _error(err)
    from specheads.heads import UnsupportedTargetError
    from specheads.heads.config import HeadConfigError, HeadLoadError
    from specheads.heads.hub import HubError
    from specheads.target import TargetLoadError
    from specheads.training.data import DataError
    from specheads.training.loop import train

    # A scheduler's preemption or `kill` sends SIGTERM, which ends Python without unwinding: trackers would lose what
    # they had not flushed (a wandb run file was left with its header only). As SystemExit, exit handlers run.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _exit_with_launcher()
    try:
        result = train(cfg)
    except (
        ConfigError,
        DataError,
        UnsupportedTargetError,
        TargetLoadError,
        HeadLoadError,
        HeadConfigError,
        HubError,
        FileNotFoundError,
    ) as err:  # what to fix, without a traceback
        return _error(err)
    if result.finished:
        shown = {k: round(v, 4) for k, v in result.metrics.items() if k.endswith(("tau", "loss")) or "top1" in k}
        logging.getLogger(__name__).info("saved head to %s after %d steps: %s", result.output_dir, result.step, shown)
    return 0


def _error(err: Exception) -> int:
    print(f"specheads train: error: {err}", file=sys.stderr)
    return 2
