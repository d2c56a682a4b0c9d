"""Turning target and draft logits into the distributions that speculative sampling compares.

Convention: p is the target's distribution, q the draft's (as in the speculative-sampling papers and in
transformers `_speculative_sampling`). Lossless speculative sampling reproduces exactly the distribution it is
given as p, so p must be the *warped* target distribution that plain sampling would use, and q must be warped
the same way: the acceptance ratio p(x)/q(x) is only meaningful when both live on the same (warped) scale.
Leviathan et al. 2023, https://arxiv.org/abs/2211.17192 (section 3, "standardized sampling").
"""

from __future__ import annotations

import torch
from torch import Tensor


def warp_logits_to_probs(
    logits: Tensor,  # (..., V)
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Tensor:  # (..., V) float32, rows sum to 1
    """Temperature, then top-k, then top-p (nucleus), then softmax: the order transformers `generate` uses.

    Apply the SAME call to the target logits (p) and to the draft logits (q); a draft sampled from a differently
    warped q still gives a lossless output, but accepts less. Temperature 0 is not a distribution: greedy
    decoding has its own path (`accept_greedy`). `top_k` of None or 0 and `top_p` of None or 1.0 mean "off",
    as in transformers. Ties at the k-th logit are all kept, as transformers' `TopKLogitsWarper` does.
    """
    if not temperature > 0:
        raise ValueError(
            f"warp_logits_to_probs needs temperature > 0, got {temperature}; for temperature 0 use accept_greedy "
            "(argmax), which is not a probability distribution."
        )
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be None, 0 (off) or a positive int, got {top_k}.")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be None or in (0, 1], got {top_p}.")

    scores = logits.float() / temperature  # (..., V)
    vocab_size = scores.shape[-1]
    if top_k and top_k < vocab_size:
        kth_best = torch.topk(scores, top_k, dim=-1).values[..., -1:]  # (..., 1)
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    if top_p is not None and top_p < 1:
        scores = _keep_nucleus(scores, top_p)
    return torch.softmax(scores, dim=-1)


def _keep_nucleus(scores: Tensor, top_p: float) -> Tensor:  # (..., V) -> (..., V)
    """Keep the smallest set of most likely tokens whose mass reaches top_p (Holtzman et al. 2019,
    https://arxiv.org/abs/1904.09751); the most likely token is always kept."""
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True)  # (..., V)
    sorted_probs = torch.softmax(sorted_scores, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of the strictly more likely tokens
    drop_sorted = mass_before >= top_p  # first token has mass_before 0 < top_p: never dropped
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def sample_from_probs(probs: Tensor, generator: torch.Generator | None = None) -> int:  # probs (V,)
    """One token from a (possibly unnormalised) distribution. One device sync: the caller needs a Python int.
    A `generator` must live on the same device as `probs` (torch's rule for `multinomial`)."""
    return int(torch.multinomial(probs, 1, generator=generator).item())
