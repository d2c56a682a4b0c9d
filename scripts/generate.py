"""Thin wrapper around ``specheads generate`` (see specheads/decoding/cli.py for the options)."""

from specheads.decoding.cli import generate_main

if __name__ == "__main__":
    raise SystemExit(generate_main())
