"""Entry point for `accelerate launch` tests: train, then write this rank's view of the weights to a file.

SPECHEADS_TEST_FSDP_ON_CPU=1 runs an FSDP launch config on CPU processes (see below).

accelerate launch ... tests/training/launch_train.py CONFIG RESULT_DIR key=value ...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from accelerate import PartialState
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType

from specheads.training.config import load_config
from specheads.training.loop import train


def main() -> None:
    config, result_dir, *overrides = sys.argv[1:]
    if os.environ.get("SPECHEADS_TEST_FSDP_ON_CPU") == "1":
        # Accelerate turns FSDP on only for accelerator devices (MULTI_GPU, XPU, ...), yet torch's FSDP2 runs on CPU
        # over gloo. Marking the CPU process group MULTI_GPU before the Accelerator exists lifts that gate and nothing
        # else: the launch config's FSDP plugin, Accelerate's FSDP2 preparation and torch's sharding all run for real.
        PartialState(cpu=True).distributed_type = DistributedType.MULTI_GPU
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
    }
    Path(result_dir, f"rank{state.process_index}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
