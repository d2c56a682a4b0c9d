"""The verifier's walk over replayed guess ranks (``tuning.replay.walk_steps``), on rigged ranks."""

from __future__ import annotations

import random

import pytest

from specheads.decoding.tuning.replay import walk_steps


@pytest.mark.parametrize(
    ("ranks", "guesses", "expected"),
    [
        # an accepted guess commits the next token too, so the position after it is never guessed
        ([0, 5, 1, 0, 3], 1, [1, 0, 1]),
        ([0, 5, 1, 0, 3], 2, [1, 1, 0]),
        ([0, 5, 1, 0, 3], 6, [1, 1, 1]),
        ([4, 4, 4], 1, [0, 0, 0]),
        ([], 3, []),
    ],
)
def test_walk_accepts_a_rank_below_the_guess_count_and_skips_the_token_after_it(ranks, guesses, expected):
    assert walk_steps(ranks, guesses) == expected


def test_a_wider_tree_never_accepts_fewer_guesses():
    """What lets the auto tree compare k = 1..4 on one replay: the walks differ, the accepted counts only grow."""
    rng = random.Random(0)
    for _ in range(500):
        ranks = [rng.randrange(5) for _ in range(rng.randrange(16))]
        accepted = [sum(walk_steps(ranks, k)) for k in range(1, 6)]
        assert accepted == sorted(accepted), ranks
