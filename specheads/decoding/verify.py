"""One target forward over every node of a draft tree, on top of the committed KV cache.

The target is a stock transformers model: the tree is expressed only through an additive 4D mask and explicit
position ids (see ``tree.py``). The forward appends all n nodes to the cache; ``kv_cache.commit_path`` then keeps
exactly the accepted path's entries. On a target with sliding-window layers those layers hold only the last W-1
committed keys (``kv_cache``) and get a mask over just those and the nodes, which also hides keys W or more
positions back from deeper nodes, as transformers' own sliding-window mask does; models with both kinds of layer
take one mask per layer type.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from specheads.decoding.kv_cache import commit_path, new_cache, window_start
from specheads.decoding.tree import ancestor_matrix, tree_attention_mask
from specheads.heads.tree_layers import SLIDING, sliding_windows, tree_obstacle


@dataclass(frozen=True)
class AttentionLayout:
    """The masks a target's layers read: ``window`` 0 is one mask over the whole prefix for every layer; otherwise
    sliding layers see only the last ``window`` positions, and ``layer_types`` (when the model mixes sliding and
    full layers) names the mask per type that its forward takes as a dict."""

    window: int = 0
    layer_types: tuple[str, ...] = ()


def attention_layout(target: PreTrainedModel) -> AttentionLayout:
    """How ``target``'s layers attend, read from the cache transformers would build for it and its config.

    Targets that cannot verify a tree at all (``heads.tree_layers.tree_obstacle``: the attention implementation,
    recurrent or chunked-attention layers, mixed windows) are refused here, before anything is decoded."""
    check_tree_capability(target)
    kinds = set(getattr(target.config.get_text_config(), "layer_types", None) or [])
    windows = sliding_windows(target)
    if not windows:
        return AttentionLayout()
    kinds = kinds or {SLIDING}
    return AttentionLayout(windows.pop(), tuple(sorted(kinds)) if len(kinds) > 1 else ())


def check_tree_capability(target: PreTrainedModel) -> None:
    """Refuse a target that cannot verify a tree, with the reason ``tree_obstacle`` gives (the one answer)."""
    reason = tree_obstacle(target)
    if reason is not None:
        raise ValueError(reason)


def windowed(mask: torch.Tensor, positions: torch.Tensor, prefix_len: int, window: int, start: int = 0) -> torch.Tensor:
    """The sliding layers' mask: ``mask`` (1, 1, n, prefix + n) over only the keys they hold, positions ``start``
    to ``prefix_len - 1`` and the n nodes, with the keys W or more positions behind each node also hidden: node i
    at position p sees a key at position q only if p - q < W (transformers' ``sliding_window_overlay``)."""
    key_positions = torch.cat([torch.arange(start, prefix_len, device=positions.device), positions])
    too_far = positions[:, None] - key_positions[None, :] >= window  # (n, prefix - start + n)
    return mask[..., start:].masked_fill(too_far, torch.finfo(mask.dtype).min)


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
    layout: AttentionLayout = AttentionLayout(),
) -> Verification:
    """Feed the n tree nodes (root first) in ONE forward: mask = prefix + ancestors, position = prefix + depth.

    ``layer_ids`` names the hidden-state indices the drafter reads (HF convention: 0 = embeddings, N = after the
    final norm); None skips hidden states. ``ancestors``/``depths`` may be passed when the tree was compiled once.
    ``layout`` is the target's ``attention_layout`` (the default: no sliding-window layers).
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
    masks: torch.Tensor | dict[str, torch.Tensor] = mask
    if layout.window:
        sliding = windowed(mask, position_ids[0], prefix_len, layout.window, window_start(cache))
        masks = {kind: sliding if kind == SLIDING else mask for kind in layout.layer_types} or sliding
    out = target(
        input_ids=tokens.unsqueeze(0),
        attention_mask=masks,
        position_ids=position_ids,
        cache=cache,
        use_cache=True,
        output_hidden_states=list(layer_ids) if layer_ids else None,
    )
    return Verification(logits=out.logits[0], hidden_states=out.hidden_states if layer_ids else None)


def select_rows(hidden_states: tuple[torch.Tensor | None, ...], rows: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """Keep only the given node rows (e.g. the accepted path) of every returned hidden state: (1, n, H) -> (1, r, H)."""
    return tuple(None if h is None else h[:, rows] for h in hidden_states)


PROBE_PARENTS = (-1, 0, 0, 0, 0, 0, 0, 1, 6)
"""Root, six siblings and a grandchild under the first and the last: masks, depths (node 8 sits six slots past its
position, as wide trees' nodes do) and a branch to commit."""
PROBE_TOLERANCE = {torch.float32: 0.01, torch.float64: 0.01}
"""The largest difference, relative to the largest logit, that ``tree_exactness_gap`` may find (0.1 in 16-bit
formats). Wrong masks or positions shift logits by a good part of their range (MPT: 22%); rounding differs by a
few ulps: a 16-bit forward over several tokens rounds otherwise than one over a single token, and fp32 matrix
products may run in TF32 on a GPU."""

_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(dtype, device): gap}


def check_tree_exactness(target: PreTrainedModel, layout: AttentionLayout) -> None:
    """Refuse a target whose forward over a tree is not its sequential forward (``tree_exactness_gap``), before
    anything is decoded: speculative decoding on it would not be lossless. Measured once per target, dtype and
    device in a process. The capability check (``tree_obstacle``) comes first: this probe is the second line of
    defence, for what only a forward shows."""
    check_tree_capability(target)
    dtype = target.get_input_embeddings().weight.dtype
    key = (dtype, str(target.device))
    gaps = _CHECKED.setdefault(target, {})
    if key not in gaps:
        try:
            gaps[key] = tree_exactness_gap(target, layout)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # the family's forward cannot take a tree at all
            raise ValueError(
                f"{type(target).__name__}'s forward fails on a draft tree ({type(error).__name__}: {error}). Tree "
                "verification feeds the target a 4D additive attention mask over the cache and the nodes, explicit "
                "position ids and a DynamicCache, as transformers' rotary-position models take them; this family's "
                "forward does not (ALiBi models such as BLOOM, and Falcon with alibi=True, build their biases from a "
                "2D padding mask), so trees cannot be verified on it. Decode this target with transformers' generate"
            ) from error
    tolerance = PROBE_TOLERANCE.get(dtype, 0.1)
    if gaps[key] > tolerance:
        raise ValueError(
            f"{type(target).__name__}'s forward over a draft tree does not match its own forward over each path: "
            f"on a fixed 9-node probe tree its logits differ by {gaps[key]:.1%} of their range, where rounding in "
            f"{str(dtype).removeprefix('torch.')} stays under {tolerance:.0%}. Its layers do not honour the 4D "
            "attention mask, the explicit position ids or the cache commit that tree verification relies on (ALiBi "
            "models such as MPT take their biases from the key index, not the position), so speculative decoding "
            "would not be lossless. Decode this target with transformers' generate"
        )


@torch.inference_mode()
def tree_exactness_gap(target: PreTrainedModel, layout: AttentionLayout) -> float:
    """How far ``target``'s tree forward is from its own sequential one, on a fixed 9-node tree over a 6-token prefix:
    the largest difference of any node's logits from those of its path run from scratch, and of the next token's
    after committing a branch, relative to the largest reference logit. 0 up to rounding when the forward honours the
    4D mask, the position ids and the cache commit; a family that ignores one of them (ALiBi biases taken from the
    key index, as MPT's) is off by far more. Four small forwards, no drafter involved."""
    device = target.device
    vocab = int(target.config.get_text_config().vocab_size)
    generator = torch.Generator().manual_seed(0)
    parents = torch.tensor(PROBE_PARENTS, device=device)
    nodes = parents.numel()
    paths = [row.nonzero().flatten().tolist() for row in ancestor_matrix(parents)]  # root ... node, per node
    prefix, tokens = (torch.randint(0, vocab, (size,), generator=generator).to(device) for size in (6, nodes + 1))
    cache = new_cache(target)
    target(input_ids=prefix.unsqueeze(0), cache=cache, use_cache=True)
    cache.crop(0)
    got = [verify_tree(target, cache, tokens[:nodes], parents, layout=layout).logits]
    commit_path(cache, prefix.numel(), paths[-1])  # the deepest branch, which leaves the first child
    got.append(verify_tree(target, cache, tokens[nodes:], torch.tensor([-1], device=device), layout=layout).logits)
    paths.append(paths[-1] + [nodes])  # the next token after the committed branch
    lengths = torch.tensor([prefix.numel() + len(path) for path in paths], device=device)
    longest = max(map(len, paths))
    batch = torch.stack([torch.cat([prefix, tokens[path + [0] * (longest - len(path))]]) for path in paths])  # padded
    mask = (torch.arange(batch.shape[1], device=device) < lengths[:, None]).long()
    logits = target(input_ids=batch, attention_mask=mask, use_cache=False).logits  # each path run from scratch
    want = logits[torch.arange(len(paths), device=device), lengths - 1]
    got_all, want = torch.cat(got).float(), want.float()
    return float((got_all - want).abs().max() / want.abs().max().clamp_min(1e-6))
