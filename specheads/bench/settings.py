"""What ``specheads bench`` measures and how: one dataclass that the command line, ``make demo`` and the auto-tree
calibration read, in a module of its own so that none of them imports the command-line module."""

from __future__ import annotations

from dataclasses import dataclass, field

BUILTIN_METHODS = ("hf-prompt-lookup", "hf-assisted", "specheads-lookup", "specheads-plain")
"""Comparison methods besides the baseline (plain ``generate``, always run first) and the given heads.
``specheads-plain`` is specheads' loop with no drafter (every tree is the root alone): the gap between it and
``generate`` is loop overhead, not drafting, so a head's speedup over it is what its drafts alone buy."""


@dataclass
class BenchSettings:
    target: str = "smollm2-135m-instruct"
    questions: str | None = None  # None: the repository's data/spec_bench/question.jsonl
    per_category: int = 3
    repeats: int = 1  # runs of each (prompt, method), interleaved; the median time is reported
    categories: list[str] = field(default_factory=list)  # empty: all
    max_new_tokens: int = 96
    temperature: float = 0.0
    seed: int = 0
    heads: list[str] = field(default_factory=list)
    trees: list[str] = field(default_factory=lambda: ["auto"])  # one for all heads, or one per head
    methods: list[str] = field(default_factory=lambda: list(BUILTIN_METHODS))
    assistant: str | None = None  # None: the target's first ``assistant_layers`` layers
    assistant_layers: int = 6
    prompt_lookup_tokens: int = 10
    device: str = "auto"
    dtype: str = "auto"
    out: str = "runs/bench"
    calibration_prompts: int = 6  # held-out questions for --tree auto: one per Spec-Bench category
    calibration_data: str | None = None  # chats for --tree auto when too few questions are held out (default: data/)
    recalibrate: bool = False  # no effect, kept for older command lines: every auto calibration times the target
    backoff: bool = False  # also run every head with draft backoff, as a second method NAME+backoff
    lookup_branch: int = 0  # > 0: also run every head with up to N prompt-lookup tokens on its tree, as NAME+lookup
    lookup_solo: int | str | None = None  # with lookup_branch: also NAME+lookup-solo, the chain alone on matches of
    # N tokens or more; "auto": N priced by the cost model on the auto tree's calibration
    drafter_window: int = 0  # > 0: also run every EAGLE head as NAME+window, its drafter cache cut to sinks + N rows
    drafter_sinks: int = 4
    progress: bool = True
