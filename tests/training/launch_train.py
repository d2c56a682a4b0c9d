"""Entry point for `accelerate launch` tests: train, then write this rank's view of the weights to a file.

accelerate launch ... tests/training/launch_train.py CONFIG RESULT_DIR key=value ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from accelerate import PartialState

from specheads.training.config import load_config
from specheads.training.loop import train


def main() -> None:
    config, result_dir, *overrides = sys.argv[1:]
    result = train(load_config(config, overrides))
    state = PartialState()
    record = {
        "checksum": result.checksum,
        "step": result.step,
        "world": state.num_processes,
        "distributed_type": str(state.distributed_type),
        "metrics": result.metrics,
    }
    Path(result_dir, f"rank{state.process_index}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
