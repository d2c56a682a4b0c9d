"""The base every draft head shares: its config, and saving it as ``config.json`` + ``model.safetensors`` + card."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import safetensors.torch
from torch import nn

from specheads import __version__
from specheads.heads.card import write_model_card
from specheads.heads.config import FORMAT_VERSION, HeadConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class DraftHead(nn.Module):
    """A trainable drafter attached to a frozen target. Subclasses set ``head_type``, ``config_class``, ``card_tags``.

    Only the head's own tensors are saved (its ``state_dict``); borrowed target modules are not part of it
    (see ``specheads.heads.borrowed``).
    """

    head_type: ClassVar[str]
    config_class: ClassVar[type[HeadConfig]]
    card_tags: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config

    @property
    def layer_ids(self) -> list[int]:
        return list(self.config.layer_ids)

    def config_json(self) -> dict[str, Any]:
        return {
            "head_type": self.head_type,
            "format_version": FORMAT_VERSION,
            "specheads_version": __version__,
            "config": self.config.to_dict(),
        }

    def save_pretrained(self, save_directory: str | os.PathLike, card: dict[str, Any] | None = None) -> Path:
        """Write ``config.json``, ``model.safetensors`` and a ``README.md`` model card into ``save_directory``.

        ``card`` holds what is known about training and acceptance (config, metrics, tau); it goes into the card.
        The folder is written to a temporary sibling first and renamed, so a killed save never leaves half a head.
        """
        out = Path(save_directory)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            (tmp / CONFIG_NAME).write_text(json.dumps(self.config_json(), indent=2) + "\n")
            # save_model de-duplicates tied tensors (e.g. a draft model's tied embedding and lm_head).
            safetensors.torch.save_model(self, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
            write_model_card(tmp / "README.md", self, card or {})
            if out.exists():
                keep = {CONFIG_NAME, WEIGHTS_NAME, "README.md"}
                for child in out.iterdir():  # keep side files (e.g. a LoRA adapter folder) next to the head
                    if child.name not in keep and not (tmp / child.name).exists():
                        shutil.move(str(child), tmp / child.name)
                shutil.rmtree(out)
            tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out

    def push_to_hub(self, repo_id: str, card: dict[str, Any] | None = None, **kwargs: Any) -> str:
        """Save to a temporary folder and upload it with huggingface_hub (see ``specheads.heads.hub``)."""
        from specheads.heads.hub import push_folder

        with tempfile.TemporaryDirectory() as tmp:
            folder = self.save_pretrained(Path(tmp) / "head", card=card)
            return push_folder(folder, repo_id, **kwargs)
