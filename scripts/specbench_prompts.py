"""The first N Spec-Bench questions of each category, first turn, as the prompts file the curve scripts read
(``{id, prompt, category}``, MT-bench's sub-categories as ``mt_bench``): answered by ``specheads data generate``, it is
the benchmark side of ``scaling_curve.py``, ``draft_vocab_coverage.py`` and ``acceptance_probe.py``.

    python scripts/specbench_prompts.py --per-category 4 --out runs/data/specbench-4pc-prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specheads.arg_types import positive_int
from specheads.bench.questions import load_questions, select_per_category
from specheads.shipped_data import find_default_questions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-category", type=positive_int, default=4)
    parser.add_argument("--questions", default=None, help="Spec-Bench question.jsonl (default: the shipped one)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    questions = select_per_category(load_questions(args.questions or find_default_questions()), args.per_category)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as handle:
        for q in questions:
            handle.write(json.dumps({"id": q.question_id, "prompt": q.prompt, "category": q.category}) + "\n")
    print(f"wrote {len(questions)} prompts to {args.out}")


if __name__ == "__main__":
    main()
