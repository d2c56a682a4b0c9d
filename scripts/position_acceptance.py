"""Acceptance against position in a long context: does a head draft as well at token 7,000 as at token 500?

Each long document (the prompts of one category of `data/long_context/questions.jsonl`, chat template applied) is
read once by the target; every head is then evaluated teacher-forced on it, one band of positions at a time
(``--edges``): acceptance at depth d in a band is the share of its positions where the head's d-th chained guess
equals the target's own next token, given the d-1 before it were right. Compare a head trained with
``loss.position_offset`` (LongSpec's anchor-offset indices) against one trained without it:

    python scripts/position_acceptance.py --head runs/eagle3-long-control --head runs/eagle3-long \
        --out docs/results/long-context

Prints a markdown table and writes it, with the raw numbers, under ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specheads.bench.calibration import render_prompt
from specheads.bench.questions import load_questions
from specheads.heads import load_head
from specheads.target import load_target
from specheads.training.features import extract_features
from specheads.training.metrics import teacher_forced_acceptance

QUESTIONS = Path(__file__).resolve().parent.parent / "data" / "long_context" / "questions.jsonl"


def documents(path: Path, category: str, tokenizer) -> list[list[int]]:
    questions = load_questions(path)
    chosen = [q for q in questions if q.category == category]
    if not chosen:
        found = sorted({q.category for q in questions})
        raise SystemExit(f"--category {category!r} has no questions in {path}; it has {found}")
    return [render_prompt(tokenizer, q.prompt, torch.device("cpu")).view(-1).tolist() for q in chosen]


def band_batches(ids: list[int], features, start: int, end: int):
    """One document's (batch, features) pair whose loss positions are the band [start, end)."""
    length = len(ids)
    loss_mask = torch.zeros(1, length, dtype=torch.long)
    loss_mask[0, start : min(end, length)] = 1
    batch = {
        "input_ids": torch.tensor([ids]),
        "attention_mask": torch.ones(1, length, dtype=torch.long),
        "loss_mask": loss_mask,
    }
    return batch, features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", action="append", required=True, help="a saved EAGLE head folder (repeatable)")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument("--category", default="long-7.5k", help="whose documents to read")
    parser.add_argument("--edges", type=int, nargs="+", default=[0, 1024, 2048, 4096, 8192], help="band edges")
    parser.add_argument("--depths", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    target, tokenizer = load_target(args.target)
    docs = documents(args.questions, args.category, tokenizer)
    heads = {name: load_head(name, target) for name in args.head}
    read = {tuple(head.layer_ids) for head in heads.values()}
    if len(read) != 1:
        raise SystemExit(f"the heads read different target layers {sorted(read)}; compare heads of one target")
    layer_ids = list(read.pop())
    with torch.no_grad():
        features = [extract_features(target, torch.tensor([ids]), torch.ones(1, len(ids)), layer_ids) for ids in docs]
    bands = list(zip(args.edges, args.edges[1:]))
    rows = []
    for name, head in heads.items():
        for start, end in bands:
            loader = [band_batches(ids, feats, start, end) for ids, feats in zip(docs, features) if len(ids) > start]
            if not loader:  # no document reaches this band
                print(f"{name}: no document reaches position {start}; band {start}-{end} left out", flush=True)
                continue
            row = {"head": name, "band": f"{start}-{min(end, max(map(len, docs)))}"}
            row |= teacher_forced_acceptance(head, target, loader, args.depths)
            print(json.dumps(row), flush=True)
            rows.append(row)
    write(rows, args, [len(ids) for ids in docs])


def write(rows: list[dict], args, lengths: list[int]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "acceptance.json").write_text(json.dumps({"documents": lengths, "rows": rows}, indent=1))
    depth_cols = [f"depth {d}" for d in range(1, args.depths + 1)]
    lines = [
        f"Documents: {args.category} of {args.questions.name}, {lengths} tokens.",
        "",
        "| head | positions | " + " | ".join(depth_cols) + " | tau (chain) |",
        "|---|---|" + "---|" * (len(depth_cols) + 1),
    ]
    for row in rows:
        cells = [f"{row[f'depth{d}']:.3f}" for d in range(1, args.depths + 1)] + [f"{row['tau']:.2f}"]
        lines.append(f"| {row['head']} | {row['band']} | " + " | ".join(cells) + " |")
    (args.out / "acceptance.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
