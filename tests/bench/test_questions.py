"""Spec-Bench loading: first turns, MT-bench ids folded into ``mt_bench``, per-category selection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specheads.bench.questions import (
    MT_BENCH,
    held_out_questions,
    load_questions,
    select_per_category,
    spec_bench_category,
)


def write_questions(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_mt_bench_ids_map_to_mt_bench():
    assert spec_bench_category(81, "writing") == MT_BENCH
    assert spec_bench_category(160, "humanities") == MT_BENCH
    assert spec_bench_category(161, "translation") == "translation"
    assert spec_bench_category(80, "writing") == "writing"


def test_another_question_file_keeps_its_own_categories(tmp_path):
    """Ids 81-160 were folded into mt_bench in any file: a custom set's per-category table showed a category it does
    not hold."""
    records = [{"question_id": i, "category": "coding", "turns": [f"q{i}"]} for i in range(1, 201)]
    questions = load_questions(write_questions(tmp_path / "q.jsonl", records))
    assert {q.category for q in questions} == {"coding"}
    assert spec_bench_category(90, "long-1k") == "long-1k"  # only MT-bench's sub-categories fold


def test_load_and_select(tmp_path):
    records = [
        {"question_id": 81, "category": "writing", "turns": ["w1", "w2"]},
        {"question_id": 95, "category": "coding", "turns": ["c1", "c2"]},
        {"question_id": 161, "category": "translation", "turns": ["t1"]},
        {"question_id": 162, "category": "translation", "turns": ["t2"]},
        {"question_id": 241, "category": "summarization", "turns": ["s1"]},
    ]
    questions = load_questions(write_questions(tmp_path / "q.jsonl", records))
    assert [q.category for q in questions] == [MT_BENCH, MT_BENCH, "translation", "translation", "summarization"]
    assert questions[0].prompt == "w1"  # first turn only
    chosen = select_per_category(questions, 1)
    assert [q.question_id for q in chosen] == [81, 161, 241]
    assert [q.question_id for q in select_per_category(questions, 5, ["translation"])] == [161, 162]
    with pytest.raises(ValueError, match="unknown categories"):
        select_per_category(questions, 1, ["poetry"])
    # a category named twice is measured once; --per-category below 1 sliced [:-1] (dropped the last question)
    twice = select_per_category(questions, 5, ["translation", "translation"])
    assert [q.question_id for q in twice] == [161, 162]
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"--per-category must be at least 1, got {bad}"):
            select_per_category(questions, bad)


GOOD = {"question_id": 161, "category": "translation", "turns": ["t1"]}


@pytest.mark.parametrize(
    "line, message",
    [
        ({**GOOD, "turns": "What is the capital?"}, "turns is 'What is the capital\\?'; expected a list"),  # was 'W'
        ({**GOOD, "turns": [""]}, "expected a list whose first turn is a non-empty string"),
        ({**GOOD, "turns": [5]}, "turns is \\[5\\]"),
        ({**GOOD, "turns": {"0": "t"}}, "expected a list whose first turn"),
        ({**GOOD, "question_id": None}, "question_id is None; expected a non-empty string or an integer"),
        ({**GOOD, "question_id": ""}, "question_id is ''"),
        ({**GOOD, "question_id": 1.5}, "question_id is 1.5"),
        ({**GOOD, "question_id": 161}, "question_id 161 is also the id of line 1; expected ids unique"),
        ({**GOOD, "question_id": "161"}, "question_id 161 is also the id of line 1"),
        ({**GOOD, "category": 7}, "category is 7; expected a non-empty string"),
        ({"question_id": 1}, "missing \\['category', 'turns'\\]"),
        ("[1, 2]", "found a list"),
        ('{"question_id": 1,', "not valid JSON"),
    ],
)
def test_odd_question_lines_name_the_file_and_line(tmp_path, line, message):
    """A string for turns loaded its first character as the prompt, an empty or non-string turn loaded as such, and
    bad JSON or ids raised without naming the file or the line."""
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + (line if isinstance(line, str) else json.dumps(line)) + "\n")
    with pytest.raises(ValueError, match=f"q.jsonl:3: .*{message}"):
        load_questions(path)
    path.write_text(json.dumps({**GOOD, "question_id": "162"}) + "\n")
    assert load_questions(path)[0].question_id == 162  # an id written as a digit string is read as the number


def test_question_ids_may_be_strings_or_integers(tmp_path):
    """A user's own set (or HumanEval's ``HumanEval/18``) names questions by strings; each id is unique in its file."""
    records = [{**GOOD, "question_id": "HumanEval/18"}, {**GOOD, "question_id": "ah-1"}, {**GOOD, "question_id": 7}]
    questions = load_questions(write_questions(tmp_path / "q.jsonl", records))
    assert [q.question_id for q in questions] == ["HumanEval/18", "ah-1", 7]
    assert [q.question_id for q in select_per_category(questions, 2)] == ["HumanEval/18", "ah-1"]


def test_an_empty_question_file_is_an_error_naming_it(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ValueError, match=f"question file {path} holds no questions"):
        load_questions(path)


def test_calibration_questions_are_never_measured_and_cover_the_measured_categories(tmp_path):
    records = [{"question_id": i, "category": c, "turns": [f"{c}{i}"]}
               for i, c in [(161, "translation"), (162, "translation"), (163, "translation"),
                            (241, "summarization"), (242, "summarization"), (321, "qa"), (322, "qa")]]  # fmt: skip
    questions = load_questions(write_questions(tmp_path / "q.jsonl", records))
    measured = select_per_category(questions, 1, ["translation", "summarization"])
    held_out = held_out_questions(questions, measured, 3)
    assert [q.question_id for q in held_out] == [162, 242, 163]  # round-robin over measured categories only
    assert not {q.question_id for q in held_out} & {q.question_id for q in measured}
    assert len(held_out_questions(questions, measured, 10)) == 3  # all that is left

    with pytest.raises(FileNotFoundError, match="--questions"):
        load_questions(tmp_path / "nope.jsonl")
    bad = write_questions(tmp_path / "bad.jsonl", [{"question_id": 1, "category": "qa"}])
    with pytest.raises(ValueError, match="turns"):
        load_questions(bad)


def test_shipped_spec_bench_file_is_the_default_and_has_six_categories():
    from specheads.shipped_data import find_default_questions

    path = find_default_questions()
    assert path == (Path(__file__).resolve().parents[2] / "data" / "spec_bench" / "question.jsonl")
    questions = load_questions(path)
    counts = {c: sum(q.category == c for q in questions) for c in {q.category for q in questions}}
    assert counts == {c: 80 for c in (MT_BENCH, "translation", "summarization", "qa", "math_reasoning", "rag")}
