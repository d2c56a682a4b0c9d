"""What acceptance a head would need for a given speedup on the machine a `specheads bench` report was made on.

The report holds the target's forward cost by number of new tokens (the auto tree's cost curve) and, for a head, the
seconds it spent drafting, verifying and in between. A chain of k guesses, each accepted with the same probability a
given the one before it (an assumption: measured heads accept a little less at each depth), commits
1 + a + ... + a^k tokens a step and costs a verify of k + 1 tokens, k drafter steps and the loop's own time. Anchored
on the head's measured run (its speedup, tau and costs per step), the script prints the speedup each a gives at the
best k, and the a that each asked speedup and tau need.

    python scripts/acceptance_needed.py --report docs/results/bench-reference-v3/results.json \\
        --head specheads-eagle3-smollm2-135m-instruct --speedups 1.5 1.7 --tau 2.0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

MAX_CHAIN = 12


def chain_tau(a: float, k: int) -> float:
    return sum(a**i for i in range(k + 1))


class StepModel:
    """Seconds a step costs with a chain of k guesses, anchored on one measured run of the head."""

    def __init__(self, report: dict, head: str) -> None:
        method, result = report["methods"][head], report["results"][head]["overall"]
        curve = method["cost_curve"]
        self.sizes, self.seconds = np.array(curve["sizes"], float), np.array(curve["seconds"], float)
        choices = method.get("auto_tree", {}).get("choices")
        if not choices:
            raise SystemExit(f"{head}: its tree is not an auto tree that drafts; expected a head run with --tree auto")
        nodes, depth = len(choices), max(len(c) for c in choices)
        steps = result["target_forwards"] - result["prompts"]  # one forward a prompt is its prefill
        # the curve was timed at the calibration's context, not the measured prompts': scale it to this run's
        # verify time per forward
        self.scale = result["verify_s"] / result["target_forwards"] / self._curve(nodes + 1)
        self.draft_per_depth = result["draft_s"] / steps / depth
        self.other = result["other_s"] / steps
        self.measured = (result["tau"], self.cost(nodes, depth), result["speedup"])

    def _curve(self, tokens: int) -> float:
        return float(np.interp(tokens, self.sizes, self.seconds))

    def verify(self, drafted: int) -> float:
        return self._curve(drafted + 1) * self.scale

    def cost(self, drafted: int, depth: int) -> float:
        return self.verify(drafted) + depth * self.draft_per_depth + self.other

    def speedup(self, a: float, k: int) -> float:
        tau, cost, speedup = self.measured
        return speedup * (chain_tau(a, k) / tau) * (cost / self.cost(k, k))

    def best(self, a: float) -> tuple[float, int]:
        return max((self.speedup(a, k), k) for k in range(MAX_CHAIN + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", type=Path, required=True, help="a `specheads bench` results.json")
    parser.add_argument("--head", required=True, help="the method name of a head run with --tree auto")
    parser.add_argument("--speedups", type=float, nargs="+", default=[1.5, 1.7])
    parser.add_argument("--tau", type=float, default=2.0, help="a tau to reach at the chain the speed picks")
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    model = StepModel(report, args.head)
    tau, cost, speedup = model.measured
    measured_a = report["results"][args.head]["overall"]["acceptance_per_depth"][0]
    print(f"{args.head}: measured tau {tau:.2f}, {speedup:.2f}x, depth-1 acceptance {measured_a:.3f}")
    print(
        f"per step: verify of 2 tokens {1000 * model.verify(1):.1f} ms, drafter {1000 * model.draft_per_depth:.1f} "
        f"ms a depth, loop {1000 * model.other:.1f} ms"
    )
    print("\n| acceptance a | best chain k | tau | speedup |\n|---|---|---|---|")
    grid = np.round(np.arange(0.20, 0.951, 0.05), 2)
    for a in grid:
        rate, k = model.best(a)
        print(f"| {a:.2f} | {k} | {chain_tau(a, k):.2f} | {rate:.2f}x |")
    fine = np.arange(0.0, 0.99, 0.005)
    print()
    for asked in args.speedups:
        hit = next((a for a in fine if model.best(a)[0] >= asked), None)
        print(f"{asked:.2f}x needs a >= {hit:.3f}" if hit is not None else f"{asked:.2f}x: not reached below a = 0.99")
    hit = next((a for a in fine if chain_tau(a, model.best(a)[1]) >= args.tau), None)
    print(f"tau {args.tau:.2f} at the chain the speed picks needs a >= {hit:.3f}" if hit is not None else "")


if __name__ == "__main__":
    main()
