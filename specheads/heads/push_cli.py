"""``specheads push DIR REPO_ID``: upload a saved head folder (config, weights, card, LoRA adapter) to the Hub."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from specheads.heads.base import CONFIG_NAME, LORA_DIR, WEIGHTS_NAME
from specheads.heads.config import HeadConfigError, HeadLoadError
from specheads.heads.hub import HubError, files_to_upload, push_folder
from specheads.heads.interop import is_eagle3_checkpoint
from specheads.heads.load import ADAPTER_WEIGHTS_NAME, HEADS, read_head_config, safetensors_header


def push_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specheads push", description=__doc__)
    parser.add_argument("folder", help="a folder written by head.save_pretrained() (e.g. runs/eagle3-smollm2-135m)")
    parser.add_argument("repo_id", help="Hub repository, e.g. your-name/smollm2-135m-eagle3")
    parser.add_argument(
        "--private",
        action="store_true",
        help="make the repository private (an existing public one too); without it, a new repository follows its "
        "owner's default visibility and an existing one keeps its own",
    )
    parser.add_argument("--commit-message", default="Upload specheads draft head", help="the commit's message")
    parser.add_argument(
        "--revision", help="push to this branch (created from the default branch when missing) instead of main"
    )
    parser.add_argument("--dry-run", action="store_true", help="check the folder and list what would be uploaded")
    args = parser.parse_args(argv)
    try:
        validate_repo_id(args.repo_id)
        _check_head_folder(Path(args.folder))
        files = files_to_upload(args.folder)
    except (FileNotFoundError, RuntimeError, HFValidationError, HeadConfigError) as err:
        print(f"specheads push: {err}", file=sys.stderr)
        return 2
    where = args.repo_id + (f" (branch {args.revision})" if args.revision else "")
    print(f"would upload to {where}: " + ", ".join(files) if args.dry_run else f"uploading {len(files)} files")
    if args.dry_run:
        return 0
    try:
        url = push_folder(  # token: from `hf auth login` / HF_TOKEN
            args.folder,
            args.repo_id,
            private=True if args.private else None,
            commit_message=args.commit_message,
            revision=args.revision,
        )
    except HubError as err:
        print(f"specheads push: {err}", file=sys.stderr)
        return 1
    print(f"pushed: {url}")
    return 0


def _check_head_folder(folder: Path) -> None:
    """A specheads head folder, not a missing one nor what ``specheads export`` writes from it."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} {'is a file' if folder.exists() else 'does not exist'}")
    path = folder / CONFIG_NAME
    try:
        raw = json.loads(path.read_text()) if path.is_file() else None
    except json.JSONDecodeError:
        raw = None  # read_head_config says what is wrong with it
    if isinstance(raw, dict) and "head_type" not in raw:
        # export's own record (EAGLE, Medusa), a transformers model's (a draft model), an EAGLE-3 engine layout
        exported = "specheads" in raw or "architectures" in raw or is_eagle3_checkpoint(raw)
    else:
        exported = False
    if exported:
        raise HeadLoadError(
            f"{folder}: this is an engine checkpoint written by `specheads export`; push the specheads head folder it "
            "came from, or upload this folder with `hf upload`"
        )
    meta = read_head_config(folder)
    HEADS[meta["head_type"]].config_class.from_saved(meta["config"])  # the values' types, as load_head reads them
    weights = [folder / WEIGHTS_NAME]
    if (folder / LORA_DIR).is_dir():
        weights.append(folder / LORA_DIR / ADAPTER_WEIGHTS_NAME)
    for path in weights:  # the headers: a file nobody could load is not published
        safetensors_header(path)
