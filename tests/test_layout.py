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


DECODING_CALLERS = ("__init__.py", "cli.py")
"""The decoding modules that may import the tuning: the public re-exports and the command line, which pass it in."""


def test_the_decoding_core_does_not_import_its_tuning():
    """The decode step (tree, draft, verify, accept, cache commit, generator, drafters) reads without the machine
    tuning beside it (``decoding/tuning``: cost model, auto tree, backoff, CPU kernels), which callers pass in."""
    core = [path for path in sorted((PACKAGE / "decoding").glob("*.py")) if path.name not in DECODING_CALLERS]
    assert len(core) > 10 and (PACKAGE / "decoding" / "tuning" / "cost_model.py").is_file()
    offending = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in core
        for name in _imports(path)
        if name.startswith("specheads.decoding.tuning")
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
