"""Drafter caches after a step equal a fresh run over the committed tokens; the draft model adapts its length."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specheads.decoding.draft import Sampling
from specheads.decoding.draft_model_drafter import DraftModelDrafter
from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.kv_cache import crop_to
from specheads.decoding.prompt_lookup_drafter import PromptLookupDrafter, lookup_match
from specheads.decoding.tree import DynamicTreeConfig
from specheads.heads import DraftModel, EagleConfig, EagleHead

PROMPT = torch.tensor([3, 17, 42, 5, 17, 42, 9, 3, 17])


def _assert_same_cache(ours: DynamicCache, theirs: DynamicCache) -> None:
    assert ours.get_seq_length() == theirs.get_seq_length()
    for a, b in zip(ours.layers, theirs.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_eagle_cache_after_a_step_equals_a_fresh_start(tiny_llama):
    torch.manual_seed(0)
    for version in (1, 3):
        drafter = EagleTreeDrafter(
            EagleHead(EagleConfig(version=version), tiny_llama).eval(), DynamicTreeConfig(3, 2, 5)
        )
        layers = drafter.layer_ids
        hidden = tiny_llama(input_ids=PROMPT.unsqueeze(0), output_hidden_states=layers).hidden_states
        state = drafter.begin(PROMPT, hidden, 11, Sampling(), None)
        tree = drafter.propose(state)
        child = int(torch.nonzero(tree.parents == 0)[0])
        grandchild = int(torch.nonzero(tree.parents == child)[0])
        fed = tree.tokens[[0, child, grandchild]]  # pretend the target accepted root -> child -> grandchild
        sequence = torch.cat([PROMPT, fed])
        full = tiny_llama(input_ids=sequence.unsqueeze(0), output_hidden_states=layers).hidden_states
        rows = tuple(None if h is None else h[:, PROMPT.numel() :] for h in full)
        drafter.observe(state, fed, rows, 23)
        fresh = drafter.begin(sequence, full, 23, Sampling(), None)
        drafter.flush(state), drafter.flush(fresh)  # observe only queues rows; propose would flush them
        _assert_same_cache(state.cache, fresh.cache)
        torch.testing.assert_close(state.logits, fresh.logits, atol=1e-4, rtol=1e-4)
        assert state.cache_len == sequence.numel()
        # observe projects only the last row onto the vocabulary: the same logits as the head's full forward
        next_tokens = torch.cat([sequence[1:], torch.tensor([23])]).unsqueeze(0)
        positions = torch.arange(sequence.numel()).unsqueeze(0)
        _, reference = drafter.head(drafter.head.fuse(full), next_tokens, positions)
        torch.testing.assert_close(state.logits, reference[0, -1], atol=1e-4, rtol=1e-4)
        # steps that skip drafting queue their rows: two observes, then one flush, give the same state
        for flush in (drafter.flush, drafter.propose):  # propose flushes first
            queued = drafter.begin(PROMPT, hidden, 11, Sampling(), None)
            drafter.observe(queued, fed[:2], tuple(None if h is None else h[:, :2] for h in rows), int(fed[2]))
            drafter.observe(queued, fed[2:], tuple(None if h is None else h[:, 2:] for h in rows), 23)
            assert queued.cache.get_seq_length() == 0  # nothing fed yet
            flush(queued)
            assert queued.cache_len == sequence.numel()
            torch.testing.assert_close(queued.logits, fresh.logits, atol=1e-4, rtol=1e-4)
        drafter.flush(queued)  # nothing queued: a no-op
        assert queued.cache_len == sequence.numel()
        crop_to(queued.cache, queued.cache_len)  # drop propose's tree rows
        _assert_same_cache(queued.cache, fresh.cache)


@torch.inference_mode()
def test_draft_model_cache_and_adaptive_length(tiny_llama):
    drafter = DraftModelDrafter(DraftModel.from_target(tiny_llama, 1).eval(), draft_length=3, max_length=4)
    state = drafter.begin(PROMPT, None, 11, Sampling(), None)
    tree = drafter.propose(state)
    assert tree.num_nodes == 4 and tree.parents.tolist() == [-1, 0, 1, 2]
    drafter.observe(state, tree.tokens, None, 7)  # everything accepted: grow
    assert state.draft_length == 4 and state.pending == tree.tokens[-1:].tolist()
    committed = torch.cat([PROMPT, tree.tokens[:-1]])  # the last drafted token was never fed to the draft model
    reference = DynamicCache(config=drafter.model.config)
    drafter.model(input_ids=committed.unsqueeze(0), cache=reference, use_cache=True)
    _assert_same_cache(state.cache, reference)
    tree = drafter.propose(state)
    assert tree.num_nodes == 5 and tree.tokens[0] == 7
    drafter.observe(state, tree.tokens[:1], None, 9)  # rejected at once: shrink
    assert state.draft_length == 3 and state.pending == []
    assert state.cache.get_seq_length() == committed.numel() + 2  # + the pending token and the old root


@torch.inference_mode()
def test_draft_model_cache_when_the_accepted_path_leaves_its_chain(tiny_llama):
    """With a lookup branch grafted on, the target can accept a token the draft model did not draft: only the
    chain rows up to that token stay in the draft cache, and the rest waits to be fed."""
    drafter = DraftModelDrafter(DraftModel.from_target(tiny_llama, 1).eval(), draft_length=3, max_length=4)
    state = drafter.begin(PROMPT, None, 11, Sampling(), None)
    tree = drafter.propose(state)
    first = int(tree.tokens[1])
    other = (first + 1) % 128  # a lookup token beside the chain's first guess
    fed = torch.tensor([11, first, other])  # root, the chain's first token, then the branch
    drafter.observe(state, fed, None, 7)
    assert state.pending == [other] and state.draft_length == 3  # one chain token accepted: neither grow nor shrink
    reference = DynamicCache(config=drafter.model.config)
    drafter.model(input_ids=torch.cat([PROMPT, fed[:2]]).unsqueeze(0), cache=reference, use_cache=True)
    _assert_same_cache(state.cache, reference)


def test_prompt_lookup_finds_latest_match():
    context = torch.tensor([1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3])
    tokens, ngram = lookup_match(context, 2, max_ngram=3, min_ngram=1)
    assert tokens.tolist() == [5, 6] and ngram == 2  # "6 2 3" never occurred before; "2 3" did, latest at 5
    tokens, ngram = lookup_match(torch.tensor([1, 2, 3]), 2, 3, 1)
    assert tokens.tolist() == [] and ngram == 0
    drafter = PromptLookupDrafter(num_tokens=3)
    state = drafter.begin(torch.tensor([4, 5, 6, 7, 4]), None, 5, Sampling(), None)
    tree = drafter.propose(state)
    assert tree.tokens.tolist() == [5, 6, 7, 4] and tree.draft_probs is None
    drafter.observe(state, tree.tokens[:2], None, 8)
    assert state.context == [4, 5, 6, 7, 4, 5, 6, 8]
