"""The one interface between drafters and the speculative step: the draft tree, the drafter protocol, sampling.

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

import numbers
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specheads.decoding.sampling import warp_logits_to_probs
from specheads.decoding.tree import CompiledTree

HiddenStates = tuple[torch.Tensor | None, ...]
"""The target's ``hidden_states`` tuple in HF indexing, restricted to the fed rows: entries are (1, m, H) or None."""


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen. Temperature 0 = greedy. The same warping is applied to p (target) and q (draft)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not _is_number(self.temperature) or not self.temperature >= 0:  # NaN fails >= too
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}")
        if self.top_k is not None and (not isinstance(self.top_k, numbers.Integral) or self.top_k < 0):
            raise ValueError(f"top_k must be None, 0 (off) or a whole number >= 1, got {self.top_k!r}")
        if self.top_p is not None and (not _is_number(self.top_p) or not 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be None or a number in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped distribution (..., V); greedy scoring uses the plain softmax (only its ranking matters)."""
        if self.greedy:
            return torch.softmax(logits.float(), dim=-1)
        return warp_logits_to_probs(logits, self.temperature, self.top_k, self.top_p)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


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


DRAFTER_MODULES = ("model", "head", "heads")
"""Where a drafter holds its modules (a draft ``model``, an EAGLE ``head``, Medusa ``heads``): the generator checks
their placement and swaps CPU kernels into them."""


def inner_modules(inner: Any) -> tuple[Any, ...]:
    """A wrapped drafter's ``DRAFTER_MODULES``, for a wrapper to expose as its own (None where it has none)."""
    return tuple(getattr(inner, name, None) for name in DRAFTER_MODULES)


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
    gumbel = gumbel_noise(probs.shape, generator, probs.device)
    return torch.topk(log_q.double() + gumbel, k, dim=-1).indices, scores


def gumbel_noise(shape: torch.Size, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Standard Gumbel noise in float64: float32 uniforms cap it at ~16.6, so tokens over e^16.6 times less likely
    than the best would be drawn too rarely for the q that acceptance trusts."""
    uniform = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)
    return -torch.log(-torch.log(uniform.clamp_(min=1e-300)))
