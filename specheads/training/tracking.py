"""Experiment tracking through Accelerate's trackers: wandb, tensorboard, or none.

wandb runs offline unless an API key is configured (``WANDB_API_KEY`` or a ``~/.netrc`` entry for api.wandb.ai);
an explicit ``WANDB_MODE`` wins. The key itself is never read into a log line or printed.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

from specheads.training.config import TrainConfig


def wandb_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode() -> str:
    return os.environ.get("WANDB_MODE") or ("online" if wandb_key_configured() else "offline")


def tracker_setup(cfg: TrainConfig) -> tuple[str | None, dict[str, Any]]:
    """``log_with`` for ``Accelerator`` and ``init_kwargs`` for ``init_trackers``."""
    kind = cfg.train.log_with
    if kind == "none":
        return None, {}
    if kind == "wandb":
        out = Path(cfg.train.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        return "wandb", {"wandb": {"mode": wandb_mode(), "dir": str(out), "name": cfg.train.run_name}}
    return kind, {}


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> ``{"train.lr": 1e-3, ...}`` with lists as strings (what every tracker accepts)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return flat
