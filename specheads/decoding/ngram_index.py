"""An incremental n-gram index for prompt lookup: where each n-gram of the committed context last occurred.

Prompt lookup (``PromptLookupDrafter``, and the lookup branch that wraps it) asks each step for the latest earlier
occurrence of the context's last n tokens. Rescanning the context for it costs time proportional to the context,
every step; this index is updated with each committed token (one dictionary write per n-gram length) and answers in
time independent of the context's length, with the same answer as the scan (``prompt_lookup_drafter.lookup_match``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class NgramIndex:
    """The committed tokens, and for each n in ``[min_ngram, max_ngram]`` the start of the latest occurrence of every
    n-gram except the context's own last one (which would always match itself)."""

    def __init__(self, max_ngram: int, min_ngram: int) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self.latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}

    def extend(self, tokens: Iterable[int]) -> None:
        """Append committed tokens; the n-gram that was the context's tail becomes an earlier occurrence."""
        for token in tokens:
            length = len(self.tokens)  # the old tail n-gram ends here
            for n, latest in self.latest.items():
                if length >= n:
                    latest[tuple(self.tokens[length - n :])] = length - n
            self.tokens.append(int(token))

    def match(self, num_tokens: int) -> tuple[torch.Tensor, int]:
        """The up to ``num_tokens`` tokens that followed the latest earlier occurrence of the context's last n-gram,
        and that n (the longest that occurred, from ``max_ngram`` down; 0 and no tokens when none did)."""
        for n in range(min(self.max_ngram, len(self.tokens) - 1), self.min_ngram - 1, -1):
            start = self.latest[n].get(tuple(self.tokens[-n:]))
            if start is not None:
                return torch.tensor(self.tokens[start + n : start + n + num_tokens], dtype=torch.long), n
        return torch.zeros(0, dtype=torch.long), 0
