"""Per context length of the long-context set: what a speculative step costs, and what a head gains.

For each question (``--per-length`` per length of `data/long_context/questions.jsonl`) the target prefills the
prompt, then ``--steps`` speculative steps run by hand: the EAGLE drafter proposes a tree, the target verifies it
with its full cache, and the root alone is committed (the step costs what any step costs; only acceptance differs).
Measured per length, as medians over steps and prompts:
- the target's verify cost per step (grows with its KV cache), and a plain one-token step for scale;
- the drafter's time per step and its cache size, with every row and with a sink + recent window;
- prompt lookup's cost per step: the incremental n-gram index against a rescan of the whole context;
- with ``--head``: tau and speedup over ``generate`` of that head (and with the window). Without a head, a fresh
  random EAGLE-3 head drafts: enough for the cost and memory columns, not for tau.

    python scripts/long_context_costs.py [--head runs/eagle3] [--tree chain:3] [--per-length 1] [--steps 8]
    python scripts/long_context_costs.py --head runs/eagle3 --window-sweep 16 64 256   # tau against window size

The target runs under the CPU kernels that ``specheads generate`` and ``specheads bench`` use (``CpuKernels``:
few-row products and grouped-query attention), for ``generate`` as for the speculative steps; ``--stock-kernels``
measures without them. One untimed run on the first prompt warms both up. Prints a markdown table (and writes it,
with the raw numbers, under ``--out``). Timings on a busy machine are noisy: say what else ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from specheads.bench.calibration import render_prompt
from specheads.bench.questions import load_questions, select_per_category
from specheads.decoding import SpeculativeGenerator, build_drafter
from specheads.decoding.draft import Sampling
from specheads.decoding.eagle_draft import DrafterWindow, with_drafter_window
from specheads.decoding.kv_cache import commit_path, crop_to, new_cache
from specheads.decoding.ngram_index import NgramIndex
from specheads.decoding.prompt_lookup_drafter import lookup_match
from specheads.decoding.tuning.cpu_attention import NAME as GQA
from specheads.decoding.tuning.cpu_attention import attention_configs
from specheads.decoding.tuning.cpu_kernels import CpuKernels
from specheads.decoding.verify import select_rows, verify_tree
from specheads.heads import EagleConfig, EagleHead, load_head
from specheads.target import load_target

QUESTIONS = Path(__file__).resolve().parents[1] / "data" / "long_context" / "questions.jsonl"


def cache_mib(cache: Any) -> float:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)) / 2**20


@contextlib.contextmanager
def stock_sdpa(model: Any):
    """transformers' own SDPA attention (per-head KV copies) inside a ``CpuKernels`` block, for one timing."""
    configs = attention_configs(model, (GQA,))
    for config in configs:
        config._attn_implementation = "sdpa"
    try:
        yield
    finally:
        for config in configs:
            config._attn_implementation = GQA


def step_costs(model: Any, drafter: Any, ids: torch.Tensor, steps: int) -> dict[str, float]:
    """Prefill, then ``steps`` propose -> verify -> commit-the-root steps; medians of their parts (and the same verify
    with transformers' stock SDPA attention, when the grouped-query one is on)."""
    layers = drafter.layer_ids
    cache = new_cache(model)
    out = model(input_ids=ids.view(1, -1), cache=cache, use_cache=True, output_hidden_states=layers)
    root = int(out.logits[0, -1].argmax())
    start = time.perf_counter()
    state = drafter.begin(ids.view(-1), out.hidden_states, root, Sampling(), None)
    drafter.flush(state)
    prefill_s = time.perf_counter() - start
    draft, verify, plain, stock = [], [], [], []
    for _ in range(steps):
        start = time.perf_counter()
        tree = drafter.propose(state)
        draft.append(time.perf_counter() - start)
        prefix = cache.get_seq_length()
        start = time.perf_counter()
        checked = verify_tree(model, cache, tree.tokens, tree.parents, layers)
        verify.append(time.perf_counter() - start)
        crop_to(cache, prefix)
        if model.config._attn_implementation == GQA:
            with stock_sdpa(model):
                start = time.perf_counter()
                verify_tree(model, cache, tree.tokens, tree.parents, layers)
                stock.append(time.perf_counter() - start)
            crop_to(cache, prefix)
        start = time.perf_counter()
        verify_tree(model, cache, tree.tokens[:1], tree.parents[:1])  # a plain decoding step, for scale
        plain.append(time.perf_counter() - start)
        commit_path(cache, prefix, [0])
        new_root = int(checked.logits[0].argmax())
        drafter.observe(state, tree.tokens[:1], select_rows(checked.hidden_states, torch.tensor([0])), new_root)
    drafter.flush(state)
    return {
        "verify_ms": 1e3 * statistics.median(verify),
        **({"verify_repeat_kv_ms": 1e3 * statistics.median(stock)} if stock else {}),
        "plain_step_ms": 1e3 * statistics.median(plain),
        "draft_ms": 1e3 * statistics.median(draft),
        "drafter_prefill_s": prefill_s,
        "drafter_rows": state.cache.get_seq_length(),
        "drafter_mib": cache_mib(state.cache),
        "tree_nodes": tree.num_nodes,
    }


def lookup_costs(context: list[int], repeats: int = 50) -> dict[str, float]:
    """One step of prompt lookup at this context: the index's update + match, and a rescan of the whole context."""
    index = NgramIndex(3, 2)
    index.extend(context[:-1])
    start = time.perf_counter()
    for _ in range(repeats):
        index.extend(context[-1:])  # the committed token, then the match (the index grows by a token a repeat)
        index.match(10)
    indexed = (time.perf_counter() - start) / repeats
    tensor = torch.tensor(context)
    start = time.perf_counter()
    for _ in range(max(repeats // 10, 1)):
        lookup_match(tensor, 10, 3, 2)
    rescan = (time.perf_counter() - start) / max(repeats // 10, 1)
    return {"lookup_index_us": 1e6 * indexed, "lookup_rescan_us": 1e6 * rescan}


def head_speed(
    model: Any, tokenizer: Any, drafter: Any, ids: torch.Tensor, new_tokens: int, kernels: Any
) -> dict[str, float]:
    """tau and wall time of the head's speculative decoding, and of ``generate``, on one prompt (greedy)."""
    prompt = ids.view(1, -1)
    start = time.perf_counter()
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False)
    generate_s = time.perf_counter() - start
    result = SpeculativeGenerator(model, tokenizer, drafter, acceptance="greedy", kernels=kernels).generate(
        prompt, max_new_tokens=new_tokens
    )
    return {"tau": result.stats.tau, "speedup": generate_s / result.stats.total_s}


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    model, tokenizer = load_target(args.target)
    torch.manual_seed(0)
    head = load_head(args.head, model) if args.head else EagleHead(EagleConfig(version=3), model).eval()
    full = build_drafter(head, args.tree)
    windowed = with_drafter_window(full, DrafterWindow(args.sinks, args.window))
    questions = select_per_category(load_questions(args.questions), args.per_length)
    kernels = None if args.stock_kernels else CpuKernels()
    with kernels(model) if kernels is not None else contextlib.nullcontext():
        return measure_questions(args, model, tokenizer, (full, windowed), questions, kernels)


def measure_questions(args, model, tokenizer, drafters, questions, kernels) -> dict[str, list[dict[str, float]]]:
    full, windowed = drafters
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    if args.head:  # untimed: the first generate and speculative runs pay one-off costs
        head_speed(model, tokenizer, full, render_prompt(tokenizer, questions[0].prompt, model.device), 8, kernels)
    for question in questions:
        ids = render_prompt(tokenizer, question.prompt, model.device).view(-1)
        row: dict[str, float] = {"prompt_tokens": ids.numel()}
        for label, drafter in (("", full), ("window_", windowed)):
            row.update({f"{label}{k}": v for k, v in step_costs(model, drafter, ids, args.steps).items()})
            if args.head:
                speed = head_speed(model, tokenizer, drafter, ids, args.max_new_tokens, kernels)
                row.update({f"{label}{k}": v for k, v in speed.items()})
        row.update(lookup_costs(ids.tolist()))
        rows[question.category].append(row)
        print(f"{question.category} question {question.question_id}: {json.dumps(row)}", flush=True)
    return rows


COLUMNS = [
    ("prompt tokens", "prompt_tokens", "{:.0f}"),
    ("target verify ms/step", "verify_ms", "{:.1f}"),
    ("verify ms/step, stock SDPA", "verify_repeat_kv_ms", "{:.1f}"),
    ("plain step ms", "plain_step_ms", "{:.1f}"),
    ("drafter ms/step", "draft_ms", "{:.1f}"),
    ("drafter cache MiB", "drafter_mib", "{:.2f}"),
    ("drafter ms/step, window", "window_draft_ms", "{:.1f}"),
    ("drafter cache MiB, window", "window_drafter_mib", "{:.2f}"),
    ("lookup us/step, index", "lookup_index_us", "{:.0f}"),
    ("lookup us/step, rescan", "lookup_rescan_us", "{:.0f}"),
    ("tau", "tau", "{:.2f}"),
    ("tau, window", "window_tau", "{:.2f}"),
    ("speedup", "speedup", "{:.2f}x"),
    ("speedup, window", "window_speedup", "{:.2f}x"),
]


def markdown(rows: dict[str, list[dict[str, float]]]) -> str:
    """One line per length: medians over its prompts (tau and speedup: "-" without a head)."""
    lines = ["| length | " + " | ".join(name for name, _, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for category, measured in rows.items():
        cells = []
        for _, key, form in COLUMNS:
            values = [r[key] for r in measured if key in r]
            cells.append(form.format(statistics.median(values)) if values else "-")
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def window_sweep(
    model: Any, tokenizer: Any, drafter: Any, prompts: dict[str, list[torch.Tensor]], windows: list[int], args
) -> dict[str, dict[str, float]]:
    """Median tau per length for each drafter window (``recent`` rows after ``args.sinks`` sinks; 0 = every row):
    greedy decoding of ``args.max_new_tokens`` tokens per prompt, the same target and tree for every window."""
    table: dict[str, dict[str, float]] = {}
    kernels = CpuKernels()
    for category, ids_list in prompts.items():
        table[category] = {}
        for recent in windows:
            windowed = with_drafter_window(drafter, DrafterWindow(args.sinks, recent)) if recent else drafter
            taus = []
            for ids in ids_list:
                generator = SpeculativeGenerator(model, tokenizer, windowed, acceptance="greedy", kernels=kernels)
                result = generator.generate(ids.view(1, -1), max_new_tokens=args.max_new_tokens)
                taus.append(result.stats.tau)
            table[category][str(recent or "all")] = statistics.median(taus)
            print(f"{category} window {recent or 'all'}: tau {statistics.median(taus):.2f} ({len(taus)} prompts)")
    return table


def sweep_markdown(table: dict[str, dict[str, float]]) -> str:
    windows = list(next(iter(table.values())))
    lines = ["| length | " + " | ".join(f"tau, window {w}" for w in windows) + " |", "|---" * (len(windows) + 1) + "|"]
    lines += [f"| {c} | " + " | ".join(f"{row[w]:.2f}" for w in windows) + " |" for c, row in table.items()]
    return "\n".join(lines)


def run_window_sweep(args: argparse.Namespace) -> None:
    """``--window-sweep``: tau per length against the drafter window's size, written to OUT/window-sweep.*."""
    model, tokenizer = load_target(args.target)
    drafter = build_drafter(load_head(args.head, model), args.tree)
    questions = select_per_category(load_questions(args.questions), args.per_length)
    prompts: dict[str, list[torch.Tensor]] = defaultdict(list)
    for question in questions:
        prompts[question.category].append(render_prompt(tokenizer, question.prompt, model.device).view(-1))
    table = window_sweep(model, tokenizer, drafter, prompts, [*args.window_sweep, 0], args)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = vars(args) | {"questions": str(args.questions), "out": str(args.out)}
    (args.out / "window-sweep.json").write_text(json.dumps({"settings": settings, "tau": table}, indent=1))
    (args.out / "window-sweep.md").write_text(sweep_markdown(table) + "\n")
    print(sweep_markdown(table))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument("--head", default=None, help="a saved EAGLE head (default: a fresh random EAGLE-3 head)")
    parser.add_argument("--tree", default="chain:3", help="the head's tree, as specheads generate --tree")
    parser.add_argument("--per-length", type=int, default=1, help="questions per length")
    parser.add_argument("--steps", type=int, default=8, help="measured steps per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="with --head: tokens for tau and speedup")
    parser.add_argument("--window", type=int, default=256, help="the drafter window's recent rows")
    parser.add_argument("--sinks", type=int, default=4, help="the drafter window's sink rows")
    parser.add_argument("--stock-kernels", action="store_true", help="without the CPU kernels (CpuKernels)")
    parser.add_argument("--out", type=Path, default=Path("runs/long_context_costs"))
    parser.add_argument(
        "--window-sweep",
        type=int,
        nargs="+",
        default=None,
        metavar="RECENT",
        help="with --head, only measure tau per length for each of these drafter windows and every row",
    )
    args = parser.parse_args()
    if args.window_sweep:
        if not args.head:
            parser.error("--window-sweep needs --head (a fresh head's tau says nothing about the window)")
        with torch.inference_mode():
            run_window_sweep(args)
        return
    with torch.inference_mode():
        rows = measure(args)
    table = markdown(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "costs.json").write_text(
        json.dumps(
            {"settings": vars(args) | {"questions": str(args.questions), "out": str(args.out)}, "rows": rows}, indent=1
        )
    )
    (args.out / "costs.md").write_text(table + "\n")
    print(f"{torch.get_num_threads()} threads, tree {args.tree}, window {args.sinks} + {args.window} rows")
    print(table)


if __name__ == "__main__":
    main()
