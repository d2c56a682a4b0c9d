"""Speculative generation: draft -> verify -> accept -> commit, one screen.

The target is a frozen stock transformers model. Each step verifies a whole draft tree in ONE target forward
(``verify_tree``), keeps the accepted path in the KV cache (``commit_path``) and tells the drafter what the target
saw (``Drafter.observe``). With no drafter every tree is the root alone: plain decoding through the same loop.

Conventions: node 0 of every tree is the root, the last committed token, not yet in the target cache. "tau counts
the bonus token": tau = committed tokens / target forwards (the prefill forward, which yields the first token,
counts). p = target, q = draft.
"""

from __future__ import annotations

import contextlib
import copy
import numbers
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from specheads.decoding.accept import (
    LOSSY_ACCEPTANCE,
    AcceptResult,
    accept_greedy,
    accept_speculative,
    accept_typical,
)
from specheads.decoding.draft import DRAFTER_MODULES, Drafter, DraftTree, Sampling, root_only_tree
from specheads.decoding.kv_cache import commit_path, new_cache
from specheads.decoding.prompts import Prompt, encode_prompt
from specheads.decoding.sampling import (
    generation_settings_to_flag,
    sample_from_probs,
    warn_unapplied_generation_settings,
)
from specheads.decoding.stats import GenerationResult, GenerationStats, StepTimer
from specheads.decoding.tree import ancestor_matrix, fits_context
from specheads.decoding.verify import attention_layout, check_tree_exactness, select_rows, verify_tree

ACCEPTANCE_RULES = ("greedy", "speculative", "typical")

Kernels = Callable[..., contextlib.AbstractContextManager[Any]]
"""A hook the generator enters around each request with the target and the drafter's modules, e.g. a choice of
CPU kernels (``specheads.decoding.tuning.cpu_kernels.CpuKernels``): ``with kernels(*modules): ...``."""


class DraftPolicy(Protocol):
    """Whether to draft on the next step, from what earlier steps of the request cost and committed (e.g.
    ``specheads.decoding.tuning.backoff.DraftBackoff``). The generator copies it afresh for every request; a step
    without a draft verifies the root alone, so any policy is lossless."""

    def should_draft(self) -> bool: ...

    def record(self, drafted: bool, seconds: float, tokens: int) -> None: ...


@dataclass
class RequestState:
    """Everything one generate() call mutates; nothing is stored on the generator or on modules."""

    cache: DynamicCache
    prompt_len: int
    output: list[int]  # committed new tokens, the current root last
    root: int
    drafter_state: Any
    generator: torch.Generator | None
    stats: GenerationStats
    eos_ids: set[int] = field(default_factory=set)  # read from the target's generation config at each call
    text: str = ""
    streamed: str = ""  # the prefix of text already passed to the stream callback


class SpeculativeGenerator:
    """Generate with a frozen target and an optional drafter (Medusa, EAGLE, draft model, prompt lookup)."""

    def __init__(
        self,
        target: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        drafter: Drafter | None = None,
        acceptance: str = "speculative",
        posterior_threshold: float = 0.09,
        posterior_alpha: float = 0.3,
        kernels: Kernels | None = None,
        backoff: DraftPolicy | None = None,
    ) -> None:
        """``kernels``: entered around every request with the target and the drafter's modules (``Kernels``); the
        CLI and the benchmark pass ``CpuKernels()``, the CPU kernels measured faster on this machine.

        ``backoff``: a ``DraftPolicy`` that may skip drafting on steps where it does not pay (lossless), copied
        afresh for every request; ``specheads.decoding.tuning.backoff.DraftBackoff()`` is the default policy."""
        if backoff is True:
            raise TypeError(
                f"backoff takes a draft policy, got {backoff!r}; pass "
                "specheads.decoding.tuning.backoff.DraftBackoff() for the default one, or None for none"
            )
        if acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"acceptance must be one of {ACCEPTANCE_RULES}, got {acceptance!r}")
        if drafter is not None and not all(hasattr(drafter, name) for name in ("begin", "propose", "observe")):
            raise TypeError(  # a loaded head, say, which would otherwise fail only after the prompt's forward
                f"drafter must be a Drafter (begin, propose, observe), got {type(drafter).__name__}; wrap a loaded "
                "head with specheads.decoding.build_drafter(head)"
            )
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.acceptance = acceptance
        self.typical_params = (posterior_threshold, posterior_alpha)
        self.kernels, self.backoff = kernels, backoff or None  # False: no policy, as None
        self.layer_ids = list(drafter.layer_ids) if drafter is not None else []
        self.max_context = int(getattr(target.config.get_text_config(), "max_position_embeddings", 0) or 0)
        self.layout = attention_layout(target)  # refuses a target that cannot verify trees (``tree_obstacle``)
        check_tree_exactness(target, self.layout)  # a forward that ignores the tree mask or positions: refused
        self.flagged_settings = generation_settings_to_flag(target)  # warned about now, and again if they change
        warn_unapplied_generation_settings(self.flagged_settings)

    def check_drafter_placement(self) -> None:
        """The drafter's modules must sit on the target's device, and a head that reads the target's hidden states
        must share its dtype: a model or head moved after loading would otherwise fail deep inside a forward."""
        weight = self.target.get_input_embeddings().weight
        for name, module in self.drafter_modules():
            for param in module.parameters():
                wrong_dtype = name != "model" and param.is_floating_point() and param.dtype != weight.dtype
                if param.device != weight.device or wrong_dtype:
                    raise ValueError(
                        f"the drafter's {name} is on {param.device} in {param.dtype}, the target on {weight.device} "
                        f"in {weight.dtype}; move it to match (e.g. drafter.{name}.to(target.device, "
                        "target.dtype)), or load the head after moving the target: load_head places it there"
                    )

    def drafter_modules(self) -> list[tuple[str, torch.nn.Module]]:
        """The drafter's modules by attribute: a draft ``model``, an EAGLE ``head``, Medusa ``heads``."""
        found = [(name, getattr(self.drafter, name, None)) for name in DRAFTER_MODULES]
        return [(name, module) for name, module in found if isinstance(module, torch.nn.Module)]

    def eos_ids(self) -> set[int]:
        """The target's EOS ids as its generation config says now: what ``generate`` stops at (not the tokenizer's)."""
        config = self.target.generation_config
        eos = config.eos_token_id if config is not None else None
        if eos is None and getattr(self.tokenizer, "eos_token_id", None) is not None:
            warnings.warn(
                "the target's generation_config.eos_token_id is None, so decoding runs to max_new_tokens as generate "
                "does; set model.generation_config.eos_token_id = tokenizer.eos_token_id to stop at that EOS",
                stacklevel=5,  # the caller of generate()
            )
        return set(eos if isinstance(eos, list) else [eos]) - {None}

    def generate(
        self,
        prompt: Prompt,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        stop: Sequence[str] | str | None = (),
        seed: int | None = None,
        stream: Callable[[str], None] | None = None,
    ) -> GenerationResult:
        """Generate from a prompt; ``result.token_ids`` are the new tokens (not the prompt; a final EOS included),
        ``result.text`` their text without special tokens, ``result.stats`` a ``GenerationStats`` (tau, acceptance
        per depth, the time split, ``lossy``).

        ``prompt``: a string (wrapped as a user turn in the chat template when the tokenizer has one: pass token ids
        for raw text), chat messages, token ids (a list, a 1D tensor or a (1, T) tensor), or a tokenizer's output
        (``input_ids`` and an optional left-padding ``attention_mask``, whose padding is dropped). One sequence per
        call. ``temperature`` 0 is greedy (token-identical to the target's ``generate``); above 0 samples exactly
        the target's distribution after ``top_k``/``top_p`` (transformers' ``generate`` adds ``top_k=50`` by
        default: pass ``top_k=50`` to sample the same law). ``seed`` makes sampling reproducible, except with
        ``backoff``, whose draft-or-not choice follows timings (the law stays exact, the drawn sequence varies);
        None draws a seed from torch's global generator (so ``torch.manual_seed`` applies). ``stream`` receives
        each new piece of text as it is committed. Each call keeps its state to itself.

        Runs inside ``kernels(target, *drafter modules)`` when the generator was given ``kernels``.
        """
        self.check_drafter_placement()
        settings = generation_settings_to_flag(self.target)
        if settings != self.flagged_settings:  # the config changed since: as EOS, it is read on every call
            self.flagged_settings = settings
            warn_unapplied_generation_settings(settings)
        modules = [self.target, *(module for _, module in self.drafter_modules())]
        with self.kernels(*modules) if self.kernels is not None else contextlib.nullcontext():
            return self._generate(prompt, max_new_tokens, temperature, top_k, top_p, stop, seed, stream)

    @torch.inference_mode()
    def _generate(
        self,
        prompt: Prompt,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        stop: Sequence[str] | str | None = (),
        seed: int | None = None,
        stream: Callable[[str], None] | None = None,
    ) -> GenerationResult:
        start = time.perf_counter()
        sampling, rule, stop = self.check_request(max_new_tokens, temperature, top_k, top_p, stop, seed)
        req = self.prefill(self.encode(prompt), sampling, seed, rule)  # the first new token becomes the root
        self.emit(req, [req.root], max_new_tokens, stop, stream)
        policy = copy.deepcopy(self.backoff) if self.drafter is not None else None
        timer = StepTimer(self.target.device)
        while not req.stats.stop_reason and not self.context_full(req):
            timer.begin()
            prefix_len = req.cache.get_seq_length()  # the root goes at this position, depth-d nodes at + d
            # 1. draft: a tree rooted at the last committed token (the root alone when the policy skips drafting)
            drafting = self.drafter is not None and (policy is None or policy.should_draft())
            tree, ancestors, depth = self.draft(req, drafting, prefix_len)
            timer.drafted()
            # 2. verify: one target forward over every node
            depths = tree.structure.depths if tree.structure is not None else None
            verification = verify_tree(
                self.target, req.cache, tree.tokens, tree.parents, self.layer_ids, ancestors, depths, self.layout
            )
            req.stats.target_forwards += 1
            timer.verified()
            # 3. accept: the longest acceptable path plus the bonus/correction token
            result = self.accept(rule, tree, verification.logits, sampling, req.generator)
            path = torch.tensor(result.path, device=tree.tokens.device)
            req.stats.record_step(depth, len(result.path) - 1)
            # 4. commit: keep the path in the target cache, tell the drafter what the target saw
            commit_path(req.cache, prefix_len, path)
            fed_tokens = tree.tokens[path]
            timer.committed()
            if self.drafter is not None:  # drafter work (e.g. EAGLE re-feeds the path), timed as drafting
                hidden = select_rows(verification.hidden_states, path) if self.layer_ids else None
                self.drafter.observe(req.drafter_state, fed_tokens, hidden, result.next_token)
            req.root = result.next_token
            timer.observed()
            # 5. emit the accepted tokens and the bonus token; stop at EOS / stop strings / max_new_tokens
            self.emit(req, fed_tokens[1:].tolist() + [result.next_token], max_new_tokens, stop, stream)
            timer.add_to(req.stats)
            if policy is not None:
                policy.record(drafting, timer.step_s, len(result.path))
        req.stats.total_s = time.perf_counter() - start
        req.stats.bookkeeping_s = req.stats.total_s - req.stats.draft_s - req.stats.verify_s
        return GenerationResult(text=req.text, token_ids=list(req.output), stats=req.stats)

    def check_request(
        self,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        stop: Sequence[str] | str | None,
        seed: int | None,
    ) -> tuple[Sampling, str, list[str]]:
        """The request's sampling, acceptance rule and stop strings, or an error for settings that cannot go
        together."""
        if not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:  # numpy ints too
            raise ValueError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens!r}")
        sampling = Sampling(temperature, top_k, top_p)
        if self.acceptance == "greedy" and not sampling.greedy:
            raise ValueError(
                f"acceptance='greedy' keeps the target's argmax, so it decodes at temperature 0 only; got "
                f"temperature {temperature}. Use temperature=0, or acceptance='speculative' to sample (lossless)"
            )
        stop = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
        if any(not isinstance(s, str) or not s for s in stop):  # "" is in every text: it would stop at once
            raise ValueError(
                f"stop takes non-empty strings, got {stop!r}; pass stop=None for none (stop tokens go in the target's "
                "generation_config.eos_token_id)"
            )
        if seed is not None and not isinstance(seed, numbers.Integral):
            raise ValueError(f"seed must be a whole number or None, got {seed!r}")
        return sampling, "greedy" if sampling.greedy else self.acceptance, stop

    def context_full(self, req: RequestState) -> bool:
        """Not even the root has a position left: the request stops (``context_full``) without drafting."""
        if self.max_context and req.cache.get_seq_length() >= self.max_context:
            req.stats.stop_reason = "context_full"
        return req.stats.stop_reason == "context_full"

    def draft(self, req: RequestState, drafting: bool, prefix_len: int) -> tuple[DraftTree, torch.Tensor, int]:
        """This step's tree, its ancestor matrix and its depth (of the deepest node; the root is depth 0): the
        drafter's proposal, or the root alone when not drafting or when the context cannot hold every node."""
        device = self.target.device
        if not drafting:
            tree = root_only_tree(req.root, device)
            req.stats.plain_steps += self.drafter is not None
        else:
            tree = self.drafter.propose(req.drafter_state).to(device)
        ancestors = _ancestors(tree)
        # a static tree knows its depth without a device sync
        depth = tree.structure.max_depth if tree.structure is not None else int(ancestors.sum(dim=1).max()) - 1
        if not fits_context(self.max_context, prefix_len, depth):
            tree = root_only_tree(req.root, device)
            return tree, _ancestors(tree), 0
        return tree, ancestors, depth

    def prefill(self, input_ids: torch.Tensor, sampling: Sampling, seed: int | None, rule: str) -> RequestState:
        """Feed the prompt, pick the first new token from its last logits and start the drafter."""
        device = self.target.device
        generator = None
        if not sampling.greedy:
            generator = torch.Generator(device=device)
            # no seed: one drawn from the global generator, which torch.manual_seed governs and this does not reseed
            generator.manual_seed(seed if seed is not None else int(torch.randint(2**62, (1,)).item()))
        cache = new_cache(self.target)
        t0 = time.perf_counter()
        out = self.target(
            input_ids=input_ids.to(device).unsqueeze(0),
            cache=cache,
            use_cache=True,
            output_hidden_states=self.layer_ids or None,
            logits_to_keep=1,  # only the last position picks a token: skip the (T, V) lm_head over the prompt
        )
        cache.crop(0)  # sliding-window layers keep only the last W-1 prompt keys (a no-op for full-attention ones)
        logits = out.logits[0, -1]  # (V,)
        if sampling.greedy:
            root = int(torch.argmax(logits).item())  # syncs: the forward's time is all in
        else:
            root = sample_from_probs(sampling.probs(logits), generator)
        t1 = time.perf_counter()
        # the prompt's forward is target time, as in the benchmark's baselines (every target forward is "verify")
        stats = GenerationStats(target_forwards=1, acceptance=rule, lossy=rule in LOSSY_ACCEPTANCE)
        stats.verify_s = stats.prefill_s = t1 - t0
        drafter_state = None
        if self.drafter is not None:
            hidden = out.hidden_states if self.layer_ids else None
            drafter_state = self.drafter.begin(input_ids.to(device), hidden, root, sampling, generator)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            stats.draft_s += time.perf_counter() - t1
        return RequestState(cache, input_ids.numel(), [], root, drafter_state, generator, stats, self.eos_ids())

    def accept(
        self, rule: str, tree: DraftTree, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
    ) -> AcceptResult:
        if rule == "greedy":
            return accept_greedy(tree.tokens, tree.parents, logits)
        if rule == "typical":
            threshold, alpha = self.typical_params
            return accept_typical(
                tree.tokens,
                tree.parents,
                logits,
                sampling.temperature,
                threshold,
                alpha,
                generator,
                top_k=sampling.top_k,
                top_p=sampling.top_p,
            )
        target_probs = sampling.probs(logits)  # (n, V), warped exactly like the draft's q
        return accept_speculative(tree.tokens, tree.parents, target_probs, tree.draft_probs, generator, tree.fixed)

    def emit(
        self,
        req: RequestState,
        tokens: list[int],
        max_new_tokens: int,
        stop: Sequence[str],
        stream: Callable[[str], None] | None,
    ) -> None:
        """Append new tokens one by one until a stop condition; stream the new text. Stop strings are looked for in
        the text returned (special tokens skipped)."""
        # the tail a stop string can end in: n characters span at most n tokens (some more for split UTF-8 bytes)
        window = 64 + max(map(len, stop), default=0)
        for token in tokens:
            req.output.append(token)
            req.stats.new_tokens += 1
            if token in req.eos_ids:
                req.stats.stop_reason = "eos"
            elif stop and _contains_any(self.tokenizer.decode(req.output[-window:], skip_special_tokens=True), stop):
                req.stats.stop_reason = "stop_string"
            elif len(req.output) >= max_new_tokens:
                req.stats.stop_reason = "max_new_tokens"
            if req.stats.stop_reason:
                break
        text = self.tokenizer.decode(req.output, skip_special_tokens=True)
        if req.stats.stop_reason == "stop_string":
            text = _cut_after_stop(text, stop)
        req.text = text
        # Hold back a trailing partial UTF-8 character (decoded as U+FFFD) until its next byte arrives.
        ready = text if req.stats.stop_reason else text.rstrip("\ufffd")
        if stream is not None and ready.startswith(req.streamed) and len(ready) > len(req.streamed):
            stream(ready[len(req.streamed) :])
            req.streamed = ready

    def encode(self, prompt: Prompt) -> torch.Tensor:
        """Token ids (T,) of a prompt; errors for empty, batched, padded, over-long or unknown prompts."""
        vocab_size = getattr(self.target.get_input_embeddings(), "num_embeddings", 0)  # 0: not checked
        return encode_prompt(self.tokenizer, prompt, self.max_context, vocab_size)


def _ancestors(tree: DraftTree) -> torch.Tensor:
    return tree.structure.ancestors if tree.structure is not None else ancestor_matrix(tree.parents)


def _contains_any(text: str, strings: Sequence[str]) -> bool:
    return any(s in text for s in strings)


def _cut_after_stop(text: str, stop: Sequence[str]) -> str:
    """Text up to and including the earliest stop string (as transformers' ``stop_strings`` keeps it)."""
    ends = [text.find(s) + len(s) for s in stop if s in text]
    return text[: min(ends)] if ends else text
