"""Run every method on every prompt, interleaved per prompt in one process, so machine noise hits all alike.

The first method is the baseline (plain ``generate``): speedups are relative to it and, at T=0, every lossless
method's output must equal it token for token.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

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
    peak_mem_mb: float | None  # GPU only (``peak_memory_mb``)
    near_tie: float | None = None  # 16-bit T=0 mismatch: the baseline's logit gap where they part (``mark_near_ties``)
    repeat_seconds: list[float] = field(default_factory=list)  # every repeat's time; ``run`` is the median one
    repeat_tokens: list[int] = field(default_factory=list)  # every repeat's new tokens (at T>0 they may differ)
    parted: tuple[list[int], list[list[int]]] | None = None  # a mismatch: (the baseline's tokens, each output of the
    # repeats that differ from them)


def peak_memory_mb(device: torch.device) -> float | None:
    """Peak accelerator memory since the last reset on GPU; None on CPU, where no per-method figure is honest: the
    allocator keeps what a method freed, so a process's RSS only ever rises (``process_peak_rss_mb`` reports it)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return None


def process_peak_rss_mb() -> float | None:
    """This process's peak resident memory so far (never reset); None on Windows, which lacks ``resource``."""
    try:
        import resource  # Unix only: imported here so that the benchmark also runs elsewhere
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


class BenchmarkInterrupted(KeyboardInterrupt):
    """Ctrl-C during the timed runs, carrying the records of every prompt that all methods finished (the prompt in
    progress is dropped: a prompt some methods skipped would skew the comparison), so they can still be reported."""

    def __init__(self, records: list[Record], prompts_done: int, prompts: int) -> None:
        super().__init__(f"interrupted after {prompts_done} of {prompts} prompts")
        self.records, self.prompts_done, self.prompts = records, prompts_done, prompts


def run_benchmark(
    methods: list[Method],
    prompts: list[tuple[Question, torch.Tensor]],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    warmup_tokens: int = 8,
    progress: bool = True,
    repeats: int = 1,
) -> list[Record]:
    """``prompts``: (question, input_ids (1, T)) pairs. A short warm-up run per method precedes the timed runs.

    With ``repeats`` > 1 every (prompt, method) runs that many times, the methods interleaved within each repeat, and
    its record keeps the run of median time: one slow run on a shared machine then moves nothing. The same seed is
    used each time, so at T=0 repeats should produce the same tokens: each is compared with the baseline's first run
    and one that differs makes the method's record a mismatch; at T>0 a method whose drafting depends on
    measured time (draft backoff) spends the random stream differently each run, so its repeats may differ (each
    still follows the target's distribution) and the run of median time per token is kept. Ctrl-C raises
    ``BenchmarkInterrupted`` with the records of the prompts finished so far (a plain KeyboardInterrupt before any)."""
    if not methods or not prompts:
        raise ValueError(f"need at least one method and one prompt, got {len(methods)} and {len(prompts)}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if warmup_tokens:
        for method in tqdm(methods, desc="warm-up", disable=not progress, leave=False):
            method.run(prompts[0][1], warmup_tokens, temperature, seed)
    records: list[Record] = []
    bar = tqdm(total=len(prompts) * len(methods) * repeats, desc="benchmark", unit="run", disable=not progress)
    try:
        for question, input_ids in prompts:
            records += _run_prompt(methods, question, input_ids, max_new_tokens, temperature, seed, repeats, bar)
    except KeyboardInterrupt:
        done = len(records) // len(methods)
        if not done:
            raise
        raise BenchmarkInterrupted(records, done, len(prompts)) from None
    finally:
        bar.close()
    return records


def _run_prompt(
    methods: list[Method],
    question: Question,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    repeats: int,
    bar: tqdm,
) -> list[Record]:
    """Every method on one prompt, ``repeats`` times interleaved: one record per method (the median run)."""
    device = input_ids.device
    runs: dict[str, list[MethodRun]] = {method.name: [] for method in methods}
    peaks: dict[str, float | None] = {}
    for _ in range(repeats):
        for method in methods:
            bar.set_postfix_str(f"{question.category} #{question.question_id} {method.name}")
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            runs[method.name].append(method.run(input_ids, max_new_tokens, temperature, seed))
            peak = peak_memory_mb(device)
            if peak is not None:  # the largest over the repeats
                peaks[method.name] = max(peak, peaks.get(method.name) or 0.0)
            bar.update(1)
    sampled = temperature > 0
    baseline = _median_run(runs[methods[0].name])
    # at T=0 every repeat must give the baseline's tokens: one that does not is a mismatch in the report
    reference = runs[methods[0].name][0].token_ids if not sampled else baseline.token_ids
    if not sampled and any(r.token_ids != reference for r in runs[methods[0].name]):
        print(
            f"warning: {methods[0].name} gave different tokens on repeats of question {question.question_id} at T=0 "
            "(a nondeterministic kernel?); the other methods are compared with its first run",
            file=sys.stderr,
        )
    records = []
    for method in methods:
        run = _median_run(runs[method.name])
        repeats_compared = runs[method.name] if not sampled else [run]
        differing = [r.token_ids for r in repeats_compared if r.token_ids != reference]
        differing = [ids for i, ids in enumerate(differing) if ids not in differing[:i]]
        identical = None if method is methods[0] else not differing
        parted = (reference, differing) if identical is False else None
        seconds, tokens = [r.seconds for r in runs[method.name]], [r.new_tokens for r in runs[method.name]]
        records.append(
            Record(question, method.name, run, identical, peaks.get(method.name), None, seconds, tokens, parted)
        )
    return records


def _median_run(runs: list[MethodRun]) -> MethodRun:
    """The run of median time per token (the lower middle one for an even count)."""
    return sorted(runs, key=lambda r: r.seconds / max(r.new_tokens, 1))[(len(runs) - 1) // 2]


NEAR_TIE_ULPS = 4
"""A 16-bit T=0 mismatch counts as a near-tie when, at the first token where the outputs part, the target's own
forward (over the whole prefix) rates the baseline's and the method's tokens within this many units in the last
place of its largest logit, either way. A verify forward over several tokens rounds differently from generate's
one-token steps (another kernel, another summation order), which in bf16 is worth a few ulps: enough to flip an
exact or near tie. Measured on SmolLM2 in bf16 on a CPU: gaps of 0 to 2 ulps (0.25 at logits near 17); twice that is
allowed, and no more: at SmolLM2's scale 8 ulps are a whole logit, where a wrong runner-up would pass."""


@torch.inference_mode()
def mark_near_ties(
    records: list[Record], target: torch.nn.Module, prompts: list[tuple[Question, torch.Tensor]]
) -> None:
    """For a 16-bit target at T=0: set ``near_tie`` (the logit gap) on every record whose output parts from the
    baseline's where the baseline's own forward had a near-tie (``NEAR_TIE_ULPS``), every differing repeat alike (the
    largest gap is kept). fp32 mismatches are never ties."""
    dtype = next(target.parameters()).dtype
    if dtype not in (torch.bfloat16, torch.float16):
        return
    mantissa = 7 if dtype == torch.bfloat16 else 10
    prompt_of = {question.question_id: ids for question, ids in prompts}
    for record in records:
        if record.identical is not False or record.parted is None:
            continue
        expected, outputs = record.parted  # the repeats that differed, against the baseline run they were compared with
        prompt = prompt_of[record.question.question_id][0]
        gaps = [_tie_gap(target, prompt, expected, got, mantissa) for got in outputs]
        if all(gap is not None for gap in gaps):
            record.near_tie = max(gaps, key=abs)


def _tie_gap(
    target: torch.nn.Module, prompt: torch.Tensor, expected: list[int], got: list[int], mantissa: int
) -> float | None:
    """The baseline's logit gap where ``got`` parts from ``expected``, when within ``NEAR_TIE_ULPS``; else None (a
    length difference, one output a prefix of the other, is not a token choice: None too)."""
    where = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), None)
    if where is None:
        return None
    ids = torch.cat([prompt, torch.tensor(expected[:where], dtype=prompt.dtype, device=prompt.device)])
    logits = target(input_ids=ids[None]).logits[0, -1].float()
    gap = (logits[expected[where]] - logits[got[where]]).item()
    ulp = 2.0 ** (math.floor(math.log2(max(logits.abs().max().item(), 1e-6))) - mantissa)
    return gap if abs(gap) <= NEAR_TIE_ULPS * ulp else None  # this forward may even prefer the method's token
