"""The one interface between drafters and the speculative step, plus the two simplest drafters.

A drafter proposes a tree of candidate tokens rooted at the last committed token; the verifier never knows which
drafter made it (as transformers' ``CandidateGenerator``). Per-request drafter state lives in the object returned
by ``begin`` and is passed back explicitly: drafters keep no per-request state on themselves or on modules.

Protocol, in the order the generator calls it:
1. ``begin(prompt_ids, hidden_states, root, sampling, generator)`` after the target's prefill: the target has fed
   ``prompt_ids`` and returned ``hidden_states`` for them; ``root`` is the first new token (not yet fed).
2. ``propose(state)`` -> ``DraftTree`` rooted at ``state``'s root.
3. ``observe(state, fed_tokens, hidden_states, root)`` after verify/accept/commit: the target fed the accepted
   path ``fed_tokens`` (old root first) and ``root`` is the new root (the bonus or correction token).

Drafters that need target features name them in ``layer_ids`` (HF hidden-state indices); others use ``[]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specheads.decoding.ngram_index import NgramIndex
from specheads.decoding.sampling import warp_logits_to_probs
from specheads.decoding.tree import CompiledTree, StaticTree, chain_parents
from specheads.heads import MedusaHeads

HiddenStates = tuple[torch.Tensor | None, ...]
"""The target's ``hidden_states`` tuple in HF indexing, restricted to the fed rows: entries are (1, m, H) or None."""


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen. Temperature 0 = greedy. The same warping is applied to p (target) and q (draft)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped distribution (..., V); greedy scoring uses the plain softmax (only its ranking matters)."""
        if self.greedy:
            return torch.softmax(logits.float(), dim=-1)
        return warp_logits_to_probs(logits, self.temperature, self.top_k, self.top_p)


@dataclass
class DraftTree:
    """Candidate tokens for one verification. Node 0 = root (last committed token, not yet in the target cache).

    ``draft_probs[i]`` is the draft distribution q (target vocabulary) that node i's children were drawn from,
    sequentially without replacement in sibling order; None when the children are deterministic proposals
    (top-k, n-gram lookup), which lossless acceptance treats as point masses. ``fixed[i]`` marks node i as such a
    deterministic proposal even though its parent has a q row (a lookup branch grafted onto a sampled tree); fixed
    children come after their q-drawn siblings.
    """

    tokens: torch.Tensor  # (n,) long, target vocabulary
    parents: torch.Tensor  # (n,) long, parents[0] = -1
    draft_probs: torch.Tensor | None = None  # (n, V) or None
    structure: CompiledTree | None = None  # precompiled mask material (static trees), else built per step
    fixed: torch.Tensor | None = None  # (n,) bool or None (= no node is fixed beyond what draft_probs=None says)

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[0]

    def to(self, device: torch.device | str) -> DraftTree:
        """The same tree on ``device`` (itself when it is there already). Drafters that work on token lists,
        like prompt lookup, build their trees on the CPU."""
        if self.tokens.device == torch.device(device):
            return self
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return DraftTree(
            move(self.tokens), move(self.parents), move(self.draft_probs), self.structure, move(self.fixed)
        )


def root_only_tree(root: int, device: torch.device | str) -> DraftTree:
    """A tree with no candidates: verifying it is one plain decoding step."""
    return DraftTree(tokens=torch.tensor([root], device=device), parents=torch.tensor([-1], device=device))


class Drafter(Protocol):
    """``begin`` once per request; then per step ``propose`` (may be skipped: draft backoff verifies the root alone)
    and ``observe`` with the committed path (old root first), the target's hidden states on it, and the new root."""

    layer_ids: list[int]

    def begin(
        self,
        prompt_ids: torch.Tensor,
        hidden_states: HiddenStates | None,
        root: int,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> Any: ...

    def propose(self, state: Any) -> DraftTree: ...

    def observe(self, state: Any, fed_tokens: torch.Tensor, hidden_states: HiddenStates | None, root: int) -> None: ...


def draw_children(
    probs: torch.Tensor, k: int, greedy: bool, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick k children from q ``(..., V)``: top-k when greedy, else k draws without replacement (Gumbel-top-k,
    https://arxiv.org/abs/1903.06059), which is what lossless multi-draft acceptance needs.

    Returns ``(ids (..., k), scores (..., k))`` where ``scores`` are the log of the k largest probabilities of q,
    in rank order. They depend on q only, never on which tokens were drawn, so a tree pruned by them keeps, for
    every node, a prefix of its children whose length does not depend on their values (needed for losslessness);
    under greedy they are exactly the children's own log-probs (EAGLE-2's ranking).
    """
    log_q = torch.log(probs.float())
    scores = torch.topk(log_q, k, dim=-1).values
    if greedy:
        return torch.topk(log_q, k, dim=-1).indices, scores
    uniform = torch.rand(probs.shape, generator=generator, device=probs.device).clamp_(min=1e-20)
    gumbel = -torch.log(-torch.log(uniform))
    return torch.topk(log_q + gumbel, k, dim=-1).indices, scores


class MedusaDrafter:
    """Medusa heads on a static tree: node (depth d, rank r) is head d's r-th best guess (top-k, deterministic,
    so ``draft_probs`` is None even when sampling). Head k reads the target's hidden state at the last fed position
    and predicts token t + k + 1, i.e. depth k below the root (the root itself is the target's own next token)."""

    def __init__(self, heads: MedusaHeads, tree: StaticTree) -> None:
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


class PromptLookupDrafter:
    """Training-free drafter: find the latest earlier occurrence of the context's last n tokens (n from
    ``max_ngram`` down to ``min_ngram``) and propose the tokens that followed it as a chain (Saxena 2023,
    https://github.com/apoorvumang/prompt-lookup-decoding). Deterministic: ``draft_probs`` is None."""

    layer_ids: list[int] = []

    def __init__(self, num_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if num_tokens < 1 or not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need num_tokens >= 1 and 1 <= min_ngram <= max_ngram, got {num_tokens=}, {max_ngram=}")
        self.num_tokens, self.max_ngram, self.min_ngram = num_tokens, max_ngram, min_ngram
        self.layer_ids = []

    def begin(
        self,
        prompt_ids: torch.Tensor,
        hidden_states: HiddenStates | None,
        root: int,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> LookupState:
        index = NgramIndex(self.max_ngram, self.min_ngram)
        index.extend(prompt_ids.view(-1).tolist() + [root])
        return LookupState(index)

    def observe(
        self, state: LookupState, fed_tokens: torch.Tensor, hidden_states: HiddenStates | None, root: int
    ) -> None:
        state.index.extend(fed_tokens.view(-1).tolist()[1:] + [root])  # the old root is already in the context

    def continuation(self, state: LookupState) -> tuple[torch.Tensor, int]:
        """The proposed tokens after the root (possibly none) and the length of the n-gram they matched (0: none);
        ``lookup_match``'s answer, from the incremental index."""
        return state.index.match(self.num_tokens)

    def propose(self, state: LookupState) -> DraftTree:
        tokens = torch.cat([torch.tensor(state.context[-1:]), self.continuation(state)[0]])
        return DraftTree(tokens=tokens, parents=chain_parents(tokens.numel()))


@dataclass
class LookupState:
    index: NgramIndex  # every committed token, ending with the root, and where each n-gram of them last occurred

    @property
    def context(self) -> list[int]:
        return self.index.tokens


def lookup_match(context: torch.Tensor, num_tokens: int, max_ngram: int, min_ngram: int) -> tuple[torch.Tensor, int]:
    """The up to ``num_tokens`` tokens that followed the latest earlier match of the context's last n-gram, and that
    n (the longest from ``max_ngram`` down to ``min_ngram``; 0 and no tokens when nothing matched)."""
    length = context.numel()
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = context.unfold(0, n, 1)[:-1]  # (length - n, n): every n-gram except the tail itself
        hits = torch.nonzero((windows == context[-n:]).all(dim=1)).flatten()
        if hits.numel():
            start = int(hits[-1]) + n
            return context[start : start + num_tokens], n
    return context[:0], 0
