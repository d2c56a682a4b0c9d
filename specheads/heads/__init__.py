"""What a draft head is: modules, configs, save/load. No training or decoding logic lives here."""

from typing import Any

from specheads.heads.base import DraftHead
from specheads.heads.borrowed import UnsupportedTargetError
from specheads.heads.config import FORMAT_VERSION, HeadConfig, HeadConfigError, TargetRecord
from specheads.heads.draft_model import DraftModel, DraftModelConfig
from specheads.heads.eagle import EagleHead, deprecated_name
from specheads.heads.eagle_config import EAGLE_TOKEN_OFFSET, EagleConfig, build_vocab_maps, default_eagle3_layer_ids
from specheads.heads.load import (
    HEADS,
    LORA_DIR,
    HeadLoadError,
    apply_lora_adapter,
    load_head,
    load_lora_adapter,
    read_head_config,
    resolve_head_folder,
)
from specheads.heads.masks import causal_additive_mask, padding_causal_mask
from specheads.heads.medusa import MEDUSA_HEAD_OFFSET, MedusaConfig, MedusaHeads, predicted_offset


def __getattr__(name: str) -> Any:
    """Deprecated names (``EagleDrafter``) still import, with a DeprecationWarning."""
    return globals()[deprecated_name(__name__, name)]


__all__ = [
    "DraftHead",
    "DraftModel",
    "DraftModelConfig",
    "EAGLE_TOKEN_OFFSET",
    "EagleConfig",
    "EagleHead",
    "FORMAT_VERSION",
    "HEADS",
    "HeadConfig",
    "HeadConfigError",
    "HeadLoadError",
    "LORA_DIR",
    "MEDUSA_HEAD_OFFSET",
    "MedusaConfig",
    "MedusaHeads",
    "TargetRecord",
    "UnsupportedTargetError",
    "apply_lora_adapter",
    "build_vocab_maps",
    "causal_additive_mask",
    "default_eagle3_layer_ids",
    "load_head",
    "load_lora_adapter",
    "padding_causal_mask",
    "predicted_offset",
    "read_head_config",
    "resolve_head_folder",
]
