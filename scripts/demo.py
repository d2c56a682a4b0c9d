"""``make demo``: train an EAGLE-3 head for SmolLM2 on committed data and benchmark it. Optional: --questions PATH."""

import sys

from specheads.bench.demo import demo_main

if __name__ == "__main__":
    sys.exit(demo_main())
