"""Ordinary mistakes on the command line end in one line, ``specheads CMD: error: ...``, and exit status 2.

Each case drives the real ``specheads`` entry point. The run folder is a real tiny training run (a finished head with
its checkpoints), since a checkpoint given where a head belongs, or a run folder where a checkpoint belongs, are the
mix-ups the messages are for. Where the mistake is in a file or folder argument, the command fails before it loads
the target.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specheads.cli import main
from tests.tiny_models import save_tiny_target

REPO = Path(__file__).resolve().parents[1]
MEDUSA = REPO / "configs" / "medusa" / "smollm2-135m.yaml"
DISTILL = REPO / "data" / "smollm2-135m-instruct-greedy-1k.jsonl"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A tiny target (SmolLM2's tokenizer, hidden 64), a small chat file, a prompt and a question file, and a run
    trained on them for 2 steps with a checkpoint at step 2."""
    root = tmp_path_factory.mktemp("cli-errors")
    save_tiny_target(root / "target")
    chats = root / "chats.jsonl"
    with DISTILL.open() as source:
        chats.write_text("".join(line for line, _ in zip(source, range(24))))
    (root / "prompts.jsonl").write_text(json.dumps({"id": "a", "prompt": "Name a colour."}) + "\n")
    question = {"question_id": 1, "category": "qa", "turns": ["Name a colour."]}
    (root / "questions.jsonl").write_text(json.dumps(question) + "\n")
    run = root / "run"
    overrides = [
        f"target.name={root / 'target'}",
        f"data.paths=[{chats}]",
        "data.max_length=64",
        "data.eval_size=4",
        "head.options.num_heads=1",
        "train.max_steps=2",
        "train.batch_size=4",
        "train.save_every=2",
        "train.eval_every=0",
        "train.progress_bar=false",
        f"train.output_dir={run}",
    ]
    assert main(["train", "--config", str(MEDUSA), *overrides]) == 0
    return {
        "root": root,
        "target": root / "target",
        "chats": chats,
        "run": run,
        "checkpoint": run / "checkpoints" / "step-00000002",
        "prompts": root / "prompts.jsonl",
        "questions": root / "questions.jsonl",
        "overrides": overrides,
    }


def run_cli(capsys, argv: list[str]) -> str:
    """``specheads ARGV``: asserts exit status 2 and no traceback; returns what it wrote to stderr."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err


def test_generate_with_a_head_that_is_not_there_or_not_a_head(files, capsys):
    prompt = ["generate", "--prompt", "hi", "--target", str(files["target"]), "--max-new-tokens", "2"]
    err = run_cli(capsys, [*prompt, "--head", "/nonexistent"])
    assert err.startswith("specheads generate: error: '/nonexistent' is not a local folder and could not be fetched")
    err = run_cli(capsys, [*prompt, "--head", str(files["checkpoint"])])
    assert "specheads generate: error: --head " in err
    assert "this is a training checkpoint, not a saved head; pass the run's output folder" in err
    assert f"train.resume={files['checkpoint']}" in err
    err = run_cli(capsys, [*prompt, "--head", str(files["run"] / "config.json")])
    assert "specheads generate: error: " in err and "config.json is a file; expected a head folder" in err
    assert main([*prompt, "--head", str(files["run"])]) == 0  # the run's output folder is the head


def test_generate_with_a_mistyped_builtin_target(capsys):
    err = run_cli(capsys, ["generate", "--prompt", "hi", "--target", "smollm2-135m"])
    assert err.startswith("specheads generate: error: unknown target 'smollm2-135m'")
    assert "did you mean smollm2-135m-instruct?" in err


def test_bench_with_a_checkpoint_for_a_head_or_a_missing_question_file(files, capsys):
    bench = ["bench", "--target", str(files["target"]), "--out", str(files["root"] / "bench"), "--no-progress"]
    err = run_cli(capsys, [*bench, "--questions", str(files["questions"]), "--head", str(files["checkpoint"])])
    assert "specheads bench: error: --head " in err and "this is a training checkpoint, not a saved head" in err
    err = run_cli(capsys, [*bench, "--questions", "nope.jsonl", "--head", str(files["run"])])
    assert "specheads bench: error: question file nope.jsonl not found; pass --questions PATH" in err


@pytest.mark.parametrize("command", ["generate", "cache-features"])
def test_data_commands_with_a_target_that_does_not_load(files, capsys, command):
    if command == "generate":
        args = ["--prompts", str(files["prompts"]), "--out", str(files["root"] / "distilled.jsonl")]
    else:
        args = ["--data", str(files["chats"]), "--out-dir", str(files["root"] / "features")]
    err = run_cli(capsys, ["data", command, "--target", "nope-model", *args])
    assert err.startswith(f"specheads data {command}: error: could not load target 'nope-model'")


def test_train_from_a_checkpoint_as_a_head_or_resuming_a_run_folder(files, capsys):
    train = ["train", "--config", str(MEDUSA), *files["overrides"]]
    elsewhere = f"train.output_dir={files['root'] / 'run2'}"
    err = run_cli(capsys, [*train, elsewhere, f"head.init_from={files['checkpoint']}"])
    assert err.startswith(f"specheads train: error: head.init_from={files['checkpoint']} is a training checkpoint")
    assert f"continue training from it with train.resume={files['checkpoint']}" in err
    err = run_cli(capsys, [*train, "train.max_steps=4", f"train.resume={files['run']}"])
    assert f"specheads train: error: train.resume={files['run']}: " in err
    assert "train.resume takes a checkpoint folder such as OUT/checkpoints/step-00000200" in err
    assert f"resume its latest checkpoint with train.resume={files['checkpoint']}" in err


def test_train_with_a_broken_config_file(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text(MEDUSA.read_text().replace("  max_steps: 1000\n", "  max_steps: [1000\n"))
    err = run_cli(capsys, ["train", "--config", str(broken)])
    assert err.startswith(f"specheads train: error: {broken}: not valid YAML: line ")
