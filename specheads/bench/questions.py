"""Spec-Bench questions (https://github.com/hemingkx/Spec-Bench): loading, category mapping and selection.

Spec-Bench's ``question.jsonl`` stores its MT-bench block (question ids 81-160) under MT-bench's eight
sub-categories (writing, roleplay, ...). Spec-Bench itself reports them as one category, ``mt_bench``; so do we, in
Spec-Bench's file (one holding its task categories); other files keep their own categories.
Only the first turn of each question is benchmarked (as Spec-Bench does for single-turn speed).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

MT_BENCH_IDS = range(81, 161)
"""Question ids of Spec-Bench's MT-bench block, reported as category ``mt_bench``."""

MT_BENCH = "mt_bench"
MT_BENCH_SUBCATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_TASKS = ("translation", "summarization", "qa", "math_reasoning", "rag")
"""Spec-Bench's categories besides MT-bench: a file holding any of them is read as Spec-Bench's own."""


@dataclass(frozen=True)
class Question:
    question_id: int | str  # unique within its file: results are matched to questions by it
    category: str  # Spec-Bench category (MT-bench sub-categories folded into ``mt_bench``)
    prompt: str  # the first turn


def spec_bench_category(question_id: int | str, category: str) -> str:
    """The Spec-Bench reporting category of a question: ids 81-160 under an MT-bench sub-category are ``mt_bench``."""
    return MT_BENCH if question_id in MT_BENCH_IDS and category in MT_BENCH_SUBCATEGORIES else category


def load_questions(path: str | Path) -> list[Question]:
    """Read a Spec-Bench-format JSONL file (``question_id``, ``category``, ``turns``) in file order."""
    path = Path(path)
    if path.is_dir():  # e.g. data/spec_bench/, the folder the default file is in
        raise FileNotFoundError(
            f"question file {path} is a folder; pass --questions the file in it (such as {path / 'question.jsonl'}): "
            "JSON lines with question_id, category, turns"
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"question file {path} not found; pass --questions PATH to a Spec-Bench question.jsonl "
            "(JSON lines with question_id, category, turns)"
        )
    questions = []
    seen: dict[int | str, int] = {}  # question id -> its line
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # e.g. Spec-Bench as a parquet file
        raise ValueError(
            f"question file {path} is not UTF-8 text; expected a Spec-Bench question.jsonl (JSON lines with "
            "question_id, category, turns): convert the file to JSON lines"
        ) from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        question = _question(line, f"{path}:{number}")
        if question.question_id in seen:
            raise ValueError(
                f"{path}:{number}: question_id {question.question_id!r} is also the id of line "
                f"{seen[question.question_id]}; expected ids unique within the file: rename one"
            )
        seen[question.question_id] = number
        questions.append(question)
    if not questions:
        raise ValueError(
            f"question file {path} holds no questions; expected JSON lines with question_id, category, turns"
        )
    if not any(q.category in SPEC_BENCH_TASKS for q in questions):
        return questions  # not Spec-Bench's file: its categories are reported as it names them
    return [Question(q.question_id, spec_bench_category(q.question_id, q.category), q.prompt) for q in questions]


def _question(line: str, where: str) -> Question:
    """One line of a question file, or a ValueError naming the file and line and what it holds instead."""
    expected = (
        "a JSON object with a question_id (a string or an integer), a category string and turns, a list of strings"
    )
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON ({err.msg} at column {err.colno}); expected {expected}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: found a {type(record).__name__}; expected {expected}")
    missing = sorted({"question_id", "category", "turns"} - set(record))
    if missing:
        raise ValueError(f"{where}: missing {missing}; expected {expected}")
    qid, category, turns = record["question_id"], record["category"], record["turns"]
    if isinstance(qid, str) and qid.strip().isdigit():
        qid = int(qid)
    if isinstance(qid, bool) or not isinstance(qid, (int, str)) or (isinstance(qid, str) and not qid.strip()):
        raise ValueError(f"{where}: question_id is {qid!r}; expected a non-empty string or an integer")
    if not isinstance(category, str) or not category:
        raise ValueError(f"{where}: category is {category!r}; expected a non-empty string")
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
        raise ValueError(f"{where}: turns is {turns!r:.80}; expected a list whose first turn is a non-empty string")
    return Question(qid, category, turns[0])


def select_per_category(
    questions: list[Question], per_category: int, categories: list[str] | None = None
) -> list[Question]:
    """The first ``per_category`` questions of each category (file order), categories in first-seen order (or
    ``categories``' order, each once)."""
    if per_category < 1:
        raise ValueError(f"--per-category must be at least 1, got {per_category}")
    by_category: dict[str, list[Question]] = defaultdict(list)
    for question in questions:
        by_category[question.category].append(question)
    if categories:
        unknown = set(categories) - set(by_category)
        if unknown:
            raise ValueError(f"unknown categories {sorted(unknown)}; the file has {sorted(by_category)}")
    chosen = list(dict.fromkeys(categories)) if categories else list(by_category)
    return [q for category in chosen for q in by_category[category][:per_category]]


def held_out_questions(questions: list[Question], measured: list[Question], count: int) -> list[Question]:
    """``count`` questions that are not measured, taken round-robin over the measured categories (file order within
    each): calibration prompts from the benchmark's distribution that the reported numbers never see."""
    measured_ids = {q.question_id for q in measured}
    categories = list(dict.fromkeys(q.category for q in measured))
    pools = {c: [q for q in questions if q.category == c and q.question_id not in measured_ids] for c in categories}
    chosen: list[Question] = []
    while len(chosen) < count and any(pools.values()):
        for category in categories:
            if pools[category] and len(chosen) < count:
                chosen.append(pools[category].pop(0))
    return chosen
