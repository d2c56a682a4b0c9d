"""Micro-benchmark: target tokens/s of online feature extraction vs reading the offline cache, and cache bytes/token.

Features are the EAGLE-3 layers plus the last post-norm state (HF indices 2, N//2, N-3, N) in fp16, with the
target's distribution as top-k probabilities or as full logits. Prints numbers; asserts nothing.

    python scripts/bench_features.py --samples 32 --max-length 256
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from specheads.target import load_target
from specheads.training.data import DataConfig, build_datasets, collate
from specheads.training.feature_cache import CachedFeatureDataset, collate_features
from specheads.training.features import cache_features, extract_features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--data", default="data/smollm2-135m-instruct-greedy-1k.jsonl")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--topk", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_target(args.target)
    cfg = DataConfig(paths=[args.data], max_length=args.max_length, max_samples=args.samples, eval_size=0)
    dataset, _ = build_datasets(cfg, tokenizer)
    layers = model.config.num_hidden_layers
    layer_ids = [2, layers // 2, layers - 3, layers]
    batches = [dataset[i : i + args.batch_size] for i in range(0, len(dataset), args.batch_size)]
    batches = [collate([dict(zip(b, row)) for row in zip(*b.values())], tokenizer.pad_token_id) for b in batches]
    num_tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    print(f"{len(dataset)} samples, {num_tokens} tokens, batch {args.batch_size}, {torch.get_num_threads()} threads")

    start = time.perf_counter()
    for batch in batches:
        extract_features(model, batch["input_ids"], batch["attention_mask"], layer_ids, False, args.topk, torch.float16)
    online = num_tokens / (time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        topk_bytes = cache_features(
            model, dataset, layer_ids, f"{tmp}/topk", torch.float16, args.topk, batch_size=args.batch_size
        )
        writing = num_tokens / (time.perf_counter() - start)
        cached = CachedFeatureDataset(f"{tmp}/topk", tokenizer.pad_token_id)
        start = time.perf_counter()
        for i in range(0, len(cached), args.batch_size):
            collate_features([cached[j] for j in range(i, min(i + args.batch_size, len(cached)))], cached.pad_token_id)
        reading = num_tokens / (time.perf_counter() - start)
        small = dataset.select(range(min(4, len(dataset))))
        logits_bytes = cache_features(model, small, layer_ids, f"{tmp}/logits", torch.float16, None)
        hidden_only = cache_features(model, small, layer_ids, f"{tmp}/hidden", torch.float16, None, with_logits=False)

    print(f"online extraction (target forward): {online:10.0f} tokens/s")
    print(f"offline cache write (forward + IO): {writing:10.0f} tokens/s")
    print(f"offline cache read + collate:       {reading:10.0f} tokens/s  ({reading / online:.0f}x online)")
    print(f"cache bytes/token, layers {layer_ids} fp16:")
    print(f"  hidden states only:      {hidden_only:10.0f}")
    print(f"  + top-{args.topk} probs:         {topk_bytes:10.0f}")
    print(f"  + full logits (V={model.config.vocab_size}): {logits_bytes:10.0f}")


if __name__ == "__main__":
    main()
