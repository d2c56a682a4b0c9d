"""Whether a target can verify a draft tree, and why not: the one answer, ``tree_obstacle``, that every caller asks
(``load_target``, the generator and its exactness probe, training's early warning). Read from the model's attention
implementation, its forward and the cache transformers builds for it, so training can say so before hours are spent
on a head that specheads' decoder would refuse (decoding refuses such a target with the same reason)."""

from __future__ import annotations

import inspect
import warnings

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DummyLayer, DynamicLayer, DynamicSlidingWindowLayer

GQA_SDPA_ATTENTION = "specheads_sdpa_gqa"
"""The name decoding's CPU kernels register their grouped-query SDPA under for a ``with`` block (SDPA's masks, so a
target switched to it verifies trees too)."""
TREE_ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
"""Attention implementations that pass an additive float 4D mask straight through (flash kernels take no such mask)."""
SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' ``config.layer_types`` names
ATTENTION_CACHE_LAYERS = (DynamicLayer.__name__, DynamicSlidingWindowLayer.__name__, DummyLayer.__name__)
"""Cache layers a tree can be verified through: full and sliding-window attention, and the empty placeholder of a
layer that reads another layer's keys and values (Gemma3n's KV-shared layers), which holds nothing to roll back."""

GENERATE_INSTEAD = "Decode this target with transformers' generate"


def tree_obstacle(target: PreTrainedModel, probe: bool = False) -> str | None:
    """Why ``target`` cannot verify a tree, or None when it can: one line saying what was found, what is expected and
    what to do. With ``probe``, also what only a forward shows: that it honours a 4D mask and explicit position ids
    (``mask_probe_obstacle``, two tokens).

    Its attention implementation must apply the additive 4D tree mask as given (``sdpa`` or ``eager``); its sliding-
    window layers, if any, must share one window (the verifier builds one mask for all of them).

    Only attention layers take a tree: a recurrent layer (linear attention, a state-space or convolution layer, as in
    Qwen3-Next, Jamba, LFM2, Falcon-H1) folds every node it is fed into one state, whatever the mask says, and that
    state cannot be cut back to the accepted path, nor can a compressed attention cache (DeepSeek-V4, HY-V4);
    chunked attention (Llama 4) needs a mask the verifier does not build; a model whose forward takes no ``cache``
    (RWKV, GPT-1) has no prefix cache to verify against."""
    attention = getattr(target.config, "_attn_implementation", None)
    if attention not in (*TREE_ATTENTION_IMPLEMENTATIONS, GQA_SDPA_ATTENTION):
        return (
            f"the target uses attn_implementation={attention!r}, which does not apply the additive 4D tree mask "
            f"verification passes; expected one of {TREE_ATTENTION_IMPLEMENTATIONS}. Load it with "
            "attn_implementation='sdpa' (or specheads.target.load_target), or call "
            "target.set_attn_implementation('sdpa')"
        )
    reason = _layer_obstacle(target)
    if reason is not None:
        return f"{reason}. {GENERATE_INSTEAD}"
    return mask_probe_obstacle(target) if probe else None


@torch.no_grad()
def mask_probe_obstacle(model: PreTrainedModel) -> str | None:
    """Whether the model ignores a custom 4D mask or explicit position ids, or None when it honours both.

    Probe: feed tokens [a, b] where b may not see a and both sit at position 0. Then b's logits must equal those
    of b fed alone. A model that silently builds its own causal mask (or ignores position ids) fails this.
    """
    device = model.device
    param_dtype = next(model.parameters()).dtype
    ids = torch.tensor([[1, 2]], device=device)
    blocked = torch.finfo(param_dtype).min
    mask = torch.tensor([[[[0.0, blocked], [blocked, 0.0]]]], dtype=param_dtype, device=device)  # (1, 1, 2, 2)
    try:
        pair = model(input_ids=ids, attention_mask=mask, position_ids=torch.zeros_like(ids)).logits[0, 1]
    except Exception as err:  # noqa: BLE001 - any failure here means the architecture is unusable for trees
        return (
            f"{type(model).__name__} does not accept a 4D attention mask with explicit position_ids "
            f"({type(err).__name__}: {err}); tree verification needs both."
        )
    alone = model(input_ids=ids[:, 1:], position_ids=torch.zeros_like(ids[:, 1:])).logits[0, 0]
    tolerance = 1e-3 if param_dtype == torch.float32 else 5e-2
    if not torch.allclose(pair.float(), alone.float(), atol=tolerance * max(1.0, alone.abs().max().item())):
        return (
            f"{type(model).__name__} ignores a custom 4D attention mask or explicit position_ids (a masked-out token "
            "changed the logits); tree verification would be silently wrong with this architecture."
        )
    return None


def _layer_obstacle(target: PreTrainedModel) -> str | None:
    """Why ``target``'s layers cannot take a tree (without the advice), or None."""
    name = type(target).__name__
    if "cache" not in inspect.signature(type(target).forward).parameters:
        return (
            f"{name}'s forward takes no `cache`: it keeps no transformers key/value cache (RWKV passes its recurrent "
            "state as `state`, XLNet and GPT-1 keep none), so a tree's nodes cannot be verified against a cached "
            "prefix and rolled back to the accepted path. Expected a model whose forward takes `cache` (a "
            "DynamicCache), as every attention decoder in transformers does"
        )
    kinds = {type(layer).__name__ for layer in DynamicCache(config=target.config).layers}
    if not kinds <= set(ATTENTION_CACHE_LAYERS):
        return (
            f"{name} has cache layers of kinds {sorted(kinds)}, not all plain key/value caches: recurrent layers "
            "(linear attention, state-space or convolution) fold every tree node they are fed into one state, and "
            "compressed or indexed attention caches (DeepSeek-V4's, HY-V4's) keep summaries over several tokens; "
            "neither can be rolled back to the accepted path, so tree verification would not be exact. Expected "
            "attention layers only (full or sliding-window)"
        )
    types = set(getattr(target.config.get_text_config(), "layer_types", None) or [])
    if not types <= {SLIDING, FULL}:
        return (
            f"{name} has layers of types {sorted(types)}; tree verification masks '{SLIDING}' and '{FULL}' layers only"
        )
    windows = sliding_windows(target)
    if len(windows) > 1:
        return (
            f"{name}'s sliding-window layers have different windows ({sorted(windows)}); tree verification gives "
            "every sliding layer one mask, so it needs one window"
        )
    return None


def sliding_windows(target: PreTrainedModel) -> set[int]:
    """The windows of ``target``'s sliding-window layers, as the cache transformers builds for it holds them."""
    cache = DynamicCache(config=target.config)
    return {int(layer.sliding_window) for layer in cache.layers if getattr(layer, "is_sliding", False)}


def warn_if_trees_cannot_be_verified(target: PreTrainedModel) -> None:
    """Training's early word on a target that specheads' decoder will refuse (the head can still be exported)."""
    reason = tree_obstacle(target)
    if reason is not None:
        warnings.warn(
            f"{reason.rstrip('.')}. specheads' decoder will refuse this target, so a head trained on it cannot be "
            "decoded or benchmarked with specheads; it can still be saved and exported for an engine that drafts for "
            "such layers",
            UserWarning,
            stacklevel=2,
        )
