"""Config errors in one line each: where (the file with line and column, or the one override), the key, what was
expected and what was found, instead of PyYAML's and OmegaConf's multi-line dumps of their internals. Each function
returns the message for ``load_config`` to raise (as ``config_secrets`` does)."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError


def yaml_problem(err: yaml.YAMLError) -> str:
    """``line L, column C: problem (context)`` from PyYAML's marks (1-based, as editors count)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}" + (f" ({context})" if context else "")


def reworded(err: OmegaConfBaseException, source: str, schema: type) -> str:
    """One line naming the source, the key, what was expected and what was found (OmegaConf's own message is a
    multi-line dump of its internals)."""
    if isinstance(err, ConfigKeyError):
        return _unknown_key_message(err, source, schema)
    full_key = str(getattr(err, "full_key", None) or "")
    expected = schema_type(schema, full_key) if full_key else None
    if isinstance(err, ValidationError) and expected is not None:
        found = _shown_value(getattr(err, "value", None))
        message = f"{source}: {full_key}: expected {_describe(expected)}, found {found}"
        if typing.get_origin(expected) is list and not isinstance(err.value, (list, ListConfig, dict, DictConfig)):
            item = "" if err.value is None else err.value
            if source.startswith("command-line override"):
                message += f"; write {full_key}=[{item}]"
            else:
                message += f"; write a YAML list, [{item}]"
        return message + "."
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"{source}: {full_key + ': ' if full_key else ''}{first_line}"


def schema_type(schema: type, full_key: str) -> Any | None:
    """The declared type of ``full_key`` (``train.lr``, ``train.adam_betas[0]``) in ``schema``, or None."""
    node: Any = schema
    for part in full_key.split("."):
        name, _, index = part.partition("[")
        if not dataclasses.is_dataclass(node):
            return None
        node = typing.get_type_hints(node).get(name)
        if node is None:
            return None
        if index:  # a list item
            node = (typing.get_args(node) or (None,))[0]
    return node


TYPE_NAMES = {int: "an integer", float: "a float", bool: "a boolean (true or false)", str: "a string"}
LIST_ITEMS = {int: "integers", float: "floats", str: "strings"}


def _describe(kind: Any) -> str:
    args = typing.get_args(kind)
    if type(None) in args and len(args) == 2:  # X | None
        return f"{_describe(next(a for a in args if a is not type(None)))} or null"
    if typing.get_origin(kind) is list:
        return f"a list of {LIST_ITEMS[args[0]]}" if args and args[0] in LIST_ITEMS else "a list"
    if typing.get_origin(kind) is dict:
        return "a mapping (key: value)"
    return TYPE_NAMES.get(kind, str(kind))


def _shown_value(value: Any) -> str:
    value = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
    return "null" if value is None else repr(value)


def _unknown_key_message(err: ConfigKeyError, source: str, schema: type) -> str:
    full_key = str(getattr(err, "full_key", "") or "")
    parent, _, name = full_key.rpartition(".")
    node = schema_type(schema, parent) if parent else schema
    if not dataclasses.is_dataclass(node):
        return f"{source}: unknown key '{full_key}'."
    valid = sorted(f.name for f in dataclasses.fields(node) if not f.metadata.get("omegaconf_ignore"))
    where = f"section '{parent}'" if parent else "the top level"
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean '{parent + '.' if parent else ''}{close[0]}'?" if close else ""
    return f"{source}: unknown key '{full_key}'; valid keys in {where} are {valid}.{hint}"
