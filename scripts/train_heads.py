"""Train a draft head: ``accelerate launch scripts/train_heads.py --config configs/medusa/smollm2-135m.yaml``."""

import sys

from specheads.training.train_cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
