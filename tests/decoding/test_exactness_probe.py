"""The generator's exactness probe (``verify.check_tree_exactness``): a target whose forward over a tree is not its
forward over each path is refused before decoding, and every family the suite decodes passes it."""

from __future__ import annotations

import pytest
import torch

from specheads.decoding import verify
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.medusa_drafter import MedusaDrafter
from specheads.decoding.tree import static_tree
from specheads.decoding.verify import attention_layout, tree_exactness_gap
from specheads.heads import MedusaConfig, MedusaHeads
from tests.decoding.helpers import TinyTokenizer
from tests.decoding.planted import PlantedDrafter, greedy_continuation
from tests.tiny_models import ARCHITECTURES, make_tiny_llama, tiny_family, tiny_named

PROMPT = torch.tensor([3, 17, 42, 5, 17, 42, 9, 3, 17, 42, 5, 17])
WIDE_TREE = [[0], [1], [2], [3], [0, 0], [3, 0], [0, 0, 0]]  # siblings ahead of deeper nodes: slots past positions


def test_an_alibi_target_is_refused_before_decoding():
    """MPT takes its ALiBi biases from the key index, not the position ids: a tree's later siblings get another
    model's logits, 22% of their range off, and generator construction says so."""
    mpt = tiny_family("mpt")
    assert tree_exactness_gap(mpt, attention_layout(mpt)) > 0.1
    with pytest.raises(ValueError, match=r"MptForCausalLM's forward over a draft tree does not match.*ALiBi.*generate"):
        SpeculativeGenerator(mpt, TinyTokenizer())


def test_the_refused_target_would_really_decode_other_tokens(monkeypatch):
    """Without the probe, MPT decodes other tokens than its own generate with a tree drafter (the target's own
    continuation planted in the tree, so paths through later siblings are accepted): the refusal prevents a real
    loss of exactness, not a rounding difference."""
    mpt = tiny_family("mpt")
    mpt.generation_config.eos_token_id = None
    expected = greedy_continuation(mpt, PROMPT, 24)
    torch.manual_seed(0)
    medusa = MedusaDrafter(MedusaHeads(MedusaConfig(num_heads=3), mpt).eval(), static_tree(WIDE_TREE))
    monkeypatch.setattr("specheads.decoding.generator.check_tree_exactness", lambda target, layout: None)
    generator = SpeculativeGenerator(mpt, TinyTokenizer(), PlantedDrafter(medusa, expected, every=1))
    assert generator.generate(PROMPT, max_new_tokens=24).token_ids != expected


@pytest.mark.parametrize("model_type, options", [("bloom", {}), ("falcon", dict(alibi=True))])
def test_a_target_whose_forward_cannot_take_a_tree_is_refused_with_the_reason(model_type, options):
    """BLOOM and ALiBi Falcon build their biases from a 2D padding mask and fail on a 4D tree mask deep inside their
    forward; generator construction turns that into a refusal that says what the verifier feeds the target."""
    target = tiny_family(model_type, **options)
    refusal = r"forward fails on a draft tree \(ValueError: .*4D additive.*generate"
    with pytest.raises(ValueError, match=refusal) as info:
        SpeculativeGenerator(target, TinyTokenizer())
    assert info.value.__cause__ is not None  # the family's own error stays attached


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_family_the_suite_decodes_passes_the_probe_and_decodes_its_own_tokens(name):
    """All 47 tested families (MoE, latent attention, attention sinks, learned absolute positions, parallel blocks,
    sliding windows, ...) give each tree node its path's logits, and a Medusa head over a wide tree with the target's
    own continuation planted in it (accepted through later siblings) decodes exactly their greedy tokens."""
    target = tiny_named(name)
    assert tree_exactness_gap(target, attention_layout(target)) < 1e-5  # fp32: rounding only
    target.generation_config.eos_token_id = None
    expected = greedy_continuation(target, PROMPT, 24)
    torch.manual_seed(0)
    medusa = MedusaDrafter(MedusaHeads(MedusaConfig(num_heads=3), target).eval(), static_tree(WIDE_TREE))
    planted = PlantedDrafter(medusa, expected, every=1)
    result = SpeculativeGenerator(target, TinyTokenizer(), planted).generate(PROMPT, max_new_tokens=24)
    assert result.token_ids == expected
    assert result.stats.target_forwards <= 1 + 24 // 3  # the planted paths were accepted, not only bonus tokens


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_targets_pass_under_their_tolerance(dtype):
    target = make_tiny_llama().to(dtype)
    assert verify.PROBE_TOLERANCE.get(dtype, 0.1) == 0.1
    assert tree_exactness_gap(target, attention_layout(target)) < 0.01  # rounding: far under the tolerance
    SpeculativeGenerator(target, TinyTokenizer())  # not refused


def test_the_probe_runs_once_per_target_dtype_and_device():
    target = make_tiny_llama(seed=3)
    forwards: list[int] = []
    target.register_forward_pre_hook(lambda module, args: forwards.append(1))
    SpeculativeGenerator(target, TinyTokenizer())
    probed = len(forwards)
    assert probed == 4  # prefill, tree, the next token after the commit, every path from scratch in one batch
    SpeculativeGenerator(target, TinyTokenizer())
    assert len(forwards) == probed  # measured once
    SpeculativeGenerator(target.to(torch.bfloat16), TinyTokenizer())
    assert len(forwards) == 2 * probed  # another dtype: measured again
