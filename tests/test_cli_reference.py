"""docs/cli.md is the commands' own parsers rendered: it names every option, and every option says what it does."""

from __future__ import annotations

import argparse
from pathlib import Path

from specheads.cli import SUBCOMMANDS, reference_markdown

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def test_the_reference_matches_the_parsers():
    assert REFERENCE.read_text() == reference_markdown(), "docs/cli.md is stale: run python scripts/cli_reference.py"


def test_every_command_and_option_is_in_the_reference_with_what_it_does():
    import importlib

    text = reference_markdown()
    for name, (module_name, _, _) in SUBCOMMANDS.items():
        assert f"## `specheads {name}" in text
        parsers = [importlib.import_module(module_name).build_parser()]
        parsers += [
            p for a in parsers[0]._actions if isinstance(a, argparse._SubParsersAction) for p in a.choices.values()
        ]
        for action in (a for parser in parsers for a in parser._actions if not isinstance(a, argparse._HelpAction)):
            assert all(f"`{option}`" in text for option in action.option_strings), action.option_strings
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) > 80  # every command's table, not a header alone
    assert [row for row in rows if row.endswith("|  |")] == [], "an option without a help text"
