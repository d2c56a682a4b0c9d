"""Bad input on the command line, one row each: the command, its exit status and the words of its one-line error.

Every ``specheads`` subcommand is here (train, data generate, data cache-features, generate, bench, export, push).
Each row drives the real entry point in-process against real files: a tiny target (SmolLM2's tokenizer, hidden 64)
and a real tiny training run (a finished head with its checkpoint), since a checkpoint given where a head belongs,
or a run folder where a checkpoint belongs, are the mix-ups the messages are for. Where the mistake is in a file or
folder argument, ``--target nope-model`` (which cannot load) shows that the command fails before it loads the target:
the error is about the file, not the target. Docs: docs/reliability.md.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specheads.cli import main
from tests.tiny_models import save_tiny_target

REPO = Path(__file__).resolve().parents[1]
MEDUSA = REPO / "configs" / "medusa" / "smollm2-135m.yaml"
DISTILL = REPO / "data" / "smollm2-135m-instruct-greedy-1k.jsonl"
QUESTION = {"question_id": 1, "category": "qa", "turns": ["Name a colour."]}


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path | list[str]]:
    """A tiny target, a small chat file, prompt and question files good and bad, and a run trained on them for 2
    steps with a checkpoint at step 2; a Medusa-2 head whose lora/ folder is gone."""
    root = tmp_path_factory.mktemp("bad-inputs")
    save_tiny_target(root / "target")
    chats = root / "chats.jsonl"
    with DISTILL.open() as source:
        chats.write_text("".join(line for line, _ in zip(source, range(24))))
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
    medusa2 = root / "medusa2-without-lora"  # a Medusa-2 head copied without its lora/ folder
    medusa2.mkdir()
    for name in ("model.safetensors", "README.md"):
        shutil.copy(run / name, medusa2 / name)
    meta = json.loads((run / "config.json").read_text())
    (medusa2 / "config.json").write_text(json.dumps({**meta, "lora_adapter": True}))
    (root / "not-empty").mkdir()
    (root / "not-empty" / "notes.txt").write_text("mine\n")
    (root / "a-file.txt").write_text("a file\n")
    (root / "broken.yaml").write_text(MEDUSA.read_text().replace("  max_steps: 1000\n", "  max_steps: [1000\n"))
    (root / "empty.jsonl").write_text("\n")
    (root / "corrupt-out.jsonl").write_text('{"id": "a", "messages": [\x01]}\n')
    return {
        "root": root,
        "target": root / "target",
        "chats": chats,
        "run": run,
        "checkpoint": run / "checkpoints" / "step-00000002",
        "medusa2": medusa2,
        "prompts": _jsonl(root / "prompts.jsonl", [{"id": "a", "prompt": "Name a colour."}]),
        "dup_prompts": _jsonl(root / "dup.jsonl", [{"id": "a", "prompt": "One."}, {"id": "a", "prompt": "Two."}]),
        "questions": _jsonl(root / "questions.jsonl", [QUESTION]),
        "string_ids": _jsonl(root / "string-ids.jsonl", [{**QUESTION, "question_id": "HumanEval/18"}, QUESTION]),
        "dup_questions": _jsonl(root / "dup-questions.jsonl", [QUESTION, {**QUESTION, "question_id": "1"}]),
        "overrides": overrides,
    }


def run_cli(capsys, argv: list[str]) -> tuple[int, str]:
    """``specheads ARGV`` in-process: its exit status (argparse's own exits too) and what it wrote (stderr, then
    stdout: a bare ``specheads`` prints its usage there)."""
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code
    written = capsys.readouterr()
    return status, written.err + written.out


TRAIN = ["train", "--config", str(MEDUSA), "{overrides}"]
GENERATE = ["generate", "--prompt", "hi", "--target", "{target}", "--max-new-tokens", "2"]
BENCH = ["bench", "--target", "nope-model", "--out", "{root}/bench", "--no-progress"]
DATA_GENERATE = ["data", "generate", "--target", "{target}", "--out", "{root}/distilled.jsonl"]

ROWS = [
    # (id, command, exit status, words of the error)
    ("no-command", [], 2, "usage: specheads"),
    ("unknown-command", ["serve"], 2, "invalid choice: 'serve'"),
    # train
    ("train-no-config", ["train"], 2, "the following arguments are required: --config"),
    ("train-missing-config", ["train", "--config", "{root}/nope.yaml"], 2, "config file not found: {root}/nope.yaml"),
    ("train-broken-yaml", ["train", "--config", "{root}/broken.yaml"], 2, "{root}/broken.yaml: not valid YAML: line "),
    ("train-override-without-value", [*TRAIN, "train.max_steps"], 2, "expected KEY=VALUE"),
    ("train-unknown-key", [*TRAIN, "train.max_stepz=3"], 2, "train.max_stepz"),
    ("train-head-options-type", [*TRAIN, "head.options.num_heads=two"], 2, "fix head.options in the training config"),
    ("train-resume-yes", [*TRAIN, "train.resume=yes"], 2, "YAML reads a bare yes/on/true as a boolean"),
    ("train-secret-env", [*TRAIN, "train.run_name=${{oc.env:HF_TOKEN}}"], 2, "reads HF_TOKEN, which looks like"),
    ("train-new-run-over-checkpoints", [*TRAIN], 2, "train.resume=no starts a new run, but "),
    (
        "train-checkpoint-as-head",
        [*TRAIN, "train.output_dir={root}/run2", "head.init_from={checkpoint}"],
        2,
        "head.init_from={checkpoint} is a training checkpoint, not a saved head",
    ),
    (
        "train-run-folder-as-checkpoint",
        [*TRAIN, "train.max_steps=4", "train.resume={run}"],
        2,
        "resume its latest checkpoint with train.resume={checkpoint}",
    ),
    ("train-resume-twice", [*TRAIN, "--resume", "train.resume={checkpoint}"], 2, "were both given; expected one"),
    ("train-abbreviated-option", [*TRAIN, "--resum"], 2, "unrecognized arguments: --resum"),  # not --resume
    # data generate
    ("data-no-subcommand", ["data"], 2, "the following arguments are required: command"),
    ("data-generate-abbreviated-option", [*DATA_GENERATE, "--prompts", "{prompts}", "--max-new", "4"], 2,
     "unrecognized arguments: --max-new"),
    ("data-generate-negative-temperature", [*DATA_GENERATE, "--prompts", "{prompts}", "--temperature", "-1"], 2,
     "--temperature: expected a number >= 0"),
    ("data-generate-top-p-above-1", [*DATA_GENERATE, "--prompts", "{prompts}", "--top-p", "1.5"], 2,
     "--top-p: expected a number in (0, 1]"),
    ("data-generate-top-p-0", [*DATA_GENERATE, "--prompts", "{prompts}", "--top-p", "0"], 2,
     "--top-p: expected a number in (0, 1]"),
    ("data-generate-batch-0", [*DATA_GENERATE, "--prompts", "{prompts}", "--batch-size", "0"], 2,
     "expected an integer >= 1, got 0"),
    ("data-generate-duplicate-ids", [*DATA_GENERATE, "--prompts", "{dup_prompts}"], 2,
     "{dup_prompts}:2: id 'a' is also the id of line 1; expected unique ids"),
    ("data-generate-empty-prompts", [*DATA_GENERATE, "--prompts", "{root}/empty.jsonl"], 2,
     "{root}/empty.jsonl holds no prompt records"),
    ("data-generate-missing-prompts", [*DATA_GENERATE, "--prompts", "{root}/nope.jsonl"], 2, "{root}/nope.jsonl"),
    ("data-generate-corrupt-out", ["data", "generate", "--target", "{target}", "--prompts", "{prompts}", "--out",
     "{root}/corrupt-out.jsonl"], 2, "{root}/corrupt-out.jsonl:1: not a JSON record"),
    ("data-generate-target-does-not-load", ["data", "generate", "--target", "nope-model", "--prompts", "{prompts}",
     "--out", "{root}/distilled.jsonl"], 2, "specheads data generate: error: could not load target 'nope-model'"),
    # data cache-features
    ("cache-features-target-does-not-load", ["data", "cache-features", "--target", "nope-model", "--data",
     "{chats}", "--out-dir", "{root}/features"], 2, "specheads data cache-features: error: could not load target"),
    ("cache-features-missing-data", ["data", "cache-features", "--target", "nope-model", "--data",
     "{root}/nope.jsonl", "--out-dir", "{root}/features"], 2, "data file not found: {root}/nope.jsonl"),
    # generate
    ("generate-missing-local-head", [*GENERATE, "--head", "{root}/nope-head"], 2,
     "head folder {root}/nope-head does not exist; expected a folder written by head.save_pretrained()"),
    ("generate-checkpoint-as-head", [*GENERATE, "--head", "{checkpoint}"], 2,
     "--head={checkpoint} is a training checkpoint, not a saved head; pass the run's output folder"),
    ("generate-file-as-head", [*GENERATE, "--head", "{run}/config.json"], 2, "config.json is a file; expected a head"),
    ("generate-medusa2-without-lora", [*GENERATE, "--head", "{medusa2}"], 2,
     "says lora_adapter: true), but its lora/ folder is missing"),
    ("generate-mistyped-builtin-target", ["generate", "--prompt", "hi", "--target", "smollm2-135m"], 2,
     "did you mean smollm2-135m-instruct?"),
    ("generate-head-and-lookup", [*GENERATE, "--head", "{run}", "--prompt-lookup"], 2, "exclusive: pick one drafter"),
    ("generate-greedy-sampling", [*GENERATE, "--acceptance", "greedy", "--temperature", "1"], 2,
     "it needs --temperature 0"),
    ("generate-dtype", [*GENERATE, "--dtype", "float8"], 2, "--dtype: expected one of"),
    ("generate-abbreviated-option", [*GENERATE, "--temp", "0"], 2, "unrecognized arguments: --temp"),
    ("generate-lookup-branch-without-head", [*GENERATE, "--lookup-branch", "2"], 2, "needs --head"),
    ("generate-tree-without-head", [*GENERATE, "--tree", "chain"], 2, "--tree chain needs --head DIR"),
    # bench (--target nope-model: every one of these fails before a target would load)
    ("bench-checkpoint-as-head", [*BENCH, "--questions", "{questions}", "--head", "{checkpoint}"], 2,
     "--head={checkpoint} is a training checkpoint, not a saved head"),
    ("bench-missing-question-file", [*BENCH, "--questions", "{root}/nope.jsonl", "--head", "{run}"], 2,
     "question file {root}/nope.jsonl not found; pass --questions PATH"),
    ("bench-empty-question-file", [*BENCH, "--questions", "{root}/empty.jsonl"], 2,
     "question file {root}/empty.jsonl holds no questions"),
    ("bench-duplicate-question-ids", [*BENCH, "--questions", "{dup_questions}"], 2,
     "{dup_questions}:2: question_id 1 is also the id of line 1"),
    ("bench-string-question-ids-are-read", [*BENCH, "--questions", "{string_ids}"], 2,
     "could not load target 'nope-model'"),
    ("bench-missing-local-head", [*BENCH, "--questions", "{questions}", "--head", "{root}/nope-head"], 2,
     "head folder {root}/nope-head does not exist"),
    ("bench-medusa2-without-lora", [*BENCH, "--questions", "{questions}", "--head", "{medusa2}"], 2,
     "its lora/ folder is missing"),
    ("bench-abbreviated-option", [*BENCH, "--per-cat", "1"], 2, "unrecognized arguments: --per-cat"),
    # export (a bad OUT is refused before the target loads)
    ("export-into-the-head", ["export", "{run}", "{run}"], 2, "is the head's own folder"),
    ("export-into-a-folder-with-files", ["export", "{run}", "{root}/not-empty"], 2,
     "output {root}/not-empty already holds files; expected a new or empty folder"),
    ("export-into-a-file", ["export", "{run}", "{root}/a-file.txt"], 2, "output {root}/a-file.txt is a file"),
    ("export-overwrite-never-the-head", ["export", "{run}", "{run}", "--overwrite"], 2, "is the head's own folder"),
    ("export-missing-local-head", ["export", "{root}/nope-head", "{root}/exported"], 2,
     "head folder {root}/nope-head does not exist"),
    ("export-checkpoint", ["export", "{checkpoint}", "{root}/exported"], 2, "has no config.json"),
    ("export-medusa2-without-lora", ["export", "{medusa2}", "{root}/exported"], 2, "its lora/ folder is missing"),
    ("export-unknown-engine", ["export", "{run}", "{root}/exported", "--engine", "tgi"], 2, "invalid choice: 'tgi'"),
    # push (--dry-run: nothing leaves the machine)
    ("push-bad-repo-id", ["push", "{run}", "not a repo id", "--dry-run"], 2, "specheads push: "),
    ("push-missing-folder", ["push", "{root}/nope-head", "me/head", "--dry-run"], 2, "nope-head does not exist"),
    ("push-checkpoint", ["push", "{checkpoint}", "me/head", "--dry-run"], 2, "has no config.json"),
    ("push-medusa2-without-lora", ["push", "{medusa2}", "me/head", "--dry-run"], 2, "its lora/ folder is missing"),
]  # fmt: skip


def _filled(argv: list[str], files: dict) -> list[str]:
    out: list[str] = []
    for arg in argv:
        if arg == "{overrides}":
            out += files["overrides"]
        else:
            out.append(arg.format(**{k: v for k, v in files.items() if k != "overrides"}))
    return out


@pytest.mark.parametrize("argv, status, words", [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_bad_input_ends_in_one_line_naming_the_problem(files, capsys, argv, status, words):
    got, err = run_cli(capsys, _filled(argv, files))
    assert (got, "Traceback" not in err) == (status, True), err
    assert words.format(**{k: v for k, v in files.items() if k != "overrides"}) in err, err


def test_the_good_neighbours_of_the_bad_rows_work(files, capsys):
    """The run folder is the head; a string-id question file and a dry-run push of the head go through."""
    assert main([*_filled(GENERATE, files), "--head", str(files["run"])]) == 0
    assert main(["push", str(files["run"]), "me/head", "--dry-run"]) == 0
    assert main(["export", str(files["run"]), str(files["root"] / "exported")]) == 0
    exported = sorted(p.name for p in (files["root"] / "exported").iterdir())
    assert main(["export", str(files["run"]), str(files["root"] / "exported"), "--overwrite"]) == 0  # its own
    assert sorted(p.name for p in (files["root"] / "exported").iterdir()) == exported
    assert json.loads((files["run"] / "config.json").read_text())["head_type"] == "medusa"  # the head is intact


def test_resume_may_follow_the_overrides(files, capsys):
    """``train --config C key=value --resume key=value``: the flag among the overrides, as before them (it ended in
    "unrecognized arguments")."""
    copy = files["root"] / "run-copy"
    shutil.copytree(files["run"], copy)
    overrides = [o for o in files["overrides"] if not o.startswith("train.output_dir=")]
    assert main(["train", "--config", str(MEDUSA), *overrides, "--resume", f"train.output_dir={copy}"]) == 0
