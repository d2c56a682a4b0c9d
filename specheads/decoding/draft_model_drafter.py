"""Classic speculative decoding with a small draft LM (Leviathan et al. 2023, https://arxiv.org/abs/2211.17192;
Chen et al. 2023, https://arxiv.org/abs/2302.01318): the draft model extends the root with a chain of
``draft_length`` tokens on its own KV cache, one token per small forward.

Adaptive length (as transformers' assisted generation heuristic): grow by one when the whole chain was accepted,
shrink by one when it was rejected early, within ``[min_length, max_length]``.

The draft cache mirrors the target's: it holds the committed tokens (root excluded). After a step the chain rows
that were accepted are already there in order, so committing is a crop; committed tokens the draft model never
fed (the last drafted token, when everything was accepted) wait in ``pending`` and go in with the next root.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from specheads.decoding.draft import DraftTree, HiddenStates, Sampling, draw_children, root_only_tree
from specheads.decoding.kv_cache import crop_to, new_cache
from specheads.decoding.tree import chain_parents
from specheads.heads import DraftModel


@dataclass
class DraftModelState:
    cache: DynamicCache
    pending: list[int]  # committed tokens not yet fed to the draft model, oldest first
    root: int
    draft_length: int
    sampling: Sampling
    generator: torch.Generator | None
    committed: int = 0  # rows of the draft cache that hold committed tokens
    last_chain: list[int] = field(default_factory=list)  # drafted tokens of the last proposal (root excluded)
    proposed: bool = False  # propose ran since the last observe (False after a plain step: draft backoff)


class DraftModelDrafter:
    """Wraps a ``DraftModel`` head (``head.model`` is a stock causal LM sharing the target tokenizer)."""

    layer_ids: list[int] = []

    def __init__(self, head: DraftModel, draft_length: int = 4, min_length: int = 1, max_length: int = 8) -> None:
        if not 1 <= min_length <= draft_length <= max_length:
            raise ValueError(
                f"need 1 <= min_length <= draft_length <= max_length, got {min_length, draft_length, max_length}"
            )
        self.model = head.model
        self.draft_length, self.min_length, self.max_length = draft_length, min_length, max_length
        self.layer_ids = []
        # positions the draft model has (learned position embeddings, as GPT-2's and OPT's, end there); 0: no limit
        self.max_positions = int(getattr(self.model.config.get_text_config(), "max_position_embeddings", 0) or 0)

    def begin(
        self,
        prompt_ids: torch.Tensor,
        hidden_states: HiddenStates | None,
        root: int,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> DraftModelState:
        cache = new_cache(self.model)  # cropped after each step (a sliding-window model: back to its window)
        return DraftModelState(cache, prompt_ids.view(-1).tolist(), root, self.draft_length, sampling, generator)

    def propose(self, state: DraftModelState) -> DraftTree:
        device = self.model.device
        # The root goes at position p = committed + pending and the k-th drafted token at p + k; the last one is
        # never fed, so a chain of L tokens needs positions up to p + L - 1 of the draft model's own.
        length = state.draft_length
        if self.max_positions:
            length = min(length, self.max_positions - state.committed - len(state.pending))
        if length < 1:  # the root has no position left in the draft model: a plain step (fed next time)
            return root_only_tree(state.root, device)
        feed = torch.tensor(state.pending + [state.root], device=device).unsqueeze(0)  # (1, m)
        chain, q_rows = [state.root], []
        for _ in range(length):
            out = self.model(input_ids=feed, cache=state.cache, use_cache=True, logits_to_keep=1)  # feed may be long
            logits = out.logits[0, -1]  # (V,)
            q = state.sampling.probs(logits)
            token, _ = draw_children(q, 1, state.sampling.greedy, state.generator)
            q_rows.append(q)
            feed = token.view(1, 1)
            chain.append(token)
        state.committed += len(state.pending)
        state.pending = []
        state.proposed = True
        tokens = torch.cat([torch.tensor(chain[:1], device=device), torch.cat(chain[1:])])
        state.last_chain = tokens[1:].tolist()
        draft_probs = None
        if not state.sampling.greedy:
            draft_probs = torch.cat([torch.stack(q_rows), torch.zeros_like(q_rows[0]).unsqueeze(0)])  # (n, V)
        return DraftTree(tokens=tokens, parents=chain_parents(tokens.numel()).to(device), draft_probs=draft_probs)

    def observe(
        self, state: DraftModelState, fed_tokens: torch.Tensor, hidden_states: HiddenStates | None, root: int
    ) -> None:
        fed = fed_tokens.view(-1).tolist()  # old root + accepted chain tokens
        if not state.proposed:  # a plain step: the draft cache holds nothing of it, so feed it next time
            state.pending += fed
            state.root = root
            return
        state.proposed = False
        # The cache holds the old root and the first L - 1 of the L chain tokens beyond the committed rows (L is
        # draft_length, or less at the end of the draft model's positions). Those rows stay valid up to the first
        # accepted token that is not the chain's: with a lookup branch grafted on (LookupBranchDrafter) the
        # accepted path can leave the chain.
        drafted = len(state.last_chain)
        accepted = next((i for i, (a, b) in enumerate(zip(fed[1:], state.last_chain)) if a != b), len(fed) - 1)
        accepted = min(accepted, drafted)  # chain tokens the target accepted
        in_cache = min(1 + accepted, drafted)
        crop_to(state.cache, state.committed + in_cache)
        state.committed += in_cache
        state.pending = fed[in_cache:]
        state.root = root
        if accepted == drafted:
            state.draft_length = min(state.draft_length + 1, self.max_length)
        elif accepted < drafted // 2:
            state.draft_length = max(state.draft_length - 1, self.min_length)
