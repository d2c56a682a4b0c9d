"""Prompt lookup: the training-free drafter that copies what followed the context's last n-gram earlier on."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specheads.decoding.draft import DraftTree, HiddenStates, Sampling
from specheads.decoding.ngram_index import NgramIndex
from specheads.decoding.tree import chain_parents


class PromptLookupDrafter:
    """Training-free drafter: find the latest earlier occurrence of the context's last n tokens (n from
    ``max_ngram`` down to ``min_ngram``) and propose the tokens that followed it as a chain (Saxena 2023,
    https://github.com/apoorvumang/prompt-lookup-decoding). Deterministic: ``draft_probs`` is None."""

    layer_ids: list[int] = []

    def __init__(self, num_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if num_tokens < 1 or not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need num_tokens >= 1 and 1 <= min_ngram <= max_ngram, got {num_tokens=}, {max_ngram=}")
        self.num_tokens, self.max_ngram, self.min_ngram = num_tokens, max_ngram, min_ngram
        self.layer_ids = []

    def begin(
        self,
        prompt_ids: torch.Tensor,
        hidden_states: HiddenStates | None,
        root: int,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> LookupState:
        index = NgramIndex(self.max_ngram, self.min_ngram)
        index.extend(prompt_ids.view(-1).tolist() + [root])
        return LookupState(index)

    def observe(
        self, state: LookupState, fed_tokens: torch.Tensor, hidden_states: HiddenStates | None, root: int
    ) -> None:
        state.index.extend(fed_tokens.view(-1).tolist()[1:] + [root])  # the old root is already in the context

    def continuation(self, state: LookupState) -> tuple[torch.Tensor, int]:
        """The proposed tokens after the root (possibly none) and the length of the n-gram they matched (0: none);
        ``lookup_match``'s answer, from the incremental index."""
        return state.index.match(self.num_tokens)

    def propose(self, state: LookupState) -> DraftTree:
        tokens = torch.cat([torch.tensor(state.context[-1:]), self.continuation(state)[0]])
        return DraftTree(tokens=tokens, parents=chain_parents(tokens.numel()))


@dataclass
class LookupState:
    index: NgramIndex  # every committed token, ending with the root, and where each n-gram of them last occurred

    @property
    def context(self) -> list[int]:
        return self.index.tokens


def lookup_match(context: torch.Tensor, num_tokens: int, max_ngram: int, min_ngram: int) -> tuple[torch.Tensor, int]:
    """The up to ``num_tokens`` tokens that followed the latest earlier match of the context's last n-gram, and that
    n (the longest from ``max_ngram`` down to ``min_ngram``; 0 and no tokens when nothing matched)."""
    length = context.numel()
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = context.unfold(0, n, 1)[:-1]  # (length - n, n): every n-gram except the tail itself
        hits = torch.nonzero((windows == context[-n:]).all(dim=1)).flatten()
        if hits.numel():
            start = int(hits[-1]) + n
            return context[start : start + num_tokens], n
    return context[:0], 0
