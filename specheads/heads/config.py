"""What every head records about the target it was built for, and strict (de)serialisation of head configs."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

FORMAT_VERSION = 1
"""Version of the on-disk layout (``config.json`` + ``model.safetensors``). Bump on incompatible changes."""


class HeadConfigError(ValueError):
    """A head config (or the target it is used with) does not match what was expected."""


FILE_FIX = "the config file was edited by hand or written by another tool: fix the value or re-save the head"
"""What to do about a saved head's ``config.json`` value of the wrong type."""


class HeadLoadError(RuntimeError):
    """A saved head could not be loaded strictly."""


PROBE_TENSORS = 8
PROBE_ENTRIES = 8
PROBE_TOLERANCE = 5e-3
"""Weight probes of two targets agree when no probed tensor moved by more than this (relative L2): 16-bit rounding
of the same weights moves one by ~0.1% (bf16's RMS relative error), another model or a fine-tune by far more."""


@dataclass
class TargetRecord:
    """The frozen target a head was built for. Loading a head onto a target with other shapes is an error; onto one
    with the same shapes but other weights (``weight_probe``), a warning."""

    name_or_path: str = ""
    revision: str | None = None
    model_type: str = ""
    hidden_size: int = 0
    vocab_size: int = 0
    num_hidden_layers: int = 0
    weight_probe: list[float] = field(default_factory=list)

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
            weight_probe=weight_probe(model),
        )

    def shape_mismatches(self, other: TargetRecord) -> list[str]:
        """Human-readable differences in the fields that make a head's weights incompatible."""
        return [
            f"{name}: head was built for {getattr(self, name)}, target has {getattr(other, name)}"
            for name in ("hidden_size", "vocab_size", "num_hidden_layers")
            if getattr(self, name) != getattr(other, name)
        ]

    def weight_distance(self, other: TargetRecord) -> float | None:
        """How far the two targets' weight probes are apart: the largest relative L2 distance over the probed
        tensors (one changed tensor counts in full). None when either record has no probe (a record without the
        field, or weights that could not be read) or the probes were taken differently."""
        if not self.weight_probe or len(self.weight_probe) != len(other.weight_probe):
            return None
        mine = torch.tensor(self.weight_probe).view(-1, PROBE_ENTRIES)
        theirs = torch.tensor(other.weight_probe).view(-1, PROBE_ENTRIES)
        return float(((mine - theirs).norm(dim=1) / mine.norm(dim=1).clamp_min(1e-12)).max())

    def other_weights(self, actual: TargetRecord) -> str | None:
        """Why ``actual`` (same shapes) may not be the target this record was made from, or None when it is.

        The weight probes decide when both records have one: a renamed copy (or a built-in target loaded from its
        cache folder by path) passes, the same name over other weights (a fine-tune, the base model) does not.
        Records without a probe fall back to comparing names."""
        distance = self.weight_distance(actual)
        if distance is not None:
            if distance <= PROBE_TOLERANCE:
                return None
            return (
                f"{self.name_or_path!r}, and {actual.name_or_path!r} has other weights (sampled weights differ by "
                f"{distance:.1%}, relative)"
            )
        if self.name_or_path and actual.name_or_path and self.name_or_path != actual.name_or_path:
            return f"{self.name_or_path!r}, not {actual.name_or_path!r}"
        return None


def weight_probe(model: torch.nn.Module) -> list[float]:
    """A few fixed entries of a few of the model's weights, spread from the embeddings to the last layers: enough to
    tell one set of weights from another of the same shapes, in any dtype or device. Empty when the weights cannot
    be read here (quantized, on the meta device, or partitioned by DeepSpeed ZeRO-3 or FSDP2, whose gathering takes
    every process) or the model is too small. LoRA adapter tensors (peft) are left out, so an adapted target
    probes as its base."""
    params = [
        param
        for name, param in model.named_parameters()
        if "lora_" not in name and param.is_floating_point() and param.numel() >= PROBE_ENTRIES
    ]
    if len(params) < PROBE_TENSORS or any(p.device.type == "meta" or is_partitioned(p) for p in params):
        return []
    picks = [params[i * (len(params) - 1) // (PROBE_TENSORS - 1)] for i in range(PROBE_TENSORS)]
    values = []
    with torch.no_grad():
        for param in picks:
            flat = param.detach().reshape(-1)
            # a fixed stride through the tensor that is coprime to typical row lengths, so entries fall in many rows
            index = torch.arange(PROBE_ENTRIES, device=flat.device) * 1_000_003 % flat.numel()
            values.extend(flat[index].float().cpu().tolist())
    return values


def is_partitioned(param: torch.Tensor) -> bool:
    """Split across processes: by DeepSpeed ZeRO-3 (``ds_numel``) or by FSDP2 (a ``DTensor``)."""
    if hasattr(param, "ds_numel"):
        return True
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(param, DTensor)


@dataclass
class HeadConfig:
    """Fields every head config has. ``layer_ids`` are the HF ``hidden_states`` indices the head reads."""

    target: TargetRecord = field(default_factory=TargetRecord)
    layer_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], fix: str = FILE_FIX) -> HeadConfig:
        """Build the config strictly: unknown keys are errors that list the valid ones; a value of the wrong type
        is an error that ends with ``fix`` (what the user who wrote ``data`` should do)."""
        return _dataclass_from_dict(cls, data, where=cls.__name__, fix=fix)

    @classmethod
    def from_saved(cls, data: dict[str, Any]) -> HeadConfig:
        """The config of a head saved to disk; a head type whose checks tightened over time overrides it to still
        load what it saved before (``from_dict`` checks a config being written)."""
        return cls.from_dict(data)


def _dataclass_from_dict(cls: type, data: dict[str, Any], where: str, fix: str = FILE_FIX) -> Any:
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
        if dataclasses.is_dataclass(hint):
            value = _dataclass_from_dict(hint, value, where=f"{where}.{key}", fix=fix)
        elif not _has_type(value, hint):
            raise HeadConfigError(
                f"{where}.{key}: expected {_type_name(hint)}, found {type(value).__name__} {value!r}; {fix}"
            )
        kwargs[key] = value
    return cls(**kwargs)


def _has_type(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a config field's annotation (ints are accepted where floats are)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(_has_type(item, args[0]) for item in value)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _type_name(hint: Any) -> str:
    if typing.get_args(hint):  # list[float]: its __name__ is plain "list"
        return str(hint).replace("typing.", "")
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def default_dtype_of(model: torch.nn.Module) -> torch.dtype:
    """dtype of a model's first floating-point parameter (heads are created in the target's dtype)."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32
