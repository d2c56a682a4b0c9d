"""Deciding which drafted tokens to keep: the accept stage of draft -> verify -> accept -> commit.

The tree convention (docs/design.md): node 0 is the root, the last committed token; `tokens (n,)` and
`parents (n,)` with `parents[0] = -1` and `parents[i] < i`; children of a node are ordered by index, the order
in which they were drafted. Row i of `target_logits` / `target_probs` is the target's distribution for the
token AFTER node i, so a child c of node i is judged by row i. Row i of `draft_probs` is the draft distribution
q from which node i's children were drawn, one after another WITHOUT replacement, in sibling order.

Every rule returns an `AcceptResult`: the accepted root-to-leaf path and one extra token sampled from the
target after its last node (the bonus token when the path reaches a leaf, the correction token otherwise).
So one step always commits `len(path)` tokens: tau counts the bonus token.

Rules: `accept_greedy` (temperature 0, output identical to greedy `generate`), `accept_speculative` (lossless:
the output has exactly the target's distribution) and `accept_typical` (Medusa's typical acceptance: LOSSY,
faster, its output distribution differs from the target's). `LOSSY_ACCEPTANCE` names the lossy ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specheads.decoding.sampling import sample_from_probs, warp_logits_to_probs
from specheads.decoding.tree import children_lists

__all__ = [
    "LOSSY_ACCEPTANCE",
    "AcceptResult",
    "accept_greedy",
    "accept_speculative",
    "accept_typical",
    "warp_logits_to_probs",
]

LOSSY_ACCEPTANCE = frozenset({"typical"})
"""Names of acceptance rules whose output distribution is NOT the target's, so the API, CLI and stats can label
them. Greedy and speculative acceptance are lossless: greedy reproduces greedy decoding token for token,
speculative sampling reproduces the target's sampling distribution."""


@dataclass(frozen=True)
class AcceptResult:
    """What one accept stage decided. Accepted draft tokens = len(path) - 1; committed tokens = len(path)."""

    path: list[int]  # accepted node indices, root (0) first, in root-to-leaf order
    next_token: int  # sampled from the target after path[-1]: the bonus or correction token


def accept_greedy(
    tokens: Tensor,  # (n,) long
    parents: Tensor,  # (n,) long, parents[0] = -1
    target_logits: Tensor,  # (n, V): row i scores the token after node i
) -> AcceptResult:
    """The longest path whose every token is the target's argmax at its parent; the next token is the argmax
    after the path. Ties between equal logits go to the first index (torch.argmax), as in greedy `generate`,
    so greedy speculative decoding is token-for-token identical to it. Equally long paths: the first drafted."""
    parent_list = _check_tree(tokens, parents, target_logits)
    best = torch.argmax(target_logits, dim=-1)  # (n,)
    matches = tokens[1:] == best[parents[1:]]  # (n - 1,)
    path = _longest_path(parent_list, [True, *matches.tolist()])
    return AcceptResult(path=path, next_token=int(best[path[-1]].item()))


def accept_speculative(
    tokens: Tensor,  # (n,) long
    parents: Tensor,  # (n,) long, parents[0] = -1
    target_probs: Tensor,  # (n, V): warped target distribution p after each node
    draft_probs: Tensor | None,  # (n, V): draft distribution q that node i's children were drawn from, or None
    generator: torch.Generator | None = None,
    fixed: Tensor | None = None,  # (n,) bool: node i is a fixed proposal even though its parent has a q row
) -> AcceptResult:
    """Lossless multi-draft speculative sampling: the committed tokens have exactly the target's distribution.

    Walk down from the root. At the current node, with residual target p (initially `target_probs[node]`) and
    draft q (`draft_probs[node]`), try the children in draft order: child token x is accepted with probability
    min(1, p(x)/q(x)) and the walk moves into it. On rejection, p <- normalize(max(0, p - q)), and because the
    siblings were drawn without replacement, q <- q with x removed, renormalized; then try the next sibling. If no
    child is accepted (or there are none) the next token is drawn from the current p.
    Leviathan et al. 2023 (https://arxiv.org/abs/2211.17192) and Chen et al. 2023
    (https://arxiv.org/abs/2302.01318) for one draft; SpecInfer (https://arxiv.org/abs/2305.09781) for recursive
    rejection over siblings; Recursive Speculative Decoding (https://arxiv.org/abs/2402.14160) for siblings drawn
    without replacement.

    `draft_probs=None` means the children are deterministic proposals (top-k of a Medusa head, a fixed tree):
    each child is then a draw from the point mass q = onehot(x), i.e. accepted with probability p(x), and the
    residual is p with x removed. That is exactly lossless for any fixed proposal. The same point-mass rule is
    used for a child whose token has q(x) = 0 (it could not have been drawn from q; a duplicate sibling, or a
    drafter that proposed outside its warped support): treating it as a fixed proposal keeps the output lossless,
    whereas min(1, p/0) would accept it always. A token with p(x) = 0 is never accepted. `fixed` marks children
    that were not drawn from their parent's q at all (a prompt-lookup branch added to a sampled tree, after the
    drawn siblings): they take the point-mass rule whatever q says about their token, and leave q as it is.

    Contract for losslessness: p and q are warped the same way (`warp_logits_to_probs`), q rows sum to 1 over
    the target vocabulary, and how many children a node has may depend on q but not on the tokens drawn (pruning
    drawn children by their own probabilities makes them no longer a sample from q).

    Numerics: a rejection happens with probability sum(max(0, p - q)); if that residual sums to exactly 0 in
    floating point (p == q up to rounding, so the rejection had ~0 probability), p is kept unchanged instead of
    dividing by zero. Two scalar reads per tried child are unavoidable: the walk branches on the outcome.
    `generator` must live on the device of `target_probs`.
    """
    parent_list = _check_tree(tokens, parents, target_probs)
    if draft_probs is not None and draft_probs.shape != target_probs.shape:
        raise ValueError(
            f"draft_probs must match target_probs {tuple(target_probs.shape)}, got {tuple(draft_probs.shape)}; "
            "map a reduced draft vocabulary into the target vocabulary first (zeros elsewhere)."
        )
    children = children_lists(parent_list)
    token_list = tokens.tolist()
    fixed_list = [False] * len(token_list) if fixed is None else fixed.tolist()
    uniforms = torch.rand(len(token_list), generator=generator, device=target_probs.device).tolist()  # (n,)

    path = [0]
    p = target_probs[0]  # (V,)
    q = None if draft_probs is None else draft_probs[0]  # (V,) or None
    while True:
        accepted, p = _try_children(children[path[-1]], token_list, fixed_list, uniforms, p, q)
        if accepted is None:
            return AcceptResult(path=path, next_token=sample_from_probs(p, generator))
        path.append(accepted)
        p = target_probs[accepted]
        q = None if draft_probs is None else draft_probs[accepted]


def _try_children(
    children: list[int],
    tokens: list[int],
    fixed: list[bool],
    uniforms: list[float],
    p: Tensor,  # (V,) residual target distribution at the node
    q: Tensor | None,  # (V,) draft distribution its children were drawn from, or None (fixed proposals)
) -> tuple[int | None, Tensor]:
    """One node of `accept_speculative`'s walk: recursive rejection over its children in draft order. Returns the
    accepted child (None if every child was rejected) and the residual p to sample from when none was accepted."""
    for child in children:
        x = tokens[child]
        p_x = p[x].item()
        q_x = 0.0 if q is None or fixed[child] else q[x].item()
        if q_x > 0:  # x was drawn from q: accept with probability min(1, p(x) / q(x))
            if uniforms[child] * q_x < p_x:
                return child, p
            p = _normalized_or(torch.clamp(p - q, min=0), fallback=p)
            rest = _without_token(q, x)
            q = _normalized_or(rest, fallback=rest)  # all zero: later siblings count as fixed proposals
        else:  # fixed proposal: a draw from the point mass at x, accepted with probability p(x)
            if uniforms[child] < p_x:
                return child, p
            p = _normalized_or(_without_token(p, x), fallback=p)
    return None, p


def accept_typical(
    tokens: Tensor,  # (n,) long
    parents: Tensor,  # (n,) long, parents[0] = -1
    target_logits: Tensor,  # (n, V): row i scores the token after node i
    temperature: float,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
    generator: torch.Generator | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
) -> AcceptResult:
    """Medusa's typical acceptance (https://arxiv.org/abs/2401.10774, section 2.3.1). LOSSY.

    A drafted token x is typical at its parent if p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p))),
    with p the target's distribution at `temperature` (then `top_k` / `top_p`, as sampling warps it) and H its
    entropy: a confident target accepts only its favourites, a flat one accepts more. The longest all-typical path
    wins (on ties, the one the target finds likeliest: the highest sum of log p, as in Medusa), then the next token
    is sampled from the target after it. It accepts more than speculative sampling but does NOT reproduce the
    target's distribution (it is in `LOSSY_ACCEPTANCE`).
    Temperature 0 makes every p one-hot, so the rule becomes exactly greedy acceptance, which is what runs.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}.")
    if temperature == 0:
        return accept_greedy(tokens, parents, target_logits)
    parent_list = _check_tree(tokens, parents, target_logits)
    probs = warp_logits_to_probs(target_logits, temperature, top_k, top_p)  # (n, V)
    entropy = torch.special.entr(probs).sum(dim=-1)  # (n,) nats
    threshold = torch.clamp(posterior_alpha * torch.exp(-entropy), max=posterior_threshold)  # (n,)
    candidate_probs = probs[parents[1:], tokens[1:]]  # (n - 1,)
    typical = candidate_probs > threshold[parents[1:]]  # (n - 1,)
    path = _longest_path(parent_list, [True, *typical.tolist()], [0.0, *candidate_probs.log().tolist()])
    return AcceptResult(path=path, next_token=sample_from_probs(probs[path[-1]], generator))


def _check_tree(tokens: Tensor, parents: Tensor, scores: Tensor) -> list[int]:
    """Fail early on a malformed tree; returns `parents` as a Python list (one sync, used by the walk)."""
    n = tokens.shape[0]
    if tokens.dim() != 1 or parents.shape != tokens.shape or scores.dim() != 2 or scores.shape[0] != n:
        raise ValueError(
            "expected tokens (n,), parents (n,) and one target row per node (n, V); got "
            f"{tuple(tokens.shape)}, {tuple(parents.shape)}, {tuple(scores.shape)}."
        )
    parent_list = parents.tolist()
    if n == 0 or parent_list[0] != -1 or any(not 0 <= parent < i for i, parent in enumerate(parent_list[1:], 1)):
        raise ValueError(f"parents must start with -1 (the root) and have 0 <= parents[i] < i; got {parent_list}.")
    return parent_list


def _longest_path(parent_list: list[int], node_ok: list[bool], log_probs: list[float] | None = None) -> list[int]:
    """The deepest node whose whole root path is ok, as a path. Among equally deep ones the highest sum of
    ``log_probs`` along the path wins (Medusa's rule for typical acceptance), then the lowest index."""
    depth = [0] * len(parent_list)  # -1 marks a node cut off from the root
    score = [0.0] * len(parent_list)
    for node, parent in enumerate(parent_list[1:], 1):
        depth[node] = depth[parent] + 1 if node_ok[node] and depth[parent] >= 0 else -1
        score[node] = score[parent] + (log_probs[node] if log_probs is not None else 0.0)
    node = max(range(len(depth)), key=lambda i: (depth[i], score[i], -i))
    path = [node]
    while node != 0:
        node = parent_list[node]
        path.append(node)
    return path[::-1]


def _without_token(probs: Tensor, token: int) -> Tensor:  # (V,) -> (V,) unnormalised
    probs = probs.clone()
    probs[token] = 0
    return probs


def _normalized_or(weights: Tensor, fallback: Tensor) -> Tensor:  # (V,) -> (V,)
    """weights / sum, or `fallback` when nothing is left (a residual that rounds to zero mass). No device sync."""
    total = weights.sum()
    return torch.where(total > 0, weights / total, fallback)
