"""The architecture's arrows, checked on the source: training and decoding use heads; heads uses neither;
decoding never imports training. Also: every `specheads` subcommand is real and answers --help."""

import ast
import importlib
from pathlib import Path

import pytest

from specheads.cli import SUBCOMMANDS, main

PACKAGE = Path(__file__).resolve().parents[1] / "specheads"

FORBIDDEN = {
    "heads": ("specheads.training", "specheads.decoding", "specheads.bench"),
    "decoding": ("specheads.training", "specheads.bench"),
    "training": ("specheads.decoding", "specheads.bench"),
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_import_arrows_point_one_way(part):
    files = sorted((PACKAGE / part).rglob("*.py"))
    assert files, f"specheads/{part} has no modules"
    offending = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in files
        for name in _imports(path)
        if name.startswith(FORBIDDEN[part])
    ]
    assert not offending, offending


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_subcommand_exists_and_has_help(command, capsys):
    module_name, function_name, _ = SUBCOMMANDS[command]
    assert callable(getattr(importlib.import_module(module_name), function_name))
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_top_level_help_lists_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(command in out for command in SUBCOMMANDS)
    assert main([]) == 2
