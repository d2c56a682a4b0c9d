"""A head's tree plus a prompt-lookup branch: the graft itself, and that the branch really reaches verification.

Losslessness of the combined trees is tested where every drafter's is: greedy identity in test_generator.py (tiny
Llama) and test_greedy_equivalence.py (SmolLM2), the sampling law in test_sampling_end_to_end.py, and the
acceptance rule for grafted (fixed) nodes among drawn siblings in test_accept.py.
"""

from __future__ import annotations

import pytest
import torch

from specheads.decoding.draft import DraftTree, Sampling
from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.lookup_branch import LookupBranchDrafter, first_choice_path, graft_chain
from specheads.decoding.medusa_drafter import MedusaDrafter
from specheads.decoding.prompt_lookup_drafter import PromptLookupDrafter
from specheads.decoding.tree import DynamicTreeConfig, static_tree
from specheads.decoding.tuning.cost_model import RecordingDrafter
from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads
from tests.decoding.helpers import TinyTokenizer

# root 10; children 11 (node 1) and 12 (node 2); node 1 has child 13 (node 3)
TREE = DraftTree(tokens=torch.tensor([10, 11, 12, 13]), parents=torch.tensor([-1, 0, 0, 1]))


def test_graft_follows_matching_nodes_then_hangs_the_rest_below() -> None:
    q = torch.softmax(torch.randn(4, 20, generator=torch.Generator().manual_seed(0)), dim=-1)
    tree = DraftTree(TREE.tokens, TREE.parents, draft_probs=q)
    grafted = graft_chain(tree, torch.tensor([11, 13, 14, 15]))
    assert grafted.tokens.tolist() == [10, 11, 12, 13, 14, 15]
    assert grafted.parents.tolist() == [-1, 0, 0, 1, 3, 4]  # 11 and 13 reused, 14 under 13, 15 under 14
    assert grafted.fixed.tolist() == [False, False, False, False, True, True]
    assert torch.equal(grafted.draft_probs[:4], q) and not grafted.draft_probs[4:].any()
    assert grafted.structure is None  # the shape changed: the verifier must not use a precompiled one


def test_graft_without_a_match_starts_a_new_branch_at_the_root() -> None:
    grafted = graft_chain(TREE, torch.tensor([13, 11]))  # 13 exists, but not as a child of the root
    assert grafted.tokens.tolist() == [10, 11, 12, 13, 13, 11]
    assert grafted.parents.tolist() == [-1, 0, 0, 1, 0, 4]
    assert grafted.draft_probs is None and grafted.fixed.tolist() == [False] * 4 + [True] * 2


@pytest.mark.parametrize("chain", [[], [11], [11, 13]], ids=["empty", "one-known", "all-known"])
def test_graft_of_a_chain_already_in_the_tree_returns_the_tree(chain: list[int]) -> None:
    assert graft_chain(TREE, torch.tensor(chain, dtype=torch.long)) is TREE


def test_graft_keeps_earlier_fixed_marks() -> None:
    once = graft_chain(TREE, torch.tensor([12, 20]))
    twice = graft_chain(once, torch.tensor([12, 20, 21]))
    assert twice.parents.tolist() == [-1, 0, 0, 1, 2, 4]
    assert twice.fixed.tolist() == [False, False, False, False, True, True]


def test_first_choice_path_keeps_the_first_child_at_every_level() -> None:
    # root 10 -> {11 -> {13, 14 -> 16}, 12 -> 15}: first children 11, then 13
    q = torch.rand(7, 20, generator=torch.Generator().manual_seed(0))
    tree = DraftTree(torch.tensor([10, 11, 12, 13, 14, 15, 16]), torch.tensor([-1, 0, 0, 1, 1, 2, 4]), q)
    path = first_choice_path(tree)
    assert path.tokens.tolist() == [10, 11, 13] and path.parents.tolist() == [-1, 0, 1]
    assert torch.equal(path.draft_probs, q[[0, 1, 3]]) and path.fixed is None
    chain = DraftTree(torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 1]))
    assert first_choice_path(chain) is chain


def test_narrow_branch_keeps_the_head_first_choice_only_when_the_lookup_proposes(tiny_llama) -> None:
    torch.manual_seed(0)
    eagle = EagleTreeDrafter(EagleHead(EagleConfig(version=3), tiny_llama).eval(), DynamicTreeConfig(2, 2, 4))
    drafter = LookupBranchDrafter(eagle, num_tokens=3, min_ngram=2)  # narrow is the default
    with torch.no_grad():
        matched = drafter.propose(_begin(drafter, tiny_llama, torch.tensor([5, 6, 7, 8, 9, 1, 2, 5]), 6, Sampling()))
        unmatched = drafter.propose(_begin(drafter, tiny_llama, torch.tensor([1, 2, 3, 4]), 5, Sampling()))
        head = eagle.propose(_begin(eagle, tiny_llama, torch.tensor([5, 6, 7, 8, 9, 1, 2, 5]), 6, Sampling()))
    head_part = matched.tokens[~matched.fixed]
    assert torch.equal(head_part, first_choice_path(head).tokens)  # the head's best path, then the lookup's
    assert matched.tokens[matched.fixed].tolist() == [7, 8, 9][-int(matched.fixed.sum()) :]
    assert unmatched.num_nodes == 5 and unmatched.fixed is None  # no lookup proposal: the head's whole tree


def test_solo_steps_propose_the_lookup_chain_alone_and_leave_the_head_idle(tiny_llama) -> None:
    torch.manual_seed(0)
    eagle = EagleTreeDrafter(EagleHead(EagleConfig(version=1), tiny_llama).eval(), DynamicTreeConfig(2, 2, 4))
    drafter = LookupBranchDrafter(eagle, num_tokens=3, min_ngram=2, solo_ngram=3)
    with torch.no_grad():
        # "... 1 5 6" matches the 3-gram at the start: the chain 7 8 9 alone, and EAGLE's re-feed stays queued
        state = _begin(drafter, tiny_llama, torch.tensor([1, 5, 6, 7, 8, 9, 2, 1, 5]), 6, Sampling())
        solo = drafter.propose(state)
        assert solo.tokens.tolist() == [6, 7, 8, 9] and solo.parents.tolist() == [-1, 0, 1, 2]
        assert solo.fixed.tolist() == [False, True, True, True]
        assert state.inner.cache_len == 0 and len(state.inner.pending_tokens) == 1  # the head did not run
        # "... 2 5 6" matches only the 2-gram "5 6": the head's first choice beside the chain, as without solo
        state = _begin(drafter, tiny_llama, torch.tensor([1, 5, 6, 7, 8, 9, 2, 5]), 6, Sampling())
        narrow = drafter.propose(state)
        assert narrow.tokens[narrow.fixed].tolist() == [7, 8, 9][-int(narrow.fixed.sum()) :]
        assert (~narrow.fixed).sum() >= 2 and state.inner.cache_len == 8
    with pytest.raises(ValueError, match=r"solo_ngram must lie in \[min_ngram, max_ngram\] = \[2, 3\], got 4"):
        LookupBranchDrafter(eagle, min_ngram=2, solo_ngram=4)


def _begin(drafter, target, prompt: torch.Tensor, root: int, sampling: Sampling):
    out = target(input_ids=prompt.unsqueeze(0), output_hidden_states=drafter.layer_ids or None)
    hidden = out.hidden_states if drafter.layer_ids else None
    return drafter.begin(prompt, hidden, root, sampling, torch.Generator().manual_seed(0))


def test_the_branch_adds_the_lookup_continuation_to_an_eagle_tree(tiny_llama) -> None:
    torch.manual_seed(0)
    eagle = EagleTreeDrafter(EagleHead(EagleConfig(version=3), tiny_llama).eval(), DynamicTreeConfig(2, 2, 4))
    drafter = LookupBranchDrafter(eagle, num_tokens=3, min_ngram=2, narrow=False)
    prompt = torch.tensor([5, 6, 7, 8, 9, 1, 2, 5])
    for sampling in (Sampling(), Sampling(temperature=1.0)):
        with torch.no_grad():
            tree = drafter.propose(_begin(drafter, tiny_llama, prompt, 6, sampling))  # context "... 5 6": 7 8 9
            head_tree = eagle.propose(_begin(eagle, tiny_llama, prompt, 6, sampling))  # same seed, same draws
        lookup = tree.tokens[tree.fixed].tolist()
        assert lookup and lookup == [7, 8, 9][-len(lookup) :]  # what the head already guessed is reused
        assert torch.equal(tree.tokens[: head_tree.num_nodes], head_tree.tokens)
        assert tree.num_nodes == head_tree.num_nodes + len(lookup)
        assert (tree.draft_probs is None) == sampling.greedy


def test_the_branch_stays_out_while_the_lookup_finds_nothing(tiny_llama) -> None:
    torch.manual_seed(0)
    medusa = MedusaDrafter(MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).eval(), static_tree([[0], [0, 0]]))
    drafter = LookupBranchDrafter(medusa, num_tokens=3, min_ngram=2)
    with torch.no_grad():
        state = _begin(drafter, tiny_llama, torch.tensor([1, 2, 3, 4]), 5, Sampling())
        tree = drafter.propose(state)
    assert tree.num_nodes == 3 and tree.fixed is None  # no earlier "4 5": the Medusa tree alone
    assert drafter.head is None and drafter.layer_ids == medusa.layer_ids


def test_the_branch_raises_tau_on_repetitive_text(tiny_llama) -> None:
    """Once the text repeats (the tiny random model soon loops), the combined drafter commits more per forward
    than the random head alone, with output identical to plain greedy decoding."""
    tiny_llama.generation_config.eos_token_id = None
    torch.manual_seed(0)
    eagle = EagleTreeDrafter(EagleHead(EagleConfig(version=3), tiny_llama).eval(), DynamicTreeConfig(2, 2, 4))
    plain = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(torch.tensor([3, 4, 5]), max_new_tokens=40)
    repetitive = torch.tensor([3, 4, 5] + plain.token_ids[:30] + [3, 4, 5])  # the continuation is in the prompt
    results = {
        name: SpeculativeGenerator(tiny_llama, TinyTokenizer(), drafter).generate(repetitive, max_new_tokens=24)
        for name, drafter in {
            "plain": None,
            "head": eagle,
            "head+lookup": LookupBranchDrafter(eagle, num_tokens=5, min_ngram=2),
            "lookup": PromptLookupDrafter(num_tokens=5, min_ngram=2),
        }.items()
    }
    assert all(r.token_ids == results["plain"].token_ids for r in results.values())
    assert results["head+lookup"].stats.tau > results["head"].stats.tau + 0.5
    assert results["head+lookup"].stats.tau >= results["lookup"].stats.tau - 0.5


@pytest.mark.parametrize("wrapper", [LookupBranchDrafter, RecordingDrafter])
@pytest.mark.parametrize("head_type", ["medusa", "eagle"])
def test_the_generator_checks_and_places_the_wrapped_head(tiny_llama, head_type, wrapper) -> None:
    """The generator finds a drafter's modules by attribute (placement check, CPU kernels): a lookup branch and the
    auto tree's calibration recorder must expose their inner drafter's, or a head in the wrong dtype fails deep
    inside a forward instead of by name, and calibration times other kernels than decoding runs."""
    tiny_llama.generation_config.eos_token_id = None
    if head_type == "medusa":
        module = MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).eval()
        inner, name = MedusaDrafter(module, static_tree([[0], [0, 0]])), "heads"
    else:
        module = EagleHead(EagleConfig(version=1), tiny_llama).eval()
        inner, name = EagleTreeDrafter(module, DynamicTreeConfig(2, 2, 4)), "head"
    generator = SpeculativeGenerator(tiny_llama, TinyTokenizer(), wrapper(inner))
    assert (name, module) in generator.drafter_modules()
    module.to(torch.bfloat16)  # the target is fp32
    with pytest.raises(ValueError, match=rf"the drafter's {name} is on cpu in torch.bfloat16"):
        generator.generate(torch.tensor([3, 17, 42, 5]), max_new_tokens=4)
