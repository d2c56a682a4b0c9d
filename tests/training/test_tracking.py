"""Trackers: a wandb offline run writes its run folder with the logged metrics (read back from the run file)."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from specheads.training.config import load_config
from specheads.training.loop import train
from specheads.training.tracking import WANDB_ID_FILE, tracker_setup, wandb_mode, wandb_run_id
from tests.training.train_helpers import REPO, tiny_overrides

MEDUSA = REPO / "configs" / "medusa" / "smollm2-135m.yaml"


def read_wandb_records(run_file: Path) -> list:
    """The protobuf ``Record``s of a ``run-*.wandb`` file (a LevelDB-style log, 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", f"{run_file} is not a wandb run file"
    block, pos, pending, records = 32 * 1024, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a record header never straddles a block: the tail is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind not in (1, 4):
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending)
        records.append(record)
    return records


def read_wandb_history(run_file: Path) -> list[dict[str, float]]:
    """The history rows of a ``run-*.wandb`` file."""
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        for record in read_wandb_records(run_file)
        if record.WhichOneof("record_type") == "history"
    ]


@pytest.mark.slow  # a whole run in a subprocess: in make test, not make test-fast
def test_wandb_offline_run_records_the_metrics(tiny_target_dir, small_chat_file, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    cfg = load_config(
        MEDUSA,
        ["train.log_with=wandb", "head.options.num_heads=2"]
        + tiny_overrides(tiny_target_dir, small_chat_file, out, max_steps=2, eval_every=2, eval_batches=1),
    )
    result = train(cfg)
    runs = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, list(out.rglob("*"))
    history = read_wandb_history(runs[0])
    by_step = {}
    for row in history:
        by_step.setdefault(row["_step"], {}).update(row)
    assert {0, 1, 2} <= set(by_step)
    assert "eval/tau" in by_step[0] and "eval/top1/head1" in by_step[0]  # the untrained head, before step 1
    assert by_step[2]["eval/tau"] == result.metrics["eval/tau"]
    assert "train/loss" in by_step[1] and "train/lr" in by_step[2]


@pytest.mark.slow  # a whole run in a subprocess: in make test, not make test-fast
def test_wandb_keeps_wandb_dir_and_wandb_project_from_the_environment(tiny_target_dir, small_chat_file, tmp_path):
    """WANDB_DIR places wandb's files and WANDB_PROJECT names the project (they were overridden by the output folder
    and the built-in project name); an explicit train.project still wins over WANDB_PROJECT. A fresh process, as a
    user's: wandb reads its environment once per process, and an earlier in-process run would have set it."""
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    overrides = ["train.log_with=wandb", "head.options.num_heads=1"] + tiny_overrides(
        tiny_target_dir, small_chat_file, out, max_steps=1
    )
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}  # see the SIGTERM test below
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        OMP_NUM_THREADS="1",
        WANDB_DIR=str(tmp_path / "wandb-home"),
        WANDB_PROJECT="from-the-environment",
    )
    command = [sys.executable, str(REPO / "scripts" / "train_heads.py"), "--config", str(MEDUSA), *overrides]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (out / "wandb").exists()
    (run_file,) = (tmp_path / "wandb-home" / "wandb").glob("offline-run-*/run-*.wandb")
    runs = [r.run for r in read_wandb_records(run_file) if r.WhichOneof("record_type") == "run"]
    assert runs and {run.project for run in runs} == {"from-the-environment"}
    assert runs[0].run_id == (out / WANDB_ID_FILE).read_text().strip()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_PROJECT", "from-the-environment")
        assert load_config(MEDUSA, overrides).train.project == "from-the-environment"
        assert load_config(MEDUSA, [*overrides, "train.project=mine"]).train.project == "mine"


def test_only_the_main_process_writes_the_wandb_run_id(tmp_path, monkeypatch):
    """Every rank sets up trackers before the process group exists; a rank other than 0 writing its own id could
    replace the one rank 0 started its wandb run with, and a resume would then start another run."""
    monkeypatch.setenv("RANK", "1")
    assert wandb_run_id(tmp_path) is None
    assert not (tmp_path / WANDB_ID_FILE).exists()
    monkeypatch.setenv("RANK", "0")
    first = wandb_run_id(tmp_path)
    assert first and (tmp_path / WANDB_ID_FILE).read_text().strip() == first
    monkeypatch.setenv("RANK", "1")
    assert wandb_run_id(tmp_path) is None and (tmp_path / WANDB_ID_FILE).read_text().strip() == first
    monkeypatch.delenv("RANK")  # a plain one-process run
    assert wandb_run_id(tmp_path) == first
    # a new run in the folder (its predecessor left no checkpoint to resume) is a new wandb run, not appended to
    # the old one's steps
    fresh = wandb_run_id(tmp_path, resuming=False)
    assert fresh != first and (tmp_path / WANDB_ID_FILE).read_text().strip() == fresh
    assert wandb_run_id(tmp_path, resuming=True) == fresh


def test_wandb_is_offline_without_a_key(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "secret-key-value")
    assert wandb_mode() == "online"
    cfg = load_config(MEDUSA, ["train.log_with=wandb", f"train.output_dir={tmp_path}"])
    _, init_kwargs = tracker_setup(cfg)
    assert "secret-key-value" not in repr(init_kwargs)


@pytest.mark.parametrize("kind, hidden", [("wandb", ["wandb"]), ("tensorboard", ["tensorboard", "tensorboardX"])])
def test_a_tracker_without_its_package_fails_before_anything_loads(kind, hidden, tmp_path, capsys, monkeypatch):
    """Accelerate only warns when ``log_with`` names a tracker that is not installed, and the run trains untracked
    and exits 0. A package set to None in sys.modules is one that is not installed (find_spec gives None)."""
    import specheads.training.loop
    from specheads.training.config import ConfigError
    from specheads.training.train_cli import train_main

    built = load_config(MEDUSA, [f"train.log_with={kind}", f"train.output_dir={tmp_path / 'out'}"])
    for package in hidden:
        monkeypatch.setitem(sys.modules, package, None)
    expected = rf"train.log_with={kind} needs the {hidden[0]} package, which is not installed: pip install " + (
        rf"'specheads\[{kind}\]'"
    )
    with pytest.raises(ConfigError, match=expected):
        load_config(MEDUSA, [f"train.log_with={kind}"])
    with pytest.raises(ConfigError, match=expected):  # a config built before (or in code) is checked when training
        tracker_setup(built)

    def no_training(cfg):
        raise AssertionError("training started")

    monkeypatch.setattr(specheads.training.loop, "train", no_training)
    assert train_main(["--config", str(MEDUSA), f"train.log_with={kind}", f"train.output_dir={tmp_path / 'out'}"]) == 2
    assert f"pip install 'specheads[{kind}]'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_folder_named_like_the_tracker_is_not_its_package(tmp_path, monkeypatch):
    """wandb writes its runs into ./wandb by default; that folder is a namespace package to find_spec."""
    import specheads.training.tracker_packages as tracker_packages
    import specheads.training.tracking as tracking
    from specheads.training.config import ConfigError

    (tmp_path / "tracker_runs_folder").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(tracker_packages.TRACKER_PACKAGES, "wandb", ("tracker_runs_folder",))
    with pytest.raises(ConfigError, match=r"needs the tracker_runs_folder package, which is not installed"):
        tracking.require_tracker_package("wandb")


def test_tensorboard_runs_on_either_of_its_packages(monkeypatch):
    """Accelerate's tensorboard tracker takes tensorboard or tensorboardX; only both missing is an error."""
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    cfg = load_config(MEDUSA, ["train.log_with=tensorboard"])
    assert tracker_setup(cfg) == ("tensorboard", {})


def test_tensorboard_writes_event_files(tiny_target_dir, small_chat_file, tmp_path):
    out = tmp_path / "run"
    cfg = load_config(
        MEDUSA,
        ["train.log_with=tensorboard", "head.options.num_heads=1"]
        + tiny_overrides(tiny_target_dir, small_chat_file, out, max_steps=1),
    )
    train(cfg)
    assert list((out / "logs").rglob("events.out.tfevents.*"))


def _logged_losses(out: Path) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    losses = {}
    for events in sorted((out / "logs").rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        if "train/loss" in accumulator.Tags()["scalars"]:
            losses.update({e.step: e.value for e in accumulator.Scalars("train/loss")})
    return losses


def test_the_loss_logged_across_a_resume_is_the_uninterrupted_runs(tiny_target_dir, small_chat_file, tmp_path):
    """Checkpoints every 2 steps, losses logged every 3: the window logged at step 6 began before the step-4
    checkpoint. It is saved with the checkpoint, so the resumed run logs the same mean as an uninterrupted one."""
    runs = {}
    for name, stops in (("full", [None]), ("resumed", [4, None])):
        for stop_after in stops:
            kw = dict(max_steps=6, batch_size=2, save_every=2, log_every=3, resume="auto", stop_after=stop_after)
            overrides = ["train.log_with=tensorboard", "head.options.num_heads=1"]
            overrides += tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / name, **kw)
            train(load_config(MEDUSA, [o for o in overrides if o != "train.stop_after=None"]))
        runs[name] = _logged_losses(tmp_path / name)
    assert sorted(runs["full"]) == [3, 6] and runs["resumed"] == runs["full"]


@pytest.mark.slow  # a whole run in a subprocess: in make test, not make test-fast
def test_a_sigtermed_run_keeps_its_wandb_metrics_and_resumes_into_the_same_wandb_run(
    tiny_target_dir, small_chat_file, tmp_path
):
    """SIGTERM (a scheduler's preemption, `kill`) unwinds: the run exits through SystemExit, wandb flushes (the run
    file holds more than its header), and `--resume` logs into the same run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    # max_steps far beyond what the run reaches before the signal: it cannot finish first, however fast the machine
    overrides = ["train.log_with=wandb", "head.options.num_heads=2"] + tiny_overrides(
        tiny_target_dir, small_chat_file, out, max_steps=1_000_000, save_every=2, keep_last=1
    )
    command = [sys.executable, str(REPO / "scripts" / "train_heads.py"), "--config", str(MEDUSA), *overrides]
    # WANDB_SERVICE: an in-process wandb run earlier in this test process leaves it set, and a child would log
    # through that process's wandb service instead of its own, as a user's training process does
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1")
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not list((out / "checkpoints").glob("step-*/trainer_state.json")) and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0][-3000:]
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)  # steps 1 and 2 were logged before their checkpoint was saved
    log = process.communicate(timeout=120)[0]
    assert process.returncode == 128 + signal.SIGTERM, log[-3000:]
    (first,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    logged = {row["_step"] for row in read_wandb_history(first) if "train/loss" in row}
    assert {1, 2} <= logged, logged

    from specheads.training.checkpoint import latest_checkpoint, read_step

    resumed = [*command, f"train.stop_after={read_step(latest_checkpoint(out)) + 2}", "--resume"]
    done = subprocess.run(resumed, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and len({run.name.rsplit("-", 1)[1] for run in runs}) == 1  # one wandb run id
    assert (out / "wandb_run_id").read_text().strip() == runs[0].name.rsplit("-", 1)[1]


def test_progress_bar_false_silences_the_libraries_bars_for_the_run_only():
    """train.progress_bar=false left transformers' "Loading weights" and datasets' reading and tokenizing bars on."""
    import datasets
    from transformers.utils import logging as hf_logging

    from specheads.training.loop import _library_progress_bars

    datasets.enable_progress_bars()  # the libraries' defaults (an environment variable may have turned them off)
    hf_logging.enable_progress_bar()
    with _library_progress_bars(False):
        assert not datasets.is_progress_bar_enabled() and not hf_logging.is_progress_bar_enabled()
    assert datasets.is_progress_bar_enabled() and hf_logging.is_progress_bar_enabled()  # as they were
    with _library_progress_bars(True):
        assert datasets.is_progress_bar_enabled() and hf_logging.is_progress_bar_enabled()
