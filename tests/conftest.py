"""Shared fixtures: a tiny random Llama for unit tests and the real SmolLM2-135M-Instruct target for integration."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import LlamaForCausalLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
# Share the cores among pytest-xdist workers (PYTEST_XDIST_WORKER_COUNT), at most 2 threads each.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))

from tests.tiny_models import SMOLLM2, make_tiny_llama  # noqa: E402  (after the environment is set)


@pytest.fixture
def tiny_llama() -> LlamaForCausalLM:
    return make_tiny_llama()


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the real SmolLM2-135M-Instruct target, fp32 on CPU, loaded once per test session."""
    from specheads.target import load_target

    return load_target(SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer alone (the one ``load_target`` returns), without loading its weights."""
    from transformers import AutoTokenizer

    from specheads.target import builtin_cache_dir, ensure_builtin_converted

    ensure_builtin_converted(SMOLLM2)
    return AutoTokenizer.from_pretrained(builtin_cache_dir(SMOLLM2))


def pytest_collection_modifyitems(config, items):
    """Long tests first (SmolLM2 runs, then multi-process launches; stable order otherwise): with several xdist
    workers they start at once and the short tests fill in around them, instead of one running alone at the end.
    A test that asks for the real target without the slow marker would put it in `make test-fast`: refused."""
    unmarked = [item.nodeid for item in items if "smollm2" in item.fixturenames and not item.get_closest_marker("slow")]
    if unmarked:
        raise pytest.UsageError(f"these tests load SmolLM2 (fixture smollm2) without @pytest.mark.slow: {unmarked}")
    items.sort(
        key=lambda item: (item.get_closest_marker("slow") is None, item.get_closest_marker("distributed") is None)
    )
