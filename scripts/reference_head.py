"""Save a trained head as the repository's reference head: bf16 weights and a card with its training and acceptance.

    python scripts/reference_head.py runs/eagle3-sharegpt/curve/step-475 reference/eagle3-smollm2-135m-instruct \
        --config configs/eagle3/smollm2-135m-sharegpt.yaml

The head folder is one that ``scripts/scaling_curve.py`` wrote from a training checkpoint; the acceptance it measured
there (``acceptance-*.json``) goes into the card.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specheads.heads import load_head
from specheads.target import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("head", help="a saved head folder")
    parser.add_argument("out", help="the reference head folder to write")
    parser.add_argument("--config", required=True, help="the training config that made the head")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument(
        "--recipe",
        default="docs/results.md, 'Broad data: EAGLE-3 on ShareGPT, fixed text'",
        help="where the head's data, commands and wall time are written up (goes into the card)",
    )
    args = parser.parse_args()

    source = Path(args.head)
    target, _ = load_target(args.target)
    head = load_head(source, target).to(torch.bfloat16)
    measured = {path.stem: json.loads(path.read_text()) for path in sorted(source.glob("acceptance-*.json"))}
    card = {
        "training": {
            "command": f"specheads train --config {args.config}",
            "recipe": args.recipe,
            "weights": "bf16 copy of the fp32 training checkpoint",
        },
        "acceptance": measured,
    }
    out = head.save_pretrained(args.out, card=card)
    size = sum(path.stat().st_size for path in out.iterdir()) / 2**20
    print(f"wrote {out} ({size:.1f} MiB)")


if __name__ == "__main__":
    main()
