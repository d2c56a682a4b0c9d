"""The decoding methods a benchmark compares, behind one small interface.

Every method takes the same prompt ids and returns a ``MethodRun``: the new token ids and where the time went.
transformers' own methods (plain ``generate``, prompt lookup, assisted generation) are timed from outside with
forward hooks (target forwards = verify time, assistant forwards = draft time), and run with the same CPU matrix
kernels as specheads' (``hf_method``); specheads methods report their own ``GenerationStats``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from specheads.decoding.generator import Kernels, SpeculativeGenerator
from specheads.decoding.tuning.backoff import DraftBackoff
from specheads.target import only_this_config


@dataclass
class MethodRun:
    """One method on one prompt."""

    token_ids: list[int]
    seconds: float
    target_forwards: int  # prefill included
    draft_s: float = 0.0
    verify_s: float = 0.0
    accepted_lengths: list[int] = field(default_factory=list)  # draft tokens accepted per step (specheads only)
    depth_attempts: list[int] = field(default_factory=list)
    depth_accepts: list[int] = field(default_factory=list)
    plain_steps: int = 0  # steps draft backoff verified without a draft

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tau(self) -> float:
        """Tokens committed per target forward, counting the bonus token (the prefill forward counts)."""
        return self.new_tokens / max(self.target_forwards, 1)

    @property
    def other_s(self) -> float:
        return max(self.seconds - self.draft_s - self.verify_s, 0.0)


@dataclass
class Method:
    """A named way to generate. ``lossless``: at T=0 its output must equal plain ``generate`` token for token."""

    name: str
    run: Callable[[torch.Tensor, int, float, int], MethodRun]  # (input_ids (1, T), max_new_tokens, temperature, seed)
    lossless: bool = True
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # shown in the report (e.g. the chosen tree)


class ForwardTimer:
    """Counts and times a module's forward calls with hooks (synchronising CUDA so the times are real)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.calls, self.seconds = module, 0, 0.0
        self._start = 0.0
        self._handles: list[Any] = []

    def _sync(self) -> None:
        device = next(self.module.parameters()).device
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the module's GPU, not the current one (--device cuda:1)

    def _before(self, module: torch.nn.Module, args: Any) -> None:
        self._sync()
        self._start = time.perf_counter()

    def _after(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._sync()
        self.seconds += time.perf_counter() - self._start
        self.calls += 1

    def __enter__(self) -> ForwardTimer:
        self._handles = [
            self.module.register_forward_pre_hook(self._before),
            self.module.register_forward_hook(self._after),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()


def generation_config_for(model: PreTrainedModel, max_new_tokens: int, temperature: float) -> GenerationConfig:
    """The benchmark's sampling with the target's special tokens only: greedy at T=0, else pure temperature sampling
    over the full vocabulary (no top-k/top-p, which specheads applies only when asked). Nothing else from the
    target's own generation config (repetition_penalty, no_repeat_ngram_size, min_p, beams...) carries over: the
    speculative loop applies none of it, so every method decodes the same distribution."""
    own = model.generation_config
    eos = own.eos_token_id if own is not None else model.config.eos_token_id
    pad = own.pad_token_id if own is not None else None
    if pad is None:
        pad = eos[0] if isinstance(eos, list) else eos  # Llama-3 style: several EOS ids, no pad
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=0 if temperature > 0 else None,
        top_p=1.0 if temperature > 0 else None,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=own.bos_token_id if own is not None else None,
    )


def hf_method(
    name: str,
    target: PreTrainedModel,
    lossless: bool = True,
    description: str = "",
    assistant: PreTrainedModel | None = None,
    kernels: Kernels | None = None,
    **generation_options: Any,
) -> Method:
    """transformers ``generate`` with extra generation-config fields (``prompt_lookup_num_tokens=10``) and/or an
    ``assistant`` model (assisted generation).

    ``kernels``: run the target and the assistant under the CPU kernel choice specheads' methods verify with
    (``specheads.decoding.tuning.cpu_kernels.SmallBatchLinear``: measured per machine; no effect on GPU or in bf16),
    so that a comparison with them measures the drafting, not the matrix kernel. On a CPU whose BLAS is slow for a
    few rows, transformers' multi-token forwards would otherwise pay what specheads' do not; on one whose one-row
    kernel is the slow one, plain ``generate`` (one row per step) would."""

    def run(input_ids: torch.Tensor, max_new_tokens: int, temperature: float, seed: int) -> MethodRun:
        config = generation_config_for(target, max_new_tokens, temperature)
        for key, value in generation_options.items():
            setattr(config, key, value)
        kwargs = {} if assistant is None else {"assistant_model": assistant}
        torch.manual_seed(seed)
        drafter = ForwardTimer(assistant) if assistant is not None else None
        with contextlib.ExitStack() as stack:
            if kernels is not None:  # the kernels SpeculativeGenerator runs the target and a draft model with
                stack.enter_context(kernels(*(model for model in (target, assistant) if model is not None)))
            verify = stack.enter_context(ForwardTimer(target))
            stack.enter_context(drafter or contextlib.nullcontext())
            stack.enter_context(only_this_config(target, config))
            start = time.perf_counter()
            out = target.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, **kwargs
            )
            _sync(target)
            seconds = time.perf_counter() - start
        return MethodRun(
            token_ids=out[0, input_ids.shape[1] :].tolist(),
            seconds=seconds,
            target_forwards=verify.calls,
            draft_s=drafter.seconds if drafter is not None else 0.0,
            verify_s=verify.seconds,
        )

    return Method(name, run, lossless=lossless, description=description)


def specheads_method(
    name: str,
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    drafter: Any,
    acceptance: str = "speculative",
    description: str = "",
    extra: dict[str, Any] | None = None,
    backoff: bool = False,
    kernels: Kernels | None = None,
) -> Method:
    """specheads' ``SpeculativeGenerator`` with a drafter (None = plain decoding through the speculative loop)."""
    policy = DraftBackoff() if backoff else None
    generator = SpeculativeGenerator(target, tokenizer, drafter, acceptance, kernels=kernels, backoff=policy)

    def run(input_ids: torch.Tensor, max_new_tokens: int, temperature: float, seed: int) -> MethodRun:
        result = generator.generate(input_ids[0], max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        _sync(target)
        stats = result.stats
        return MethodRun(
            token_ids=list(result.token_ids),
            seconds=stats.total_s,
            target_forwards=stats.target_forwards,
            draft_s=stats.draft_s,
            verify_s=stats.verify_s,
            accepted_lengths=list(stats.accepted_lengths),
            depth_attempts=list(stats.depth_attempts),
            depth_accepts=list(stats.depth_accepts),
            plain_steps=stats.plain_steps,
        )

    return Method(name, run, lossless=acceptance != "typical", description=description, extra=dict(extra or {}))


def _sync(model: PreTrainedModel) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
