"""Packed answers: the target's regenerated ShareGPT answers kept without the prompts, joined back when read."""

from __future__ import annotations

import gzip
import itertools
import json

import pytest
from transformers import AutoTokenizer

from specheads.training.answering import GenerationSettings
from specheads.training.answers import conversation_id, is_packed_answers, join_answers, read_packed
from specheads.training.data import DataConfig, DataError, build_datasets, load_conversations
from specheads.training.data_cli import data_main
from specheads.training.distill import generate_dataset, read_jsonl
from specheads.training.sharegpt import installed_sharegpt_file, stream_json_array
from tests.training.train_helpers import REPO


def chat(cid: str, *turns: tuple[str, str]) -> dict:
    return {"id": cid, "conversations": [{"from": who, "value": text} for who, text in turns]}


SOURCE = [
    chat("a_0", ("human", "Name a colour."), ("gpt", "Blue."), ("human", "Another?"), ("gpt", "Red.")),
    chat("b_1", ("system", "Be brief."), ("human", "Why is the sky blue?"), ("gpt", "Scattering.")),
    chat("c_2", ("gpt", "A leading answer."), ("human", "Count to three."), ("gpt", "1, 2, 3.")),
]


def generate_and_pack(
    tiny_target_dir, tmp_path, source: list[dict], clean_args: tuple[str, ...] = ()
) -> tuple[list[dict], str]:
    """ShareGPT records cleaned (``data sharegpt``), answered by the tiny target (``data generate``), and packed."""
    source_file, clean = tmp_path / "sharegpt.json", tmp_path / "clean.jsonl"
    source_file.write_text(json.dumps(source))
    assert data_main(["sharegpt", "--source", str(source_file), "--questions", *clean_args, "--out", str(clean)]) == 0
    generated = tmp_path / "generated.jsonl"
    args = ["--target", str(tiny_target_dir), "--prompts", str(clean), "--out", str(generated)]
    assert data_main(["generate", *args, "--max-new-tokens", "6"]) == 0
    packed = tmp_path / "answers.jsonl.gz"
    assert data_main(["pack-answers", "--data", str(generated), "--out", str(packed)]) == 0
    return read_jsonl(generated), str(packed)


def two_turn_line(conversation_id: str) -> dict:
    """A ``data generate --turns 2`` line, as that command writes it."""
    return {
        "id": conversation_id,
        "messages": [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Green."},
            {"role": "user", "content": "Another?"},
            {"role": "assistant", "content": "Yellow."},
        ],
        "answer_token_ids": [11, 12],
        "finished": True,
        "generated_with": {"target": "t", "max_new_tokens": 8, "temperature": 0.0, "turns": 2},
    }


def test_packed_answers_hold_no_prompt_text_and_join_back_to_the_generated_file(tiny_target_dir, tmp_path, capsys):
    generated, packed = generate_and_pack(tiny_target_dir, tmp_path, SOURCE)
    text = gzip.open(packed, "rt").read()
    for prompt in ("Name a colour.", "Be brief.", "Why is the sky blue?", "Count to three.", "Another?"):
        assert prompt not in text  # only what the target wrote, and digests
    assert is_packed_answers(tmp_path / "answers.jsonl.gz") and not is_packed_answers(tmp_path / "generated.jsonl")
    assert [r["id"] for r in read_packed(tmp_path / "answers.jsonl.gz")] == [r["id"] for r in generated]
    joined = tmp_path / "joined.jsonl"
    source = str(tmp_path / "sharegpt.json")
    assert data_main(["join-answers", "--answers", packed, "--source", source, "--out", str(joined)]) == 0
    assert "joined 3 answers to their prompts; 0 ids not in the ShareGPT file" in capsys.readouterr().out
    assert read_jsonl(joined) == generated  # turns, the target's ids, finished and generated_with, in order
    first = {r["id"]: r["messages"][:-1] for r in generated}
    assert first["a_0"] == [{"role": "user", "content": "Name a colour."}]  # only the first question was answered
    assert first["c_2"] == [{"role": "user", "content": "Count to three."}]  # the leading answer trimmed


def test_a_prompt_that_reads_differently_is_left_out_and_counted(tiny_target_dir, tmp_path):
    generated, packed = generate_and_pack(tiny_target_dir, tmp_path, SOURCE)
    edited = json.loads(json.dumps(SOURCE))
    edited[1]["conversations"][1]["value"] = "Why is the sea blue?"
    del edited[2]
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    records, report = join_answers(tmp_path / "answers.jsonl.gz", tmp_path / "edited.json")
    assert [r["id"] for r in records] == ["a_0"] and (report.prompt_changed, report.id_not_found) == (1, 1)
    (tmp_path / "other.json").write_text(json.dumps([chat("z_9", ("human", "?"), ("gpt", "!"))]))
    with pytest.raises(DataError, match="none of its 3 answers found its prompt"):
        join_answers(tmp_path / "answers.jsonl.gz", tmp_path / "other.json")


def test_a_repeated_id_joins_the_record_that_cleaning_kept(tiny_target_dir, tmp_path):
    """ShareGPT repeats some ids; cleaning drops a record with no usable answer and keeps a later one of the same id,
    so the join must read that later record, not the first."""
    empty = {"id": "b_1", "conversations": [{"from": "human", "value": "An unanswered question."}]}
    generated, packed = generate_and_pack(tiny_target_dir, tmp_path, [SOURCE[0], empty, SOURCE[1]])
    assert sorted(r["id"] for r in generated) == ["a_0", "b_1"]  # answered shortest first
    records, report = join_answers(tmp_path / "answers.jsonl.gz", tmp_path / "sharegpt.json")
    assert records == generated and report.joined == 2


def test_unanswered_questions_kept_as_prompts_are_answered_and_join_back(tiny_target_dir, tmp_path):
    """``data sharegpt --keep-unanswered`` keeps a last question that no answer follows, and a conversation that is
    only a question, as prompts: the target's answers to them (a second turn's written here as ``data generate
    --turns 2`` writes it) join back. The join cut such questions off, as cleaning for training does, and found
    none of these answers' prompts."""
    source = [
        chat("open_5", ("human", "Name a colour."), ("gpt", "Blue."), ("human", "Another?")),
        chat("only_6", ("human", "Count to three.")),
    ]
    generated, _ = generate_and_pack(tiny_target_dir, tmp_path, source, ("--keep-unanswered",))
    assert {r["id"]: r["messages"][0]["content"] for r in generated} == {
        "open_5": "Name a colour.",
        "only_6": "Count to three.",
    }
    records, report = join_answers(tmp_path / "answers.jsonl.gz", tmp_path / "sharegpt.json")
    assert records == generated and report.joined == 2
    second = two_turn_line("open_5")
    (tmp_path / "two-turns.jsonl").write_text(json.dumps(second) + "\n")
    packed = tmp_path / "two-turns.jsonl.gz"
    assert data_main(["pack-answers", "--data", str(tmp_path / "two-turns.jsonl"), "--out", str(packed)]) == 0
    records, report = join_answers(packed, tmp_path / "sharegpt.json")
    assert records == [second] and report.joined == 1


def test_pack_refuses_a_file_that_is_not_generated_answers(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "p", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert data_main(["pack-answers", "--data", str(prompts), "--out", str(tmp_path / "a.jsonl.gz")]) == 2
    assert "record 1 is not a generated answer" in capsys.readouterr().err
    assert data_main(["pack-answers", "--data", str(prompts), "--out", str(tmp_path / "a.jsonl")]) == 2
    assert "does not end in .gz" in capsys.readouterr().err
    # a bad record after good ones: the packed file written before is kept, and no half-written one is left beside it
    answered = {"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    prompts.write_text(json.dumps(answered) + "\n" + json.dumps({"id": "p", "messages": []}) + "\n")
    (tmp_path / "a.jsonl.gz").write_bytes(b"earlier")
    assert data_main(["pack-answers", "--data", str(prompts), "--out", str(tmp_path / "a.jsonl.gz")]) == 2
    assert "record 2 is not a generated answer" in capsys.readouterr().err
    prompts.write_text(json.dumps(answered) + "\n" + json.dumps({**answered, "finished": "yes"}) + "\n")
    assert data_main(["pack-answers", "--data", str(prompts), "--out", str(tmp_path / "a.jsonl.gz")]) == 2
    assert 'prompts.jsonl: record 2: finished holds "yes"; expected true, false' in capsys.readouterr().err
    assert (tmp_path / "a.jsonl.gz").read_bytes() == b"earlier" and sorted(tmp_path.iterdir()) == [
        tmp_path / "a.jsonl.gz",
        prompts,
    ]


def test_an_output_is_replaced_only_by_a_whole_file(tmp_path):
    from specheads.training.output_file import atomic_output

    out = tmp_path / "out.jsonl"
    out.write_text("old")
    for stop in (ValueError("bad record"), KeyboardInterrupt()):
        with pytest.raises(type(stop)), atomic_output(out) as partial:
            partial.write_text("half")
            raise stop
        assert out.read_text() == "old" and list(tmp_path.iterdir()) == [out]
    with atomic_output(tmp_path / "new" / "out.jsonl") as partial:
        partial.write_text("whole")
    assert (tmp_path / "new" / "out.jsonl").read_text() == "whole" and len(list((tmp_path / "new").iterdir())) == 1


def test_training_reads_packed_answers_joined_with_the_installed_sharegpt(tiny_target_dir, tmp_path):
    """Answers to the installed package's first conversations, packed, are training data as they stand: the
    loader joins them with the package's prompts (reading the file only until every id is found)."""
    first = list(itertools.islice(stream_json_array(installed_sharegpt_file()), 3))
    generated, _ = generate_and_pack(tiny_target_dir, tmp_path, first)
    packed = DataConfig(paths=[str(tmp_path / "answers.jsonl.gz")], eval_size=0)
    conversations = load_conversations(packed)
    assert conversations["messages"] == [r["messages"] for r in generated]
    assert conversations["answer_token_ids"] == [r["answer_token_ids"] for r in generated]
    tokenizer = AutoTokenizer.from_pretrained(tiny_target_dir)
    train, _ = build_datasets(packed, tokenizer)
    for sample, record in zip(train, generated, strict=True):
        trained = [t for t, m in zip(sample["input_ids"], sample["loss_mask"]) if m]
        assert trained[: len(record["answer_token_ids"])] == record["answer_token_ids"]


def test_multi_turn_answers_pack_without_the_questions_and_join_back(tmp_path):
    """A ``data generate --turns 2`` line (written here as that command writes it) keeps the target's first answer in
    the pack; the join puts the conversation's second question back between the two answers."""
    (tmp_path / "sharegpt.json").write_text(json.dumps(SOURCE))
    line = two_turn_line("a_0")
    (tmp_path / "generated.jsonl").write_text(json.dumps(line) + "\n")
    packed = tmp_path / "answers.jsonl.gz"
    assert data_main(["pack-answers", "--data", str(tmp_path / "generated.jsonl"), "--out", str(packed)]) == 0
    record = read_packed(packed)[0]
    assert record["earlier_answers"] == ["Green."] and record["answer"] == "Yellow."
    assert "Another?" not in gzip.open(packed, "rt").read() and "Blue." not in gzip.open(packed, "rt").read()
    records, report = join_answers(packed, tmp_path / "sharegpt.json")
    assert records == [line] and report.joined == 1
    changed = json.loads(json.dumps(SOURCE))
    changed[0]["conversations"][2]["value"] = "One more?"  # the second question, which only a multi-turn join reads
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    fewer = [chat("a_0", ("human", "Name a colour."), ("gpt", "Blue."))]  # no second question to put back
    (tmp_path / "fewer.json").write_text(json.dumps(fewer))
    for source in ("changed.json", "fewer.json"):
        with pytest.raises(DataError, match="none of its 1 answers found its prompt"):
            join_answers(packed, tmp_path / source)


@pytest.mark.slow
def test_multi_turn_generation_packs_and_joins_back_to_the_generated_file(smollm2, tmp_path):
    """``data generate --turns 2`` on the real target, packed and joined: the join rebuilds the very turns the target
    was asked, so every digest matches and the joined file equals the generated one."""
    quiz = ("Answer with one word: is water wet?", "Answer with one word: is fire hot?")
    source = [
        chat("quiz_0", ("human", quiz[0]), ("gpt", "Another model."), ("human", quiz[1]), ("gpt", "Another model.")),
        chat("sky_1", ("system", "Be brief."), ("human", "Name one colour."), ("gpt", "Red.")),
    ]
    source_file, clean, generated = tmp_path / "sharegpt.json", tmp_path / "clean.jsonl", tmp_path / "generated.jsonl"
    source_file.write_text(json.dumps(source))
    assert data_main(["sharegpt", "--source", str(source_file), "--questions", "--out", str(clean)]) == 0
    model, tokenizer = smollm2
    settings = GenerationSettings(max_new_tokens=24, batch_size=2, turns=2)
    assert generate_dataset(model, tokenizer, clean, generated, settings) == 2
    lines = read_jsonl(generated)
    two_turns = [line for line in lines if sum(m["role"] == "assistant" for m in line["messages"]) == 2]
    assert [line["id"] for line in two_turns] == ["quiz_0"]  # the one with a second question
    assert [m["content"] for m in two_turns[0]["messages"] if m["role"] == "user"] == list(quiz)
    packed = tmp_path / "answers.jsonl.gz"
    assert data_main(["pack-answers", "--data", str(generated), "--out", str(packed)]) == 0
    assert {r["id"]: len(r.get("earlier_answers", [])) for r in read_packed(packed)} == {"quiz_0": 1, "sky_1": 0}
    records, report = join_answers(packed, source_file)
    assert records == lines and report.joined == 2


COMMITTED = sorted((REPO / "data" / "sharegpt-answers").glob("*.jsonl.gz"))


@pytest.fixture(scope="module")
def committed_conversations(tmp_path_factory):
    """The installed ShareGPT file's records that the committed answers were cut from, read in one pass (the file is
    125 MB) and written as a small ShareGPT file to join every committed set against."""
    wanted = {conversation_id(r["id"]) for path in COMMITTED for r in read_packed(path)}
    found = [r for r in stream_json_array(installed_sharegpt_file()) if str(r.get("id")) in wanted]
    source = tmp_path_factory.mktemp("sharegpt") / "needed.json"
    source.write_text(json.dumps(found))
    return source


@pytest.mark.slow
@pytest.mark.parametrize("path", COMMITTED, ids=lambda path: path.name)
def test_every_committed_answer_file_joins_whole_with_the_installed_sharegpt(path, committed_conversations):
    """The committed regenerated sets are only usable joined with the installed package: every answer must find
    its prompt (a change to the ShareGPT reader, the cleaning or a task rule that moved a prompt would show here)."""
    records, report = join_answers(path, committed_conversations)
    assert report.joined == len(read_packed(path)) == len(records) > 0
    assert (report.id_not_found, report.prompt_changed) == (0, 0)
