"""`accelerate launch` with two CPU processes (DDP over gloo; DeepSpeed ZeRO-2/3 on its CPU accelerator; two
single-process "nodes" on localhost): the same script completes, each rank trains on its own share of the data, both
ranks end with identical weights, and the saved head loads."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specheads.heads import load_head
from specheads.target import load_target
from tests.training.train_helpers import GRADIENT_AS_UPDATE, REPO, tiny_overrides

pytestmark = pytest.mark.distributed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch_command(launch_config: str, head_config: str, result_dir: Path, overrides: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "configs" / "accelerate" / launch_config),
        "--num_processes", "2", "--main_process_port", str(_free_port()),
        str(REPO / "tests" / "training" / "launch_train.py"),
        str(REPO / "configs" / head_config / "smollm2-135m.yaml"), str(result_dir), *overrides,
    ]  # fmt: skip


def _launch(launch_config: str, head_config: str, result_dir: Path, overrides: list[str], **env: str) -> list[dict]:
    """`accelerate launch` two CPU processes of tests/training/launch_train.py; each rank's record."""
    command = _launch_command(launch_config, head_config, result_dir, overrides)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", **env}
    records = [result_dir / f"rank{i}.json" for i in range(2)]
    for record in records:  # a second launch into one folder must not read the first one's results
        record.unlink(missing_ok=True)
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 and _aborted_in_teardown(done.stderr, records):
        warnings.warn("a rank aborted at interpreter exit after writing its result (C++ thread teardown)", stacklevel=2)
    else:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return [json.loads(record.read_text()) for record in records]


def _aborted_in_teardown(stderr: str, records: list[Path]) -> bool:
    """A rank killed by std::terminate at interpreter exit, after training, the final save, end_training and its
    result file: seen once in ~20 DeepSpeed ZeRO-3 CPU launches, a C++ thread left joinable at shutdown. Everything
    the tests check had happened; any failure before the result files is still a failure."""
    return all(record.is_file() for record in records) and "terminate called without an active exception" in stderr


def _assert_in_sync(ranks: list[dict], distributed_type: str, steps: int) -> None:
    assert [r["world"] for r in ranks] == [2, 2]
    assert all(r["distributed_type"] == f"DistributedType.{distributed_type}" for r in ranks), ranks
    assert ranks[0]["step"] == ranks[1]["step"] == steps
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-9, abs=1e-9)
    assert ranks[0]["metrics"] == ranks[1]["metrics"]  # eval metrics are reduced over both ranks


def _assert_sharded(ranks: list[dict], head_config: str, overrides: list[str], target_dir: Path) -> None:
    """Each rank trained on its own share of the data (equal weights alone do not show it: ranks that all read every
    batch stay in sync too). Within an epoch the ranks' samples are disjoint, and a whole epoch's samples over both
    ranks are the training split, each once. The split must fill whole rounds of micro-batches (one per rank), so
    Accelerate's even_batches repeats no sample at an epoch's end. For runs from step 0 (a record starts an epoch)."""
    from transformers import AutoTokenizer

    from specheads.training.config import load_config
    from specheads.training.data import build_datasets

    cfg = load_config(REPO / "configs" / head_config / "smollm2-135m.yaml", overrides)
    train_split, _ = build_datasets(cfg.data, AutoTokenizer.from_pretrained(target_dir))
    split = [tuple(ids) for ids in train_split["input_ids"]]
    assert len(set(split)) == len(split), "two training samples are equal: the check below needs them distinct"
    per_round = len(ranks) * cfg.train.batch_size
    assert len(split) % per_round == 0, f"{len(split)} training samples leave an epoch's last round part-filled"
    per_epoch = len(split) // per_round  # micro-batches of one rank in an epoch
    batches = [[[tuple(ids) for ids in batch] for batch in rank["train_samples"]] for rank in ranks]
    assert len(batches[0]) == len(batches[1]) == ranks[0]["step"] * cfg.train.grad_accum > 0
    for start in range(0, len(batches[0]), per_epoch):
        shares = [[sample for batch in mine[start : start + per_epoch] for sample in batch] for mine in batches]
        both = set(shares[0]) & set(shares[1])
        assert not both, f"both ranks trained on {len(both)} of the same samples in micro-batches {start}+"
        assert set(shares[0] + shares[1]) <= set(split)
        if start + per_epoch <= len(batches[0]):  # a whole epoch: every training sample once
            assert sorted(shares[0] + shares[1]) == sorted(split)


@pytest.mark.parametrize(
    "launch_config, head_config",
    [
        ("cpu-2proc.yaml", "eagle3"),
        ("deepspeed-zero2.yaml", "medusa"),
        ("deepspeed-zero3.yaml", "medusa"),
    ],
    ids=["ddp", "deepspeed-zero2", "deepspeed-zero3"],
)
def test_two_cpu_processes_stay_in_sync(launch_config, head_config, tiny_target_dir, small_chat_file, tmp_path):
    out = tmp_path / "run"
    deepspeed = launch_config.startswith("deepspeed")
    overrides = tiny_overrides(
        tiny_target_dir, small_chat_file, out, max_steps=3, batch_size=2, eval_every=3, save_every=2
    ) + ["head.options.draft_vocab_size=null", "loss.ttt_steps=2"] * (head_config == "eagle3")
    # 16 samples less 8 held out: 8 to train on, 2 per micro-batch on each rank, so step 3 starts a second epoch
    overrides.append("data.max_samples=16")
    overrides += ["train.max_grad_norm=0.5"] * deepspeed  # DeepSpeed clips in its engine: it must get this value
    # ZeRO-2 in bf16: DeepSpeed casts the head, while the target's lm_head it projects through stays fp32
    overrides += ["train.mixed_precision=bf16"] * (launch_config == "deepspeed-zero2.yaml")
    # The launch exactly as train_cli.py documents it, without ACCELERATE_USE_CPU: train() asks Accelerate for CPU
    # processes itself (otherwise each process would train alone as a world of one)
    ranks = _launch(launch_config, head_config, tmp_path, overrides)
    _assert_in_sync(ranks, "DEEPSPEED" if deepspeed else "MULTI_CPU", 3)
    _assert_sharded(ranks, head_config, overrides, tiny_target_dir)
    assert [r["gradient_clipping"] for r in ranks] == ([0.5, 0.5] if deepspeed else [None, None])
    assert (out / "checkpoints" / "step-00000002").is_dir()
    target, _ = load_target(Path(tiny_target_dir))
    load_head(out, target)


@pytest.mark.parametrize("launch_config", ["cpu-2proc.yaml", "deepspeed-zero2.yaml"], ids=["ddp", "deepspeed-zero2"])
def test_two_processes_take_the_step_one_process_takes(
    launch_config, tiny_target_dir, small_chat_file, tmp_path, monkeypatch
):
    """Two ranks of 2 samples each take the gradient step one process takes on the same 4 samples in one batch: each
    rank's loss is weighted by its share of the step's tokens, which the engines' gradient average (DDP's, DeepSpeed's)
    would otherwise leave equal (a rank with fewer tokens would count as much as one with more)."""
    from launch_train import record_training_samples

    from specheads.training.config import load_config
    from specheads.training.loop import train
    from specheads.training.metrics import Throughput

    monkeypatch.setattr(Throughput, "count", Throughput.count)  # restored after the test: the recorder replaces it
    batches = record_training_samples()
    step = dict(max_steps=1, max_grad_norm=0, warmup_steps=0)
    config = REPO / "configs" / "eagle1" / "smollm2-135m.yaml"
    one = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "one", batch_size=4, **step)
    train(load_config(config, GRADIENT_AS_UPDATE + one))
    start_overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "start", **step)
    train(load_config(config, [*GRADIENT_AS_UPDATE, "train.lr=0"] + start_overrides))  # the initial weights

    two = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "two", batch_size=2, **step)
    ranks = _launch(launch_config, "eagle1", tmp_path, GRADIENT_AS_UPDATE + two)
    _assert_in_sync(ranks, "DEEPSPEED" if launch_config.startswith("deepspeed") else "MULTI_CPU", 1)
    shares = [[sample for batch in rank["train_samples"] for sample in batch] for rank in ranks]
    assert sorted(shares[0] + shares[1]) == sorted(batches[0])  # the same four samples: the one-process batch
    assert sum(map(len, shares[0])) != sum(map(len, shares[1]))  # unequal shares, or an unweighted mean would pass
    weights = {name: load_file(str(tmp_path / name / "model.safetensors")) for name in ("one", "two", "start")}
    for name, start in weights["start"].items():
        expected = weights["one"][name] - start
        torch.testing.assert_close(
            weights["two"][name] - start,
            expected,
            rtol=1e-3,
            atol=1e-4 * expected.abs().max().item(),
            msg=lambda m, name=name: f"{name}: {m}",
        )


def test_eval_over_two_processes_counts_each_held_out_sample_once(tiny_target_dir, small_chat_file, tmp_path):
    """10 held-out samples in batches of 4 over 2 processes: Accelerate completes the last round with 6 samples from
    the start of the split, which must not count twice. The untrained head's step-0 metrics equal one process's."""
    from specheads.training.config import load_config
    from specheads.training.loop import train

    config = REPO / "configs" / "medusa" / "smollm2-135m.yaml"
    overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "two" / "run", max_steps=1, eval_every=1)
    overrides += ["data.eval_size=10", "train.mixed_precision=no"]
    two = _launch("cpu-2proc.yaml", "medusa", tmp_path / "two", overrides, ACCELERATE_USE_CPU="1")
    one = train(load_config(config, [*overrides, f"train.output_dir={tmp_path / 'one'}"]))
    two_step0, one_step0 = two[0]["history"][0], one.history[0]
    assert two_step0["step"] == one_step0["step"] == 0
    assert two_step0.keys() == one_step0.keys()
    for name in ("eval/top1/head1", "eval/top1/head2", "eval/top1/head3", "eval/tau"):
        assert two_step0[name] == pytest.approx(one_step0[name], rel=1e-6), name


FSDP_ON_CPU = {"SPECHEADS_TEST_FSDP_ON_CPU": "1"}  # launch_train.py lifts Accelerate's accelerator-only FSDP gate


def _ddp_then_fsdp_and_resumed(
    head_config: str, tmp_path: Path, overrides_for: Callable[[Path], list[str]]
) -> dict[str, tuple[list[dict], Path]]:
    """The same 4-step run under DDP, under FSDP2, and under FSDP2 resumed from the latter's step-2 checkpoint, each
    on two CPU processes: every run's rank records and output folder."""
    runs = {}
    for name, launch_config, extra in [
        ("ddp", "cpu-2proc.yaml", {}),
        ("fsdp", "fsdp.yaml", FSDP_ON_CPU),
        ("fsdp-resumed", "fsdp.yaml", FSDP_ON_CPU),
    ]:
        out = tmp_path / name / "run"
        overrides = overrides_for(out)
        if name == "fsdp-resumed":
            overrides.append(f"train.resume={tmp_path / 'fsdp' / 'run' / 'checkpoints' / 'step-00000002'}")
        ranks = _launch(launch_config, head_config, tmp_path / name, overrides, ACCELERATE_USE_CPU="1", **extra)
        _assert_in_sync(ranks, "MULTI_CPU" if name == "ddp" else "FSDP", 4)
        runs[name] = (ranks, out)
    return runs


def test_fsdp2_on_two_cpu_processes_matches_ddp_and_resumes(tiny_target_dir, small_chat_file, tmp_path):
    """configs/accelerate/fsdp.yaml with torch's FSDP2 sharding the head over two CPU processes (Accelerate's
    accelerator-only gate lifted in launch_train.py): the same data and seed end at the weights DDP reaches, the
    sharded checkpoint (torch.distributed.checkpoint files) resumes to the same weights, and the head loads."""
    settings = dict(max_steps=4, batch_size=2, eval_every=4, save_every=2, mixed_precision="no")
    launched = _ddp_then_fsdp_and_resumed(
        "medusa", tmp_path, lambda out: tiny_overrides(tiny_target_dir, small_chat_file, out, **settings)
    )
    runs = {}
    for name, (ranks, out) in launched.items():
        assert ranks[0]["eval_steps"] == ([4] if name == "fsdp-resumed" else [0, 4])
        runs[name] = load_file(out / "model.safetensors")
    assert any(p.name.endswith(".distcp") for p in (tmp_path / "fsdp" / "run" / "checkpoints").rglob("*"))
    for name in ("fsdp", "fsdp-resumed"):
        assert runs[name].keys() == runs["ddp"].keys()
        for key, value in runs["ddp"].items():
            torch.testing.assert_close(runs[name][key], value, rtol=1e-4, atol=1e-5, msg=f"{name}: {key}")
    target, _ = load_target(Path(tiny_target_dir))
    load_head(tmp_path / "fsdp" / "run", target)


def test_medusa2_under_fsdp2_saves_the_head_and_adapter_ddp_saves_and_resumes(
    tiny_target_dir, small_chat_file, tmp_path
):
    """Medusa-2's objective holds the adapted target, so FSDP2 shards the target with the heads. The final save read
    the target's weight probe and peft's adapter tensors from those shards and crashed after the last step; both now
    come from what was recorded before sharding and from the gathered state. Head and adapter equal DDP's, the
    step-2 checkpoint resumes to the same weights, and the head loads with its adapter. (FSDP's checkpoints still
    hold the frozen target's shards: Accelerate saves FSDP models through torch's own state dict, whole.)"""
    settings = dict(max_steps=4, batch_size=2, eval_every=0, save_every=2, mixed_precision="no")
    launched = _ddp_then_fsdp_and_resumed(
        "medusa2",
        tmp_path,
        lambda out: tiny_overrides(tiny_target_dir, small_chat_file, out, **settings) + ["lora.heads_warmup_steps=1"],
    )
    files = ("model.safetensors", "lora/adapter_model.safetensors")
    runs = {name: {f: load_file(out / f) for f in files} for name, (_, out) in launched.items()}
    lora_b = [v for k, v in runs["ddp"]["lora/adapter_model.safetensors"].items() if "lora_B" in k]
    assert lora_b and all(v.abs().max() > 0 for v in lora_b)  # the adapters trained (they start at zero)
    for name in ("fsdp", "fsdp-resumed"):
        for file, tensors in runs["ddp"].items():
            assert runs[name][file].keys() == tensors.keys(), (name, file)
            for key, value in tensors.items():
                torch.testing.assert_close(runs[name][file][key], value, rtol=1e-4, atol=1e-6, msg=f"{name}: {key}")
    saved = json.loads((tmp_path / "fsdp" / "run" / "config.json").read_text())
    assert saved["config"]["target"]["weight_probe"]  # the record taken before sharding, not an empty one
    from specheads.heads import load_lora_adapter

    target, _ = load_target(Path(tiny_target_dir))
    load_head(tmp_path / "fsdp" / "run", load_lora_adapter(target, tmp_path / "fsdp" / "run"), adapter_applied=True)


def test_two_nodes_on_localhost_train_as_one_group(tiny_target_dir, small_chat_file, tmp_path):
    """configs/accelerate/multi-node.yaml as a user runs it: one `accelerate launch` per node, each with its own
    --machine_rank and node 0's address. Here both "nodes" are this machine (one CPU process each, gloo), so two
    separate launchers must rendezvous into one world of 2 and train in sync."""
    out = tmp_path / "run"
    overrides = tiny_overrides(tiny_target_dir, small_chat_file, out, max_steps=3, batch_size=2, eval_every=3)
    config_file = REPO / "configs" / "medusa" / "smollm2-135m.yaml"
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "ACCELERATE_USE_CPU": "1"}
    launchers = []
    for machine_rank in (0, 1):
        command = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(REPO / "configs" / "accelerate" / "multi-node.yaml"),
            "--num_processes", "2", "--num_machines", "2", "--machine_rank", str(machine_rank),
            "--main_process_ip", "127.0.0.1", "--main_process_port", port, "--mixed_precision", "no",
            str(REPO / "tests" / "training" / "launch_train.py"), str(config_file), str(tmp_path), *overrides,
        ]  # fmt: skip
        log = open(tmp_path / f"node{machine_rank}.log", "w")  # noqa: SIM115 - closed below
        launchers.append((subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    try:
        codes = [process.wait(timeout=600) for process, _ in launchers]
    finally:
        for process, log in launchers:
            process.kill()
            log.close()
    logs = [(tmp_path / f"node{i}.log").read_text()[-4000:] for i in (0, 1)]
    assert codes == [0, 0], logs

    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    _assert_in_sync(ranks, "MULTI_CPU", 3)
    _assert_sharded(ranks, "medusa", overrides, tiny_target_dir)  # each node's rank its own share
    target, _ = load_target(Path(tiny_target_dir))
    load_head(out, target)


def test_fsdp_config_builds_accelerates_fsdp2_plugin(monkeypatch):
    """`accelerate launch --config_file configs/accelerate/fsdp.yaml` yields the environment that builds Accelerate's
    FSDP2 plugin with our settings (only the objective is wrapped, as one unit). On a CPU-only machine Accelerate
    would run this launch as plain DDP; the FSDP2 test above lifts that gate to run the sharding itself."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    config = REPO / "configs" / "accelerate" / "fsdp.yaml"
    args = launch_command_parser().parse_args(["--config_file", str(config), "--num_processes", "2", "train.py"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.auto_wrap_policy is None  # NO_WRAP: the small objective is one FSDP unit
    assert "SHARDED_STATE_DICT" in str(plugin.state_dict_type)


def test_medusa2_under_deepspeed_checkpoints_without_the_frozen_target_and_resumes(
    tiny_target_dir, small_chat_file, tmp_path
):
    """Medusa-2's objective holds the whole adapted target; DeepSpeed saves it through its own engine, which is told
    to leave frozen parameters out (it kept all of them). A run resumed from the step-2 checkpoint ends where the
    uninterrupted run does."""
    settings = dict(max_steps=4, batch_size=2, eval_every=0, save_every=2, keep_last=2)
    whole_dir = tmp_path / "whole" / "run"
    extra = ["train.max_grad_norm=0.5", "lora.heads_warmup_steps=3"]  # the adapters join after the resume
    overrides = tiny_overrides(tiny_target_dir, small_chat_file, whole_dir, **settings) + extra
    whole = _launch("deepspeed-zero2.yaml", "medusa2", tmp_path / "whole", overrides)
    states = torch.load(
        whole_dir / "checkpoints" / "step-00000002" / "pytorch_model" / "mp_rank_00_model_states.pt", weights_only=True
    )["module"]
    frozen = [name for name in states if not name.startswith("head.") and "lora_" not in name]
    # the one frozen tensor left is the tied embedding under its lm_head alias (DeepSpeed drops a frozen parameter
    # by the name named_parameters gives it, which is the embedding's)
    assert frozen == ["adapted.base_model.model.lm_head.weight"], frozen
    checkpoint = whole_dir / "checkpoints" / "step-00000002"
    resumed_dir = tmp_path / "resumed" / "run"
    overrides = tiny_overrides(tiny_target_dir, small_chat_file, resumed_dir, **settings)
    overrides += [*extra, f"train.resume={checkpoint}"]
    resumed = _launch("deepspeed-zero2.yaml", "medusa2", tmp_path / "resumed", overrides)
    assert resumed[0]["step"] == whole[0]["step"] == 4
    assert resumed[0]["checksum"] == pytest.approx(whole[0]["checksum"], rel=1e-9, abs=1e-9)
    assert (resumed_dir / "lora" / "adapter_model.safetensors").is_file()


def test_medusa2_under_zero3_checkpoints_without_the_frozen_target_and_resumes(
    tiny_target_dir, small_chat_file, tmp_path
):
    """ZeRO-3 partitions the adapted target with the heads; its checkpoints still leave the frozen weights out (a
    checkpoint, optimizer state included, is a fraction of the target's own file), and a run resumed from step 2
    ends where the uninterrupted run does, with the adapter saved."""
    settings = dict(max_steps=4, batch_size=2, eval_every=0, save_every=2, keep_last=2)
    runs = {}
    for name in ("whole", "resumed"):
        out = tmp_path / name / "run"
        overrides = tiny_overrides(tiny_target_dir, small_chat_file, out, **settings) + ["lora.heads_warmup_steps=1"]
        if name == "resumed":
            overrides.append(f"train.resume={tmp_path / 'whole' / 'run' / 'checkpoints' / 'step-00000002'}")
        runs[name] = _launch("deepspeed-zero3.yaml", "medusa2", tmp_path / name, overrides)
    checkpoint = tmp_path / "whole" / "run" / "checkpoints" / "step-00000002"
    saved = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
    target_bytes = sum(f.stat().st_size for f in Path(tiny_target_dir).glob("*.safetensors"))
    assert saved < 0.1 * target_bytes, (saved, target_bytes)
    assert runs["resumed"][0]["step"] == runs["whole"][0]["step"] == 4
    assert runs["resumed"][0]["checksum"] == pytest.approx(runs["whole"][0]["checksum"], rel=1e-9, abs=1e-9)
    assert (tmp_path / "resumed" / "run" / "lora" / "adapter_model.safetensors").is_file()


def test_each_rank_loads_the_target_onto_its_own_gpu(monkeypatch):
    """The target loads before the Accelerator exists, straight onto the device the rank will train on (no host
    copy per rank): LOCAL_RANK's GPU, or the CPU when the launch asks for it or there is no GPU."""
    from specheads.training.launch import launch_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    assert launch_device() == torch.device("cuda", 3)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    assert launch_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("ACCELERATE_USE_CPU")
    assert launch_device() == torch.device("cpu")


def test_a_hung_rank_ends_the_launch_after_dist_timeout_s(tiny_target_dir, small_chat_file, tmp_path):
    """Rank 1 never reaches its first micro-batch; rank 0 waits in the step's first collective for
    ``train.dist_timeout_s`` (5 s here), then fails, and the launch ends with an error instead of hanging."""
    overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "run", max_steps=2, batch_size=2)
    overrides += ["data.max_samples=16", "train.dist_timeout_s=5"]
    command = _launch_command("cpu-2proc.yaml", "eagle1", tmp_path, overrides)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SPECHEADS_TEST_HANG_RANK": "1"}
    start = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    waited = time.monotonic() - start
    assert done.returncode != 0, done.stdout[-2000:]
    assert "Timed out waiting 5000ms" in done.stderr, done.stderr[-4000:]  # gloo's words, for the configured 5 s
    assert waited < 240, f"the launch took {waited:.0f} s to fail: the timeout did not end it"
    assert not (tmp_path / "rank0.json").exists()  # rank 0 did not finish training alone


def test_a_deepspeed_launch_that_sets_its_own_accumulation_is_refused(tiny_target_dir, small_chat_file, tmp_path):
    """An `accelerate config` file's deepspeed_config writes gradient_accumulation_steps: 1, which Accelerate let
    override train.grad_accum with a warning: each micro-batch became an optimizer and schedule step. Refused now."""
    launch = tmp_path / "deepspeed-own-accumulation.yaml"
    launch.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
        "  gradient_accumulation_steps: 1\n  zero_stage: 2\n  offload_optimizer_device: none\n"
        "  offload_param_device: none\n  zero3_init_flag: false\nnum_processes: 1\nnum_machines: 1\n"
        "machine_rank: 0\nmixed_precision: 'no'\n"
    )
    overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "run", max_steps=2, batch_size=2)
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(launch),
        "--main_process_port", str(_free_port()), str(REPO / "tests" / "training" / "launch_train.py"),
        str(REPO / "configs" / "medusa" / "smollm2-135m.yaml"), str(tmp_path), *overrides, "train.grad_accum=2",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "gradient_accumulation_steps=1 but train.grad_accum=2" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "rank0.json").exists()
