"""Draft backoff: stop drafting while it does not pay on this request, and probe now and then.

A head that guesses well on one prompt (math) can guess badly on the next (a translation): there, every verified
tree costs more than the one token it usually yields. ``DraftBackoff`` measures, per request, the committed tokens
per second of drafting steps and of plain steps (the root alone), and drafts only while drafting is the faster of
the two; while it is not, every ``probe_every``-th step drafts again to refresh the estimate. Lossless either way:
a plain step is an ordinary verification of the root, and the drafter still observes every committed token.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DraftBackoff:
    """Per-request policy (the generator copies a fresh one for each ``generate`` call).

    ``smoothing`` weights the newest step in the exponential moving averages of step time and tokens per step.
    """

    probe_every: int = 8
    smoothing: float = 0.25
    draft_seconds: float | None = None  # moving average of a drafting step's wall time
    draft_tokens: float | None = None  # ... and of the tokens it committed (bonus token counted)
    plain_seconds: float | None = None  # moving average of a plain step's wall time (it commits one token)
    since_probe: int = 0

    def pays(self) -> bool:
        """Drafting commits more tokens per second than plain steps (both measured on this request)."""
        return self.draft_tokens / self.draft_seconds >= 1.0 / self.plain_seconds

    def should_draft(self) -> bool:
        if self.draft_seconds is None:  # measure drafting first, then one plain step
            return True
        if self.plain_seconds is None:
            return False
        if self.pays():
            self.since_probe = 0
            return True
        self.since_probe += 1
        if self.since_probe >= self.probe_every:
            self.since_probe = 0
            return True
        return False

    def record(self, drafted: bool, seconds: float, tokens: int) -> None:
        """One finished step: its wall time (draft + verify + commit + observe) and the tokens it committed."""
        if drafted:
            self.draft_seconds = self._average(self.draft_seconds, seconds)
            self.draft_tokens = self._average(self.draft_tokens, float(tokens))
        else:
            self.plain_seconds = self._average(self.plain_seconds, seconds)

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)
