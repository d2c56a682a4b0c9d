"""Files the repository ships beside the package (``data/``), found from a checkout: one home for their paths, which
training (the data commands' defaults) and the benchmark both read."""

from __future__ import annotations

from pathlib import Path

DEFAULT_QUESTIONS = Path("data") / "spec_bench" / "question.jsonl"
"""Spec-Bench's question file as the repository ships it, relative to the repository root (data/README.md)."""


def checkout_root() -> Path | None:
    """The repository root when specheads runs from a checkout (an editable install); None when it is installed from
    a wheel, which ships the package only: ``data/``, ``configs/`` and ``scripts/`` come with a checkout."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() else None


def find_default_questions(repo_root: Path | None = None) -> Path:
    """The repository's ``data/spec_bench/question.jsonl``, looked up from a checkout or the current directory."""
    roots = list(dict.fromkeys(root for root in (repo_root, Path.cwd(), checkout_root()) if root is not None))
    for root in roots:
        candidate = (root / DEFAULT_QUESTIONS).resolve()
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no Spec-Bench question file at {DEFAULT_QUESTIONS} relative to {[str(r) for r in roots]} (a checkout ships "
        "it; a wheel does not); run from a checkout or pass --questions PATH to Spec-Bench's question.jsonl"
    )
