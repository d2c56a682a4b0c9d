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

from specheads.arg_types import non_negative_float, non_negative_int, positive_int
from specheads.bench.calibration import (
    DEFAULT_CALIBRATION_DATA,
    calibration_data_file,
    calibration_prompts,
    check_calibration_source,
    render_prompt,
)
from specheads.bench.lineup import build_methods, refuse_adapted_head, trees_per_head
from specheads.bench.questions import held_out_questions, load_questions, select_per_category
from specheads.bench.report import (
    OVERALL,
    PLOTS_MISSING,
    aggregate,
    check_out_folder,
    plots_available,
    write_report,
)
from specheads.bench.runner import BenchmarkInterrupted, mark_near_ties, run_benchmark
from specheads.bench.settings import BUILTIN_METHODS, BenchSettings
from specheads.decoding.cli import DTYPES, resolve_head_argument
from specheads.decoding.head_drafter import check_head_tree
from specheads.decoding.tuning.auto_tree import (
    parse_solo_length,
)
from specheads.decoding.tuning.cpu_attention import applies_to as gqa_applies_to
from specheads.decoding.tuning.cpu_kernels import CpuKernels
from specheads.heads.config import HeadLoadError
from specheads.heads.hub import HubError
from specheads.shipped_data import find_default_questions
from specheads.target import TargetLoadError, resolve_device_dtype

RETIMED = "every --tree auto calibration times the target's verify cost itself, at its own context length"


def build_parser() -> argparse.ArgumentParser:
    d = BenchSettings()
    parser = argparse.ArgumentParser(prog="specheads bench", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    _add_workload_arguments(parser, d)
    _add_method_arguments(parser, d)
    _add_auto_tree_arguments(parser, d)
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars (for logs)")
    return parser


def _add_workload_arguments(parser: argparse.ArgumentParser, d: BenchSettings) -> None:
    p = parser.add_argument_group("what is measured")
    p.add_argument("--target", default=d.target, help="target model (built-in name, directory, .gguf, Hub id)")
    p.add_argument("--questions", default=None, help="Spec-Bench question.jsonl (default: data/spec_bench/)")
    p.add_argument("--per-category", type=positive_int, default=d.per_category, help="questions per category")
    p.add_argument(
        "--repeats",
        type=int,
        default=d.repeats,
        help="run each (prompt, method) N times, interleaved, and report the median time (noisy machines)",
    )
    p.add_argument("--categories", nargs="*", default=[], help="only these categories (mt_bench, translation, ...)")
    p.add_argument("--max-new-tokens", type=positive_int, default=d.max_new_tokens, help="new tokens per run")
    p.add_argument("--temperature", type=non_negative_float, default=d.temperature, help="0 = greedy (lossless check)")
    p.add_argument("--seed", type=int, default=d.seed, help="sampling seed (T>0)")
    p.add_argument("--device", default=d.device, help="auto (cuda if available) | cpu | cuda | cuda:1 ...")
    p.add_argument(
        "--dtype",
        default=d.dtype,
        choices=DTYPES,
        help="auto: bfloat16 on a GPU, float32 on a CPU",
    )
    p.add_argument("--out", default=d.out, help="output folder for results.json, results.md and plots")


def _add_method_arguments(parser: argparse.ArgumentParser, d: BenchSettings) -> None:
    p = parser.add_argument_group("methods compared")
    p.add_argument(
        "--head",
        dest="heads",
        action="append",
        default=[],
        help="head folder (repeatable; one folder twice under two --tree is reported as NAME@TREE each)",
    )
    p.add_argument(
        "--tree",
        dest="trees",
        action="append",
        default=[],
        help="tree per --head (or one for all): auto | chain:D | dynamic:D,K,N (EAGLE) | tree file or name (Medusa); "
        "default: auto",
    )
    p.add_argument("--methods", nargs="*", default=d.methods, choices=BUILTIN_METHODS, help="comparison methods")
    p.add_argument("--assistant", default=None, help="draft model head folder for hf-assisted")
    p.add_argument(
        "--assistant-layers", type=positive_int, default=d.assistant_layers, help="layers of the default assistant"
    )
    p.add_argument(
        "--prompt-lookup-tokens",
        type=positive_int,
        default=d.prompt_lookup_tokens,
        help="tokens a prompt-lookup draft proposes: hf-prompt-lookup's prompt_lookup_num_tokens and the length of "
        "specheads-lookup's chain",
    )


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
        help=f"--tree auto: kept so older command lines with --head and --tree auto run; it changes nothing: {RETIMED}",
    )
    p.add_argument(
        "--backoff",
        action="store_true",
        help="also run every head with draft backoff (stop drafting while it does not pay) as NAME+backoff",
    )
    p.add_argument(
        "--lookup-branch",
        type=non_negative_int,
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
        type=non_negative_int,
        default=d.drafter_window,
        metavar="N",
        help="also run every EAGLE head as NAME+window, its drafter's own cache cut to the first --drafter-sinks and "
        "the last N rows (lossless; 0 = off)",
    )
    p.add_argument(
        "--drafter-sinks", type=non_negative_int, default=d.drafter_sinks, help="with --drafter-window: rows kept first"
    )


def _solo_length(value: str) -> int | str:
    try:
        return parse_solo_length(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def run_bench(
    settings: BenchSettings,
    target: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Load (or take) the target, run every method on the selected questions, write the report."""
    device, dtype = resolve_device_dtype(settings.device, settings.dtype)
    # the question file, output and head folders first: a wrong one fails at once, not after the target loaded
    questions_path = Path(settings.questions) if settings.questions else find_default_questions()
    every_question = load_questions(questions_path)
    check_out_folder(settings.out)
    if settings.assistant:
        resolve_head_argument(settings.assistant, "--assistant")
    for head, tree in zip(settings.heads, trees_per_head(settings)):  # every head's tree, before the first calibrates
        head_dir = resolve_head_argument(head, "--head")
        refuse_adapted_head(head, head_dir)
        try:
            check_head_tree(head_dir, tree)
        except ValueError as error:
            raise ValueError(f"--head {head}: --tree {error}") from None
    questions = select_per_category(every_question, settings.per_category, settings.categories)
    held_out = held_out_questions(every_question, questions, settings.calibration_prompts)
    check_calibration_source(settings, held_out, len(questions), questions_path)
    if target is None or tokenizer is None:
        from specheads.target import load_target

        target, tokenizer = load_target(settings.target, dtype=dtype, device=device)
    else:  # a target handed in (the Python API): the report names it, not the settings' default
        settings = replace(settings, target=str(getattr(target.config, "name_or_path", "") or type(target).__name__))
    device = target.device
    prompts = [(q, render_prompt(tokenizer, q.prompt, device)) for q in questions]
    calibration, calibration_source, calibration_ids = calibration_prompts(
        tokenizer, settings.calibration_prompts, device, held_out, calibration_data_file(settings)
    )
    kernels = CpuKernels()  # measured once here, then every method runs with the same CPU kernels
    methods = build_methods(settings, target, tokenizer, calibration, calibration_source, kernels)
    interrupted = None
    try:
        records = run_benchmark(
            methods,
            prompts,
            settings.max_new_tokens,
            settings.temperature,
            settings.seed,
            progress=settings.progress,
            repeats=settings.repeats,
        )
    except BenchmarkInterrupted as stop:  # Ctrl-C: the prompts every method finished are reported, then it stops
        records, interrupted = stop.records, stop
    if settings.temperature == 0:
        mark_near_ties(records, target, prompts)
    config = _run_config(settings, questions_path, target, kernels)
    if settings.heads and "auto" in (settings.trees or ["auto"]):
        config["calibration"] = {"source": calibration_source, "question_ids": calibration_ids}
    if interrupted is not None:
        config["interrupted"] = f"after {interrupted.prompts_done} of {interrupted.prompts} prompts"
    report = aggregate(records, methods, config)
    paths = write_report(report, settings.out)
    if interrupted is not None:
        print(f"\nspecheads bench: {interrupted}; the finished ones are in {paths['markdown']}", file=sys.stderr)
        raise interrupted
    return report, paths


def _run_config(
    settings: BenchSettings, questions_path: Path, target: PreTrainedModel, kernels: CpuKernels
) -> dict[str, Any]:
    """The settings and the machine a run measured on, as results.json records them."""
    dtype = next(target.parameters()).dtype
    return {
        **asdict(settings),
        "questions": str(questions_path),
        "device": _device_name(target.device),
        "dtype": str(dtype).removeprefix("torch."),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        # every method's few-row products, transformers' included (hf_method): measured once, remembered
        "cpu_kernel_rows": sorted(kernels.faster_row_counts(target)),
        "cpu_gqa_attention": gqa_applies_to(target),  # every method's masked multi-token forwards, likewise
    }


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
    defaults = BenchSettings()
    if args.assistant and args.assistant_layers != defaults.assistant_layers:
        parser.error("--assistant-layers cuts the default assistant from the target; --assistant replaces it: give one")
    if args.heads and args.trees and "auto" not in args.trees:  # calibration options would be recorded unused
        calibrating = [
            option
            for option, given in [
                ("--recalibrate", args.recalibrate),
                ("--calibration-prompts", args.calibration_prompts != defaults.calibration_prompts),
                ("--calibration-data", args.calibration_data is not None),
            ]
            if given
        ]
        if calibrating:
            parser.error(f"{' '.join(calibrating)} calibrate --tree auto, and every --tree given is fixed: drop them")
    if args.recalibrate:
        print(f"note: --recalibrate is no longer needed: {RETIMED}", file=sys.stderr)
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
