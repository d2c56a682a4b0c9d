"""Write docs/cli.md, the reference of every `specheads` command's options, from the commands' own parsers.

python scripts/cli_reference.py [--out docs/cli.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specheads.cli import reference_markdown

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "cli.md"), help="where to write it (default: docs/cli.md)")
    out = Path(parser.parse_args().out)
    out.write_text(reference_markdown(), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
