"""Writing a data command's output file so that a failed or interrupted write never leaves half a file behind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_output(out: Path) -> Iterator[Path]:
    """A path beside ``out`` to write: renamed over ``out`` when the block ends, removed when it raises (an error
    or Ctrl-C leaves ``out`` as it was and no ``.partial`` file beside it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    try:
        yield partial
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(out)
