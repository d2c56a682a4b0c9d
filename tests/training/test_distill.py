"""Self-distillation on SmolLM2: batched (left-padded) greedy answers equal per-prompt generate; runs resume."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from specheads.training.answering import GenerationSettings, answer_batch, prompt_ids
from specheads.training.data import tokenize_conversation
from specheads.training.data_cli import data_main
from specheads.training.distill import generate_dataset, read_jsonl, read_prompts

PROMPTS = [
    {"id": "a", "prompt": "Name a colour."},
    {"id": "b", "prompt": "Write one sentence about the sea, using the word blue twice."},
    {"id": "c", "messages": [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "x"}]},
]


def write_prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS), encoding="utf-8")
    return path


def test_read_prompts_accepts_prompt_and_messages(tmp_path):
    records = read_prompts(write_prompts(tmp_path), limit=3)
    assert [r["id"] for r in records] == ["a", "b", "c"]
    assert records[0]["messages"] == [{"role": "user", "content": "Name a colour."}]
    assert records[2]["messages"] == [{"role": "user", "content": "What is 2+3?"}]  # old answer dropped


def sharegpt_turns(cid: str, *turns: str) -> dict:
    """A ShareGPT record alternating human and gpt turns, starting with the human."""
    sides = ("human", "gpt")
    return {"id": cid, "conversations": [{"from": sides[i % 2], "value": text} for i, text in enumerate(turns)]}


def test_read_prompts_keeps_the_later_questions_only_for_multi_turn(tmp_path):
    path = tmp_path / "prompts.jsonl"
    record = sharegpt_turns("q", "One?", "other model", "Two?", "other model", "Three?", "other model")
    path.write_text(json.dumps(record) + "\n" + json.dumps({"id": "p", "prompt": "Alone?"}) + "\n")
    one, alone = read_prompts(path)
    assert one["messages"] == [{"role": "user", "content": "One?"}] and "later_questions" not in one
    assert read_prompts(path, turns=2)[0]["later_questions"] == ["Two?"]
    three, alone = read_prompts(path, turns=5)
    assert three["later_questions"] == ["Two?", "Three?"] and "later_questions" not in alone
    assert three["messages"] == one["messages"]  # the other model's answers are never kept


@pytest.mark.slow
def test_multi_turn_answers_follow_the_targets_own_earlier_answers(smollm2, tmp_path):
    """Each turn is answered after the target's own answers to the turns before; a cut answer ends the conversation,
    and so does a next prompt past max_prompt_tokens; every answer is trained on."""
    model, tokenizer = smollm2
    prompts = tmp_path / "prompts.jsonl"
    quiz = [
        "Answer with one word: is water wet?",
        "Answer with one word: is fire hot?",
        "Answer with one word: is ice cold?",
    ]
    records = [
        sharegpt_turns("quiz", quiz[0], "Another model.", quiz[1], "Another model.", quiz[2], "Another model."),
        sharegpt_turns("story", "Write two short paragraphs about a cat.", "Another model.", "Now a dog."),
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    settings = GenerationSettings(max_new_tokens=24, batch_size=2, turns=3)
    out = tmp_path / "out.jsonl"
    assert generate_dataset(model, tokenizer, prompts, out, settings) == 2
    lines = {record["id"]: record for record in read_jsonl(out)}
    turns = lines["quiz"]["messages"]
    assert [m["role"] for m in turns] == ["user", "assistant"] * 3
    assert [m["content"] for m in turns if m["role"] == "user"] == quiz
    for end in (1, 3, 5):  # each answer is the target's greedy answer to the conversation before it
        expected = answer_batch(model, tokenizer, [turns[:end]], GenerationSettings(max_new_tokens=24))[0]
        assert turns[end]["content"] == expected.text and expected.finished
    assert lines["quiz"]["answer_token_ids"] == expected.token_ids and lines["quiz"]["finished"] is True
    assert lines["quiz"]["generated_with"]["turns"] == 3
    story = lines["story"]
    assert len(story["messages"]) == 2 and story["finished"] is False  # cut at 24 tokens: no second question
    sample = tokenize_conversation(turns, tokenizer, 1024, lines["quiz"]["answer_token_ids"], True)
    spans = sum(1 for a, b in zip([0, *sample["loss_mask"]], sample["loss_mask"]) if (a, b) == (0, 1))
    assert spans == 3  # all three answers carry the loss
    with pytest.raises(ValueError, match="turns: 3 -> None"):  # a resume with other turns would mix two kinds
        generate_dataset(model, tokenizer, prompts, out, GenerationSettings(max_new_tokens=24, batch_size=2))
    firsts = [prompt_ids(tokenizer, [{"role": "user", "content": r["conversations"][0]["value"]}]) for r in records]
    short = GenerationSettings(max_new_tokens=24, batch_size=2, turns=3, max_prompt_tokens=max(map(len, firsts)) + 2)
    generate_dataset(model, tokenizer, prompts, tmp_path / "short.jsonl", short)
    assert [len(r["messages"]) for r in read_jsonl(tmp_path / "short.jsonl")] == [2, 2]  # turn 2's prompt is longer


@pytest.mark.slow
def test_batched_greedy_equals_per_prompt_generate(smollm2, tmp_path):
    model, tokenizer = smollm2
    records = read_prompts(write_prompts(tmp_path))
    settings = GenerationSettings(max_new_tokens=8, batch_size=3)
    batched = answer_batch(model, tokenizer, [r["messages"] for r in records], settings)
    for record, answer in zip(records, batched, strict=True):
        ids = tokenizer.apply_chat_template(
            record["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :].tolist()
        if tokenizer.eos_token_id in out:
            out = out[: out.index(tokenizer.eos_token_id)]
        assert answer.text == tokenizer.decode(out, skip_special_tokens=True)
        assert answer.token_ids == out and answer.finished == (len(out) < 8)


@pytest.mark.slow
def test_resume_skips_done_ids_and_drops_a_partial_line(smollm2, tmp_path):
    model, tokenizer = smollm2
    prompts, out = write_prompts(tmp_path), tmp_path / "out" / "distill.jsonl"
    settings = GenerationSettings(max_new_tokens=4, batch_size=2)
    assert generate_dataset(model, tokenizer, prompts, out, settings, limit=1) == 1
    first = out.read_text(encoding="utf-8")
    record = json.loads(first)
    assert record["id"] == "a" and [m["role"] for m in record["messages"]] == ["user", "assistant"]
    with open(out, "a", encoding="utf-8") as f:
        f.write('{"id": "b", "messages": [{"role": "us')  # a kill in the middle of a write
    assert generate_dataset(model, tokenizer, prompts, out, settings) == 2
    text = out.read_text(encoding="utf-8")
    assert text.startswith(first) and text.endswith("\n")
    assert [r["id"] for r in read_jsonl(out)] == ["a", "c", "b"]  # the rest shortest first: c's prompt is shorter
    assert generate_dataset(model, tokenizer, prompts, out, settings) == 0


@pytest.mark.slow
def test_generate_cli_samples_reproducibly(smollm2, tmp_path):
    prompts = write_prompts(tmp_path)
    common = ["generate", "--prompts", str(prompts), "--limit", "2", "--max-new-tokens", "3", "--temperature", "0.8"]
    for name in ("one.jsonl", "two.jsonl"):
        assert data_main(common + ["--top-p", "0.9", "--seed", "7", "--out", str(tmp_path / name)]) == 0
    one, two = read_jsonl(tmp_path / "one.jsonl"), read_jsonl(tmp_path / "two.jsonl")
    assert [r["id"] for r in one] == ["a", "b"] and one == two


@pytest.mark.slow
def test_records_keep_the_targets_own_ids_and_whether_it_stopped(smollm2, tmp_path):
    """Text re-encodes to other ids (``\\n\\n`` is generated as one token and re-encoded as two), and an answer cut
    at max_new_tokens must not train the end-of-turn token: lines record both, and the training data uses them."""
    model, tokenizer = smollm2
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"id": "story", "prompt": "Write two short paragraphs about a cat."})
        + "\n"
        + json.dumps({"id": "yes", "prompt": "Answer with one word: is water wet?"})
        + "\n"
    )
    out = tmp_path / "out.jsonl"
    generate_dataset(model, tokenizer, prompts, out, GenerationSettings(max_new_tokens=24, batch_size=2))
    records = {record["id"]: record for record in read_jsonl(out)}
    story, yes = records["story"], records["yes"]
    assert story["finished"] is False and len(story["answer_token_ids"]) == 24  # cut
    assert yes["finished"] is True and len(yes["answer_token_ids"]) < 24  # the target ended it
    for record in (story, yes):
        prompt = tokenizer.apply_chat_template(record["messages"][:-1], tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        sample = tokenize_conversation(
            record["messages"], tokenizer, 1024, record["answer_token_ids"], record["finished"]
        )
        answer_end = len(prompt_ids) + len(record["answer_token_ids"])
        assert sample["input_ids"][:answer_end] == prompt_ids + record["answer_token_ids"]  # what the target saw
        assert tokenizer.convert_ids_to_tokens(sample["input_ids"][answer_end]) == "<|im_end|>"
        assert sample["loss_mask"][len(prompt_ids) : answer_end] == [1] * len(record["answer_token_ids"])
        assert sample["loss_mask"][answer_end] == int(record["finished"])  # no stop taught where the cut was
        assert sum(sample["loss_mask"]) == len(record["answer_token_ids"]) + int(record["finished"])


@pytest.mark.slow
def test_greedy_answers_ignore_the_targets_own_generation_config(smollm2):
    """Some targets ship repetition_penalty / no_repeat_ngram_size: "greedy" data must still be the argmax."""
    model, tokenizer = smollm2
    messages = [[{"role": "user", "content": "List the numbers one to five, then again."}]]
    settings = GenerationSettings(max_new_tokens=16)
    plain = answer_batch(model, tokenizer, messages, settings)[0]
    own = model.generation_config
    try:
        model.generation_config = copy.deepcopy(own)
        model.generation_config.repetition_penalty = 3.0
        model.generation_config.no_repeat_ngram_size = 2
        shipped = answer_batch(model, tokenizer, messages, settings)[0]
        assert model.generation_config.repetition_penalty == 3.0  # the target's own config is put back
    finally:
        model.generation_config = own
    assert shipped.token_ids == plain.token_ids


def test_prompt_files_read_their_last_line_and_answer_only_the_first_user_turn(tmp_path, caplog):
    path = tmp_path / "prompts.jsonl"
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "REFERENCE ANSWER FROM ANOTHER MODEL"},
        {"role": "user", "content": "And then?"},
    ]
    path.write_text(
        json.dumps({"id": "1", "prompt": "a"})
        + "\n\n"
        + json.dumps({"id": "2", "messages": conversation})
        + "\n"
        + json.dumps({"id": "3", "prompt": "c"})  # no final newline: an input file, not a line cut by a kill
    )
    with caplog.at_level("WARNING", logger="specheads.training.distill"):
        records = read_prompts(path)
    assert [r["id"] for r in records] == ["1", "2", "3"]
    assert records[1]["messages"] == conversation[:2]  # another model's answer is not trained as the target's
    assert "1 of 3 prompt records hold several user turns" in caplog.text
    path.write_text(json.dumps({"id": "1", "prompt": "a"}) + "\n\n{not json\n")
    with pytest.raises(ValueError, match="prompts.jsonl:3: not a JSON record"):
        read_prompts(path)


def test_data_cli_errors_are_one_line_before_the_target_loads(tmp_path, capsys, monkeypatch):
    import specheads.target

    monkeypatch.setattr(specheads.target, "load_target", lambda *a, **k: pytest.fail("the target was loaded"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "no id"}) + "\n")
    assert data_main(["generate", "--prompts", str(bad), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "record has no 'id'" in capsys.readouterr().err
    assert data_main(["cache-features", "--data", str(tmp_path / "none.jsonl"), "--out-dir", str(tmp_path / "c")]) == 2
    assert "data file not found" in capsys.readouterr().err


@pytest.mark.slow
def test_resuming_with_other_settings_is_refused(smollm2, tmp_path):
    """A rerun appended to the same file whatever its settings: greedy and sampled, or 200- and 16-token answers,
    ended up mixed in one file without a word."""
    model, tokenizer = smollm2
    prompts, out = write_prompts(tmp_path), tmp_path / "distill.jsonl"
    assert generate_dataset(model, tokenizer, prompts, out, GenerationSettings(max_new_tokens=3), limit=1) == 1
    assert read_jsonl(out)[0]["generated_with"] == {
        "target": "smollm2-135m-instruct",
        "max_new_tokens": 3,
        "temperature": 0.0,
    }
    for other, changed in [
        (GenerationSettings(max_new_tokens=4), "max_new_tokens: 3 -> 4"),
        (GenerationSettings(max_new_tokens=3, temperature=0.7), "temperature: 0.0 -> 0.7"),
    ]:
        with pytest.raises(ValueError, match=f"other settings \\(.*{changed}"):
            generate_dataset(model, tokenizer, prompts, out, other, limit=2)
    assert generate_dataset(model, tokenizer, prompts, out, GenerationSettings(max_new_tokens=3, batch_size=1)) == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--batch-size", "-1"], "argument --batch-size: expected an integer >= 1, got -1"),
        (["generate", "--max-new-tokens", "0"], "argument --max-new-tokens: expected an integer >= 1, got 0"),
        (["cache-features", "--shard-size", "0"], "argument --shard-size: expected an integer >= 1, got 0"),
        (["cache-features", "--batch-size", "x"], "argument --batch-size: expected an integer, got 'x'"),
        (["cache-features", "--eval-size", "-1"], "argument --eval-size: expected an integer >= 0, got -1"),
    ],
)
def test_counts_that_mean_nothing_are_refused_as_parsed(argv, message, tmp_path, capsys):
    """generate --batch-size -1 reported conversations it never wrote; cache-features --shard-size -2 wrote a cache
    marked complete with no shards, and 0 divided by zero."""
    where = ["--prompts", "p.jsonl", "--out", "o.jsonl"] if argv[0] == "generate" else ["--data", "d", "--out-dir", "c"]
    with pytest.raises(SystemExit):
        data_main([*argv, *where])
    assert message in capsys.readouterr().err


def test_a_generated_file_resumes_whatever_spelling_of_its_target_folder(tiny_target_dir, tmp_path, monkeypatch):
    """The same folder given as an absolute and a relative path was refused as another target."""
    prompts, out = write_prompts(tmp_path), tmp_path / "distill.jsonl"
    common = ["generate", "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "2"]
    assert data_main([*common, "--target", str(tiny_target_dir), "--limit", "1"]) == 0
    monkeypatch.chdir(tiny_target_dir.parent)
    assert data_main([*common, "--target", tiny_target_dir.name, "--limit", "2"]) == 0
    assert [r["id"] for r in read_jsonl(out)] == ["a", "b"]


def test_batches_hold_prompts_of_similar_lengths_and_a_rerun_answers_the_rest_shortest_first(
    tiny_target_dir, tmp_path, monkeypatch
):
    """Prompts are answered shortest first, so a batch pads little; ``--file-order`` keeps the file's order."""
    import specheads.training.answering as answering
    from specheads.target import load_target

    model, tokenizer = load_target(str(tiny_target_dir))
    words = [9, 1, 7, 3, 12, 2, 5, 8]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": "word " * n}) + "\n" for i, n in enumerate(words)))
    batches = []
    answer = answering.answer_batch

    def recorded(model, tokenizer, conversations, settings, seed=0):
        batches.append([len(answering.prompt_ids(tokenizer, c)) for c in conversations])
        return answer(model, tokenizer, conversations, settings, seed)

    monkeypatch.setattr(answering, "answer_batch", recorded)
    settings = GenerationSettings(max_new_tokens=2, batch_size=3)
    out = tmp_path / "out.jsonl"
    assert generate_dataset(model, tokenizer, prompts, out, settings, limit=5) == 5
    assert generate_dataset(model, tokenizer, prompts, out, settings) == 3
    flat = [n for batch in batches for n in batch]
    assert [len(b) for b in batches] == [3, 2, 3] and flat[:5] == sorted(flat[:5]) and flat[5:] == sorted(flat[5:])
    by_length = [f"p{i}" for i in sorted(range(5), key=lambda i: words[i])]
    assert [r["id"] for r in read_jsonl(out)] == by_length + ["p5", "p6", "p7"]
    batches.clear()
    in_file_order = tmp_path / "file-order.jsonl"
    generate_dataset(model, tokenizer, prompts, in_file_order, GenerationSettings(2, batch_size=8, by_length=False))
    assert [r["id"] for r in read_jsonl(in_file_order)] == [f"p{i}" for i in range(8)]


def test_sharegpt_records_are_prompts_and_long_prompts_can_be_skipped(tiny_target_dir, tmp_path, caplog):
    """ShareGPT's own records (``conversations`` of from/value turns) are read as prompts, the first human turn
    answered; ``max_prompt_tokens`` skips the prompts a training length leaves no room after, and says how many."""
    from specheads.target import load_target

    prompts = tmp_path / "sharegpt.jsonl"
    rows = [
        {"id": "s0", "conversations": [{"from": "human", "value": "hi " * 3}, {"from": "gpt", "value": "old"}]},
        {"id": "s1", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "why?"}]},
        {"id": "s2", "conversations": [{"from": "human", "value": "word " * 300}]},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    records = read_prompts(prompts)
    assert records[0]["messages"] == [{"role": "user", "content": "hi hi hi "}]
    assert records[1]["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "why?"}]
    model, tokenizer = load_target(str(tiny_target_dir))
    out = tmp_path / "out.jsonl"
    with caplog.at_level("INFO", logger="specheads.training.distill"):
        written = generate_dataset(model, tokenizer, prompts, out, GenerationSettings(2, max_prompt_tokens=100))
    assert written == 2 and sorted(r["id"] for r in read_jsonl(out)) == ["s0", "s1"]
    assert "skipped 1 of 3 prompts longer than max_prompt_tokens=100" in caplog.text
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "conversations": [{"from": "robot", "value": "?"}]}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: unreadable turns"):
        read_prompts(bad)


def test_greedy_rows_drop_ended_rows_and_match_generate_row_by_row(tiny_target_dir):
    """The loop that drops each row as it ends gives every row what ``generate`` gives it alone."""
    from transformers import GenerationConfig

    from specheads.target import load_target, only_this_config
    from specheads.training.answering import greedy_rows, left_pad

    model, _ = load_target(str(tiny_target_dir))
    prompts = [[5, 9, 2], [7, 1, 4, 4, 8, 3, 6], [11], [3, 3, 9, 12, 2]]
    input_ids, mask = left_pad(prompts, 0)
    free = greedy_rows(model, input_ids, mask, 12, eos_ids=[])
    assert [len(row) for row in free] == [12] * 4
    eos = [free[1][2], free[3][6]]  # rows end at different steps, so the batch shrinks more than once
    rows = greedy_rows(model, input_ids, mask, 12, eos_ids=eos)
    assert len({len(row) for row in rows}) > 1
    for prompt, row in zip(prompts, rows):
        config = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0)
        with only_this_config(model, config):
            alone = model.generate(torch.tensor([prompt]), generation_config=config)[0, len(prompt) :].tolist()
        assert row == alone[: len(row)] and (len(row) == 12 or row[-1] in eos) and len(alone) == len(row)


def test_prompts_are_sorted_within_blocks_so_a_stopped_run_samples_the_whole_file(
    tiny_target_dir, tmp_path, monkeypatch
):
    """Shortest first within each block of ``SORT_BLOCK`` prompts, blocks in file order: a run stopped after the
    first block has answered prompts from the start of the file, not the shortest of all of it."""
    import specheads.training.distill as distill
    from specheads.target import load_target

    monkeypatch.setattr(distill, "SORT_BLOCK", 4)
    model, tokenizer = load_target(str(tiny_target_dir))
    words = [9, 1, 7, 3, 12, 2, 5, 8]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": "word " * n}) + "\n" for i, n in enumerate(words)))
    out = tmp_path / "out.jsonl"
    generate_dataset(model, tokenizer, prompts, out, GenerationSettings(2, batch_size=2))
    assert [r["id"] for r in read_jsonl(out)] == ["p1", "p3", "p2", "p0", "p5", "p6", "p7", "p4"]


def test_generate_records_a_dtype_other_than_fp32_and_a_resume_keeps_to_it(tiny_target_dir, tmp_path, capsys):
    """A bf16 answer is another model's: the file says so, and a resume in fp32 would mix the two."""
    prompts = write_prompts(tmp_path)

    def generate(out, *extra):
        argv = ["generate", "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "2"]
        return data_main([*argv, "--target", str(tiny_target_dir), *extra])

    bf16, fp32 = tmp_path / "bf16.jsonl", tmp_path / "fp32.jsonl"
    assert generate(bf16, "--limit", "1", "--dtype", "bf16") == 0
    assert read_jsonl(bf16)[0]["generated_with"]["dtype"] == "bfloat16"
    assert generate(bf16, "--limit", "2") == 2
    assert "dtype: 'bfloat16' -> None" in capsys.readouterr().err
    assert generate(bf16, "--limit", "2", "--dtype", "bf16") == 0
    assert len(read_jsonl(bf16)) == 2
    assert generate(fp32, "--limit", "1") == 0
    assert "dtype" not in read_jsonl(fp32)[0]["generated_with"]  # as in every file written before dtypes were named
