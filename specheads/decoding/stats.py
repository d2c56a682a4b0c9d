"""What one speculative request measured: tokens, target forwards (tau), acceptance per tree depth, time split."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class GenerationStats:
    new_tokens: int = 0
    target_forwards: int = 0
    plain_steps: int = 0  # steps verified without a draft because draft backoff judged drafting not to pay
    accepted_lengths: list[int] = field(default_factory=list)  # draft tokens accepted per verify step
    depth_attempts: list[int] = field(default_factory=list)  # steps whose tree reached depth d+1
    depth_accepts: list[int] = field(default_factory=list)  # ... and accepted a node at depth d+1
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0  # the prompt's forward, also counted in verify_s
    bookkeeping_s: float = 0.0  # accept, commit, stop checks, emitting text
    total_s: float = 0.0
    acceptance: str = "greedy"
    lossy: bool = False
    stop_reason: str = ""

    @property
    def tau(self) -> float:
        """Tokens committed per target forward, counting the bonus token (plain decoding: 1.0)."""
        return self.new_tokens / max(self.target_forwards, 1)

    @property
    def acceptance_rate_per_depth(self) -> list[float]:
        return [a / max(n, 1) for a, n in zip(self.depth_accepts, self.depth_attempts)]

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / max(self.total_s, 1e-9)

    def record_step(self, tree_depth: int, accepted: int) -> None:
        grow = tree_depth - len(self.depth_attempts)
        self.depth_attempts += [0] * max(grow, 0)
        self.depth_accepts += [0] * max(grow, 0)
        for d in range(tree_depth):
            self.depth_attempts[d] += 1
            self.depth_accepts[d] += int(accepted > d)
        self.accepted_lengths.append(accepted)

    def summary(self) -> str:
        rates = " ".join(f"{r:.2f}" for r in self.acceptance_rate_per_depth) or "-"
        return (
            f"tokens {self.new_tokens} | target forwards {self.target_forwards} | tau {self.tau:.2f} | "
            f"{self.tokens_per_s:.1f} tok/s | acceptance by depth [{rates}] | time draft {self.draft_s:.2f}s "
            f"verify {self.verify_s:.2f}s bookkeeping {self.bookkeeping_s:.2f}s | "
            f"{f'backoff: {self.plain_steps} plain steps | ' if self.plain_steps else ''}acceptance {self.acceptance}"
            f"{' (LOSSY)' if self.lossy else ''} | stop {self.stop_reason}"
        )


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: GenerationStats


class StepTimer:
    """Splits one decode step's wall time into drafting (proposing, and the drafter's ``observe``) and verification
    (one target forward); accept, commit and emitting are bookkeeping. On a GPU it waits for queued kernels at the
    verification boundaries, so that each phase's time is its own."""

    def __init__(self, device: torch.device) -> None:
        self.sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        self.start = self.mark = self.end = 0.0
        self.draft_s = self.verify_s = 0.0

    def begin(self) -> None:
        self.start = self.mark = time.perf_counter()
        self.draft_s = self.verify_s = 0.0

    def drafted(self) -> None:
        self.sync()
        self.draft_s += self._lap()

    def verified(self) -> None:
        self.sync()
        self.verify_s += self._lap()

    def committed(self) -> None:
        self._lap()

    def observed(self) -> None:
        self.draft_s += self._lap()
        self.end = self.mark

    @property
    def step_s(self) -> float:
        """From ``begin`` to ``observed``: what draft backoff weighs a step by."""
        return self.end - self.start

    def add_to(self, stats: GenerationStats) -> None:
        stats.draft_s += self.draft_s
        stats.verify_s += self.verify_s

    def _lap(self) -> float:
        now = time.perf_counter()
        elapsed, self.mark = now - self.mark, now
        return elapsed
