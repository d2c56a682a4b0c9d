"""Losses on rigged inputs, and the EAGLE-3 training-time-test unroll against a step-by-step reference."""

from __future__ import annotations

import math

import pytest
import torch

from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads
from specheads.training.losses import (
    TargetDistribution,
    chain_tau,
    draft_model_loss,
    eagle3_ttt_loss,
    medusa_loss,
    ratios,
    soft_cross_entropy,
    ttt_attention_mask,
)


def test_chain_tau_counts_the_bonus_token():
    assert chain_tau([]) == 1.0
    assert chain_tau([1.0, 1.0, 1.0]) == 4.0
    assert chain_tau([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert chain_tau([0.0, 1.0]) == 1.0


def test_medusa_loss_rewards_the_token_k_plus_1_ahead():
    """Head k at position t predicts token t+k+1: logits rigged that way score top-1 = 1 and a near-zero loss."""
    batch, length, vocab, heads = 2, 9, 11, 3
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))
    logits = torch.full((heads, batch, length, vocab), -30.0)
    for k in range(1, heads + 1):
        for t in range(length - k - 1):
            logits[k - 1, :, t].scatter_(-1, ids[:, t + k + 1, None], 30.0)
    mask = torch.ones_like(ids)
    loss, stats = medusa_loss(logits, ids, mask, decay=0.8)
    metrics = ratios(stats)
    assert loss.item() < 1e-6
    assert all(metrics[f"top1/head{k}"] == 1.0 for k in range(1, heads + 1))
    shifted, _ = medusa_loss(logits.roll(1, dims=2), ids, mask, decay=0.8)  # off by one position: wrong
    assert shifted.item() > 10


def test_medusa_loss_ignores_tokens_outside_the_loss_mask():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    logits = torch.randn(2, 1, 6, 8)
    mask = torch.tensor([[0, 0, 0, 1, 1, 0]])
    _, stats = medusa_loss(logits, ids, mask, decay=1.0)
    assert stats["top1/head1"][1].item() == 2  # targets t+2 in {3, 4} are the masked-in tokens
    assert stats["top1/head2"][1].item() == 2


def test_soft_labels_equal_hard_labels_for_one_hot_targets():
    ids = torch.randint(0, 7, (2, 6))
    logits = torch.randn(2, 2, 6, 7)
    one_hot = torch.nn.functional.one_hot(torch.cat([ids[:, 1:], ids[:, :1]], dim=1), 7).float()  # at s: token s+1
    hard, _ = medusa_loss(logits, ids, torch.ones_like(ids), decay=0.8)
    soft, _ = medusa_loss(logits, ids, torch.ones_like(ids), decay=0.8, target=TargetDistribution(one_hot))
    torch.testing.assert_close(hard, soft)


def test_draft_model_acceptance_follows_each_chain_until_its_first_miss():
    """top1/step{k} counts chains (one per start position) whose first k-1 guesses matched: brute force agrees."""
    valid = torch.tensor([[0, 1, 1, 1, 1, 1, 0, 1, 1], [1, 1, 1, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    hits = torch.tensor([[0, 1, 1, 0, 1, 1, 0, 1, 1], [1, 0, 1, 0, 1, 1, 1, 0, 1]], dtype=torch.bool)
    vocab, depth = 5, 4
    labels = torch.randint(0, vocab, (int(valid.sum()),), generator=torch.Generator().manual_seed(0))
    logits = torch.nn.functional.one_hot(torch.where(hits[valid], labels, (labels + 1) % vocab), vocab).float() * 9
    loss, stats = draft_model_loss(logits, valid, labels, None, depth)
    for k in range(1, depth + 1):
        tried = accepted = 0
        for row in range(valid.shape[0]):
            for start in range(valid.shape[1] - k + 1):
                chain = range(start, start + k - 1)
                if all(hits[row, i] for i in chain) and valid[row, start + k - 1]:
                    tried += 1
                    accepted += int(hits[row, start + k - 1])
        assert stats[f"top1/step{k}"].tolist() == [accepted, tried], k
    one_hot = TargetDistribution(torch.nn.functional.one_hot(labels, vocab).float())
    soft, soft_stats = draft_model_loss(logits, valid, labels, one_hot, depth)
    torch.testing.assert_close(loss, soft)  # soft labels that are one-hot are the hard labels
    assert soft_stats["top1/step2"].tolist() == stats["top1/step2"].tolist()


def test_topk_distribution_matches_dense_on_its_support():
    logits = torch.randn(1, 3, 10)
    probs = torch.softmax(logits, -1)
    values, indices = probs.topk(10, dim=-1)  # k = V: the same distribution
    dense, sparse = TargetDistribution(probs), TargetDistribution(values, indices)
    draft = torch.logspace(0, 1, 10)[None, None].expand(1, 3, 10)
    torch.testing.assert_close(soft_cross_entropy(draft, dense), soft_cross_entropy(draft, sparse))
    d2t = torch.tensor([0, 3, 4, 9])
    t2d = torch.full((10,), -1)
    t2d[d2t] = torch.arange(4)
    a, b = dense.to_draft_vocab(d2t, t2d), sparse.to_draft_vocab(d2t, t2d)
    small = torch.randn(1, 3, 4)
    torch.testing.assert_close(soft_cross_entropy(small, a), soft_cross_entropy(small, b))


def test_ttt_mask_is_causal_on_the_context_and_diagonal_on_later_steps():
    attention = torch.tensor([[1, 1, 1, 0]])
    mask = ttt_attention_mask(attention, step=2, dtype=torch.float32)[0, 0]  # (4, 12)
    allowed = mask == 0
    assert allowed.shape == (4, 12)
    assert allowed[:, :4].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]  # padded key hidden
    for block in (1, 2):
        assert torch.equal(allowed[:, 4 * block : 4 * (block + 1)], torch.eye(4, dtype=torch.bool))


def test_eagle3_unroll_equals_running_each_chain_separately(tiny_llama):
    """Step j at position t must see exactly: step-0 keys at positions <= t, and its own chain at t for steps 1..j.

    Reference: for each t, a fresh cache over the context 0..t, then one single-token step per j feeding back the
    previous hidden output with token t+1+j at position t+j (plain attention to everything in that cache).
    """
    torch.manual_seed(0)
    drafter = EagleHead(EagleConfig(version=3, layer_ids=[1, 2, 3]), tiny_llama).eval()
    batch, length, steps = 1, 6, 3
    features = torch.randn(batch, length, 64)
    ids = torch.randint(0, 128, (batch, length))
    target = TargetDistribution.from_logits(torch.randn(batch, length, 128))
    outputs = []

    class RecordingDrafter:  # records every step's logits at all positions, whatever rows the loss reads
        def __call__(self, *args, **kwargs):
            hidden, _ = drafter(*args, **kwargs)
            outputs.append(drafter.logits(hidden))
            return hidden, None

        def logits(self, hidden):
            return drafter.logits(hidden)

    with torch.no_grad():
        eagle3_ttt_loss(
            RecordingDrafter(), drafter.new_cache(), features, ids, torch.ones_like(ids), torch.ones_like(ids),
            target, drafter.d2t, drafter.t2d, steps, decay=0.8,
        )  # fmt: skip
        for t in range(length - 1):
            cache = drafter.new_cache()
            positions = torch.arange(t + 1)[None]
            hidden, logits = drafter(features[:, : t + 1], ids[:, 1 : t + 2], positions, cache=cache)
            hidden, logits = hidden[:, -1:], logits[:, -1:]
            torch.testing.assert_close(outputs[0][:, t], logits[:, 0], atol=1e-5, rtol=1e-4)
            for j in range(1, steps):
                if t + 1 + j >= length:
                    break
                hidden, logits = drafter(hidden, ids[:, t + 1 + j : t + 2 + j], torch.tensor([[t + j]]), cache=cache)
                torch.testing.assert_close(outputs[j][:, t], logits[:, 0], atol=1e-5, rtol=1e-4)


def test_eagle3_loss_skips_and_acceptance_misses_target_tokens_outside_the_draft_vocab(tiny_llama):
    from specheads.heads import build_vocab_maps

    d2t, t2d = build_vocab_maps(torch.arange(16)[None], 128, 16)  # draft vocab = target ids 0..15
    drafter = EagleHead(EagleConfig(version=3, layer_ids=[1, 2, 3], draft_vocab_size=16), tiny_llama, d2t=d2t)
    logits = torch.full((1, 5, 128), -10.0)
    logits[0, :, 3] = 10.0  # the target's greedy token is 3 (inside) ...
    logits[0, 2, 3], logits[0, 2, 100] = -10.0, 10.0  # ... except at position 2 (token 100, outside)
    ids = torch.zeros(1, 5, dtype=torch.long)
    with torch.no_grad():
        loss, stats = eagle3_ttt_loss(
            drafter, drafter.new_cache(), torch.randn(1, 5, 64), ids, torch.ones_like(ids), torch.ones_like(ids),
            TargetDistribution.from_logits(logits), drafter.d2t, drafter.t2d, steps=1, decay=0.8,
        )  # fmt: skip
    assert math.isfinite(loss.item())
    # positions t=0..3 read targets at 1..4: all four count for acceptance, and the one whose target (100) the draft
    # vocabulary lacks can only be a miss; the loss leaves it out
    assert stats["top1/step1"][1].item() == 4 and stats["top1/step1"][0].item() <= 3


def test_medusa_heads_train_on_the_loss(tiny_llama):
    """A few optimizer steps on one batch lower the loss: gradients reach every head."""
    heads = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1, share_lm_head=True), tiny_llama)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    hidden = tiny_llama(ids, output_hidden_states=True).hidden_states[-1]
    optimizer = torch.optim.Adam(heads.parameters(), lr=3e-2)
    losses = []
    for _ in range(20):
        loss, _ = medusa_loss(heads(hidden), ids, torch.ones_like(ids), decay=0.8)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in heads.parameters())
