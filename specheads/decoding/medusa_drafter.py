"""Medusa's drafter: every head guesses one depth of a static tree (https://arxiv.org/abs/2401.10774)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specheads.decoding.draft import DraftTree, HiddenStates, Sampling
from specheads.decoding.tree import StaticTree
from specheads.heads import MedusaHeads


class MedusaDrafter:
    """Medusa heads on a static tree: node (depth d, rank r) is head d's r-th best guess (top-k, deterministic,
    so ``draft_probs`` is None even when sampling). Head k reads the target's hidden state at the last fed position
    and predicts token t + k + 1, i.e. depth k below the root (the root itself is the target's own next token)."""

    def __init__(self, heads: MedusaHeads, tree: StaticTree) -> None:
        if not isinstance(tree, StaticTree):  # Medusa's own code takes the choices list itself
            raise TypeError(
                f"tree must be a StaticTree, got {type(tree).__name__}; compile Medusa choices with "
                "specheads.decoding.static_tree(choices), or use chain_tree(depth) or load_tree(path)"
            )
        if tree.max_depth > heads.num_heads:
            raise ValueError(
                f"the tree is {tree.max_depth} deep but the Medusa head set has only {heads.num_heads} heads; "
                f"use a tree at most {heads.num_heads} deep (e.g. chain:{heads.num_heads}) or more heads"
            )
        self.heads = heads
        self.tree = tree
        self.layer_ids = list(heads.layer_ids)

    def begin(
        self,
        prompt_ids: torch.Tensor,
        hidden_states: HiddenStates | None,
        root: int,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> MedusaState:
        state = MedusaState(hidden=None, root=root)
        self.observe(state, prompt_ids, hidden_states, root)
        return state

    def observe(self, state: MedusaState, fed_tokens: torch.Tensor, hidden_states: HiddenStates, root: int) -> None:
        state.hidden = hidden_states[self.layer_ids[0]][:, -1:]  # (1, 1, H) at the last fed position
        state.root = root

    def propose(self, state: MedusaState) -> DraftTree:
        if self.tree.ranks.device != state.hidden.device:  # once: the structure then stays with the heads
            self.tree = self.tree.to(state.hidden.device)
        tree = self.tree
        logits = self.heads(state.hidden)[: tree.max_depth, 0, 0]  # (D, V): head d guesses depth d
        guesses = torch.topk(logits, tree.max_rank, dim=-1).indices  # (D, R)
        tokens = guesses[(tree.compiled.depths - 1).clamp(min=0), tree.ranks]  # (n,)
        tokens[0] = state.root
        return DraftTree(tokens=tokens, parents=tree.compiled.parents, structure=tree.compiled)


@dataclass
class MedusaState:
    hidden: torch.Tensor | None  # (1, 1, H) target feature at the last fed position
    root: int
