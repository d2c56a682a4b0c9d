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
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.heads.tree_layers import mask_probe_obstacle
from specheads.target import TargetLoadError, load_target
from specheads.training.accumulation import accumulation_rounds, micro_batches, token_weights
from specheads.training.checkpoint import (
    keep_trainable_state_only,
    load_checkpoint,
    output_lock,
    read_rank_state,
    read_step,
    save_checkpoint,
)
from specheads.training.config import TrainConfig, to_container, to_yaml
from specheads.training.feature_cache import (
    FEATURE_CACHES,
    check_cache_target,
    warn_ignored_data_settings,
)
from specheads.training.features import FeatureSource
from specheads.training.launch import (
    check_accumulation,
    check_world,
    cpu_processes,
    launch_device,
    launched_world,
    process_group_kwargs,
    sync_deepspeed_config,
)
from specheads.training.losses import Stats, add_stats
from specheads.training.metrics import Throughput, bar_fields, evaluate, reduce_stats, weights_checksum, with_tau
from specheads.training.objective import build_objective
from specheads.training.resume import (
    check_resume_config,
    check_resume_data,
    check_resume_world,
    data_digest,
    resolve_resume,
)
from specheads.training.run_setup import (
    build_head,
    check_before_loading,
    check_cache,
    datasets,
    loaders,
    optimizer_and_scheduler,
)
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


@dataclass
class _Run:
    """What ``_prepare`` builds and the loop reads: the prepared objective, optimizer, loaders and schedule, the
    feature source, and what a resume and the checkpoints need."""

    accelerator: Accelerator
    objective: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    train_loader: DataLoader
    eval_loader: DataLoader
    features: FeatureSource
    params: list[nn.Parameter]  # after prepare: FSDP replaces parameters by sharded ones; clipping needs them all
    adapters: bool  # Medusa-2's LoRA adapters train as a second parameter group
    target: PreTrainedModel
    target_was_training: bool
    resume_from: Path | None
    digest: Any  # the data digest checkpoints record, or None when neither saving nor resuming
    trackers: tuple[Any, dict[str, Any]]  # Accelerate's log_with and the trackers' init kwargs


def _prepare(cfg: TrainConfig, target: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase | None) -> _Run:
    """Everything before the first step: checks, the target, the Accelerator, data, head, objective, optimizer."""
    tc = cfg.train
    resume_from = resolve_resume(tc.resume, Path(tc.output_dir))  # before any loading: a wrong resume fails fast
    if resume_from is not None:
        check_resume_config(resume_from, to_yaml(cfg))
        check_resume_world(resume_from, launched_world())  # the launch's process count, known before anything loads
    log_with, init_kwargs = tracker_setup(cfg, resuming=resume_from is not None)
    precision = check_before_loading(cfg)
    if target is None:  # before the Accelerator exists, so ZeRO-3 cannot build the frozen target pre-sharded
        # a forward ignoring the tree mask is refused; other obstacles only warn (build_head): the head still exports
        target, tokenizer = load_target(
            cfg.target.name, dtype=getattr(torch, cfg.target.dtype), device=launch_device(), check_tree_attention=False
        )
        if (reason := mask_probe_obstacle(target)) is not None:
            raise TargetLoadError(reason)
    target_was_training = target.training
    accelerator = _accelerator(cfg, precision, log_with)
    target.to(accelerator.device)
    with accelerator.main_process_first():
        train_ds, eval_ds, merge = datasets(cfg, tokenizer)
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
            check_cache(dataset, layer_ids, objective.needs_logits)
    train_loader, eval_loader = loaders(cfg, train_ds, eval_ds, merge)
    groups, optimizer, scheduler = optimizer_and_scheduler(cfg, objective, accelerator.num_processes)
    if accelerator.state.deepspeed_plugin is not None:
        sync_deepspeed_config(accelerator.state.deepspeed_plugin.deepspeed_config, tc.max_grad_norm, tc.grad_accum)
    objective, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        objective, optimizer, train_loader, eval_loader, scheduler
    )
    check_accumulation(accelerator, tc.grad_accum)
    return _Run(
        accelerator, objective, optimizer, scheduler, train_loader, eval_loader, features,
        list(objective.parameters()), len(groups) > 1, target, target_was_training, resume_from, digest,
        (log_with, init_kwargs),
    )  # fmt: skip


def _accelerator(cfg: TrainConfig, precision: str, log_with: Any) -> Accelerator:
    """The run's Accelerator, the world checked and the seed set; checkpoints keep the trainable state only."""
    out = Path(cfg.train.output_dir)
    accelerator = Accelerator(
        cpu=cpu_processes(),
        mixed_precision=precision,
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=cfg.train.grad_accum, sync_with_dataloader=False
        ),
        log_with=log_with,
        project_config=ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "logs")),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        kwargs_handlers=process_group_kwargs(cfg.train.dist_timeout_s),
    )
    check_world(accelerator)
    keep_trainable_state_only(accelerator)
    set_seed(cfg.train.seed)
    return accelerator


def _start(run: _Run, cfg: TrainConfig) -> tuple[int, Stats]:
    """The step to start from and the unlogged per-rank sums (a checkpoint's, or 0 and none); writes the run's
    config into the output folder and starts the trackers."""
    accelerator, step, window = run.accelerator, 0, {}
    if run.resume_from is not None:
        load_checkpoint(accelerator, run.resume_from, run.objective)
        step = read_step(run.resume_from)
        saved_window = read_rank_state(run.resume_from, accelerator.process_index).get("log_window", {})
        window = {k: torch.tensor(v, device=accelerator.device) for k, v in saved_window.items()}
        logger.info("resumed from %s at step %d", run.resume_from, step)
    if accelerator.is_main_process:
        out = Path(cfg.train.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_config.yaml").write_text(to_yaml(cfg))
    log_with, init_kwargs = run.trackers
    if log_with is not None:
        accelerator.init_trackers(cfg.train.project, config=flatten(to_container(cfg)), init_kwargs=init_kwargs)
    return step, window


def _train(cfg: TrainConfig, target: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase | None) -> TrainResult:
    """The training loop: one optimizer step per round of ``grad_accum`` micro-batches, with logging, evaluation and
    checkpoints at their intervals, then the final save."""
    tc, out = cfg.train, Path(cfg.train.output_dir)
    run = _prepare(cfg, target, tokenizer)
    accelerator, objective = run.accelerator, run.objective
    step, window = _start(run, cfg)
    history: list[dict[str, float]] = []

    def run_eval() -> dict[str, float]:
        metrics = evaluate(accelerator, objective, run.eval_loader, run.features, tc.eval_batches)
        history.append({"step": step, **metrics})
        accelerator.log(metrics, step=step)
        return metrics

    metrics = run_eval() if tc.eval_every and step == 0 else {}
    if run.resume_from is not None and step >= tc.max_steps:  # nothing left to train: saved with its numbers
        logger.info("%s is at train.max_steps=%d already: nothing to train; saving the head", run.resume_from, step)
        metrics = run_eval() if tc.eval_every else {}
    micro = step * tc.grad_accum  # micro-batches consumed so far (a step spans an epoch's end; see accumulation)
    throughput = Throughput(accelerator)
    bar = tqdm(total=tc.max_steps, initial=step, disable=not (tc.progress_bar and accelerator.is_main_process))
    stopped = False
    objective.train()
    rounds = accumulation_rounds(micro_batches(accelerator, run.train_loader, micro), tc.grad_accum)
    while step < tc.max_steps and not stopped:
        group = next(rounds)
        micro = _optimizer_step(run, tc, group, micro, window, throughput)
        if not accelerator.sync_gradients:  # Accelerate's own count of A micro-batches must end with the group
            raise RuntimeError(f"optimizer step out of step with the {len(group)} micro-batches accumulated")
        step += 1
        bar.update(1)
        if step % tc.log_every == 0 or step == tc.max_steps:
            logged = _log_window(run, window, throughput, step)
            bar.set_postfix(loss=f"{logged['train/loss']:.3f}", **bar_fields(metrics))
            window = {}
        if tc.eval_every and (step % tc.eval_every == 0 or step == tc.max_steps):
            with throughput.paused():
                metrics = run_eval()
            bar.set_postfix(**bar_fields(metrics))
        if tc.save_every and step % tc.save_every == 0:
            with throughput.paused():
                log_window = {k: v.tolist() for k, v in window.items()}  # the next logged loss spans the resume
                extra = {"log_window": log_window}
                save_checkpoint(accelerator, out, step, tc.keep_last, to_yaml(cfg), run.digest, extra)
        if tc.stop_after is not None and step >= tc.stop_after:
            stopped = True
    bar.close()
    accelerator.wait_for_everyone()
    for tracker in accelerator.trackers:  # close run files before the final save rewrites the output folder
        tracker.finish()
    checksum = weights_checksum(accelerator.unwrap_model(objective))
    finished = not (stopped and step < tc.max_steps)
    if finished:
        _save_final(accelerator, objective, cfg, run.target, metrics, out)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    run.target.train(run.target_was_training)  # Medusa-2's objective switched the adapters inside it to train mode
    return TrainResult(out, step, metrics, history, finished, checksum, target_tokens_per_s=throughput.overall_rate())


def _optimizer_step(run, tc, group: list, micro: int, window: Stats, throughput: Throughput) -> int:
    """One optimizer step over a round of micro-batches, each weighted by its share of the round's loss tokens;
    adds their statistics to ``window`` and returns the count of micro-batches consumed."""
    accelerator, objective = run.accelerator, run.objective
    weights = token_weights(accelerator, group, tc.grad_accum, tc.weight_by_tokens)  # one all-reduce
    for batch, (weight, tokens) in zip(group, weights):
        throughput.count(batch)
        draw = micro * accelerator.num_processes + accelerator.process_index
        micro += 1
        with accelerator.accumulate(objective):
            loss, stats = objective(*run.features(batch), draw)
            accelerator.backward(loss * weight)  # token-weighted: the step's gradient is its tokens' mean
            if accelerator.sync_gradients and tc.max_grad_norm > 0:
                accelerator.clip_grad_norm_(run.params, tc.max_grad_norm)
            run.optimizer.step()
            run.scheduler.step()
            run.optimizer.zero_grad()
        stats["loss"] = torch.stack([loss.detach().float() * tokens, tokens])
        add_stats(window, stats)
    return micro


def _log_window(run, window: Stats, throughput: Throughput, step: int) -> dict[str, float]:
    """Log the statistics gathered since the last log (all processes reduced), the learning rates and throughput."""
    accelerator, scheduler = run.accelerator, run.scheduler
    logged = {f"train/{k}": v for k, v in reduce_stats(accelerator, window).items()}
    logged["train/lr"] = scheduler.get_last_lr()[0]
    if run.adapters:
        logged["train/lr_lora"] = scheduler.get_last_lr()[1]
    logged["train/target_tokens_per_s"] = throughput.window_rate()
    accelerator.log(with_tau(logged, "train/"), step=step)
    return logged


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
