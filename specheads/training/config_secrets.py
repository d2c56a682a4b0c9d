"""Keep secrets out of a training config.

The resolved config is copied into the head's model card (``README.md``, published with the head by
``specheads push``), ``train_config.yaml`` and the tracker's run config, so a config must not read a secret from the
environment (``${oc.env:HF_TOKEN}``) or carry one pasted in. Libraries that need a secret read it from the environment
themselves (huggingface_hub: ``HF_TOKEN``; wandb: ``WANDB_API_KEY``). Each check returns the problem as a message
(naming the variable, never its value) for ``load_config`` to raise.

What a config reads from an ordinary variable is not written out either: the files a head ships with keep the
``${oc.env:...}`` reference (``env_references``, ``with_references``), as the user wrote it, not the value read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASS", "AUTH", "CREDENTIAL")
"""An environment variable whose name contains one of these (any case) holds a secret."""
SECRET_MIN_LENGTH = 8  # a secret variable's value shorter than this is not looked for in the resolved config
_ENV_READ = re.compile(r"oc\.env\s*:\s*['\"]?(?P<name>[^,'\"}\s]*)")

SourceOf = Callable[[str | None], str]  # dotted key -> where it was set ("configs/x.yaml", "command-line override ...")


def looks_secret(name: str) -> str | None:
    """The part of ``SECRET_NAME_PARTS`` that ``name`` contains, if any."""
    return next((part for part in SECRET_NAME_PARTS if part in name.upper()), None)


def secret_env_read(unresolved: dict[str, Any], source_of: SourceOf) -> str | None:
    """``${oc.env:NAME}`` with a secret-looking NAME (or one computed by another interpolation, which cannot be
    checked) is a problem; ordinary variables (``${oc.env:SPECHEADS_DATA,data}``) are not."""
    for key, text in _strings(unresolved):
        for match in _ENV_READ.finditer(text):
            name = match["name"]
            if "$" in name:
                return (
                    f"{source_of(key)}: {key}: {text!r} reads an environment variable whose name is computed; "
                    "expected a literal name, e.g. ${oc.env:SPECHEADS_DATA}, so that a secret cannot be read."
                )
            if part := looks_secret(name):
                return (
                    f"{source_of(key)}: {key}: {text!r} reads {name}, which looks like a secret (the name contains "
                    f"{part}); the resolved config is copied into the model card, train_config.yaml and the tracker's "
                    "run config, so a config may not read it. Remove it: libraries that need it read it from the "
                    "environment themselves."
                )
    return None


def secret_value(resolved: dict[str, Any], source_of: SourceOf) -> str | None:
    """No resolved value may contain a secret variable's value, however it got there (pasted in, or read through a
    computed name). Values with a path separator are not looked for: tokens and keys have none, while a variable
    such as ``SSH_AUTH_SOCK`` holds a path that a config could legitimately share a prefix with."""
    secrets = {
        name: value
        for name, value in os.environ.items()
        if looks_secret(name) and len(value) >= SECRET_MIN_LENGTH and "/" not in value and os.sep not in value
    }
    for key, text in _strings(resolved):
        for name, value in secrets.items():
            if value in text:
                source = source_of(key).replace(value, f"<{name}>")  # an override that pasted it in is not echoed
                return (
                    f"{source}: {key} contains the value of the environment variable {name}, which looks like "
                    f"a secret (the name contains {looks_secret(name)}); the config is copied into the model card, "
                    "train_config.yaml and the tracker's run config. Remove it from the config."
                )
    return None


def _strings(node: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted key, value)`` for every string in a nested container (list items as ``key[i]``)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _strings(value, f"{prefix}[{index}]")
    elif isinstance(node, str):
        yield prefix, node


def env_references(unresolved: dict[str, Any]) -> dict[str, str]:
    """``dotted key -> text`` for every value that reads an environment variable (``${oc.env:...}``)."""
    return {key: text for key, text in _strings(unresolved) if _ENV_READ.search(text)}


def with_references(resolved: dict[str, Any], references: dict[str, str]) -> dict[str, Any]:
    """``resolved`` with each key of ``references`` set back to its ``${oc.env:...}`` text (in place)."""
    for key, text in references.items():
        node: Any = resolved
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", key)
        for part in parts[:-1]:
            node = node[int(part[1:-1])] if part.startswith("[") else node[part]
        last = parts[-1]
        node[int(last[1:-1]) if last.startswith("[") else last] = text
    return resolved
