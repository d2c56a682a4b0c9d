"""Benchmark heads against generate, prompt lookup and assisted generation: ``python scripts/benchmark.py --help``."""

import sys

from specheads.bench.cli import bench_main

if __name__ == "__main__":
    sys.exit(bench_main())
