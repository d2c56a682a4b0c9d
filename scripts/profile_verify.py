"""Time one tree verification of n tokens (1 = a decode step) on the target, with and without ``small_batch_linear``
(docs/results.md; one row is padded to two there).

The swapped kernel is forced for every row count here, so both columns are measured; the generator uses it only for
the row counts ``faster_row_counts`` finds faster on this machine, printed last.

    python scripts/profile_verify.py [--target smollm2-135m-instruct] [--prefix 200] [--repeats 7]

Sizes and kernels are interleaved within each repeat and the median is printed, so machine noise hits all alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from specheads.decoding.kv_cache import crop_to
from specheads.decoding.tree import chain_parents
from specheads.decoding.tuning.cpu_kernels import MAX_ROWS, faster_row_counts, small_batch_linear
from specheads.decoding.verify import verify_tree
from specheads.target import load_target

SIZES = (1, 2, 3, 4, 8, 16, 32, 64)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--prefix", type=int, default=200, help="cached prompt tokens before the tree")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    model, _ = load_target(args.target)
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, args.prefix), generator=generator)
    cache = DynamicCache(config=model.config)
    model(input_ids=prompt, cache=cache, use_cache=True)
    times: dict[tuple[int, bool], list[float]] = {}
    for _ in range(args.repeats):
        for n in SIZES:
            for fast in (False, True):
                tokens = torch.randint(0, vocab, (n,), generator=generator)
                with small_batch_linear(model, rows=range(1, MAX_ROWS + 1)) if fast else torch.inference_mode():
                    start = time.perf_counter()
                    verify_tree(model, cache, tokens, chain_parents(n))
                    times.setdefault((n, fast), []).append(time.perf_counter() - start)
                crop_to(cache, args.prefix)
    print(f"{torch.get_num_threads()} threads, prefix {args.prefix}, median of {args.repeats} (ms)")
    print("tokens | stock F.linear | small_batch_linear | stock / 1 token")
    base = statistics.median(times[(1, False)])
    for n in SIZES:
        stock, fast = statistics.median(times[(n, False)]), statistics.median(times[(n, True)])
        print(f"{n:6d} | {stock * 1e3:14.1f} | {fast * 1e3:18.1f} | {stock / base:.2f}x")
    print(
        f"row counts the generator computes with small_batch_linear here: {sorted(faster_row_counts(model)) or 'none'}"
    )


if __name__ == "__main__":
    main()
