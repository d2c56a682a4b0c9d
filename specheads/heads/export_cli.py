"""``specheads export HEAD OUT``: write a trained head in the format a serving engine loads (vLLM or SGLang).

    specheads export runs/eagle3-smollm2-135m OUT [--engine vllm|sglang|speculators] [--dtype bfloat16] [--target NAME]

EAGLE-3 heads become the Llama EAGLE-3 draft checkpoint both engines read (or, with ``--engine speculators``, the
speculators format that vLLM serves with ``vllm serve OUT``), Medusa heads vLLM's MedusaModel
checkpoint, draft models a plain transformers folder (``specheads.heads.interop``). The command prints how to serve
the result; the same lines go into ``OUT/README.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from specheads.heads.base import WEIGHTS_NAME
from specheads.heads.card import base_model_id, builtin_weights_note
from specheads.heads.config import HeadConfigError, HeadLoadError
from specheads.heads.draft_model import DraftModel
from specheads.heads.eagle import EagleHead
from specheads.heads.hub import HubError
from specheads.heads.interop import ENGINES, ExportError, export_head
from specheads.heads.load import LORA_DIR, load_head, read_head_config, resolve_head_folder
from specheads.heads.serving_card import serve_command

DTYPES = {"keep": None, "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specheads export", description=__doc__.split("\n\n")[0])
    parser.add_argument("head", help="a folder written by head.save_pretrained() (e.g. runs/eagle3-smollm2-135m)")
    parser.add_argument("out", help="output folder (new or empty; an existing one only with --overwrite)")
    parser.add_argument(
        "--overwrite", action="store_true", help="write into OUT even when it holds files (never the head's folder)"
    )
    parser.add_argument("--engine", choices=ENGINES, default="vllm", help="which engine's format (default: vllm)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="keep", help="cast the weights (default: keep)")
    parser.add_argument(
        "--target", default=None, help="the target model (default: the one recorded in the head's config.json)"
    )
    args = parser.parse_args(argv)
    from specheads.target import TargetLoadError, load_target

    try:
        folder = resolve_head_folder(args.head)
        check_output_folder(folder, Path(args.out), args.overwrite)
        if (folder / LORA_DIR).is_dir():
            raise ExportError(
                f"{args.head} is a Medusa-2 head: its heads were trained with the LoRA adapter in {LORA_DIR}/, and an "
                "engine would serve them beside the plain target. Merge the adapter into a copy of the target "
                "(peft's merge_and_unload), serve that copy, and export the heads without the lora/ folder"
            )
        target_name = args.target or read_head_config(folder)["config"]["target"]["name_or_path"]
        if not target_name:
            raise ExportError(f"{args.head} does not record its target's name (it was built in code): pass --target")
        target, tokenizer = load_target(target_name, check_tree_attention=False)
        head = load_head(folder, target)
        dtype = DTYPES[args.dtype] or saved_dtype(folder)  # keep: the dtype the head was saved in
        files = export_head(head, target, args.out, engine=args.engine, dtype=dtype, tokenizer=tokenizer)
    except (ExportError, HeadConfigError, HeadLoadError, HubError, TargetLoadError, FileNotFoundError, KeyError) as err:
        print(f"specheads export: {err}", file=sys.stderr)
        return 2
    usage = serve_instructions(head, args.engine, base_model_id(target_name) or target_name, args.out)
    if note := builtin_weights_note(target_name):
        usage += f"\n{note}\n"
    (Path(args.out) / "README.md").write_text(usage)
    print(f"wrote {args.out}: {', '.join(files)}\n\n{usage}")
    return 0


def check_output_folder(head: Path, out: Path, overwrite: bool) -> None:
    """Export writes ``config.json`` and ``model.safetensors``, the names a head's own files have: the head's folder
    is never an output, and a folder that holds files is one only with ``--overwrite``."""
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
    return f"# Exported by specheads for {engine}\n\nServe it beside the target it was trained on:\n\n    {command}\n"
