"""Grouped-query attention for masked few-token forwards on CPU, without copying the KV cache per query head.

transformers' SDPA path, given a mask and several query tokens (a verify step's tree, a chain), expands every key
and value head to the query heads it serves (``repeat_kv``) before calling SDPA: with 3 KV heads serving 9 query heads
that writes the whole cache three times over in every layer of every step, a cost that grows with the context (at
7.4k tokens it is most of a 4-token forward on a 2-core CPU). One query token takes another path that does not copy,
so plain decoding never paid it. ``masked_gqa_attention(model)`` registers an attention function that asks PyTorch's
SDPA for grouped-query attention (``enable_gqa=True``) in exactly that case (CPU, a mask, more than one query, fewer KV
heads than query heads) and hands every other call to transformers' own SDPA function; the model is switched to it
for a ``with`` block (its config's attention implementation, then restored). Same arithmetic, no modeling code copied.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from specheads.heads.tree_layers import GQA_SDPA_ATTENTION

NAME = GQA_SDPA_ATTENTION  # accepted by ``tree_obstacle``: a target may be built or probed inside the block


def gqa_sdpa_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, with masked multi-query CPU calls done as grouped-query SDPA."""
    grouped = (
        getattr(module, "num_key_value_groups", 1) > 1
        and query.device.type == "cpu"
        and attention_mask is not None
        and query.shape[2] > 1
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and key.shape[-1] == value.shape[-1]
    )
    if not grouped:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # (B, H, q, d)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, gqa_sdpa_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks are SDPA's

_users: dict[int, int] = {}  # id(config) -> open blocks
_lock = threading.Lock()


def attention_configs(model: nn.Module, implementations: tuple[str, ...] = ("sdpa", NAME)) -> list[Any]:
    """The configs the layers of ``model`` read their attention implementation from, where it is one of these."""
    configs = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "_attn_implementation", None) in implementations:
            configs[id(config)] = config
    return list(configs.values())


def applies_to(model: nn.Module) -> bool:
    """Whether ``masked_gqa_attention`` changes anything for ``model``: on CPU, SDPA attention, grouped KV heads."""
    grouped = any(getattr(m, "num_key_value_groups", 1) > 1 for m in model.modules())
    return next(model.parameters()).device.type == "cpu" and grouped and bool(attention_configs(model))


@contextlib.contextmanager
def masked_gqa_attention(*models: nn.Module) -> Iterator[None]:
    """Within the block, the models' SDPA attention runs masked multi-query CPU calls as grouped-query SDPA.

    Blocks may overlap (threads sharing a target): the last one out restores ``sdpa``."""
    configs = [config for model in models for config in attention_configs(model)]
    with _lock:
        for config in configs:
            _users[id(config)] = _users.get(id(config), 0) + 1
            config._attn_implementation = NAME
    try:
        yield
    finally:
        with _lock:
            for config in configs:
                _users[id(config)] -= 1
                if not _users[id(config)]:
                    del _users[id(config)]
                    config._attn_implementation = "sdpa"
