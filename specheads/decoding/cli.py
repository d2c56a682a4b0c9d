"""``specheads generate``: stream a speculative (or plain) generation to the terminal, then print its stats.

    specheads generate --target smollm2-135m-instruct --head DIR --prompt "..." [--tree auto|small10|FILE|chain|dynamic]

Tree settings: ``auto`` (every head type: the tree the cost model expects to be fastest on this device for this
head, calibrated once on built-in prompts and cached, ``tuning.auto_tree.auto_tree_drafter``); a tree file or the
name of one shipped in ``specheads/decoding/trees/`` (Medusa, static); ``chain`` or ``chain:D`` (every head type:
one path of D tokens); ``dynamic`` or ``dynamic:D,K,N`` (EAGLE-2 dynamic tree of depth D, top-K expansion, N nodes
kept).
No ``--head`` = plain decoding; ``--prompt-lookup`` = the training-free n-gram drafter;
``--lookup-branch N`` adds up to N prompt-lookup tokens to the head's tree (``specheads.decoding.lookup_branch``);
``--lookup-solo M`` with it proposes the lookup chain alone on steps whose match is at least M tokens (``auto``, with
``--tree auto``: the length the cost model prices best, cached with the tree).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import HfArgumentParser, PreTrainedModel, PreTrainedTokenizerBase

from specheads.arg_types import non_negative_float, non_negative_int, positive_int, probability
from specheads.decoding.eagle_draft import DrafterWindow, with_drafter_window
from specheads.decoding.generator import ACCEPTANCE_RULES, Kernels, SpeculativeGenerator
from specheads.decoding.head_drafter import check_head_tree
from specheads.decoding.prompt_lookup_drafter import PromptLookupDrafter
from specheads.decoding.tuning.auto_tree import (
    DrafterSpec,
    auto_tree_drafter,
    fixed_drafter,
    parse_solo_length,
    with_lookup_branch,
)
from specheads.decoding.tuning.backoff import DraftBackoff
from specheads.decoding.tuning.cpu_kernels import CpuKernels
from specheads.heads.base import CONFIG_NAME
from specheads.heads.config import HeadConfigError, HeadLoadError
from specheads.heads.hub import HubError
from specheads.heads.load import refuse_checkpoint_as_head, required_adapter, resolve_head_folder

DTYPES = ("auto", "float32", "bfloat16", "float16")
NUMBER_CHECKS = {  # bench's argparse types: a number out of range is a usage error before anything loads
    "max_new_tokens": positive_int,
    "temperature": non_negative_float,
    "top_k": non_negative_int,  # 0 = off, as Sampling takes it
    "top_p": probability,
    "drafter_window": non_negative_int,  # 0 = every row
    "drafter_sinks": non_negative_int,
}


@dataclass
class GenerateArgs:
    """Options of ``specheads generate`` (dashes or underscores both work: ``--max-new-tokens``)."""

    prompt: str = field(metadata={"help": "user message (chat-templated when the tokenizer has a template)"})
    target: str = field(default="smollm2-135m-instruct", metadata={"help": "target name, model dir or .gguf"})
    device: str = field(default="auto", metadata={"help": "auto (cuda if available, else cpu) | cpu | cuda | cuda:1"})
    dtype: str = field(
        default="auto",
        metadata={
            "help": "auto (bfloat16 on a GPU, float32 on a CPU) | float32 | bfloat16 | float16; greedy output is "
            "token-identical to generate's in float32, up to near-ties in 16-bit (README)"
        },
    )
    head: str | None = field(default=None, metadata={"help": "saved head folder (none = plain decoding)"})
    prompt_lookup: bool = field(default=False, metadata={"help": "draft with n-gram prompt lookup (no head)"})
    tree: str | None = field(
        default=None,
        metadata={
            "help": "auto (sized for this device by the cost model; calibrated once, then cached), a tree file/name "
            "(Medusa), chain[:D] or dynamic[:D,K,N] (EAGLE); default: each head type's own (EAGLE: dynamic, sized "
            "for a GPU)"
        },
    )
    recalibrate: bool = field(default=False, metadata={"help": "with --tree auto: calibrate again, ignore the cache"})
    max_new_tokens: int = field(default=256, metadata={"help": "new tokens at most"})
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy; above 0 samples the target's distribution"})
    top_k: int | None = field(
        default=None, metadata={"help": "with --temperature: sample from the K likeliest tokens (0 = off)"}
    )
    top_p: float | None = field(
        default=None, metadata={"help": "with --temperature: sample from the smallest set holding probability P"}
    )
    acceptance: str = field(
        default="speculative", metadata={"help": "typical is LOSSY", "choices": list(ACCEPTANCE_RULES)}
    )
    seed: int | None = field(default=None, metadata={"help": "random seed for sampling, for a repeatable run"})
    stop: list[str] = field(default_factory=list, metadata={"help": "stop strings"})
    raw: bool = field(default=False, metadata={"help": "feed the prompt without the chat template"})
    backoff: bool = field(default=False, metadata={"help": "stop drafting while it does not pay (lossless)"})
    lookup_branch: int = field(
        default=0,
        metadata={
            "help": "with --head: also graft up to N prompt-lookup tokens onto its tree (0 = off; pays at T=0 on text "
            "that repeats the prompt, not under sampling: docs/results.md)"
        },
    )
    lookup_solo: str | None = field(
        default=None,
        metadata={
            "help": "with --lookup-branch: on steps whose lookup match is at least N tokens (2 or 3), propose the "
            "lookup chain alone and let the head sit out; auto (with --tree auto): N, or never, as the cost model "
            "prices it on the calibration run (cached with the tree)"
        },
    )
    drafter_window: int = field(
        default=0,
        metadata={
            "help": "EAGLE heads: keep only the first --drafter-sinks and the last N rows in the drafter's own cache, "
            "so its memory and time per step stay flat on long contexts (0 = every row; lossless either way: the "
            "target verifies with its full cache)"
        },
    )
    drafter_sinks: int = field(default=4, metadata={"help": "with --drafter-window: first rows always kept"})


def build_parser() -> HfArgumentParser:
    return HfArgumentParser(GenerateArgs, prog="specheads generate", allow_abbrev=False)


def generate_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if unknown:  # HfArgumentParser raises a ValueError for these; argparse's own usage error reads better
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    for name, check in NUMBER_CHECKS.items():  # HfArgumentParser types a field by its annotation alone
        value = getattr(args, name)
        try:
            if value is not None:
                check(str(value))
        except argparse.ArgumentTypeError as error:
            parser.error(f"argument --{name.replace('_', '-')}: {error}")
    if args.head and args.prompt_lookup:
        parser.error("--head and --prompt-lookup are exclusive: pick one drafter")
    if args.lookup_branch < 0 or (args.lookup_branch and not args.head):
        parser.error(
            f"--lookup-branch takes a token count >= 1 and needs --head (got {args.lookup_branch}, "
            f"head {args.head}); for prompt lookup alone use --prompt-lookup"
        )
    if args.lookup_solo is not None and not args.lookup_branch:
        parser.error(f"--lookup-solo {args.lookup_solo} needs --lookup-branch N: it is a variant of the branch")
    if args.lookup_solo is not None:
        try:
            args.lookup_solo = parse_solo_length(args.lookup_solo)
        except ValueError as error:
            parser.error(f"--lookup-solo: {error}")
        if args.lookup_solo == "auto" and args.tree != "auto":
            parser.error(
                f"--lookup-solo auto is priced on the auto tree's calibration: it needs --tree auto, got --tree "
                f"{args.tree or '(default)'}; or give the length (2 or 3)"
            )
    if args.drafter_window and not args.head:
        parser.error(f"--drafter-window {args.drafter_window} bounds an EAGLE head's cache: it needs --head")
    head_only = [f"--tree {args.tree}"] if args.tree is not None else []
    head_only += ["--recalibrate"] if args.recalibrate else []
    if head_only and not args.head:  # name only the options given
        plural = len(head_only) > 1
        what = f"{' and '.join(head_only)} need{'' if plural else 's'} --head DIR"
        parser.error(f"{what}: {'they set' if plural else 'it sets'} how a head drafts")
    if args.acceptance == "greedy" and args.temperature > 0:
        parser.error(
            f"--acceptance greedy keeps the target's argmax: it needs --temperature 0 (got {args.temperature}); "
            "to sample, use --acceptance speculative (lossless)"
        )
    if args.recalibrate and args.tree != "auto":
        parser.error(
            f"--recalibrate re-measures the auto tree: it needs --tree auto, got --tree {args.tree or '(default)'}"
        )
    if args.dtype not in DTYPES:
        parser.error(f"--dtype: expected one of {DTYPES}, got {args.dtype!r}")
    from specheads.target import TargetLoadError

    try:
        return _generate(args, parser)
    except (HeadLoadError, HeadConfigError, HubError, TargetLoadError, FileNotFoundError) as error:
        _stderr(f"specheads generate: error: {error}")  # what to fix, without a traceback
        return 2


def resolve_head_argument(head: str, option: str = "--head") -> Path:
    """``--head``: the local folder of a saved head (a Hub id is fetched once), checked before the target loads, so
    that a wrong folder fails at once rather than after it. A training checkpoint is the usual mix-up: the message
    says which folder to pass instead."""
    refuse_checkpoint_as_head(head, option)
    folder = resolve_head_folder(head)
    if not (folder / CONFIG_NAME).is_file():
        raise HeadLoadError(
            f"{option} {head}: {folder} has no {CONFIG_NAME}; expected a folder written by head.save_pretrained() (a "
            "training run's output folder, once it finished)"
        )
    required_adapter(folder)  # a Medusa-2 head without its lora/ folder fails before the target loads
    return folder


def _generate(args: GenerateArgs, parser: HfArgumentParser) -> int:
    from specheads.target import load_target, resolve_device_dtype

    try:
        device, dtype = resolve_device_dtype(args.device, args.dtype)
    except ValueError as error:
        parser.error(f"--device {error}")
    head_dir = resolve_head_argument(args.head) if args.head else None  # before the target: a wrong one fails fast
    if head_dir is not None and args.tree is not None:
        try:
            check_head_tree(head_dir, args.tree)
        except ValueError as error:
            parser.error(f"--tree: {error}")
    target, tokenizer = load_target(args.target, dtype=dtype, device=device)
    kernels = CpuKernels()  # the CPU kernels measured faster here, for calibration and decoding alike
    spec, adapted = DrafterSpec(None, ""), False
    if args.prompt_lookup:
        spec = DrafterSpec(PromptLookupDrafter(), "default")
    elif head_dir is not None:
        target, spec, adapted = _head_drafter(args, parser, head_dir, target, tokenizer, kernels)
    if args.drafter_window and spec.auto is not None and not spec.auto.num_nodes:  # no head drafts: bench notes it too
        _stderr(
            f"note: --drafter-window {args.drafter_window} is not applied: the auto tree for {args.head} is plain "
            "decoding, with no EAGLE drafter to bound"
        )
    elif args.drafter_window and spec.drafter is not None:
        try:
            spec.drafter = with_drafter_window(spec.drafter, DrafterWindow(args.drafter_sinks, args.drafter_window))
        except ValueError as error:
            parser.error(f"--drafter-window: {error}")
        spec.tree += f"; drafter cache: {args.drafter_sinks} sink + {args.drafter_window} recent rows"
    drafter = spec.drafter
    backoff = DraftBackoff() if args.backoff else None
    prompt: Any = args.prompt
    if args.raw:
        prompt = tokenizer(args.prompt, return_tensors="pt").input_ids
    try:  # a target the verifier cannot check exactly, or a request it cannot take (context length): say why
        generator = SpeculativeGenerator(target, tokenizer, drafter, args.acceptance, kernels=kernels, backoff=backoff)
        result = generator.generate(
            prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            stop=args.stop,
            seed=args.seed,
            stream=lambda piece: print(piece, end="", flush=True),
        )
    except ValueError as error:
        _stderr(f"specheads generate: error: {error}")
        return 2
    print()
    where = f"{target.device} {str(next(target.parameters()).dtype).removeprefix('torch.')}"
    if adapted:
        where += ", target + LoRA adapter"
    print(f"[{describe(spec, args)}; {where}] {result.stats.summary()}", file=sys.stderr)
    return 0


def _head_drafter(
    args: GenerateArgs,
    parser: HfArgumentParser,
    head_dir: Path,
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    kernels: Kernels,
) -> tuple[PreTrainedModel, DrafterSpec, bool]:
    """The target to decode (Medusa-2: with its LoRA adapter applied), the head's drafter for ``--tree``, and whether
    an adapter was applied."""
    from specheads.heads import apply_lora_adapter, load_head
    from specheads.target import cache_root

    target, adapted = apply_lora_adapter(target, head_dir)  # Medusa-2: the adapted target is the one being decoded
    if adapted:
        _stderr(
            f"note: {args.head} is a Medusa-2 head, trained with a LoRA adapter on the target: decoding runs "
            f"{args.target} with that adapter applied, so the output is exactly the adapted model's (distilled "
            f"to stay close to {args.target}'s own, not equal to it)"
        )
    head = load_head(head_dir, target, adapter_applied=adapted)
    if args.tree == "auto":
        spec = auto_tree_drafter(
            head,
            head_dir,
            target,
            tokenizer,
            cache_root(),
            args.recalibrate,
            log=_stderr,
            lookup_branch=args.lookup_branch,
            lookup_solo=args.lookup_solo,
            kernels=kernels,
        )
        return target, spec, adapted
    return target, _fixed_tree(args, parser, head, target.device), adapted


def _fixed_tree(args: GenerateArgs, parser: HfArgumentParser, head: Any, device: torch.device) -> DrafterSpec:
    """The head's drafter on ``--tree`` (or its default tree), with ``--lookup-branch`` grafted on."""
    try:
        with warnings.catch_warnings():  # the note below says it in the CLI's words
            warnings.filterwarnings("ignore", message="the default EAGLE tree")
            spec = fixed_drafter(head, args.tree)
    except ValueError as error:  # a default tree that does not fit is the head's problem, not --tree's
        parser.error(f"--tree: {error}" if args.tree else f"--head {args.head}: {error}")
    if args.tree is None and head.head_type == "eagle" and device.type == "cpu":
        _stderr(
            "note: the default EAGLE tree (60 nodes) is sized for a GPU; on a CPU, verifying it costs ~3x a "
            "plain step here, so it may be slower than plain decoding. --tree auto sizes it for this machine"
        )
    if args.lookup_branch:
        try:
            spec = with_lookup_branch(spec, args.lookup_branch, args.lookup_solo)
        except ValueError as error:
            parser.error(f"--lookup-solo: {error}")
    return spec


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)  # stdout carries only the generated text


def describe(spec: DrafterSpec, args: GenerateArgs) -> str:
    """What decoded, for the stats line: the drafter, its tree (``auto``: the one chosen) and the temperature."""
    if spec.drafter is None and not spec.tree:
        return "plain decoding"
    name = type(spec.drafter).__name__ if spec.drafter is not None else "no drafter (plain decoding)"
    return f"{name}, tree {spec.tree}, T={args.temperature}"


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    raise SystemExit(generate_main())
