"""One Accelerate training loop for every head type, from one CPU process to DeepSpeed ZeRO-3.

Only the objective (the head, plus Medusa-2's LoRA adapters), the optimizer, the train dataloader and the scheduler
are prepared; the frozen target stays a plain module on the device and is never wrapped, sharded or saved (Medusa-2's
objective holds it, and its checkpoints leave its frozen weights out: ``keep_trainable_state_only``).
A "step" is one optimizer update (``grad_accum`` micro-batches, each weighted by its loss tokens:
``accumulation``). Data order is a function of (seed, epoch) via
Accelerate's seedable sampler, and resume skips exactly the micro-batches already consumed, so a resumed run ends
with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
    set_seed,
)
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase, get_scheduler
from transformers.trainer_pt_utils import LengthGroupedSampler

from specheads.heads import HEADS, DraftHead, EagleDrafter, build_vocab_maps, load_head
from specheads.heads.borrowed import warn_on_unknown_logit_finish
from specheads.heads.interop import export_obstacle
from specheads.heads.tree_layers import warn_if_trees_cannot_be_verified
from specheads.target import load_target
from specheads.training.accumulation import accumulation_rounds, micro_batches, token_weights
from specheads.training.checkpoint import (
    check_resume_config,
    check_resume_data,
    data_digest,
    keep_trainable_state_only,
    load_checkpoint,
    output_lock,
    read_rank_state,
    read_step,
    resolve_resume,
    save_checkpoint,
)
from specheads.training.config import ConfigError, TrainConfig, to_container, to_yaml
from specheads.training.data import DataError, build_datasets, collate
from specheads.training.feature_cache import (
    FEATURE_CACHES,
    CachedFeatureDataset,
    ConcatFeatureCache,
    check_cache_target,
    collate_features,
    open_feature_caches,
    warn_ignored_data_settings,
)
from specheads.training.features import FeatureSource
from specheads.training.launch import (
    check_world,
    cpu_processes,
    has_accelerator,
    launch_device,
    process_group_kwargs,
    resolve_mixed_precision,
    sync_deepspeed_clipping,
)
from specheads.training.losses import Stats, add_stats
from specheads.training.metrics import Throughput, bar_fields, evaluate, reduce_stats, weights_checksum, with_tau
from specheads.training.objective import build_objective, hold_adapters, parameter_groups
from specheads.training.tracking import flatten, tracker_setup

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    output_dir: Path
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)  # every eval, step 0 = the untrained head
    finished: bool = True  # False when stopped by ``train.stop_after`` (no final head saved)
    checksum: float = 0.0  # of this rank's trainable weights: ranks of a data-parallel run must agree
    target_tokens_per_s: float = 0.0  # non-padding tokens trained on per second, all ranks, eval/saves excluded


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
    if head_cls is EagleDrafter and config.version == 3 and draft_vocab and draft_vocab < vocab:
        d2t, _ = build_vocab_maps(_loss_tokens(train_dataset), vocab, draft_vocab)
        return EagleDrafter(config, target, d2t=d2t)
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


def _datasets(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase) -> tuple[Any, Any, Any]:
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


def _lengths(dataset: Any) -> list[int]:
    """Token count of every sample (offline caches read it from the shard offsets, without loading features)."""
    if isinstance(dataset, FEATURE_CACHES):
        return dataset.lengths()
    return [len(ids) for ids in dataset["input_ids"]]


def _loss_tokens(dataset: Any) -> list[list[int]]:
    """Assistant tokens of every training sample (what an EAGLE-3 draft vocabulary is counted from)."""
    if isinstance(dataset, FEATURE_CACHES):
        return dataset.loss_tokens()
    return [[t for t, m in zip(ids, mask) if m] for ids, mask in zip(dataset["input_ids"], dataset["loss_mask"])]


def _check_cache(dataset: CachedFeatureDataset | ConcatFeatureCache, layer_ids: list[int], needs_logits: bool) -> None:
    path = dataset.out_dir
    missing = sorted(set(layer_ids) - set(dataset.layer_ids))
    has_distribution = dataset.meta.get("with_logits") or dataset.meta.get("topk")
    if missing or (needs_logits and not has_distribution):
        raise ConfigError(
            f"feature cache {path} holds hidden states {dataset.layer_ids} "
            f"{'and a target distribution' if has_distribution else 'and no target distribution'}; this head needs "
            f"hidden states {layer_ids}{' and the distribution' if needs_logits else ''}. Re-run "
            "`specheads data cache-features` with the head's layer ids."
        )


def train(
    cfg: TrainConfig, target: PreTrainedModel | None = None, tokenizer: PreTrainedTokenizerBase | None = None
) -> TrainResult:
    """Train the head described by ``cfg``; save it (and Medusa-2's adapter in ``lora/``) to ``train.output_dir``.

    ``target``/``tokenizer`` skip loading ``cfg.target.name`` (tests share one copy). With ``lora.enabled`` the given
    target receives LoRA adapters in place, so pass a copy you do not need unchanged; its train/eval mode is restored.
    One run at a time writes to an output folder (``checkpoint.output_lock``).
    """
    with output_lock(Path(cfg.train.output_dir)), _library_progress_bars(cfg.train.progress_bar):
        return _train(cfg, target, tokenizer)


@contextlib.contextmanager
def _library_progress_bars(shown: bool) -> Iterator[None]:
    """``train.progress_bar=false`` silences the libraries' bars too (loading weights, reading and tokenizing the
    data), not only the training bar; they are put back as they were afterwards."""
    import datasets
    from transformers.utils import logging as hf_logging

    if shown:
        yield
        return
    datasets_were_on, transformers_were_on = datasets.is_progress_bar_enabled(), hf_logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if datasets_were_on:
            datasets.enable_progress_bars()
        if transformers_were_on:
            hf_logging.enable_progress_bar()


def _train(cfg: TrainConfig, target: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase | None) -> TrainResult:
    tc = cfg.train
    out = Path(tc.output_dir)
    resume_from = resolve_resume(tc.resume, out)  # before any loading: a wrong resume fails in seconds
    if resume_from is not None:
        check_resume_config(resume_from, to_yaml(cfg))
    log_with, init_kwargs = tracker_setup(cfg, resuming=resume_from is not None)
    precision = resolve_mixed_precision(tc.mixed_precision)
    if precision == "fp16" and not has_accelerator():
        raise ConfigError(
            "train.mixed_precision=fp16 needs a GPU (on CPU, Accelerate would silently train in fp32); "
            "use train.mixed_precision=bf16 (CPU autocast) or no."
        )
    if cfg.features.mode == "online":  # a mistyped data path fails in seconds, not after the target loaded
        missing = [path for path in cfg.data.paths if not Path(path).is_file()]
        if missing:
            raise DataError(f"data file not found: {missing[0]}")
    if target is None:  # before the Accelerator exists, so ZeRO-3 cannot build the frozen target pre-sharded
        target, tokenizer = load_target(cfg.target.name, dtype=getattr(torch, cfg.target.dtype), device=launch_device())
    target_was_training = target.training
    accelerator = Accelerator(
        cpu=cpu_processes(),
        mixed_precision=precision,
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=tc.grad_accum, sync_with_dataloader=False),
        log_with=log_with,
        project_config=ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "logs")),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        kwargs_handlers=process_group_kwargs(tc.dist_timeout_s),
    )
    check_world(accelerator)
    keep_trainable_state_only(accelerator)
    set_seed(tc.seed)
    target.to(accelerator.device)
    with accelerator.main_process_first():
        train_ds, eval_ds, merge = _datasets(cfg, tokenizer)
    if cfg.features.mode == "offline":
        check_cache_target(train_ds, target)
        check_cache_target(eval_ds, target)
        if accelerator.is_main_process:
            warn_ignored_data_settings(cfg.data, train_ds)
    # what checkpoints record and a resume checks: one pass over the data, so only when either happens
    digest = data_digest(train_ds, eval_ds) if tc.save_every or resume_from is not None else None
    if resume_from is not None:
        check_resume_data(resume_from, digest)
    head = build_head(cfg, target, train_ds)
    objective = build_objective(head, target, cfg.loss, cfg.lora, tc.seed)
    # Medusa-2 runs its adapted target itself (with gradients), so it needs no separate feature pass.
    layer_ids = [] if getattr(objective, "runs_target", False) else head.layer_ids
    features = FeatureSource(target, layer_ids, with_logits=objective.needs_logits)
    for dataset in (train_ds, eval_ds):
        if isinstance(dataset, FEATURE_CACHES):
            _check_cache(dataset, layer_ids, objective.needs_logits)
    generator = torch.Generator().manual_seed(tc.seed)  # loader worker seeds never draw from the global RNG
    if tc.group_by_length:
        sampler = EpochLengthGroupedSampler(tc.batch_size, _lengths(train_ds), tc.seed)
        train_loader = DataLoader(train_ds, batch_size=tc.batch_size, sampler=sampler, collate_fn=merge)
    else:
        train_loader = DataLoader(
            train_ds, batch_size=tc.batch_size, shuffle=True, collate_fn=merge, generator=generator
        )
    eval_loader = DataLoader(eval_ds, batch_size=tc.eval_batch_size, collate_fn=merge)
    groups = parameter_groups(objective, tc.lr, cfg.lora.lr)
    optimizer = torch.optim.AdamW(
        groups, lr=tc.lr, betas=tuple(tc.adam_betas), eps=tc.adam_eps, weight_decay=tc.weight_decay
    )
    # Accelerate steps a prepared scheduler once per process per update, so count in those units.
    n = accelerator.num_processes
    scheduler = get_scheduler(
        tc.scheduler, optimizer, num_warmup_steps=tc.warmup_steps * n, num_training_steps=tc.max_steps * n
    )
    if len(groups) > 1 and cfg.lora.heads_warmup_steps:
        scheduler = hold_adapters(scheduler, cfg.lora.heads_warmup_steps, tc.warmup_steps, ticks_per_step=n)
    if accelerator.state.deepspeed_plugin is not None:
        sync_deepspeed_clipping(accelerator.state.deepspeed_plugin.deepspeed_config, tc.max_grad_norm)
    objective, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        objective, optimizer, train_loader, eval_loader, scheduler
    )
    # After prepare: FSDP replaces parameters by sharded ones, and its clipping needs the model's full list.
    params = list(objective.parameters())

    step = 0
    window: Stats = {}  # per-rank sums since the last logged step
    if resume_from is not None:
        load_checkpoint(accelerator, resume_from, objective)
        step = read_step(resume_from)
        saved_window = read_rank_state(resume_from, accelerator.process_index).get("log_window", {})
        window = {k: torch.tensor(v, device=accelerator.device) for k, v in saved_window.items()}
        logger.info("resumed from %s at step %d", resume_from, step)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_config.yaml").write_text(to_yaml(cfg))
    if log_with is not None:
        accelerator.init_trackers(tc.project, config=flatten(to_container(cfg)), init_kwargs=init_kwargs)

    history: list[dict[str, float]] = []

    def run_eval() -> dict[str, float]:
        metrics = evaluate(accelerator, objective, eval_loader, features, tc.eval_batches)
        history.append({"step": step, **metrics})
        accelerator.log(metrics, step=step)
        return metrics

    metrics = run_eval() if tc.eval_every and step == 0 else {}
    if resume_from is not None and step >= tc.max_steps:  # nothing left to train: the head is saved with its numbers
        logger.info("%s is at train.max_steps=%d already: nothing to train; saving the head", resume_from, step)
        metrics = run_eval() if tc.eval_every else {}
    micro = step * tc.grad_accum  # micro-batches consumed so far (a step spans an epoch's end; see accumulation)
    throughput = Throughput(accelerator)
    bar = tqdm(total=tc.max_steps, initial=step, disable=not (tc.progress_bar and accelerator.is_main_process))
    stopped = False
    objective.train()
    rounds = accumulation_rounds(micro_batches(accelerator, train_loader, micro), tc.grad_accum)
    while step < tc.max_steps and not stopped:
        group = next(rounds)
        weights = token_weights(accelerator, group, tc.grad_accum, tc.weight_by_tokens)  # one all-reduce
        for batch, (weight, tokens) in zip(group, weights):
            throughput.count(batch)
            draw = micro * accelerator.num_processes + accelerator.process_index
            micro += 1
            with accelerator.accumulate(objective):
                loss, stats = objective(*features(batch), draw)
                accelerator.backward(loss * weight)  # token-weighted: the step's gradient is its tokens' mean
                if accelerator.sync_gradients and tc.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(params, tc.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            stats["loss"] = torch.stack([loss.detach().float() * tokens, tokens])
            add_stats(window, stats)
        if not accelerator.sync_gradients:  # Accelerate's own count of A micro-batches must end with the group
            raise RuntimeError(f"optimizer step out of step with the {len(group)} micro-batches accumulated")
        step += 1
        bar.update(1)
        if step % tc.log_every == 0 or step == tc.max_steps:
            logged = {f"train/{k}": v for k, v in reduce_stats(accelerator, window).items()}
            logged["train/lr"] = scheduler.get_last_lr()[0]
            if len(groups) > 1:
                logged["train/lr_lora"] = scheduler.get_last_lr()[1]
            logged["train/target_tokens_per_s"] = throughput.window_rate()
            accelerator.log(with_tau(logged, "train/"), step=step)
            bar.set_postfix(loss=f"{logged['train/loss']:.3f}", **bar_fields(metrics))
            window = {}
        if tc.eval_every and (step % tc.eval_every == 0 or step == tc.max_steps):
            with throughput.paused():
                metrics = run_eval()
            bar.set_postfix(**bar_fields(metrics))
        if tc.save_every and step % tc.save_every == 0:
            with throughput.paused():
                log_window = {k: v.tolist() for k, v in window.items()}  # the next logged loss spans the resume
                save_checkpoint(accelerator, out, step, tc.keep_last, to_yaml(cfg), digest, {"log_window": log_window})
        if tc.stop_after is not None and step >= tc.stop_after:
            stopped = True
    bar.close()
    accelerator.wait_for_everyone()
    for tracker in accelerator.trackers:  # close run files before the final save rewrites the output folder
        tracker.finish()
    checksum = weights_checksum(accelerator.unwrap_model(objective))
    finished = not (stopped and step < tc.max_steps)
    if finished:
        _save_final(accelerator, objective, cfg, target, metrics, out)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    target.train(target_was_training)  # Medusa-2's objective switched the adapters inside it to train mode
    return TrainResult(out, step, metrics, history, finished, checksum, target_tokens_per_s=throughput.overall_rate())


def _save_final(accelerator, objective, cfg: TrainConfig, target, metrics: dict[str, float], out: Path) -> None:
    """Gather full weights (ZeRO-3 shards them), rebuild the head from them on the main process, save it."""
    state = accelerator.get_state_dict(objective)  # every rank must call this
    if not accelerator.is_main_process:
        return
    unwrapped = accelerator.unwrap_model(objective)
    live = unwrapped.head
    builder = getattr(type(live), "for_loading", type(live))
    head = builder(copy.deepcopy(live.config), target)
    head.load_state_dict(_submodule_state(state, "head"), strict=True)
    from specheads.heads.card import ADAPTER_KEY
    from specheads.heads.hub import save_lora_adapter

    adapted = getattr(unwrapped, "adapted", None)  # Medusa-2's LoRA adapter: saved with the heads, as one unit
    write_adapter = None
    if adapted is not None:  # the adapter as published: no peft template card, the target named as the user gave it
        weights = _submodule_state(state, "adapted")  # gathered: under FSDP2 the peft model's own tensors are shards
        write_adapter = partial(save_lora_adapter, adapted, target_name=cfg.target.name, state_dict=weights)
    card = {"training": to_container(cfg), "metrics": metrics, ADAPTER_KEY: adapted is not None}  # card before lora/
    if "eval/tau" in metrics:
        card["acceptance"] = {"simulated_chain_tau": metrics["eval/tau"]}
    head.save_pretrained(out, card=card, write_adapter=write_adapter)


def _submodule_state(state: dict[str, Any], name: str) -> dict[str, Any]:
    """The entries of a full state dict under submodule ``name``, keyed as that submodule's own state dict."""
    return {key[len(name) + 1 :]: value for key, value in state.items() if key.startswith(f"{name}.")}
