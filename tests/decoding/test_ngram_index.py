"""The incremental n-gram index proposes exactly what the full rescan (``lookup_match``) does, at every step."""

from __future__ import annotations

import pytest
import torch

from specheads.decoding.draft import Sampling
from specheads.decoding.lookup_branch import LookupBranchDrafter
from specheads.decoding.ngram_index import NgramIndex
from specheads.decoding.prompt_lookup_drafter import PromptLookupDrafter, lookup_match


@pytest.mark.parametrize(("vocab", "max_ngram", "min_ngram", "num_tokens"), [(3, 3, 1, 4), (5, 3, 2, 5), (8, 4, 1, 2)])
def test_index_matches_the_rescan_on_every_prefix(vocab, max_ngram, min_ngram, num_tokens):
    generator = torch.Generator().manual_seed(vocab)
    for _ in range(20):
        sequence = torch.randint(
            0, vocab, (int(torch.randint(1, 120, (1,), generator=generator)),), generator=generator
        )
        index = NgramIndex(max_ngram, min_ngram)
        for length in range(1, sequence.numel() + 1):
            index.extend(sequence[length - 1 : length].tolist())
            tokens, ngram = index.match(num_tokens)
            expected, expected_ngram = lookup_match(sequence[:length], num_tokens, max_ngram, min_ngram)
            assert (tokens.tolist(), ngram) == (expected.tolist(), expected_ngram), (sequence[:length], length)


def test_the_drafters_propose_what_the_rescan_does_as_tokens_are_committed():
    """Committed in uneven steps (the old root first, as the generator feeds them), as the drafter and the lookup
    branch see a request."""
    generator = torch.Generator().manual_seed(0)
    sequence = torch.randint(0, 6, (300,), generator=generator).tolist()
    drafter = PromptLookupDrafter(num_tokens=5, max_ngram=3, min_ngram=2)
    state = drafter.begin(torch.tensor(sequence[:40]), None, sequence[40], Sampling(), None)
    position = 40  # the root's index in the sequence
    while position < len(sequence) - 1:
        tree = drafter.propose(state)
        expected, _ = lookup_match(torch.tensor(sequence[: position + 1]), 5, 3, 2)
        assert tree.tokens.tolist() == [sequence[position], *expected.tolist()]
        step = int(torch.randint(1, 5, (1,), generator=generator))
        new_root = min(position + step, len(sequence) - 1)
        drafter.observe(state, torch.tensor(sequence[position:new_root]), None, sequence[new_root])
        position = new_root
    assert state.context == sequence
    branch = LookupBranchDrafter(drafter)  # the branch reads the same index
    assert (
        branch.lookup.continuation(
            branch.lookup.begin(torch.tensor(sequence[:-1]), None, sequence[-1], Sampling(), None)
        )[0].tolist()
        == lookup_match(torch.tensor(sequence), 5, 3, 2)[0].tolist()
    )
