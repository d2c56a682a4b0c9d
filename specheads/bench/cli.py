"""``specheads bench`` / ``scripts/benchmark.py``: specheads heads against plain ``generate``, transformers' prompt
lookup and assisted generation, on Spec-Bench questions, interleaved per prompt in one process.

    specheads bench --head runs/eagle3-smollm2-135m --tree auto --per-category 3 --max-new-tokens 96 --out runs/bench
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.bench.calibration import (
    DEFAULT_CALIBRATION_DATA,
    calibration_data_file,
    calibration_prompts,
    check_calibration_source,
    render_prompt,
)
from specheads.bench.methods import Method, hf_method, specheads_method
from specheads.bench.questions import held_out_questions, load_questions, select_per_category
from specheads.bench.report import OVERALL, PLOTS_MISSING, aggregate, plots_available, write_report
from specheads.bench.runner import mark_near_ties, run_benchmark
from specheads.bench.settings import BUILTIN_METHODS, BenchSettings
from specheads.decoding.cli import resolve_head_argument
from specheads.decoding.eagle_draft import DrafterWindow, with_drafter_window
from specheads.decoding.generator import Kernels
from specheads.decoding.tuning.auto_tree import (
    DrafterSpec,
    auto_drafter,
    auto_tree_cache_path,
    fixed_drafter,
    parse_solo_length,
    prompt_lookup_drafter,
    remember_tree,
    with_lookup_branch,
)
from specheads.decoding.tuning.cost_curve import CostCurve, load_or_measure_cost_curve
from specheads.decoding.tuning.cpu_kernels import SmallBatchLinear
from specheads.heads.config import HeadLoadError
from specheads.heads.hub import HubError
from specheads.shipped_data import find_default_questions
from specheads.target import TargetLoadError, cache_root, resolve_device_dtype


def build_parser() -> argparse.ArgumentParser:
    d = BenchSettings()
    parser = argparse.ArgumentParser(prog="specheads bench", description=__doc__.split("\n\n")[0])
    _add_workload_arguments(parser, d)
    _add_method_arguments(parser, d)
    _add_auto_tree_arguments(parser, d)
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    return parser


def _add_workload_arguments(parser: argparse.ArgumentParser, d: BenchSettings) -> None:
    p = parser.add_argument_group("what is measured")
    p.add_argument("--target", default=d.target, help="target model (built-in name, directory, .gguf, Hub id)")
    p.add_argument("--questions", default=None, help="Spec-Bench question.jsonl (default: data/spec_bench/)")
    p.add_argument("--per-category", type=int, default=d.per_category, help="questions per category")
    p.add_argument(
        "--repeats",
        type=int,
        default=d.repeats,
        help="run each (prompt, method) N times, interleaved, and report the median time (noisy machines)",
    )
    p.add_argument("--categories", nargs="*", default=[], help="only these categories (mt_bench, translation, ...)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature, help="0 = greedy (lossless check)")
    p.add_argument("--seed", type=int, default=d.seed, help="sampling seed (T>0)")
    p.add_argument("--device", default=d.device, help="auto (cuda if available) | cpu | cuda | cuda:1 ...")
    p.add_argument("--dtype", default=d.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--out", default=d.out, help="output folder for results.json, results.md and plots")


def _add_method_arguments(parser: argparse.ArgumentParser, d: BenchSettings) -> None:
    p = parser.add_argument_group("methods compared")
    p.add_argument("--head", dest="heads", action="append", default=[], help="head folder (repeatable)")
    p.add_argument(
        "--tree",
        dest="trees",
        action="append",
        default=[],
        help="tree per --head (or one for all): auto | chain:D | dynamic:D,K,N (EAGLE) | tree file or name (Medusa)",
    )
    p.add_argument("--methods", nargs="*", default=d.methods, choices=BUILTIN_METHODS, help="comparison methods")
    p.add_argument("--assistant", default=None, help="draft model head folder for hf-assisted")
    p.add_argument("--assistant-layers", type=int, default=d.assistant_layers, help="layers of the default assistant")
    p.add_argument("--prompt-lookup-tokens", type=int, default=d.prompt_lookup_tokens)


def _add_auto_tree_arguments(parser: argparse.ArgumentParser, d: BenchSettings) -> None:
    p = parser.add_argument_group("--tree auto and head variants")
    p.add_argument(
        "--calibration-prompts",
        type=int,
        default=d.calibration_prompts,
        help="held-out questions that calibrate --tree auto (round-robin over the measured categories)",
    )
    p.add_argument(
        "--calibration-data",
        default=None,
        metavar="FILE",
        help="--tree auto: JSONL chats (a 'messages' list each, as `specheads data generate` writes) whose first user "
        "turns calibrate the heads when the question file has too few unmeasured questions (default: "
        f"data/{DEFAULT_CALIBRATION_DATA.name} in a checkout of the repository)",
    )
    p.add_argument(
        "--recalibrate",
        action="store_true",
        help="--tree auto: time the target's verify cost again (a cached curve may have been timed on a busy "
        "machine); the heads' calibration runs on every bench run anyway",
    )
    p.add_argument(
        "--backoff",
        action="store_true",
        help="also run every head with draft backoff (stop drafting while it does not pay) as NAME+backoff",
    )
    p.add_argument(
        "--lookup-branch",
        type=int,
        default=d.lookup_branch,
        metavar="N",
        help="also run every head with up to N prompt-lookup tokens grafted onto its tree, as NAME+lookup (0 = off)",
    )
    p.add_argument(
        "--lookup-solo",
        type=_solo_length,
        default=d.lookup_solo,
        metavar="N|auto",
        help="with --lookup-branch: also run every head as NAME+lookup-solo, where steps whose lookup match is at "
        "least N tokens (2 or 3) propose the lookup chain alone and the head sits out; auto (needs --tree auto): "
        "N, or never, as the cost model prices it on the calibration run",
    )

    p.add_argument(
        "--drafter-window",
        type=int,
        default=d.drafter_window,
        metavar="N",
        help="also run every EAGLE head as NAME+window, its drafter's own cache cut to the first --drafter-sinks and "
        "the last N rows (lossless; 0 = off)",
    )
    p.add_argument("--drafter-sinks", type=int, default=d.drafter_sinks, help="with --drafter-window: rows kept first")


def _solo_length(value: str) -> int | str:
    try:
        return parse_solo_length(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


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
    trees = settings.trees or ["auto"]
    if len(trees) not in (1, len(settings.heads)):
        raise ValueError(f"give one --tree for all heads or one per --head; got {len(trees)} for {len(settings.heads)}")
    trees = trees * len(settings.heads) if len(trees) == 1 else trees
    if not calibration and "auto" in trees[: len(settings.heads)]:
        # auto_drafter would choose (and cache for specheads generate) a tree from no acceptance at all
        raise ValueError(
            "--tree auto needs calibration prompts and got none; pass --calibration-data FILE, or a fixed --tree"
        )
    curve = None
    for head_arg, tree in zip(settings.heads, trees):
        if tree == "auto" and curve is None:
            curve = load_or_measure_cost_curve(target, cache_root(), refresh=settings.recalibrate, kernels=kernels)
            relative = ", ".join(f"{n}: {r:.2f}x" for n, r in zip(curve.sizes, curve.relative()))
            print(f"verify cost by tree size on {curve.device} (relative to 1 token): {relative}")
        if any(m.name == f"specheads-{Path(head_arg).name}" for m in methods):
            raise ValueError(f"two --head folders are both named {Path(head_arg).name!r}; rename one")
        calibrated = (calibration, calibration_source, curve, kernels)
        methods += _head_methods(settings, head_arg, tree, target, tokenizer, *calibrated)
    return methods


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
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    calibration: list[torch.Tensor],
    calibration_source: str,
    curve: CostCurve | None,
    kernels: Kernels | None = None,
) -> list[Method]:
    """One head's methods: its tree, and with ``--backoff``, ``--lookup-branch`` and ``--lookup-solo`` those
    variants. An ``auto`` tree is chosen on ``curve`` and cached for ``specheads generate --tree auto``."""
    from specheads.heads import LORA_DIR, load_head, resolve_head_folder

    head_dir = resolve_head_folder(head_arg)  # a Hub id is fetched once; everything below reads this folder
    if (head_dir / LORA_DIR).is_dir():
        raise ValueError(
            f"{head_arg} is a Medusa-2 head with a LoRA adapter: it decodes an adapted target, so its outputs are "
            "not comparable to the plain target's. Merge the adapter into a target copy and pass it as --target."
        )
    head = load_head(head_dir, target).to(target.device).eval()
    acceptance = "greedy" if settings.temperature == 0 else "speculative"
    curve = curve if tree == "auto" else None
    if curve is not None:
        spec = auto_drafter(head, target, tokenizer, curve, calibration, kernels=kernels)
    else:
        spec = fixed_drafter(head, tree)
    name, what = f"specheads-{Path(head_arg).name}", f"{head.head_type} head"
    methods = [_specheads(name, target, tokenizer, spec, acceptance, what, kernels, curve)]
    if settings.backoff and spec.drafter is not None:
        backoff = f"{what}, draft backoff"
        methods.append(
            _specheads(f"{name}+backoff", target, tokenizer, spec, acceptance, backoff, kernels, curve, True)
        )
    if settings.lookup_branch:
        branch = with_lookup_branch(spec, settings.lookup_branch)
        what_branch = f"{what} + lookup"
        methods.append(_specheads(f"{name}+lookup", target, tokenizer, branch, acceptance, what_branch, kernels, curve))
    if settings.drafter_window and spec.drafter is not None:
        window = DrafterWindow(settings.drafter_sinks, settings.drafter_window)
        cut = DrafterSpec(with_drafter_window(spec.drafter, window), spec.tree, spec.auto)
        windowed = f"{what}, drafter cache {window.sinks} + {window.recent} rows"
        methods.append(_specheads(f"{name}+window", target, tokenizer, cut, acceptance, windowed, kernels, curve))
    priced: dict[int, int | None] = {}  # lookup-branch size -> solo n-gram length, priced with an auto tree
    if settings.lookup_solo is not None and spec.drafter is not None:  # no head tree: +lookup is the chain alone
        solo = with_lookup_branch(spec, settings.lookup_branch, settings.lookup_solo)
        alone = "where the cost model says" if settings.lookup_solo == "auto" else f"on {settings.lookup_solo}-grams"
        what_solo = f"{what} + lookup, alone {alone}"
        methods.append(
            _specheads(f"{name}+lookup-solo", target, tokenizer, solo, acceptance, what_solo, kernels, curve)
        )
        if settings.lookup_solo == "auto":
            priced[settings.lookup_branch] = solo.drafter.solo_ngram
    if curve is not None:  # what generate --tree auto [--lookup-solo auto] reuses on this device
        assert spec.auto is not None
        cached_as = auto_tree_cache_path(cache_root(), head_dir, target)
        failed = remember_tree(cached_as, spec.auto, f"specheads bench on {calibration_source}", priced)
        if failed:
            print(f"note: the auto tree could not be cached for specheads generate ({failed})", file=sys.stderr)
    return methods


def _specheads(
    name: str,
    target: Any,
    tokenizer: Any,
    spec: DrafterSpec,
    acceptance: str,
    what: str,
    kernels: Kernels | None,
    curve: CostCurve | None = None,
    backoff: bool = False,
) -> Method:
    extra: dict[str, Any] = {"tree": spec.tree, "backoff": backoff}
    if spec.auto is not None and curve is not None:
        extra["auto_tree"] = {"choices": spec.auto.choices, "candidates": spec.auto.candidates}
        extra["cost_curve"] = asdict(curve)
    description = f"specheads, {what}"
    return specheads_method(name, target, tokenizer, spec.drafter, acceptance, description, extra, backoff, kernels)


def run_bench(
    settings: BenchSettings,
    target: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Load (or take) the target, run every method on the selected questions, write the report."""
    device, dtype = resolve_device_dtype(settings.device, settings.dtype)
    # the question file and head folders first: a wrong one fails at once, not after the target loaded
    questions_path = Path(settings.questions) if settings.questions else find_default_questions()
    every_question = load_questions(questions_path)
    for option, folder in [*(("--head", h) for h in settings.heads), ("--assistant", settings.assistant)]:
        if folder:
            resolve_head_argument(folder, option)
    questions = select_per_category(every_question, settings.per_category, settings.categories)
    held_out = held_out_questions(every_question, questions, settings.calibration_prompts)
    check_calibration_source(settings, held_out, len(questions), questions_path)
    if target is None or tokenizer is None:
        from specheads.target import load_target

        target, tokenizer = load_target(settings.target, dtype=dtype, device=device)
    else:  # a target handed in (the Python API): the report names it, not the settings' default
        settings = replace(settings, target=str(getattr(target.config, "name_or_path", "") or type(target).__name__))
    device, dtype = target.device, next(target.parameters()).dtype
    prompts = [(q, render_prompt(tokenizer, q.prompt, device)) for q in questions]
    calibration, calibration_source, calibration_ids = calibration_prompts(
        tokenizer, settings.calibration_prompts, device, held_out, calibration_data_file(settings)
    )
    kernels = SmallBatchLinear()  # measured once here, then every method's few-row products use the same choice
    methods = build_methods(settings, target, tokenizer, calibration, calibration_source, kernels)
    records = run_benchmark(
        methods,
        prompts,
        settings.max_new_tokens,
        settings.temperature,
        settings.seed,
        progress=settings.progress,
        repeats=settings.repeats,
    )
    if settings.temperature == 0:
        mark_near_ties(records, target, prompts)
    config = {
        **asdict(settings),
        "questions": str(questions_path),
        "device": _device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        # every method's few-row products, transformers' included (hf_method): measured once, remembered
        "cpu_kernel_rows": sorted(kernels.faster_row_counts(target)),
    }
    if settings.heads and "auto" in (settings.trees or ["auto"]):
        config["calibration"] = {"source": calibration_source, "question_ids": calibration_ids}
    report = aggregate(records, methods, config)
    return report, write_report(report, settings.out)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def warn_mismatches(report: dict[str, Any]) -> None:
    """Print every lossless method whose T=0 output differs from the baseline, loudly, on stderr."""
    if not report["mismatches"]:
        return
    bar = "!" * 100
    lines = [bar, "WARNING: lossless methods produced outputs that differ from plain generate at T=0:"]
    lines += [f"  {m['method']}: question {m['question_id']} ({m['category']})" for m in report["mismatches"]]
    print("\n".join([*lines, bar]), file=sys.stderr)


def bench_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: expected a number of runs per (prompt, method), at least 1")
    if args.lookup_solo is not None and args.lookup_branch < 1:
        parser.error(f"--lookup-solo {args.lookup_solo} needs --lookup-branch N (N >= 1): it varies the branch")
    if args.lookup_solo == "auto" and any(tree != "auto" for tree in args.trees):
        parser.error(
            f"--lookup-solo auto is priced on the auto tree's calibration: it needs --tree auto, got {args.trees}"
        )
    if not args.heads:  # options that only shape the heads' methods would be recorded as if applied
        given = [
            option
            for option, value in [
                ("--tree", args.trees),
                ("--backoff", args.backoff),
                ("--lookup-branch", args.lookup_branch),
                ("--lookup-solo", args.lookup_solo is not None),
                ("--drafter-window", args.drafter_window),
                ("--recalibrate", args.recalibrate),
            ]
            if value
        ]
        if given:
            parser.error(f"{' '.join(given)} shape the heads' methods: they need --head DIR")
    if args.assistant and "hf-assisted" not in args.methods:
        parser.error(f"--assistant {args.assistant} is the draft model of hf-assisted, which --methods leaves out")
    settings = BenchSettings(**{k: v for k, v in vars(args).items()})
    settings.trees = settings.trees or ["auto"]
    if not plots_available():  # said before the measurement too, not only after it
        print(f"note: {PLOTS_MISSING}", file=sys.stderr)
    try:
        report, paths = run_bench(settings)
    except (ValueError, HeadLoadError, HubError, TargetLoadError, FileNotFoundError) as error:
        # settings, heads, files or prompts the target cannot take: what and how to fix it (HeadConfigError is a
        # ValueError)
        print(f"specheads bench: error: {error}", file=sys.stderr)
        return 2
    print(paths["markdown"].read_text())
    for label, path in paths.items():
        print(f"{label}: {path}")
    warn_mismatches(report)
    overall = report["results"]
    print("overall speedup: " + ", ".join(f"{n} {g[OVERALL]['speedup']:.2f}x" for n, g in overall.items()))
    return 1 if report["mismatches"] else 0
