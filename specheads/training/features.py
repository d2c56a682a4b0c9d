"""What a draft head learns from: the frozen target's hidden states and next-token distribution.

Online mode runs the target inside each training step under ``no_grad`` (``extract_features``). Offline mode runs
it once over the dataset and writes the same tensors to safetensors shards (``cache_features``), so training can
read them back (``CachedFeatureDataset`` + ``collate_features``) without loading the target: both modes hand the
loss the same ``TargetFeatures``.

Hidden states are keyed by HF index (0 = embeddings, i = input of layer i, N = after the final norm; see
docs/design.md). The target's distribution is kept whole (logits) or as its top-k probabilities: with k = 32 a
token costs ~200 bytes instead of 2 x vocab_size (~98 KB for a 49k vocabulary in fp16).

Cache layout (``out_dir``): ``meta.json`` and ``shard-00000.safetensors``, ... Samples are packed without padding:
``offsets (n+1,)`` delimits sample j as tokens ``offsets[j]:offsets[j+1]`` of ``input_ids (N,)``, ``loss_mask (N,)``,
``hidden_states.{i} (N, H)`` and either ``logits (N, V)`` or ``topk_values``/``topk_indices (N, k)``. The attention
mask of a packed sample is all ones, so it is rebuilt by the collate rather than stored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.utils.data import ConcatDataset, Dataset
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from specheads.heads.config import TargetRecord
from specheads.training.data import DataConfig, collate

logger = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 1
CACHE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class TargetFeatures:
    """The frozen target's outputs for one batch, identical in online and offline mode.

    ``hidden_states``: HF index -> (B, T, H). ``logits`` (B, T, V) or None. ``topk_values`` (B, T, k): the target's
    probabilities (softmax over the full vocabulary, so a row sums to <= 1) of its top-k tokens ``topk_indices``.
    Position t predicts token t+1. Values at padded positions are meaningless (masked by ``attention_mask``).
    """

    hidden_states: dict[int, torch.Tensor]
    logits: torch.Tensor | None = None
    topk_values: torch.Tensor | None = None
    topk_indices: torch.Tensor | None = None


@torch.no_grad()
def extract_features(
    target: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    layer_ids: list[int],
    with_logits: bool = True,
    topk: int | None = None,
    dtype: torch.dtype | None = None,
) -> TargetFeatures:
    """One frozen-target forward returning only the hidden states in ``layer_ids`` (and logits / top-k probs).

    input_ids, attention_mask (B, T), right-padded. ``dtype`` casts every floating feature (None keeps the
    target's); top-k probabilities are computed in fp32 before the cast.
    """
    needs_logits = with_logits or topk is not None
    check_feature_request(target, layer_ids, needs_logits, topk)
    out = target(
        input_ids=input_ids,
        attention_mask=attention_mask,
        output_hidden_states=list(layer_ids) or False,
        logits_to_keep=0 if needs_logits else 1,  # 0 keeps every position; 1 skips the (B, T, V) lm_head cost
        use_cache=False,
    )
    cast = (lambda t: t) if dtype is None else (lambda t: t.to(dtype))
    features = TargetFeatures(hidden_states={i: cast(out.hidden_states[i]) for i in layer_ids})
    if with_logits:
        features.logits = cast(out.logits)  # (B, T, V)
    if topk is not None:
        values, indices = torch.softmax(out.logits.float(), dim=-1).topk(topk, dim=-1)  # (B, T, k)
        features.topk_values, features.topk_indices = cast(values), indices
    return features


def check_feature_request(
    target: PreTrainedModel, layer_ids: list[int], needs_logits: bool, topk: int | None = None
) -> None:
    """Layer ids must be hidden-state indices of this target (an empty list only with logits); top-k within the
    vocabulary."""
    text = target.config.get_text_config()
    num_layers = text.num_hidden_layers
    if not (layer_ids or needs_logits) or not all(0 <= i <= num_layers for i in layer_ids):
        raise ValueError(
            f"layer_ids={layer_ids} must be HF hidden-state indices in 0..{num_layers} (N = final norm); "
            "an empty list only when logits or top-k probabilities are asked for."
        )
    if topk is not None and not 1 <= topk <= text.vocab_size:
        raise ValueError(f"topk={topk} must lie in 1..{text.vocab_size} (the target's vocabulary size).")


def topk_to_dense(values: torch.Tensor, indices: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Top-k target probabilities (B, T, k) -> dense (B, T, V): zero outside the top-k, renormalised to sum to 1.

    This is the target's distribution *restricted to its top-k* (the mass outside is dropped, not spread), the
    usual soft label when only the top-k were cached. Rows with no mass (padding) stay zero.
    """
    dense = torch.zeros(*values.shape[:-1], vocab_size, dtype=torch.float32, device=values.device)
    dense.scatter_(-1, indices.long(), values.float())
    return dense / dense.sum(-1, keepdim=True).clamp_min(1e-12)


def _shard_path(out_dir: Path, shard: int) -> Path:
    return out_dir / f"shard-{shard:05d}.safetensors"


def _dataset_digest(dataset: Any) -> str:
    """A content hash of the token ids, so resuming into a cache made from other data is an error."""
    digest = hashlib.sha1()
    for sample in dataset:
        digest.update(json.dumps(sample["input_ids"]).encode())
    return digest.hexdigest()


def _shard_tensors(
    target: PreTrainedModel,
    samples: list[dict[str, Any]],
    layer_ids: list[int],
    dtype: torch.dtype,
    topk: int | None,
    with_logits: bool,
    batch_size: int,
    progress: Any = None,
) -> dict[str, torch.Tensor]:
    """Run the target over one shard's samples and pack the valid (unpadded) positions, in sample order.

    Batches are formed from length-sorted samples so that little of each forward is padding.
    """
    lengths = [len(s["input_ids"]) for s in samples]
    by_length = sorted(range(len(samples)), key=lengths.__getitem__)
    per_sample: dict[int, dict[str, torch.Tensor]] = {}
    for start in range(0, len(samples), batch_size):
        chunk_ids = by_length[start : start + batch_size]
        batch = collate([samples[j] for j in chunk_ids], pad_token_id=0)
        features = extract_features(
            target,
            batch["input_ids"].to(target.device),
            batch["attention_mask"].to(target.device),
            layer_ids,
            with_logits=with_logits and topk is None,
            topk=topk,
            dtype=dtype,
        )
        tensors = {"input_ids": batch["input_ids"].int(), "loss_mask": batch["loss_mask"].to(torch.uint8)}
        tensors |= {f"hidden_states.{i}": h.cpu() for i, h in features.hidden_states.items()}
        if features.logits is not None:
            tensors["logits"] = features.logits.cpu()
        if features.topk_values is not None:
            tensors["topk_values"] = features.topk_values.cpu()
            tensors["topk_indices"] = features.topk_indices.int().cpu()
        for row, j in enumerate(chunk_ids):  # right padding: sample j is the first lengths[j] positions of its row
            per_sample[j] = {name: tensor[row, : lengths[j]] for name, tensor in tensors.items()}
        if progress is not None:
            progress.update(len(chunk_ids))
    packed = {
        name: torch.cat([per_sample[j][name] for j in range(len(samples))]).contiguous() for name in per_sample[0]
    }
    packed["offsets"] = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)
    return packed


def cache_features(
    target: PreTrainedModel,
    dataset: Any,
    layer_ids: list[int],
    out_dir: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    topk: int | None = None,
    with_logits: bool = True,
    shard_size: int = 512,
    batch_size: int = 8,
    data: dict[str, Any] | None = None,
) -> float:
    """Write the target's features for every sample of ``dataset`` (``input_ids``, ``loss_mask``); return bytes/token.

    Resumable: shards already on disk are kept (each is written to a temporary name and renamed, so a shard that
    exists is complete); ``meta.json`` pins the settings and data, and a rerun with different ones is an error.
    ``data``, the ``DataConfig`` fields the samples were built with, is recorded (not pinned: the data itself is, by
    hash) so that offline training can warn when its own ``data.*`` settings differ.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype_name = next((name for name, d in CACHE_DTYPES.items() if d == dtype), None)
    if dtype_name is None:
        raise ValueError(f"cache dtype {dtype} is not one of {list(CACHE_DTYPES)}.")
    settings = {
        "format_version": CACHE_FORMAT_VERSION,
        "layer_ids": list(layer_ids),
        "dtype": dtype_name,
        "topk": topk,
        "with_logits": with_logits and topk is None,
        "shard_size": shard_size,
        "num_samples": len(dataset),
        "data_sha1": _dataset_digest(dataset),
        "target": asdict(TargetRecord.from_model(target)),
    }
    check_feature_request(target, list(layer_ids), settings["with_logits"] or topk is not None, topk)
    record = {"data": None if data is None else {**data, "paths": _resolved(data["paths"])}}
    meta_path = out_dir / "meta.json"
    if meta_path.exists():
        previous = json.loads(meta_path.read_text())
        changed = sorted(k for k in settings if previous.get(k) != settings[k])
        if changed:
            raise ValueError(
                f"{out_dir} holds a cache made with other settings or data ({', '.join(changed)} differ); "
                "pass a new out_dir or delete this one."
            )
    _write_json(meta_path, {**settings, **record, "complete": False})
    num_shards = -(-len(dataset) // shard_size)
    with tqdm(total=len(dataset), desc="caching features", unit="sample") as progress:
        for shard in range(num_shards):
            path = _shard_path(out_dir, shard)
            indices = range(shard * shard_size, min((shard + 1) * shard_size, len(dataset)))
            if path.exists():
                progress.update(len(indices))  # finished by an earlier run
                continue
            samples = [dataset[j] for j in indices]
            tensors = _shard_tensors(
                target, samples, layer_ids, dtype, topk, settings["with_logits"], batch_size, progress
            )
            tmp = path.with_suffix(".tmp")
            save_file(tensors, str(tmp), metadata={"format_version": str(CACHE_FORMAT_VERSION)})
            os.replace(tmp, path)
    num_tokens = 0
    for shard in range(num_shards):
        with safe_open(_shard_path(out_dir, shard), framework="pt") as f:
            num_tokens += int(f.get_slice("offsets")[-1:].item())
    num_bytes = sum(_shard_path(out_dir, s).stat().st_size for s in range(num_shards))
    bytes_per_token = num_bytes / max(num_tokens, 1)
    _write_json(
        meta_path,
        {
            **settings,
            **record,
            "complete": True,
            "num_shards": num_shards,
            "num_tokens": num_tokens,
            "num_bytes": num_bytes,
            "bytes_per_token": bytes_per_token,
        },
    )
    logger.info("cached %d tokens, %d shards: %.1f bytes/token (%s)", num_tokens, num_shards, bytes_per_token, out_dir)
    return bytes_per_token


def _resolved(paths: list[str]) -> list[str]:
    return [str(Path(path).resolve()) for path in paths]


DATA_RECORDED = ("paths", "format", "max_length", "max_samples", "eval_fraction", "eval_size", "seed")
"""``data.*`` settings that decide a cache's samples; offline training reads the samples and ignores the settings."""


def check_cache_target(dataset: CachedFeatureDataset | ConcatFeatureCache, target: PreTrainedModel) -> None:
    """A cache's features must come from the target being trained: other shapes (layer count, hidden size,
    vocabulary) are an error; the same shapes under another name or model type are a warning (a renamed copy, or
    another model of the same size)."""
    cached, current = TargetRecord(**dataset.meta["target"]), TargetRecord.from_model(target)
    shapes = ("num_hidden_layers", "hidden_size", "vocab_size")
    differ = [
        f"{name} {getattr(cached, name)} vs {getattr(current, name)}"
        for name in shapes
        if getattr(cached, name) != getattr(current, name)
    ]
    if differ:
        raise ValueError(
            f"feature cache {dataset.out_dir} was written by target {cached.name_or_path!r}, which differs from the "
            f"training target {current.name_or_path!r} ({', '.join(differ)}); expected features of the target being "
            f"trained. Re-run `specheads data cache-features --target {current.name_or_path}`, or set target.name to "
            "the cache's target."
        )
    if (cached.name_or_path, cached.model_type) != (current.name_or_path, current.model_type):
        logger.warning(
            "feature cache %s was written by target %r (%s) and the training target is %r (%s): the shapes agree, so "
            "training goes on; make sure both are the same model",
            dataset.out_dir,
            cached.name_or_path,
            cached.model_type,
            current.name_or_path,
            current.model_type,
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
    current = {**asdict(data), "paths": _resolved(data.paths)}
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


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


class CachedFeatureDataset(Dataset):
    """Samples of an offline feature cache: ``input_ids``/``loss_mask`` (T,) long and the feature tensors (T, ...).

    Batch with ``collate_features(samples, dataset.pad_token_id)`` to get what online mode gives:
    ``(collate(...) dict, TargetFeatures)``. Needs no target model.
    """

    def __init__(self, out_dir: str | Path, pad_token_id: int = 0) -> None:
        self.out_dir = Path(out_dir)
        meta_path = self.out_dir / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{meta_path} not found: write the cache with `specheads data cache-features`.")
        self.meta = json.loads(meta_path.read_text())
        if not self.meta.get("complete"):
            raise ValueError(f"feature cache {self.out_dir} is incomplete: rerun cache-features to finish it.")
        self.pad_token_id = pad_token_id
        self.layer_ids: list[int] = self.meta["layer_ids"]
        self.target = TargetRecord(**self.meta["target"])
        self.shard_size: int = self.meta["shard_size"]
        self._offsets = []
        for shard in range(self.meta["num_shards"]):
            with safe_open(_shard_path(self.out_dir, shard), framework="pt") as f:
                self._offsets.append(f.get_tensor("offsets").tolist())

    def __len__(self) -> int:
        return self.meta["num_samples"]

    def lengths(self) -> list[int]:
        """Token count of every sample, in order."""
        return [b - a for offsets in self._offsets for a, b in zip(offsets[:-1], offsets[1:])]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for a cache of {len(self)} samples")
        shard, local = divmod(index, self.shard_size)
        start, end = self._offsets[shard][local], self._offsets[shard][local + 1]
        with safe_open(_shard_path(self.out_dir, shard), framework="pt") as f:
            sample = {name: f.get_slice(name)[start:end] for name in f.keys() if name != "offsets"}
        sample["input_ids"] = sample["input_ids"].long()
        sample["loss_mask"] = sample["loss_mask"].long()
        if "topk_indices" in sample:
            sample["topk_indices"] = sample["topk_indices"].long()
        return sample


class ConcatFeatureCache(ConcatDataset):
    """Several caches of one target, layer set and distribution format read as one dataset, in order: data added
    later needs only its own cache (``features.extra_cache_dirs``)."""

    MUST_MATCH = ("target", "layer_ids", "dtype", "topk", "with_logits")

    def __init__(self, caches: list[CachedFeatureDataset]) -> None:
        first = caches[0]
        for cache in caches[1:]:
            differ = [key for key in self.MUST_MATCH if cache.meta.get(key) != first.meta.get(key)]
            if differ:
                found = ", ".join(f"{key} {first.meta.get(key)!r} vs {cache.meta.get(key)!r}" for key in differ)
                raise ValueError(
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
