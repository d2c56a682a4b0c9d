"""Build the prompt file for the second self-distilled set (`data/smollm2-135m-instruct-greedy-mix-1k.jsonl`).

The first set (`data/smollm2-135m-instruct-greedy-1k.jsonl`) has only code, grade-school math, role-play and
self-instruct seed prompts: nothing where the answer reuses text given in the prompt, which is what summarization,
RAG and extraction answers do. This set adds prompts that put a passage in front of the model, built from the same
permissively licensed sources (GPT-4-written GPTeacher role-play responses as passages), plus more plain prompts of
the first set's sources. No prompt of the first set is reused and no Spec-Bench text is used.

    python scripts/make_prompt_mix.py --out runs/prompts-mix-1k.jsonl    # reads data/train_prompts/
    specheads data generate --target smollm2-135m-instruct --prompts runs/prompts-mix-1k.jsonl \
        --out data/smollm2-135m-instruct-greedy-mix-1k.jsonl --max-new-tokens 200 --batch-size 32
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_SET = ROOT / "data" / "smollm2-135m-instruct-greedy-1k.jsonl"
PROMPTS_DIR = ROOT / "data" / "train_prompts"
PROMPTS_FILE, ROLEPLAY_FILE = "prompts.jsonl", "gpteacher_roleplay-simple-deduped-roleplay-instruct.json"

PLAIN = {"gpteacher_codegen": 200, "gsm8k_train": 150, "gpteacher_roleplay": 100, "self_instruct_seed": 50}
SUMMARIZE = (
    "Summarize: {passage}",
    "Summarize the following text in a few sentences.\n\n{passage}",
    "Write a short summary of this passage:\n\n{passage}",
)
ANSWER_FROM = (
    "{passage}\n\nUsing only the text above, answer this: {question}",
    "Read the passage and answer the question.\n\nPassage: {passage}\n\nQuestion: {question}",
    "Context:\n{passage}\n\nBased on the context, {question}",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output JSONL with id, source and prompt")
    parser.add_argument("--summaries", type=int, default=250)
    parser.add_argument("--context-questions", type=int, default=250)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--prompts-dir",
        type=Path,
        default=PROMPTS_DIR,
        help="the training-prompt folder: the merged prompts.jsonl and GPTeacher's role-play JSON, each plain or "
        "gzipped (default: the committed copy, data/train_prompts; data/README.md)",
    )
    args = parser.parse_args()
    sources = [_plain_or_gzipped(args.prompts_dir / name) for name in (PROMPTS_FILE, ROLEPLAY_FILE)]
    missing = [str(path) for path in sources if not path.is_file()]
    if missing:
        parser.exit(
            2,
            f"make_prompt_mix.py: {', '.join(missing)} not found: this script reads the training prompts that "
            f"data/README.md describes; pass --prompts-dir DIR with {PROMPTS_FILE} and {ROLEPLAY_FILE}\n",
        )
    rng = random.Random(args.seed)
    used = {json.loads(line)["id"] for line in FIRST_SET.open()}
    prompts = [json.loads(line) for line in _read_text(sources[0]).split("\n") if line]  # not splitlines: U+2028
    fresh = [p for p in prompts if p["id"] not in used]

    rows = []
    for source, count in PLAIN.items():
        pool = [p for p in fresh if p["source"] == source]
        rows += [{"id": p["id"], "source": source, "prompt": p["prompt"]} for p in rng.sample(pool, count)]
    taken = {row["id"] for row in rows}

    # Passages: role-play responses of 80-220 words whose prompt is in neither set.
    roleplay = json.loads(_read_text(sources[1]))
    passages = [
        (f"gpteacher_roleplay/{i}", r)
        for i, r in enumerate(roleplay)
        if 80 <= len(r["response"].split()) <= 220 and f"gpteacher_roleplay/{i}" not in used | taken
    ]
    picked = rng.sample(passages, args.summaries + args.context_questions)
    for n, (record_id, record) in enumerate(picked):
        passage = record["response"].strip()
        if n < args.summaries:
            prompt = rng.choice(SUMMARIZE).format(passage=passage)
            source = "summarize_gpteacher_roleplay"
        else:
            question = record["instruction"].strip()
            prompt = rng.choice(ANSWER_FROM).format(passage=passage, question=question[0].lower() + question[1:])
            source = "context_qa_gpteacher_roleplay"
        rows.append({"id": f"{source}/{record_id.split('/')[1]}", "source": source, "prompt": prompt})

    rng.shuffle(rows)
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} prompts to {args.out}")


def _plain_or_gzipped(path: Path) -> Path:
    """``path``, or its ``.gz`` sibling when only that exists (the committed copies are gzipped)."""
    gzipped = path.with_name(path.name + ".gz")
    return gzipped if not path.is_file() and gzipped.is_file() else path


def _read_text(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


if __name__ == "__main__":
    main()
