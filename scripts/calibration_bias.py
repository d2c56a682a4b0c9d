"""Does the ``auto`` tree's calibration read the acceptance a small tree gets? The wide tree against a one-guess chain.

``--tree auto`` calibrates a head with a wide tree (``calibration_drafter``: 6 deep, 4 guesses a depth) and prices
every smaller tree on the per-(depth, rank) acceptance it records. Each step of that wide tree starts after a
rejection at some depth, while a one-guess chain also starts steps right after an accepted guess; easy positions come
in runs, so the two see different positions. This runs both on the same prompts, greedy, and prints the depth-1
rank-0 acceptance each records, per prompt (hits/trials) and overall.

    python scripts/calibration_bias.py --head reference/eagle3-smollm2-135m-instruct              # built-in prompts
    python scripts/calibration_bias.py --head reference/eagle3-smollm2-135m-instruct \
        --question-ids 82 162 242 322 402 482 --max-new-tokens 32 64     # the held-out questions `make demo` used
"""

from __future__ import annotations

import argparse

import torch

from specheads.bench.questions import load_questions
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.head_drafter import build_drafter
from specheads.decoding.tuning.auto_tree import BUILTIN_CALIBRATION_PROMPTS, calibration_drafter
from specheads.decoding.tuning.cost_model import RecordingDrafter
from specheads.heads import load_head
from specheads.target import load_target


def first_guess_acceptance(target, tokenizer, drafter, prompts, max_new_tokens: int) -> list[tuple[int, int]]:
    """(rank-0 hits, trials) at depth 1 per prompt, decoding greedily with ``drafter``."""
    recorder = RecordingDrafter(drafter)
    generator = SpeculativeGenerator(target, tokenizer, drafter=recorder, acceptance="greedy")
    recorder.max_context = generator.max_context
    counts, before = [], (0, 0)
    for prompt in prompts:
        generator.generate(prompt, max_new_tokens=max_new_tokens)
        now = (recorder.hits[0][0], recorder.trials[0][0]) if recorder.trials else (0, 0)
        counts.append((now[0] - before[0], now[1] - before[1]))
        before = now
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", required=True, help="a saved EAGLE head folder")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--questions", default="data/spec_bench/question.jsonl", help="Spec-Bench question file")
    parser.add_argument("--question-ids", type=int, nargs="*", help="these questions (default: the built-in prompts)")
    parser.add_argument("--max-new-tokens", type=int, nargs="+", default=[32], help="one run per value")
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    target, tokenizer = load_target(args.target)
    head = load_head(args.head, target)
    if args.question_ids:
        by_id = {q.question_id: q for q in load_questions(args.questions)}
        texts = [by_id[i].prompt for i in args.question_ids]
    else:
        texts = list(BUILTIN_CALIBRATION_PROMPTS)
    prompts = []
    for text in texts:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
        )
        prompts.append((ids if torch.is_tensor(ids) else ids["input_ids"])[0])
    for tokens in args.max_new_tokens:
        for name, drafter in (
            ("wide (calibration)", calibration_drafter(head)[0]),
            ("chain:1", build_drafter(head, "chain:1")),
        ):
            counts = first_guess_acceptance(target, tokenizer, drafter, prompts, tokens)
            hits, trials = sum(h for h, _ in counts), sum(t for _, t in counts)
            cells = " ".join(f"{h}/{t}" for h, t in counts)
            rate = hits / max(trials, 1)
            print(
                f"{tokens} tokens, {name}: depth-1 rank-0 {rate:.3f} ({hits}/{trials}; per prompt {cells})", flush=True
            )


if __name__ == "__main__":
    main()
