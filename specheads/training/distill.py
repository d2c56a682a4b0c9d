"""Self-distillation: the frozen target answers a prompt file, and heads are then trained on its own outputs.

Medusa-2 (https://arxiv.org/abs/2401.10774, section 2.3.2) and EAGLE (https://arxiv.org/abs/2401.15077) both train
on the target's own responses: a draft head is judged by how often it agrees with the target, not with whoever
wrote a dataset's reference answers.

Output is JSONL in messages format, one complete line per conversation, flushed after every batch. A rerun reads
the ids already written and answers only the rest; a line cut short by a kill is removed first, so a killed run
loses at most the batch in flight. Besides the answer's text, each line keeps the target's own token ids
(``answer_token_ids``: decoding to text and encoding again does not give them back, e.g. ``\n\n`` generated as one
token re-encodes as two) and whether the target ended the answer itself (``finished``: an answer cut at
``max_new_tokens`` must not teach the heads that the turn ends there). ``specheads.training.data`` reads both.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from specheads.target import only_this_config
from specheads.training.chat_format import DataError, first_question, later_questions, to_messages

logger = logging.getLogger(__name__)


@dataclass
class GenerationSettings:
    """How the target answers. ``temperature == 0`` means greedy; sampling is seeded per batch (see ``_seed``)."""

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


def read_prompts(path: str | Path, limit: int | None = None, turns: int = 1) -> list[dict[str, Any]]:
    """The first ``limit`` records of a prompt file as ``{"id", "messages", ...}``, ready for the chat template.

    A record holds ``id`` and either ``prompt`` (one user turn), ``messages`` or ShareGPT's ``conversations``
    (``[{from: human|gpt|system, value}]``), of which the turns up to the first user turn are kept (a system prompt
    and that question): the target answers it. The other model's answers are never kept (heads would be trained on
    them as the target's); with ``turns > 1`` the next ``turns - 1`` user turns are kept as ``later_questions``, for
    the target to answer after its own answers.
    """
    records = []
    seen: dict[str, int] = {}  # id -> its line: a resume skips by id, so two prompts with one id lose one
    multi_turn = 0
    for line_number, record in _numbered_jsonl(path):
        if limit is not None and len(records) >= limit:
            break
        if not isinstance(record, dict) or "id" not in record:
            found = f"keys {sorted(record)}" if isinstance(record, dict) else f"a {type(record).__name__}"
            raise ValueError(f"{path}:{line_number}: record has no 'id' ({found}); resuming needs ids.")
        if str(record["id"]) in seen:
            raise ValueError(
                f"{path}:{line_number}: id {record['id']!r} is also the id of line {seen[str(record['id'])]}; "
                "expected unique ids (a resume skips the prompts whose id is already answered): rename one."
            )
        seen[str(record["id"])] = line_number
        later: list[str] = []
        if "messages" in record or "conversations" in record:
            try:
                messages = to_messages(record, "messages" if "messages" in record else "sharegpt")
            except (KeyError, TypeError, DataError) as err:
                raise ValueError(f"{path}:{line_number}: unreadable turns ({err}).") from None
            later = later_questions(messages)
            multi_turn += bool(later) and turns == 1
            messages = first_question(messages)
        elif "prompt" in record:
            messages = [{"role": "user", "content": record["prompt"]}]
        else:
            raise ValueError(
                f"{path}:{line_number}: record needs 'prompt', 'messages' or 'conversations', "
                f"found keys {sorted(record)}."
            )
        if not messages:
            raise ValueError(f"{path}:{line_number}: no user turn to answer.")
        out = {"id": str(record["id"]), "messages": messages}
        if "source" in record:
            out["source"] = record["source"]
        if turns > 1 and later:
            out["later_questions"] = later[: turns - 1]
        records.append(out)
    if not records:
        raise ValueError(f"{path} holds no prompt records; expected JSONL lines with 'id' and 'prompt' or 'messages'.")
    if multi_turn:
        logger.warning(
            "%d of %d prompt records hold several user turns; only the first is answered (--turns N answers up to N, "
            "each after the target's own earlier answers)",
            multi_turn,
            len(records),
        )
    return records


def _numbered_jsonl(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """Every non-blank line of an input JSONL file with its line number, the last one too (with or without a
    final newline); an unreadable line is an error naming it."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append((number, json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON record ({err}).") from None
    return records


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of an output JSONL file (a trailing line without newline, cut by a kill, is ignored);
    an unreadable complete line is an error naming it."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.endswith("\n") or not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}:{number}: not a JSON record ({err}); the file was edited or damaged: fix or delete that "
                    "line (its prompt is answered again), or write to another --out."
                ) from None
    return records


def finished_ids(out_path: Path) -> set[str]:
    """Ids already answered in ``out_path``; a trailing partial line is cut off so new lines append cleanly."""
    if not out_path.exists():
        return set()
    with open(out_path, "rb+") as f:
        data = f.read()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            f.truncate(complete)
    return {str(record["id"]) for record in read_jsonl(out_path)}


def _seed(settings: GenerationSettings, ids: list[str]) -> int:
    """A batch's sampling seed depends on its ids, not on its position, so a resumed run samples the same way."""
    return (settings.seed * 1_000_003 + zlib.crc32("\0".join(ids).encode())) % 2**31


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


SORT_BLOCK = 512
"""Prompts are sorted by length within consecutive blocks of this many (16 batches of 32), not across the file: the
batches still pad little, and a run stopped early holds a sample of the whole file, not only its shortest prompts."""


def answer_order(records: list[dict[str, Any]], lengths: dict[str, int]) -> list[dict[str, Any]]:
    """The order prompts are answered in: the file's blocks of ``SORT_BLOCK`` in turn, each shortest first.

    Computed over every prompt, done or not, so a resumed run forms the same batches (and sampling seeds) as one
    that was never stopped: the answered prompts are a prefix of this order, in whole batches."""
    order = []
    for start in range(0, len(records), SORT_BLOCK):
        order += sorted(records[start : start + SORT_BLOCK], key=lambda record: lengths[record["id"]])
    return order


def generate_dataset(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts_path: str | Path,
    out_path: str | Path,
    settings: GenerationSettings,
    limit: int | None = None,
) -> int:
    """Answer those of the first ``limit`` prompts of the file that are not yet in ``out_path``, appending one line
    each; return how many.

    Each line records how it was generated (``generated_with``: target, token limit, sampling); resuming into a file
    written with other settings is an error rather than a silent mix."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = finished_ids(out_path)
    generated_with = _generated_with(model, settings)
    _check_same_settings(out_path, generated_with)
    records = read_prompts(prompts_path, limit, settings.turns)
    lengths = {record["id"]: len(prompt_ids(tokenizer, record["messages"])) for record in records}
    if settings.max_prompt_tokens is not None:
        kept = [record for record in records if lengths[record["id"]] <= settings.max_prompt_tokens]
        if len(kept) < len(records):
            logger.info(
                "skipped %d of %d prompts longer than max_prompt_tokens=%d",
                len(records) - len(kept),
                len(records),
                settings.max_prompt_tokens,
            )
        records = kept
    if settings.by_length:
        records = answer_order(records, lengths)
    todo = [record for record in records if record["id"] not in done]
    cut = 0
    with open(out_path, "a", encoding="utf-8") as out, tqdm(total=len(todo), desc="self-distilling") as bar:
        for start in range(0, len(todo), settings.batch_size):
            batch = todo[start : start + settings.batch_size]
            ids = [record["id"] for record in batch]
            conversations = answer_turns(model, tokenizer, batch, settings, _seed(settings, ids))
            lines = []
            for record, (messages, answer) in zip(batch, conversations):
                line = {
                    **{key: value for key, value in record.items() if key != "later_questions"},
                    "messages": messages,
                    "answer_token_ids": answer.token_ids,
                    "finished": answer.finished,
                    "generated_with": generated_with,
                }
                lines.append(json.dumps(line, ensure_ascii=False) + "\n")
                cut += not answer.finished
            out.write("".join(lines))
            out.flush()
            os.fsync(out.fileno())
            bar.update(len(batch))
    if cut:
        logger.info(
            "%d of %d answers were cut at max_new_tokens=%d (kept with finished=false: their end-of-turn token is "
            "not trained on)",
            cut,
            len(todo),
            settings.max_new_tokens,
        )
    return len(todo)


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
    histories = [list(record["messages"]) for record in records]
    last: list[Answer | None] = [None] * len(records)
    pending = list(range(len(records)))
    for turn in range(settings.turns):
        if not pending:
            break
        answers = answer_batch(model, tokenizer, [histories[i] for i in pending], settings, seed + turn)
        asking = []
        for index, answer in zip(pending, answers):
            histories[index].append({"role": "assistant", "content": answer.text})
            last[index] = answer
            questions = records[index].get("later_questions", [])
            if not answer.finished or turn >= len(questions) or turn + 1 >= settings.turns:
                continue
            asked = histories[index] + [{"role": "user", "content": questions[turn]}]
            limit = settings.max_prompt_tokens
            if limit is None or len(prompt_ids(tokenizer, asked)) <= limit:
                histories[index] = asked
                asking.append(index)
        pending = asking
    return list(zip(histories, last))


def _generated_with(model: PreTrainedModel, settings: GenerationSettings) -> dict[str, Any]:
    """What decides an answer: the target, the token limit and, when sampling, the sampling settings (the batch size
    too, since a batch's seed depends on its ids)."""
    record: dict[str, Any] = {"target": str(model.config.name_or_path), "max_new_tokens": settings.max_new_tokens}
    if settings.turns > 1:
        record["turns"] = settings.turns
    if settings.temperature > 0:
        record.update(
            temperature=settings.temperature, top_p=settings.top_p, seed=settings.seed, batch_size=settings.batch_size
        )
    else:
        record["temperature"] = 0.0
    return record


def _spelled_alike(generated_with: dict[str, Any]) -> dict[str, Any]:
    """The record with a target folder named by its resolved path: ``tiny4`` and ``/abs/tiny4`` are one target."""
    target = str(generated_with.get("target", ""))
    if target and Path(target).exists():
        return {**generated_with, "target": str(Path(target).resolve())}
    return generated_with


def _check_same_settings(out_path: Path, generated_with: dict[str, Any]) -> None:
    """A resumed run must answer the rest the way the lines already written were answered."""
    if not out_path.exists():
        return
    earlier = next((r["generated_with"] for r in reversed(read_jsonl(out_path)) if "generated_with" in r), None)
    if earlier is None or _spelled_alike(earlier) == _spelled_alike(generated_with):
        return
    changed = [
        f"{key}: {earlier.get(key)!r} -> {generated_with.get(key)!r}"
        for key in sorted(set(earlier) | set(generated_with))
        if earlier.get(key) != generated_with.get(key)
    ]
    raise ValueError(
        f"{out_path} was generated with other settings ({'; '.join(changed)}); resuming would mix two kinds of "
        "answers in one file. Use the same settings to finish it, or write to another --out."
    )
