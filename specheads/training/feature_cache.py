"""Reading an offline feature cache (written by ``features.cache_features``): samples, several caches as one, the
checks an offline run makes against its target and data settings, and the collate that rebuilds what online mode
gives the loss (``TargetFeatures``)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.utils.data import ConcatDataset, Dataset
from transformers import PreTrainedModel

from specheads.heads.config import TargetRecord
from specheads.training.config import ConfigError
from specheads.training.data import DataConfig, collate
from specheads.training.features import TargetFeatures, resolved_paths, same_setting, shard_path

logger = logging.getLogger(__name__)


DATA_RECORDED = ("paths", "format", "max_length", "max_samples", "eval_fraction", "eval_size", "seed")
"""``data.*`` settings that decide a cache's samples; offline training reads the samples and ignores the settings."""


def read_cache_meta(split_dir: Path) -> dict[str, Any]:
    """A cache split's ``meta.json`` (``CACHE/train`` or ``CACHE/eval``), refused when missing or incomplete."""
    meta_path = split_dir / "meta.json"
    if not meta_path.is_file():
        hint = (
            f" ({split_dir.parent} is a split itself: name the folder above it)"
            if (split_dir.parent / "meta.json").is_file()
            else ""
        )
        raise ConfigError(
            f"{meta_path} not found; expected the folder `specheads data cache-features --out-dir` wrote, which "
            f"holds train/ and eval/{hint}."
        )
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{meta_path} is damaged ({err}); rerun `specheads data cache-features` into a new folder"
        ) from None
    if not meta.get("complete"):
        raise ConfigError(
            f"feature cache {split_dir} is incomplete (its writer was stopped): rerun the same `specheads data "
            "cache-features` command to finish it."
        )
    return meta


def check_cache_target(dataset: CachedFeatureDataset | ConcatFeatureCache, target: PreTrainedModel) -> None:
    """A cache's features must come from the target being trained: other shapes (layer count, hidden size,
    vocabulary) are an error; the same shapes with other weights are a warning (a fine-tune, or another model of the
    same size), and a renamed copy of the same weights passes."""
    cached, current = TargetRecord(**dataset.meta["target"]), TargetRecord.from_model(target)
    shapes = ("num_hidden_layers", "hidden_size", "vocab_size")
    differ = [
        f"{name} {getattr(cached, name)} vs {getattr(current, name)}"
        for name in shapes
        if getattr(cached, name) != getattr(current, name)
    ]
    if differ:
        raise ConfigError(
            f"feature cache {dataset.out_dir} was written by target {cached.name_or_path!r}, which differs from the "
            f"training target {current.name_or_path!r} ({', '.join(differ)}); expected features of the target being "
            f"trained. Re-run `specheads data cache-features --target {current.name_or_path}`, or set target.name to "
            "the cache's target."
        )
    other = cached.other_weights(current)
    if other:
        logger.warning(
            "feature cache %s was written by target %s; the shapes agree, so training goes on, but the features may "
            "not be this target's: re-run `specheads data cache-features` with the training target",
            dataset.out_dir,
            other,
        )


def warn_ignored_data_settings(data: DataConfig, dataset: CachedFeatureDataset | ConcatFeatureCache) -> None:
    """Offline training reads the samples of ``features.cache_dir`` as they were cached: ``data.*`` settings are not
    used. Warn where they differ from what the cache was built with, so a changed setting is not silently ignored."""
    built = dataset.meta.get("data")
    if built is None:
        logger.warning(
            "feature cache %s does not record the data settings it was built with (an older cache); offline training "
            "ignores data.* and reads the cached samples as they are",
            dataset.out_dir,
        )
        return
    current = {**asdict(data), "paths": resolved_paths(data.paths)}
    differ = [
        f"data.{key}={current[key]!r} (cache: {built.get(key)!r})"
        for key in DATA_RECORDED
        if current[key] != built.get(key)
    ]
    if differ:
        logger.warning(
            "offline training reads the samples of feature cache %s as it was built, so these settings are ignored: "
            "%s. To train on other data, re-run `specheads data cache-features` with them; to silence this, set them "
            "to the cache's values",
            dataset.out_dir,
            "; ".join(differ),
        )


class CachedFeatureDataset(Dataset):
    """Samples of an offline feature cache: ``input_ids``/``loss_mask`` (T,) long and the feature tensors (T, ...).

    Batch with ``collate_features(samples, dataset.pad_token_id)`` to get what online mode gives:
    ``(collate(...) dict, TargetFeatures)``. Needs no target model.
    """

    def __init__(self, out_dir: str | Path, pad_token_id: int = 0) -> None:
        self.out_dir = Path(out_dir)
        self.meta = read_cache_meta(self.out_dir)
        self.pad_token_id = pad_token_id
        self.layer_ids: list[int] = self.meta["layer_ids"]
        self.target = TargetRecord(**self.meta["target"])
        self.shard_size: int = self.meta["shard_size"]
        self._offsets = []
        for shard in range(self.meta["num_shards"]):
            with safe_open(shard_path(self.out_dir, shard), framework="pt") as f:
                self._offsets.append(f.get_tensor("offsets").tolist())

    def __len__(self) -> int:
        return self.meta["num_samples"]

    def lengths(self) -> list[int]:
        """Token count of every sample, in order."""
        return [b - a for offsets in self._offsets for a, b in zip(offsets[:-1], offsets[1:])]

    def loss_tokens(self) -> list[list[int]]:
        """The tokens under the loss mask of every sample, in order, read from the token columns alone (the
        features, hundreds of times larger, stay on disk)."""
        tokens = []
        for shard, offsets in enumerate(self._offsets):
            with safe_open(shard_path(self.out_dir, shard), framework="pt") as f:
                ids, mask = f.get_tensor("input_ids").long(), f.get_tensor("loss_mask").bool()
            tokens += [ids[a:b][mask[a:b]].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
        return tokens

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for a cache of {len(self)} samples")
        shard, local = divmod(index, self.shard_size)
        start, end = self._offsets[shard][local], self._offsets[shard][local + 1]
        with safe_open(shard_path(self.out_dir, shard), framework="pt") as f:
            sample = {name: f.get_slice(name)[start:end] for name in f.keys() if name != "offsets"}
        sample["input_ids"] = sample["input_ids"].long()
        sample["loss_mask"] = sample["loss_mask"].long()
        if "topk_indices" in sample:
            sample["topk_indices"] = sample["topk_indices"].long()
        return sample


def _difference(key: str, first: Any, other: Any) -> str:
    """One recorded setting's two values; a target by the fields that differ, its weight sample as "other weights"."""
    if key != "target" or not isinstance(first, dict) or not isinstance(other, dict):
        return f"{key} {first!r} vs {other!r}"
    fields = [
        f"{k} {first.get(k)!r} vs {other.get(k)!r}" for k in first if k != "weight_probe" and first[k] != other.get(k)
    ]
    if first.get("weight_probe") != other.get("weight_probe"):
        fields.append("other weights")
    return f"target ({', '.join(fields)})"


class ConcatFeatureCache(ConcatDataset):
    """Several caches of one target, layer set and distribution format read as one dataset, in order: data added
    later needs only its own cache (``features.extra_cache_dirs``)."""

    MUST_MATCH = ("target", "layer_ids", "dtype", "topk", "with_logits")

    def __init__(self, caches: list[CachedFeatureDataset]) -> None:
        first = caches[0]
        for cache in caches[1:]:
            differ = [key for key in self.MUST_MATCH if not same_setting(key, first.meta.get(key), cache.meta.get(key))]
            if differ:
                found = ", ".join(_difference(key, first.meta.get(key), cache.meta.get(key)) for key in differ)
                raise ConfigError(
                    f"feature caches {first.out_dir} and {cache.out_dir} cannot be read together ({found}); write "
                    "every cache with the same target and `specheads data cache-features` options."
                )
        super().__init__(caches)
        self.caches = caches
        self.out_dir = " + ".join(str(cache.out_dir) for cache in caches)
        self.layer_ids = first.layer_ids
        self.meta = {**first.meta, "num_samples": len(self)}
        self.meta["num_tokens"] = sum(cache.meta.get("num_tokens", 0) for cache in caches)

    def lengths(self) -> list[int]:
        """Token count of every sample, in order."""
        return [n for cache in self.caches for n in cache.lengths()]

    def loss_tokens(self) -> list[list[int]]:
        return [tokens for cache in self.caches for tokens in cache.loss_tokens()]


FEATURE_CACHES = (CachedFeatureDataset, ConcatFeatureCache)  # what an offline run reads


def open_feature_caches(dirs: list[str | Path]) -> CachedFeatureDataset | ConcatFeatureCache:
    """One cache directory as a ``CachedFeatureDataset``; several as their concatenation."""
    caches = [CachedFeatureDataset(d) for d in dirs]
    return caches[0] if len(caches) == 1 else ConcatFeatureCache(caches)


def _pad_stack(tensors: list[torch.Tensor], width: int) -> torch.Tensor:
    out = tensors[0].new_zeros((len(tensors), width, *tensors[0].shape[1:]))
    for row, tensor in enumerate(tensors):
        out[row, : tensor.shape[0]] = tensor
    return out  # (B, T, ...)


def collate_features(
    samples: list[dict[str, torch.Tensor]], pad_token_id: int
) -> tuple[dict[str, torch.Tensor], TargetFeatures]:
    """Right-pad cached samples into the online batch dict and ``TargetFeatures`` (zeros at padded positions)."""
    batch = collate([{"input_ids": s["input_ids"], "loss_mask": s["loss_mask"]} for s in samples], pad_token_id)
    width = batch["input_ids"].shape[1]
    layer_ids = sorted(int(name.split(".")[1]) for name in samples[0] if name.startswith("hidden_states."))
    features = TargetFeatures(
        hidden_states={i: _pad_stack([s[f"hidden_states.{i}"] for s in samples], width) for i in layer_ids}
    )
    for name in ("logits", "topk_values", "topk_indices"):
        if name in samples[0]:
            setattr(features, name, _pad_stack([s[name] for s in samples], width))
    return batch, features
