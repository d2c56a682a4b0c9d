"""One target forward over every node of a draft tree, on top of the committed KV cache.

The target is a stock transformers model: the tree is expressed only through an additive 4D mask and explicit
position ids (see ``tree.py``). The forward appends all n nodes to the cache; ``kv_cache.commit_path`` then keeps
exactly the accepted path's entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from specheads.decoding.tree import ancestor_matrix, tree_attention_mask


@dataclass
class Verification:
    """What the target said about a tree: ``logits[i]`` predicts the token after node i."""

    logits: torch.Tensor  # (n, V)
    hidden_states: tuple[torch.Tensor | None, ...] | None  # HF indices; requested entries are (1, n, H), others None


def verify_tree(
    target: PreTrainedModel,
    cache: DynamicCache,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    layer_ids: list[int] | None = None,
    ancestors: torch.Tensor | None = None,
    depths: torch.Tensor | None = None,
) -> Verification:
    """Feed the n tree nodes (root first) in ONE forward: mask = prefix + ancestors, position = prefix + depth.

    ``layer_ids`` names the hidden-state indices the drafter reads (HF convention: 0 = embeddings, N = after the
    final norm); None skips hidden states. ``ancestors``/``depths`` may be passed when the tree was compiled once.
    """
    tokens = tokens.view(-1)  # (n,)
    if ancestors is None:
        ancestors = ancestor_matrix(parents)
    if depths is None:
        depths = ancestors.sum(dim=1) - 1
    prefix_len = cache.get_seq_length()
    dtype = target.get_input_embeddings().weight.dtype
    mask = tree_attention_mask(ancestors.to(tokens.device), prefix_len, dtype)  # (1, 1, n, prefix + n)
    position_ids = (prefix_len + depths.to(tokens.device)).unsqueeze(0)  # (1, n)
    out = target(
        input_ids=tokens.unsqueeze(0),
        attention_mask=mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=True,
        output_hidden_states=list(layer_ids) if layer_ids else None,
    )
    return Verification(logits=out.logits[0], hidden_states=out.hidden_states if layer_ids else None)


def select_rows(hidden_states: tuple[torch.Tensor | None, ...], rows: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """Keep only the given node rows (e.g. the accepted path) of every returned hidden state: (1, n, H) -> (1, r, H)."""
    return tuple(None if h is None else h[:, rows] for h in hidden_states)
