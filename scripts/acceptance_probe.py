"""Decode-time acceptance of a head on held-out conversations of its own feature cache.

Training reports teacher-forced top-1 accuracy on the cache's eval split; this decodes the same conversations'
prompts with a one-guess chain (greedy, the real speculative loop) and reports accepted guesses per step. When the
two agree, the head sees at inference what it saw in training, and a lower acceptance on other prompts (Spec-Bench)
is a matter of data, not of a feature mismatch.

    python scripts/acceptance_probe.py --head runs/eagle3-smollm2-135m-cont --cache runs/features-smollm2-1k/eval \
        --conversations 20 --max-new-tokens 64
"""

from __future__ import annotations

import argparse

import torch
from tqdm.auto import tqdm

from specheads.decoding import SpeculativeGenerator, build_drafter
from specheads.heads import load_head
from specheads.target import load_target
from specheads.training.feature_cache import CachedFeatureDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", required=True)
    parser.add_argument("--cache", required=True, help="a feature cache split, e.g. runs/features/eval")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--tree", default="chain:1", help="tree setting (build_drafter); chain:1 = one guess")
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    target, tokenizer = load_target(args.target)
    generator = SpeculativeGenerator(target, tokenizer, build_drafter(load_head(args.head, target), args.tree))
    cache = CachedFeatureDataset(args.cache)
    steps = accepted = same = 0
    count = min(args.conversations, len(cache))
    for index in tqdm(range(count), desc="decoding"):
        sample = cache[index]
        answer_start = int(sample["loss_mask"].nonzero()[0])
        prompt = sample["input_ids"][:answer_start]
        result = generator.generate(prompt.tolist(), max_new_tokens=args.max_new_tokens)
        stats = result.stats
        steps += stats.target_forwards - 1  # the prefill proposes nothing
        accepted += stats.new_tokens - stats.target_forwards  # every step also commits one target token
        reference = sample["input_ids"][answer_start : answer_start + len(result.token_ids)].tolist()
        same += reference == result.token_ids
    print(
        f"{count} conversations, {steps} steps: {accepted / steps:.3f} accepted guesses per step (tau "
        f"{1 + accepted / steps:.2f}); {same}/{count} outputs equal the cached answer"
    )


if __name__ == "__main__":
    with torch.inference_mode():
        main()
