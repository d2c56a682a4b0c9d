"""Tree verification equals each node's sequential path; committing the accepted path equals a sequential run."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from specheads.decoding.kv_cache import commit_path
from specheads.decoding.tree import compile_tree
from specheads.decoding.verify import select_rows, verify_tree

PARENTS = [-1, 0, 0, 1, 1, 2, 3]  # the hand-built tree of test_tree.py


def _prefilled(model, prefix: torch.Tensor) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    model(input_ids=prefix.unsqueeze(0), cache=cache, use_cache=True)
    return cache


def _path_to(node: int, parents: list[int]) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def assert_same_and_continues_alike(model, cache: DynamicCache, reference: DynamicCache) -> None:
    """The committed cache holds a sequential run's entries, layer by layer, and continues exactly like it."""
    for ours, theirs in zip(cache.layers, reference.layers, strict=True):
        torch.testing.assert_close(ours.keys, theirs.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.values, theirs.values, atol=1e-5, rtol=1e-5)
    nxt = torch.tensor([[5]])
    ours = model(input_ids=nxt, cache=cache, use_cache=True).logits
    theirs = model(input_ids=nxt, cache=reference, use_cache=True).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_tree_logits_equal_sequential_paths(tiny_llama):
    model = tiny_llama
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 128, (9,), generator=generator)
    tokens = torch.randint(0, 128, (len(PARENTS),), generator=generator)
    cache = _prefilled(model, prefix)
    layer = model.config.num_hidden_layers
    verification = verify_tree(model, cache, tokens, torch.tensor(PARENTS), layer_ids=[layer])
    assert verification.logits.shape == (len(PARENTS), 128)
    assert cache.get_seq_length() == 9 + len(PARENTS)
    hidden = verification.hidden_states[layer]  # (1, n, H), after the final norm
    torch.testing.assert_close(model.lm_head(hidden)[0], verification.logits, atol=1e-5, rtol=1e-5)
    for node in range(len(PARENTS)):
        sequence = torch.cat([prefix, tokens[_path_to(node, PARENTS)]])
        expected = model(input_ids=sequence.unsqueeze(0)).logits[0, -1]
        torch.testing.assert_close(verification.logits[node], expected, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_commit_equals_sequential_run(tiny_llama):
    model = tiny_llama
    generator = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 128, (6,), generator=generator)
    tokens = torch.randint(0, 128, (len(PARENTS),), generator=generator)
    path = [0, 1, 3, 6]
    cache = _prefilled(model, prefix)
    verify_tree(model, cache, tokens, torch.tensor(PARENTS))
    commit_path(cache, prefix_len=6, path=path)
    reference = _prefilled(model, torch.cat([prefix, tokens[path]]))
    assert cache.get_seq_length() == reference.get_seq_length() == 6 + len(path)
    assert_same_and_continues_alike(model, cache, reference)


@torch.inference_mode()
def test_commit_root_only_and_select_rows(tiny_llama):
    cache = _prefilled(tiny_llama, torch.arange(4))
    verification = verify_tree(tiny_llama, cache, torch.tensor([7, 8, 9]), torch.tensor([-1, 0, 0]), layer_ids=[0])
    commit_path(cache, 4, [0])
    assert cache.get_seq_length() == 5
    rows = select_rows(verification.hidden_states, torch.tensor([0, 2]))
    assert rows[0].shape == (1, 2, 64) and all(h is None for h in rows[1:])


@pytest.mark.slow
@torch.inference_mode()
def test_verify_on_smollm2_matches_sequential(smollm2):
    """The real target (30 layers, GQA) on a short chat prompt: every node of a small tree matches its path."""
    model, tokenizer = smollm2
    prefix = tokenizer("The capital of France is", return_tensors="pt").input_ids[0]
    tokens = tokenizer(" Paris. It is", return_tensors="pt").input_ids[0][:4]
    parents = [-1, 0, 0, 1]
    tokens = torch.cat([tokens[:1], tokens[1:2], tokens[2:3], tokens[3:4]])
    cache = _prefilled(model, prefix)
    tree = compile_tree(parents)
    verification = verify_tree(model, cache, tokens, tree.parents, ancestors=tree.ancestors, depths=tree.depths)
    for node in range(len(parents)):
        sequence = torch.cat([prefix, tokens[_path_to(node, parents)]])
        expected = model(input_ids=sequence.unsqueeze(0)).logits[0, -1]
        torch.testing.assert_close(verification.logits[node], expected, atol=2e-3, rtol=1e-3)


@torch.inference_mode()
def test_a_sliding_window_target_verifies_and_commits_within_its_window():
    """Gemma2 (sliding and full layers, window 8) past its window: each node's logits are its sequential path's, and
    a committed branch leaves the cache exactly as transformers' own after a sequential run: the sliding layers hold
    their last W-1 keys, the full layers every key, and both continue alike."""
    from specheads.decoding.kv_cache import new_cache, window_start
    from specheads.decoding.verify import attention_layout
    from tests.tiny_models import tiny_family

    model = tiny_family("gemma2", sliding_window=8, head_dim=16, query_pre_attn_scalar=16)
    generator = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, 128, (11,), generator=generator)
    tokens = torch.randint(0, 128, (len(PARENTS),), generator=generator)
    cache = new_cache(model)
    model(input_ids=prefix.unsqueeze(0), cache=cache, use_cache=True)
    cache.crop(0)
    assert window_start(cache) == 11 - 7
    verification = verify_tree(model, cache, tokens, torch.tensor(PARENTS), layout=attention_layout(model))
    for node in range(len(PARENTS)):
        sequence = torch.cat([prefix, tokens[_path_to(node, PARENTS)]])
        expected = model(input_ids=sequence.unsqueeze(0)).logits[0, -1]
        torch.testing.assert_close(verification.logits[node], expected, atol=1e-4, rtol=1e-4)
    path = [0, 2, 5]  # a branch that is not nodes 0..2
    commit_path(cache, prefix_len=11, path=path)
    reference = _prefilled(model, torch.cat([prefix, tokens[path]]))  # transformers' cache: sliding layers keep W-1
    assert cache.get_seq_length() == reference.get_seq_length() == 14 and window_start(cache) == 14 - 7
    kinds = {ours.keys.shape[-2] for ours in cache.layers}
    assert kinds == {7, 14}  # sliding layers their window, full layers everything
    assert_same_and_continues_alike(model, cache, reference)
