"""``build_head``: draft-vocabulary settings that cannot work are refused with their own message."""

from __future__ import annotations

import logging
import re
import warnings

import pytest

from specheads.heads import HeadConfigError
from specheads.training.config import load_config
from specheads.training.run_setup import build_head
from tests.tiny_models import make_tiny_llama, tiny_named
from tests.training.train_helpers import REPO

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
    from tests.tiny_models import tiny_family

    target = tiny_family("lfm2", layer_types=["conv", "full_attention"] * 2)
    cfg = load_config(REPO / "configs" / "medusa" / "smollm2-135m.yaml")
    with pytest.warns(UserWarning, match=r"LinearAttentionLayer.*specheads' decoder will refuse this target"):
        head = build_head(cfg, target, None)
    assert head.num_heads > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_head(cfg, make_tiny_llama(), None)  # an attention-only target: no such warning


def test_training_says_before_the_run_when_the_head_will_not_export(caplog):
    """A head meant for vLLM/SGLang is trained with settings that export: training names what `specheads export`
    would refuse (Qwen2's q/k/v biases in the target's own layer; EAGLE-1's input norm) and what to set instead,
    and says nothing for a head that exports (EAGLE-3 on a Llama target, or with a Llama layer on Qwen2)."""
    eagle3 = REPO / "configs" / "eagle3" / "smollm2-135m.yaml"
    vocab = ["head.options.draft_vocab_size=64"]
    cases = [
        (eagle3, vocab, tiny_named("qwen2"), r"extra tensors.*head\.options\.draft_layer=llama"),
        (REPO / "configs" / "eagle1" / "smollm2-135m.yaml", [], make_tiny_llama(), r"input_norm=false"),
        (eagle3, vocab, make_tiny_llama(), None),
        (eagle3, [*vocab, "head.options.draft_layer=llama"], tiny_named("qwen2"), None),
    ]
    for path, overrides, target, refusal in cases:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="specheads.training.run_setup"):
            build_head(load_config(path, overrides), target, TOKENS)
        said = [r.getMessage() for r in caplog.records if "will refuse this head" in r.getMessage()]
        if refusal is None:
            assert not said
        else:
            assert len(said) == 1 and re.search(refusal, said[0]), said
