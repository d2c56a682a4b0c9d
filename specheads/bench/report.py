"""Aggregate benchmark records per category and overall; write JSON, a markdown table and PNG plots.

speedup = baseline seconds per token / method seconds per token over the same prompts. At T=0 lossless methods
produce the baseline's tokens, so this is exactly baseline time / method time; at T>0 outputs differ in length and
per-token time is the fair comparison. The plots need matplotlib (the ``plots`` extra); without it the JSON and
markdown are still written.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from specheads.bench.methods import Method
from specheads.bench.runner import Record, process_peak_rss_mb

OVERALL = "overall"
PLOTS = {"speedup_png": "speedup.png", "acceptance_png": "acceptance.png"}
PLOTS_INSTALL = "pip install 'specheads[plots]'"
PLOTS_MISSING = f"matplotlib is not installed, so the plots ({', '.join(PLOTS.values())}) are skipped; {PLOTS_INSTALL}"


def plots_available() -> bool:
    """Whether matplotlib, which only the plots need, can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def summarize(records: list[Record]) -> dict[str, Any]:
    """Totals over a group of records of one method."""
    runs = [r.run for r in records]
    tokens = sum(r.new_tokens for r in runs)
    seconds = sum(r.seconds for r in runs)
    forwards = sum(r.target_forwards for r in runs)
    accepted = [a for r in runs for a in r.accepted_lengths]
    depth = max((len(r.depth_attempts) for r in runs), default=0)
    attempts = [sum(r.depth_attempts[d] for r in runs if d < len(r.depth_attempts)) for d in range(depth)]
    accepts = [sum(r.depth_accepts[d] for r in runs if d < len(r.depth_accepts)) for d in range(depth)]
    compared = [r.identical for r in records if r.identical is not None]
    return {
        "prompts": len(records),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / max(seconds, 1e-9),
        "target_forwards": forwards,
        "tau": tokens / max(forwards, 1),
        "draft_s": sum(r.draft_s for r in runs),
        "verify_s": sum(r.verify_s for r in runs),
        "other_s": sum(r.other_s for r in runs),
        "accepted_length_hist": dict(sorted(Counter(accepted).items())),
        "mean_accepted_length": sum(accepted) / len(accepted) if accepted else None,
        "plain_steps": sum(r.plain_steps for r in runs),  # draft backoff: steps verified without a draft
        "acceptance_per_depth": [a / max(n, 1) for a, n in zip(accepts, attempts)],
        "identical": sum(compared) if compared else None,
        "compared": len(compared),
        "near_ties": sum(r.near_tie is not None for r in records),
        "peak_mem_mb": max((r.peak_mem_mb for r in records if r.peak_mem_mb is not None), default=None),
    }


def aggregate(records: list[Record], methods: list[Method], config: dict[str, Any]) -> dict[str, Any]:
    """The whole report as one JSON-serialisable dict; ``methods[0]`` is the baseline."""
    categories = list(dict.fromkeys(r.question.category for r in records))
    results: dict[str, dict[str, Any]] = {}
    for method in methods:
        mine = [r for r in records if r.method == method.name]
        groups = {c: [r for r in mine if r.question.category == c] for c in categories}
        results[method.name] = {c: summarize(g) for c, g in {**groups, OVERALL: mine}.items() if g}
    baseline = results[methods[0].name]
    greedy = config.get("temperature", 0) == 0
    for per_group in results.values():
        for group, summary in per_group.items():
            summary["speedup"] = summary["tokens_per_s"] / max(baseline[group]["tokens_per_s"], 1e-9)
            if not greedy:  # sampled outputs are not expected to match the baseline's: nothing was compared
                summary["identical"], summary["compared"] = None, 0
    mismatches = [
        {"method": r.method, "question_id": r.question.question_id, "category": r.question.category}
        for r in records
        if r.identical is False and r.near_tie is None and _lossless(methods, r.method)
    ]
    near_ties = [
        {"method": r.method, "question_id": r.question.question_id, "category": r.question.category, "gap": r.near_tie}
        for r in records
        if r.near_tie is not None and _lossless(methods, r.method)
    ]
    return {
        "config": config,
        "noise": noise_floor(records, methods[0].name),
        "process_peak_rss_mb": process_peak_rss_mb(),
        "baseline": methods[0].name,
        "categories": categories,
        "methods": {m.name: {"description": m.description, "lossless": m.lossless, **m.extra} for m in methods},
        "results": results,
        "mismatches": mismatches if config.get("temperature", 0) == 0 else [],
        "near_ties": near_ties if config.get("temperature", 0) == 0 else [],
        "per_prompt": [
            {
                "question_id": r.question.question_id,
                "category": r.question.category,
                "method": r.method,
                "new_tokens": r.run.new_tokens,
                "seconds": r.run.seconds,
                "tau": r.run.tau,
                "repeat_seconds": r.repeat_seconds,
                "repeat_tokens": r.repeat_tokens,
                "identical": r.identical,
                "near_tie": r.near_tie,
            }
            for r in records
        ],
    }


PLAIN_LOOP = "specheads-plain"
"""The loop with no drafter: it does what ``generate`` does, so its speedup is the noise floor of a run."""


def noise_floor(records: list[Record], baseline: str) -> dict[str, float | None]:
    """How far two runs that should tie read apart: the plain loop against the baseline (overall speedup), and the
    median spread of repeated runs of one (prompt, method), ``(max - min) / median`` of their times per token (at
    T>0 repeats may end at different lengths)."""
    plain = [r for r in records if r.method == PLAIN_LOOP]
    base = {r.question.question_id: r for r in records if r.method == baseline}
    plain_speedup = None
    if plain:
        plain_rate = sum(r.run.new_tokens for r in plain) / max(sum(r.run.seconds for r in plain), 1e-9)
        mine = [base[r.question.question_id] for r in plain]
        base_rate = sum(r.run.new_tokens for r in mine) / max(sum(r.run.seconds for r in mine), 1e-9)
        plain_speedup = plain_rate / max(base_rate, 1e-9)
    spreads = []
    for r in records:
        per_token = [s / max(n, 1) for s, n in zip(r.repeat_seconds, r.repeat_tokens)]
        if len(per_token) > 1:
            spreads.append((max(per_token) - min(per_token)) / max(statistics.median(per_token), 1e-9))
    return {
        "plain_loop_speedup": plain_speedup,
        "repeat_spread": statistics.median(spreads) if spreads else None,
    }


def _noise_note(report: dict[str, Any]) -> str:
    noise, repeats = report.get("noise") or {}, report["config"].get("repeats", 1)
    parts = []
    if repeats > 1:
        parts.append(f"each (prompt, method) ran {repeats} times, interleaved; times are the median run's")
        if noise.get("repeat_spread") is not None:
            parts.append(f"repeats of one run spread by a median {100 * noise['repeat_spread']:.0f}% of its time")
    if noise.get("plain_loop_speedup") is not None:
        parts.append(
            f"noise floor: `{PLAIN_LOOP}` (drafts nothing) read {noise['plain_loop_speedup']:.2f}x, so differences "
            "of that size are noise"
        )
    return (" " + "; ".join(parts) + ".") if parts else ""


def _lossless(methods: list[Method], name: str) -> bool:
    return next(m.lossless for m in methods if m.name == name)


def markdown_report(report: dict[str, Any]) -> str:
    """Tables: overall per method, speedup and tau per category, accepted-length histograms."""
    lines = _overall_table(report) + _category_tables(report) + _histogram_table(report["results"])
    return "\n".join(lines + _trees_costs_and_mismatches(report)) + "\n"


def _prompts_per_category(report: dict[str, Any]) -> str:
    """How many prompts each category measured: ``--per-category`` is an upper bound a small file may not reach."""
    asked = report["config"].get("per_category")
    measured = {
        category: group["prompts"]
        for category, group in report["results"].get(report["baseline"], {}).items()
        if category != OVERALL
    }
    if not measured or set(measured.values()) == {asked}:
        return f"{asked} prompt(s) per category"
    counts = ", ".join(f"{category} {count}" for category, count in measured.items())
    return f"up to {asked} prompt(s) per category (measured: {counts})"


def _interrupted_note(config: dict[str, Any]) -> str:
    if not config.get("interrupted"):
        return ""
    return f" **Partial: interrupted (Ctrl-C) {config['interrupted']}; these numbers cover the prompts finished.**"


def _kernel_note(config: dict[str, Any]) -> str:
    rows, note = config.get("cpu_kernel_rows"), ""
    if rows:
        span = f"{rows[0]}-{rows[-1]}" if rows == list(range(rows[0], rows[-1] + 1)) else ", ".join(map(str, rows))
        note += (
            f" Matrix products of {span} rows ran as `(W @ x.T).T`{' (one row padded to two)' * (1 in rows)} in every "
            "method, transformers' included (measured faster than `F.linear` on this CPU: "
            "`specheads.decoding.tuning.cpu_kernels`)."
        )
    if config.get("cpu_gqa_attention"):
        note += (
            " Masked attention over several query tokens ran as grouped-query SDPA, without copying the KV cache per "
            "query head, in every method (`specheads.decoding.tuning.cpu_attention`)."
        )
    return note


def _overall_table(report: dict[str, Any]) -> list[str]:
    config = report["config"]
    greedy = config.get("temperature", 0) == 0
    lines = [
        f"Target `{config.get('target')}` on {config.get('device')} ({config.get('dtype')}), "
        f"T={config.get('temperature')}, {config.get('max_new_tokens')} new tokens, "
        f"{_prompts_per_category(report)}, baseline `{report['baseline']}`.{_interrupted_note(config)}"
        f"{_noise_note(report)}{_kernel_note(config)}",
        "",
        "| method | tau | tokens/s | speedup | identical at T=0 | time draft / verify / other | peak mem (MB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, per_group in report["results"].items():
        s = per_group[OVERALL]
        identical = "baseline" if name == report["baseline"] else (f"{s['identical']}/{s['compared']}")
        if s.get("near_ties"):
            identical += f" (+{s['near_ties']} near-tie)"
        total = max(s["seconds"], 1e-9)
        split = " / ".join(f"{100 * s[k] / total:.0f}%" for k in ("draft_s", "verify_s", "other_s"))
        memory = "n/a (CPU)" if s["peak_mem_mb"] is None else f"{s['peak_mem_mb']:.0f}"
        lines.append(
            f"| {name} | {s['tau']:.2f} | {s['tokens_per_s']:.1f} | {s['speedup']:.2f}x | "
            f"{identical if greedy else 'n/a (T>0)'} | {split} | {memory} |"
        )
    return lines


def _category_tables(report: dict[str, Any]) -> list[str]:
    results, categories = report["results"], report["categories"]
    lines = []
    for title, key, fmt in (("Speedup", "speedup", "{:.2f}x"), ("tau", "tau", "{:.2f}")):
        lines += ["", f"{title} per category:", "", "| method | " + " | ".join(categories) + " | overall |"]
        lines.append("|---" * (len(categories) + 2) + "|")
        for name, per_group in results.items():
            cells = [fmt.format(per_group[c][key]) if c in per_group else "-" for c in [*categories, OVERALL]]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [
        "",
        "speedup = baseline s/token / method s/token (= time ratio when outputs are identical). Time split: every "
        "target forward (the prompt's included) is verify; drafting includes the drafter's start on the prompt. Peak "
        "mem: per-method `torch.cuda.max_memory_allocated` on GPU; none per method on CPU, where the allocator keeps "
        "freed memory, so RSS only rises: the whole process peaked at "
        f"{report.get('process_peak_rss_mb') or 0:.0f} MB RSS.",
    ]


def _histogram_table(results: dict[str, Any]) -> list[str]:
    hists = {n: g[OVERALL] for n, g in results.items() if g[OVERALL]["accepted_length_hist"]}
    if not hists:
        return []
    longest = max(max(int(k) for k in s["accepted_length_hist"]) for s in hists.values())
    lines = ["", "Accepted draft tokens per step (share of steps):", ""]
    lines += ["| method | " + " | ".join(str(k) for k in range(longest + 1)) + " | mean |"]
    lines.append("|---" * (longest + 3) + "|")
    for name, s in hists.items():
        hist = {int(k): v for k, v in s["accepted_length_hist"].items()}
        steps = sum(hist.values())
        cells = [f"{100 * hist.get(k, 0) / steps:.0f}%" for k in range(longest + 1)]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {s['mean_accepted_length']:.2f} |")
    return lines


def _trees_costs_and_mismatches(report: dict[str, Any]) -> list[str]:
    lines = []
    trees = {n: m["tree"] for n, m in report["methods"].items() if m.get("tree")}
    if trees:
        lines += ["", "Trees:", ""] + [f"- `{n}`: {t}" for n, t in trees.items()]
    priced = {n: m for n, m in report["methods"].items() if m.get("cost_curve")}
    if priced:  # each auto tree was priced on the verify cost its calibration timed, at its context length
        c = next(iter(priced.values()))["cost_curve"]
        lines += ["", f"Target forward cost by new tokens, as each auto tree's calibration timed it ({c['device']}, "
                  f"{c['dtype']}):", ""]  # fmt: skip
        by_curve: dict[str, list[str]] = {}  # a head's variants share its calibration
        for name, method in priced.items():
            by_curve.setdefault(json.dumps(method["cost_curve"], sort_keys=True), []).append(f"`{name}`")
        for key, names in by_curve.items():
            c = json.loads(key)
            cells = ", ".join(f"{n}: {1000 * s:.0f} ms" for n, s in zip(c["sizes"], c["seconds"]))
            # a curve given by hand (or an old report's without one) has no context length
            context = f" ({c['prefix_len']}-token context)" if c.get("prefix_len") else ""
            lines.append(f"- {', '.join(names)}{context}: {cells}")
    if report.get("near_ties"):
        lines += ["", f"Near-ties at T=0 ({report['config'].get('dtype')}: outputs part where the baseline's own "
                  "logits were within a few 16-bit steps, which a multi-token verify rounds differently; not counted "
                  "as mismatches):", ""]  # fmt: skip
        lines += [
            f"- `{m['method']}` on question {m['question_id']} ({m['category']}): logit gap {m['gap']:.4f}"
            for m in report["near_ties"]
        ]
    if report["mismatches"]:
        lines += ["", "**MISMATCHES at T=0 (lossless methods whose output differs from the baseline):**", ""]
        lines += [f"- `{m['method']}` on question {m['question_id']} ({m['category']})" for m in report["mismatches"]]
    return lines


def plot_report(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """``speedup.png`` (per category per method) and ``acceptance.png`` (acceptance rate per tree depth)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, categories = report["results"], [*report["categories"], OVERALL]
    names = [n for n in results if n != report["baseline"]]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(categories)), 4))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs = [c + i * width for c in range(len(categories))]
        ax.bar(xs, [results[name].get(c, {}).get("speedup", 0) for c in categories], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks([c + width * (len(names) - 1) / 2 for c in range(len(categories))], categories, rotation=20)
    ax.set_ylabel(f"speedup over {report['baseline']}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    paths = [out_dir / PLOTS["speedup_png"]]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    drafted = {name: g[OVERALL]["acceptance_per_depth"] for name, g in results.items()}
    drafted = {name: rates for name, rates in drafted.items() if rates}
    for name, rates in drafted.items():
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=name)
    ax.set_xlabel("tree depth")
    ax.set_ylabel("acceptance rate (steps reaching the depth)")
    ax.set_ylim(0, 1)
    if drafted:
        ax.legend(fontsize="small")
    else:  # e.g. every head's auto tree was the root alone: plain decoding, nothing drafted to accept
        ax.text(0.5, 0.5, "no method drafted a tree", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    paths.append(out_dir / PLOTS["acceptance_png"])
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


def check_out_folder(out_dir: str | Path) -> None:
    """Refuse an output folder that cannot be made (it, or a folder above it, is a file) before anything is measured:
    the report is written last, and a failure there loses the whole run."""
    out_dir = Path(out_dir)
    for folder in (out_dir, *out_dir.parents):
        if folder.exists():
            if not folder.is_dir():
                raise ValueError(
                    f"--out {out_dir}: {folder} is a file; expected a folder for the report: pass another --out"
                )
            return


def write_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write ``results.json``, ``results.md`` and the plots into ``out_dir``; returns the paths. All are made in a
    temporary folder first and then renamed into place, so a run killed while writing them does not leave the new
    numbers beside an earlier run's plots. Without matplotlib the plots are skipped with a warning (and an earlier
    run's are removed); the numbers are always written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = {"json": "results.json", "markdown": "results.md"}
    with tempfile.TemporaryDirectory(prefix=".report-", dir=out_dir) as tmp:
        staged = Path(tmp)
        (staged / "results.json").write_text(json.dumps(report, indent=2))
        (staged / "results.md").write_text(markdown_report(report))
        if plots_available():
            plot_report(report, staged)
            names.update(PLOTS)
        else:
            warnings.warn(PLOTS_MISSING, stacklevel=2)
            for name in PLOTS.values():
                (out_dir / name).unlink(missing_ok=True)
        for name in names.values():
            os.replace(staged / name, out_dir / name)
    return {key: out_dir / name for key, name in names.items()}
