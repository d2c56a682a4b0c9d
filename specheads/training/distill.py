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
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.training.answering import GenerationSettings, answer_turns, prompt_ids
from specheads.training.chat_format import DataError, first_question, later_questions, text_message, to_messages

logger = logging.getLogger(__name__)


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
    for line_number, record in numbered_jsonl(path):
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
            try:
                messages = [text_message("user", record["prompt"])]
            except DataError as err:
                raise ValueError(f"{path}:{line_number}: unreadable prompt ({err}).") from None
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
        raise ValueError(
            f"{path} holds no prompt records; expected JSONL lines with 'id' and 'prompt', 'messages' or "
            "'conversations'."
        )
    if multi_turn:
        logger.warning(
            "%d of %d prompt records hold several user turns; only the first is answered (--turns N answers up to N, "
            "each after the target's own earlier answers)",
            multi_turn,
            len(records),
        )
    return records


def numbered_jsonl(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """Every non-blank line of an input JSONL file (a byte-order mark allowed) with its line number, the last one
    too (with or without a final newline); an unreadable line, a JSON array or a file that is not text is an error
    naming it."""
    records = []
    with open(path, encoding="utf-8-sig") as f:
        try:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                if not records and line.lstrip().startswith("["):
                    raise ValueError(
                        f"{path} is a JSON array; expected JSONL, one record per line (for ShareGPT's JSON file, "
                        f"`specheads data sharegpt --source {path} --out FILE.jsonl` writes its conversations as JSONL)"
                    )
                try:
                    records.append((number, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number}: not a JSON record ({err}).") from None
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{path} is not UTF-8 text ({err.reason}); expected JSONL (decompress a .gz first)"
            ) from None
    return records


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of an output JSONL file; a last line without a newline is kept when it is a whole JSON
    record and ignored when it is a fragment (cut by a kill). An unreadable complete line is an error naming it."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                if not line.endswith("\n"):
                    continue
                raise ValueError(
                    f"{path}:{number}: not a JSON record ({err}); the file was edited or damaged: fix or delete that "
                    "line (its prompt is answered again), or write to another --out."
                ) from None
    return records


def check_output_file(out_path: str | Path, prompts_path: str | Path) -> None:
    """Refuse an ``--out`` that is not a ``data generate`` output to resume, before anything is loaded or changed:
    every record must carry an ``id`` and its ``messages``, and a trailing fragment must be the start of a record."""
    out_path = Path(out_path)
    if not out_path.exists():
        return
    if out_path.resolve() == Path(prompts_path).resolve():  # resuming would cut its last line
        raise ValueError(f"--out {out_path} is the prompt file; write the answers to another file")
    fix = "write to a new --out file (or delete this one to start over)"
    try:
        records = read_jsonl(out_path)
        tail = out_path.read_bytes()
    except UnicodeDecodeError:
        raise ValueError(
            f"--out {out_path} is not a `specheads data generate` output (not UTF-8 text); {fix}"
        ) from None
    for number, record in enumerate(records, start=1):
        if not (isinstance(record, dict) and "id" in record and isinstance(record.get("messages"), list)):
            raise ValueError(
                f"--out {out_path} is not a `specheads data generate` output (record {number} lacks 'id' or "
                f"'messages'); {fix}"
            )
    fragment = tail[tail.rfind(b"\n") + 1 :].strip()
    if fragment and not fragment.startswith(b"{"):
        raise ValueError(f"--out {out_path} ends in a line that is not a JSON record; {fix}")


def finished_ids(out_path: Path) -> set[str]:
    """Ids already answered in ``out_path`` (checked by ``check_output_file``); a trailing fragment cut by a kill is
    removed, and a whole last record missing its newline gets one, so new lines append cleanly."""
    if not out_path.exists():
        return set()
    records = read_jsonl(out_path)
    with open(out_path, "rb+") as f:
        data = f.read()
        complete = data.rfind(b"\n") + 1
        if data[complete:].strip():
            try:
                json.loads(data[complete:])
                f.write(b"\n")
            except json.JSONDecodeError:
                f.truncate(complete)
    return {str(record["id"]) for record in records}


def _seed(settings: GenerationSettings, ids: list[str]) -> int:
    """A batch's sampling seed depends on its ids, not on its position, so a resumed run samples the same way."""
    return (settings.seed * 1_000_003 + zlib.crc32("\0".join(ids).encode())) % 2**31


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
    check_output_file(out_path, prompts_path)
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


def _generated_with(model: PreTrainedModel, settings: GenerationSettings) -> dict[str, Any]:
    """What decides an answer: the target and its dtype (named where it is not fp32, so that files written before
    the dtype was recorded still resume), the token limit and, when sampling, the sampling settings (the batch size
    too, since a batch's seed depends on its ids)."""
    record: dict[str, Any] = {"target": str(model.config.name_or_path), "max_new_tokens": settings.max_new_tokens}
    if model.dtype != torch.float32:
        record["dtype"] = str(model.dtype).removeprefix("torch.")
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
