"""How much of the target's benchmark answers a reduced draft vocabulary can express, per size and category.

An EAGLE-3 head drafts only inside its draft vocabulary (the most frequent answer tokens of its training data,
``build_vocab_maps``), so the share of the target's own answer tokens inside it bounds the head's acceptance from
above, before any training. This measures that bound for several sizes on one training config's data:

    python scripts/draft_vocab_coverage.py --config configs/eagle3/smollm2-135m-sharegpt.yaml \
        --data runs/data/specbench-4pc-greedy.jsonl --categories runs/data/specbench-4pc-prompts.jsonl \
        --sizes 8192 16384 32768
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specheads.heads import build_vocab_maps
from specheads.target import load_target
from specheads.training.config import load_config
from specheads.training.data import DataConfig, build_datasets
from specheads.training.run_setup import loss_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the training config whose data builds the vocabulary")
    parser.add_argument("--data", required=True, help="the target's answers to benchmark prompts (messages JSONL)")
    parser.add_argument("--categories", required=True, help="the prompts file with a 'category' per id")
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192, 16384, 32768])
    args = parser.parse_args()

    cfg = load_config(args.config)
    _, tokenizer = load_target(cfg.target.name)
    train, _ = build_datasets(cfg.data, tokenizer)
    vocab = len(tokenizer)
    training_tokens = loss_tokens(train)
    bench, _ = build_datasets(DataConfig(paths=[args.data], max_length=cfg.data.max_length, eval_size=0), tokenizer)
    prompts = [json.loads(x) for x in Path(args.categories).read_text().splitlines() if x.strip()]
    category = {str(prompt["id"]): prompt["category"] for prompt in prompts}  # data generate writes ids as text
    records = [json.loads(x) for x in Path(args.data).read_text().splitlines() if x.strip()]
    groups: dict[str, list[int]] = {}
    if len(bench) < len(records):
        print(f"{len(records) - len(bench)} of {len(records)} answers start past max_length: not counted")
    for tokens, source in zip(loss_tokens(bench), bench["source"], strict=True):  # rows shift past a dropped answer
        groups.setdefault(category[str(records[source]["id"])], []).extend(tokens)
    groups["all"] = [t for name in list(groups) for t in groups[name]]
    print(f"{len(training_tokens)} training records, {sum(map(len, training_tokens)):,} answer tokens; vocab {vocab}")
    print("| draft vocabulary | " + " | ".join(groups) + " |")
    print("|---" * (len(groups) + 1) + "|")
    for size in args.sizes:
        _, t2d = build_vocab_maps(training_tokens, vocab, size)
        cells = [f"{(t2d[torch.tensor(tokens)] >= 0).float().mean().item():.3f}" for tokens in groups.values()]
        print(f"| {size:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
