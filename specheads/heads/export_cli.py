"""``specheads export HEAD OUT``: write a trained head in the format a serving engine loads (vLLM, SGLang, speculators).

    specheads export runs/eagle3-smollm2-135m OUT [--engine vllm|sglang|speculators] [--dtype bfloat16] [--target NAME]

EAGLE-3 heads become the Llama EAGLE-3 draft checkpoint both engines read (or, with ``--engine speculators``, the
speculators format that vLLM serves with ``vllm serve OUT``), Medusa heads vLLM's MedusaModel
checkpoint, draft models a plain transformers folder (``specheads.heads.interop``). The command prints how to serve
the result; the same lines go into ``OUT/README.md``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from specheads.heads.base import CONFIG_NAME, WEIGHTS_NAME
from specheads.heads.card import base_model_id, builtin_weights_note
from specheads.heads.config import HeadConfigError, HeadLoadError
from specheads.heads.draft_model import DraftModel
from specheads.heads.eagle import EagleHead
from specheads.heads.eagle3_checkpoint import is_eagle3_checkpoint
from specheads.heads.files import CARD_NAME
from specheads.heads.hub import HubError
from specheads.heads.interop import ENGINES, ExportError, export_head
from specheads.heads.load import LORA_DIR, load_head, recorded_target_name, resolve_head_folder
from specheads.heads.serving_card import serve_command

DTYPES = {"keep": None, "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

EXPORT_HEADING = "# Exported by specheads for "
"""The first line of the README.md an export writes, followed by the engine: vLLM and SGLang read the same EAGLE-3
and draft-model folders, so this line is what tells a push which engine the folder was exported for."""

EXPORT_FILE_PATTERNS = (
    CONFIG_NAME,
    WEIGHTS_NAME,
    CARD_NAME,
    # a draft model: transformers' save_pretrained (shards and their index) and its tokenizer's files
    "model-?????-of-?????.safetensors",
    "model.safetensors.index.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.model",
)
"""The names of every file an export may write: ``--overwrite`` replaces these and nothing else."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specheads export", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("head", help="a folder written by head.save_pretrained() (e.g. runs/eagle3-smollm2-135m)")
    parser.add_argument("out", help="output folder (new or empty; an existing one only with --overwrite)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export in OUT (never files no export writes, nor the head's folder)",
    )
    parser.add_argument("--engine", choices=ENGINES, default="vllm", help="which engine's format (default: vllm)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="keep", help="cast the weights (default: keep)")
    parser.add_argument(
        "--target", default=None, help="the target model (default: the one recorded in the head's config.json)"
    )
    return parser


def export_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from specheads.target import TargetLoadError, load_target

    try:
        folder = resolve_head_folder(args.head)
        check_output_folder(folder, Path(args.out), args.overwrite)
        if (folder / LORA_DIR).is_dir():
            raise ExportError(
                f"{args.head} is a Medusa-2 head: its heads were trained with the LoRA adapter in {LORA_DIR}/, and an "
                "engine would serve them beside the plain target. Merge the adapter into a copy of the target "
                "(peft's merge_and_unload) and serve that copy; to export the heads, copy the head folder without "
                "lora/ and without lora_adapter in its config.json, and pass --target the merged copy"
            )
        target_name = args.target or recorded_target(folder, args.head)
        target, tokenizer = load_target(target_name, check_tree_attention=False)
        head = load_head(folder, target)
        dtype = DTYPES[args.dtype] or saved_dtype(folder)  # keep: the dtype the head was saved in
        usage = serve_instructions(head, args.engine, base_model_id(target_name) or target_name, args.out)
        if note := builtin_weights_note(target_name):
            usage += f"\n{note}\n"

        def write(stage: Path) -> list[str]:
            files = export_head(head, target, stage, engine=args.engine, dtype=dtype, tokenizer=tokenizer)
            (stage / CARD_NAME).write_text(usage)
            return files

        files = replace_export(Path(args.out), write)
    except (ExportError, HeadConfigError, HeadLoadError, HubError, TargetLoadError, FileNotFoundError) as err:
        print(f"specheads export: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {', '.join(files)}\n\n{usage}")
    return 0


def recorded_target(folder: Path, given_as: str) -> str:
    """The target to export a head against without ``--target``: the one a specheads head's config records or, for
    an imported EAGLE-3 checkpoint, the one its config names when that loads here without a download (a local
    folder or a built-in name: a downloaded checkpoint may name anything)."""
    try:
        raw = json.loads((folder / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        raw = None  # read_head_config says what is wrong with it
    if not (isinstance(raw, dict) and is_eagle3_checkpoint(raw)):
        name = recorded_target_name(folder)
        if not name:
            raise ExportError(f"{given_as} does not record its target's name (it was built in code): pass --target")
        return name
    from specheads.target import BUILTIN_TARGETS

    name = checkpoint_target(raw)
    if name is None or not (name in BUILTIN_TARGETS or Path(name).is_dir()):
        named = f"names its target {name!r}, not a local folder or built-in target" if name else "names no target"
        raise ExportError(f"{given_as} is an EAGLE-3 checkpoint that {named}: pass --target (the model it drafts for)")
    return name


def checkpoint_target(meta: dict[str, Any]) -> str | None:
    """The target an engine-format ``config.json`` names: speculators' verifier, or the engines' base model."""
    verifier = (meta.get("speculators_config") or {}).get("verifier") or {}
    name = verifier.get("name_or_path") or meta.get("base_model_name_or_path")
    return str(name) if name else None


def check_output_folder(head: Path, out: Path, overwrite: bool) -> None:
    """Export writes ``config.json`` and ``model.safetensors``, the names a head's own files have: the head's folder
    is never an output, and a folder that holds files is one only with ``--overwrite`` and only when every file is
    one an export writes (``replace_export`` deletes those)."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"output {out} is a file; expected a folder to write the export into: pick another OUT")
    if out.is_dir() and out.resolve() == head.resolve():
        raise ExportError(
            f"output {out} is the head's own folder ({head}); the export would replace the head's files with the "
            "engine's: pick another OUT"
        )
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(
            f"output {out} already holds files; expected a new or empty folder: pick another OUT, or pass "
            "--overwrite to replace what an earlier export wrote there"
        )
    foreign = sorted(path.name for path in out.iterdir() if not is_export_file(path)) if out.is_dir() else []
    if foreign:
        raise ExportError(
            f"output {out} holds files no export writes ({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}"
            ") and --overwrite replaces only an earlier export's files: move them out of OUT or pick another OUT"
        )


def is_export_file(path: Path) -> bool:
    """A file whose name an export may write (``EXPORT_FILE_PATTERNS``)."""
    return path.is_file() and any(fnmatch.fnmatchcase(path.name, pattern) for pattern in EXPORT_FILE_PATTERNS)


def replace_export(out: Path, write: Callable[[Path], list[str]]) -> list[str]:
    """Run ``write`` (which returns the names of the files it wrote) into a new folder beside ``out``, then replace
    the earlier export's files in ``out`` with those: a failed export leaves ``out`` as it was, a finished one leaves
    only its own files there (an engine would also load an earlier export's shards and index)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        files = write(stage)
        out.mkdir(exist_ok=True)
        for path in out.iterdir():
            if is_export_file(path):
                path.unlink()
        for path in stage.iterdir():
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return files


SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def saved_dtype(folder: Path) -> torch.dtype | None:
    """The floating dtype of a saved head's weights (heads load in the target's dtype, which may differ), or None
    when the folder has no specheads weights file (an imported checkpoint keeps the dtype it loads in)."""
    path = folder / WEIGHTS_NAME
    if not path.is_file():
        return None
    with safe_open(str(path), "pt") as f:
        kinds = {f.get_slice(name).get_dtype() for name in f.keys()}
    return next((SAFETENSORS_DTYPES[k] for k in ("BF16", "F16", "F32") if k in kinds), None)


def serve_instructions(head: object, engine: str, target_name: str, out: str) -> str:
    """How to serve an exported head with ``engine``; ``target_name`` is the target's Hub id or local path."""
    if isinstance(head, EagleHead):
        method, steps = ("eagle3" if head.version == 3 else "eagle"), 3
    elif isinstance(head, DraftModel):
        method, steps = "draft_model", 4
    else:
        method, steps = "medusa", head.num_heads  # type: ignore[attr-defined]
    command = serve_command(method, steps, engine, target_name, out)
    return f"{EXPORT_HEADING}{engine}\n\nServe it beside the target it was trained on:\n\n    {command}\n"


def recorded_engine(folder: Path) -> str | None:
    """The engine an export folder was written for, from its README's first line (``EXPORT_HEADING``), or None."""
    try:
        first = (folder / CARD_NAME).read_text().partition("\n")[0]
    except (OSError, UnicodeDecodeError):
        return None
    engine = first.removeprefix(EXPORT_HEADING)
    return engine if first.startswith(EXPORT_HEADING) and engine in ENGINES else None
