"""Turning target and draft logits into the distributions that speculative sampling compares.

Convention: p is the target's distribution, q the draft's (as in the speculative-sampling papers and in
transformers `_speculative_sampling`). Lossless speculative sampling reproduces exactly the distribution it is
given as p, so p must be the *warped* target distribution that plain sampling would use, and q must be warped
the same way: the acceptance ratio p(x)/q(x) is only meaningful when both live on the same (warped) scale.
Leviathan et al. 2023, https://arxiv.org/abs/2211.17192 (section 3, "standardized sampling").
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel


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
    https://arxiv.org/abs/1904.09751); the most likely token is always kept. Computed as transformers'
    ``TopPLogitsWarper`` does (ascending sort, drop while the mass so far is <= 1 - top_p), so that tokens tied at the
    nucleus' edge are kept or dropped as ``generate`` does."""
    sorted_scores, order = torch.sort(scores, dim=-1, descending=False)  # (..., V)
    drop_sorted = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1) <= 1 - top_p
    drop_sorted[..., -1:] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def sample_from_probs(probs: Tensor, generator: torch.Generator | None = None) -> int:  # probs (V,)
    """One token from a (possibly unnormalised) distribution. One device sync: the caller needs a Python int.
    A `generator` must live on the same device as `probs` (torch's rule for `multinomial`)."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


UNAPPLIED_GENERATION_SETTINGS = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "min_p": None,
    "top_h": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "num_beams": 1,
    "min_length": 0,
    "min_new_tokens": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
    "guidance_scale": None,
    "watermarking_config": None,
    "forced_bos_token_id": None,
    "stop_strings": None,
    "max_time": None,
    "token_healing": False,  # generate re-tokenizes the prompt's end first
}
"""Logits processors of a target's generation config that the speculative loop does not apply, and their neutral
values. ``top_k``, ``top_p`` and ``temperature`` are arguments of ``generate`` instead, and so is ``stop`` (the
config's ``stop_strings`` are not read); ``max_time`` is not applied either."""


def generation_settings_to_flag(target: PreTrainedModel) -> dict[str, Any]:
    """What the target's generation config sets that the speculative loop does not apply (its logits processors),
    and whether it asks to sample; empty when nothing is to be flagged."""
    config = target.generation_config
    if config is None:
        return {}
    found = {
        key: getattr(config, key)
        for key, neutral in UNAPPLIED_GENERATION_SETTINGS.items()
        if getattr(config, key, neutral) not in (neutral, None)
    }
    if getattr(config, "do_sample", False):
        found["do_sample"] = {k: getattr(config, k) for k in ("temperature", "top_k", "top_p") if getattr(config, k)}
    return found


def warn_unapplied_generation_settings(found: dict[str, Any], stacklevel: int = 3) -> None:
    """Warn about what ``generation_settings_to_flag`` found."""
    unapplied = {key: value for key, value in found.items() if key != "do_sample"}
    if unapplied:
        warnings.warn(
            f"the target's generation config sets {unapplied}, which speculative decoding does not apply: outputs "
            "follow the model's own distribution, as transformers' generate does with these at their defaults (and "
            "`specheads bench` runs its baselines that way). Clear them from model.generation_config to silence this",
            stacklevel=stacklevel,
        )
    if "do_sample" in found:
        warnings.warn(
            f"the target's generation config asks to sample ({found['do_sample']}); SpeculativeGenerator.generate "
            "takes temperature, top_k and top_p as arguments and decodes greedily unless temperature > 0 is passed "
            "(max_new_tokens too is an argument, not read from the config)",
            stacklevel=stacklevel,
        )
