"""The committed long-context set: Spec-Bench format, one category per length, prompts that fit SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specheads.bench.questions import load_questions, select_per_category
from tests.scripts_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ROOT / "data" / "long_context" / "questions.jsonl"
SMOLLM2_CONTEXT = 8192


def builder():
    return load_script("make_long_context_questions.py")


def test_each_length_is_a_category_of_fitting_prompts():
    lengths = builder().LENGTHS
    questions = load_questions(QUESTIONS)
    records = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    assert [q.category for q in select_per_category(questions, 3)] == [c for c in lengths for _ in range(3)]
    assert len({q.question_id for q in questions}) == len(questions)
    for record in records:
        limit = lengths[record["category"]]
        assert 0.9 * limit <= record["prompt_tokens"] <= limit
        assert record["prompt_tokens"] + 512 <= SMOLLM2_CONTEXT  # room for the answer
    assert sorted({r["task"] for r in records}) == ["continue", "question", "summarise"]


@pytest.mark.slow
def test_recorded_lengths_are_smollm2_token_counts():
    """The recorded lengths are what the SmolLM2 tokenizer counts for the chat-templated prompt."""
    from transformers import AutoTokenizer

    from specheads.target import ensure_builtin_converted

    tokenizer = AutoTokenizer.from_pretrained(ensure_builtin_converted("smollm2-135m-instruct"))
    make = builder()
    for line in QUESTIONS.read_text().splitlines():
        record = json.loads(line)
        assert make.prompt_tokens(tokenizer, record["turns"][0]) == record["prompt_tokens"]
