"""Fixtures for training tests: a tiny target saved to disk with SmolLM2's tokenizer, and a small chat file.

The tiny target (hidden 64, 4 layers, SmolLM2's 49k vocabulary and chat template; a 2-layer variant too) loads by
path in any process, so `accelerate launch` tests and resume tests exercise the real loop in seconds. Runs on the
real SmolLM2 target are reserved for the tests where learning is the point.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.tiny_models import save_tiny_target
from tests.training.train_helpers import REPO

DISTILL = REPO / "data" / "smollm2-135m-instruct-greedy-1k.jsonl"  # committed self-distilled set (data/README.md)


@pytest.fixture(scope="session")
def distill_path() -> Path:
    assert DISTILL.is_file(), f"{DISTILL} is missing from the repository"
    return DISTILL


@pytest.fixture(scope="session")
def small_chat_file(tmp_path_factory, distill_path) -> Path:
    """The first 64 self-distilled conversations (enough for a few tiny batches and a held-out split)."""
    out = tmp_path_factory.mktemp("data") / "chats.jsonl"
    with open(distill_path) as source:
        out.write_text("".join(itertools.islice(source, 64)))
    return out


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory) -> Path:
    return save_tiny_target(tmp_path_factory.mktemp("tiny-target"), num_layers=4)


@pytest.fixture(scope="session")
def tiny_two_layer_target_dir(tmp_path_factory) -> Path:
    """The tiny target with 2 layers: fewer than EAGLE-3's default low layer index, and another layer count."""
    return save_tiny_target(tmp_path_factory.mktemp("tiny-target-2"), num_layers=2)
