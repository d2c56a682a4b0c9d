"""Keep exactly the accepted path in a KV cache, without an extra forward.

After verification the cache holds ``prefix + n`` entries: the committed prefix, then every tree node in node
order. The accepted path is a subset of the nodes; transformers has no API to keep a non-contiguous subset along
the sequence axis, so we copy the path's entries into the contiguous slots right after the prefix and drop the
tail (``cache.layers[i].keys/.values`` are plain tensors ``(B, kv_heads, seq, head_dim)``; see shared NOTES:
~2 ms, equal to a sequential run, where re-feeding the path would cost a whole forward).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """An empty KV cache for ``model`` that can be cropped back to any length.

    transformers' sliding-window cache layers keep only the last W-1 keys, so the n nodes of a verified tree would
    push out prefix keys that the accepted path still needs, and no crop brings them back. For a model with such
    layers the cache keeps every key instead (its memory grows with the sequence, as a model without a window's
    does) and the window is applied by the mask (``verify.AttentionLayout``); others get transformers' own cache.
    """
    cache = DynamicCache(config=model.config)
    return DynamicCache() if sliding_window(cache) else cache


def sliding_window(cache: DynamicCache) -> int:
    """The smallest sliding window among the cache's layers (0 when every layer attends to the whole prefix)."""
    windows = [int(layer.sliding_window) for layer in cache.layers if getattr(layer, "is_sliding", False)]
    return min(windows, default=0)


def commit_path(cache: DynamicCache, prefix_len: int, path: torch.Tensor | list[int]) -> None:
    """Move the entries of tree nodes ``path`` (node indices, root first) to slots ``prefix_len ...`` and crop."""
    path_list = path.tolist() if isinstance(path, torch.Tensor) else list(path)
    keep = prefix_len + len(path_list)
    if path_list == list(range(len(path_list))):  # already contiguous (root only, or a chain's prefix): crop only
        crop_to(cache, keep)
        return
    path = torch.as_tensor(path_list, dtype=torch.long)
    sources: dict[torch.device, torch.Tensor] = {}  # one copy of the index per device, not one per layer
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        if layer.keys.shape[-2] < prefix_len + int(path.max()) + 1:
            raise ValueError(
                f"cache layer holds {layer.keys.shape[-2]} entries but the path needs node {int(path.max())} after "
                f"a prefix of {prefix_len}; verify the tree before committing it"
            )
        src = sources.get(layer.keys.device)
        if src is None:
            src = sources[layer.keys.device] = (prefix_len + path).to(layer.keys.device)
        layer.keys[:, :, prefix_len:keep] = layer.keys[:, :, src]  # advanced indexing copies before writing
        layer.values[:, :, prefix_len:keep] = layer.values[:, :, src]
    crop_to(cache, keep)


def crop_to(cache: DynamicCache, length: int) -> None:
    """Drop every entry past ``length`` (``DynamicCache.crop`` takes a negative count to remove)."""
    extra = cache.get_seq_length() - length
    if extra < 0:
        raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} entries to a longer length {length}")
    if extra:
        cache.crop(-extra)
