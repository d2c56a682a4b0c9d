"""Experiment tracking through Accelerate's trackers: wandb, tensorboard, or none.

wandb runs offline unless an API key is configured (``WANDB_API_KEY`` or a ``~/.netrc`` entry for api.wandb.ai);
an explicit ``WANDB_MODE`` wins. The key itself is never read into a log line or printed. wandb's own environment
settings are kept: ``WANDB_DIR`` places its files (else ``train.output_dir``), and ``WANDB_PROJECT`` names the project
unless ``train.project`` is given (the schema's default reads it).
"""

from __future__ import annotations

import netrc
import os
import uuid
from pathlib import Path
from typing import Any

from specheads.training.config import ConfigError, TrainConfig
from specheads.training.tracker_packages import missing_tracker_package


def require_tracker_package(kind: str) -> None:
    """Fail before anything loads when ``train.log_with`` names a tracker whose package is not installed."""
    if problem := missing_tracker_package(kind):
        raise ConfigError(problem)


def wandb_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode() -> str:
    return os.environ.get("WANDB_MODE") or ("online" if wandb_key_configured() else "offline")


def tracker_setup(cfg: TrainConfig, resuming: bool = False) -> tuple[str | None, dict[str, Any]]:
    """``log_with`` for ``Accelerator`` and ``init_kwargs`` for ``init_trackers``; a resumed run logs into the wandb
    run of the one it continues, a new one into a new run."""
    kind = cfg.train.log_with
    if kind == "none":
        return None, {}
    require_tracker_package(kind)  # also for a config built in code, which load_config did not check
    if kind == "wandb":
        out = Path(cfg.train.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        settings = {"mode": wandb_mode(), "name": cfg.train.run_name}
        if not os.environ.get("WANDB_DIR"):  # set: the user's place for wandb's files wins
            settings["dir"] = str(out)
        return "wandb", {"wandb": {**settings, "id": wandb_run_id(out, resuming), "resume": "allow"}}
    return kind, {}


WANDB_ID_FILE = "wandb_run_id"


def wandb_run_id(output_dir: Path, resuming: bool = True) -> str | None:
    """The wandb run id of this output folder: made on its first run and kept in ``wandb_run_id``, so a resumed run
    logs into the same wandb run instead of starting another. A new run (``resuming`` False: one whose predecessor
    here left no checkpoint, or stopped before its first) gets a new id, not its predecessor's run.

    Only the launch's rank 0 reads or writes the file (it holds the output folder's lock, and its tracker is the only
    one that starts); the other ranks get None. Were every rank to write, before the process group exists, a rank
    could replace the id rank 0 had just started its wandb run with, and a resume would start another run.
    """
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    path = output_dir / WANDB_ID_FILE
    if resuming and path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:12]
    path.write_text(run_id + "\n")
    return run_id


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
