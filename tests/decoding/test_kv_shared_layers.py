"""Gemma3n: its last layers read the keys and values of earlier ones (KV sharing), and hold only an empty placeholder
in the cache (``DummyLayer``). The verifier once refused it as a recurrent model; such layers hold nothing to roll
back, and a tree over them is exact. Its hidden states are AltUp's stacked streams, not one (B, T, H) feature per
layer, so heads are refused with the reason, while drafters that read no hidden states decode it."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from specheads.decoding import build_drafter
from specheads.decoding.draft import DraftTree
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.prompt_lookup_drafter import PromptLookupDrafter
from specheads.decoding.verify import attention_layout, tree_exactness_gap
from specheads.heads import (
    DraftModel,
    DraftModelConfig,
    EagleConfig,
    EagleHead,
    MedusaConfig,
    MedusaHeads,
    UnsupportedTargetError,
)
from specheads.heads.tree_layers import tree_obstacle
from tests.decoding.helpers import TinyTokenizer
from tests.decoding.planted import PlantedDrafter, greedy_continuation
from tests.tiny_models import tiny_family

LAYERS = 4
GEMMA3N = dict(
    num_hidden_layers=LAYERS,
    num_kv_shared_layers=2,  # layers 2 and 3 read layers 0's and 1's keys and values
    layer_types=["sliding_attention", "full_attention"] * 2,
    sliding_window=8,  # the decode runs past the window
    head_dim=16,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=128,
    activation_sparsity_pattern=[0.0] * LAYERS,
    altup_num_inputs=2,
    laurel_rank=4,
    initializer_range=0.02,  # at the suite's 0.2 a tiny Gemma3n repeats one token; at 0.02 its output varies
)
PROMPT = torch.randint(3, 128, (12,), generator=torch.Generator().manual_seed(1))
PARENTS = [-1, 0, 0, 0, 0, 1, 4, 5]  # four children of the root, then deeper nodes under the first and the last


class WideTreeDrafter:
    """A fixed branching tree of arbitrary tokens under the root, reading no hidden states: wrapped in
    ``PlantedDrafter``, the accepted path (root, node 1, node 5, node 7) is not the run of nodes 0..3, so committing
    it copies cache entries."""

    layer_ids: list[int] = []

    def begin(self, prompt_ids, hidden_states, root, sampling, generator):
        return [root]

    def observe(self, state, fed_tokens, hidden_states, root):
        state[0] = root

    def propose(self, state):
        tokens = torch.tensor([state[0], *[(state[0] + 11 * i) % 128 for i in range(1, len(PARENTS))]])
        return DraftTree(tokens=tokens, parents=torch.tensor(PARENTS))


@pytest.fixture(scope="module")
def gemma3n():
    target = tiny_family("gemma3n_text", **GEMMA3N)
    target.generation_config.eos_token_id = None
    return target


def test_kv_shared_layers_take_a_tree_exactly(gemma3n):
    kinds = {type(layer).__name__ for layer in DynamicCache(config=gemma3n.config).layers}
    assert "DummyLayer" in kinds  # the KV-shared layers' placeholders are really there
    assert tree_obstacle(gemma3n) is None
    assert tree_exactness_gap(gemma3n, attention_layout(gemma3n)) < 1e-5  # fp32: rounding only


def _drafter(name, target):
    if name == "wide-tree":
        return WideTreeDrafter()
    if name == "lookup":
        return PromptLookupDrafter(num_tokens=4)
    small = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )  # a small LM of its own, with the target's vocabulary
    return build_drafter(DraftModel(DraftModelConfig(model_config=small.to_dict()), target).eval(), None)


@pytest.mark.parametrize("drafter", ["wide-tree", "lookup", "draft-model"])
def test_gemma3n_decodes_its_own_greedy_tokens_past_its_window(gemma3n, drafter):
    expected = greedy_continuation(gemma3n, PROMPT, 24)
    assert len(set(expected)) > 4  # a continuation that varies, so a wrong commit would show
    inner = _drafter(drafter, gemma3n)
    planted = PlantedDrafter(inner, expected, every=1)
    result = SpeculativeGenerator(gemma3n, TinyTokenizer(), planted).generate(PROMPT, max_new_tokens=24)
    assert result.token_ids == expected
    assert result.stats.target_forwards < 24  # planted drafts were accepted, not only bonus tokens
    if drafter == "wide-tree":
        assert not all(planted.states[0].contiguous)  # committed paths that were not nodes 0..d


def test_heads_are_refused_on_stacked_hidden_states_with_what_works_instead(gemma3n):
    """Every Gemma3n hidden state, the last included, is AltUp's (2, B, T, H) stack: every head is refused."""
    for build in (
        lambda: MedusaHeads(MedusaConfig(num_heads=2), gemma3n),
        lambda: EagleHead(EagleConfig(version=3), gemma3n),
        lambda: EagleHead(EagleConfig(version=1, draft_layer="llama"), gemma3n),
    ):
        with pytest.raises(UnsupportedTargetError, match=r"AltUp's parallel streams.*Draft models.*--prompt-lookup"):
            build()
