"""Does decoding accept what the head guesses teacher-forced? A one-guess chain, replayed on the target's own output.

Decoding a chain of one guess per step, a step accepts the head's guess for the next token or not, and either way the
target adds one token. Replayed teacher-forced, one target forward over prompt + output gives the head's guess at
every position; walking them as the verifier does (an accepted guess skips the target's next token, which no guess
was made for) must accept exactly the steps that decoding accepted. When it does, the drafter reads at decode time
what training gave it, and the gap between teacher-forced acceptance over all positions and accepted guesses per step
is the walk itself: the positions after an accepted guess, which are easier than most, are never guessed.

    specheads bench --per-category 4 --max-new-tokens 64 --head reference/eagle3-smollm2-135m-instruct \
        --tree chain:1 --methods specheads-plain --out docs/results/bench-chain1
    python scripts/chain_replay.py --head reference/eagle3-smollm2-135m-instruct \
        --data runs/data/specbench-4pc-greedy.jsonl --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specheads.decoding.tuning.replay import guess_ranks, walk_steps
from specheads.heads import load_head
from specheads.target import load_target


def replayed_chain_steps(head, target, ids: torch.Tensor, new_ids: list[int]) -> tuple[list[int], list[bool]]:
    """(accepted guesses per step, 0 or 1, of a one-guess chain; whether the head's guess is right at each output
    position after the first), replayed on prompt ``ids`` (1, P) and the target's output ``new_ids``."""
    sequence = torch.cat([ids[0], torch.tensor(new_ids, dtype=ids.dtype)])  # (T,)
    ranks = guess_ranks(head, target, sequence, ids.shape[1], max_guesses=1)
    return walk_steps(ranks, 1), [rank == 0 for rank in ranks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", required=True)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--data", required=True, help="the target's greedy answers (`specheads data generate` JSONL)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    target, tokenizer = load_target(args.target)
    head = load_head(args.head, target).eval()
    steps, right = [], []
    for line in tqdm(Path(args.data).read_text().splitlines(), desc="replaying"):
        record = json.loads(line)
        ids = tokenizer.apply_chat_template(
            record["messages"][:1], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        walked, guessed = replayed_chain_steps(head, target, ids, record["answer_token_ids"][: args.max_new_tokens])
        steps += walked
        right += guessed
    print(
        f"teacher-forced depth 1 over every position: {sum(right) / len(right):.3f} ({len(right)} positions); "
        f"one-guess chain: {sum(steps)} of {len(steps)} steps accepted ({sum(steps) / len(steps):.3f})"
    )


if __name__ == "__main__":
    main()
