"""The ``specheads`` command: one entry point whose subcommands live next to the code they drive.

Each subcommand's module owns its own argument parser (``build_parser``); this file dispatches, importing lazily so
that ``specheads push`` does not pay for importing the training stack, and renders the parsers as ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from specheads import __version__

SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("specheads.training.train_cli", "train_main", "train a draft head on a frozen target (YAML config)"),
    "data": ("specheads.training.data_cli", "data_main", "self-distil training data; cache target features"),
    "generate": ("specheads.decoding.cli", "generate_main", "generate with speculative decoding (or plainly)"),
    "bench": ("specheads.bench.cli", "bench_main", "benchmark heads against generate and assisted decoding"),
    "push": ("specheads.heads.push_cli", "push_main", "upload a saved head folder to the Hugging Face Hub"),
    "export": ("specheads.heads.export_cli", "export_main", "write a head for vLLM, SGLang or speculators"),
}


REFERENCE_HEADER = """# Command reference

Every option of every `specheads` command, read from the commands' own parsers (`specheads COMMAND --help` and
`specheads data SUBCOMMAND --help` print the same options and help, without the defaults). Written by
`python scripts/cli_reference.py`; a test fails when this file and the parsers differ.
"""


def reference_markdown() -> str:
    """``docs/cli.md``: each subcommand's options as a table, from the parser each module builds (``build_parser``)."""
    parts = [REFERENCE_HEADER]
    for name, (module_name, _, summary) in SUBCOMMANDS.items():
        parser = importlib.import_module(module_name).build_parser()
        subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subcommands:
            parts.append(_reference_section(f"specheads {name}", summary, parser))
            continue
        helps = {choice.dest: choice.help for choice in subcommands[0]._choices_actions}
        for sub_name, sub_parser in subcommands[0].choices.items():
            parts.append(_reference_section(f"specheads {name} {sub_name}", helps.get(sub_name) or "", sub_parser))
    return "\n".join(parts)


def _reference_section(title: str, summary: str, parser: argparse.ArgumentParser) -> str:
    rows = ["| option | value | default | what it does |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        names = ", ".join(f"`{n}`" for n in action.option_strings) or f"`{action.dest}` (positional)"
        required = action.required and action.nargs not in ("*", "?")  # argparse marks a bare "*" positional required
        default = "required" if required else _shown_default(action)
        rows.append(f"| {names} | {_cell(_value_form(action))} | {default} | {_cell(action.help or '')} |")
    return f"## `{title}`\n\n{summary[:1].upper()}{summary[1:]}.\n\n" + "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")  # a table cell: its pipes escaped, on one line


def _is_switch(action: argparse.Action) -> bool:
    """A flag (store_true/false), or a dataclass bool (``--raw`` or ``--raw false``, as HfArgumentParser makes them)."""
    return action.nargs == 0 or (action.nargs == "?" and isinstance(action.const, bool))


def _value_form(action: argparse.Action) -> str:
    if _is_switch(action):
        return "flag"
    form = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else (action.metavar or action.dest.upper())
    return {"?": f"[{form}]", "*": f"[{form} ...]", "+": f"{form} [{form} ...]"}.get(action.nargs, form)


def _shown_default(action: argparse.Action) -> str:
    default = action.default
    if action.nargs == 0:
        return "off"  # a flag: what holds when it is not given
    if _is_switch(action):
        return "on" if default else "off"
    if default is None or default is argparse.SUPPRESS or default == []:
        return "-"
    if isinstance(default, (list, tuple)):
        return " ".join(f"`{item}`" for item in default)
    return f"`{default}`"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="specheads",
        description="Speculative decoding with trained draft heads.",
        epilog="Run `specheads COMMAND --help` for a command's options.",
    )
    parser.add_argument(
        "command", choices=sorted(SUBCOMMANDS), help="; ".join(f"{k}: {v[2]}" for k, v in SUBCOMMANDS.items())
    )
    parser.add_argument("--version", action="version", version=f"specheads {__version__}")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    args = parser.parse_args(argv[:1])
    module_name, function_name, _ = SUBCOMMANDS[args.command]
    try:
        entry = getattr(importlib.import_module(module_name), function_name)
        return int(entry(argv[1:]) or 0)
    except KeyboardInterrupt:  # Ctrl-C: what was printed stays, without a traceback under it
        print(f"\nspecheads {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail again
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
