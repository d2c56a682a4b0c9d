"""Whether the package a tracker runs on is installed: asked by the config check (before the target loads) and by the
tracker setup (for a config built in code), so it depends on neither."""

from __future__ import annotations

import importlib.util

TRACKER_PACKAGES = {"wandb": ("wandb",), "tensorboard": ("tensorboard", "tensorboardX")}
"""The packages each tracker runs on (either one for tensorboard, as Accelerate accepts), installed by the specheads
extra of the tracker's name. Accelerate only warns when none is installed, and the run then trains untracked."""


def missing_tracker_package(kind: str) -> str | None:
    """Why ``train.log_with=kind`` cannot track here (its package is not installed), or None when it can."""
    packages = TRACKER_PACKAGES.get(kind, ())
    if packages and not any(_installed(package) for package in packages):
        return (
            f"train.log_with={kind} needs the {packages[0]} package, which is not installed: "
            f"pip install 'specheads[{kind}]' (or train.log_with=none to train without tracking)."
        )
    return None


def _installed(package: str) -> bool:
    """A module or regular package, not a namespace package: a folder named ``wandb`` in the working directory (where
    wandb writes its runs by default) is found by ``find_spec`` too, with no origin."""
    spec = importlib.util.find_spec(package)
    return spec is not None and spec.origin is not None
