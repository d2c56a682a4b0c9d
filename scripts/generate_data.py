"""Self-distillation: the target answers a prompt file. Same as ``specheads data generate``."""

import sys

from specheads.training.data_cli import data_main

if __name__ == "__main__":
    raise SystemExit(data_main(["generate", *sys.argv[1:]]))
