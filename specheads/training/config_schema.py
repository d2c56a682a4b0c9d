"""The training configuration's schema: one dataclass per section of the YAML file, which are also the only source
of defaults, the valid choices of the fields that take a name, and ``ConfigError``. Loading, merging and checking a
config is ``training/config.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specheads.training.data import DataConfig

FEATURE_MODES = ("online", "offline")
LABEL_KINDS = ("hard", "soft")
SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup")
MIXED_PRECISION = ("auto", "no", "bf16", "fp16")
TRACKERS = ("none", "wandb", "tensorboard")
TARGET_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
"""``target.dtype`` spellings -> the torch dtype name the target is loaded in (the short names are the ones
``train.mixed_precision`` and ``specheads data cache-features --dtype`` use)."""
YAML_FALSE = ("False", "false")  # YAML 1.1 reads a bare `no`/`off`/`false` as a boolean; a str field then holds this
YAML_TRUE = ("True", "true")


class ConfigError(ValueError):
    """The training config is invalid; the message names the key, what is valid, and how to fix it."""


@dataclass
class TargetSection:
    """The frozen target: a built-in name (``smollm2-135m-instruct``), a local directory, a .gguf file or a Hub id."""

    name: str = "smollm2-135m-instruct"
    dtype: str = "float32"  # a key of TARGET_DTYPES; validation stores the torch name (bf16 -> bfloat16)


@dataclass
class HeadSection:
    """Which head to train (a key of ``specheads.heads.HEADS``) and its config fields (checked against its class)."""

    type: str = "medusa"
    options: dict[str, Any] = field(default_factory=dict)
    init_from: str | None = None  # a saved head folder to start from (warm start); its config is used


@dataclass
class FeatureSection:
    """Online: the target runs inside each step. Offline: read the ``train/`` and ``eval/`` caches that
    ``specheads data cache-features --out-dir CACHE_DIR`` wrote (the target is still loaded: heads borrow its
    embedding and lm_head, but it never runs)."""

    mode: str = "online"
    cache_dir: str | None = None
    extra_cache_dirs: list[str] = field(default_factory=list)  # more caches read after cache_dir (same target/layers)


@dataclass
class LossSection:
    """Loss weights and options for every head type (each objective reads the fields it needs)."""

    medusa_labels: str = "hard"  # hard: data tokens; soft: the target's distribution
    decay: float = 0.8  # weight of head k / TTT step i is decay**k (Medusa) or decay**i (EAGLE-3)
    ttt_steps: int = 7  # EAGLE-3 training-time-test unroll length
    feature_weight: float = 1.0  # EAGLE-1 SmoothL1 feature regression
    token_weight: float = 0.1  # EAGLE-1 cross-entropy against the target distribution
    input_noise: float = 0.0  # EAGLE-1: uniform noise U(-a, a) added to input features
    draft_labels: str = "soft"  # draft model: soft = distill the target's distribution; hard = the data tokens
    chain_depth: int = 5  # draft model: guesses per chain whose acceptance eval reports (eval/top1/step1..K, tau)
    position_offset: int = 0
    """EAGLE: LongSpec's anchor-offset position ids (https://arxiv.org/abs/2502.17421). In training, each sequence's
    positions after its first ``anchor_tokens`` are shifted by a random offset drawn uniformly from
    [0, position_offset], so a head trained on short sequences meets the large positions (and distances to the
    first tokens) of long contexts. Keep position_offset + the longest sequence within the target's context.
    0 = off: positions 0, 1, 2, ..."""
    anchor_tokens: int = 4
    """With ``position_offset``: the first tokens that keep their own positions (the anchor, as attention sinks)."""


@dataclass
class LoraSection:
    """Medusa-2: LoRA adapters on the target trained jointly with the heads (https://arxiv.org/abs/2401.10774)."""

    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    distill_weight: float = 1.0  # weight of KL(original target || adapted target)
    lr: float = 1e-4  # the adapters learn slower than the heads, so the target's own predictions barely move
    heads_warmup_steps: int = 0  # train the heads alone this many steps first (adapters at lr 0), as Medusa-2 does


@dataclass
class TrainSection:
    """Optimisation, evaluation, checkpointing and tracking. Batch sizes are per process."""

    output_dir: str = "runs/head"
    seed: int = 0
    max_steps: int = 1000
    batch_size: int = 8
    eval_batch_size: int = 8
    grad_accum: int = 1
    weight_by_tokens: bool = True  # a step's loss is its tokens' mean (false: the mean of its micro-batches')
    group_by_length: bool = False  # batches of similar lengths (less padding; as transformers' Trainer option)
    lr: float = 1e-3
    weight_decay: float = 0.0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    adam_eps: float = 1e-8  # AdamW's epsilon (transformers' adam_epsilon), added to sqrt(v)
    scheduler: str = "cosine"
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    mixed_precision: str = "auto"  # auto: the launch config's (`accelerate launch`), else no
    eval_every: int = 100
    eval_batches: int | None = None  # None = the whole held-out split; counts batches of all processes together
    save_every: int = 0  # 0 = no intermediate checkpoints
    keep_last: int = 2
    resume: str = "no"  # no | auto (latest checkpoint in output_dir) | a checkpoint directory
    stop_after: int | None = None  # stop after this many steps (as if killed) without the final save
    log_every: int = 10
    log_with: str = "none"
    project: str = "${oc.env:WANDB_PROJECT,specheads}"  # wandb project (tensorboard: log subfolder); env, else this
    run_name: str | None = None
    progress_bar: bool = True
    dist_timeout_s: int = 1800  # how long ranks wait for a hung rank before the launch fails (torch's default)


@dataclass
class TrainConfig:
    target: TargetSection = field(default_factory=TargetSection)
    head: HeadSection = field(default_factory=HeadSection)
    data: DataConfig = field(default_factory=DataConfig)
    features: FeatureSection = field(default_factory=FeatureSection)
    loss: LossSection = field(default_factory=LossSection)
    lora: LoraSection = field(default_factory=LoraSection)
    train: TrainSection = field(default_factory=TrainSection)
    # dotted key -> the ``${oc.env:...}`` text its value was read through: written out instead of the value
    env_reads: dict[str, str] = field(default_factory=dict, metadata={"omegaconf_ignore": True})
