"""The ``specheads`` command: one entry point whose subcommands live next to the code they drive.

Each subcommand's module owns its own argument parser; this file only dispatches, importing lazily so that
``specheads push`` does not pay for importing the training stack.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from specheads import __version__

SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("specheads.training.train_cli", "train_main", "train a draft head on a frozen target (YAML config)"),
    "data": ("specheads.training.data_cli", "data_main", "self-distil training data; cache target features"),
    "generate": ("specheads.decoding.cli", "generate_main", "generate with speculative decoding (or plainly)"),
    "bench": ("specheads.bench.cli", "bench_main", "benchmark heads against generate and assisted decoding"),
    "push": ("specheads.heads.push_cli", "push_main", "upload a saved head folder to the Hugging Face Hub"),
    "export": ("specheads.heads.export_cli", "export_main", "write a head for vLLM, SGLang or speculators"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="specheads",
        description="Speculative decoding with trained draft heads.",
        epilog="Run `specheads COMMAND --help` for a command's options.",
    )
    parser.add_argument(
        "command", choices=sorted(SUBCOMMANDS), help="; ".join(f"{k}: {v[2]}" for k, v in SUBCOMMANDS.items())
    )
    parser.add_argument("--version", action="version", version=f"specheads {__version__}")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    args = parser.parse_args(argv[:1])
    module_name, function_name, _ = SUBCOMMANDS[args.command]
    try:
        entry = getattr(importlib.import_module(module_name), function_name)
        return int(entry(argv[1:]) or 0)
    except KeyboardInterrupt:  # Ctrl-C: what was printed stays, without a traceback under it
        print(f"\nspecheads {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail again
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
