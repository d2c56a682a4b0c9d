"""How the frozen target answers: batched, left-padded greedy or sampled answers, turn by turn for multi-turn prompts.

``specheads.training.distill`` writes these answers to a resumable file; this module only computes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from specheads.target import only_this_config
from specheads.training.chat_format import interleave


@dataclass
class GenerationSettings:
    """How the target answers. ``temperature == 0`` means greedy; sampling is seeded per batch (``distill._seed``)."""

    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    batch_size: int = 32  # measured fastest of 1, 8, 16, 32 on a 2-core CPU (docs/results.md)
    by_length: bool = True
    """Answer the prompts shortest first within blocks of the file (``answer_order``), so a batch pads little."""
    max_prompt_tokens: int | None = None
    """Skip prompts longer than this (a training length leaves no room for an answer after them)."""
    turns: int = 1
    """Answer up to this many user turns of a multi-turn conversation, each after the target's own earlier answers
    (a conversation stops at an answer cut at ``max_new_tokens``, or where the next prompt passes
    ``max_prompt_tokens``)."""


def left_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists so every prompt ends at the last column, where generation continues."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        input_ids[row, width - len(seq) :] = torch.as_tensor(seq, dtype=torch.long)
        attention_mask[row, width - len(seq) :] = 1
    return input_ids, attention_mask  # (B, T), (B, T)


def stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


@dataclass
class Answer:
    """One answer: its text, the target's own token ids (end-of-turn excluded), whether the target ended it."""

    text: str
    token_ids: list[int]
    finished: bool  # False: cut at max_new_tokens


@torch.no_grad()
def prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """The target's input for a conversation: its chat template with the assistant's turn opened."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def answer_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: list[list[dict[str, str]]],
    settings: GenerationSettings,
    seed: int = 0,
) -> list[Answer]:
    """The target's answers to a batch of conversations (left-padded, cut at EOS).

    Greedy answers are the target's argmax, from a loop that drops each row as it ends (``greedy_rows``); sampled
    ones come from one ``generate`` call. Only the settings here apply: the target's own generation config (a
    ``repetition_penalty`` or ``no_repeat_ngram_size`` some targets ship) is set aside."""
    token_lists = [prompt_ids(tokenizer, messages) for messages in conversations]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids, attention_mask = left_pad(token_lists, pad_id)
    eos_ids = stop_ids(model, tokenizer)
    sampling = settings.temperature > 0
    if sampling:
        torch.manual_seed(seed)
        rows = generate_rows(model, input_ids, attention_mask, settings, eos_ids, pad_id)
    else:
        rows = greedy_rows(model, input_ids, attention_mask, settings.max_new_tokens, eos_ids)
    return [_answer(tokenizer, row, eos_ids) for row in rows]


def generate_rows(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    settings: GenerationSettings,
    eos_ids: list[int],
    pad_id: int,
) -> list[list[int]]:
    """The new tokens of each row of a left-padded batch from one transformers ``generate`` call (rows that end
    early are padded after their EOS), under these settings alone."""
    sampling = settings.temperature > 0
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        do_sample=sampling,
        temperature=settings.temperature if sampling else None,
        top_p=settings.top_p if sampling else None,
        top_k=None,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
    )
    with only_this_config(model, config):
        output = model.generate(
            input_ids=input_ids.to(model.device),
            attention_mask=attention_mask.to(model.device),
            generation_config=config,
        )
    return output[:, input_ids.shape[1] :].tolist()


def _answer(tokenizer: PreTrainedTokenizerBase, row: list[int], eos_ids: list[int]) -> Answer:
    cut = next((i for i, token in enumerate(row) if token in eos_ids), None)
    ids = row if cut is None else row[:cut]
    return Answer(tokenizer.decode(ids, skip_special_tokens=True), ids, cut is not None)


@torch.no_grad()
def greedy_rows(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    eos_ids: list[int],
) -> list[list[int]]:
    """Greedy continuations of a left-padded batch (each up to and including its EOS), dropping every row from the
    batch and its KV cache as soon as it ends.

    ``generate`` steps every row until the longest answer ends, so a batch whose answers mostly stop early spends
    most of its compute on rows already done; on a CPU a step costs about in proportion to its rows."""
    device = model.device
    mask = attention_mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: a row's first real token is position 0
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=input_ids.to(device), attention_mask=mask, position_ids=positions, cache=cache).logits[
        :, -1
    ]
    rows: list[list[int]] = [[] for _ in range(input_ids.shape[0])]
    active = list(range(input_ids.shape[0]))  # the batch row of each live cache row
    last = positions[:, -1]
    stops = torch.tensor(eos_ids, device=device)
    for step in range(max_new_tokens):
        tokens = logits.argmax(-1)  # (live,)
        for row, token in zip(active, tokens.tolist()):
            rows[row].append(token)
        live = ~torch.isin(tokens, stops)
        if step == max_new_tokens - 1 or not live.any():  # every live row has max_new_tokens now, or none is live
            break
        if not live.all():
            keep = live.nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            mask, tokens, last = mask[keep], tokens[keep], last[keep]
            active = [active[i] for i in keep.tolist()]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)
        last = last + 1
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=last[:, None], cache=cache).logits[
            :, -1
        ]
    return rows


def answer_turns(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: list[dict[str, Any]],
    settings: GenerationSettings,
    seed: int = 0,
) -> list[tuple[list[dict[str, str]], Answer]]:
    """Each record's conversation as the target answered it (ending in its last answer) and that last answer.

    Turn by turn over the batch: a record with ``later_questions`` asks its next one after the target's answer, as
    long as that answer was finished and the longer prompt fits ``max_prompt_tokens``. The target reads its earlier
    answers as text through the chat template, as training reads them."""
    answers: list[list[Answer]] = [[] for _ in records]

    def conversation(index: int, asking: bool) -> list[dict[str, str]]:
        # the join rebuilds the same turns from the packed answers (chat_format.answered_conversation)
        texts = [answer.text for answer in answers[index]]
        questions = records[index].get("later_questions", [])[: len(texts) - (0 if asking else 1)]
        return interleave(records[index]["messages"], questions, texts)

    pending = list(range(len(records)))
    for turn in range(settings.turns):
        if not pending:
            break
        prompts = [conversation(i, asking=True) for i in pending]
        asking = []
        for index, answer in zip(pending, answer_batch(model, tokenizer, prompts, settings, seed + turn)):
            answers[index].append(answer)
            if (
                not answer.finished
                or turn >= len(records[index].get("later_questions", []))
                or turn + 1 >= settings.turns
            ):
                continue
            limit = settings.max_prompt_tokens
            if limit is None or len(prompt_ids(tokenizer, conversation(index, asking=True))) <= limit:
                asking.append(index)
        pending = asking
    return [(conversation(i, asking=False), answers[i][-1]) for i in range(len(records))]
