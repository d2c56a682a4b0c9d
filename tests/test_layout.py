"""The architecture's arrows, checked on the source: training and decoding use heads; heads uses neither;
decoding never imports training; no module imports itself back through others, lazily or not; no module is over
the size limit. Also: every `specheads` subcommand is real and answers --help."""

import ast
import importlib
import re
from collections import deque
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


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere in its source (function bodies and TYPE_CHECKING blocks
    included): ``from a import b`` is module ``a.b`` when that is a module, else ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: climb from the importing module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.update([full] if full in modules else [base] if base in modules else [])
    return found - {name}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports."""
    paths = {_module_name(path, package): path for path in sorted(package.rglob("*.py"))}
    return {name: _imported_modules(name, path, set(paths)) for name, path in paths.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle per module that lies on one, each named once (as ``a -> b -> a``)."""
    cycles, seen = [], set()
    for start in sorted(graph):
        came_from: dict[str, str] = {}
        queue = deque([start])
        while queue and start not in came_from:
            node = queue.popleft()
            for child in sorted(graph[node]):
                if child not in came_from:
                    came_from[child] = node
                    queue.append(child)
        if start not in came_from:
            continue
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(came_from[path[-1]])
        cycle = path[::-1]
        if frozenset(cycle) not in seen:
            seen.add(frozenset(cycle))
            cycles.append(cycle)
    return cycles


def test_import_cycle_finder_names_a_cycle_and_passes_a_tree():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_import_graph_sees_lazy_relative_and_type_checking_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .one import x\n")
    (package / "sub" / "one.py").write_text("def f():\n    from pkg.two import y\n")
    (package / "two.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import one\n")
    graph = import_graph(package)
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.sub.one"}, "pkg.sub.one": {"pkg.two"}, "pkg.two": {"pkg.sub.one"}}
    assert import_cycles(graph) == [["pkg.sub.one", "pkg.two", "pkg.sub.one"]]


def test_no_import_cycles():
    """A cycle held open by a lazy import still ties its modules together: neither can be read or moved alone."""
    graph = import_graph()
    assert len(graph) > 20 and graph["specheads.bench.cli"], "the import graph is empty: the finder is broken"
    cycles = [" -> ".join(cycle) for cycle in import_cycles(graph)]
    assert not cycles, "import cycles (move what both sides need into a module of its own): " + "; ".join(cycles)


MAX_MODULE_LINES = 420
"""Modules stay under ~400 lines (docs/design.md): one job each, readable in one sitting; a little slack for a
docstring or a refusal added late."""


def oversized_modules(package: Path = PACKAGE, limit: int = MAX_MODULE_LINES) -> list[str]:
    """``path (N lines)`` for every module of the package longer than ``limit`` lines, longest first."""
    sizes = {path: len(path.read_text().splitlines()) for path in package.rglob("*.py")}
    return [
        f"{path.relative_to(package.parent).as_posix()} ({lines} lines)"
        for path, lines in sorted(sizes.items(), key=lambda item: -item[1])
        if lines > limit
    ]


def test_the_size_check_names_every_module_over_the_limit(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "short.py").write_text("x = 1\n" * 5)
    (package / "sub" / "long.py").write_text("x = 1\n" * 12)
    (package / "longer.py").write_text("x = 1\n" * 20)
    assert oversized_modules(package, limit=10) == ["pkg/longer.py (20 lines)", "pkg/sub/long.py (12 lines)"]
    assert oversized_modules(package, limit=20) == []


def test_no_module_is_over_the_size_limit():
    assert len(list(PACKAGE.rglob("*.py"))) > 20, "no modules found: the size check is looking in the wrong place"
    offenders = oversized_modules()
    assert not offenders, f"modules over {MAX_MODULE_LINES} lines (split each along a seam): " + ", ".join(offenders)


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


def test_the_target_asks_only_the_capability_check_of_heads():
    """``target.load_target`` asks ``heads.tree_layers.tree_obstacle`` (the one answer to "can it verify a tree");
    that module imports nothing of specheads, so the target never reaches back into the heads it serves."""
    target_imports = {name for name in _imports(PACKAGE / "target.py") if name.startswith("specheads")}
    assert target_imports == {"specheads.heads.tree_layers"}
    assert not [name for name in _imports(PACKAGE / "heads" / "tree_layers.py") if name.startswith("specheads")]


LINE_LINK = re.compile(r"\[([\w/]+\.py):(\d+)\]\(([^)#]+)#L(\d+)\)")
"""A docs link to a line of code, ``[generator.py:151](../specheads/decoding/generator.py#L151)``."""


def stale_line_links(doc: Path) -> list[str]:
    """Each line link in ``doc`` whose label and anchor disagree, whose file is missing, or whose line is not a
    ``def``/``class`` or a numbered step comment (``# 2. verify``): code moved under it."""
    stale = []
    for match in LINE_LINK.finditer(doc.read_text()):
        label, labelled, target, anchored = match.groups()
        path = (doc.parent / target).resolve()
        lines = path.read_text().splitlines() if path.is_file() else []
        line = lines[int(anchored) - 1].strip() if 0 < int(anchored) <= len(lines) else ""
        if labelled != anchored or not re.match(r"(async def|def|class) |# \d+\. ", line):
            stale.append(f"{doc.name}: [{label}:{labelled}] -> {target}#L{anchored} reads {line[:50]!r}")
    return stale


def test_the_line_link_check_finds_a_link_the_code_moved_under(tmp_path):
    (tmp_path / "code.py").write_text("import os\n\n\ndef run():\n    # 1. draft: the tree\n    pass\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[code.py:4](code.py#L4) and [code.py:5](code.py#L5)")
    assert stale_line_links(doc) == []
    doc.write_text("[code.py:3](code.py#L3), [code.py:4](code.py#L5), [gone.py:1](gone.py#L1)")
    assert len(stale_line_links(doc)) == 3


def test_docs_line_links_point_at_what_they_name():
    docs = [PACKAGE.parent / "README.md", *sorted((PACKAGE.parent / "docs").glob("*.md"))]
    assert sum(len(LINE_LINK.findall(doc.read_text())) for doc in docs) > 10, "the link pattern no longer matches"
    stale = [entry for doc in docs for entry in stale_line_links(doc)]
    assert not stale, "update these anchors (the code moved): " + "; ".join(stale)
