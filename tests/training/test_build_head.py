"""``build_head``: draft-vocabulary settings that cannot work are refused with their own message."""

from __future__ import annotations

import warnings

import pytest
from tiny_models import make_tiny_llama
from train_helpers import REPO

from specheads.heads import HeadConfigError
from specheads.training.config import load_config
from specheads.training.loop import build_head

TOKENS = {"input_ids": [[1, 2, 3]], "loss_mask": [[1, 1, 1]]}  # what an EAGLE-3 draft vocabulary is counted from


def test_a_draft_vocabulary_larger_than_the_targets_is_refused():
    """configs/eagle3 asks for 8,192 draft tokens; a 128-token target cannot have them (no d2t map can help)."""
    cfg = load_config(REPO / "configs" / "eagle3" / "smollm2-135m.yaml")
    assert cfg.head.options["draft_vocab_size"] == 8192
    with pytest.raises(HeadConfigError, match=r"draft_vocab_size=8192 exceeds the target's vocabulary of 128 tokens"):
        build_head(cfg, make_tiny_llama(vocab_size=128), TOKENS)
    cfg = load_config(REPO / "configs" / "eagle3" / "smollm2-135m.yaml", ["head.options.draft_vocab_size=128"])
    assert build_head(cfg, make_tiny_llama(vocab_size=128), TOKENS).draft_vocab_size == 128  # the full one is fine


def test_eagle1_refuses_a_draft_vocabulary():
    """EAGLE-1 drafts with the target's lm_head over the full vocabulary; a draft_vocab_size would be ignored."""
    cfg = load_config(REPO / "configs" / "eagle1" / "smollm2-135m.yaml", ["head.options.draft_vocab_size=16"])
    with pytest.raises(HeadConfigError, match=r"draft_vocab_size=16 applies to EAGLE-3.*Drop draft_vocab_size"):
        build_head(cfg, make_tiny_llama(vocab_size=128), None)


def test_training_on_a_target_the_decoder_would_refuse_warns_first():
    """LFM2's convolution layers fold every tree node into one state: specheads' decoder refuses such a target, and
    training says so before the run, with the same reason (a Medusa head on it is still built and trainable)."""
    from tiny_models import tiny_family

    target = tiny_family("lfm2", layer_types=["conv", "full_attention"])
    cfg = load_config(REPO / "configs" / "medusa" / "smollm2-135m.yaml")
    with pytest.warns(UserWarning, match=r"LinearAttentionLayer.*specheads' decoder will refuse this target"):
        head = build_head(cfg, target, None)
    assert head.num_heads > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_head(cfg, make_tiny_llama(), None)  # an attention-only target: no such warning
