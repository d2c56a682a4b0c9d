"""A test drafter that knows the future, so that decoding tests get drafts accepted with random heads.

Random heads almost never get a draft accepted, and a suite that only ever verifies rejected trees cannot tell a
right accepted path from a wrong one (hidden rows, cache commits, drafter re-feeds). ``PlantedDrafter`` wraps a
real drafter and, on every ``every``-th proposal, writes the target's own greedy continuation (computed beforehand
with ``generate``) into the wrapped drafter's tree along the path to its last-created deepest node (siblings that
carry the same token get another one). In a branching tree that path leaves the first branch and is not the run of
nodes 0..d, so committing it exercises everything that picks the path's rows. Greedy decoding only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from specheads.decoding.draft import DraftTree, HiddenStates, Sampling


def greedy_continuation(target: PreTrainedModel, prompt: torch.Tensor, max_new_tokens: int) -> list[int]:
    """The target's own ``generate(do_sample=False)`` new tokens after ``prompt`` (T,)."""
    ids = prompt.view(1, -1)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


@dataclass
class PlantedState:
    inner: Any  # the wrapped drafter's state
    prompt: list[int]
    root: int
    fed: list[int] = field(default_factory=list)  # every token fed to the target after the prompt, in order
    planted: list[int] = field(default_factory=list)  # per proposal: length of the planted path (0: none)
    contiguous: list[bool] = field(default_factory=list)  # per planted proposal: the path was nodes 0..d
    first_branch: list[bool] = field(default_factory=list)  # ... the path was the first child at every level
    proposals: int = 0


class PlantedDrafter:
    """Wraps ``inner`` (any drafter); ``continuation`` is the target's greedy output after the prompt, long enough
    to cover every proposal. Keeps each request's state in ``states`` for the test to inspect afterwards."""

    def __init__(self, inner: Any, continuation: list[int], every: int = 2) -> None:
        self.inner, self.continuation, self.every = inner, continuation, every
        self.layer_ids = list(inner.layer_ids)
        # the generator looks up the wrapped modules by these names (CPU kernels, device checks)
        self.model, self.head, self.heads = (getattr(inner, name, None) for name in ("model", "head", "heads"))
        self.states: list[PlantedState] = []

    def begin(
        self,
        prompt_ids: torch.Tensor,
        hidden_states: HiddenStates | None,
        root: int,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> PlantedState:
        if not sampling.greedy:
            raise ValueError("PlantedDrafter plants the greedy continuation: decode at temperature 0")
        inner = self.inner.begin(prompt_ids, hidden_states, root, sampling, generator)
        state = PlantedState(inner, prompt_ids.view(-1).tolist(), root)
        self.states.append(state)
        return state

    def observe(
        self, state: PlantedState, fed_tokens: torch.Tensor, hidden_states: HiddenStates | None, root: int
    ) -> None:
        self.inner.observe(state.inner, fed_tokens, hidden_states, root)
        state.fed += fed_tokens.view(-1).tolist()
        state.root = root

    def propose(self, state: PlantedState) -> DraftTree:
        tree = self.inner.propose(state.inner)
        state.proposals += 1
        if (state.proposals - 1) % self.every or tree.num_nodes == 1:
            state.planted.append(0)
            return tree
        parents = tree.parents.tolist()
        depth = [0] * len(parents)
        for node in range(1, len(parents)):
            depth[node] = depth[parents[node]] + 1
        node = max(range(len(parents)), key=lambda i: (depth[i], i))  # the last-created deepest node
        path = [node]
        while path[-1] != 0:
            path.append(parents[path[-1]])
        path.reverse()
        start = len(state.fed) + 1  # the root is continuation[len(fed)]
        truth = self.continuation[start : start + len(path) - 1]
        path = path[: len(truth) + 1]
        tokens = tree.tokens.clone()
        for parent, child, token in zip(path, path[1:], truth):
            for sibling in range(1, len(parents)):
                if parents[sibling] == parent and sibling != child and int(tokens[sibling]) == token:
                    tokens[sibling] = token ^ 1  # another token (an even-sized vocabulary): rejected
            tokens[child] = token
        state.planted.append(len(path) - 1)
        state.contiguous.append(path == list(range(len(path))))
        first_children = [next(i for i in range(1, len(parents)) if parents[i] == p) for p in path[:-1]]
        state.first_branch.append(first_children == path[1:])
        return DraftTree(tokens, tree.parents, tree.draft_probs, tree.structure, tree.fixed)
