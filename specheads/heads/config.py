"""What every head records about the target it was built for, and strict (de)serialisation of head configs."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

FORMAT_VERSION = 1
"""Version of the on-disk layout (``config.json`` + ``model.safetensors``). Bump on incompatible changes."""


class HeadConfigError(ValueError):
    """A head config (or the target it is used with) does not match what was expected."""


class HeadLoadError(RuntimeError):
    """A saved head could not be loaded strictly."""


@dataclass
class TargetRecord:
    """The frozen target a head was built for. Loading a head onto a target with other shapes is an error."""

    name_or_path: str = ""
    revision: str | None = None
    model_type: str = ""
    hidden_size: int = 0
    vocab_size: int = 0
    num_hidden_layers: int = 0

    @classmethod
    def from_model(cls, model: PreTrainedModel, revision: str | None = None) -> TargetRecord:
        config = model.config.get_text_config()
        return cls(
            name_or_path=str(getattr(model.config, "name_or_path", "") or ""),
            revision=revision or getattr(model.config, "_commit_hash", None),
            model_type=str(getattr(config, "model_type", "")),
            hidden_size=int(config.hidden_size),
            vocab_size=int(config.vocab_size),
            num_hidden_layers=int(config.num_hidden_layers),
        )

    def shape_mismatches(self, other: TargetRecord) -> list[str]:
        """Human-readable differences in the fields that make a head's weights incompatible."""
        return [
            f"{name}: head was built for {getattr(self, name)}, target has {getattr(other, name)}"
            for name in ("hidden_size", "vocab_size", "num_hidden_layers")
            if getattr(self, name) != getattr(other, name)
        ]


@dataclass
class HeadConfig:
    """Fields every head config has. ``layer_ids`` are the HF ``hidden_states`` indices the head reads."""

    target: TargetRecord = field(default_factory=TargetRecord)
    layer_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        """Build the config strictly: unknown keys are errors that list the valid ones."""
        return _dataclass_from_dict(cls, data, where=cls.__name__)


def _dataclass_from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise HeadConfigError(f"{where}: expected a mapping, found {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise HeadConfigError(f"{where}: unknown keys {unknown}; valid keys are {sorted(names)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = _dataclass_from_dict(hint, value, where=f"{where}.{key}")
        kwargs[key] = value
    return cls(**kwargs)


def default_dtype_of(model: torch.nn.Module) -> torch.dtype:
    """dtype of a model's first floating-point parameter (heads are created in the target's dtype)."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32
