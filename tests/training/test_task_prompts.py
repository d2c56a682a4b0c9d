"""Task prompts cut from ShareGPT (translation, summaries, passage QA): the rules, the sample, and the join back."""

from __future__ import annotations

import gzip
import json

import pytest

from specheads.training.answers import conversation_id, join_answers
from specheads.training.data import DataError
from specheads.training.data_cli import data_main
from specheads.training.distill import read_jsonl
from specheads.training.task_prompts import (
    german_sentences,
    is_german,
    is_passage,
    make_task_prompts,
    parse_task_id,
    task_prompt,
)
from tests.training.test_answers import chat

GERMAN = (
    "Ich habe gestern mit meiner Schwester über die Reise nach Berlin gesprochen. "
    "Sie ist nicht sicher, ob wir mit dem Zug oder mit dem Auto fahren sollen.\n"
    "| Tabelle | mit der Spalte und dem Wert für die Zeile |\n"
    "Kurz."
)
PASSAGE = " ".join(
    f"The river {name} is one of the long rivers in the region, and it was used for trade by the towns on its banks."
    for name in ("Alder", "Birch", "Cedar", "Dogwood", "Elm", "Fir", "Gum", "Hazel")
)  # 8 sentences of 23 words: 184 words of English prose
QUESTION = "Which rivers were used for trade?"
SOURCE = [
    chat("de_0", ("human", GERMAN), ("gpt", "That is German.")),
    chat("pr_1", ("human", QUESTION), ("gpt", PASSAGE)),
    chat("co_2", ("human", "Write code."), ("gpt", PASSAGE + "\n```python\nprint(1)\n```")),
]


def messages(record: dict) -> list[dict[str, str]]:
    roles = {"human": "user", "gpt": "assistant"}
    return [{"role": roles[t["from"]], "content": t["value"]} for t in record["conversations"]]


def test_german_sentences_keep_prose_of_a_benchmark_length_and_drop_markup():
    assert german_sentences(GERMAN) == [
        (0, "Ich habe gestern mit meiner Schwester über die Reise nach Berlin gesprochen."),
        (1, "Sie ist nicht sicher, ob wir mit dem Zug oder mit dem Auto fahren sollen."),
    ]  # the table row (piece 2) has German words but is markup; "Kurz." (piece 3) is too short to translate
    assert not is_german("The cat is on the mat and it is not moving at all.")
    assert not is_german("what if im using node js and the server")  # "im" is English chat's "I'm"
    assert not is_german("Des conséquences dévastatrices : les effets de la pollution des fermes")
    assert (
        is_passage(PASSAGE) and not is_passage(PASSAGE[:200]) and not is_passage(SOURCE[2]["conversations"][1]["value"])
    )


def test_each_task_cuts_its_prompt_from_one_turn_and_refuses_a_turn_that_gives_none():
    german, prose = messages(SOURCE[0]), messages(SOURCE[1])
    assert task_prompt(german, "translate", 0, 1) == f"Translate German to English: {german_sentences(GERMAN)[1][1]}"
    assert task_prompt(german, "translate", 0, 2) is None and task_prompt(german, "translate", 0, 4) is None
    assert task_prompt(prose, "summarize", 1, 0) == f"Summarize: {PASSAGE}"
    assert task_prompt(prose, "context_qa", 1, 0) == f"{PASSAGE}\n{QUESTION}"
    assert task_prompt(prose, "summarize", 0, 0) is None  # a user turn is not a passage
    assert task_prompt(prose, "summarize", 1, 1) is None and task_prompt(prose, "summarize", 5, 0) is None
    with pytest.raises(DataError, match="task 'poem' is not one of"):
        task_prompt(prose, "poem", 1, 0)


def test_task_ids_name_the_conversation_and_the_rule_and_plain_ids_stay_plain():
    assert parse_task_id("pr_1#context_qa:1:0") == ("pr_1", "context_qa", 1, 0)
    assert parse_task_id("a#b#translate:3:12") == ("a#b", "translate", 3, 12)
    assert parse_task_id("QWJhYvA_0") is None and parse_task_id("x#poem:1:0") is None
    assert conversation_id("pr_1#summarize:1:0") == "pr_1" and conversation_id("QWJhYvA_0") == "QWJhYvA_0"


def test_the_sample_takes_the_counts_asked_with_at_most_one_passage_task_per_conversation():
    prompts, found = make_task_prompts(SOURCE, {"translate": 1, "summarize": 5, "context_qa": 5}, seed=3)
    assert found["translate"] == 2 and found["summarize"] + found["context_qa"] == 1
    # pr_1 gives both passage tasks and the seed picks one; co_2's passage holds code
    assert sum(p["task"] == "translate" for p in prompts) == 1 and len(prompts) == 2
    assert make_task_prompts(SOURCE, {"translate": 1, "summarize": 5}, seed=3)[0][0] == prompts[0]  # seeded
    with pytest.raises(DataError, match=r"unknown task\(s\) \['poem'\]"):
        make_task_prompts(SOURCE, {"poem": 1})


def test_task_answers_generate_pack_and_join_back_without_the_prompts(tiny_target_dir, tmp_path, capsys):
    source, clean, prompts = tmp_path / "sharegpt.json", tmp_path / "clean.jsonl", tmp_path / "prompts.jsonl"
    source.write_text(json.dumps(SOURCE))
    assert data_main(["sharegpt", "--source", str(source), "--questions", "--out", str(clean)]) == 0
    args = ["--conversations", str(clean), "--out", str(prompts), "--translate", "5", "--summarize", "5"]
    assert data_main(["task-prompts", *args, "--context-qa", "5"]) == 0
    out = capsys.readouterr().out
    assert "translate: 2 of 2 candidates taken (5 asked)" in out and "wrote 3 prompts" in out
    generated, packed = tmp_path / "generated.jsonl", tmp_path / "answers.jsonl.gz"
    gen = ["--target", str(tiny_target_dir), "--prompts", str(prompts), "--out", str(generated)]
    assert data_main(["generate", *gen, "--max-new-tokens", "5"]) == 0
    assert data_main(["pack-answers", "--data", str(generated), "--out", str(packed)]) == 0
    text = gzip.open(packed, "rt").read()
    assert "Berlin" not in text and "river" not in text  # the prompts' text stays in ShareGPT
    records, report = join_answers(packed, source)
    assert records == read_jsonl(generated) and report.joined == 3
    edited = json.loads(json.dumps(SOURCE))
    edited[0]["conversations"][0]["value"] = GERMAN.replace("Berlin", "Bonn")
    source.write_text(json.dumps(edited))
    records, report = join_answers(packed, source)
    assert report.prompt_changed == 1 and len(records) == 2  # an edited sentence fails its digest


def test_task_prompts_without_a_count_or_a_file_is_a_one_line_error(tmp_path, capsys):
    clean = tmp_path / "clean.jsonl"
    assert data_main(["task-prompts", "--conversations", str(clean), "--out", str(tmp_path / "p.jsonl")]) == 2
    assert "conversations file not found" in capsys.readouterr().err
    clean.write_text(json.dumps(SOURCE[0]) + "\n")
    assert data_main(["task-prompts", "--conversations", str(clean), "--out", str(tmp_path / "p.jsonl")]) == 2
    assert "no prompts asked for" in capsys.readouterr().err
