"""Run every method on every prompt, interleaved per prompt in one process, so machine noise hits all alike.

The first method is the baseline (plain ``generate``): speedups are relative to it and, at T=0, every lossless
method's output must equal it token for token.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from specheads.bench.methods import Method, MethodRun
from specheads.bench.questions import Question


@dataclass
class Record:
    """One method on one prompt."""

    question: Question
    method: str
    run: MethodRun
    identical: bool | None  # same tokens as the baseline (None for the baseline itself)
    peak_mem_mb: float


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory since the last reset on GPU; the process's peak RSS on CPU (never reset)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def run_benchmark(
    methods: list[Method],
    prompts: list[tuple[Question, torch.Tensor]],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    warmup_tokens: int = 8,
    progress: bool = True,
) -> list[Record]:
    """``prompts``: (question, input_ids (1, T)) pairs. A short warm-up run per method precedes the timed runs."""
    if not methods or not prompts:
        raise ValueError(f"need at least one method and one prompt, got {len(methods)} and {len(prompts)}")
    device = prompts[0][1].device
    if warmup_tokens:
        for method in tqdm(methods, desc="warm-up", disable=not progress, leave=False):
            method.run(prompts[0][1], warmup_tokens, temperature, seed)
    records = []
    bar = tqdm(total=len(prompts) * len(methods), desc="benchmark", unit="run", disable=not progress)
    for question, input_ids in prompts:
        baseline: MethodRun | None = None
        for method in methods:
            bar.set_postfix_str(f"{question.category} #{question.question_id} {method.name}")
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            run = method.run(input_ids, max_new_tokens, temperature, seed)
            identical = None if baseline is None else run.token_ids == baseline.token_ids
            baseline = baseline or run
            records.append(Record(question, method.name, run, identical, peak_memory_mb(device)))
            bar.update(1)
    bar.close()
    return records
