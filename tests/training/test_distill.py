"""Self-distillation on SmolLM2: batched (left-padded) greedy answers equal per-prompt generate; runs resume."""

from __future__ import annotations

import json

import torch

from specheads.training.data_cli import data_main
from specheads.training.distill import GenerationSettings, answer_batch, generate_dataset, read_jsonl, read_prompts

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


def test_batched_greedy_equals_per_prompt_generate(smollm2, tmp_path):
    model, tokenizer = smollm2
    records = read_prompts(write_prompts(tmp_path))
    settings = GenerationSettings(max_new_tokens=8, batch_size=3)
    batched = answer_batch(model, tokenizer, [r["messages"] for r in records], settings)
    for record, answer in zip(records, batched):
        ids = tokenizer.apply_chat_template(
            record["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :].tolist()
        if tokenizer.eos_token_id in out:
            out = out[: out.index(tokenizer.eos_token_id)]
        assert answer == tokenizer.decode(out, skip_special_tokens=True)


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
    assert [r["id"] for r in read_jsonl(out)] == ["a", "b", "c"]
    assert generate_dataset(model, tokenizer, prompts, out, settings) == 0


def test_generate_cli_samples_reproducibly(smollm2, tmp_path):
    prompts = write_prompts(tmp_path)
    common = ["generate", "--prompts", str(prompts), "--limit", "2", "--max-new-tokens", "3", "--temperature", "0.8"]
    for name in ("one.jsonl", "two.jsonl"):
        assert data_main(common + ["--top-p", "0.9", "--seed", "7", "--out", str(tmp_path / name)]) == 0
    one, two = read_jsonl(tmp_path / "one.jsonl"), read_jsonl(tmp_path / "two.jsonl")
    assert [r["id"] for r in one] == ["a", "b"] and one == two
