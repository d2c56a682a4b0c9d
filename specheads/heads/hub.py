"""Sharing heads on the Hugging Face Hub through huggingface_hub's own API (no hand-written HTTP)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, snapshot_download

from specheads.heads.card import public_name
from specheads.heads.files import CONFIG_NAME, LORA_DIR, WEIGHTS_NAME

LORA_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""A Medusa-2 LoRA adapter as peft saves and loads it (``peft.utils.constants`` ``CONFIG_NAME`` and
``SAFETENSORS_WEIGHTS_NAME``): the files of ``lora/`` that are pushed and downloaded."""

UPLOAD_PATTERNS = [CONFIG_NAME, WEIGHTS_NAME, "README.md", *(f"{LORA_DIR}/{name}" for name in LORA_FILES)]
"""What a push uploads: the head, its card, and a Medusa-2 LoRA adapter when there is one (nothing else a run left in
``lora/``: peft's template card, optimizer states, logs)."""

DELETE_PATTERNS = [CONFIG_NAME, WEIGHTS_NAME, "README.md", f"{LORA_DIR}/*"]
"""What a push deletes from the repository when the folder does not upload it: a stale adapter would be applied to
the target by everyone who downloads the head, and ``lora/`` holds nothing else of this head."""


ENGINE_DELETE_PATTERNS = ["*.json", "*.safetensors", "*.md", "*.txt", "*.model", "*.jinja", f"{LORA_DIR}/*"]
"""What pushing an engine's folder deletes from the repository when the folder does not have it: the files of an
earlier head or export, which the engine would otherwise load beside this one."""


MODEL_NAME_KEYS = ("name_or_path", "_name_or_path", "base_model_name_or_path")
"""The keys under which an uploaded JSON config names a model: a head's target record (and a draft model's own
transformers config), the engines' base model, speculators' verifier, a LoRA adapter's base model."""


class HubError(RuntimeError):
    """The Hub could not be reached or refused the request (one line, no traceback needed)."""


def files_to_upload(folder: str | os.PathLike) -> list[str]:
    """The files ``push_folder`` would upload from ``folder`` (relative paths), after checking it is a head folder."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root} {'is a file' if root.exists() else 'does not exist'}; push a folder written by "
            "head.save_pretrained()"
        )
    for required in (CONFIG_NAME, WEIGHTS_NAME, "README.md"):
        if not (root / required).is_file():
            raise FileNotFoundError(f"{root} has no {required}; push a folder written by head.save_pretrained()")
    files = [CONFIG_NAME, WEIGHTS_NAME, "README.md"]
    if (root / LORA_DIR).is_dir():
        missing = [name for name in LORA_FILES if not (root / LORA_DIR / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{root / LORA_DIR} has no {' or '.join(missing)}; expected the LoRA adapter that Medusa-2 training "
                "saves (peft's save_pretrained)"
            )
        files += [f"{LORA_DIR}/{name}" for name in LORA_FILES]
    return files


def push_folder(
    folder: str | os.PathLike,
    repo_id: str,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str = "Upload specheads draft head",
    revision: str | None = None,
    engine_folder: bool = False,
) -> str:
    """Create ``repo_id`` if needed and upload the head folder (or, ``engine_folder``, every file of a folder an
    engine serves as it is); returns the commit URL.

    ``private=None`` leaves visibility to the Hub (a new repository follows its owner's default, an existing one
    keeps its own); ``True`` makes the repository private, an existing public one included; ``False`` creates a
    public one. ``revision`` names a branch, created from the default branch when missing. Files of an earlier head
    that this folder does not have (``DELETE_PATTERNS``) are deleted. A local target path in a config is uploaded as
    the card names it (``published_copy``); an engine's folder is uploaded without its hidden files."""
    names = _engine_files(Path(folder)) if engine_folder else files_to_upload(folder)
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory() as stage:
        published = published_copy(Path(folder), names, Path(stage))
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            if private:  # create_repo ignores ``private`` for a repository that already exists
                api.update_repo_settings(repo_id, private=True)
            if revision is not None:  # upload_folder commits to an existing branch only
                api.create_branch(repo_id, branch=revision, exist_ok=True)
            info = api.upload_folder(
                folder_path=str(published),
                repo_id=repo_id,
                allow_patterns=None if engine_folder else UPLOAD_PATTERNS,
                delete_patterns=ENGINE_DELETE_PATTERNS if engine_folder else DELETE_PATTERNS,
                commit_message=commit_message,
                revision=revision,
            )
        except Exception as err:  # noqa: BLE001 - network, auth and offline errors all become one clear line
            raise HubError(_one_line(f"could not push {folder} to {repo_id}", err)) from err
    return str(getattr(info, "commit_url", info))


def published_copy(folder: Path, names: list[str], stage: Path) -> Path:
    """``folder``'s files ``names`` as they are published, in ``stage``: a JSON file that names a local model by its
    path (``MODEL_NAME_KEYS``) is rewritten with the name the card uses (``public_name``), every other file is linked
    (copied where links are refused). The folder keeps its paths: loading a head and exporting it read them."""
    for name in names:
        source, copy = folder / name, stage / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        meta = _read_json(source) if name.endswith(".json") else None
        if meta is not None and (public := public_config(meta)) != meta:
            copy.write_text(json.dumps(public, indent=2) + "\n")
            continue
        try:
            copy.symlink_to(source.resolve())
        except OSError:
            shutil.copy2(source, copy)
    return stage


def public_config(value: Any) -> Any:
    """A JSON config with every model name under ``MODEL_NAME_KEYS`` as ``public_name`` writes it."""
    if isinstance(value, dict):
        return {
            key: public_name(item) if key in MODEL_NAME_KEYS and isinstance(item, str) else public_config(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [public_config(item) for item in value]
    return value


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # uploaded as it is


def _engine_files(folder: Path) -> list[str]:
    """Every file of an engine's folder, relative to it, but hidden ones (``.git``, caches, partial writes)."""
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder} {'is a file' if folder.exists() else 'does not exist'}; push a folder specheads export wrote"
        )
    return sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    )


def save_lora_adapter(
    adapted: Any, folder: str | os.PathLike, target_name: str, state_dict: dict[str, Any] | None = None
) -> None:
    """Save a peft model's adapter into ``folder`` as it is published with the head: without peft's template
    README (a page of "[More Information Needed]"), and with ``base_model_name_or_path`` the target's name as the
    user gave it (``public_name``) rather than the local folder it was loaded from. ``load_lora_adapter`` applies
    the adapter to the target it is given, whatever that field says. ``state_dict``, the peft model's full weights,
    is for a model whose own tensors are shards (FSDP2): peft picks the adapter's from it."""
    adapted.save_pretrained(str(folder), state_dict=state_dict)  # peft has no switch for its card
    (Path(folder) / "README.md").unlink(missing_ok=True)
    config_path = Path(folder) / LORA_FILES[0]
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = public_name(target_name)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def download_head(repo_id: str, revision: str | None = None) -> Path:
    """Fetch a head folder from the Hub (or the local Hub cache when offline)."""
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=UPLOAD_PATTERNS))
    except Exception as err:  # noqa: BLE001
        raise HubError(
            _one_line(f"{repo_id!r} is not a local folder and could not be fetched from the Hub", err)
        ) from err


def _one_line(what: str, err: Exception) -> str:
    from huggingface_hub.constants import is_offline_mode

    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    check = "check the network connection (or HF_ENDPOINT)"
    if is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        hint = f" (HF_HUB_OFFLINE is set: unset it, then {check})"
    else:
        hint = f" ({check})" if _is_network_failure(err) else ""
    return f"{what}: {type(err).__name__}: {reason}{hint}"


def _is_network_failure(err: Exception) -> bool:
    """No answer from the Hub (as opposed to an answer that refuses: auth, not found)."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    if isinstance(err, (OfflineModeIsEnabled, LocalEntryNotFoundError, ConnectionError, TimeoutError)):
        return True
    # huggingface_hub's HTTP client (httpx, httpx2 from huggingface_hub 2) raises subclasses of its TransportError
    return any(cls.__name__ == "TransportError" and cls.__module__.startswith("httpx") for cls in type(err).__mro__)
