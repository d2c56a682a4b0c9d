"""Families whose causal-LM forward finishes the logits after the lm_head (Gemma2/3's soft cap, Granite's
``logits_scaling``, Cohere's ``logit_scale``): heads apply the same finish, so their logits are on the target's scale.
Before, Medusa and EAGLE-1 heads read the bare ``lm_head`` output: on a Granite target with ``logits_scaling=4`` a head
that computes the target's own last step gave logits 4x too sharp (found by comparing them with the target's)."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

from specheads.heads import MedusaConfig, MedusaHeads
from specheads.heads.borrowed import (
    LOGIT_FINISH_TOLERANCE,
    LOGIT_TRANSFORMS,
    BorrowedModules,
    LogitTransform,
    borrow,
    logit_finish_gap,
    warn_on_unknown_logit_finish,
)
from tests.tiny_models import TINY_FAMILY_CONFIG, tiny_family

FINISHED = {  # every LOGIT_TRANSFORMS entry, with a finish far from the identity
    "gemma2": dict(head_dim=16, final_logit_softcapping=3.0),
    "gemma3_text": dict(head_dim=16, final_logit_softcapping=3.0),
    "gemma4_text": dict(final_logit_softcapping=3.0),
    "vaultgemma": dict(head_dim=16, final_logit_softcapping=3.0),
    "nanochat": dict(final_logit_softcapping=3.0),
    "granite": dict(logits_scaling=4.0),
    "granite_swa": dict(logits_scaling=4.0),
    "granitemoe": dict(logits_scaling=4.0, num_local_experts=4, num_experts_per_tok=2),
    "granitemoe_swa": dict(logits_scaling=4.0),
    "granitemoeshared": dict(
        logits_scaling=4.0, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64
    ),
    "cohere": dict(logit_scale=0.25),
    "cohere2": dict(logit_scale=0.25),
    "cohere2_moe": dict(logit_scale=0.25),
    "hyperclovax": dict(logits_scaling=4.0),
}


def test_every_listed_finish_is_tested():
    assert sorted(FINISHED) == sorted(LOGIT_TRANSFORMS)


@pytest.mark.parametrize("model_type", sorted(FINISHED))
def test_heads_finish_logits_as_the_targets_own_forward_does(model_type):
    """On the target's own last hidden state, ``BorrowedModules.logits`` is the target's logits; the bare lm_head
    (the identity finish, as before) is not, so each setting above is one a head would get wrong."""
    target = tiny_family(model_type, **FINISHED[model_type])
    assert logit_finish_gap(target) < 1e-5
    borrowed = borrow(target)
    assert borrowed.finish != LogitTransform()
    bare = BorrowedModules(borrowed.embed_tokens, borrowed.lm_head)
    ids = torch.tensor([[5, 9, 33, 7, 12, 40]])
    out = target(input_ids=ids, output_hidden_states=True)
    assert (bare.logits(out.hidden_states[-1]) - out.logits).abs().max() > 0.1


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "mistral", "phi3", "gemma", "olmo2"])
def test_families_without_a_finish_keep_the_bare_lm_head(model_type):
    target = tiny_family(model_type, **(dict(head_dim=16) if model_type in ("qwen3", "gemma") else {}))
    assert borrow(target).finish == LogitTransform()
    assert logit_finish_gap(target) < 1e-6


@pytest.mark.parametrize("model_type", ["granite", "gemma2", "cohere"])
@pytest.mark.parametrize("share_lm_head", [True, False])
def test_a_medusa_head_that_copies_the_target_computes_its_distribution(model_type, share_lm_head):
    """With no residual blocks a Medusa head is the target's lm_head (shared or a copy): its logits on the last hidden
    state must then be the target's next-token logits, on every family."""
    target = tiny_family(model_type, **FINISHED[model_type])
    head = MedusaHeads(MedusaConfig(num_heads=2, num_layers=0, share_lm_head=share_lm_head), target).eval()
    ids = torch.tensor([[5, 9, 33, 7, 12, 40]])
    out = target(input_ids=ids, output_hidden_states=True)
    logits = head(out.hidden_states[-1])  # (K, B, T, V)
    for k in range(2):
        torch.testing.assert_close(logits[k], out.logits, rtol=1e-5, atol=1e-5)


class HalvedLlama(LlamaForCausalLM):
    """A family unknown to LOGIT_TRANSFORMS whose forward rescales its logits (as MiniCPM3's scales its last hidden
    state before the lm_head)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 0.5
        return out


def test_training_warns_about_a_finish_it_does_not_know(caplog):
    config = AutoConfig.for_model("llama", **TINY_FAMILY_CONFIG)
    torch.manual_seed(0)
    target = HalvedLlama(config).eval()
    gap = logit_finish_gap(target)
    assert gap is not None and gap > 100 * LOGIT_FINISH_TOLERANCE
    with caplog.at_level(logging.WARNING, logger="specheads.heads.borrowed"):
        warn_on_unknown_logit_finish(target)
    assert "HalvedLlama's logits are not its lm_head applied to its last hidden state" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specheads.heads.borrowed"):
        warn_on_unknown_logit_finish(tiny_family("granite", logits_scaling=4.0))
    assert caplog.text == ""


def test_the_check_is_skipped_on_weights_it_cannot_run():
    with torch.device("meta"):
        target = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **TINY_FAMILY_CONFIG))
    assert logit_finish_gap(target) is None
