"""``specheads train`` / ``scripts/train_heads.py``: parse a config path and dotted overrides, then train.

    accelerate launch --config_file configs/accelerate/cpu-2proc.yaml scripts/train_heads.py \
        --config configs/eagle3/smollm2-135m.yaml train.max_steps=200 train.resume=auto
"""

from __future__ import annotations

import argparse
import logging
import sys

from specheads.training.config import ConfigError, load_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specheads train",
        description="Train a draft head on a frozen target. Any config key can be overridden as key.sub=value.",
    )
    parser.add_argument("--config", required=True, help="YAML file, e.g. configs/medusa/smollm2-135m.yaml")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint (train.resume=auto)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.max_steps=200 train.lr=3e-4")
    return parser


def _with_resume_flag(overrides: list[str], resume: bool) -> list[str]:
    """``--resume`` is ``train.resume=auto``; given together with an explicit ``train.resume=...`` it is an error
    rather than one silently replacing the other."""
    explicit = [o for o in overrides if o.split("=", 1)[0].strip() == "train.resume"]
    if resume and explicit:
        raise ConfigError(
            f"--resume (train.resume=auto) and {explicit[-1]} were both given; expected one of them. Keep --resume "
            "to continue from the latest checkpoint in train.output_dir, or the override to resume from that one."
        )
    return overrides + (["train.resume=auto"] if resume else [])


def train_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, _with_resume_flag(list(args.overrides), args.resume))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from specheads.training.loop import train

    result = train(cfg)
    if result.finished:
        shown = {k: round(v, 4) for k, v in result.metrics.items() if k.endswith(("tau", "loss")) or "top1" in k}
        logging.getLogger(__name__).info("saved head to %s after %d steps: %s", result.output_dir, result.step, shown)
    return 0
