"""The base every draft head shares: its config, and saving it as ``config.json`` + ``model.safetensors`` + card."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import safetensors.torch
from torch import nn

from specheads import __version__
from specheads.heads.card import ADAPTER_KEY, write_model_card
from specheads.heads.config import FORMAT_VERSION, HeadConfig
from specheads.heads.files import CHECKPOINT_STATE_NAME, CONFIG_NAME, LORA_DIR, WEIGHTS_NAME

__all__ = ["CHECKPOINT_STATE_NAME", "CONFIG_NAME", "LORA_DIR", "WEIGHTS_NAME", "DraftHead", "make_readable"]


def make_readable(path: Path) -> None:
    """Give a written file the mode the user's umask asks for (safetensors creates files readable by the owner
    only, so a serving process under another user could not load a head)."""
    mask = os.umask(0)
    os.umask(mask)
    path.chmod(0o666 & ~mask)


PARTIAL_MARK = ".partial-"
"""``save_pretrained`` writes ``.NAME.partial-PID`` first and renames it over ``NAME`` once complete."""


def remove_stale_partials(folder: Path) -> None:
    """Remove what a killed save left half-written in ``folder`` (a process that no longer runs); a live one's
    partial files are its own to finish."""
    for path in folder.glob(f".*{PARTIAL_MARK}*"):
        pid = path.name.rpartition(PARTIAL_MARK)[2]
        if not pid.isdigit() or _process_runs(int(pid)):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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
        # the Medusa-2 LoRA adapter folder load_head found beside this head: part of the head as published
        self.loaded_adapter: Path | None = None

    @property
    def layer_ids(self) -> list[int]:
        return list(self.config.layer_ids)

    def config_json(self, with_adapter: bool = False) -> dict[str, Any]:
        """``config.json``; a head saved with a LoRA adapter for its target (Medusa-2) says so (``lora_adapter``),
        so that loading it without ``lora/`` is an error rather than drafts against the bare target."""
        meta = {
            "head_type": self.head_type,
            "format_version": FORMAT_VERSION,
            "specheads_version": __version__,
            "config": self.config.to_dict(),
        }
        return {**meta, ADAPTER_KEY: True} if with_adapter else meta

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        card: dict[str, Any] | None = None,
        write_adapter: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write ``config.json``, ``model.safetensors`` and a ``README.md`` model card into ``save_directory``.

        ``card`` holds what is known about training and acceptance (config, metrics, tau); it goes into the card.
        Each file is written under a temporary name in the folder and renamed over the old one, so a killed save
        leaves every file whole, and nothing else in the folder (a training run's checkpoints, logs, config) is
        touched. A LoRA adapter folder (``lora/``) left by an earlier head is removed: it belongs to that head.
        ``write_adapter(folder)`` (Medusa-2) writes this head's adapter: into a temporary folder first, which
        replaces ``lora/`` once complete, just before the head's own files, so a killed save never leaves a new
        head beside an empty or half-written adapter. A head ``load_head`` found an adapter beside
        (``loaded_adapter``) writes a copy of that one.
        """
        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(out)
        if write_adapter is None and self.loaded_adapter is not None:
            # a loaded Medusa-2 head keeps its adapter: without it the copy would draft against the bare target
            write_adapter = functools.partial(shutil.copytree, self.loaded_adapter)
        writers = {
            # save_model de-duplicates tied tensors (e.g. a draft model's tied embedding and lm_head).
            WEIGHTS_NAME: lambda path: safetensors.torch.save_model(self, str(path), metadata={"format": "pt"}),
            CONFIG_NAME: lambda path: path.write_text(
                json.dumps(self.config_json(write_adapter is not None), indent=2) + "\n"
            ),
            # the card says whether this head comes with an adapter (Medusa-2), which it cannot see yet in lora/
            "README.md": lambda path: write_model_card(
                path, self, {**(card or {}), ADAPTER_KEY: write_adapter is not None}
            ),
        }
        staged: list[tuple[Path, Path]] = []
        adapter = out / f".{LORA_DIR}{PARTIAL_MARK}{os.getpid()}"
        try:
            for name, write in writers.items():
                staged.append((out / f".{name}{PARTIAL_MARK}{os.getpid()}", out / name))
                write(staged[-1][0])
                make_readable(staged[-1][0])
            if write_adapter is not None:
                write_adapter(adapter)
                for path in adapter.rglob("*"):
                    if path.is_file():
                        make_readable(path)
            if (out / LORA_DIR).is_dir():
                shutil.rmtree(out / LORA_DIR)
            if write_adapter is not None:
                os.replace(adapter, out / LORA_DIR)
            for partial, final in staged:  # weights first, config after: an old config never names new shapes
                os.replace(partial, final)
        finally:
            for partial, _ in staged:
                partial.unlink(missing_ok=True)
            shutil.rmtree(adapter, ignore_errors=True)
        return out

    def push_to_hub(self, repo_id: str, card: dict[str, Any] | None = None, **kwargs: Any) -> str:
        """Save to a temporary folder and upload it with huggingface_hub (see ``specheads.heads.hub``); a head loaded
        with its Medusa-2 adapter uploads a copy of that adapter too (``save_pretrained`` writes it)."""
        from specheads.heads.hub import push_folder

        with tempfile.TemporaryDirectory() as tmp:
            folder = self.save_pretrained(Path(tmp) / "head", card=card)
            return push_folder(folder, repo_id, **kwargs)
