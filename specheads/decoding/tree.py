"""Draft trees as data: nodes with a parent and a token, compiled into what one verification forward needs.

Node 0 is the root: the last committed token, not yet in the target's KV cache. ``parents[0] = -1`` and
``parents[i] < i``; siblings are ordered by index, which is the order the drafter proposed them in.
A chain is the tree with one path. Static trees (Medusa "choices", https://arxiv.org/abs/2401.10774) are compiled
once; dynamic trees (EAGLE-2, https://arxiv.org/abs/2406.16858) are chosen per step by ``select_dynamic_nodes``.

What a tree compiles into:
- an additive float 4D attention mask over ``[prefix + nodes]``: 0 where a node may attend (the whole prefix, its
  ancestors and itself), ``finfo(dtype).min`` elsewhere. Never boolean: eager attention adds a mask as 0/1.
- ``position_ids = prefix_len + depth``; without them every branch but the first gets wrong logits, silently.
- ``retrieve_indices``: every root-to-leaf path as node indices, padded with -1.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

# A tree file (the shipped ones: specheads/decoding/trees/, linked as configs/trees/ in a checkout) is a JSON object
# {"choices": [[0], [1], [0, 0], ...]}: Medusa paths where path (i0, i1, ..., i_{d-1}) is the node at depth d whose
# token is head d's i_{d-1}-th best guess, under the node of path (i0, ..., i_{d-2}).
TREE_FILE_KEY = "choices"


@dataclass(frozen=True)
class CompiledTree:
    """A tree's structure (no tokens), compiled once: parents, depths, ancestor matrix and root-to-leaf paths."""

    parents: torch.Tensor  # (n,) long, parents[0] = -1
    depths: torch.Tensor  # (n,) long, depths[0] = 0
    ancestors: torch.Tensor  # (n, n) bool, [i, j] = node j is node i or one of its ancestors
    retrieve_indices: torch.Tensor  # (num_leaves, max_depth + 1) long, each row a root-to-leaf path, -1 padded

    @property
    def num_nodes(self) -> int:
        return self.parents.shape[0]

    @property
    def max_depth(self) -> int:
        return self.retrieve_indices.shape[1] - 1

    def attention_mask(self, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask ``(1, 1, n, prefix_len + n)`` for verifying the nodes on top of a ``prefix_len`` cache."""
        return tree_attention_mask(self.ancestors, prefix_len, dtype)

    def position_ids(self, prefix_len: int) -> torch.Tensor:
        """``(1, n)``: each node sits at ``prefix_len + depth``."""
        return (prefix_len + self.depths).unsqueeze(0)

    def to(self, device: torch.device | str) -> CompiledTree:
        move = lambda t: t.to(device)  # noqa: E731
        return CompiledTree(move(self.parents), move(self.depths), move(self.ancestors), move(self.retrieve_indices))


@dataclass(frozen=True)
class StaticTree:
    """A tree shape proposed by per-depth top-k guesses (Medusa): node i is guess ``ranks[i]`` at depth ``depths[i]``.

    ``choices`` keeps the Medusa paths sorted by (depth, path) so parents come before children and siblings are
    ordered by rank.
    """

    choices: tuple[tuple[int, ...], ...]
    compiled: CompiledTree
    ranks: torch.Tensor  # (n,) long, ranks[0] = 0 (the root is not a guess)

    @property
    def num_nodes(self) -> int:
        return self.compiled.num_nodes

    @property
    def max_depth(self) -> int:
        return self.compiled.max_depth

    @property
    def max_rank(self) -> int:
        """How many top-k guesses per depth the tree needs (from ``choices``: no device sync)."""
        return max(path[-1] for path in self.choices) + 1

    def to(self, device: torch.device | str) -> StaticTree:
        """The same tree with its structure on ``device``, so drafting and verifying it copy nothing per step."""
        return StaticTree(self.choices, self.compiled.to(device), self.ranks.to(device))


def children_lists(parents: list[int]) -> list[list[int]]:
    """``children[i]``: node i's children in draft (index) order, for a tree given as its parent list."""
    children: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents[1:], 1):
        children[parent].append(node)
    return children


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """``(n, n)`` bool: ``[i, j]`` is True when j is i or an ancestor of i. Vectorised by walking up the parents."""
    n = parents.shape[0]
    rows = torch.arange(n, device=parents.device)
    ancestors = torch.zeros(n, n, dtype=torch.bool, device=parents.device)
    current = rows.clone()
    alive = torch.ones(n, dtype=torch.bool, device=parents.device)
    for _ in range(n):  # at most n - 1 hops up; stops as soon as every walk reached the root
        ancestors[rows[alive], current[alive]] = True
        current = torch.where(alive, parents[current.clamp(min=0)], current)
        alive = alive & (current >= 0)
        if not bool(alive.any()):
            break
    return ancestors


def tree_attention_mask(ancestors: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive float mask ``(1, 1, n, prefix_len + n)``: every node sees the prefix, its ancestors and itself."""
    n = ancestors.shape[0]
    blocked = torch.finfo(dtype).min
    mask = torch.zeros(n, prefix_len + n, dtype=dtype, device=ancestors.device)
    mask[:, prefix_len:] = torch.where(ancestors, 0.0, blocked).to(dtype)
    return mask.view(1, 1, n, prefix_len + n)


def node_depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of each node (root = 0): the number of strict ancestors."""
    return ancestor_matrix(parents).sum(dim=1) - 1


def fits_context(max_context: int, prefix_len: int, depth: int) -> bool:
    """Whether a tree of ``depth`` rooted at position ``prefix_len`` fits a context of ``max_context`` positions
    (0: no limit); the generator verifies the root alone where it does not."""
    return not max_context or prefix_len + depth < max_context


def check_parents(parents: torch.Tensor) -> None:
    """Fail loudly on a malformed tree: the root must be node 0 and every parent must come before its child."""
    if parents.dim() != 1 or parents.numel() == 0:
        raise ValueError(f"parents must be a non-empty 1D tensor, got shape {tuple(parents.shape)}")
    if int(parents[0]) != -1:
        raise ValueError(f"node 0 must be the root (parents[0] == -1), got parents[0] = {int(parents[0])}")
    idx = torch.arange(parents.numel(), device=parents.device)
    bad = (parents[1:] < 0) | (parents[1:] >= idx[1:])
    if bool(bad.any()):
        raise ValueError(f"every node i > 0 needs 0 <= parents[i] < i; offending parents: {parents.tolist()}")


def compile_tree(parents: torch.Tensor | list[int]) -> CompiledTree:
    """Compile a parent array into mask material, depths and root-to-leaf paths."""
    parents = torch.as_tensor(parents, dtype=torch.long)
    check_parents(parents)
    ancestors = ancestor_matrix(parents)
    depths = ancestors.sum(dim=1) - 1
    n = parents.numel()
    has_child = torch.zeros(n, dtype=torch.bool, device=parents.device)
    has_child[parents[1:]] = True
    leaves = torch.nonzero(~has_child).flatten()
    max_depth = int(depths.max().item())
    # A path lists its nodes by depth: ancestors of the leaf, placed at their depth, -1 after the leaf.
    retrieve = torch.full((leaves.numel(), max_depth + 1), -1, dtype=torch.long, device=parents.device)
    for row, leaf in enumerate(leaves.tolist()):
        path = torch.nonzero(ancestors[leaf]).flatten()  # ancestors are numbered before descendants
        retrieve[row, : path.numel()] = path
    return CompiledTree(parents=parents, depths=depths, ancestors=ancestors, retrieve_indices=retrieve)


def chain_parents(length: int) -> torch.Tensor:
    """Parents of a chain of ``length`` nodes: root, then each node the child of the previous one."""
    if length < 1:
        raise ValueError(f"a chain needs at least the root node, got length={length}")
    return torch.arange(-1, length - 1, dtype=torch.long)


def static_tree(choices: list[list[int]] | list[tuple[int, ...]]) -> StaticTree:
    """Compile Medusa choices (paths of top-k ranks) into a static tree, sorted so parents precede children."""
    paths = sorted({tuple(int(r) for r in c) for c in choices}, key=lambda p: (len(p), p))
    if not paths:
        raise ValueError("a static tree needs at least one path besides the root, got no choices")
    known = {(): 0}
    parents, ranks = [-1], [0]
    for path in paths:
        if any(r < 0 for r in path) or not path:
            raise ValueError(f"choices must be non-empty paths of ranks >= 0, got {list(path)}")
        if path[:-1] not in known:
            raise ValueError(f"choice {list(path)} has no parent {list(path[:-1])} in the tree; add the parent path")
        known[path] = len(parents)
        parents.append(known[path[:-1]])
        ranks.append(path[-1])
    return StaticTree(choices=tuple(paths), compiled=compile_tree(parents), ranks=torch.tensor(ranks))


def chain_tree(depth: int) -> StaticTree:
    """A chain of ``depth`` draft nodes below the root: each depth's best guess."""
    return static_tree([[0] * d for d in range(1, depth + 1)])


def load_tree(path: str | Path | Traversable) -> StaticTree:
    """Load a static tree from a JSON file ``{"choices": [[0], [1], [0, 0], ...]}`` (a path, or package data); a file
    of any other shape is a ValueError that names it and the expected format."""
    expected = f'expected a JSON object {{"{TREE_FILE_KEY}": [[0], [1], [0, 0], ...]}} (every path with its parent)'
    try:
        data = json.loads((Path(path) if isinstance(path, str) else path).read_text())
    except ValueError as error:  # not JSON, or not UTF-8 text
        raise ValueError(f"tree file {path} does not read as JSON ({error}); {expected}") from None
    choices = data.get(TREE_FILE_KEY) if isinstance(data, dict) else None
    if not isinstance(choices, list) or not all(_is_path(c) for c in choices):
        found = textwrap.shorten(json.dumps(data), 80, placeholder=" ...")  # a tree file can hold hundreds of paths
        raise ValueError(f"tree file {path}: {expected}, found {found}")
    unknown = set(data) - {TREE_FILE_KEY, "description"}
    if unknown:
        raise ValueError(f"tree file {path}: unknown keys {sorted(unknown)}; allowed: {TREE_FILE_KEY!r}, 'description'")
    try:
        return static_tree(choices)
    except ValueError as error:  # a path without its parent, a negative rank, no paths
        raise ValueError(f"tree file {path}: {error}") from None


def _is_path(choice: object) -> bool:
    """A Medusa path as JSON holds it: a list of whole-number ranks (``true`` is not a rank)."""
    return isinstance(choice, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in choice)


@dataclass(frozen=True)
class DynamicTreeConfig:
    """EAGLE-2 dynamic tree: expand the ``top_k`` best nodes of each depth with ``top_k`` children each, for
    ``depth`` levels, then keep the ``total_tokens`` best nodes (root excluded) by cumulative draft log-prob.
    ``depth`` counts drafted levels; the EAGLE reference's ``depth=d`` drafts d+1."""

    depth: int = 5
    top_k: int = 8
    total_tokens: int = 60

    def __post_init__(self) -> None:
        if self.depth < 1 or self.top_k < 1 or self.total_tokens < 1:
            raise ValueError(f"depth, top_k and total_tokens must all be >= 1, got {self}")


def select_dynamic_nodes(scores: torch.Tensor, parents: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """Keep the root and the ``total_tokens`` best candidates; returns kept indices in creation order.

    ``scores`` ``(m,)`` are cumulative draft log-probs (root first, score 0); a child never scores above its parent
    and is created after it, so ranking by (score desc, creation index asc) always keeps parents with children.
    Creation order puts parents before children and keeps siblings in draft order, which the tree contract needs.
    """
    m = scores.shape[0]
    # Candidates with zero draft probability (score -inf) are never worth verifying.
    keep = min(total_tokens + 1, int(torch.isfinite(scores).sum()))
    order = torch.arange(m, device=scores.device)
    # Stable sort on -score keeps creation order among ties, so a parent (created first) wins a tie with its child.
    ranked = torch.sort(-scores, stable=True).indices
    kept = torch.sort(ranked[:keep]).values
    kept_mask = torch.zeros(m, dtype=torch.bool, device=scores.device)
    kept_mask[kept] = True
    orphan = kept_mask[1:] & ~kept_mask[parents[1:].clamp(min=0)]
    if bool(orphan.any()):  # cannot happen with monotone scores; guards callers that pass other scores
        raise ValueError(f"selected nodes {order[1:][orphan].tolist()} without their parents; scores must not increase")
    return kept


def reindex_parents(parents: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Parents of the kept nodes, renumbered into positions within ``kept`` (kept must be sorted, root first)."""
    new_index = torch.full_like(parents, -1)
    new_index[kept] = torch.arange(kept.numel(), device=kept.device)
    kept_parents = parents[kept]
    return torch.where(kept_parents >= 0, new_index[kept_parents.clamp(min=0)], kept_parents)
