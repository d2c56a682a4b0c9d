"""`accelerate launch` with two CPU processes (DDP over gloo; DeepSpeed ZeRO-2/3 on its CPU accelerator): the same
script completes, both ranks end with identical weights, and the saved head loads."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import REPO, tiny_overrides

from specheads.heads import load_head
from specheads.target import load_target

pytestmark = pytest.mark.distributed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    config_file = REPO / "configs" / head_config / "smollm2-135m.yaml"
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "configs" / "accelerate" / launch_config),
        "--num_processes", "2", "--main_process_port", str(_free_port()),
        str(REPO / "tests" / "training" / "launch_train.py"), str(config_file), str(tmp_path), *overrides,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    if not deepspeed:  # DDP needs Accelerator(cpu=True); DeepSpeed picks its CPU accelerator by itself (NOTES.md)
        env["ACCELERATE_USE_CPU"] = "1"
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]

    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert all(r["distributed_type"] == ("DistributedType.DEEPSPEED" if deepspeed else "DistributedType.MULTI_CPU")
               for r in ranks), ranks  # fmt: skip
    assert ranks[0]["step"] == ranks[1]["step"] == 3
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-9, abs=1e-9)
    assert ranks[0]["metrics"] == ranks[1]["metrics"]  # eval metrics are reduced over both ranks
    assert (out / "checkpoints" / "step-00000002").is_dir()
    target, _ = load_target(Path(tiny_target_dir))
    load_head(out, target)


def test_fsdp_config_builds_accelerates_fsdp2_plugin(monkeypatch):
    """FSDP cannot start here: Accelerate turns it on only for accelerator devices (MULTI_GPU, NPU, XPU, ...) and
    runs the same launch as plain DDP (MULTI_CPU) on a CPU-only machine. What can be checked without a GPU is
    everything up to the device: `accelerate launch --config_file configs/accelerate/fsdp.yaml` yields the environment
    that builds Accelerate's FSDP2 plugin with our settings (only the objective is wrapped, as one unit)."""
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
