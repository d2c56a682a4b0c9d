"""One head and tree decoded with the CPU kernel swap forced for every row count ("before") and with the measured
per-row-count choice the generator makes ("now"), beside plain ``generate``, interleaved per prompt in one process.

    python scripts/kernel_ab.py --head runs/demo-eagle3-smollm2-135m --tree chain:1 --per-category 2
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from specheads.bench.questions import load_questions, select_per_category
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.head_drafter import build_drafter
from specheads.decoding.tuning.cpu_kernels import MAX_ROWS, SmallBatchLinear, small_batch_linear
from specheads.heads import load_head
from specheads.shipped_data import find_default_questions
from specheads.target import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", required=True)
    parser.add_argument("--tree", default="chain:1")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    target, tokenizer = load_target(args.target)
    head = load_head(args.head, target)
    kernels = SmallBatchLinear()
    swapped = sorted(kernels.faster_row_counts(target)) or "none"
    print(f"{torch.get_num_threads()} threads; row counts the measured choice swaps here: {swapped}")
    questions = select_per_category(load_questions(find_default_questions()), args.per_category)
    forced = SpeculativeGenerator(target, tokenizer, build_drafter(head, args.tree))
    measured = SpeculativeGenerator(target, tokenizer, build_drafter(head, args.tree), kernels=kernels)
    names = ("generate", "swap forced (before)", "measured choice (now)")
    seconds, tokens, forwards, identical = ({name: 0 for name in names} for _ in range(4))
    for question in questions:
        messages = [{"role": "user", "content": question.prompt}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"]
        baseline: list[int] = []
        for name in names:
            start = time.perf_counter()
            if name == "generate":
                out = target.generate(
                    ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.max_new_tokens
                )
                baseline = new = out[0, ids.shape[1] :].tolist()
                steps = len(new)  # one forward a token, the prefill included
            else:
                every_count = small_batch_linear(target, rows=range(2, MAX_ROWS + 1))
                with every_count if name.startswith("swap") else contextlib.nullcontext():
                    result = (forced if name.startswith("swap") else measured).generate(ids[0], args.max_new_tokens)
                new, steps = result.token_ids, result.stats.target_forwards  # the prefill counts, as in bench
            seconds[name] += time.perf_counter() - start
            tokens[name], forwards[name], identical[name] = (
                tokens[name] + len(new),
                forwards[name] + steps,
                identical[name] + (new == baseline),
            )
    base_rate = tokens["generate"] / seconds["generate"]
    for name in names:
        rate = tokens[name] / seconds[name]
        print(
            f"{name:24s} {rate:6.1f} tok/s  {rate / base_rate:.2f}x  tau {tokens[name] / forwards[name]:.2f}  "
            f"identical {identical[name]}/{len(questions)}"
        )


if __name__ == "__main__":
    main()
