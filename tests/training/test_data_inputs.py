"""Training data as users bring it: other tools' shapes, byte-order marks, gzip, JSON arrays, folders, mixed files."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from specheads.training.data import DataConfig, DataError, load_conversations
from specheads.training.data_cli import data_main
from specheads.training.distill import read_prompts
from specheads.training.sharegpt import ReadReport, stream_json_array

TURNS = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
SHAREGPT = {"id": "a", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}


def write_lines(path, records, prefix="", end="\n"):
    path.write_text(prefix + "".join(json.dumps(r) + end for r in records), encoding="utf-8")
    return path


def test_a_record_of_another_shape_is_named_whichever_shape_comes_first(tmp_path):
    """The JSON reader gives every record every column (None where absent): a prompt/response file whose second
    record held messages was read as messages, and its first record blamed ("missing 'NoneType' object is not
    iterable")."""
    path = write_lines(tmp_path / "mixed.jsonl", [{"prompt": "q", "response": "a"}, {"messages": TURNS}])
    with pytest.raises(DataError, match=r"mixed.jsonl \(record 2\): .*prompt_response shape.*present: \['messages'\]"):
        load_conversations(DataConfig(paths=[str(path)]))
    path = write_lines(tmp_path / "null.jsonl", [SHAREGPT, {"id": "b", "conversations": None}])
    with pytest.raises(DataError, match=r"null.jsonl \(record 2\): a record does not have the sharegpt shape"):
        load_conversations(DataConfig(paths=[str(path)]))


def test_role_content_turns_under_conversations_name_the_key_they_belong_under(tmp_path):
    """SpecForge writes OpenAI turns under 'conversations'; the error said "missing 'from'" for training and
    "unreadable turns ('from')" for generation."""
    path = write_lines(tmp_path / "specforge.jsonl", [{"id": "1", "conversations": TURNS}])
    expected = r"has \['content', 'role'\]; expected \['from', 'value'\]; turns of .* are read under 'messages'"
    with pytest.raises(DataError, match=r"specforge.jsonl \(record 1\): a turn under 'conversations' " + expected):
        load_conversations(DataConfig(paths=[str(path)]))
    with pytest.raises(ValueError, match=r"specforge.jsonl:1: unreadable turns \(a turn under 'conversations' "):
        read_prompts(path)


def test_a_prompt_that_is_not_text_is_a_one_line_error(tmp_path):
    """``{"id": 1, "prompt": 5}`` reached the chat template: a TypeError traceback out of `data generate`."""
    path = write_lines(tmp_path / "prompts.jsonl", [{"id": "1", "prompt": 5}])
    with pytest.raises(ValueError, match=r"prompts.jsonl:1: unreadable prompt \(a turn has role='user' and content"):
        read_prompts(path)
    parts = [{"type": "text", "text": "Hi"}]
    path = write_lines(tmp_path / "parts.jsonl", [{"id": "1", "prompt": parts}])
    assert read_prompts(path)[0]["messages"] == [{"role": "user", "content": "Hi"}]


def test_prompt_and_sharegpt_files_may_start_with_a_byte_order_mark(tmp_path):
    """Training read such files, while `data generate` and `data sharegpt` refused them (an invisible '\\ufeff')."""
    path = write_lines(tmp_path / "prompts.jsonl", [{"id": "1", "prompt": "Hi"}], prefix="\ufeff", end="\r\n")
    assert [r["id"] for r in read_prompts(path)] == ["1"]
    source = tmp_path / "sharegpt.json"
    source.write_text("\ufeff" + json.dumps([SHAREGPT]), encoding="utf-8")
    assert [r["id"] for r in stream_json_array(source, ReadReport())] == ["a"]


def test_gzipped_or_json_array_prompt_files_say_what_to_do(tmp_path):
    """A .gz gave "'utf-8' codec can't decode byte 0x8b" without the file's name; ShareGPT's JSON array gave
    "record has no 'id' (a list)" or "line 1: not a JSON record"."""
    packed = tmp_path / "prompts.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"id": "1", "prompt": "Hi"}\n'))
    with pytest.raises(ValueError, match=r"prompts.jsonl.gz is not UTF-8 text .*decompress a .gz first"):
        read_prompts(packed)
    source = tmp_path / "sharegpt.json.gz"
    source.write_bytes(gzip.compress(json.dumps([SHAREGPT]).encode()))
    with pytest.raises(DataError, match=r"sharegpt.json.gz is not UTF-8 text .*decompress a .gz first"):
        list(stream_json_array(source))
    for indent in (None, 1):  # one line, or pretty-printed
        array = tmp_path / "sharegpt.json"
        array.write_text(json.dumps([SHAREGPT], indent=indent), encoding="utf-8")
        with pytest.raises(ValueError, match=r"sharegpt.json is a JSON array; expected JSONL.*specheads data sharegpt"):
            read_prompts(array)


def test_gzipped_training_files_that_are_cut_or_damaged_are_one_error_naming_the_line(tmp_path):
    """A bad line inside a .jsonl.gz was reported as line 1 (the compressed bytes were read as text); a file named
    .gz that is not gzip, or a download cut short, was a BadGzipFile or EOFError traceback."""
    good = json.dumps({"messages": TURNS}) + "\n"
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress((good * 2 + '{"messages": [ oops\n' + good).encode()))
    with pytest.raises(DataError, match=r"bad.jsonl.gz: line 3: Expecting value"):
        load_conversations(DataConfig(paths=[str(bad)]))
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_text(good)
    whole = gzip.compress((good * 200).encode())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    for path in (plain, cut):
        with pytest.raises(DataError, match=rf"{path.name}: unreadable \(.*\); expected a UTF-8 JSON or JSONL file"):
            load_conversations(DataConfig(paths=[str(path)]))


def test_the_last_conversation_of_a_task_prompts_file_is_read_without_a_final_newline(tmp_path, capsys):
    """`data task-prompts` read its input as a generated file, where a last line without a newline is one cut by a
    kill: a hand-made conversations file lost its last conversation without a word."""
    german = "Das ist nicht gut und ich bin mit der Arbeit auch nicht zufrieden, aber wir werden es sehen."
    conversation = {
        "id": "z",
        "conversations": [{"from": "human", "value": "Bitte?"}, {"from": "gpt", "value": german}],
    }
    conversations = tmp_path / "conversations.jsonl"
    conversations.write_text(json.dumps(conversation), encoding="utf-8")
    out = tmp_path / "tasks.jsonl"
    assert (
        data_main(["task-prompts", "--conversations", str(conversations), "--out", str(out), "--translate", "5"]) == 0
    )
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["z#translate:1:0"]


@pytest.mark.parametrize(
    "argv",
    [
        ["pack-answers", "--data", "{dir}", "--out", "{dir}/a.jsonl.gz"],
        ["join-answers", "--answers", "{dir}", "--out", "{dir}/j.jsonl"],
        ["task-prompts", "--conversations", "{dir}", "--out", "{dir}/t.jsonl", "--translate", "1"],
        ["cache-features", "--data", "{dir}", "--out-dir", "{dir}/features"],
    ],
)
def test_a_folder_given_for_a_file_is_named_as_a_folder(argv, tmp_path, capsys):
    """It was reported as "file not found", while it is right there."""
    assert data_main([arg.format(dir=tmp_path) for arg in argv]) == 2
    assert f"{tmp_path} is a folder; give the file(s) in it" in capsys.readouterr().err
    with pytest.raises(DataError, match=f"data file {tmp_path} is a folder"):
        load_conversations(DataConfig(paths=[str(tmp_path)]))


def test_a_format_set_by_hand_is_named_as_the_setting_not_as_the_first_record(tmp_path):
    """With ``format: messages`` on a ShareGPT file the error blamed "the file's first record" and said to split
    the file, where the fix is the setting."""
    path = write_lines(tmp_path / "sharegpt.jsonl", [SHAREGPT])
    with pytest.raises(DataError, match=r"record 1\): .*the messages shape the format setting names.*format auto"):
        load_conversations(DataConfig(paths=[str(path)], format="messages"))


def test_sharegpt_records_without_ids_join_back_by_the_index_cleaning_gave_them(tiny_target_dir, tmp_path, capsys):
    """Cleaning names a record without an id by its index, while the join looked it up as "None": every answer of
    such a file was left out as "id not in the ShareGPT file"."""
    from specheads.training.distill import read_jsonl

    source = tmp_path / "sharegpt.json"
    unnamed = {"conversations": [{"from": "human", "value": "Why?"}, {"from": "gpt", "value": "So."}]}
    source.write_text(json.dumps([unnamed, SHAREGPT]), encoding="utf-8")
    clean, generated, packed = tmp_path / "clean.jsonl", tmp_path / "generated.jsonl", tmp_path / "a.jsonl.gz"
    assert data_main(["sharegpt", "--source", str(source), "--questions", "--out", str(clean)]) == 0
    target = ["--target", str(tiny_target_dir), "--max-new-tokens", "2"]
    assert data_main(["generate", *target, "--prompts", str(clean), "--out", str(generated)]) == 0
    assert data_main(["pack-answers", "--data", str(generated), "--out", str(packed)]) == 0
    joined = tmp_path / "joined.jsonl"
    assert data_main(["join-answers", "--answers", str(packed), "--source", str(source), "--out", str(joined)]) == 0
    assert read_jsonl(joined) == read_jsonl(generated)
    assert sorted(record["id"] for record in read_jsonl(joined)) == ["0", "a"]


def test_a_damaged_packed_answers_file_is_one_error_naming_it(tmp_path, capsys):
    """A broken line printed the JSON decoder's message without the file or line; a file cut short was an EOFError
    traceback out of `data join-answers`."""
    line = json.dumps({"id": "a", "prompt_sha256": "0" * 16, "answer": "Hello"}) + "\n"
    broken, cut = tmp_path / "broken.jsonl.gz", tmp_path / "cut.jsonl.gz"
    broken.write_bytes(gzip.compress((line + '{"id": "b", "prompt_sha').encode()))
    whole = gzip.compress((line * 300).encode())
    cut.write_bytes(whole[: len(whole) // 2])
    for path, message in [(broken, "line 2 is not a JSON record"), (cut, "unreadable (Compressed file ended")]:
        assert data_main(["join-answers", "--answers", str(path), "--out", str(tmp_path / "joined.jsonl")]) == 2
        assert f"{path}: {message}" in capsys.readouterr().err


def test_the_prompt_file_given_as_out_is_refused_before_it_is_touched(tmp_path):
    """`--out` naming the prompt file read its prompts as answered (0 written) and cut its last line when it had no
    final newline, taken for a line cut by a kill."""
    from specheads.training.answering import GenerationSettings
    from specheads.training.distill import generate_dataset

    prompts = tmp_path / "prompts.jsonl"
    text = json.dumps({"id": "1", "prompt": "Hi"}) + "\n" + json.dumps({"id": "2", "prompt": "Bye"})
    prompts.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=r"--out .*prompts.jsonl is the prompt file; write the answers to another"):
        generate_dataset(None, None, prompts, tmp_path / "." / "prompts.jsonl", GenerationSettings())
    assert prompts.read_text(encoding="utf-8") == text


BAD_ANSWER_IDS = {
    "text": ("1 2 3", r"a str \('1 2 3'\)"),
    "nested": ([[1, 2], [3]], r"a list \('\[1, 2\]'\) at position 0"),
    "negative": ([5, -1], r"id -1 at position 1"),
    "float": ([5, 1.5], r"a float \('1.5'\) at position 1"),
}


def _refused_in_a_packed_file(tmp_path, capsys, bad: dict, message: str) -> None:
    """A packed answers file whose second record holds ``bad``: training and `data join-answers` both name it."""
    good = {"id": "a", "prompt_sha256": "0" * 16, "answer": "Hello", "answer_token_ids": [5, 6], "finished": True}
    packed = tmp_path / "answers.jsonl.gz"
    lines = [good, {**good, "id": "b", **bad}]
    packed.write_bytes(gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode()))
    with pytest.raises(DataError, match=rf"answers.jsonl.gz: record 2: {message}"):
        load_conversations(DataConfig(paths=[str(packed)]))
    assert data_main(["join-answers", "--answers", str(packed), "--out", str(tmp_path / "joined.jsonl")]) == 2
    assert "answers.jsonl.gz: record 2: " + next(iter(bad)) + " holds" in capsys.readouterr().err


@pytest.mark.parametrize("ids, found", BAD_ANSWER_IDS.values(), ids=BAD_ANSWER_IDS.keys())
def test_answer_token_ids_that_are_not_token_ids_are_one_error_naming_the_record(ids, found, tmp_path, capsys):
    """In a packed answers file (or a generated one), answer_token_ids holding text, nested lists or floats was a
    pyarrow ArrowInvalid traceback out of training or `data join-answers`; negative ids loaded without a word."""
    fix = r"; expected a list of the target's token ids .* or remove answer_token_ids to train on its text re-encoded$"
    _refused_in_a_packed_file(tmp_path, capsys, {"answer_token_ids": ids}, rf"answer_token_ids holds {found}{fix}")
    generated = [{"messages": TURNS, "answer_token_ids": [5, 6]}, {"messages": TURNS, "answer_token_ids": ids}]
    path = write_lines(tmp_path / "generated.jsonl", generated)
    # the JSON reader refuses a column of mixed types (the line is named) or reads it (the record is named)
    with pytest.raises(DataError, match=rf"generated.jsonl(: line 2| \(record 2\)): answer_token_ids holds {found}"):
        load_conversations(DataConfig(paths=[str(path)]))


def test_a_broken_line_is_named_before_whole_number_ids_on_an_earlier_one(tmp_path):
    """Ids written as 5.0 load as 5; the check that names a JSONL file's bad line blamed them, not the cut-off line."""
    path = tmp_path / "generated.jsonl"
    path.write_text(json.dumps({"messages": TURNS, "answer_token_ids": [5.0, 6.0]}) + '\n{"messages": [\n')
    with pytest.raises(DataError, match=r"generated.jsonl: line 2: "):
        load_conversations(DataConfig(paths=[str(path)]))
    path.write_text(json.dumps({"messages": TURNS, "answer_token_ids": [5.0, 6.0]}) + "\n")
    assert load_conversations(DataConfig(paths=[str(path)]))[0]["answer_token_ids"] == [5, 6]


BAD_FINISHED = {
    "text": ("yes", '"yes"'),
    "number": (1, "1"),
    "list": ([True], r"\[true\]"),
}


@pytest.mark.parametrize("finished, found", BAD_FINISHED.values(), ids=BAD_FINISHED.keys())
def test_finished_that_is_not_a_boolean_is_one_error_naming_the_record(finished, found, tmp_path, capsys):
    """finished "yes" or [true] was a pyarrow traceback out of training; 1 (or 0) was read as true (false) without a
    word, and a packed answers file took any of them."""
    fix = r"; expected true, false .* or null, .* or remove finished to train the answer's end-of-turn token$"
    _refused_in_a_packed_file(tmp_path, capsys, {"finished": finished}, rf"finished holds {found}{fix}")
    bad = {"messages": TURNS, "answer_token_ids": [5, 6], "finished": finished}
    for generated, at in (([{**bad, "finished": True}, bad], 2), ([bad], 1)):  # a column of mixed types, or of one
        path = write_lines(tmp_path / "generated.jsonl", generated)
        with pytest.raises(DataError, match=rf"generated.jsonl(: line {at}| \(record {at}\)): finished holds {found}"):
            load_conversations(DataConfig(paths=[str(path)]))
    path = write_lines(tmp_path / "generated.jsonl", [{**bad, "finished": None}, {**bad, "finished": False}])
    assert load_conversations(DataConfig(paths=[str(path)]))["finished"] == [None, False]


def test_answer_token_ids_beyond_the_vocabulary_name_the_record(smollm2_tokenizer, tmp_path):
    """Ids of another tokenizer loaded, and failed as an index error in the target's embedding."""
    import re

    from specheads.training.answers import prompt_digest, sharegpt_prompts
    from specheads.training.chat_format import first_question
    from specheads.training.data import build_datasets
    from specheads.training.sharegpt import installed_sharegpt_file, record_id

    vocab = len(smollm2_tokenizer)
    path = write_lines(tmp_path / "generated.jsonl", [{"messages": TURNS, "answer_token_ids": [5, vocab]}])
    expected = rf"generated.jsonl \(record 1\): answer_token_ids holds id {vocab} at position 1 \(the tokenizer has"
    with pytest.raises(DataError, match=expected):
        build_datasets(DataConfig(paths=[str(path)], eval_size=0), smollm2_tokenizer)
    first = record_id(next(stream_json_array(installed_sharegpt_file())), 0)
    ((_, conversation),) = sharegpt_prompts({first})
    digest = prompt_digest(first_question(conversation))
    line = {"id": first, "prompt_sha256": digest, "answer": "Hi", "answer_token_ids": [vocab + 7], "finished": True}
    packed = tmp_path / "answers.jsonl.gz"
    packed.write_bytes(gzip.compress((json.dumps(line) + "\n").encode()))
    expected = rf"answers.jsonl.gz \(id {re.escape(repr(first))}\): answer_token_ids holds id {vocab + 7} at position 0"
    with pytest.raises(DataError, match=expected):
        build_datasets(DataConfig(paths=[str(packed)], eval_size=0), smollm2_tokenizer)


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({"id": "a", "prompt": "x"}),  # a prompt file's last line, without a final newline
        json.dumps({"prompt": "x"}) + "\n",
        "notes, not answers",
        json.dumps([1, 2]) + "\n",
    ],
)
def test_an_out_file_that_is_not_an_earlier_run_is_refused_untouched_before_the_target_loads(
    content, tmp_path, capsys, monkeypatch
):
    """`--out` naming another file was read as a run to resume after the target loaded: a KeyError traceback, its
    last line cut off as a kill's fragment, or answers appended to it."""
    import specheads.target

    def no_load(*args, **kwargs):
        raise AssertionError("the target was loaded before --out was checked")

    monkeypatch.setattr(specheads.target, "load_target", no_load)
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "mine.jsonl"
    prompts.write_text(json.dumps({"id": "1", "prompt": "Hi"}) + "\n", encoding="utf-8")
    out.write_text(content, encoding="utf-8")
    assert data_main(["generate", "--prompts", str(prompts), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} " in err and "write to a new --out file" in err and len(err.strip().splitlines()) == 1
    assert out.read_text(encoding="utf-8") == content


def test_a_whole_last_record_without_a_newline_counts_as_answered_and_a_fragment_does_not(tmp_path):
    """`pack-answers` dropped a complete last record missing its newline (packed 1 of 2, silently)."""
    from specheads.training.distill import finished_ids, read_jsonl

    record = {"id": "a", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]}
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({**record, "id": "z"}) + "\n" + json.dumps(record), encoding="utf-8")
    assert [r["id"] for r in read_jsonl(out)] == ["z", "a"]
    assert finished_ids(out) == {"z", "a"} and out.read_text(encoding="utf-8").endswith("}\n")  # appends cleanly
    out.write_text(json.dumps(record) + "\n" + '{"id": "b", "messages": [{"ro', encoding="utf-8")
    assert finished_ids(out) == {"a"} and out.read_text(encoding="utf-8") == json.dumps(record) + "\n"


def test_a_gzipped_file_that_is_not_utf8_is_one_error_naming_it(tmp_path, capsys):
    """A UTF-16 file gzipped was a UnicodeDecodeError traceback out of `specheads train`, and `data join-answers`
    printed the codec's message without the file."""
    path = tmp_path / "utf16.jsonl.gz"
    path.write_bytes(gzip.compress(json.dumps({"messages": []}).encode("utf-16")))
    with pytest.raises(DataError, match=re.escape(str(path))):
        load_conversations(DataConfig(paths=[str(path)]))
    assert data_main(["join-answers", "--answers", str(path), "--out", str(tmp_path / "joined.jsonl")]) == 2
    assert f"{path}: unreadable (" in capsys.readouterr().err


def test_empty_data_paths_are_refused_before_the_target_loads():
    """No data files was reported only after the target had loaded (an online run reads them after it)."""
    from specheads.training.config import ConfigError, TrainConfig
    from specheads.training.run_setup import check_before_loading

    with pytest.raises(ConfigError, match="data.paths is empty: set it to one or more JSON/JSONL files"):
        check_before_loading(TrainConfig())


def test_answers_that_join_nothing_name_the_file_searched_and_the_join_for_another_source(tmp_path, monkeypatch):
    """Answers made from a ShareGPT file of one's own could not be trained on, and the error gave no way to."""
    import specheads.training.answers as answers

    source = tmp_path / "mine.json"
    source.write_text(json.dumps([{"id": "x", "conversations": [{"from": "human", "value": "q"}]}]), encoding="utf-8")
    packed = tmp_path / "answers.jsonl.gz"
    packed.write_bytes(
        gzip.compress((json.dumps({"id": "nope", "prompt_sha256": "0" * 16, "answer": "a"}) + "\n").encode())
    )
    with pytest.raises(DataError, match=rf"found its prompt in {re.escape(str(source))} \(.*from$"):
        answers.join_answers(packed, source)
    monkeypatch.setattr(answers, "installed_sharegpt_file", lambda: source)
    with pytest.raises(
        DataError,
        match=rf"package's file .*`specheads data join-answers --answers {re.escape(str(packed))} --source FILE`",
    ):
        answers.join_answers(packed)
