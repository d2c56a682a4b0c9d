"""Tokens/s of `specheads data generate` at several batch sizes, on the same prompts, so the batch size is measured.

    python scripts/generation_throughput.py --prompts runs/data/sharegpt-clean.jsonl --count 32 \
        --batch-sizes 1 4 8 16 32 --max-new-tokens 128

The prompts are `count` of similar length (from the middle of the file's first `--pool` prompts sorted by length),
answered greedily by `answer_batch`, the function `data generate` runs (`rows`: a loop that drops each row from the
batch as it ends), and with `--methods rows generate` also by one transformers `generate` call per batch, which steps
every row until the longest answer ends. A token counts when it is kept in an answer (up to and including its end of
turn); what a batch computes after a row has ended is the batch's cost.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specheads.target import load_target
from specheads.training.answering import (
    GenerationSettings,
    answer_batch,
    generate_rows,
    left_pad,
    prompt_ids,
    stop_ids,
)
from specheads.training.distill import read_prompts


def generate_call(model, tokenizer, conversations, settings: GenerationSettings) -> int:
    """Answer tokens kept (EOS included) from one greedy transformers ``generate`` call over the batch."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids, mask = left_pad([prompt_ids(tokenizer, c) for c in conversations], pad_id)
    eos = stop_ids(model, tokenizer)
    kept = 0
    for row in generate_rows(model, input_ids, mask, settings, eos, pad_id):
        cut = next((i for i, token in enumerate(row) if token in eos), None)
        kept += len(row) if cut is None else cut + 1
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", required=True, help="JSONL prompts (prompt, messages or ShareGPT records)")
    parser.add_argument("--pool", type=int, default=1000, help="how many of the file's prompts to choose from")
    parser.add_argument("--count", type=int, default=32, help="prompts answered at every batch size")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["rows"], choices=["rows", "generate"])
    parser.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()

    model, tokenizer = load_target(args.target)
    records = read_prompts(args.prompts, args.pool)
    records.sort(key=lambda r: len(prompt_ids(tokenizer, r["messages"])))
    middle = max(0, len(records) // 2 - args.count // 2)
    chosen = records[middle : middle + args.count]
    lengths = [len(prompt_ids(tokenizer, r["messages"])) for r in chosen]
    print(f"{len(chosen)} prompts of {min(lengths)}-{max(lengths)} tokens, {torch.get_num_threads()} threads")
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    answer_batch(model, tokenizer, [chosen[0]["messages"]], GenerationSettings(max_new_tokens=8))  # warm-up
    rows = []
    print("| method | batch size | answer tokens | seconds | tokens/s |")
    print("|---|---|---|---|---|")
    for size in args.batch_sizes:
        for method in args.methods:  # interleaved, so a busy spell hits both
            tokens, start = 0, time.perf_counter()
            for first in range(0, len(chosen), size):
                batch = [r["messages"] for r in chosen[first : first + size]]
                if method == "generate":
                    tokens += generate_call(model, tokenizer, batch, settings)
                else:
                    answers = answer_batch(model, tokenizer, batch, settings)
                    tokens += sum(len(a.token_ids) + a.finished for a in answers)
            seconds = time.perf_counter() - start
            row = {"method": method, "batch_size": size, "tokens": tokens, "seconds": seconds}
            rows.append(row | {"tokens_per_s": tokens / seconds})
            print(f"| {method} | {size} | {tokens} | {seconds:.1f} | {tokens / seconds:.1f} |", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"prompt_tokens": [min(lengths), max(lengths)], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
