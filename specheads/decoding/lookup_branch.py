"""A head's draft tree plus a prompt-lookup branch, verified together in the same single forward.

A trained head guesses what the target tends to write; n-gram lookup (``PromptLookupDrafter``) guesses that the
text repeats a span it has already seen (translations keep names and numbers, summaries and RAG answers quote the
passage). They fail on different tokens, so one tree carries both: the lookup continuation is grafted onto the
head's tree where their tokens agree (walking down from the root while a child has the lookup's next token) and
the rest hangs below as a chain. Nothing is verified twice, and the verifier does not know where a node came from.
By default (``narrow``) a step where the lookup proposes keeps only the head's first-choice path beside it.

Lossless either way. Greedy acceptance only compares tokens. Under sampling the grafted nodes are marked
``fixed`` (point-mass proposals, ``accept_speculative``) and come after the head's drawn siblings, so the head's
q rows still describe exactly the children drawn from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specheads.decoding.draft import DraftTree, HiddenStates, Sampling, inner_modules, root_only_tree
from specheads.decoding.prompt_lookup_drafter import LookupState, PromptLookupDrafter

DEFAULT_LOOKUP_TOKENS = 5
DEFAULT_LOOKUP_MIN_NGRAM = 2
LOOKUP_MAX_NGRAM = 3
"""Defaults for the branch: a match of at least two tokens (a one-token match proposes a chain on almost every
step, which a CPU pays for in verification), and at most 5 tokens (docs/results.md: on the 2-core CPU a forward
over 4 tokens costs about one step, over 8-16 about 1.9 steps). Chosen on held-out Spec-Bench questions."""


@dataclass
class LookupBranchState:
    inner: Any  # the wrapped drafter's state
    lookup: LookupState


class LookupBranchDrafter:
    """Wraps any drafter: its tree, plus the prompt-lookup continuation grafted on (see the module docstring)."""

    def __init__(
        self,
        inner: Any,
        num_tokens: int = DEFAULT_LOOKUP_TOKENS,
        max_ngram: int = LOOKUP_MAX_NGRAM,
        min_ngram: int = DEFAULT_LOOKUP_MIN_NGRAM,
        narrow: bool = True,
        solo_ngram: int | None = None,
    ) -> None:
        """``narrow``: on steps where the lookup proposes, keep only the head's first-choice path (the first child
        at every level) next to it, so the combined tree stays small where verification cost grows with size
        (docs/results.md).
        ``solo_ngram``: on steps where the lookup matched an n-gram at least this long, propose its chain alone and
        skip the head (its drafting, and for EAGLE its re-feed, which waits for the next step that drafts)."""
        if solo_ngram is not None and not min_ngram <= solo_ngram <= max_ngram:
            raise ValueError(
                f"solo_ngram must lie in [min_ngram, max_ngram] = [{min_ngram}, {max_ngram}], got {solo_ngram}"
            )
        self.inner, self.narrow, self.solo_ngram = inner, narrow, solo_ngram
        self.lookup = PromptLookupDrafter(num_tokens, max_ngram, min_ngram)
        self.layer_ids = list(inner.layer_ids)
        self.model, self.head, self.heads = inner_modules(inner)

    def begin(
        self,
        prompt_ids: torch.Tensor,
        hidden_states: HiddenStates | None,
        root: int,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> LookupBranchState:
        inner = self.inner.begin(prompt_ids, hidden_states, root, sampling, generator)
        return LookupBranchState(inner, self.lookup.begin(prompt_ids, None, root, sampling, generator))

    def observe(
        self, state: LookupBranchState, fed_tokens: torch.Tensor, hidden_states: HiddenStates | None, root: int
    ) -> None:
        self.inner.observe(state.inner, fed_tokens, hidden_states, root)
        self.lookup.observe(state.lookup, fed_tokens, None, root)

    def propose(self, state: LookupBranchState) -> DraftTree:
        chain, ngram = self.lookup.continuation(state.lookup)
        if self.solo_ngram is not None and ngram >= self.solo_ngram:
            return graft_chain(root_only_tree(state.lookup.context[-1], "cpu"), chain)  # the generator moves it
        tree = self.inner.propose(state.inner)
        if self.narrow and chain.numel():
            tree = first_choice_path(tree)
        return graft_chain(tree, chain)


def first_choice_path(tree: DraftTree) -> DraftTree:
    """The chain of first children from the root down: each node's best (or first drawn) guess.

    Lossless under sampling: a node's first child drawn without replacement is a plain draw from its q row, and
    how many children are kept (one) does not depend on which tokens were drawn.
    """
    parents = tree.parents.tolist()
    kept = [0]
    for node in range(1, len(parents)):
        if parents[node] == kept[-1]:  # children follow their parent, the first one found is the first child
            kept.append(node)
    if len(kept) == len(parents):
        return tree
    index = torch.tensor(kept, device=tree.tokens.device)
    return DraftTree(
        tokens=tree.tokens[index],
        parents=torch.arange(-1, len(kept) - 1, dtype=tree.parents.dtype, device=tree.parents.device),
        draft_probs=None if tree.draft_probs is None else tree.draft_probs[index],
        fixed=None if tree.fixed is None else tree.fixed[index],
    )


def graft_chain(tree: DraftTree, chain: torch.Tensor) -> DraftTree:
    """``tree`` with the token chain ``chain`` (the tokens after the root) added as a path from the root.

    Walks down from the root while a child already has the chain's next token, then appends the remaining tokens
    as a chain under the last matched node. The new nodes come last (after every existing node, so after their
    siblings) and are marked ``fixed``; their ``draft_probs`` rows are zeros. Returns ``tree`` itself when the
    chain adds nothing.
    """
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    steps = chain.view(-1).tolist()
    node, matched = 0, 0
    for token in steps:
        child = next((c for c in range(1, len(tokens)) if parents[c] == node and tokens[c] == token), None)
        if child is None:
            break
        node, matched = child, matched + 1
    rest = steps[matched:]
    if not rest:
        return tree
    n, device = len(tokens), tree.tokens.device
    new_parents = [node] + list(range(n, n + len(rest) - 1))
    fixed = tree.fixed if tree.fixed is not None else torch.zeros(n, dtype=torch.bool, device=device)
    draft_probs = tree.draft_probs
    if draft_probs is not None:
        draft_probs = torch.cat([draft_probs, draft_probs.new_zeros(len(rest), draft_probs.shape[1])])
    return DraftTree(
        tokens=torch.cat([tree.tokens, torch.tensor(rest, dtype=tree.tokens.dtype, device=device)]),
        parents=torch.cat([tree.parents, torch.tensor(new_parents, dtype=tree.parents.dtype, device=device)]),
        draft_probs=draft_probs,
        fixed=torch.cat([fixed, torch.ones(len(rest), dtype=torch.bool, device=device)]),
    )
