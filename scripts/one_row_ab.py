"""How much of a speedup is the one-row kernel: ``generate`` and a head, each with the few-row products of
``SmallBatchLinear`` for 2+ rows only (one row on the stock ``F.linear`` path, as before it measured one row) and with
one row padded to two as well, interleaved per prompt in one process (docs/results.md, "One-row products").

    python scripts/one_row_ab.py --head reference/eagle3-smollm2-135m-instruct --tree chain:3 --per-category 1
"""

from __future__ import annotations

import argparse
import time

import torch

from specheads.bench.questions import load_questions, select_per_category
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.head_drafter import build_drafter
from specheads.decoding.tuning.cpu_kernels import MAX_ROWS, SmallBatchLinear
from specheads.heads import load_head
from specheads.shipped_data import find_default_questions
from specheads.target import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", required=True)
    parser.add_argument("--tree", default="chain:3")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    target, tokenizer = load_target(args.target)
    head = load_head(args.head, target)
    kernels = {
        "2+ rows": SmallBatchLinear(rows=range(2, MAX_ROWS + 1)),
        "1+ rows": SmallBatchLinear(rows=range(1, MAX_ROWS + 1)),
    }
    questions = select_per_category(load_questions(find_default_questions()), args.per_category)
    heads = {
        name: SpeculativeGenerator(target, tokenizer, build_drafter(head, args.tree), kernels=k)
        for name, k in kernels.items()
    }
    runs = [(f"generate, {name}", name) for name in kernels] + [(f"head, {name}", name) for name in kernels]
    seconds, tokens, outputs = {r: 0.0 for r, _ in runs}, {r: 0 for r, _ in runs}, {r: [] for r, _ in runs}
    for question in questions:
        messages = [{"role": "user", "content": question.prompt}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"]
        for run, name in runs:
            start = time.perf_counter()
            if run.startswith("generate"):
                with kernels[name](target):
                    out = target.generate(
                        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.max_new_tokens
                    )
                new = out[0, ids.shape[1] :].tolist()
            else:
                new = heads[name].generate(ids[0], args.max_new_tokens).token_ids
            seconds[run] += time.perf_counter() - start
            tokens[run] += len(new)
            outputs[run].append(new)
    print(
        f"{torch.get_num_threads()} threads, {len(questions)} prompts, {args.max_new_tokens} new tokens, "
        f"tree {args.tree}"
    )
    rates = {run: tokens[run] / seconds[run] for run, _ in runs}
    base = rates["generate, 2+ rows"]
    for run, _ in runs:
        same = sum(a == b for a, b in zip(outputs[run], outputs["generate, 2+ rows"]))
        print(f"{run:20s} {rates[run]:6.1f} tok/s  {rates[run] / base:.2f}x  identical {same}/{len(questions)}")
    print(
        f"head over generate: {rates['head, 2+ rows'] / base:.2f}x with 2+ rows, "
        f"{rates['head, 1+ rows'] / rates['generate, 1+ rows']:.2f}x with one row padded to two in both"
    )


if __name__ == "__main__":
    main()
