"""The file names of a head folder and the check that its weights file is readable, in a module of their own so that
every reader and writer (save, load, card, Hub, the engines' checkpoints) imports them without importing each other."""

import hashlib
from pathlib import Path
from typing import Any

import safetensors

from specheads.heads.config import HeadLoadError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CARD_NAME = "README.md"
LORA_DIR = "lora"
"""A Medusa-2 head's LoRA adapter for the target, in a folder beside the heads."""
CHECKPOINT_STATE_NAME = "trainer_state.json"
"""The file that marks a training checkpoint folder (written last, so it marks a complete one); a folder with it and
no ``config.json`` is a checkpoint given where a saved head belongs."""


def safetensors_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each tensor's shape and dtype code in a safetensors file, read from its header alone; a missing or unreadable
    file is a ``HeadLoadError``."""
    if not path.is_file():
        raise HeadLoadError(f"{path.parent} has no {path.name}; expected a folder written by head.save_pretrained()")
    try:
        with safetensors.safe_open(str(path), framework="pt") as handle:
            slices = {name: handle.get_slice(name) for name in handle.keys()}
            return {name: (tuple(piece.get_shape()), piece.get_dtype()) for name, piece in slices.items()}
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for corrupt files
        raise HeadLoadError(f"{path} is not a readable safetensors file ({err}); it is corrupt or truncated") from err


def hash_file(path: Path, digest: Any = None) -> Any:
    """``digest`` (a new SHA-256 when None) fed ``path``'s bytes in 1 MiB blocks: a large file never sits in memory."""
    digest = hashlib.sha256() if digest is None else digest
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest
