"""MedusaHeads: shapes, dtypes, zero-init behaviour and independent block weights."""

import pytest
import torch

from specheads.heads import MedusaConfig, MedusaHeads
from tests.tiny_models import make_tiny_llama

# The offset convention (head k at t predicts t + k + 1) is checked where it has effects: heads fitted to zero
# medusa_loss draft the target's continuation in full (tests/decoding/test_drafter_fidelity.py).


@pytest.mark.parametrize("share_lm_head", [False, True])
def test_shapes_and_zero_init_reproduce_target_distribution(tiny_llama, share_lm_head):
    heads = MedusaHeads(MedusaConfig(num_heads=3, num_layers=2, share_lm_head=share_lm_head), tiny_llama)
    hidden = torch.randn(2, 5, 64)
    logits = heads(hidden)
    assert logits.shape == (3, 2, 5, 128)
    assert logits.dtype == torch.float32
    expected = tiny_llama.lm_head(hidden)
    for k in range(3):  # untrained heads start from the target's own next-token distribution
        torch.testing.assert_close(logits[k], expected)
    assert heads.config.layer_ids == [tiny_llama.config.num_hidden_layers]
    assert heads.config.target.hidden_size == 64 and heads.config.target.vocab_size == 128


def test_shared_lm_head_is_borrowed_not_a_parameter(tiny_llama):
    shared = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1, share_lm_head=True), tiny_llama)
    own = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1, share_lm_head=False), tiny_llama)
    assert not any("lm_head" in name for name in shared.state_dict())
    assert sum(p.numel() for p in own.parameters()) == sum(p.numel() for p in shared.parameters()) + 2 * 64 * 128
    own.lm_heads[0].weight.data.add_(1.0)
    assert not torch.equal(own.lm_heads[0].weight, tiny_llama.lm_head.weight)  # a copy, not the target's tensor


def test_every_block_has_its_own_weights(tiny_llama):
    """Catches `[ResBlock(h)] * L`, which silently shares one block L times (a bug in the original Medusa)."""
    heads = MedusaHeads(MedusaConfig(num_heads=3, num_layers=3), tiny_llama)
    params = [p for name, p in heads.named_parameters() if "blocks" in name]
    assert len(params) == 3 * 3 * 2
    assert len({p.data_ptr() for p in params}) == len(params)
    heads.blocks[0][0].linear.weight.data.fill_(1.0)
    others = [heads.blocks[h][layer].linear.weight for h in range(3) for layer in range(3) if (h, layer) != (0, 0)]
    assert all(torch.count_nonzero(w) == 0 for w in others)


def test_head_dtype_follows_target():
    target = make_tiny_llama().to(torch.bfloat16)
    heads = MedusaHeads(MedusaConfig(num_heads=2), target)
    assert {p.dtype for p in heads.parameters()} == {torch.bfloat16}
    assert heads(torch.randn(1, 3, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_invalid_config_is_rejected(tiny_llama):
    with pytest.raises(ValueError, match="num_heads"):
        MedusaHeads(MedusaConfig(num_heads=0), tiny_llama)
