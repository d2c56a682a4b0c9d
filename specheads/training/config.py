"""The training configuration: dataclasses are the schema and the only source of defaults (``config_schema.py``).

A run is described by one YAML file (``configs/<head>/<target>.yaml``) merged onto ``TrainConfig`` and then by dotted
CLI overrides (``train.max_steps=200``). OmegaConf structured configs make unknown keys and wrongly typed values
errors; ``ConfigError`` re-words them to list the valid keys. Head architecture options are not repeated here: they
are the fields of the head's own config dataclass (``MedusaConfig``, ``EagleConfig``), given under ``head.options``
and checked strictly against it, so each default lives in one place.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specheads.training.chat_format import FORMATS
from specheads.training.config_messages import reworded, yaml_problem
from specheads.training.config_schema import (
    FEATURE_MODES,
    LABEL_KINDS,
    MIXED_PRECISION,
    SCHEDULERS,
    TARGET_DTYPES,
    TRACKERS,
    YAML_FALSE,
    YAML_TRUE,
    ConfigError,
    FeatureSection,
    HeadSection,
    LoraSection,
    LossSection,
    TargetSection,
    TrainConfig,
    TrainSection,
)
from specheads.training.config_secrets import env_references, secret_env_read, secret_value, with_references
from specheads.training.tracker_packages import missing_tracker_package

__all__ = [  # the schema's names are re-exported: callers import the whole config from here
    "ConfigError",
    "FEATURE_MODES",
    "FeatureSection",
    "HeadSection",
    "LABEL_KINDS",
    "LoraSection",
    "LossSection",
    "MIXED_PRECISION",
    "SCHEDULERS",
    "TARGET_DTYPES",
    "TRACKERS",
    "TargetSection",
    "TrainConfig",
    "TrainSection",
    "YAML_FALSE",
    "YAML_TRUE",
    "load_config",
    "to_container",
    "to_yaml",
    "validate",
]


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Defaults <- YAML file <- dotted overrides (``key.sub=value``), validated strictly; interpolations resolved.

    The file and each override are merged in turn, so an error names its real source (the file, with line and column
    for YAML syntax, or the one override). Data paths may use ``${oc.env:SPECHEADS_DATA,data}`` so configs
    do not hard-code a machine's layout.
    """
    merged: DictConfig = OmegaConf.structured(TrainConfig)
    if path is not None:
        merged = _merged(merged, _read_yaml(path), str(path))
    for override in overrides or []:
        merged = _merged(merged, _parse_override(override), f"command-line override {override}")

    def source_of(key: str | None) -> str:
        key = (key or "").partition("[")[0]  # a list item comes from the override of its list
        given = [o for o in overrides or [] if o.partition("=")[0].strip() == key]
        return f"command-line override {given[-1]}" if given else str(path or "config")

    unresolved = OmegaConf.to_container(merged, resolve=False)
    if problem := secret_env_read(unresolved, source_of):
        raise ConfigError(problem)  # before resolving: a secret is never read into the config
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:  # interpolations resolve only here, whichever layer wrote them
        raise ConfigError(reworded(err, source_of(getattr(err, "full_key", None)), TrainConfig)) from None
    if problem := secret_value(to_container(cfg), source_of):
        raise ConfigError(problem)
    validate(cfg)
    cfg.env_reads = env_references(unresolved)
    return cfg


def _read_yaml(path: str | os.PathLike) -> DictConfig:
    if not Path(path).is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as err:  # syntax errors and duplicate keys; the mark says where
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(err)}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a UTF-8 text file; expected a YAML training config") from None
    except OSError as err:
        if "Invalid loaded object type" not in str(err):  # OmegaConf's word for a bare number or boolean
            raise ConfigError(f"cannot read config file {path}: {err}") from None
        loaded = None
    if not isinstance(loaded, DictConfig):
        kind = "a list" if isinstance(loaded, ListConfig) else "a single value"
        sections = ", ".join(f"{f.name}:" for f in dataclasses.fields(TrainConfig) if not f.metadata)
        raise ConfigError(f"{path}: expected a mapping of sections at the top level ({sections}), found {kind}.")
    return loaded


def _parse_override(override: str) -> DictConfig:
    key, sep, _ = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(
            f"command-line override {override!r}: expected KEY=VALUE, e.g. train.max_steps=200 (the config file goes "
            "after --config)."
        )
    try:
        return OmegaConf.from_dotlist([override])
    except yaml.YAMLError as err:
        problem = yaml_problem(err)
        raise ConfigError(f"command-line override {override}: the value is not valid YAML: {problem}") from None


def _merged(base: DictConfig, layer: DictConfig, source: str) -> DictConfig:
    try:
        return OmegaConf.merge(base, layer)
    except OmegaConfBaseException as err:
        raise ConfigError(reworded(err, source, TrainConfig)) from None


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not valid; expected one of {list(choices)}.")


def validate(cfg: TrainConfig) -> None:
    """Value checks the type system cannot express; also builds the head config once to check ``head.options``."""
    from specheads.heads import HEADS

    _check_choice("head.type", cfg.head.type, tuple(HEADS))
    _check_choice("features.mode", cfg.features.mode, FEATURE_MODES)
    _check_choice("loss.medusa_labels", cfg.loss.medusa_labels, LABEL_KINDS)
    _check_choice("loss.draft_labels", cfg.loss.draft_labels, LABEL_KINDS)
    _check_choice("train.scheduler", cfg.train.scheduler, SCHEDULERS)
    _check_choice("data.format", cfg.data.format, FORMATS)
    if cfg.train.mixed_precision in YAML_FALSE:
        cfg.train.mixed_precision = "no"
    _check_choice("train.mixed_precision", cfg.train.mixed_precision, MIXED_PRECISION)
    _check_choice("target.dtype", cfg.target.dtype, tuple(TARGET_DTYPES))
    cfg.target.dtype = TARGET_DTYPES[cfg.target.dtype]
    _normalise_resume(cfg.train)
    _check_choice("train.log_with", cfg.train.log_with, TRACKERS)
    if problem := missing_tracker_package(cfg.train.log_with):  # here, not after the target loaded: accelerate warns
        raise ConfigError(problem)
    try:
        fix = "fix head.options in the training config (the YAML file or a head.options.KEY=VALUE override)"
        head_config = HEADS[cfg.head.type].config_class.from_dict(dict(cfg.head.options), fix=fix)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"head.options: {err}") from None
    _check_feature_source(cfg.features)
    _check_lora(cfg)
    _check_bounds(cfg)
    _check_loss_fields(cfg.loss, cfg.head.type + str(getattr(head_config, "version", "")))


LOSS_READERS = {
    "medusa": {"decay", "medusa_labels"},
    "eagle1": {"feature_weight", "token_weight", "input_noise", "position_offset", "anchor_tokens"},
    "eagle3": {"ttt_steps", "decay", "position_offset", "anchor_tokens"},
    "draft_model": {"draft_labels", "chain_depth"},
}
"""The ``loss`` fields each objective reads (``training/objective.py``)."""


def _check_loss_fields(loss: LossSection, objective: str) -> None:
    """A ``loss`` field set away from its default for another head's objective would be ignored without a word."""
    for item in dataclasses.fields(LossSection):
        name, value = item.name, getattr(loss, item.name)
        if name in LOSS_READERS[objective] or value == item.default:
            continue
        readers = sorted(o for o, names in LOSS_READERS.items() if name in names)
        raise ConfigError(
            f"loss.{name}={value!r} is read only by the {' and '.join(readers)} objective{'s' * (len(readers) > 1)}; "
            f"this config trains {objective}, which "
            f"ignores it. Remove it, or set head.type (and head.options.version) to the head it is for."
        )


def _check_feature_source(features: FeatureSection) -> None:
    """Online features run the target; offline ones read a cache: each setting belongs to one of the two."""
    if features.mode == "offline" and not features.cache_dir:
        raise ConfigError(
            "features.mode=offline needs features.cache_dir (written by `specheads data cache-features`)."
        )
    if features.cache_dir and features.mode != "offline":
        raise ConfigError(
            f"features.cache_dir={features.cache_dir!r} is read only with features.mode=offline; found "
            f"features.mode={features.mode!r}. Add features.mode=offline to train from the cache, or drop "
            "features.cache_dir to run the target online."
        )
    if features.extra_cache_dirs and features.mode != "offline":
        raise ConfigError(
            f"features.extra_cache_dirs={features.extra_cache_dirs} is read only with features.mode=offline; "
            f"found features.mode={features.mode!r}."
        )


def _check_lora(cfg: TrainConfig) -> None:
    """Medusa-2's adapters train with the heads, from online features, after the heads' warm-up."""
    if cfg.lora.enabled and cfg.head.type != "medusa":
        raise ConfigError(f"lora.enabled is Medusa-2 (head.type=medusa); found head.type={cfg.head.type!r}.")
    if cfg.lora.enabled and cfg.features.mode == "offline":
        raise ConfigError(
            "lora.enabled trains the target's adapters, which needs online features (features.mode=online)."
        )
    if cfg.lora.heads_warmup_steps < 0:
        raise ConfigError(f"lora.heads_warmup_steps must be >= 0, found {cfg.lora.heads_warmup_steps}.")
    if cfg.lora.enabled and cfg.lora.heads_warmup_steps >= cfg.train.max_steps:
        raise ConfigError(
            f"lora.heads_warmup_steps={cfg.lora.heads_warmup_steps} is not below train.max_steps="
            f"{cfg.train.max_steps}: the adapters would never train. Lower it, or train Medusa-1 (lora.enabled=false)."
        )


def _check_bounds(cfg: TrainConfig) -> None:
    """Numbers whose meaning has a range: rates and counts are not negative, a fraction is below 1, a rank is at
    least 1. The bounds follow what each field does: 0 is a valid value where it means "none" (``train.save_every=0``:
    no checkpoints; ``train.lr=0``: the weights stay as loaded)."""
    for name in (
        "max_steps",
        "batch_size",
        "eval_batch_size",
        "grad_accum",
        "keep_last",
        "log_every",
        "dist_timeout_s",
    ):
        if getattr(cfg.train, name) < 1:
            raise ConfigError(f"train.{name} must be >= 1, found {getattr(cfg.train, name)}.")
    for name in ("ttt_steps", "chain_depth"):
        if getattr(cfg.loss, name) < 1:
            raise ConfigError(f"loss.{name} must be >= 1, found {getattr(cfg.loss, name)}.")
    at_least_zero = {
        "train.lr": cfg.train.lr,
        "train.warmup_steps": cfg.train.warmup_steps,
        "train.save_every": cfg.train.save_every,
        "train.eval_every": cfg.train.eval_every,
        "train.weight_decay": cfg.train.weight_decay,
        "train.max_grad_norm": cfg.train.max_grad_norm,  # 0 = no clipping
        "lora.lr": cfg.lora.lr,
        "loss.input_noise": cfg.loss.input_noise,
        "loss.position_offset": cfg.loss.position_offset,
        "loss.anchor_tokens": cfg.loss.anchor_tokens,
    }
    for name, value in at_least_zero.items():
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, found {value}.")
    if not 0 <= cfg.data.eval_fraction < 1:
        raise ConfigError(
            f"data.eval_fraction must be in [0, 1) (the share of samples held out; 0 = none), found "
            f"{cfg.data.eval_fraction}."
        )
    if cfg.lora.r < 1:
        raise ConfigError(f"lora.r (the adapters' rank) must be >= 1, found {cfg.lora.r}.")
    if not 0 <= cfg.lora.dropout < 1:
        raise ConfigError(f"lora.dropout must be in [0, 1), found {cfg.lora.dropout}.")
    if cfg.train.adam_eps <= 0:
        raise ConfigError(f"train.adam_eps must be > 0 (AdamW divides by sqrt(v) + eps), found {cfg.train.adam_eps}.")
    if cfg.loss.decay <= 0:
        raise ConfigError(
            f"loss.decay must be > 0 (head k / step i is weighted decay**k; at 0 only the first one would learn), "
            f"found {cfg.loss.decay}."
        )
    _check_more_bounds(cfg)


def _check_more_bounds(cfg: TrainConfig) -> None:
    """Settings that were taken as given and then turned off or inverted what they name (a negative loss weight
    maximises its loss; eval_batches=0 evaluates nothing), or crashed after the target loaded."""
    optional_counts = {  # None = not set (the whole split, no early stop, every sample)
        "train.eval_batches": cfg.train.eval_batches,
        "train.stop_after": cfg.train.stop_after,
        "data.max_samples": cfg.data.max_samples,
        "data.num_proc": cfg.data.num_proc,
    }
    for name, value in optional_counts.items():
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1 (or unset), found {value}.")
    if cfg.data.max_length < 1:
        raise ConfigError(f"data.max_length must be >= 1 (tokens per sample), found {cfg.data.max_length}.")
    if cfg.data.eval_size is not None and cfg.data.eval_size < 0:
        raise ConfigError(f"data.eval_size must be >= 0 (held-out samples; 0 = none), found {cfg.data.eval_size}.")
    weights = {
        "loss.feature_weight": cfg.loss.feature_weight,
        "loss.token_weight": cfg.loss.token_weight,
        "lora.distill_weight": cfg.lora.distill_weight,
    }
    for name, value in weights.items():
        if value < 0:
            raise ConfigError(f"{name} must be >= 0 (a negative weight maximises its loss), found {value}.")
    if cfg.lora.alpha <= 0:
        raise ConfigError(
            f"lora.alpha must be > 0 (the adapters' update is scaled by alpha / r: at 0 they never train), found "
            f"{cfg.lora.alpha}."
        )
    betas = list(cfg.train.adam_betas)
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"train.adam_betas must be two numbers in [0, 1), e.g. [0.9, 0.95]; found {betas}.")
    for name, seed in (("train.seed", cfg.train.seed), ("data.seed", cfg.data.seed)):
        if not 0 <= seed < 2**32:  # numpy's seeds; a negative one failed after the target loaded
            raise ConfigError(f"{name} must be in [0, 2**32), found {seed}.")
    if not str(cfg.train.output_dir).strip():
        raise ConfigError(
            "train.output_dir is empty: the head, its card and checkpoints would be written into the current "
            "folder, over any README.md or config.json there. Name a folder, e.g. train.output_dir=runs/my-head."
        )


def _normalise_resume(train: TrainSection) -> None:
    """``train.resume: no`` (or off/false) means no; a true boolean names no checkpoint, so it is refused."""
    if train.resume in YAML_FALSE:
        train.resume = "no"
    elif train.resume in YAML_TRUE:
        raise ConfigError(
            f"train.resume={train.resume!r} (YAML reads a bare yes/on/true as a boolean) is not valid; expected no, "
            "auto (the latest checkpoint in train.output_dir) or a checkpoint folder. Write train.resume=auto to "
            "continue a run."
        )


def to_container(cfg: TrainConfig) -> dict[str, Any]:
    """The config as plain dicts (for trackers, the model card and ``train_config.yaml``): resolved, except values
    read from the environment, which keep their ``${oc.env:...}`` reference."""
    return with_references(OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True), cfg.env_reads)


def to_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(to_container(cfg)))
