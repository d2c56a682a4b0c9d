"""scripts/long_context_costs.py --window-sweep: tau per length against the drafter window's size."""

from __future__ import annotations

import argparse

import torch

from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.tree import DynamicTreeConfig
from specheads.heads import EagleConfig, EagleHead
from tests.decoding.helpers import TinyTokenizer
from tests.scripts_loader import load_script


@torch.inference_mode()
def test_a_window_holding_every_row_drafts_as_every_row_does(tiny_llama):
    """A window wider than the prompt and answer keeps every row, so its tau is the full drafter's; a narrow one is
    measured on the same prompts and written per length as a table."""
    script = load_script("long_context_costs.py")
    torch.manual_seed(3)
    drafter = EagleTreeDrafter(EagleHead(EagleConfig(version=3), tiny_llama).eval(), DynamicTreeConfig(3, 2, 5))
    prompts = {"long-a": [torch.randint(3, 128, (40,)), torch.randint(3, 128, (30,))], "long-b": [torch.arange(3, 50)]}
    args = argparse.Namespace(sinks=2, max_new_tokens=16)
    table = script.window_sweep(tiny_llama, TinyTokenizer(), drafter, prompts, [4, 200, 0], args)
    assert list(table) == ["long-a", "long-b"] and all(list(row) == ["4", "200", "all"] for row in table.values())
    for row in table.values():
        assert row["200"] == row["all"] and all(tau >= 1.0 for tau in row.values())
    lines = script.sweep_markdown(table).splitlines()
    assert lines[0] == "| length | tau, window 4 | tau, window 200 | tau, window all |" and len(lines) == 4
    assert lines[2].startswith("| long-a | ")
