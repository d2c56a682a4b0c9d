"""``python -m specheads``: the ``specheads`` command, for environments whose scripts folder is not on PATH."""

from specheads.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
