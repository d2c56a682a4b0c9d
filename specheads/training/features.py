"""What a draft head learns from: the frozen target's hidden states and next-token distribution.

Online mode runs the target inside each training step under ``no_grad`` (``extract_features``). Offline mode runs
it once over the dataset and writes the same tensors to safetensors shards (``cache_features``), so training can
read them back (``feature_cache``: ``CachedFeatureDataset`` + ``collate_features``) without loading the target: both
modes hand the loss the same ``TargetFeatures``.

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
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from specheads.heads.config import TargetRecord
from specheads.training.data import collate

logger = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 1
CACHE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SETTINGS_ADDED_LATER = ("loss_mask_sha1",)
"""Settings that caches written by earlier versions do not record: such a cache resumes without the check."""


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


def shard_path(out_dir: Path, shard: int) -> Path:
    return out_dir / f"shard-{shard:05d}.safetensors"


def same_setting(name: str, old: Any, new: Any) -> bool:
    """Whether a cache's recorded setting is the one asked for now. The target record gains fields over versions
    (its weight probe), and caches gain settings (the loss masks' digest): what a cache predates is not a difference."""
    if name in SETTINGS_ADDED_LATER and old is None:
        return True
    if name == "target" and isinstance(old, dict) and isinstance(new, dict):
        new = {key: value for key, value in new.items() if key in old}
        if old.get("weight_probe") and old.get("weight_probe") == new.get("weight_probe"):
            # the same weights under another spelling of their folder (relative, absolute, a renamed copy)
            old, new = ({k: v for k, v in d.items() if k != "name_or_path"} for d in (old, new))
        return old == new
    return old == new


def _dataset_digests(dataset: Any, columns: dict[str, str]) -> dict[str, str]:
    """Content hashes of columns (token ids, loss masks), named as ``columns`` maps them, in one pass over the
    samples, so resuming into a cache made from other data is an error."""
    digests = {name: hashlib.sha1() for name in columns}
    for sample in dataset:
        for name, column in columns.items():
            digests[name].update(json.dumps(sample[column]).encode())
    return {name: digest.hexdigest() for name, digest in digests.items()}


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
    settings = _cache_settings(target, dataset, layer_ids, dtype, topk, with_logits, shard_size)
    check_feature_request(target, list(layer_ids), settings["with_logits"] or topk is not None, topk)
    record = {"data": None if data is None else {**data, "paths": resolved_paths(data["paths"])}}
    meta_path = out_dir / "meta.json"
    _check_same_settings(meta_path, settings)
    _write_json(meta_path, {**settings, **record, "complete": False})
    num_shards = -(-len(dataset) // shard_size)
    with tqdm(total=len(dataset), desc="caching features", unit="sample") as progress:
        for shard in range(num_shards):
            path = shard_path(out_dir, shard)
            indices = range(shard * shard_size, min((shard + 1) * shard_size, len(dataset)))
            if path.exists() and _shard_reads(path, len(indices)):
                progress.update(len(indices))  # finished by an earlier run
                continue
            samples = [dataset[j] for j in indices]
            tensors = _shard_tensors(
                target, samples, layer_ids, dtype, topk, settings["with_logits"], batch_size, progress
            )
            tmp = path.with_suffix(".tmp")
            save_file(tensors, str(tmp), metadata={"format_version": str(CACHE_FORMAT_VERSION)})
            with open(tmp, "rb") as written:  # on disk before the rename: a power loss leaves no empty shard
                os.fsync(written.fileno())
            os.replace(tmp, path)
    num_tokens, num_bytes = _cache_size(out_dir, num_shards)
    bytes_per_token = num_bytes / max(num_tokens, 1)
    sizes = {"num_shards": num_shards, "num_tokens": num_tokens, "num_bytes": num_bytes}
    _write_json(meta_path, {**settings, **record, "complete": True, **sizes, "bytes_per_token": bytes_per_token})
    logger.info("cached %d tokens, %d shards: %.1f bytes/token (%s)", num_tokens, num_shards, bytes_per_token, out_dir)
    return bytes_per_token


def _cache_settings(
    target: PreTrainedModel,
    dataset: Any,
    layer_ids: list[int],
    dtype: torch.dtype,
    topk: int | None,
    with_logits: bool,
    shard_size: int,
) -> dict[str, Any]:
    """What a cache is pinned to (`meta.json`): a rerun with any of it changed is refused, not mixed in."""
    dtype_name = next((name for name, d in CACHE_DTYPES.items() if d == dtype), None)
    if dtype_name is None:
        raise ValueError(f"cache dtype {dtype} is not one of {list(CACHE_DTYPES)}.")
    return {
        "format_version": CACHE_FORMAT_VERSION,
        "layer_ids": list(layer_ids),
        "dtype": dtype_name,
        "topk": topk,
        "with_logits": with_logits and topk is None,
        "shard_size": shard_size,
        "num_samples": len(dataset),
        **_dataset_digests(dataset, {"data_sha1": "input_ids", "loss_mask_sha1": "loss_mask"}),
        "target": asdict(TargetRecord.from_model(target)),
    }


def _check_same_settings(meta_path: Path, settings: dict[str, Any]) -> None:
    """A rerun resumes a cache only with the settings and data that began it."""
    if not meta_path.exists():
        return
    previous = json.loads(meta_path.read_text())
    changed = sorted(k for k in settings if not same_setting(k, previous.get(k), settings[k]))
    if changed:
        raise ValueError(
            f"{meta_path.parent} holds a cache made with other settings or data ({', '.join(changed)} differ); "
            "pass a new out_dir or delete this one."
        )


def _shard_reads(path: Path, samples: int) -> bool:
    """Whether a shard an earlier run left reads back with its samples' offsets; one that does not is written again."""
    try:
        with safe_open(str(path), framework="pt") as f:
            whole = f.get_slice("offsets").get_shape() == [samples + 1]
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
        whole, why = False, f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
    else:
        why = "another number of samples"
    if not whole:
        logger.warning("%s does not read back whole (%s): writing it again", path, why)
    return whole


def _cache_size(out_dir: Path, num_shards: int) -> tuple[int, int]:
    """Tokens and bytes of the shards on disk (each shard's last offset is its token count)."""
    num_tokens = 0
    for shard in range(num_shards):
        with safe_open(shard_path(out_dir, shard), framework="pt") as f:
            num_tokens += int(f.get_slice("offsets")[-1:].item())
    return num_tokens, sum(shard_path(out_dir, s).stat().st_size for s in range(num_shards))


def resolved_paths(paths: list[str]) -> list[str]:
    return [str(Path(path).resolve()) for path in paths]


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


class FeatureSource:
    """Where a batch's target features come from: the frozen target (online) or the cache (offline).

    Online batches are dicts; offline batches are ``(dict, TargetFeatures)`` pairs from ``collate_features``.
    """

    def __init__(self, target: PreTrainedModel, layer_ids: list[int], with_logits: bool) -> None:
        self.target = target
        self.layer_ids = layer_ids
        self.with_logits = with_logits

    @torch.no_grad()
    def __call__(self, batch: dict[str, Any] | tuple[dict[str, Any], Any]) -> tuple[dict[str, Any], Any]:
        if isinstance(batch, (tuple, list)):
            batch, cached = batch
            device = batch["input_ids"].device
            moved = {name: value.to(device) for name, value in cached.hidden_states.items()}
            for name in ("logits", "topk_values", "topk_indices"):
                if getattr(cached, name) is not None:
                    setattr(cached, name, getattr(cached, name).to(device))
            cached.hidden_states = moved
            return batch, cached
        if not (self.layer_ids or self.with_logits):
            return batch, None
        features = extract_features(
            self.target, batch["input_ids"], batch["attention_mask"], self.layer_ids, with_logits=self.with_logits
        )
        return batch, features
