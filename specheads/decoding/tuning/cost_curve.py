"""What a target forward over n new tokens costs on this device, since the best draft tree depends on it
(``cost_model.choose_tree``): timed by each ``auto`` calibration at its own context length, on its own clock.

Verifying many tree nodes costs several decode steps on a small CPU but about one on a GPU (docs/results.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specheads.decoding.generator import Kernels
from specheads.decoding.kv_cache import crop_to, new_cache
from specheads.decoding.tree import chain_parents
from specheads.decoding.verify import attention_layout, verify_tree

COST_SIZES = (1, 2, 3, 4, 6, 8, 16, 32, 64)
"""Numbers of new tokens (tree nodes, root included) whose forward cost is measured; others are interpolated."""
COST_REPEATS = 16  # timed passes over the sizes, the fastest kept: with 3 or 8, a slow single-token pass set the
# small sizes' ratios (3 tokens priced at 1.03x or 1.12x one token, where 16 passes read 1.22-1.28x on SmolLM2)


def cost_sizes(max_tokens: int, max_context: int = 0) -> list[int]:
    """The sizes a tree of up to ``max_tokens`` tokens (root included) is priced on: ``COST_SIZES`` up to the first
    that covers it (the curve extrapolates past its largest), none longer than half the target's positions
    (``max_context``, 0 for no limit) so that a prefix fits before it."""
    fits = [n for n in COST_SIZES if not max_context or n <= max_context // 2] or [1]
    covering = [n for n in fits if n >= max_tokens]
    return [n for n in fits if n < max_tokens] + covering[:1]


@dataclass
class CostCurve:
    """Seconds of one target forward over n new tokens on top of a ``prefix_len``-token cache, at a few n."""

    sizes: list[int]
    seconds: list[float]
    device: str = ""
    model: str = ""
    dtype: str = ""
    prefix_len: int = 0

    def at(self, n: int) -> float:
        """Linear interpolation between measured sizes (their ``envelope``); linear extrapolation past the largest."""
        sizes, secs = self.sizes, self.envelope()
        if n <= sizes[0]:
            return secs[0]
        for (n0, s0), (n1, s1) in zip(zip(sizes, secs), zip(sizes[1:], secs[1:])):
            if n <= n1:
                return s0 + (s1 - s0) * (n - n0) / (n1 - n0)
        slope = (secs[-1] - secs[-2]) / (sizes[-1] - sizes[-2]) if len(sizes) > 1 else 0.0
        return secs[-1] + slope * (n - sizes[-1])

    def envelope(self) -> list[float]:
        """The measured seconds made non-decreasing in n: a forward over fewer tokens costs at most what one over
        more did, so a small size timed above a larger one (noise only adds time) is priced at the larger's cost."""
        lowest, priced = float("inf"), []
        for seconds in reversed(self.seconds):
            lowest = min(lowest, seconds)
            priced.append(lowest)
        return priced[::-1]

    def relative(self) -> list[float]:
        """Cost of each measured size, as the cost model prices it, relative to one token (1.0 = a decode step)."""
        priced = self.envelope()
        return [s / priced[0] for s in priced]


def device_label(device: torch.device) -> str:
    """A cache key for the hardware: the GPU's name, or the CPU architecture and thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu-{platform.machine()}-{torch.get_num_threads()}threads"


def architecture_digest(target: PreTrainedModel) -> str:
    """A digest of what a forward's cost depends on besides the device and dtype: the model's config (its name and
    the transformers version left out) and its attention implementation. Two folders holding the same architecture
    share an auto tree; a folder overwritten with another model does not reuse the old one's."""
    config = {k: v for k, v in target.config.to_dict().items() if k not in _NOT_ARCHITECTURE}
    config["attn_implementation"] = target.config._attn_implementation
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


_NOT_ARCHITECTURE = ("_name_or_path", "name_or_path", "transformers_version", "_commit_hash")


def write_cache_file(path: Path, text: str) -> str | None:
    """Write a cache entry under a temporary name and rename it into place (a reader never sees half a file).
    A cache that cannot be written (read-only, full, no permission) is not an error: the entry is measured again
    next time. Returns why it failed, or None."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(text)
        os.replace(partial, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        return f"{type(error).__name__}: {error}"
    return None


def cache_file_name(*parts: object) -> str:
    """A file name from key parts: characters other than letters, digits, '-', '_' and '.' become '_'."""
    key = "__".join(str(part) for part in parts)
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key) + ".json"


@torch.inference_mode()
def measure_cost_curve(
    target: PreTrainedModel,
    sizes: Sequence[int] = COST_SIZES,
    prefix_len: int = 128,
    repeats: int = COST_REPEATS,
    kernels: Kernels | None = None,
) -> CostCurve:
    """Time one chain verification of each size on top of a ``prefix_len`` cache (attention over a longer context
    costs a multi-token forward more than a single-token one, so the prefix is the context decoding will see).

    Sizes are interleaved within each repeat and the minimum is kept: on a shared machine, noise only ever adds
    time, so the fastest run is the best estimate of the cost itself. The first pass is a discarded warm-up.
    """
    device = target.device
    vocab = target.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, prefix_len), generator=generator).to(device)
    cache, layout = new_cache(target), attention_layout(target)
    target(input_ids=prefix, cache=cache, use_cache=True)
    best = {n: float("inf") for n in sizes}
    with kernels(target) if kernels is not None else contextlib.nullcontext():
        for attempt in range(repeats + 1):
            for n in sizes:
                tokens = torch.randint(0, vocab, (n,), generator=generator).to(device)
                _sync(device)
                start = time.perf_counter()
                verify_tree(target, cache, tokens, chain_parents(n).to(device), layout=layout)
                _sync(device)
                if attempt:
                    best[n] = min(best[n], time.perf_counter() - start)
                crop_to(cache, prefix_len)
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    name = str(target.config.name_or_path)
    return CostCurve(list(sizes), [best[n] for n in sizes], device_label(device), name, dtype, prefix_len)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
