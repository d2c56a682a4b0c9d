"""Plain helpers for training tests (see ``tests/tiny_models.py`` for why they do not live in a conftest)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tiny_overrides(target_dir: Path, data_file: Path, output_dir: Path, **train: object) -> list[str]:
    """Dotted overrides for a seconds-long run on the tiny target; ``train`` keys override ``train.*``."""
    settings = {
        "max_steps": 4,
        "batch_size": 4,
        "eval_batch_size": 4,
        "eval_every": 0,
        "log_every": 1,
        "progress_bar": False,
        "output_dir": str(output_dir),
        **train,
    }
    return [
        f"target.name={target_dir}",
        f"data.paths=[{data_file}]",
        "data.max_length=64",
        "data.eval_size=8",
        *(f"train.{key}={value}" for key, value in settings.items()),
    ]


# AdamW with a huge epsilon and a learning rate as large turn the first update into ``-grad`` (``m / (sqrt(v) + eps)``
# with ``sqrt(v) = |grad|`` much below eps), so one step's weights compare gradients through the real loop. EAGLE-1's
# losses average over exactly the loss tokens, which token-weighted accumulation weighs by; no input noise, whose
# draw depends on the micro-batch index. For ``configs/eagle1``.
GRADIENT_AS_UPDATE = ["loss.input_noise=0", "data.max_samples=16", "train.adam_eps=1e6", "train.lr=1e6"]
