"""docs/cli.md is the commands' own parsers rendered: each command's section names its options, and every option says
what it does."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from specheads.cli import SUBCOMMANDS, reference_markdown

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def test_the_reference_matches_the_parsers():
    stale = "docs/cli.md is stale: run python scripts/cli_reference.py"
    assert REFERENCE.read_text(encoding="utf-8") == reference_markdown(), stale


def test_each_commands_section_names_its_own_options_and_each_says_what_it_does():
    sections = {part.split("`", 1)[0]: part for part in reference_markdown().split("\n## `")[1:]}
    expected = {}
    for name, (module_name, _, _) in SUBCOMMANDS.items():
        parser = importlib.import_module(module_name).build_parser()
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subparsers:
            expected |= {f"specheads {name} {sub}": sub_parser for sub, sub_parser in subparsers[0].choices.items()}
        else:
            expected[f"specheads {name}"] = parser
    assert sorted(sections) == sorted(expected)
    assert "specheads data join-answers" in sections and "specheads export" in sections
    for title, parser in expected.items():
        rows = [line for line in sections[title].splitlines() if line.startswith("| `")]
        actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
        assert len(rows) == len(actions), title
        for action, row in zip(actions, rows):
            names = action.option_strings or [action.dest]
            assert all(f"`{n}`" in row.split(" | ")[0] for n in names), (title, row)
            assert not row.endswith("|  |"), f"{title}: {names} has no help text"
