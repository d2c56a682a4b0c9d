"""From a saved head and a tree setting to a drafter the speculative generator can use, and how its tree was chosen.

Tree settings (``--tree``): ``auto``, where the cost model (``cost_model``) picks size and depth for this device and
this head, or any fixed setting (``chain:D``, ``dynamic:D,K,N`` for EAGLE, a tree file or name under
``specheads/decoding/trees/`` for Medusa), built by ``head_drafter.build_drafter``.

``auto_drafter`` runs a short greedy calibration with a wide drafter, records which (depth, rank) guesses the target
accepts and what drafting costs, times the target's verify cost by tree size at the calibration's context length,
and lets ``choose_tree`` pick the tree with the most expected tokens per second (an EAGLE tree of one level priced
on its tau replayed on the calibration's output, ``replay``). ``auto_tree_drafter`` is what
``specheads generate --tree auto`` uses: the same choice, calibrated on a few built-in prompts and cached per (head
weights, target, device, dtype), so only the first call pays for the calibration. ``specheads bench --tree auto``
calibrates on held-out benchmark questions and stores its choice in the same cache, so generating after a benchmark
reuses what the benchmark measured.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.decoding.draft_model_drafter import DraftModelDrafter
from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.generator import Kernels, SpeculativeGenerator
from specheads.decoding.head_drafter import build_drafter
from specheads.decoding.lookup_branch import DEFAULT_LOOKUP_MIN_NGRAM, LOOKUP_MAX_NGRAM, LookupBranchDrafter
from specheads.decoding.medusa_drafter import MedusaDrafter
from specheads.decoding.prompt_lookup_drafter import PromptLookupDrafter
from specheads.decoding.tree import DynamicTreeConfig, static_tree
from specheads.decoding.tuning.cost_curve import (
    CostCurve,
    architecture_digest,
    cache_file_name,
    cost_sizes,
    device_label,
    measure_cost_curve,
    write_cache_file,
)
from specheads.decoding.tuning.cost_model import (
    CalibrationStep,
    DraftCost,
    RecordingDrafter,
    TreeChoice,
    choose_lookup_solo,
    choose_tree,
)
from specheads.decoding.tuning.replay import one_level_taus
from specheads.target import cache_root

AUTO_TREE_VERSION = 6  # bump when what a cached choice means changes (3: costs with one-row products padded;
# 4: the cost curve on the calibration's clock; 5: the cost curve timed by the calibration, at its context length;
# 6: EAGLE trees of one level priced on their replayed tau)
CALIBRATION_TOKENS = 32
BUILTIN_CALIBRATION_PROMPTS = (
    # One short request per kind of task a chat model gets (as Spec-Bench's categories), written for this purpose:
    # not from any training or benchmark set, so they do not flatter a head trained on one.
    "Write a short blog post about a weekend spent learning to bake bread, with a few practical tips.",
    "Why does the moon show phases? Explain it to a curious twelve-year-old.",
    "A shop sells pens at 3 for $2. How much do 18 pens cost? Show your reasoning step by step.",
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Translate into French: 'The train to the coast leaves at nine, so we should have breakfast early.'",
    "Summarize in two sentences: The city council voted on Tuesday to extend the bike lane network by 40 km over "
    "the next three years. Supporters said it would cut traffic and improve safety; opponents worried about lost "
    "parking spaces and the cost, estimated at 12 million dollars.",
)
CALIBRATION_WIDTH = 4  # guesses per depth tried during calibration (ranks beyond are assumed never accepted)
CALIBRATION_EAGLE_DEPTH = 6
CALIBRATION_CHAIN_DEPTH = 8


@dataclass
class Calibration:
    """What ``auto`` measured, kept to price a lookup branch on the chosen tree (``with_lookup_branch``)."""

    sequences: list[torch.Tensor]  # each calibration prompt with its greedy output
    steps: list[list[CalibrationStep]]
    curve: CostCurve  # timed right after the calibration, at its mean context (or the one given)
    draft_cost: DraftCost
    overhead_s: float


@dataclass
class DrafterSpec:
    """A built drafter and how its tree was chosen (for the report)."""

    drafter: Any
    tree: str  # human-readable tree description
    auto: TreeChoice | None = None
    calibration: Calibration | None = None


def fixed_drafter(head: Any, tree: str | None) -> DrafterSpec:
    """A drafter for ``head`` with a fixed (not ``auto``) tree setting; None = the head type's default tree."""
    return DrafterSpec(build_drafter(head, tree), tree or "default")


def calibration_drafter(head: Any) -> tuple[Any, int]:
    """A wide drafter that tries several guesses per depth, and the depth it drafts to."""
    kind = head.head_type
    if kind == "medusa":
        depth = head.num_heads
        choices = [[0] * (d - 1) + [r] for d in range(1, depth + 1) for r in range(CALIBRATION_WIDTH)]
        return MedusaDrafter(head, static_tree(choices)), depth
    if kind == "eagle":
        depth = CALIBRATION_EAGLE_DEPTH
        return EagleTreeDrafter(head, DynamicTreeConfig(depth, CALIBRATION_WIDTH, depth * CALIBRATION_WIDTH)), depth
    depth = CALIBRATION_CHAIN_DEPTH
    return DraftModelDrafter(head, depth, min_length=depth, max_length=depth), depth


def auto_drafter(
    head: Any,
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    curve: CostCurve | None,
    prompts: list[torch.Tensor],
    max_new_tokens: int = CALIBRATION_TOKENS,
    kernels: Kernels | None = None,
) -> DrafterSpec:
    """Calibrate the head's per-(depth, rank) acceptance on ``prompts`` (greedy), then let the cost model choose.
    ``curve``: the verify cost by tree size; None (what ``generate`` and ``bench`` use) times it after the
    calibration, on the same clock as its drafting and at its mean context length; a given one is taken as is."""
    wide, depth = calibration_drafter(head)
    recorder = RecordingDrafter(wide)
    generator = SpeculativeGenerator(target, tokenizer, drafter=recorder, acceptance="greedy", kernels=kernels)
    recorder.max_context = generator.max_context
    draft_s = overhead_s = 0.0
    steps = 0
    sequences = []
    for prompt in prompts:
        result = generator.generate(prompt, max_new_tokens=max_new_tokens)
        stats = result.stats
        sequences.append(torch.cat([prompt.view(-1).cpu(), torch.tensor(result.token_ids, dtype=torch.long)]))
        draft_s += stats.draft_s
        overhead_s += stats.bookkeeping_s  # the prompt's forward is verify time, not bookkeeping
        steps += len(stats.accepted_lengths)
    per_step = draft_s / max(steps, 1)
    draft_cost = DraftCost(fixed_s=per_step) if head.head_type == "medusa" else DraftCost(per_depth_s=per_step / depth)
    max_nodes = 63 if head.head_type != "draft_model" else CALIBRATION_CHAIN_DEPTH
    overhead = overhead_s / max(steps, 1)
    if curve is None:
        # a verify over n tokens costs more, relative to one, the longer the context it attends to; and drafting was
        # timed just now, on a shared machine's clock of this minute: the verify cost is timed the same way
        # (a step's position counts its root, which the verify feeds: the cache holds one token fewer)
        positions = [s.position - 1 for request in recorder.steps for s in request] or [1]
        context = round(sum(positions) / len(positions))
        sizes = cost_sizes(max_nodes + 1, generator.max_context)
        if generator.max_context:  # the largest size must fit after the prefix
            context = min(context, generator.max_context - sizes[-1])
        curve = measure_cost_curve(target, sizes, prefix_len=max(context, 1), kernels=kernels)
    replayed = None
    if head.head_type == "eagle":  # a depth-1 tree's tau, read on the calibration's output as decoding would walk it
        replayed = one_level_taus(head, target, sequences, [p.numel() for p in prompts], CALIBRATION_WIDTH)
    choice = choose_tree(recorder.acceptance(), curve.at, draft_cost, overhead, max_nodes, replayed)
    note = "" if choice.num_nodes else " (drafting does not pay here: plain decoding, the head is not used)"
    calibration = Calibration(sequences, recorder.steps, curve, draft_cost, overhead)
    return DrafterSpec(drafter_for_choice(head, choice), f"auto: {choice.describe()}{note}", choice, calibration)


def drafter_for_choice(head: Any, choice: TreeChoice) -> Any:
    """The drafter for a chosen tree; None (plain decoding) when the cost model found that no guess pays."""
    choices = choice.choices
    if not choices:
        return None
    depth = max(len(c) for c in choices)
    if head.head_type == "medusa":
        return MedusaDrafter(head, static_tree(choices))
    if head.head_type == "eagle":
        return EagleTreeDrafter(head, DynamicTreeConfig(depth, choice.top_k, len(choices)))
    return DraftModelDrafter(head, depth, min_length=depth, max_length=depth)


def prompt_lookup_drafter(num_tokens: int = 10) -> DrafterSpec:
    return DrafterSpec(PromptLookupDrafter(num_tokens), f"chain of up to {num_tokens} (n-gram lookup)")


def with_lookup_branch(spec: DrafterSpec, num_tokens: int, solo_ngram: int | str | None = None) -> DrafterSpec:
    """``spec``'s drafter with up to ``num_tokens`` prompt-lookup tokens grafted onto its tree; where the head
    drafts nothing (``auto`` chose plain decoding) the lookup chain alone, with the branch's n-gram settings.
    ``solo_ngram``: on steps whose lookup match is at least that long, the lookup chain alone (the head sits out);
    ``"auto"``: the length the cost model prices best on the ``auto`` tree's calibration (``choose_lookup_solo``)."""
    if num_tokens < 1:
        raise ValueError(f"a lookup branch needs num_tokens >= 1, got {num_tokens}")
    check_solo_length(solo_ngram)
    branch = f" + lookup branch (up to {num_tokens} tokens, n-gram >= {DEFAULT_LOOKUP_MIN_NGRAM}"
    if spec.drafter is None:
        drafter = PromptLookupDrafter(num_tokens, min_ngram=DEFAULT_LOOKUP_MIN_NGRAM, max_ngram=LOOKUP_MAX_NGRAM)
        return DrafterSpec(drafter, f"{spec.tree}; no head tree{branch})", spec.auto, spec.calibration)
    narrow = "; where it proposes, only the head's first-choice path beside it"
    solo = "" if solo_ngram is None else f"; alone, without the head, on {solo_ngram}-gram or longer matches"
    if solo_ngram == "auto":
        if spec.auto is None or spec.calibration is None:
            raise ValueError(
                f"an automatic solo length is priced from the auto tree's calibration, but this head's tree is fixed "
                f"({spec.tree}); use --tree auto, or give the length (2 or 3)"
            )
        cal = spec.calibration
        priced = choose_lookup_solo(
            cal.sequences,
            cal.steps,
            spec.auto,
            cal.curve.at,
            cal.draft_cost,
            cal.overhead_s,
            num_tokens,
            DEFAULT_LOOKUP_MIN_NGRAM,
            LOOKUP_MAX_NGRAM,
        )
        solo_ngram, solo = priced.solo_ngram, f"; auto: {priced.describe()}"
    drafter = LookupBranchDrafter(spec.drafter, num_tokens, max_ngram=LOOKUP_MAX_NGRAM, solo_ngram=solo_ngram)
    return DrafterSpec(drafter, f"{spec.tree}{branch}{narrow}{solo})", spec.auto, spec.calibration)


def head_fingerprint(head_dir: str | os.PathLike) -> str:
    """A digest of a saved head's config and weights (and its LoRA adapter's): a retrained head gets a new tree.
    Training checkpoints under the folder are not part of the head and are left out. A Hub id is resolved first."""
    from specheads.heads import LORA_DIR, resolve_head_folder
    from specheads.heads.files import hash_file

    digest = hashlib.sha256()
    root = resolve_head_folder(head_dir)
    files = [*root.glob("*"), *(root / LORA_DIR).glob("*")]
    for path in sorted(p for p in files if p.is_file() and p.suffix in (".json", ".safetensors")):
        digest.update(str(path.relative_to(root)).encode())
        hash_file(path, digest)
    return digest.hexdigest()[:16]


def target_weights_stamp(target: PreTrainedModel) -> str:
    """A digest of the target's weight files' names, sizes and modification times (a local folder or file, or a
    built-in target's converted copy), or of the Hub revision it was loaded at: a target overwritten in place gets a
    new ``auto`` tree. Reading the weights themselves would take as long as loading them."""
    from specheads.target import builtin_cache_dir

    name = str(target.config.name_or_path)
    local = next((p for p in (Path(name).expanduser(), builtin_cache_dir(name)) if p.exists()), None)
    digest = hashlib.sha256(str(getattr(target.config, "_commit_hash", None)).encode())
    if local is not None:
        files = [local] if local.is_file() else sorted(local.rglob("*"))
        for path in (p for p in files if p.is_file() and p.suffix in (".safetensors", ".bin", ".gguf", ".pt")):
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:12]


def auto_tree_cache_path(cache_dir: str | os.PathLike, head_dir: str | os.PathLike, target: PreTrainedModel) -> Path:
    """Where the ``auto`` tree for this head on this target (architecture and weight files), device and dtype is
    cached."""
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    name = Path(str(target.config.name_or_path)).name
    model = f"{name}__{architecture_digest(target)}{target_weights_stamp(target)}"
    key = (head_fingerprint(head_dir), device_label(target.device), model, dtype, f"v{AUTO_TREE_VERSION}")
    return Path(cache_dir) / "auto_trees" / cache_file_name(*key)


def parse_solo_length(value: str) -> int | str:
    """``--lookup-solo`` on the command line: an n-gram length or ``auto``."""
    if value == "auto":
        return value
    try:
        length = int(value)
    except ValueError:
        raise ValueError(f"expected an n-gram length (2 or 3) or 'auto', got {value!r}") from None
    check_solo_length(length)
    return length


def check_solo_length(solo_ngram: int | str | None) -> None:
    """Refuse a lookup-alone length the lookup branch cannot match, before a tree is calibrated for it."""
    if solo_ngram is None or solo_ngram == "auto":
        return
    if isinstance(solo_ngram, str) or not DEFAULT_LOOKUP_MIN_NGRAM <= solo_ngram <= LOOKUP_MAX_NGRAM:
        raise ValueError(
            f"the lookup-alone length is an n-gram length the lookup branch matches, {DEFAULT_LOOKUP_MIN_NGRAM} to "
            f"{LOOKUP_MAX_NGRAM}, or 'auto'; got {solo_ngram!r}"
        )


def remember_tree(
    path: Path, choice: TreeChoice, calibrated_on: str, lookup_solo: dict[int, int | None] | None = None
) -> str | None:
    """Cache a chosen tree, and the solo lengths priced for it per lookup-branch size (``--lookup-solo auto``);
    written to a temporary name and renamed, so a reader never sees half a file. Returns why it could not be
    cached (an unwritable cache folder is not an error), or None."""
    record = {
        "choice": asdict(choice),
        "calibrated_on": calibrated_on,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "lookup_solo": {str(tokens): ngram for tokens, ngram in (lookup_solo or {}).items()},
    }
    return write_cache_file(path, json.dumps(record, indent=2))


@dataclass
class CachedTree:
    choice: TreeChoice
    calibrated_on: str
    lookup_solo: dict[int, int | None]  # lookup-branch size -> the solo n-gram length priced for it (None: never)


def cached_tree(path: Path) -> CachedTree | None:
    """A cached choice, what it was calibrated on and the solo lengths priced for it, or None when there is none
    (or it cannot be read)."""
    try:
        record = json.loads(path.read_text())
        solo = {int(tokens): None if n is None else int(n) for tokens, n in record.get("lookup_solo", {}).items()}
        return CachedTree(TreeChoice(**record["choice"]), str(record.get("calibrated_on", "?")), solo)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def auto_tree_drafter(
    head: Any,
    head_dir: str | os.PathLike,
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cache_dir: str | os.PathLike | None = None,
    recalibrate: bool = False,
    log: Any = print,
    lookup_branch: int = 0,
    lookup_solo: int | str | None = None,
    kernels: Kernels | None = None,
) -> DrafterSpec:
    """The ``auto`` tree for a saved head: cached, or calibrated on ``BUILTIN_CALIBRATION_PROMPTS`` and cached;
    with ``lookup_branch`` > 0, with that lookup branch (``with_lookup_branch``). ``lookup_solo="auto"`` is priced on
    the calibration run and cached with the tree per branch size; a cached tree without that price is calibrated
    again (its calibration run is not kept).

    ``log`` receives one line per stage (the calibration takes a while on first use).
    ``cache_dir`` defaults to ``$SPECHEADS_CACHE`` or ``~/.cache/specheads``, as for ``specheads generate``.
    ``kernels``: the generator's (``SpeculativeGenerator(kernels=...)``), so that calibration times what it runs."""
    check_solo_length(lookup_solo)  # before the calibration, which takes a while
    cache_dir = cache_root() if cache_dir is None else cache_dir
    path = auto_tree_cache_path(cache_dir, head_dir, target)
    cached = None if recalibrate else cached_tree(path)
    if cached is not None and lookup_branch and lookup_solo == "auto" and lookup_branch not in cached.lookup_solo:
        log(f"auto tree: the cached tree has no lookup-alone length priced for a {lookup_branch}-token branch")
        cached = None
    if cached is not None:
        return _cached_auto_spec(head, cached, lookup_branch, lookup_solo)
    encode = SpeculativeGenerator(target, tokenizer).encode
    prompts = [encode(text).view(-1) for text in BUILTIN_CALIBRATION_PROMPTS]
    log(
        f"auto tree: calibrating the head on {len(prompts)} built-in prompts ({CALIBRATION_TOKENS} tokens each), "
        f"then timing the target's verify cost on {device_label(target.device)}"
    )
    spec = auto_drafter(head, target, tokenizer, None, prompts, CALIBRATION_TOKENS, kernels)
    assert spec.auto is not None
    priced: dict[int, int | None] = {}
    if lookup_branch:
        spec = with_lookup_branch(spec, lookup_branch, lookup_solo)
        if lookup_solo == "auto":
            priced[lookup_branch] = getattr(spec.drafter, "solo_ngram", None)
    failed = remember_tree(path, spec.auto, f"{len(prompts)} built-in prompts", priced)
    log(
        f"auto tree: could not cache it ({failed}); calibrated again next time"
        if failed
        else f"auto tree: cached in {path}"
    )
    return spec


def _cached_auto_spec(head: Any, cached: CachedTree, lookup_branch: int, lookup_solo: int | str | None) -> DrafterSpec:
    """``auto_tree_drafter``'s spec from a cached choice (and, with a branch, its cached lookup-alone price)."""
    choice = cached.choice
    note = "" if choice.num_nodes else ", plain decoding"
    spec = DrafterSpec(
        drafter_for_choice(head, choice), f"auto, cached from {cached.calibrated_on}: {choice.describe()}{note}", choice
    )
    if not lookup_branch:
        return spec
    solo = cached.lookup_solo[lookup_branch] if lookup_solo == "auto" else lookup_solo
    branched = with_lookup_branch(spec, lookup_branch, solo)
    if lookup_solo == "auto" and spec.drafter is not None:
        chosen = "never" if solo is None else f"on {solo}-gram or longer matches"
        branched.tree += f"; lookup alone: auto, cached ({chosen})"
    return branched
