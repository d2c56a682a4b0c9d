"""Chat data: shape detection, assistant-only loss masks on the real SmolLM2 template, truncation, splits, collate."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from omegaconf import OmegaConf

from specheads.training.data import (
    DataConfig,
    DataError,
    build_datasets,
    collate,
    detect_format,
    to_messages,
    tokenize_conversation,
)

END = "<|im_end|>"
GOOD_LINE = (
    json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}) + "\n"
)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def masked_text(tokenizer, sample) -> list[str]:
    """Decode each run of consecutive masked tokens separately."""
    runs, current = [], []
    for token, keep in zip(sample["input_ids"], sample["loss_mask"]):
        if keep:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_config_is_an_omegaconf_schema():
    cfg = OmegaConf.structured(DataConfig)
    merged = OmegaConf.merge(cfg, OmegaConf.create({"paths": ["a.jsonl"], "eval_size": 3}))
    assert OmegaConf.to_object(merged) == DataConfig(paths=["a.jsonl"], eval_size=3)


def test_shapes_are_detected_and_normalised():
    sharegpt = {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}]}
    sharegpt["conversations"].append({"from": "gpt", "value": "a"})
    assert detect_format(sharegpt, "f") == "sharegpt"
    assert to_messages(sharegpt, "sharegpt") == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    pair = {"prompt": "q", "response": "a", "id": 1}
    assert detect_format(pair, "f") == "prompt_response"
    assert to_messages(pair, "prompt_response") == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    with pytest.raises(DataError, match=r"keys \['id', 'text'\].*ShareGPT"):
        detect_format({"id": 1, "text": "x"}, "f")


def test_mask_covers_assistant_text_and_end_of_turn_only(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    sample = tokenize_conversation(messages, tokenizer, max_length=1024)
    assert sample["input_ids"] == tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    header = ["<|im_start|>", "ass", "istant", "Ċ"]
    expected = (
        [("<|im_start|>", 0), ("system", 0), ("Ċ", 0), ("Be", 0), ("Ġbrief", 0), (".", 0), (END, 0), ("Ċ", 0)]
        + [("<|im_start|>", 0), ("user", 0), ("Ċ", 0), ("Hi", 0), (END, 0), ("Ċ", 0)]
        + [(t, 0) for t in header]
        + [("Hello", 1), ("!", 1), (END, 1), ("Ċ", 0)]
        + [("<|im_start|>", 0), ("user", 0), ("Ċ", 0), ("2", 0), ("+", 0), ("2", 0), ("?", 0), (END, 0), ("Ċ", 0)]
        + [(t, 0) for t in header]
        + [("4", 1), (END, 1), ("Ċ", 0)]
    )
    assert list(zip(tokenizer.convert_ids_to_tokens(sample["input_ids"]), sample["loss_mask"])) == expected
    assert sample["num_loss_tokens"] == 5 and not sample["truncated"]


def test_mask_decodes_to_assistant_text_with_spaces_and_newlines(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    answer = " Hello!\n\nHow can I help?\n"
    messages = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": answer}]
    sample = tokenize_conversation(messages, tokenizer, max_length=1024)
    assert masked_text(tokenizer, sample) == [answer + END]
    cut = tokenize_conversation(messages, tokenizer, max_length=len(sample["input_ids"]) - 3)
    assert cut["truncated"] and cut["loss_mask"] == sample["loss_mask"][: len(cut["loss_mask"])]


@pytest.mark.parametrize(
    "answer, merged", [("\n\nHello there.", "ĊĊ"), ("  Hello there.", "ĊĠ")], ids=["newline", "space"]
)
def test_a_token_that_joins_the_header_to_the_answer_carries_no_loss(smollm2_tokenizer, answer, merged):
    """SmolLM2's header ends in a newline, which merges with an answer's leading newline or space into one token: it
    was trained as an answer token, though part of it is the template's and the target (its prompt ends at the
    header) never writes it."""
    tokenizer = smollm2_tokenizer
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": answer}]
    sample = tokenize_conversation(messages, tokenizer, max_length=256)
    tokens = tokenizer.convert_ids_to_tokens(sample["input_ids"])
    at = tokens.index(merged)
    assert tokens[at - 2 : at] == ["ass", "istant"] and sample["loss_mask"][at] == 0
    assert masked_text(tokenizer, sample) == [answer[1:] + END]  # the answer from its first token of its own


def test_build_datasets_reads_all_shapes_truncates_and_splits(smollm2_tokenizer, tmp_path):
    tokenizer = smollm2_tokenizer
    pairs = [{"prompt": f"Question {i}?", "response": f"Answer number {i}."} for i in range(6)]
    sharegpt = [{"conversations": [{"from": "human", "value": "Hey"}, {"from": "gpt", "value": "Yo"}]}]
    messages = [{"messages": [{"role": "user", "content": "x " * 200}, {"role": "assistant", "content": "y"}]}]
    cfg = DataConfig(
        paths=[
            write_jsonl(tmp_path / "pairs.jsonl", pairs),
            write_jsonl(tmp_path / "sharegpt.jsonl", sharegpt),
            write_jsonl(tmp_path / "long.jsonl", messages),
        ],
        max_length=64,
        eval_size=2,
        seed=3,
    )
    train, evaluation = build_datasets(cfg, tokenizer)
    # The long conversation's answer lies beyond max_length: it is truncated, then dropped.
    assert len(train) + len(evaluation) == 7 and len(evaluation) == 2
    assert train.column_names == ["input_ids", "loss_mask", "source"]
    # every record of the three files but the dropped one (the eighth, last), each row naming its record once
    assert sorted([*train["source"], *evaluation["source"]]) == list(range(7))
    for sample in list(train) + list(evaluation):
        assert len(sample["input_ids"]) == len(sample["loss_mask"]) <= 64 and sum(sample["loss_mask"]) > 0
    again_train, again_eval = build_datasets(cfg, tokenizer)
    assert again_train["input_ids"] == train["input_ids"] and again_eval["input_ids"] == evaluation["input_ids"]
    other_train, _ = build_datasets(DataConfig(**{**vars(cfg), "seed": 4}), tokenizer)
    assert other_train["input_ids"] != train["input_ids"]


def test_everything_dropped_says_why(smollm2_tokenizer, tmp_path):
    tokenizer = smollm2_tokenizer
    pairs = [{"prompt": f"Question {i}?", "response": "A."} for i in range(3)]
    cfg = DataConfig(paths=[write_jsonl(tmp_path / "p.jsonl", pairs)], max_length=8)
    with pytest.raises(DataError, match=r"all 3 samples were dropped: 3 had no assistant tokens within max_length=8"):
        build_datasets(cfg, tokenizer)


def test_unknown_shape_in_a_file_names_the_keys(smollm2_tokenizer, tmp_path):
    tokenizer = smollm2_tokenizer
    cfg = DataConfig(paths=[write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "a"}])])
    with pytest.raises(DataError, match=r"bad.jsonl: unknown record shape with keys \['answer', 'question'\]"):
        build_datasets(cfg, tokenizer)


def test_collate_right_pads():
    batch = [{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, {"input_ids": [8], "loss_mask": [1]}]
    out = collate(batch, pad_token_id=0)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert all(t.dtype == torch.long for t in out.values())


def test_a_record_of_another_shape_is_named(smollm2_tokenizer, tmp_path):
    tokenizer = smollm2_tokenizer
    records = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    records.append({"prompt": "q", "response": "a"})
    cfg = DataConfig(paths=[write_jsonl(tmp_path / "mixed.jsonl", records)])
    expected = r"mixed.jsonl \(record 2\): a record does not have the messages shape.*\[.prompt., .response.\]"
    with pytest.raises(DataError, match=expected):
        build_datasets(cfg, tokenizer)


def test_committed_mix_set_is_what_its_prompt_script_makes(tmp_path):
    """data/...-mix-1k.jsonl answers exactly the prompts scripts/make_prompt_mix.py builds, none from the first set."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    script = [sys.executable, str(repo / "scripts" / "make_prompt_mix.py")]
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = subprocess.run(
        [*script, "--out", str(tmp_path / "x.jsonl"), "--prompts-dir", str(empty)], capture_output=True, text=True
    )
    assert refused.returncode == 2 and f"{empty / 'prompts.jsonl'}" in refused.stderr
    assert "pass --prompts-dir DIR" in refused.stderr and not (tmp_path / "x.jsonl").exists()
    prompts = tmp_path / "prompts.jsonl"
    subprocess.run([*script, "--out", str(prompts)], check=True)  # the committed, gzipped data/train_prompts/
    built = {r["id"]: r["prompt"] for r in map(json.loads, prompts.read_text().splitlines())}
    committed = [json.loads(line) for line in (repo / "data" / "smollm2-135m-instruct-greedy-mix-1k.jsonl").open()]
    assert len(built) == len(committed) == 1000
    assert {r["id"]: r["messages"][0]["content"] for r in committed} == built
    assert all(r["messages"][1]["role"] == "assistant" and r["messages"][1]["content"] for r in committed)
    first = {json.loads(line)["id"] for line in (repo / "data" / "smollm2-135m-instruct-greedy-1k.jsonl").open()}
    assert not first & set(built)
    assert sum(r["source"].startswith(("summarize_", "context_qa_")) for r in committed) == 500


@pytest.mark.parametrize(
    "turn, message",
    [
        (
            {"role": "assistant", "content": 7},
            r"bad.jsonl \(record 2\): a turn has role='assistant' and content of type int",
        ),
        (
            {"role": "assistant", "content": None},
            r"bad.jsonl \(record 2\): a turn has role='assistant' and content of type",
        ),
        ({"role": "bot", "content": "hi"}, r"bad.jsonl \(record 2\): a turn has role='bot'; expected one of"),
    ],
)
def test_bad_turns_are_errors_naming_the_record(smollm2_tokenizer, tmp_path, turn, message):
    """They were jinja or concatenation tracebacks deep in tokenizing, or (an unknown role) silently dropped."""
    tokenizer = smollm2_tokenizer
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    bad = {"messages": [{"role": "user", "content": "q"}, turn]}
    cfg = DataConfig(paths=[write_jsonl(tmp_path / "bad.jsonl", [good, bad])])
    with pytest.raises(DataError, match=message):
        build_datasets(cfg, tokenizer)


def test_content_given_as_text_parts_is_joined():
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there."}]
    record = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "Hi"}]}
    assert to_messages(record, "messages")[0] == {"role": "user", "content": "Hello there."}


def test_special_token_text_inside_an_answer_does_not_end_its_mask(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    answer = "Use <|endoftext|> to end a document. Then write more."
    sample = tokenize_conversation(
        [{"role": "user", "content": "How?"}, {"role": "assistant", "content": answer}], tokenizer, 256
    )
    assert masked_text(tokenizer, sample) == [answer + END]


def test_answers_before_the_first_question_are_left_out(smollm2_tokenizer, tmp_path):
    """A conversation opening with an answer (common in raw ShareGPT) stopped the whole load in the chat template
    (an empty prefix); only answers is an error naming the record."""
    opener = {"role": "assistant", "content": "Hello, I am another model."}
    rest = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi there"}]
    cfg = DataConfig(paths=[write_jsonl(tmp_path / "open.jsonl", [{"messages": [opener, *rest]}])], eval_size=0)
    (sample,) = build_datasets(cfg, smollm2_tokenizer)[0]
    assert sample["input_ids"] == tokenize_conversation(rest, smollm2_tokenizer, 256)["input_ids"]
    cfg = DataConfig(paths=[write_jsonl(tmp_path / "only.jsonl", [{"messages": [opener]}])], eval_size=0)
    with pytest.raises(DataError, match=r"only.jsonl \(record 1\): the conversation has no user turn"):
        build_datasets(cfg, smollm2_tokenizer)


def test_a_template_that_trims_the_answer_keeps_a_cut_answer_open(smollm2_tokenizer):
    """Templates that `trim` content (Llama 3, Gemma) rendered a cut answer ending in a space without it, so the
    answer was not found and its end-of-turn token was trained: the head learned to stop where the target had not."""
    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.chat_template = tokenizer.chat_template.replace("message['content']", "(message['content'] | trim)")
    messages = [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "One, two, "}]
    assert "two, <|im_end|>" not in tokenizer.apply_chat_template(messages, tokenize=False)  # the template trims
    ids = tokenizer("One, two, ", add_special_tokens=False)["input_ids"]
    sample = tokenize_conversation(messages, tokenizer, 256, answer_token_ids=ids, finished=False)
    assert masked_text(tokenizer, sample) == ["One, two, "]
    assert tokenizer.decode(sample["input_ids"][-2:]) == END + "\n"
    finished = tokenize_conversation(messages, tokenizer, 256, answer_token_ids=ids, finished=True)
    assert masked_text(tokenizer, finished) == ["One, two, " + END]


def test_self_distilled_fields_are_read_beside_files_without_them(smollm2_tokenizer, tmp_path):
    """A file from `specheads data generate` (target ids, cut answers) and one without those fields load together;
    a cut answer's end-of-turn token is in the input but not in the loss."""
    tokenizer = smollm2_tokenizer
    prompt = [{"role": "user", "content": "Say hi."}]
    ids = tokenizer("Hi there", add_special_tokens=False)["input_ids"]
    distilled = {"id": "1", "messages": [*prompt, {"role": "assistant", "content": "Hi there"}]}
    cut = {**distilled, "answer_token_ids": ids, "finished": False}
    plain = {"prompt": "Say hi.", "response": "Hi there"}
    cfg = DataConfig(
        paths=[write_jsonl(tmp_path / "cut.jsonl", [cut]), write_jsonl(tmp_path / "plain.jsonl", [plain])],
        eval_size=0,
    )
    train, _ = build_datasets(cfg, tokenizer)
    cut_sample, plain_sample = train
    assert cut_sample["input_ids"] == plain_sample["input_ids"]
    assert masked_text(tokenizer, cut_sample) == ["Hi there"]
    assert masked_text(tokenizer, plain_sample) == ["Hi there" + END]


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "holds no records"),
        ("\n\n  \n", "holds no records"),  # datasets' own error, not ours, before
        (GOOD_LINE * 3 + '{"messages": [ oops\n' + GOOD_LINE, r"bad.jsonl: line 4: Expecting value"),
        (GOOD_LINE + "[1, 2]\n", r"bad.jsonl: line 2: found a JSON list; expected one JSON object per line"),
        (GOOD_LINE * 2 + '{"messages": []}\n', r"bad.jsonl \(record 3\): the conversation has no turns"),
    ],
)
def test_unreadable_data_files_are_one_error_naming_the_file(tmp_path, content, message):
    """An empty file raised StopIteration, blank lines and a bad line gave the JSON reader's chained tracebacks
    without a line number, and a record without turns failed in the chat template."""
    from specheads.training.data import load_conversations

    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        load_conversations(DataConfig(paths=[str(path)]))
