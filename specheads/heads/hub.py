"""Sharing heads on the Hugging Face Hub through huggingface_hub's own API (no hand-written HTTP)."""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import HfApi, snapshot_download

from specheads.heads.base import CONFIG_NAME, LORA_DIR, WEIGHTS_NAME

UPLOAD_PATTERNS = [CONFIG_NAME, WEIGHTS_NAME, "README.md", f"{LORA_DIR}/*"]
"""What a push uploads: the head, its card, and a Medusa-2 LoRA adapter folder when there is one. The same files
already in the repository and not in the folder are deleted by the push (a stale adapter would be merged into the
target by everyone who downloads the head)."""


class HubError(RuntimeError):
    """The Hub could not be reached or refused the request (one line, no traceback needed)."""


def files_to_upload(folder: str | os.PathLike) -> list[str]:
    """The files ``push_folder`` would upload from ``folder`` (relative paths), after checking it is a head folder."""
    root = Path(folder)
    for required in (CONFIG_NAME, WEIGHTS_NAME, "README.md"):
        if not (root / required).is_file():
            raise FileNotFoundError(f"{root} has no {required}; push a folder written by head.save_pretrained()")
    files = [name for name in (CONFIG_NAME, WEIGHTS_NAME, "README.md")]
    if (root / LORA_DIR).is_dir():
        files += sorted(str(p.relative_to(root)) for p in (root / LORA_DIR).rglob("*") if p.is_file())
    return files


def push_folder(
    folder: str | os.PathLike,
    repo_id: str,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str = "Upload specheads draft head",
) -> str:
    """Create ``repo_id`` if needed and upload the head folder; returns the commit URL.

    ``private=None`` leaves visibility to the Hub (a new repository follows its owner's default, an existing one
    keeps its own); ``True`` makes the repository private, an existing public one included; ``False`` creates a
    public one. Files of an earlier head that this folder does not have (``UPLOAD_PATTERNS``) are deleted."""
    files_to_upload(folder)
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if private:  # create_repo ignores ``private`` for a repository that already exists
            api.update_repo_settings(repo_id, private=True)
        info = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            allow_patterns=UPLOAD_PATTERNS,
            delete_patterns=UPLOAD_PATTERNS,
            commit_message=commit_message,
        )
    except Exception as err:  # noqa: BLE001 - network, auth and offline errors all become one clear line
        raise HubError(_one_line(f"could not push {folder} to {repo_id}", err)) from err
    return str(getattr(info, "commit_url", info))


def download_head(repo_id: str, revision: str | None = None) -> Path:
    """Fetch a head folder from the Hub (or the local Hub cache when offline)."""
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=UPLOAD_PATTERNS))
    except Exception as err:  # noqa: BLE001
        raise HubError(
            _one_line(f"{repo_id!r} is not a local folder and could not be fetched from the Hub", err)
        ) from err


def _one_line(what: str, err: Exception) -> str:
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    hint = " (HF_HUB_OFFLINE is set: unset it and check your network)" if offline else ""
    return f"{what}: {type(err).__name__}: {reason}{hint}"
