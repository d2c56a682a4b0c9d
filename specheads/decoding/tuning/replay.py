"""The tau of one-level trees (k guesses for the next token), replayed on the calibration's own output.

The wide calibration tree starts every step after a rejection at some depth, so its depth-1 counts see harder
positions than a small tree does: a one-guess chain also starts steps right after an accepted guess, and easy
positions come in runs (``scripts/calibration_bias.py`` measures the gap). Greedy output does not depend on the
drafter, so one target forward over each calibration sequence gives an EAGLE head's guesses at every position, and
walking them as the verifier does gives exactly the steps a k-guess tree of depth 1 would accept there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


@torch.no_grad()
def guess_ranks(head: Any, target: Any, sequence: torch.Tensor, prompt_len: int, max_guesses: int) -> list[int]:
    """Where the target's token ranks among the head's top ``max_guesses`` guesses for it (``max_guesses`` where it
    is not among them), at every output position a step can guess: one prompt's ids followed by the target's greedy
    output (``sequence``), the first output token being the prefill's."""
    x = sequence.view(1, -1).to(target.device)
    if x.shape[1] < prompt_len + 2:
        return []  # no guessed position
    features = head.fuse(target(x, output_hidden_states=True).hidden_states)
    positions = torch.arange(x.shape[1] - 1, device=x.device)[None]
    _, logits = head(features[:, :-1], x[:, 1:], positions)  # reads f_t and x_{t+1}, guesses x_{t+2}
    ranked = head.draft_to_target(logits[0].topk(max_guesses, dim=-1).indices)  # (T-1, k)
    # the prefill commits x_P; the first step guesses x_{P+1}, from row P-1
    return [_rank_of(ranked[j - 2], int(x[0, j])) for j in range(prompt_len + 1, x.shape[1])]


def walk_steps(ranks: Sequence[int], guesses: int) -> list[int]:
    """Accepted guesses per step (0 or 1) of a depth-1 tree of ``guesses`` siblings, walked over ``guess_ranks`` as
    the verifier does: an accepted guess also commits the target's next token, which no guess was made for."""
    steps, j = [], 0
    while j < len(ranks):
        steps.append(int(ranks[j] < guesses))
        j += 2 if steps[-1] else 1  # an accepted guess and the target's next token, or the target's correction
    return steps


def one_level_steps(
    head: Any, target: Any, sequence: torch.Tensor, prompt_len: int, max_guesses: int
) -> dict[int, list[int]]:
    """``{k: accepted guesses per step (0 or 1)}`` of a depth-1 tree of k guesses, for k = 1..max_guesses, replayed on
    one prompt's ids followed by the target's greedy output (``sequence``)."""
    ranks = guess_ranks(head, target, sequence, prompt_len, max_guesses)
    return {k: walk_steps(ranks, k) for k in range(1, max_guesses + 1)}


def one_level_taus(
    head: Any, target: Any, sequences: Sequence[torch.Tensor], prompt_lengths: Sequence[int], max_guesses: int
) -> dict[int, float]:
    """``{k: tau}`` for k = 1..max_guesses sibling guesses at depth 1, over every (prompt + output) sequence."""
    accepted, steps = [0] * max_guesses, [0] * max_guesses
    for sequence, prompt_len in zip(sequences, prompt_lengths, strict=True):
        for k, walk in one_level_steps(head, target, sequence, prompt_len, max_guesses).items():
            accepted[k - 1] += sum(walk)
            steps[k - 1] += len(walk)
    return {k: 1 + accepted[k - 1] / steps[k - 1] for k in range(1, max_guesses + 1) if steps[k - 1]}


def _rank_of(guesses: torch.Tensor, token: int) -> int:
    found = (guesses == token).nonzero()
    return int(found[0, 0]) if found.numel() else guesses.numel()
