"""Keep exactly the accepted path in a KV cache, without an extra forward.

After verification the cache holds ``prefix + n`` entries: the committed prefix, then every tree node in node
order. The accepted path is a subset of the nodes; transformers has no API to keep a non-contiguous subset along
the sequence axis, so we copy the path's entries into the contiguous slots right after the prefix and drop the
tail (``cache.layers[i].keys/.values`` are plain tensors ``(B, kv_heads, seq, head_dim)``; a copy is far cheaper
than re-feeding the path, which would cost a whole forward).

Sliding-window layers hold only the keys their next forward can see: the last W-1 committed positions (a node at
position p sees q only if p - q < W), so their memory stays bounded however long the sequence grows. Their slots
start at ``window_start(cache)``, not at 0; full-attention layers hold every position.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """An empty KV cache for ``model`` that can be cropped back to any committed length.

    transformers' sliding-window cache layers keep the last W-1 keys on every update, so the n nodes of a verified
    tree would push out prefix keys that the accepted path still needs. Recording their past (transformers' own
    switch for rolling back, as its assisted generation uses) makes them keep every key until the next crop, and
    ``crop_to`` (which ``commit_path`` ends with) trims them back to the last W-1 committed positions.
    """
    cache = DynamicCache(config=model.config)
    if sliding_window(cache):
        cache.activate_past_recording()
    return cache


def sliding_window(cache: DynamicCache) -> int:
    """The smallest sliding window among the cache's layers (0 when every layer attends to the whole prefix)."""
    windows = [int(layer.sliding_window) for layer in cache.layers if getattr(layer, "is_sliding", False)]
    return min(windows, default=0)


def window_start(cache: DynamicCache) -> int:
    """The position of the first key the cache's sliding-window layers will show the next forward (0 when it has no
    such layer, or holds nothing yet): they return at most their last W-1 keys with the new ones, as transformers'
    sliding layer does while recording its past. Every sliding layer has the same window and length
    (``verify.attention_layout`` refuses targets whose windows differ), so the first one tells."""
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False) and layer.is_initialized:
            return layer.get_seq_length() - min(layer.keys.shape[-2], int(layer.sliding_window) - 1)
    return 0


def commit_path(cache: DynamicCache, prefix_len: int, path: torch.Tensor | list[int]) -> None:
    """Move the entries of tree nodes ``path`` (node indices, root first) to positions ``prefix_len ...`` and crop.

    ``prefix_len`` is a position; a sliding-window layer that holds only its window finds it at slot
    ``prefix_len - (positions it no longer holds)``."""
    path_list = path.tolist() if isinstance(path, torch.Tensor) else list(path)
    keep = prefix_len + len(path_list)
    if path_list == list(range(len(path_list))):  # already contiguous (root only, or a chain's prefix): crop only
        crop_to(cache, keep)
        return
    path = torch.as_tensor(path_list, dtype=torch.long)
    sources: dict[tuple[torch.device, int], torch.Tensor] = {}  # one index per device and slot, not one per layer
    for layer in cache.layers:
        if not layer.is_initialized or layer.keys is None:  # nothing yet, or a KV-shared layer's empty placeholder
            continue
        base = prefix_len - (layer.get_seq_length() - layer.keys.shape[-2])  # the prefix's end, in this layer's slots
        if base < 0 or layer.keys.shape[-2] < base + int(path.max()) + 1:
            raise ValueError(
                f"cache layer holds {layer.keys.shape[-2]} entries but the path needs node {int(path.max())} after "
                f"a prefix of {prefix_len}; verify the tree before committing it"
            )
        src = sources.get((layer.keys.device, base))
        if src is None:
            src = sources[(layer.keys.device, base)] = (base + path).to(layer.keys.device)
        layer.keys[:, :, base : base + len(path_list)] = layer.keys[:, :, src]  # advanced indexing copies first
        layer.values[:, :, base : base + len(path_list)] = layer.values[:, :, src]
    crop_to(cache, keep)


def crop_to(cache: DynamicCache, length: int) -> None:
    """Drop every entry past position ``length``. ``DynamicCache.crop`` takes a negative count to remove, and also
    trims each sliding-window layer back to the last W-1 keys, all its next forward can see (``crop(0)`` only trims)."""
    extra = cache.get_seq_length() - length
    if extra < 0:
        raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} entries to a longer length {length}")
    cache.crop(-extra)
