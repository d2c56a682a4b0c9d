"""Which methods one benchmark run compares: the baseline, transformers' prompt lookup and assisted generation,
specheads' plain and prompt-lookup decoding, and per head its tree (fixed or ``auto``) and the variants asked for
(backoff, a lookup branch, a drafter window)."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.bench.methods import Method, hf_method, specheads_method
from specheads.bench.settings import BenchSettings
from specheads.decoding.eagle_draft import DrafterWindow, with_drafter_window
from specheads.decoding.generator import Kernels
from specheads.decoding.tuning.auto_tree import (
    DrafterSpec,
    auto_drafter,
    auto_tree_cache_path,
    fixed_drafter,
    prompt_lookup_drafter,
    remember_tree,
    with_lookup_branch,
)
from specheads.heads.base import LORA_DIR
from specheads.target import cache_root


def build_methods(
    settings: BenchSettings,
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    calibration: list[torch.Tensor],
    calibration_source: str = "the benchmark's calibration prompts",
    kernels: Kernels | None = None,
) -> list[Method]:
    """Baseline first, then transformers' methods, specheads prompt lookup and one method per head. Every ``auto``
    tree chosen is also cached for ``specheads generate --tree auto`` on this device (``auto_tree_cache_path``).
    Every method, transformers' included, runs inside ``kernels`` (``SpeculativeGenerator``'s hook)."""
    methods = [hf_method("generate", target, description="transformers generate (baseline)", kernels=kernels)]
    if "hf-prompt-lookup" in settings.methods:
        n = settings.prompt_lookup_tokens
        label = f"prompt_lookup_num_tokens={n}"
        methods.append(
            hf_method("hf-prompt-lookup", target, description=label, kernels=kernels, prompt_lookup_num_tokens=n)
        )
    if "hf-assisted" in settings.methods:
        assistant, label = _assistant(settings, target)
        what = f"assistant_model: {label}"
        methods.append(hf_method("hf-assisted", target, description=what, assistant=assistant, kernels=kernels))
    acceptance = "greedy" if settings.temperature == 0 else "speculative"
    if "specheads-plain" in settings.methods:
        spec = DrafterSpec(None, "root only (no drafter)")
        methods.append(_specheads("specheads-plain", target, tokenizer, spec, acceptance, "no drafter", kernels))
    if "specheads-lookup" in settings.methods:
        spec = prompt_lookup_drafter(settings.prompt_lookup_tokens)
        methods.append(_specheads("specheads-lookup", target, tokenizer, spec, acceptance, "prompt lookup", kernels))
    trees = trees_per_head(settings)
    if not calibration and "auto" in trees:
        # auto_drafter would choose (and cache for specheads generate) a tree from no acceptance at all
        raise ValueError(
            "--tree auto needs calibration prompts and got none; pass --calibration-data FILE, or a fixed --tree"
        )
    for head_arg, tree, name in zip(settings.heads, trees, head_method_names(settings)):
        _check_names_free(settings, head_arg, name, methods)
        calibrated = (calibration, calibration_source, kernels)
        methods += _head_methods(settings, head_arg, tree, name, target, tokenizer, *calibrated)
    return methods


def trees_per_head(settings: BenchSettings) -> list[str]:
    """The tree setting of each ``--head``: one ``--tree`` for all of them, or one each."""
    trees = settings.trees or ["auto"]
    if len(trees) not in (1, len(settings.heads)):
        raise ValueError(
            f"got {len(trees)} --tree for {len(settings.heads)} --head; give one --tree for all heads or one per --head"
        )
    return trees * len(settings.heads) if len(trees) == 1 else trees


def head_method_names(settings: BenchSettings) -> list[str]:
    """Each ``--head``'s method name, ``specheads-FOLDER``; a folder given again with another tree (one head under
    ``auto`` and ``chain:1``) is told apart by its tree, ``specheads-FOLDER@TREE``."""
    trees = trees_per_head(settings)
    names = [f"specheads-{Path(head_arg).name}" for head_arg in settings.heads]
    retreed = [any(n == name and t != tree for n, t in zip(names, trees)) for name, tree in zip(names, trees)]
    return [f"{name}@{tree}" if again else name for name, tree, again in zip(names, trees, retreed)]


def _check_names_free(settings: BenchSettings, head_arg: str, base: str, methods: list[Method]) -> None:
    """A head's methods are keyed by name in the runs and the report: two methods of one name would mix their runs.
    Checked before the head is loaded and calibrated, against every variant the settings may add."""
    variants = [settings.backoff, settings.lookup_branch, settings.drafter_window, settings.lookup_solo is not None]
    suffixes = [s for s, on in zip(("+backoff", "+lookup", "+window", "+lookup-solo"), variants) if on]
    taken = {m.name for m in methods}
    clash = next((name for name in [base, *(base + s for s in suffixes)] if name in taken), None)
    if clash is not None:
        raise ValueError(
            f"--head {head_arg} would be reported as {clash!r}, a name another method already has (two --head "
            "folders of one name and tree, or a folder named like a built-in method or a variant); rename the folder"
        )


def _assistant(settings: BenchSettings, target: PreTrainedModel) -> tuple[torch.nn.Module, str]:
    """The draft model for transformers' assisted generation (``--assistant``, else the target's first layers)."""
    from specheads.heads import DraftModel, load_head

    if settings.assistant:
        trained = load_head(settings.assistant, target)
        if trained.head_type != "draft_model":
            raise ValueError(
                f"--assistant {settings.assistant} is a head of type {trained.head_type!r}; transformers' assisted "
                "generation needs a draft model (a small causal LM, type 'draft_model'); pass this one with --head"
            )
        assistant, label = trained.model, settings.assistant
    else:
        layers = min(settings.assistant_layers, target.config.get_text_config().num_hidden_layers - 1)
        if layers < 1:
            raise ValueError("the target has one layer: no smaller assistant can be cut from it; pass --assistant")
        assistant = DraftModel.from_target(target, layers).model.to(target.device).eval()
        label = f"first {layers} target layers (untrained)"
    return assistant.requires_grad_(False), label


def _head_methods(
    settings: BenchSettings,
    head_arg: str,
    tree: str,
    name: str,
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    calibration: list[torch.Tensor],
    calibration_source: str,
    kernels: Kernels | None = None,
) -> list[Method]:
    """One head's methods: its tree, and with ``--backoff``, ``--lookup-branch`` and ``--lookup-solo`` those
    variants. An ``auto`` tree is chosen on the calibration prompts and cached for ``specheads generate --tree
    auto``."""
    from specheads.heads import load_head, resolve_head_folder

    head_dir = resolve_head_folder(head_arg)  # a Hub id is fetched once; everything below reads this folder
    refuse_adapted_head(head_arg, head_dir)
    head = load_head(head_dir, target).to(target.device).eval()
    acceptance = "greedy" if settings.temperature == 0 else "speculative"
    if tree == "auto":
        spec = auto_drafter(head, target, tokenizer, None, calibration, kernels=kernels)
        assert spec.calibration is not None
        curve = spec.calibration.curve
        relative = ", ".join(f"{n}: {r:.2f}x" for n, r in zip(curve.sizes, curve.relative()))
        print(f"{head_arg}: verify cost by tree size at a {curve.prefix_len}-token context (1 token = 1): {relative}")
    else:
        spec = fixed_drafter(head, tree)
    what = f"{head.head_type} head"
    unused = [o for o, on in [("--backoff", settings.backoff), ("--drafter-window", settings.drafter_window)] if on]
    unused += ["--lookup-solo"] if settings.lookup_solo is not None else []
    if spec.drafter is None and unused:  # the variants vary a head's drafting, and this one drafts nothing
        print(
            f"note: {' '.join(unused)} add no method for {head_arg}: its auto tree is plain decoding", file=sys.stderr
        )
    methods = [_specheads(name, target, tokenizer, spec, acceptance, what, kernels)]
    if settings.backoff and spec.drafter is not None:
        backoff = f"{what}, draft backoff"
        methods.append(_specheads(f"{name}+backoff", target, tokenizer, spec, acceptance, backoff, kernels, True))
    if settings.lookup_branch:
        branch = with_lookup_branch(spec, settings.lookup_branch)
        what_branch = f"{what} + lookup"
        methods.append(_specheads(f"{name}+lookup", target, tokenizer, branch, acceptance, what_branch, kernels))
    if settings.drafter_window and spec.drafter is not None:
        if head.head_type == "eagle":
            window = DrafterWindow(settings.drafter_sinks, settings.drafter_window)
            cut = DrafterSpec(with_drafter_window(spec.drafter, window), spec.tree, spec.auto, spec.calibration)
            windowed = f"{what}, drafter cache {window.sinks} + {window.recent} rows"
            methods.append(_specheads(f"{name}+window", target, tokenizer, cut, acceptance, windowed, kernels))
        else:
            note = f"note: --drafter-window adds no method for {head_arg}: it cuts an EAGLE drafter's cache"
            print(note, file=sys.stderr)
    priced: dict[int, int | None] = {}  # lookup-branch size -> solo n-gram length, priced with an auto tree
    if settings.lookup_solo is not None and spec.drafter is not None:  # no head tree: +lookup is the chain alone
        solo = with_lookup_branch(spec, settings.lookup_branch, settings.lookup_solo)
        alone = "where the cost model says" if settings.lookup_solo == "auto" else f"on {settings.lookup_solo}-grams"
        what_solo = f"{what} + lookup, alone {alone}"
        methods.append(_specheads(f"{name}+lookup-solo", target, tokenizer, solo, acceptance, what_solo, kernels))
        if settings.lookup_solo == "auto":
            priced[settings.lookup_branch] = solo.drafter.solo_ngram
    if tree == "auto":  # what generate --tree auto [--lookup-solo auto] reuses on this device
        _remember_auto_tree(spec, head_dir, target, calibration_source, priced)
    return methods


def refuse_adapted_head(head_arg: str, head_dir: Path) -> None:
    """A Medusa-2 head (a ``lora/`` folder beside it) is not benchmarked: ``bench`` checks it before the target
    loads, ``build_methods`` again for callers that skip that."""
    if (head_dir / LORA_DIR).is_dir():
        raise ValueError(
            f"{head_arg} is a Medusa-2 head with a LoRA adapter: it decodes an adapted target, so its outputs are "
            "not comparable to the plain target's. Merge the adapter into a target copy and pass it as --target."
        )


def _remember_auto_tree(
    spec: DrafterSpec, head_dir: Path, target: PreTrainedModel, source: str, priced: dict[int, int | None]
) -> None:
    """Cache the auto tree chosen for a head (and the lookup-solo lengths priced with it) for ``specheads generate
    --tree auto`` on this device; a cache that cannot be written is a note, not an error."""
    assert spec.auto is not None
    cached_as = auto_tree_cache_path(cache_root(), head_dir, target)
    failed = remember_tree(cached_as, spec.auto, f"specheads bench on {source}", priced)
    if failed:
        print(f"note: the auto tree could not be cached for specheads generate ({failed})", file=sys.stderr)


def _specheads(
    name: str,
    target: Any,
    tokenizer: Any,
    spec: DrafterSpec,
    acceptance: str,
    what: str,
    kernels: Kernels | None,
    backoff: bool = False,
) -> Method:
    extra: dict[str, Any] = {"tree": spec.tree, "backoff": backoff}
    if spec.auto is not None and spec.calibration is not None:  # the tree and the curve it was priced on
        extra["auto_tree"] = {"choices": spec.auto.choices, "candidates": spec.auto.candidates}
        extra["cost_curve"] = asdict(spec.calibration.curve)
    description = f"specheads, {what}"
    return specheads_method(name, target, tokenizer, spec.drafter, acceptance, description, extra, backoff, kernels)
