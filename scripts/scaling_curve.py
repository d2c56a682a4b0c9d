"""Acceptance against training tokens: every checkpoint of one EAGLE run, measured on the target's own answers.

Each checkpoint of a run (``train.save_every``) is turned into a head folder (``RUN/curve/step-N``, loadable by
``specheads bench --head``) and evaluated teacher-forced on a self-distilled file of benchmark prompts (the target's
greedy answers, ``specheads data generate``): acceptance at depth d is the share of answer positions where the
head's d-th chained guess equals the target's token, given the d-1 before it were right (the training-time test's
``top1/step d``). Training tokens are counted exactly by replaying the run's sampler over its data.

    specheads data generate --prompts runs/data/specbench-4pc-prompts.jsonl --out runs/data/specbench-4pc-greedy.jsonl \
        --max-new-tokens 128
    python scripts/scaling_curve.py --run runs/eagle3-sharegpt --data runs/data/specbench-4pc-greedy.jsonl \
        --categories runs/data/specbench-4pc-prompts.jsonl --out docs/results/scaling-sharegpt
"""

from __future__ import annotations

import argparse
import hashlib
import json
from functools import partial
from pathlib import Path

import safetensors.torch
import torch
from torch.utils.data import DataLoader

from specheads.heads import HEADS, EagleHead
from specheads.target import load_target
from specheads.training.checkpoint import STATE_FILE, WEIGHTS_FILE, completed_checkpoints, read_step
from specheads.training.config import load_config
from specheads.training.data import DataConfig, build_datasets, collate
from specheads.training.metrics import teacher_forced_acceptance
from specheads.training.run_setup import EpochLengthGroupedSampler


def tokens_per_step(cfg, tokenizer, last_step: int, num_processes: int = 1) -> list[tuple[int, int]]:
    """(target tokens, loss tokens) trained on by the end of each step up to ``last_step``, replaying the run's order
    epoch by epoch (a data point past the first epoch counts the tokens it saw again)."""
    train_ds, _ = build_datasets(cfg.data, tokenizer)
    lengths = [len(ids) for ids in train_ds["input_ids"]]
    losses = [sum(mask) for mask in train_ds["loss_mask"]]
    return replay_tokens(lengths, losses, cfg.train, last_step, num_processes)


def replay_tokens(lengths: list[int], losses: list[int], tc, last_step: int, num_processes: int = 1):
    """Cumulative (tokens, loss tokens) per optimizer step. Each epoch's order is cut into micro-batches of
    ``tc.batch_size`` (the last one short) and the epochs run on as one stream, of which a step takes ``tc.grad_accum``
    micro-batches on each of ``num_processes`` processes: a step may span an epoch's end, as in training. Exact on one
    process; on several, the few samples Accelerate repeats to even out an epoch's last batches are not counted."""
    per_step = tc.grad_accum * num_processes
    totals, pending, seen, trained, epoch = [], 0, 0, 0, 0
    while len(totals) < last_step:
        if tc.group_by_length:
            sampler = EpochLengthGroupedSampler(tc.batch_size, lengths, tc.seed)
            sampler.set_epoch(epoch)
            order = list(sampler)
        else:  # a shuffled loader's order depends on its generator's use; the counts are then per-sample averages
            order = list(range(len(lengths)))
        for start in range(0, len(order), tc.batch_size):
            micro = order[start : start + tc.batch_size]
            seen += sum(lengths[i] for i in micro)
            trained += sum(losses[i] for i in micro)
            pending += 1
            if pending == per_step:
                totals.append((seen, trained))
                pending = 0
        epoch += 1
    return totals


def run_processes(checkpoint: Path) -> int:
    """How many processes trained the run (its checkpoint's trainer state; 1 for checkpoints that lack it)."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    return int(state.get("num_processes", 1))


def offset_tokens(rows: list[dict], base: int) -> list[dict]:
    """Rows of a warm-started run counted from zero, shifted to count the starting head's ``base`` loss tokens too."""
    return [row | {"loss_tokens": row["loss_tokens"] + base, "base_loss_tokens": base} for row in rows]


def category_rows(sources: list[int], records: list[dict], category: dict[str, str]) -> dict[str, list[int]]:
    """Category -> the eval dataset's rows of its answers. ``sources`` is the dataset's ``source`` column: a prompt
    that fills ``max_length`` leaves no answer token and is dropped (as training drops it), so rows shift after it."""
    groups: dict[str, list[int]] = {}
    for row, source in enumerate(sources):
        groups.setdefault(category[str(records[source]["id"])], []).append(row)
    return groups


def cached_row(path: Path, setting: dict) -> dict | None:
    """A checkpoint's acceptance measured earlier with the same answers, groups and depths (else None: measure)."""
    cached = json.loads(path.read_text()) if path.is_file() else {}
    if cached.get("measured_with") != setting:
        return None
    return {key: value for key, value in cached.items() if key != "measured_with"}


def checkpoint_head(cfg, target, checkpoint: Path, out: Path) -> torch.nn.Module:
    """The head inside a training checkpoint, saved as a head folder (once) and returned."""
    if (out / "config.json").is_file():
        from specheads.heads import load_head

        return load_head(out, target)
    head_cls = HEADS[cfg.head.type]
    config = head_cls.config_class.from_dict(dict(cfg.head.options))
    if head_cls is EagleHead and getattr(config, "draft_vocab_size", None):
        head = EagleHead(config, target, d2t=torch.arange(config.draft_vocab_size))  # replaced by the saved maps
    else:
        head = head_cls(config, target)
    state = safetensors.torch.load_file(str(checkpoint / WEIGHTS_FILE))
    head.load_state_dict({k.removeprefix("head."): v for k, v in state.items() if k.startswith("head.")}, strict=True)
    head = head.to(next(target.parameters()).dtype)
    head.save_pretrained(out, card={"training": {"checkpoint": str(checkpoint)}})
    return head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a training output_dir with checkpoints/")
    parser.add_argument("--data", required=True, help="self-distilled benchmark answers (messages JSONL)")
    parser.add_argument(
        "--categories", default=None, help="the prompts file with a 'category' per id (per-category rows)"
    )
    parser.add_argument("--depths", type=int, default=3)
    parser.add_argument("--steps", type=int, nargs="*", default=None, help="only these checkpoints (default: all)")
    parser.add_argument("--out", required=True, help="folder for curve.json, curve.md and curve.png")
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("LABEL", "CURVE_JSON"),
        default=None,
        help="draw another run's curve.json (dashed) in the same plot, e.g. fixed-text against regenerated data",
    )
    parser.add_argument("--label", default=None, help="this run's name in a compared plot (default: its folder)")
    parser.add_argument(
        "--base-tokens",
        type=int,
        default=0,
        help="for a warm start (head.init_from): the loss tokens its starting head was trained on, added to each point",
    )
    args = parser.parse_args()

    run = Path(args.run)
    cfg = load_config(run / "train_config.yaml")
    target, tokenizer = load_target(cfg.target.name)
    checkpoints = [c for c in completed_checkpoints(run) if not args.steps or read_step(c) in args.steps]
    processes = run_processes(checkpoints[-1]) if checkpoints else 1
    steps = tokens_per_step(cfg, tokenizer, max((read_step(c) for c in checkpoints), default=1), processes)
    eval_cfg = DataConfig(paths=[args.data], max_length=cfg.data.max_length, eval_size=0)
    merge = partial(collate, pad_token_id=tokenizer.pad_token_id or 0)
    records = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    dataset, _ = build_datasets(eval_cfg, tokenizer)
    if len(dataset) < len(records):
        print(f"{len(records) - len(dataset)} of {len(records)} answers start past max_length: not measured")
    groups = {"all": list(range(len(dataset)))}
    if args.categories:
        prompts = [json.loads(x) for x in Path(args.categories).read_text().splitlines() if x.strip()]
        groups.update(category_rows(list(dataset["source"]), records, {str(p["id"]): p["category"] for p in prompts}))

    # what a cached measurement must have been made with: the same answers, groups and depths
    setting = {
        "data_sha256": hashlib.sha256(Path(args.data).read_bytes()).hexdigest(),
        "groups": {name: len(rows) for name, rows in groups.items()},
        "depths": args.depths,
    }

    def measure(head, row: dict) -> dict:
        for name, indices in groups.items():
            loader = DataLoader(dataset.select(indices), batch_size=4, collate_fn=merge)
            row[name] = teacher_forced_acceptance(head, target, loader, args.depths)
        print(json.dumps(row), flush=True)
        return row

    rows = []
    if cfg.head.init_from:  # a warm start: the head it started from is the curve's first point
        from specheads.heads import load_head

        rows.append(measure(load_head(cfg.head.init_from, target), {"step": 0, "target_tokens": 0, "loss_tokens": 0}))
    for checkpoint in checkpoints:
        step = read_step(checkpoint)
        seen, trained = steps[step - 1]
        folder = run / "curve" / f"step-{step}"
        measured = folder / f"acceptance-{Path(args.data).stem}.json"  # a checkpoint is measured once per setting
        if (cached := cached_row(measured, setting)) is not None:  # with the token counts of this replay
            rows.append(cached | {"target_tokens": seen, "loss_tokens": trained})
            continue
        head = checkpoint_head(cfg, target, checkpoint, folder)
        rows.append(measure(head, {"step": step, "target_tokens": seen, "loss_tokens": trained}))
        measured.write_text(json.dumps(rows[-1] | {"measured_with": setting}))
    rows = offset_tokens(rows, args.base_tokens)
    compare = (args.compare[0], json.loads(Path(args.compare[1]).read_text())) if args.compare else None
    write_outputs(rows, list(groups), args.depths, Path(args.out), (args.label or run.name, compare))


def write_outputs(
    rows: list[dict], groups: list[str], depths: int, out: Path, labels: tuple[str, tuple | None] = ("", None)
) -> None:
    """curve.json, curve.md and curve.png; ``labels`` is this run's name and an optional (name, rows) drawn dashed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.json").write_text(json.dumps(rows, indent=1))
    head = "| step | training tokens (loss) | " + " | ".join(f"depth {d}" for d in range(1, depths + 1)) + " | tau |"
    lines = [head, "|---" * (depths + 3) + "|"]
    for row in rows:
        cells = [f"{row['all'][f'depth{d}']:.3f}" for d in range(1, depths + 1)]
        lines.append(
            f"| {row['step']} | {row['loss_tokens']:,} | " + " | ".join(cells) + f" | {row['all']['tau']:.2f} |"
        )
    if len(groups) > 1 and rows:
        last = rows[-1]
        lines += ["", f"Depth-1 acceptance per category at step {last['step']}:", ""]
        lines += ["| " + " | ".join(groups) + " |", "|---" * len(groups) + "|"]
        lines.append("| " + " | ".join(f"{last[g]['depth1']:.3f}" for g in groups) + " |")
    (out / "curve.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    name, compare = labels
    for d in range(1, depths + 1):
        line = ax.plot(
            [r["loss_tokens"] for r in rows],
            [r["all"][f"depth{d}"] for r in rows],
            marker="o",
            label=f"{name} depth {d}" if compare else f"depth {d}",
        )
        if compare:
            other, other_rows = compare
            ax.plot(
                [r["loss_tokens"] for r in other_rows],
                [r["all"][f"depth{d}"] for r in other_rows],
                marker="s",
                linestyle="--",
                color=line[0].get_color(),
                alpha=0.6,
                label=f"{other} depth {d}",
            )
    from matplotlib.ticker import EngFormatter, NullFormatter

    tokens = [r["loss_tokens"] for r in rows + (compare[1] if compare else [])]
    if tokens and max(tokens) > 10 * max(min(tokens), 1):  # a log axis only where the points span a decade
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 1.5M, not 1.5 x 10^6
    ax.set_xlabel("training tokens (assistant tokens with a loss)")
    ax.set_ylabel("acceptance (teacher-forced, target's greedy answers)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1))  # beside the plot, never over a line
    fig.savefig(out / "curve.png", dpi=120, bbox_inches="tight")
    print((out / "curve.md").read_text())


if __name__ == "__main__":
    main()
