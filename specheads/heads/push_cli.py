"""``specheads push DIR REPO_ID``: upload a saved head folder (config, weights, card, LoRA adapter) to the Hub.

``--format vllm|sglang|speculators`` (or DIR written by ``specheads export``) uploads what that engine serves as it
is instead, with a card holding the Hub metadata, the serve command and, from ``--bench-results``, measured speed."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from specheads.heads.config import HeadConfigError
from specheads.heads.eagle3_checkpoint import is_eagle3_checkpoint
from specheads.heads.export_cli import checkpoint_target, export_main, recorded_engine
from specheads.heads.files import CARD_NAME, CONFIG_NAME, LORA_DIR, WEIGHTS_NAME, safetensors_header
from specheads.heads.hub import HubError, files_to_upload, push_folder
from specheads.heads.interop import ENGINES, ENGINES_FOR, SGLANG_EAGLE1_ARCHITECTURE, SHARED_LAYOUT_ENGINES
from specheads.heads.load import ADAPTER_WEIGHTS_NAME, HEADS, read_head_config, recorded_target_name, required_adapter
from specheads.heads.serving_card import exported_method, write_serving_card
from specheads.heads.speculators_format import SPECULATORS_ENGINE, is_speculators_checkpoint


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specheads push", description=__doc__, allow_abbrev=False)
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
    parser.add_argument(
        "--format",
        choices=("specheads", *ENGINES),
        default=None,
        help="specheads (a head folder, the default) or an engine's format: the repository then holds what that "
        "engine serves as it is (an export folder is pushed in its own format)",
    )
    parser.add_argument("--bench-results", help="a `specheads bench` results.json: its tau and speedup go on the card")
    parser.add_argument("--target", help="for --format: the target (default: the one the head's config records)")
    return parser


def push_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory() as stage:
        try:
            validate_repo_id(args.repo_id)
            folder, engine = _folder_to_push(args, Path(stage))
            files = files_to_upload(folder) if engine is None else sorted(p.name for p in folder.iterdir())
        except (FileNotFoundError, RuntimeError, HFValidationError, HeadConfigError, ValueError) as err:
            print(f"specheads push: {err}", file=sys.stderr)
            return 2
        return _push(args, folder, files, engine)


def _push(args: argparse.Namespace, folder: Path, files: list[str], engine: str | None) -> int:
    where = args.repo_id + (f" (branch {args.revision})" if args.revision else "")
    print(f"would upload to {where}: " + ", ".join(files) if args.dry_run else f"uploading {len(files)} files")
    if args.dry_run:
        return 0
    try:
        url = push_folder(  # token: from `hf auth login` / HF_TOKEN
            folder,
            args.repo_id,
            private=True if args.private else None,
            commit_message=args.commit_message,
            revision=args.revision,
            engine_folder=engine is not None,
        )
    except HubError as err:
        print(f"specheads push: {err}", file=sys.stderr)
        return 1
    print(f"pushed: {url}")
    return 0


def _folder_to_push(args: argparse.Namespace, stage: Path) -> tuple[Path, str | None]:
    """The folder to upload and its engine (None for a specheads head folder): an export folder as it is, a head
    folder as it is or, with ``--format ENGINE``, exported into ``stage``; an engine's folder gets its card."""
    folder = Path(args.folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} {'is a file' if folder.exists() else 'does not exist'}")
    engines = exported_engines(folder)
    if not engines and args.format in (None, "specheads"):
        if args.bench_results:
            raise ValueError("--bench-results goes on an engine's card: add --format vllm|sglang|speculators")
        _check_head_folder(folder)
        return folder, None
    if engines:  # an export folder: pushed in its own format (or another engine's that reads it), with a card
        meta = json.loads((folder / CONFIG_NAME).read_text())
        if args.format not in (None, "specheads", *engines):
            again = f", or export the head again with --engine {args.format}"
            raise ValueError(
                f"{folder} is a {engines[0]} export; push it without --format ({args.format} does not read that "
                f"layout){again if args.format in ENGINES_FOR[exported_method(meta)[0]] else ''}"
            )
        engine = args.format if args.format in engines else engines[0]
        target_name = args.target or _exported_target(meta)
        out, head_card = stage / "repo", None
        shutil.copytree(folder, out, ignore=shutil.ignore_patterns(".*"))
    else:
        _check_head_folder(folder)
        engine, out = args.format, stage / "repo"
        target_name = args.target or recorded_target_name(folder)
        export_argv = [str(folder), str(out), "--engine", engine, *(["--target", args.target] if args.target else [])]
        with contextlib.redirect_stdout(io.StringIO()):  # its "wrote OUT" names a folder deleted after the push
            exported = export_main(export_argv)
        if exported != 0:
            raise ValueError(f"could not export {folder} for {engine} (the reason is above)")
        head_card = (folder / CARD_NAME).read_text() if (folder / CARD_NAME).is_file() else None
    write_serving_card(out, engine, target_name, args.repo_id, args.bench_results, head_card)
    return out, engine


def exported_engines(folder: Path) -> tuple[str, ...]:
    """The engines that serve a folder ``specheads export`` wrote as it is, the one it was exported for first (its
    README says which); empty for anything else (a head folder). EAGLE-1 differs between the engines by the
    ``architectures`` SGLang loads, Medusa is vLLM's alone, and the speculators format is its own."""
    path = folder / CONFIG_NAME
    try:
        raw = json.loads(path.read_text()) if path.is_file() else None
    except json.JSONDecodeError:
        return ()  # read_head_config says what is wrong with it
    if not isinstance(raw, dict) or "head_type" in raw:
        return ()
    if is_speculators_checkpoint(raw):
        return (SPECULATORS_ENGINE,)
    if not ("specheads" in raw or "architectures" in raw or is_eagle3_checkpoint(raw)):
        return ()
    if SGLANG_EAGLE1_ARCHITECTURE in (raw.get("architectures") or ()):
        return ("sglang",)
    if exported_method(raw)[0] in ("eagle", "medusa"):  # an EAGLE-3 checkpoint reads as "eagle3"
        return ("vllm",)
    recorded = recorded_engine(folder)
    return tuple(sorted(SHARED_LAYOUT_ENGINES, key=lambda engine: engine != recorded))


def _exported_target(meta: dict) -> str:
    """The target an export was made against: as specheads named it (a built-in name keeps its license and weights
    note on the card), else as the engines' config names it."""
    recorded = ((meta.get("specheads") or {}).get("target") or {}).get("name_or_path")
    name = recorded or checkpoint_target(meta)  # a draft model's own _name_or_path is not its target
    if not name:
        raise ValueError("the export does not name its target: pass --target")
    return str(name)


def _check_head_folder(folder: Path) -> None:
    """A specheads head folder whose config and weights load."""
    meta = read_head_config(folder)
    HEADS[meta["head_type"]].config_class.from_saved(meta["config"])  # the values' types, as load_head reads them
    weights = [folder / WEIGHTS_NAME]
    if required_adapter(folder, meta) is not None:  # a Medusa-2 head without its lora/ folder is not published
        weights.append(folder / LORA_DIR / ADAPTER_WEIGHTS_NAME)
    for path in weights:  # the headers: a file nobody could load is not published
        safetensors_header(path)
