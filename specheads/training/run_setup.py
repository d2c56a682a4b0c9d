"""What a training run is built from, before its first step: the head (fresh or warm-started), the datasets and
their loaders, the optimizer and its schedule, and the checks that fail in seconds rather than after the target
loaded. The loop that runs them is ``training/loop.py``."""

from __future__ import annotations

import copy
import logging
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import PreTrainedModel, PreTrainedTokenizerBase, get_scheduler
from transformers.trainer_pt_utils import LengthGroupedSampler

from specheads.heads import HEADS, DraftHead, EagleHead, build_vocab_maps, load_head
from specheads.heads.borrowed import warn_on_unknown_logit_finish
from specheads.heads.interop import export_obstacle
from specheads.heads.tree_layers import warn_if_trees_cannot_be_verified
from specheads.training.chat_format import require_file
from specheads.training.config import ConfigError, TrainConfig
from specheads.training.data import build_datasets, collate
from specheads.training.feature_cache import (
    FEATURE_CACHES,
    CachedFeatureDataset,
    ConcatFeatureCache,
    collate_features,
    open_feature_caches,
    read_cache_meta,
)
from specheads.training.launch import has_accelerator, resolve_mixed_precision
from specheads.training.objective import hold_adapters, parameter_groups

logger = logging.getLogger(__name__)


def check_before_loading(cfg: TrainConfig) -> str:
    """The settings that can be refused before the target loads; returns the resolved mixed precision."""
    precision = resolve_mixed_precision(cfg.train.mixed_precision)
    if precision == "fp16" and not has_accelerator():
        raise ConfigError(
            "train.mixed_precision=fp16 needs a GPU (on CPU, Accelerate would silently train in fp32); "
            "use train.mixed_precision=bf16 (CPU autocast) or no."
        )
    if cfg.features.mode == "online":  # a mistyped data path fails in seconds, not after the target loaded
        if not cfg.data.paths:
            raise ConfigError(
                "data.paths is empty: set it to one or more JSON/JSONL files (or train from a feature cache with "
                "features.mode=offline)."
            )
        for path in cfg.data.paths:
            require_file(path, "data file")
    else:  # a mistyped or unfinished cache, likewise
        for root in [cfg.features.cache_dir, *cfg.features.extra_cache_dirs]:
            for split in ("train", "eval"):
                read_cache_meta(Path(root) / split)
    return precision


def build_head(cfg: TrainConfig, target: PreTrainedModel, train_dataset: Any) -> DraftHead:
    """The head named by ``cfg.head``, in fp32 whatever the target's dtype (AdamW updates to bf16 weights would mostly
    round away; ``train.mixed_precision`` runs the matmuls in bf16); an EAGLE-3 reduced vocabulary is built from the
    training tokens. The final head is saved in the target's dtype, as inference runs it.

    With ``head.init_from`` the saved head is loaded instead (its config and, for EAGLE-3, its draft vocabulary).
    """
    warn_on_unknown_logit_finish(target)
    warn_if_trees_cannot_be_verified(target)
    head = _warm_start(cfg, target) if cfg.head.init_from else _fresh_head(cfg, target, train_dataset).float()
    reason = export_obstacle(head, target)
    if reason is not None:  # the head still trains and decodes with specheads; serving it elsewhere needs others
        logger.info("`specheads export` (vLLM) will refuse this head as configured: %s", reason)
    return head


def _fresh_head(cfg: TrainConfig, target: PreTrainedModel, train_dataset: Any) -> DraftHead:
    head_cls = HEADS[cfg.head.type]
    config = head_cls.config_class.from_dict(copy.deepcopy(dict(cfg.head.options)))
    vocab = target.config.get_text_config().vocab_size
    draft_vocab = getattr(config, "draft_vocab_size", None)
    if head_cls is EagleHead and config.version == 3 and draft_vocab and draft_vocab < vocab:
        d2t, _ = build_vocab_maps(loss_tokens(train_dataset), vocab, draft_vocab)
        return EagleHead(config, target, d2t=d2t)
    return head_cls(config, target)


def _warm_start(cfg: TrainConfig, target: PreTrainedModel) -> DraftHead:
    head = load_head(cfg.head.init_from, target, trainable=True)
    if head.head_type != cfg.head.type:
        raise ConfigError(
            f"head.init_from={cfg.head.init_from!r} holds a {head.head_type!r} head but head.type is "
            f"{cfg.head.type!r}; set head.type={head.head_type} or start from a {cfg.head.type} head"
        )
    saved = head.config.to_dict()
    conflicts = {k: (v, saved[k]) for k, v in cfg.head.options.items() if k in saved and saved[k] != v}
    if conflicts:
        listed = ", ".join(f"{k}: config {v!r} vs saved {s!r}" for k, (v, s) in conflicts.items())
        raise ConfigError(
            f"head.options disagree with the head in head.init_from={cfg.head.init_from!r} ({listed}); a warm start "
            "keeps the saved architecture: drop these options or make them match"
        )
    return head


def datasets(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase) -> tuple[Any, Any, Any]:
    """Train and eval datasets and their collate function (online: tokenized chats; offline: feature caches)."""
    pad = tokenizer.pad_token_id
    if cfg.features.mode == "offline":
        roots = [Path(cfg.features.cache_dir), *map(Path, cfg.features.extra_cache_dirs)]
        return (
            open_feature_caches([root / "train" for root in roots]),
            open_feature_caches([root / "eval" for root in roots]),
            partial(collate_features, pad_token_id=pad),
        )
    train_ds, eval_ds = build_datasets(cfg.data, tokenizer)
    return train_ds, eval_ds, partial(collate, pad_token_id=pad)


class EpochLengthGroupedSampler(LengthGroupedSampler):
    """transformers' length-grouped order (shuffled mega-batches sorted by length), reseeded from ``seed + epoch``
    so that an epoch's order does not depend on how many epochs this process has run: resume stays exact."""

    def __init__(self, batch_size: int, lengths: list[int], seed: int) -> None:
        super().__init__(batch_size, lengths=lengths, generator=torch.Generator().manual_seed(seed))
        self.seed = seed

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed(self.seed + epoch)


def lengths(dataset: Any) -> list[int]:
    """Token count of every sample (offline caches read it from the shard offsets, without loading features)."""
    if isinstance(dataset, FEATURE_CACHES):
        return dataset.lengths()
    return [len(ids) for ids in dataset["input_ids"]]


def loss_tokens(dataset: Any) -> list[list[int]]:
    """Assistant tokens of every training sample (what an EAGLE-3 draft vocabulary is counted from)."""
    if isinstance(dataset, FEATURE_CACHES):
        return dataset.loss_tokens()
    return [[t for t, m in zip(ids, mask) if m] for ids, mask in zip(dataset["input_ids"], dataset["loss_mask"])]


def check_cache(dataset: CachedFeatureDataset | ConcatFeatureCache, layer_ids: list[int], needs_logits: bool) -> None:
    path = dataset.out_dir
    missing = sorted(set(layer_ids) - set(dataset.layer_ids))
    has_distribution = dataset.meta.get("with_logits") or dataset.meta.get("topk")
    if missing or (needs_logits and not has_distribution):
        fixes = [f"--layer-ids {' '.join(map(str, sorted(layer_ids)))}"] if missing else []
        fixes += ["without --no-logits (full logits, or --topk K)"] if needs_logits and not has_distribution else []
        raise ConfigError(
            f"feature cache {path} holds hidden states {dataset.layer_ids} "
            f"{'and a target distribution' if has_distribution else 'and no target distribution'}; this head needs "
            f"hidden states {layer_ids}{' and the distribution' if needs_logits else ''}. Re-run "
            f"`specheads data cache-features` {' and '.join(fixes)} into a new --out-dir"
        )


def loaders(cfg: TrainConfig, train_ds: Any, eval_ds: Any, merge: Any) -> tuple[DataLoader, DataLoader]:
    """The train loader (shuffled, or grouped by length; seeded so loader workers never draw from the global RNG)
    and the eval loader."""
    tc = cfg.train
    if tc.group_by_length:
        sampler = EpochLengthGroupedSampler(tc.batch_size, lengths(train_ds), tc.seed)
        train_loader = DataLoader(train_ds, batch_size=tc.batch_size, sampler=sampler, collate_fn=merge)
    else:
        generator = torch.Generator().manual_seed(tc.seed)
        train_loader = DataLoader(
            train_ds, batch_size=tc.batch_size, shuffle=True, collate_fn=merge, generator=generator
        )
    return train_loader, DataLoader(eval_ds, batch_size=tc.eval_batch_size, collate_fn=merge)


def optimizer_and_scheduler(
    cfg: TrainConfig, objective: nn.Module, num_processes: int
) -> tuple[list[dict[str, Any]], torch.optim.Optimizer, Any]:
    """AdamW over the objective's parameter groups (the heads, and Medusa-2's adapters at ``lora.lr``) and its
    learning-rate schedule. Accelerate steps a prepared scheduler once per process per update, so it counts in those
    units."""
    tc, n = cfg.train, num_processes
    groups = parameter_groups(objective, tc.lr, cfg.lora.lr)
    optimizer = torch.optim.AdamW(
        groups, lr=tc.lr, betas=tuple(tc.adam_betas), eps=tc.adam_eps, weight_decay=tc.weight_decay
    )
    scheduler = get_scheduler(
        tc.scheduler, optimizer, num_warmup_steps=tc.warmup_steps * n, num_training_steps=tc.max_steps * n
    )
    if len(groups) > 1 and cfg.lora.heads_warmup_steps:
        scheduler = hold_adapters(scheduler, cfg.lora.heads_warmup_steps, tc.warmup_steps, ticks_per_step=n)
    return groups, optimizer, scheduler
