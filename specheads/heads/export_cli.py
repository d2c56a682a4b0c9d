"""``specheads export HEAD OUT``: write a trained head in the format a serving engine loads (vLLM or SGLang).

    specheads export runs/eagle3-smollm2-135m OUT [--engine vllm|sglang] [--dtype bfloat16] [--target NAME]

EAGLE-3 heads become the Llama EAGLE-3 draft checkpoint both engines read, Medusa heads vLLM's MedusaModel
checkpoint, draft models a plain transformers folder (``specheads.heads.interop``). The command prints how to serve
the result; the same lines go into ``OUT/README.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from specheads.heads.card import base_model_id
from specheads.heads.config import HeadConfigError, HeadLoadError
from specheads.heads.draft_model import DraftModel
from specheads.heads.eagle import EagleDrafter
from specheads.heads.interop import ENGINES, ExportError, export_head
from specheads.heads.load import load_head, read_head_config

DTYPES = {"keep": None, "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specheads export", description=__doc__.split("\n\n")[0])
    parser.add_argument("head", help="a folder written by head.save_pretrained() (e.g. runs/eagle3-smollm2-135m)")
    parser.add_argument("out", help="output folder")
    parser.add_argument("--engine", choices=ENGINES, default="vllm", help="which engine's format (default: vllm)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="keep", help="cast the weights (default: keep)")
    parser.add_argument(
        "--target", default=None, help="the target model (default: the one recorded in the head's config.json)"
    )
    args = parser.parse_args(argv)
    from specheads.target import load_target

    try:
        target_name = args.target or read_head_config(Path(args.head))["config"]["target"]["name_or_path"]
        target, tokenizer = load_target(target_name, check_tree_attention=False)
        head = load_head(args.head, target)
        files = export_head(head, target, args.out, engine=args.engine, dtype=DTYPES[args.dtype], tokenizer=tokenizer)
    except (ExportError, HeadConfigError, HeadLoadError, FileNotFoundError, KeyError) as err:
        print(f"specheads export: {err}", file=sys.stderr)
        return 2
    usage = serve_instructions(head, args.engine, base_model_id(target_name) or target_name, args.out)
    (Path(args.out) / "README.md").write_text(usage)
    print(f"wrote {args.out}: {', '.join(files)}\n\n{usage}")
    return 0


def serve_instructions(head: object, engine: str, target_name: str, out: str) -> str:
    """How to serve an exported head with ``engine``; ``target_name`` is the target's Hub id or local path."""
    if isinstance(head, EagleDrafter):
        method, steps = ("eagle3" if head.version == 3 else "eagle"), 3
    elif isinstance(head, DraftModel):
        method, steps = "draft_model", 4
    else:
        method, steps = "medusa", head.num_heads  # type: ignore[attr-defined]
    if engine == "sglang":
        algorithm = {"eagle3": "EAGLE3", "eagle": "EAGLE"}.get(method, "STANDALONE")
        command = (
            f"python -m sglang.launch_server --model-path {target_name} --speculative-algorithm {algorithm} "
            f"--speculative-draft-model-path {out} --speculative-num-steps {steps} --speculative-eagle-topk 4 "
            "--speculative-num-draft-tokens 16"
        )
    else:
        config = f'{{"method": "{method}", "model": "{out}", "num_speculative_tokens": {steps}}}'
        command = f"vllm serve {target_name} --speculative-config '{config}'"
    return f"# Exported by specheads for {engine}\n\nServe it beside the target it was trained on:\n\n    {command}\n"
