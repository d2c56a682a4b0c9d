"""``specheads generate``: stream a speculative (or plain) generation to the terminal, then print its stats.

    specheads generate --target smollm2-135m-instruct --head DIR --prompt "..." [--tree small10|FILE|chain|dynamic]

Tree settings: a tree file or the name of one under ``configs/trees/`` (Medusa, static); ``chain`` or ``chain:D``
(every head type: one path of D tokens); ``dynamic`` or ``dynamic:D,K,N`` (EAGLE-2 dynamic tree of depth D, top-K
expansion, N nodes kept). No ``--head`` = plain decoding; ``--prompt-lookup`` = the training-free n-gram drafter;
``--lookup-branch N`` adds up to N prompt-lookup tokens to the head's tree (``specheads.decoding.lookup_branch``);
``--lookup-solo M`` with it proposes the lookup chain alone on steps whose match is at least M tokens.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import HfArgumentParser

from specheads.decoding.draft import PromptLookupDrafter
from specheads.decoding.factory import build_drafter
from specheads.decoding.generator import ACCEPTANCE_RULES, SpeculativeGenerator
from specheads.decoding.lookup_branch import LookupBranchDrafter


@dataclass
class GenerateArgs:
    """Options of ``specheads generate`` (dashes or underscores both work: ``--max-new-tokens``)."""

    prompt: str = field(metadata={"help": "user message (chat-templated when the tokenizer has a template)"})
    target: str = field(default="smollm2-135m-instruct", metadata={"help": "target name, model dir or .gguf"})
    head: str | None = field(default=None, metadata={"help": "saved head folder (none = plain decoding)"})
    prompt_lookup: bool = field(default=False, metadata={"help": "draft with n-gram prompt lookup (no head)"})
    tree: str | None = field(default=None, metadata={"help": "tree file/name, chain[:D] or dynamic[:D,K,N]"})
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    acceptance: str = field(default="speculative", metadata={"help": f"one of {ACCEPTANCE_RULES}; typical is LOSSY"})
    seed: int | None = None
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
    lookup_solo: int | None = field(
        default=None,
        metadata={
            "help": "with --lookup-branch: on steps whose lookup match is at least N tokens (2 or 3), propose the "
            "lookup chain alone and let the head sit out"
        },
    )


def generate_main(argv: list[str] | None = None) -> int:
    parser = HfArgumentParser(GenerateArgs, prog="specheads generate")
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    if args.head and args.prompt_lookup:
        parser.error("--head and --prompt-lookup are exclusive: pick one drafter")
    if args.lookup_branch < 0 or (args.lookup_branch and not args.head):
        parser.error(
            f"--lookup-branch takes a token count >= 1 and needs --head (got {args.lookup_branch}, "
            f"head {args.head}); for prompt lookup alone use --prompt-lookup"
        )
    if args.lookup_solo is not None and not args.lookup_branch:
        parser.error(f"--lookup-solo {args.lookup_solo} needs --lookup-branch N: it is a variant of the branch")
    from specheads.target import load_target

    target, tokenizer = load_target(args.target)
    drafter = None
    if args.prompt_lookup:
        drafter = PromptLookupDrafter()
    elif args.head:
        from specheads.heads import load_head, load_lora_adapter

        target = load_lora_adapter(target, args.head)  # Medusa-2: the adapted target is the one being decoded
        drafter = build_drafter(load_head(args.head, target), args.tree)
        if args.lookup_branch:
            try:
                drafter = LookupBranchDrafter(drafter, num_tokens=args.lookup_branch, solo_ngram=args.lookup_solo)
            except ValueError as error:
                parser.error(f"--lookup-solo: {error}")
    generator = SpeculativeGenerator(target, tokenizer, drafter, acceptance=args.acceptance, backoff=args.backoff)
    prompt: Any = args.prompt
    if args.raw:
        prompt = tokenizer(args.prompt, return_tensors="pt").input_ids
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
    print()
    print(f"[{describe(drafter, args)}] {result.stats.summary()}", file=sys.stderr)
    return 0


def describe(drafter: Any, args: GenerateArgs) -> str:
    if drafter is None:
        return "plain decoding"
    branch = f" + lookup branch of {args.lookup_branch}" if args.lookup_branch else ""
    if args.lookup_solo is not None:
        branch += f", alone on {args.lookup_solo}-gram matches"
    return f"{type(drafter).__name__}, tree {args.tree or 'default'}{branch}, {'T=' + str(args.temperature)}"


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    raise SystemExit(generate_main())
