"""CLI options reach what they configure: `specheads bench` and `specheads data cache-features` run end to end on a
tiny target (hidden 64, SmolLM2's tokenizer) in seconds, and each option shows in what the run measured or wrote."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tests.tiny_models import save_tiny_target

REPO = Path(__file__).resolve().parents[1]
DISTILL = REPO / "data" / "smollm2-135m-instruct-greedy-1k.jsonl"


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    return save_tiny_target(tmp_path_factory.mktemp("tiny-target"), num_layers=2)


def test_bench_options_choose_the_methods_questions_and_lookup_length(tiny_target, tmp_path):
    from specheads.bench.cli import bench_main

    questions = [
        {"question_id": 81, "category": "writing", "turns": ["Write one sentence about the sea."]},
        {"question_id": 161, "category": "translation", "turns": ["Translate to English: Guten Morgen."]},
        {"question_id": 162, "category": "translation", "turns": ["Translate to English: Danke."]},
        {"question_id": 163, "category": "translation", "turns": ["Translate to English: Bis bald."]},
    ]
    question_file = tmp_path / "question.jsonl"
    question_file.write_text("".join(json.dumps(q) + "\n" for q in questions))
    out = tmp_path / "out"
    argv = ["--target", str(tiny_target), "--questions", str(question_file), "--device", "cpu", "--out", str(out)]
    argv += ["--max-new-tokens", "4", "--no-progress", "--methods", "hf-prompt-lookup", "specheads-lookup"]
    argv += ["--categories", "translation", "--per-category", "2", "--prompt-lookup-tokens", "3"]
    assert bench_main(argv) == 0
    report = json.loads((out / "results.json").read_text())
    assert list(report["results"]) == ["generate", "hf-prompt-lookup", "specheads-lookup"]  # the baseline, then these
    assert report["categories"] == ["translation"]
    measured = {(r["method"], r["question_id"]) for r in report["per_prompt"]}
    assert measured == {(m, q) for m in report["results"] for q in (161, 162)}  # the first 2 translation questions
    assert report["methods"]["hf-prompt-lookup"]["description"] == "prompt_lookup_num_tokens=3"
    assert report["methods"]["specheads-lookup"]["tree"] == "chain of up to 3 (n-gram lookup)"
    config = report["config"]
    assert (config["methods"], config["categories"], config["per_category"], config["prompt_lookup_tokens"]) == (
        ["hf-prompt-lookup", "specheads-lookup"],
        ["translation"],
        2,
        3,
    )


def test_cache_features_options_reach_the_split_the_shards_and_the_batches(tiny_target, tmp_path, monkeypatch):
    """8 ShareGPT chats, a quarter held out: 6 train in shards of 4 (4 + 2), each run in batches of 3 (3 + 1, 2), and
    2 eval in one shard. The defaults (auto format, 5% held out, shards of 512, batches of 8) give other numbers."""
    import specheads.target
    from specheads.training.data_cli import data_main
    from specheads.training.feature_cache import CachedFeatureDataset

    roles = {"user": "human", "assistant": "gpt", "system": "system"}
    with open(DISTILL) as source:
        chats = [json.loads(line)["messages"] for line in itertools.islice(source, 8)]
    data = tmp_path / "sharegpt.json"
    data.write_text(
        json.dumps([{"conversations": [{"from": roles[m["role"]], "value": m["content"]} for m in c]} for c in chats])
    )

    batches = []  # the batch size of every target forward (a hook on the real model the CLI loads)
    load_target = specheads.target.load_target

    def load_and_watch(*args, **kwargs):
        model, tokenizer = load_target(*args, **kwargs)
        model.get_input_embeddings().register_forward_pre_hook(lambda module, inputs: batches.append(len(inputs[0])))
        return model, tokenizer

    monkeypatch.setattr(specheads.target, "load_target", load_and_watch)
    out = tmp_path / "cache"
    argv = ["cache-features", "--target", str(tiny_target), "--data", str(data), "--out-dir", str(out)]
    argv += ["--max-length", "64", "--layer-ids", "2", "--no-logits", "--format", "sharegpt"]
    argv += ["--eval-fraction", "0.25", "--shard-size", "4", "--batch-size", "3"]
    assert data_main(argv) == 0
    assert batches == [3, 1, 2, 2]  # train shard 0, train shard 1, eval
    for split, samples, shards in [("train", 6, 2), ("eval", 2, 1)]:
        meta = json.loads((out / split / "meta.json").read_text())
        assert (meta["num_samples"], meta["shard_size"]) == (samples, 4)
        assert (meta["data"]["format"], meta["data"]["eval_fraction"]) == ("sharegpt", 0.25)
        assert len(list((out / split).glob("*.safetensors"))) == shards
        assert len(CachedFeatureDataset(out / split)) == samples


@pytest.mark.parametrize(
    "command, argv, message",
    [
        ("data", ["generate", "--prompts", "p.jsonl", "--out", "o.jsonl", "--device", "cuda:7"], "--device: 'cuda:7'"),
        ("data", ["cache-features", "--data", "d", "--out-dir", "o", "--device", "gpu"], "expected a device such as"),
        ("data", ["cache-features", "--data", "d", "--out-dir", "o", "--eval-fraction", "2"], "in [0, 1)"),
        (
            "data",
            ["cache-features", "--data", "d", "--out-dir", "o", "--topk", "0"],
            "--topk: expected an integer >= 1",
        ),
        ("bench", ["--temperature=-1"], "--temperature: expected a number >= 0"),
        ("bench", ["--max-new-tokens", "0"], "--max-new-tokens: expected an integer >= 1"),
        ("bench", ["--per-category", "0"], "--per-category: expected an integer >= 1"),
    ],
)
def test_bad_values_are_usage_errors_before_anything_loads(command, argv, message, capsys):
    """Before: a traceback after the target loaded (--device), a silently inverted split (--eval-fraction 2 held
    out 3 of 4 samples) or a run that reported nonsense (--temperature -1)."""
    from specheads.bench.cli import bench_main
    from specheads.training.data_cli import data_main

    with pytest.raises(SystemExit) as exit_info:
        (data_main if command == "data" else bench_main)(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_data_commands_refuse_contradictory_or_foreign_input(tmp_path, capsys):
    from specheads.training.data_cli import data_main

    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    argv = ["cache-features", "--data", str(chats), "--out-dir", str(tmp_path / "cache"), "--no-logits", "--topk", "4"]
    assert data_main(argv) == 2
    assert "--no-logits stores no target distribution and --topk keeps its top k" in capsys.readouterr().err
    argv = ["task-prompts", "--conversations", str(chats), "--out", str(tmp_path / "tasks.jsonl"), "--translate", "2"]
    assert data_main(argv) == 2
    assert "record 1 has no ShareGPT id and conversations (found ['messages'])" in capsys.readouterr().err
