"""transformers' prompt lookup and assisted generation with stock ``F.linear`` and with the CPU kernel choice
specheads verifies with (what ``specheads bench`` now gives them), beside plain ``generate``, interleaved per prompt in
one process (docs/results.md).

    python scripts/hf_kernel_ab.py --per-category 2
"""

from __future__ import annotations

import argparse

import torch

from specheads.bench.calibration import render_prompt
from specheads.bench.lineup import _assistant
from specheads.bench.methods import hf_method
from specheads.bench.questions import load_questions, select_per_category
from specheads.bench.report import aggregate, markdown_report
from specheads.bench.runner import run_benchmark
from specheads.bench.settings import BenchSettings
from specheads.decoding.tuning.cpu_kernels import SmallBatchLinear
from specheads.shipped_data import find_default_questions
from specheads.target import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--assistant", help="a trained specheads draft model (default: the target's first 6 layers)")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    target, tokenizer = load_target(args.target)
    shared_kernels = SmallBatchLinear()
    rows = sorted(shared_kernels.faster_row_counts(target))
    print(f"{torch.get_num_threads()} threads; row counts the measured choice swaps here: {rows or 'none'}")
    assistant, label = _assistant(BenchSettings(assistant=args.assistant), target)
    methods = [hf_method("generate", target)]
    for kernels, shared in (("stock F.linear", False), ("shared kernels", True)):
        lookup = {"prompt_lookup_num_tokens": 10}
        methods.append(
            hf_method(f"hf-prompt-lookup ({kernels})", target, kernels=shared_kernels if shared else None, **lookup)
        )
    for kernels, shared in (("stock F.linear", False), ("shared kernels", True)):
        methods.append(
            hf_method(
                f"hf-assisted ({kernels})", target, kernels=shared_kernels if shared else None, assistant=assistant
            )
        )
    questions = select_per_category(load_questions(find_default_questions()), args.per_category)
    prompts = [(q, render_prompt(tokenizer, q.prompt, target.device)) for q in questions]
    records = run_benchmark(methods, prompts, args.max_new_tokens)
    config = {
        "target": args.target,
        "device": f"cpu ({torch.get_num_threads()} threads)",
        "dtype": "float32",
        "temperature": 0.0,
        "max_new_tokens": args.max_new_tokens,
        "per_category": args.per_category,
        "cpu_kernel_rows": rows,
    }
    print(f"assistant: {label}\n" + markdown_report(aggregate(records, methods, config)))


if __name__ == "__main__":
    main()
