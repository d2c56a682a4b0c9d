"""Exports of heads on families whose layers or logits differ from Llama's in numbers rather than tensor names: the
engines would run them as Llama drafters, so they are refused with the reason, and nothing is written. Granite's layer
has Llama's tensors, norms and activation, and passed every other export check: its attention multiplier, residual
multiplier and logit scaling were dropped without a word."""

from __future__ import annotations

import pytest

from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads
from specheads.heads.interop import ExportError, export_head
from tests.tiny_models import tiny_family

LLAMA_SCALING = 16**-0.5  # head_dim 16
PLAIN_GRANITE = dict(attention_multiplier=LLAMA_SCALING, residual_multiplier=1.0, logits_scaling=1.0)
EAGLE1_EXPORTABLE = dict(input_norm=False, fc_bias=False)


def eagle(version: int, target):
    return EagleHead(EagleConfig(version=version, **(EAGLE1_EXPORTABLE if version == 1 else {})), target)


@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize(
    "setting, refusal",
    [
        ("attention_multiplier", "attention scales its scores by 0.5"),
        ("residual_multiplier", "residual_multiplier=0.5"),
        ("logits_scaling", "finishes its logits after the lm_head"),
    ],
)
def test_granite_eagle_exports_are_refused_when_a_multiplier_is_not_llamas(tmp_path, version, setting, refusal):
    target = tiny_family("granite", **{**PLAIN_GRANITE, setting: 0.5})
    with pytest.raises(ExportError, match=refusal):
        export_head(eagle(version, target), target, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("version", [1, 3])
def test_a_granite_with_llamas_numbers_exports(tmp_path, version):
    """The same family with every multiplier at Llama's value is a Llama layer: the checks do not refuse it."""
    target = tiny_family("granite", **PLAIN_GRANITE)
    assert "model.safetensors" in export_head(eagle(version, target), target, tmp_path / "out")


@pytest.mark.parametrize(
    "model_type, options", [("cohere", dict(logit_scale=0.25)), ("granite", dict(PLAIN_GRANITE, logits_scaling=4.0))]
)
def test_medusa_exports_are_refused_for_targets_that_finish_their_logits(tmp_path, model_type, options):
    target = tiny_family(model_type, **options)
    with pytest.raises(ExportError, match="finishes its logits after the lm_head"):
        export_head(MedusaHeads(MedusaConfig(num_heads=2), target), target, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    plain = tiny_family(model_type, **{**options, "logit_scale" if model_type == "cohere" else "logits_scaling": 1.0})
    assert "model.safetensors" in export_head(MedusaHeads(MedusaConfig(num_heads=2), plain), plain, tmp_path / "ok")


@pytest.mark.parametrize("no_rope_layers, refused", [([0, 1, 1, 1], True), ([1, 0, 1, 0], False)])
def test_a_smollm3_drafter_without_rope_is_not_exported_as_a_llama_layer(tmp_path, no_rope_layers, refused):
    """SmolLM3's drafter takes its first layer's attention: without a rotary embedding there (a NoPE first layer),
    it is not the Llama layer the engines run."""
    target = tiny_family("smollm3", no_rope_layers=no_rope_layers)
    if refused:
        with pytest.raises(ExportError, match="has no rotary embedding"):
            export_head(eagle(1, target), target, tmp_path / "out")
    else:
        assert "model.safetensors" in export_head(eagle(1, target), target, tmp_path / "out")
