"""``specheads push DIR REPO_ID``: upload a saved head folder (config, weights, card, LoRA adapter) to the Hub."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specheads.heads.hub import HubError, files_to_upload, push_folder
from specheads.heads.load import read_head_config


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
    parser.add_argument("--dry-run", action="store_true", help="check the folder and list what would be uploaded")
    args = parser.parse_args(argv)
    try:
        read_head_config(Path(args.folder))
        files = files_to_upload(args.folder)
    except (FileNotFoundError, RuntimeError) as err:
        print(f"specheads push: {err}", file=sys.stderr)
        return 2
    print(f"would upload to {args.repo_id}: " + ", ".join(files) if args.dry_run else f"uploading {len(files)} files")
    if args.dry_run:
        return 0
    try:
        url = push_folder(
            args.folder, args.repo_id, private=True if args.private else None
        )  # token: from `hf auth login` / HF_TOKEN
    except HubError as err:
        print(f"specheads push: {err}", file=sys.stderr)
        return 1
    print(f"pushed: {url}")
    return 0
