"""Additive attention masks: 0 where attention is allowed, the dtype's minimum where it is blocked.

Additive float masks are passed through unchanged by both the ``sdpa`` and ``eager`` attention implementations;
a boolean mask is silently wrong with ``eager`` (added as 0/1).
"""

from __future__ import annotations

import torch


def blocked_value(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).min


def causal_additive_mask(q_len: int, past_len: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """(1, 1, q_len, past_len + q_len): query i sees every cached key and the new keys 0..i."""
    keys = torch.arange(past_len + q_len, device=device)
    queries = torch.arange(q_len, device=device)[:, None] + past_len
    allowed = keys[None, :] <= queries
    mask = torch.zeros(q_len, past_len + q_len, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, blocked_value(dtype))
    return mask[None, None]


def padding_causal_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1/0 padding mask -> (B, 1, T, T) additive causal mask that also hides padded keys.

    A padded query row that would see no key at all keeps its own diagonal, so softmax never sees an all-blocked row.
    """
    batch, length = attention_mask.shape
    causal = causal_additive_mask(length, 0, dtype, attention_mask.device).expand(batch, 1, -1, -1).clone()
    keys_ok = attention_mask[:, None, None, :].bool()
    causal.masked_fill_(~keys_ok, blocked_value(dtype))
    diagonal = torch.eye(length, dtype=torch.bool, device=attention_mask.device)[None, None]
    causal.masked_fill_(diagonal & ~keys_ok, 0.0)
    return causal
