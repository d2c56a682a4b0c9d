"""Lossless decoding past a sliding window, on real weights: SmolLM2-135M-Instruct's weights loaded into a Mistral
with a short window (Mistral's layers are Llama's plus the window), decoded by specheads with a trained head and by
the same model's own ``generate`` on Spec-Bench prompts many windows long. Prints whether each output is identical,
and the keys the sliding layers hold at the end (bounded by the window, however long the request).

    python scripts/check_sliding_window.py --head runs/eagle3-smollm2-135m-cont --window 64 --tree dynamic:4,4,16
"""

from __future__ import annotations

import argparse

import torch
from transformers import MistralConfig, MistralForCausalLM

from specheads.bench.calibration import render_prompt
from specheads.bench.questions import load_questions, select_per_category
from specheads.decoding import SpeculativeGenerator, build_drafter
from specheads.heads import load_head
from specheads.shipped_data import find_default_questions
from specheads.target import load_target


def windowed_copy(target: torch.nn.Module, window: int) -> MistralForCausalLM:
    """``target`` (a Llama) as a Mistral whose every layer sees only the last ``window`` positions."""
    fields = MistralConfig().to_dict()
    config = MistralConfig(**{k: v for k, v in target.config.to_dict().items() if k in fields})
    config.sliding_window, config.head_dim = window, target.config.hidden_size // target.config.num_attention_heads
    model = MistralForCausalLM(config).eval().requires_grad_(False)
    model.load_state_dict(target.state_dict(), strict=True)
    model.config._attn_implementation = "sdpa"
    model.generation_config, model.config.name_or_path = target.generation_config, target.config.name_or_path
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", required=True, help="a head trained for SmolLM2-135M-Instruct")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--tree", default="dynamic:4,4,16")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--questions", default=None, help="Spec-Bench question.jsonl (default: data/spec_bench/)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    llama, tokenizer = load_target("smollm2-135m-instruct")
    model = windowed_copy(llama, args.window)
    generator = SpeculativeGenerator(model, tokenizer, build_drafter(load_head(args.head, model), args.tree))
    kept: list[int] = []

    def record(module, args, kwargs):  # keys held by the sliding layers before each forward on a cache
        if kwargs.get("cache") is not None:
            kept.extend(layer.keys.shape[-2] for layer in kwargs["cache"].layers if layer.is_initialized)

    model.register_forward_pre_hook(record, with_kwargs=True)
    questions = select_per_category(load_questions(args.questions or find_default_questions()), args.per_category)
    identical = 0
    for question in questions:
        prompt = render_prompt(tokenizer, question.prompt, model.device).view(1, -1)
        reference = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.max_new_tokens)
        expected = reference[0, prompt.shape[1] :].tolist()
        kept.clear()
        result = generator.generate(prompt[0], max_new_tokens=args.max_new_tokens)
        same = result.token_ids == expected
        identical += same
        length = prompt.shape[1] + len(expected)
        print(
            f"{question.category:15s} prompt {prompt.shape[1]:4d} + {len(expected)} new = "
            f"{length / args.window:4.1f} windows; identical {same}; tau {result.stats.tau:.2f}; "
            f"sliding layers held at most {max(kept, default=0)} keys"
        )
    print(f"identical to generate: {identical}/{len(questions)} (window {args.window}, tree {args.tree})")


if __name__ == "__main__":
    main()
