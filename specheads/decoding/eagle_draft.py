"""EAGLE-1 / EAGLE-3 drafting: the drafter runs autoregressively on its own KV cache, from the features the target
already returned in the previous verification (no extra target pass), and grows a dynamic tree (EAGLE-2,
https://arxiv.org/abs/2406.16858) or a chain (``DynamicTreeConfig(depth=D, top_k=1, total_tokens=D)``).

Drafter positions (``EAGLE_TOKEN_OFFSET``): row t reads the target feature at t and the token at t + 1 and
predicts token t + 2. The drafter cache holds exactly one row per committed target position (the root excluded):
tree rows appended while drafting are dropped in ``observe``, and the accepted tokens are re-fed with the
*target's* features, which are better than the drafter's own guesses and cost one small drafter forward.

That forward is deferred to the next ``propose``: steps that do not draft with the head (draft backoff, a prompt-
lookup branch proposing alone) cost it nothing, and their rows are fed together when the head drafts again.

With a ``DrafterWindow`` the drafter cache keeps only the first rows (attention sinks) and the most recent ones, as
LongSpec's drafter does (https://arxiv.org/abs/2502.17421), so its memory and time per step stop growing with the
context. Kept rows keep their true (rotary) positions. Only what the drafter sees changes: the target verifies with
its full cache, so the output is the same, and only acceptance can move.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from specheads.decoding.draft import DraftTree, HiddenStates, Sampling, draw_children
from specheads.decoding.kv_cache import crop_to
from specheads.decoding.tree import DynamicTreeConfig, reindex_parents, select_dynamic_nodes
from specheads.heads import EagleHead


@dataclass(frozen=True)
class DrafterWindow:
    """A bounded drafter cache: the first ``sinks`` committed rows and the ``recent`` latest ones. The cache holds at
    most ``sinks + recent`` committed rows between steps (plus the current step's tree rows while drafting). Rows
    are fed in chunks of at most ``recent``, each row seeing the sinks, the ``recent`` rows before its chunk and its
    chunk's earlier rows, so neither a long prompt nor a step reads more than ``sinks + 2 * recent`` rows."""

    sinks: int = 4
    recent: int = 1024

    def __post_init__(self) -> None:
        if self.sinks < 0 or self.recent < 1:
            raise ValueError(
                f"a drafter window keeps sinks >= 0 first rows and recent >= 1 latest rows; got sinks={self.sinks}, "
                f"recent={self.recent}"
            )


@dataclass
class EagleState:
    cache: DynamicCache  # drafter KV cache: one row per committed target position (root excluded)
    hidden: torch.Tensor  # (1, 1, H) drafter output at the last committed row: the root's predicted feature
    logits: torch.Tensor  # (Vd,) drafter logits there: the distribution of the root's children
    root: int
    sampling: Sampling
    generator: torch.Generator | None
    cache_len: int = 0  # committed rows (= the next row's position); the cache may hold more tree rows while drafting
    evicted: int = 0  # committed rows a ``DrafterWindow`` dropped from the cache: it holds cache_len - evicted
    pending_tokens: list[torch.Tensor] = field(default_factory=list)  # fed tokens not yet run through the drafter
    pending_features: list[torch.Tensor] = field(default_factory=list)  # (1, m, H) fused target features of those


class EagleTreeDrafter:
    """Wraps an ``EagleHead`` head (v1 or v3). Token ids in the tree are target ids (mapped with ``d2t``)."""

    def __init__(
        self, head: EagleHead, tree: DynamicTreeConfig | None = None, window: DrafterWindow | None = None
    ) -> None:
        """``window``: keep only sink and recent rows in the drafter's cache (None: every committed row)."""
        if tree is not None and not isinstance(tree, DynamicTreeConfig):  # else an AttributeError at the first step
            raise TypeError(
                f"tree must be a DynamicTreeConfig, got {tree!r}; pass DynamicTreeConfig(depth, top_k, total_tokens), "
                "or build_drafter(head, 'dynamic:D,K,N') for a setting string"
            )
        self.head = head
        self.tree = tree or DynamicTreeConfig()
        self.window = window
        self.layer_ids = list(head.layer_ids)
        self.target_vocab_size = head.config.target.vocab_size

    def begin(
        self,
        prompt_ids: torch.Tensor,
        hidden_states: HiddenStates | None,
        root: int,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> EagleState:
        empty = torch.empty(0)
        state = EagleState(self.head.new_cache(), empty, empty, root, sampling, generator)
        self.observe(state, prompt_ids.view(-1), hidden_states, root)
        return state

    def observe(self, state: EagleState, fed_tokens: torch.Tensor, hidden_states: HiddenStates, root: int) -> None:
        """Queue the newly committed rows (target feature at each fed position + the token after it); ``flush``
        feeds them."""
        crop_to(state.cache, state.cache_len - state.evicted)  # drop the tree rows appended while drafting
        state.pending_features.append(self.head.fuse(hidden_states))  # (1, m, H)
        state.pending_tokens.append(fed_tokens.view(-1))
        state.root = root

    def flush(self, state: EagleState) -> None:
        """Run the queued rows through the drafter in one forward; afterwards ``state.hidden``/``logits`` describe
        the root. Feeding several observed steps at once equals feeding them one by one (causal rows)."""
        if not state.pending_tokens:
            return
        features = torch.cat(state.pending_features, dim=1)  # (1, m, H)
        fed = torch.cat(state.pending_tokens).to(features.device)
        state.pending_features, state.pending_tokens = [], []
        next_tokens = torch.cat([fed[1:], fed.new_tensor([state.root])]).unsqueeze(0)  # (1, m)
        chunk = fed.numel() if self.window is None else self.window.recent
        for start in range(0, fed.numel(), chunk):
            end = min(start + chunk, fed.numel())
            committed = state.cache_len
            positions = torch.arange(committed, committed + end - start, device=features.device).unsqueeze(0)
            # Only the last row's logits are used (the root's children): projecting every row onto the vocabulary
            # would dominate the cost of a long prompt.
            hidden, _ = self.head(
                features[:, start:end], next_tokens[:, start:end], positions, cache=state.cache, with_logits=False
            )
            state.cache_len = committed + end - start
            self._evict(state)
        state.hidden = hidden[:, -1:]
        state.logits = self.head.logits(state.hidden)[0, -1]

    def _evict(self, state: EagleState) -> None:
        """With a window: drop the committed rows between the sinks and the recent ones from every cache layer."""
        window = self.window
        held = state.cache_len - state.evicted
        if window is None or held <= window.sinks + window.recent:
            return
        for layer in state.cache.layers:
            if layer.is_initialized and layer.keys is not None:
                layer.keys = torch.cat([layer.keys[:, :, : window.sinks], layer.keys[:, :, -window.recent :]], dim=2)
                layer.values = torch.cat(
                    [layer.values[:, :, : window.sinks], layer.values[:, :, -window.recent :]], dim=2
                )
        state.evicted += held - window.sinks - window.recent

    def propose(self, state: EagleState) -> DraftTree:
        self.flush(state)
        cfg, sampling, head = self.tree, state.sampling, self.head
        device = state.logits.device
        prefix = state.cache_len  # the next row's position
        held = state.cache_len - state.evicted  # committed rows in the cache, which every tree row sees
        # Candidates in creation order (root first): tokens, parents, cumulative draft log-prob scores.
        tokens, parents, scores = [torch.tensor([state.root], device=device)], [torch.tensor([-1], device=device)], []
        scores.append(torch.zeros(1, device=device))
        q_rows = {}  # candidate index -> q over the draft vocabulary its children were drawn from
        # 1. depth 1: children of the root, from the logits the last observe already computed.
        q = sampling.probs(state.logits)  # (Vd,)
        ids, child_scores = draw_children(q, cfg.top_k, sampling.greedy, state.generator)
        q_rows[0] = q
        tokens.append(head.draft_to_target(ids))
        parents.append(torch.zeros_like(ids))
        scores.append(child_scores)
        level = torch.arange(1, 1 + ids.numel(), device=device)  # candidate indices of the newest level
        parent_hidden = state.hidden.expand(1, ids.numel(), -1)  # (1, k, H): features of the newest level's parents
        slot_of: dict[int, int] = {}
        visible = torch.zeros(0, 0, dtype=torch.bool, device=device)  # (slots, slots): tree rows in the drafter cache
        count = 1 + ids.numel()
        for depth in range(2, cfg.depth + 1):
            # 2. expand the top_k most confident nodes of the newest level with one drafter forward.
            level_scores = torch.cat(scores)[level]
            pick = torch.topk(level_scores, min(cfg.top_k, level.numel())).indices
            nodes = level[pick]  # (k',) candidate indices
            all_tokens, all_parents = torch.cat(tokens), torch.cat(parents)
            visible = self._extend_visibility(visible, slot_of, nodes.tolist(), all_parents.tolist())
            new_rows = visible[-nodes.numel() :]  # (k', slots)
            mask = _drafter_mask(new_rows, held, state.hidden.dtype)
            positions = torch.full((1, nodes.numel()), prefix + depth - 2, device=device)
            hidden, logits = head(
                parent_hidden[:, pick],
                all_tokens[nodes].unsqueeze(0),
                positions,
                attention_mask=mask,
                cache=state.cache,
            )
            q = sampling.probs(logits[0])  # (k', Vd)
            ids, child_scores = draw_children(q, cfg.top_k, sampling.greedy, state.generator)  # (k', k)
            for row, node in enumerate(nodes.tolist()):
                q_rows[node] = q[row]
            cumulative = torch.cat(scores)[nodes].unsqueeze(1) + child_scores  # (k', k)
            tokens.append(head.draft_to_target(ids).flatten())
            parents.append(nodes.unsqueeze(1).expand_as(ids).flatten())
            scores.append(cumulative.flatten())
            level = torch.arange(count, count + ids.numel(), device=device)
            parent_hidden = hidden.repeat_interleave(ids.shape[1], dim=1)  # (1, k'k, H)
            count += ids.numel()
        # 3. keep the total_tokens best candidates (parents always kept), in creation order.
        all_tokens, all_parents, all_scores = torch.cat(tokens), torch.cat(parents), torch.cat(scores)
        kept = select_dynamic_nodes(all_scores, all_parents, cfg.total_tokens)
        draft_probs = None if sampling.greedy else self._draft_probs(q_rows, kept)
        return DraftTree(tokens=all_tokens[kept], parents=reindex_parents(all_parents, kept), draft_probs=draft_probs)

    @staticmethod
    def _extend_visibility(
        visible: torch.Tensor, slot_of: dict[int, int], nodes: list[int], parents: list[int]
    ) -> torch.Tensor:
        """Give each newly forwarded node a drafter-cache slot that sees its ancestors' slots and itself."""
        old = visible.shape[0]
        grown = torch.zeros(old + len(nodes), old + len(nodes), dtype=torch.bool, device=visible.device)
        grown[:old, :old] = visible
        for offset, node in enumerate(nodes):
            slot = old + offset
            parent = parents[node]
            if parent in slot_of:  # the root has no slot: its row is already in the committed prefix
                grown[slot] = grown[slot_of[parent]]
            grown[slot, slot] = True
            slot_of[node] = slot
        return grown

    def _draft_probs(self, q_rows: dict[int, torch.Tensor], kept: torch.Tensor) -> torch.Tensor:
        """(n, V) q rows in the target vocabulary for the kept nodes (zeros for nodes that were not expanded)."""
        any_q = next(iter(q_rows.values()))
        out = torch.zeros(kept.numel(), self.target_vocab_size, device=any_q.device)
        for row, node in enumerate(kept.tolist()):
            if node in q_rows:
                out[row, self.head.d2t if self.head.version == 3 else slice(None)] = q_rows[node]
        return out


def with_drafter_window(drafter: Any, window: DrafterWindow) -> Any:
    """``drafter`` with its EAGLE drafter's cache bounded by ``window``; a wrapper (a lookup branch, whose ``inner``
    drafter drafts the tree) gets a copy with a windowed inner drafter."""
    if isinstance(drafter, EagleTreeDrafter):
        return EagleTreeDrafter(drafter.head, drafter.tree, window)
    inner = getattr(drafter, "inner", None)
    if inner is None:
        raise ValueError(
            f"a drafter window bounds an EAGLE drafter's own cache; got {type(drafter).__name__}: use an EAGLE head, "
            "or drop the window"
        )
    wrapped = copy.copy(drafter)
    wrapped.inner = with_drafter_window(inner, window)
    return wrapped


def _drafter_mask(rows: torch.Tensor, prefix: int, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, k, prefix + slots) additive mask: all committed rows plus the visible tree slots."""
    k, slots = rows.shape
    mask = torch.zeros(k, prefix + slots, dtype=dtype, device=rows.device)
    mask[:, prefix:] = torch.where(rows, 0.0, torch.finfo(dtype).min).to(dtype)
    return mask.view(1, 1, k, prefix + slots)
