"""Drafters draft what their heads say: each tree node against a step-by-step reference, the EAGLE drafter's state
after accepted paths against a fresh start, and Medusa heads against the training convention.

Losslessness alone cannot see any of this: a drafter that drafts the wrong tokens only gets fewer of them accepted,
and random heads get none accepted anyway. So these tests compare the drafts themselves, on heads whose random
weights are scaled up (attention far from uniform, heads that disagree) or fitted to the target's own output.
"""

from __future__ import annotations

import copy

import pytest
import torch

from specheads.decoding.draft import Sampling
from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.lookup_branch import LookupBranchDrafter
from specheads.decoding.medusa_drafter import MedusaDrafter
from specheads.decoding.tree import DynamicTreeConfig, chain_tree, static_tree
from specheads.heads import EAGLE_TOKEN_OFFSET, EagleConfig, EagleHead, MedusaConfig, MedusaHeads, predicted_offset
from specheads.training.losses import medusa_loss, ratios
from tests.decoding.helpers import TinyTokenizer
from tests.decoding.planted import PlantedDrafter, greedy_continuation
from tests.decoding.test_generator import PROMPT, tiny_drafters

EAGLE_HEADS = {
    "eagle1": dict(version=1),
    "eagle3": dict(version=3),
    "eagle3-d2t": dict(version=3, draft_vocab_size=48),
}


@pytest.fixture
def tiny_llama(tiny_llama):
    """The tiny random Llama without an EOS token, so runs last exactly max_new_tokens."""
    tiny_llama.generation_config.eos_token_id = None
    return tiny_llama


def scaled_eagle_head(target, name: str) -> EagleHead:
    """A random EAGLE head with weights large enough that positions and masks change its drafts."""
    torch.manual_seed(1)
    d2t = torch.randperm(128)[:48].sort().values if name == "eagle3-d2t" else None
    head = EagleHead(EagleConfig(**EAGLE_HEADS[name]), target, d2t=d2t).eval()
    with torch.no_grad():
        for param in head.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    return head


def path_to(parents: list[int], node: int) -> list[int]:
    path = [node]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


@torch.inference_mode()
def sequential_q(drafter: EagleTreeDrafter, committed, path_tokens: list[int], sampling: Sampling) -> torch.Tensor:
    """q (draft vocabulary) after drafting ``path_tokens`` one at a time on a copy of the committed drafter cache,
    each row fed the previous row's output feature, at the position ``EAGLE_TOKEN_OFFSET`` gives it."""
    head = drafter.head
    cache = copy.deepcopy(committed.cache)
    hidden, logits = committed.hidden, committed.logits
    for depth, token in enumerate(path_tokens, 1):
        token_draft_id = int(head.target_to_draft(torch.tensor(token)))
        assert token_draft_id >= 0, f"tree token {token} is outside the draft vocabulary"
        # the node at depth d sits at target position cache_len + d; its drafter row reads that token
        position = torch.tensor([[committed.cache_len + depth - EAGLE_TOKEN_OFFSET]])
        hidden, step_logits = head(hidden, torch.tensor([[token]]), position, cache=cache)
        logits = step_logits[0, -1]
    return sampling.probs(logits)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0)], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", list(EAGLE_HEADS))
@torch.inference_mode()
def test_every_eagle_tree_node_drafts_as_a_sequential_run_along_its_path(tiny_llama, name, sampling):
    """The batched tree forward (tree mask over the drafter cache, one position per depth) must give each node the
    q a plain sequential run along its root path gives: greedy trees take the top-k of it as the node's children,
    sampled trees carry it as the node's draft_probs row (in the target vocabulary)."""
    config = DynamicTreeConfig(depth=4, top_k=3, total_tokens=30)  # keeps all 30 candidates: every expanded node
    drafter = EagleTreeDrafter(scaled_eagle_head(tiny_llama, name), config)
    head = drafter.head
    hidden = tiny_llama(input_ids=PROMPT.unsqueeze(0), output_hidden_states=drafter.layer_ids).hidden_states
    root = int(head.draft_to_target(torch.tensor(5)))  # a token of the draft vocabulary
    state = drafter.begin(PROMPT, hidden, root, sampling, torch.Generator().manual_seed(0))
    committed = copy.deepcopy(state)
    drafter.flush(committed)
    tree = drafter.propose(state)
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    assert tree.num_nodes == 31
    children = [[c for c in range(1, len(parents)) if parents[c] == node] for node in range(len(parents))]
    expanded = [node for node in range(len(parents)) if children[node]]
    depths = [len(path_to(parents, node)) - 1 for node in range(len(parents))]
    assert sorted({depths[node] for node in expanded}) == [0, 1, 2, 3]  # depth-3 rows see two tree ancestors
    for node in expanded:
        q = sequential_q(drafter, committed, [tokens[n] for n in path_to(parents, node)[1:]], sampling)  # (Vd,)
        if sampling.greedy:
            top = head.draft_to_target(torch.topk(q, config.top_k).indices).tolist()
            assert [tokens[c] for c in children[node]] == top, f"children of node {node} (depth {depths[node]})"
        else:
            expected = torch.zeros(128)
            expected[head.d2t if head.version == 3 else slice(None)] = q
            torch.testing.assert_close(tree.draft_probs[node], expected, atol=1e-5, rtol=1e-4)
            assert all(q[head.target_to_draft(torch.tensor(tokens[c]))] > 0 for c in children[node])


def eagle_state(drafter, state):
    """The EAGLE drafter and its state inside a planted drafter (possibly with a lookup branch around EAGLE)."""
    inner, inner_state = drafter.inner, state.inner
    if isinstance(inner, LookupBranchDrafter):
        inner, inner_state = inner.inner, inner_state.inner
    return inner, inner_state


@pytest.mark.parametrize("name", ["eagle1", "eagle3", "eagle3-d2t", "eagle3+lookup", "eagle1+lookup-solo"])
@torch.inference_mode()
def test_eagle_state_after_accepted_paths_equals_a_fresh_start(tiny_llama, name):
    """After steps that accept paths off the tree's first branch, the EAGLE drafter must hold exactly the rows a
    fresh start on the committed sequence builds: the target's features of the accepted nodes, not of other rows."""
    continuation = greedy_continuation(tiny_llama, PROMPT, 24)
    planted = PlantedDrafter(tiny_drafters(tiny_llama)[name], continuation)
    result = SpeculativeGenerator(tiny_llama, TinyTokenizer(), planted).generate(PROMPT, max_new_tokens=16)
    assert result.token_ids == continuation[:16]
    (state,) = planted.states
    assert max(result.stats.accepted_lengths) >= 2 and not all(state.contiguous)
    drafter, ours = eagle_state(planted, state)
    sequence = torch.tensor(state.prompt + state.fed)
    hidden = tiny_llama(input_ids=sequence.unsqueeze(0), output_hidden_states=drafter.layer_ids).hidden_states
    fresh = drafter.begin(sequence, hidden, state.root, Sampling(), None)
    drafter.flush(ours), drafter.flush(fresh)
    assert ours.cache_len == fresh.cache_len == sequence.numel()
    for a, b in zip(ours.cache.layers, fresh.cache.layers):
        assert a.keys.shape == b.keys.shape
        torch.testing.assert_close(a.keys, b.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a.values, b.values, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.logits, fresh.logits, atol=1e-4, rtol=1e-4)


def scaled_medusa_heads(target, num_heads: int) -> MedusaHeads:
    """Random Medusa heads that disagree with each other (untrained ones all equal the target's lm_head)."""
    torch.manual_seed(2)
    heads = MedusaHeads(MedusaConfig(num_heads=num_heads), target).eval()
    with torch.no_grad():
        for block in heads.blocks:
            block[0].linear.weight.normal_(std=0.5)
    return heads


@torch.inference_mode()
def test_medusa_node_at_depth_d_and_rank_r_is_head_d_rank_r_guess(tiny_llama):
    """Tree choice (i0, ..., i_{d-1}) is head d's i_{d-1}-th best guess at the last fed position."""
    heads = scaled_medusa_heads(tiny_llama, 3)
    tree = static_tree([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0], [1, 0, 1]])
    drafter = MedusaDrafter(heads, tree)
    hidden = tiny_llama(input_ids=PROMPT.unsqueeze(0), output_hidden_states=drafter.layer_ids).hidden_states
    draft = drafter.propose(drafter.begin(PROMPT, hidden, 11, Sampling(), None))
    logits = heads(hidden[drafter.layer_ids[0]][:, -1:])[:, 0, 0]  # (K, V): logits[k - 1] is head k
    assert len({tuple(torch.topk(row, 3).indices.tolist()) for row in logits}) == 3  # the heads disagree
    assert draft.tokens[0] == 11
    for node, choice in enumerate(tree.choices, 1):  # node i is choices[i - 1] (sorted by depth, then path)
        head_k = len(choice)
        assert draft.tokens[node] == torch.topk(logits[head_k - 1], 3).indices[choice[-1]], f"choice {choice}"


@torch.inference_mode()
def test_medusa_heads_with_zero_training_loss_draft_the_continuation_in_full(tiny_llama):
    """Heads fitted (least squares) so that ``medusa_loss`` scores them top-1 on every position of the target's
    greedy output draft that output: every step of a chain accepts all its drafts. Ties the training convention
    (head k at t predicts t + predicted_offset(k)) to the decoding one (head k proposes depth k below the root)."""
    num_heads, max_new_tokens = 3, 20
    continuation = greedy_continuation(tiny_llama, PROMPT, max_new_tokens + num_heads + 2)
    sequence = torch.cat([PROMPT, torch.tensor(continuation)]).unsqueeze(0)  # (1, T)
    heads = MedusaHeads(MedusaConfig(num_heads=num_heads), tiny_llama).eval()  # zero blocks: features = hidden
    hidden = tiny_llama(input_ids=sequence, output_hidden_states=heads.layer_ids).hidden_states[heads.layer_ids[0]]
    length = sequence.shape[1]
    assert length <= hidden.shape[-1]  # one hidden state per position, linearly independent: an exact fit
    for k in range(1, num_heads + 1):
        rows = length - predicted_offset(k)
        labels = sequence[0, predicted_offset(k) :]  # head k at t predicts token t + predicted_offset(k)
        wanted = 20.0 * torch.nn.functional.one_hot(labels, 128).float()  # (rows, V)
        weight = torch.linalg.lstsq(hidden[0, :rows], wanted).solution  # (H, V)
        heads.lm_heads[k - 1].weight.copy_(weight.T)
    loss_mask = torch.ones_like(sequence)
    _, stats = medusa_loss(heads(hidden), sequence, loss_mask, decay=0.8)
    assert all(ratios(stats)[f"top1/head{k}"] == 1.0 for k in range(1, num_heads + 1))
    drafter = MedusaDrafter(heads, chain_tree(num_heads))
    result = SpeculativeGenerator(tiny_llama, TinyTokenizer(), drafter).generate(PROMPT, max_new_tokens=max_new_tokens)
    assert result.token_ids == continuation[:max_new_tokens]
    assert result.stats.accepted_lengths == [num_heads] * 5  # 1 + 5 x (3 + 1) = 21 tokens, cut to 20
