"""Turn a loaded head and a tree setting into a drafter, so callers never pick drafter classes by hand.

Tree settings: a tree file or the name of one shipped in ``specheads/decoding/trees/`` (Medusa, static; a checkout
links it as ``configs/trees``); ``chain`` or ``chain:D`` (every head type: one path of D tokens); ``dynamic`` or
``dynamic:D,K,N`` (EAGLE-2 dynamic tree of depth D, top-K expansion, N nodes kept). None picks each head type's
default.
"""

from __future__ import annotations

import json
import warnings
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specheads.decoding.draft_model_drafter import DraftModelDrafter
from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.medusa_drafter import MedusaDrafter
from specheads.decoding.tree import TREE_FILE_KEY, DynamicTreeConfig, StaticTree, chain_tree, load_tree, static_tree
from specheads.heads.base import CONFIG_NAME
from specheads.heads.config import HeadConfigError, HeadLoadError
from specheads.heads.load import head_type_of, read_head_config
from specheads.heads.medusa import MedusaConfig

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

SHIPPED_TREES = resources.files("specheads.decoding") / "trees"
"""The named Medusa trees (``--tree small10``): package data, so an installed wheel has them too."""
DEFAULT_MEDUSA_TREE = "small10"  # a small tree: on a CPU, verifying many nodes costs several decode steps; cut to
# the head count when a head set has fewer heads than its depth
DEFAULT_DRAFT_LENGTH = 4


def build_drafter(head: Any, tree: str | None = None) -> Any:
    """A drafter for a loaded head and a tree setting (see the module docstring); None: the head type's default."""
    kind = head.head_type
    if tree == "auto":
        raise ValueError(
            "tree 'auto' is chosen by measurement: use auto_tree_drafter (or auto_drafter), not build_drafter"
        )
    check_tree_setting(kind, tree)
    if tree is not None and tree.split(":")[0] == "chain":
        depth = _positive_ints(tree, "chain:D", 1)[0] if ":" in tree else _default_depth(head)
        if kind == "medusa":
            return MedusaDrafter(head, chain_tree(depth))
        if kind == "eagle":
            return EagleTreeDrafter(head, DynamicTreeConfig(depth, 1, depth))
        return DraftModelDrafter(head, depth, min_length=depth, max_length=depth)
    if kind == "eagle":
        if tree is None or tree == "dynamic":
            if next(head.parameters()).device.type == "cpu":
                warnings.warn(
                    "the default EAGLE tree (dynamic, 60 nodes) is sized for a GPU; on a CPU, verifying it costs "
                    "several plain steps, so it may be slower than plain decoding. Pass tree='chain:3', or size it "
                    "for this machine with specheads.decoding.auto_tree_drafter",
                    stacklevel=2,
                )
            return EagleTreeDrafter(head, DynamicTreeConfig())
        depth, top_k, total = _positive_ints(tree, "dynamic:D,K,N", 3)
        return EagleTreeDrafter(head, DynamicTreeConfig(depth, top_k, total))
    if kind == "medusa":
        if tree is None:
            return MedusaDrafter(head, default_medusa_tree(head.num_heads))
        return MedusaDrafter(head, load_tree(_tree_file(tree)))
    return DraftModelDrafter(head, DEFAULT_DRAFT_LENGTH)


def check_tree_setting(head_type: str, tree: str | None) -> None:
    """An error for a tree setting a head of ``head_type`` cannot draft (``auto`` and None always can): callers
    check it from the head's config.json, before a target loads or another head calibrates."""
    if tree is None or tree == "auto":
        pass
    elif tree.split(":")[0] == "chain":
        if ":" in tree:
            _positive_ints(tree, "chain:D", 1)
    elif head_type == "eagle":
        if not tree.startswith("dynamic:") and tree != "dynamic":
            raise ValueError(f"EAGLE heads take --tree chain[:D] or dynamic[:D,K,N]; got {tree!r}")
        if tree != "dynamic":
            _positive_ints(tree, "dynamic:D,K,N", 3)
    elif head_type == "medusa":
        load_tree(_tree_file(tree))
    elif head_type == "draft_model":
        raise ValueError(f"a draft model drafts an adaptive chain: use --tree chain:D or no --tree; got {tree!r}")
    if head_type not in ("eagle", "medusa", "draft_model"):
        raise ValueError(f"unknown head type {head_type!r}")


def check_head_tree(folder: Path, tree: str | None) -> None:
    """``check_tree_setting`` for a saved head, read from its config.json alone (before a target loads): also a
    Medusa tree deeper than the head set's heads, which ``MedusaDrafter`` would refuse only once the head loaded."""
    head_type = head_type_of(folder)
    check_tree_setting(head_type, tree)
    if head_type != "medusa" or tree is None or tree in ("auto", "chain"):  # these fit any head count
        return
    try:
        num_heads = MedusaConfig.from_saved(read_head_config(folder)["config"]).num_heads
    except HeadConfigError as error:  # the head's config.json is wrong, not --tree: say so, naming the file
        raise HeadLoadError(f"{folder / CONFIG_NAME}: {error}") from None
    chain = tree.startswith("chain:")
    depth = _positive_ints(tree, "chain:D", 1)[0] if chain else load_tree(_tree_file(tree)).max_depth
    if depth > num_heads:  # MedusaDrafter's own words
        raise ValueError(
            f"the tree is {depth} deep but the Medusa head set has only {num_heads} heads; use a tree at most "
            f"{num_heads} deep (e.g. chain:{num_heads}) or more heads"
        )


def default_medusa_tree(num_heads: int) -> StaticTree:
    """The default tree cut to the paths a head set with ``num_heads`` heads can draft (it is 4 deep)."""
    choices = json.loads(_tree_file(DEFAULT_MEDUSA_TREE).read_text())[TREE_FILE_KEY]
    return static_tree([c for c in choices if len(c) <= num_heads])


def _positive_ints(tree: str, form: str, count: int) -> list[int]:
    """The numbers after the colon of a ``chain:D`` / ``dynamic:D,K,N`` setting, or an error naming the form."""
    try:
        values = [int(x) for x in tree.split(":", 1)[1].split(",")]
    except (ValueError, IndexError):  # not numbers, or no colon
        values = []
    if len(values) != count or min(values) < 1:
        raise ValueError(
            f"tree setting {tree!r}: expected {form} with {count} whole number(s) >= 1, e.g. "
            f"{'chain:4' if count == 1 else 'dynamic:5,8,60'}"
        )
    return values


def _default_depth(head: Any) -> int:
    return head.num_heads if head.head_type == "medusa" else DEFAULT_DRAFT_LENGTH


def shipped_tree_names() -> list[str]:
    """The names ``--tree`` takes for the tree files shipped with the package."""
    return sorted(p.name.removesuffix(".json") for p in SHIPPED_TREES.iterdir() if p.name.endswith(".json"))


def _tree_file(tree: str) -> Path | Traversable:
    """A tree file given by path, else the shipped tree of that name (a path wins over a name)."""
    if Path(tree).is_file():
        return Path(tree)
    shipped = SHIPPED_TREES / f"{tree.removesuffix('.json')}.json"
    if not shipped.is_file():
        raise ValueError(f"Medusa tree {tree!r} is neither a file nor one of {shipped_tree_names()}; or use chain[:D]")
    return shipped
