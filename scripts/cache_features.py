"""Write the target's features to an offline cache. Same as ``specheads data cache-features``."""

import sys

from specheads.training.data_cli import data_main

if __name__ == "__main__":
    raise SystemExit(data_main(["cache-features", *sys.argv[1:]]))
