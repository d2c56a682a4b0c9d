"""The target's verify cost by tree size at several context lengths, as ``--tree auto`` times it
(``measure_cost_curve``, the CPU kernels decoding uses), relative to one token (docs/results.md, "The auto tree's
verify cost, timed by the calibration").

    python scripts/verify_cost_by_context.py [--target smollm2-135m-instruct] [--contexts 128 512 1024] [--repeats 16]

Each context is timed on its own cache; within it sizes are interleaved and the fastest pass is kept.
"""

from __future__ import annotations

import argparse

import torch

from specheads.decoding.tuning.cost_curve import COST_SIZES, measure_cost_curve
from specheads.decoding.tuning.cpu_kernels import CpuKernels
from specheads.target import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument(
        "--contexts", type=int, nargs="+", default=[128, 512, 1024], help="cached tokens before the tree"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(COST_SIZES[:-1]), help="tree sizes, root included")
    parser.add_argument("--repeats", type=int, default=16)
    args = parser.parse_args()
    target, _ = load_target(args.target)
    kernels = CpuKernels() if target.device.type == "cpu" else None
    print(f"| context | {' | '.join(str(n) for n in args.sizes)} |")
    print(f"|---|{'---|' * len(args.sizes)}")
    for context in args.contexts:
        curve = measure_cost_curve(target, args.sizes, prefix_len=context, repeats=args.repeats, kernels=kernels)
        cells = [f"{1000 * curve.seconds[0]:.1f} ms"] + [f"{s / curve.seconds[0]:.2f}x" for s in curve.seconds[1:]]
        print(f"| {context} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
