"""Entry point for `accelerate launch` tests: train, then write this rank's view of the weights and the samples it
trained on to a file.

SPECHEADS_TEST_FSDP_ON_CPU=1 runs an FSDP launch config on CPU processes (see below). SPECHEADS_TEST_HANG_RANK=N makes
rank N hang before its first training micro-batch, as a stuck data pipeline or device would: the others then wait in
a collective until ``train.dist_timeout_s``.

accelerate launch ... tests/training/launch_train.py CONFIG RESULT_DIR key=value ...
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from accelerate import PartialState
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType

from specheads.training.accumulation import batch_rows
from specheads.training.config import load_config
from specheads.training.loop import train
from specheads.training.metrics import Throughput


def record_training_samples() -> list[list[list[int]]]:
    """This rank's training micro-batches as they reach the loop, each sample as its unpadded token ids.

    The loop hands every training batch, and no eval batch, to ``Throughput.count``; a wrapper around it keeps a copy
    and counts as before. The tests check from it that the ranks trained on different shares of the data, which equal
    weights alone cannot show: ranks that all read every batch also stay in sync."""
    seen: list[list[list[int]]] = []
    count = Throughput.count

    def recording(self: Throughput, batch: Any) -> None:
        data = batch_rows(batch)
        rows = zip(data["input_ids"].tolist(), data["attention_mask"].tolist())
        seen.append([[t for t, keep in zip(ids, mask) if keep] for ids, mask in rows])
        count(self, batch)

    Throughput.count = recording
    return seen


def hang_before_training(rank: int) -> None:
    """On ``rank``, the first training micro-batch never arrives (the loop hands each one to ``Throughput.count``)."""
    count = Throughput.count

    def hanging(self: Throughput, batch: Any) -> None:
        if PartialState().process_index == rank:
            time.sleep(3600)
        count(self, batch)

    Throughput.count = hanging


def main() -> None:
    config, result_dir, *overrides = sys.argv[1:]
    if os.environ.get("SPECHEADS_TEST_FSDP_ON_CPU") == "1":
        # Accelerate turns FSDP on only for accelerator devices (MULTI_GPU, XPU, ...), yet torch's FSDP2 runs on CPU
        # over gloo. Marking the CPU process group MULTI_GPU before the Accelerator exists lifts that gate and nothing
        # else: the launch config's FSDP plugin, Accelerate's FSDP2 preparation and torch's sharding all run for real.
        PartialState(cpu=True).distributed_type = DistributedType.MULTI_GPU
    samples = record_training_samples()
    if "SPECHEADS_TEST_HANG_RANK" in os.environ:
        hang_before_training(int(os.environ["SPECHEADS_TEST_HANG_RANK"]))
    result = train(load_config(config, overrides))
    state = PartialState()
    deepspeed = AcceleratorState().deepspeed_plugin
    record = {
        "gradient_clipping": None if deepspeed is None else deepspeed.deepspeed_config.get("gradient_clipping"),
        "checksum": result.checksum,
        "step": result.step,
        "world": state.num_processes,
        "distributed_type": str(state.distributed_type),
        "metrics": result.metrics,
        "eval_steps": [h["step"] for h in result.history],  # a resumed run has no step-0 eval
        "history": result.history,
        "train_samples": samples,
    }
    Path(result_dir, f"rank{state.process_index}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
