"""A classic small draft model (Leviathan et al. 2023, https://arxiv.org/abs/2211.17192; Chen et al. 2023,
https://arxiv.org/abs/2302.01318): a small causal LM that shares the target's tokenizer guesses a few tokens and the
target verifies them. A truncated copy of the target (its first layers, final norm and lm_head) is a valid small
draft model that needs no other download.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from specheads.heads.base import DraftHead
from specheads.heads.config import HeadConfig, HeadConfigError, TargetRecord


@dataclass
class DraftModelConfig(HeadConfig):
    model_config: dict[str, Any] = field(default_factory=dict)
    """The small LM's own transformers config (``PretrainedConfig.to_dict()``); ``model_type`` selects the class."""
    copy_target_layers: int = 0
    """With an empty ``model_config``: build the draft model as a copy of the target's embedding, first
    ``copy_target_layers`` layers, final norm and lm_head (weights copied), e.g. as the start of distillation."""


class DraftModel(DraftHead):
    head_type = "draft_model"
    config_class = DraftModelConfig
    card_tags = ("draft-model",)

    def __init__(self, config: DraftModelConfig, target: PreTrainedModel) -> None:
        super().__init__(config)
        record = TargetRecord.from_model(target)
        if not config.target.name_or_path:
            config.target = record
        copy_weights = not config.model_config
        if copy_weights:
            if config.copy_target_layers < 1:
                raise HeadConfigError(
                    "DraftModelConfig needs a small model: set model_config (a transformers config dict) or "
                    "copy_target_layers (how many of the target's first layers to copy), e.g. copy_target_layers=4"
                )
            config.model_config = _truncated_config(target, config.copy_target_layers).to_dict()
        model_config = dict(config.model_config)
        model_type = model_config.pop("model_type", None)
        if model_type is None:
            raise HeadConfigError("DraftModelConfig.model_config has no 'model_type'")
        hf_config = AutoConfig.for_model(model_type, **model_config)
        if hf_config.vocab_size != record.vocab_size:
            raise HeadConfigError(
                f"a draft model must share the target's vocabulary: draft vocab {hf_config.vocab_size}, "
                f"target vocab {record.vocab_size}"
            )
        hf_config._attn_implementation = target.config._attn_implementation
        self.model = AutoModelForCausalLM.from_config(hf_config, dtype=next(target.parameters()).dtype)
        if copy_weights:
            source = target.state_dict()
            with torch.no_grad():
                for name, tensor in self.model.state_dict().items():
                    tensor.copy_(source[name])

    @classmethod
    def from_target(cls, target: PreTrainedModel, num_layers: int) -> DraftModel:
        """A truncated copy of the target: its embedding, first ``num_layers`` layers, final norm and lm_head."""
        return cls(DraftModelConfig(copy_target_layers=num_layers), target)

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        """Plain causal-LM forward of the small model (accepts ``attention_mask``, ``position_ids``, ``cache``)."""
        return self.model(input_ids=input_ids, **kwargs)


def _truncated_config(target: PreTrainedModel, num_layers: int) -> Any:
    total = target.config.get_text_config().num_hidden_layers
    if not 0 < num_layers <= total:
        raise HeadConfigError(f"copy_target_layers must be in [1, {total}] (the target's layers), found {num_layers}")
    small = copy.deepcopy(target.config.get_text_config())
    small.num_hidden_layers = num_layers
    if getattr(small, "layer_types", None) is not None:
        small.layer_types = small.layer_types[:num_layers]
    return small
