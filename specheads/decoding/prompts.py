"""Prompts for one speculative request: text (chat-templated), chat messages, token ids or a tokenizer's output,
checked and turned into the token ids ``SpeculativeGenerator`` decodes from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

Prompt = str | list[dict[str, str]] | torch.Tensor | list[int] | Mapping[str, Any]
"""A plain string (chat-templated when the tokenizer has a template), chat messages, or token ids (used as is)."""


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: Prompt, max_context: int = 0, vocab_size: int = 0
) -> torch.Tensor:
    """Token ids (T,) of a prompt; errors for empty, batched, padded, over-long, out-of-vocabulary (``vocab_size``:
    the target's embedding rows, 0 unchecked) or unknown prompts."""
    mask = None
    if isinstance(prompt, Mapping):  # a tokenizer's output (BatchEncoding) or a dict of its fields
        if "input_ids" not in prompt:
            raise TypeError(f"a mapping prompt needs 'input_ids' (a tokenizer's output); got keys {list(prompt)}")
        prompt, mask = prompt["input_ids"], prompt.get("attention_mask")
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("the prompt is empty; pass a non-empty string, chat messages or token ids")
        if tokenizer.chat_template:
            prompt = [{"role": "user", "content": prompt}]
        else:
            prompt = tokenizer(prompt, return_tensors="pt").input_ids
    if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], str):
        raise ValueError(
            f"got {len(prompt)} text prompts; speculative generation runs one sequence at a time: call generate "
            "once per prompt"
        )
    first = prompt[0] if isinstance(prompt, (list, tuple)) and len(prompt) > 1 else None
    if isinstance(first, (list, tuple)) or (torch.is_tensor(first) and first.dim() > 0):
        # several conversations or id lists (maybe of different lengths): torch would fail on them with its own words
        raise ValueError(
            f"got a batch of {len(prompt)} prompts; speculative generation runs one sequence at a time: call "
            "generate once per prompt"
        )
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        prompt = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt")
        prompt = prompt["input_ids"] if not torch.is_tensor(prompt) else prompt
    if not isinstance(prompt, (list, tuple, torch.Tensor)):
        raise TypeError(
            f"expected a prompt as text, chat messages, token ids (list or tensor) or a tokenizer's output; got "
            f"{type(prompt).__name__}"
        )
    ids = torch.as_tensor(prompt)
    if ids.numel() and (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool):
        raise TypeError(f"token ids must be integers, got a {ids.dtype} tensor")
    ids = ids.long()
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(
                f"batched prompts are not supported (got batch size {ids.shape[0]}); speculative generation runs "
                "one sequence at a time: call generate once per prompt"
            )
        ids = ids[0]
    if mask is not None:
        ids = _drop_left_padding(ids, torch.as_tensor(mask).reshape(-1))
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"the prompt is empty or malformed (token ids of shape {tuple(ids.shape)}); pass text or ids")
    if max_context and ids.numel() > max_context:  # a full context still yields one token
        raise ValueError(
            f"the prompt has {ids.numel()} tokens but the target's context is {max_context} tokens "
            "(max_position_embeddings); shorten the prompt to leave room for new tokens"
        )
    if vocab_size and not (0 <= int(ids.min()) and int(ids.max()) < vocab_size):  # else an opaque IndexError
        bad = ids[(ids < 0) | (ids >= vocab_size)].unique().tolist()
        raise ValueError(
            f"token ids must lie in [0, {vocab_size}) for the target's embeddings; got {bad[:8]}: encode the prompt "
            "with the target's own tokenizer (and drop label padding such as -100)"
        )
    return ids


def _drop_left_padding(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The ids without the padding an attention mask marks at their start (what ``generate`` ignores); padding
    elsewhere has no single-sequence meaning and is an error."""
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, but the ids have {tuple(ids.shape)}")
    keep = mask.bool()
    start = int(keep.long().argmax()) if keep.any() else ids.numel()
    if not keep[start:].all():
        raise ValueError(
            "the attention_mask masks tokens after the first kept one (right or inner padding); pass the "
            "unpadded ids of one sequence"
        )
    return ids[start:]
