"""The chat shapes training data comes in (ShareGPT, OpenAI messages, prompt/response pairs), read as OpenAI messages.

Shared by the data loader, the generator's prompt reader, ShareGPT's cleaning and the packed answers' join.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FORMATS = ("auto", "sharegpt", "messages", "prompt_response")
CHAT_ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
ACCEPTED_SHAPES = (
    "ShareGPT {'conversations': [{'from': 'human'|'gpt'|'system', 'value': ...}]}, "
    "OpenAI messages {'messages': [{'role': ..., 'content': ...}]}, "
    "or prompt/response pairs {'prompt': ..., 'response': ...}"
)


class DataError(ValueError):
    """The data cannot be turned into training samples; the message says what was found and how to fix it."""


def require_file(path: str | Path, what: str, fix: str = "") -> None:
    """A DataError unless ``path`` is a file: one that is missing, or a folder given where its files belong."""
    if Path(path).is_dir():
        raise DataError(f"{what} {path} is a folder; give the file(s) in it")
    if not Path(path).is_file():
        raise DataError(f"{what} not found: {path}{fix}")


def detect_format(record: dict[str, Any], source: str) -> str:
    """Name the shape of one record (``sharegpt``, ``messages`` or ``prompt_response``) or fail naming its keys."""
    present = {key for key, value in record.items() if value is not None}  # a JSON reader fills absent keys with None
    if "conversations" in present:
        return "sharegpt"
    if "messages" in present:
        return "messages"
    if "prompt" in present and "response" in present:
        return "prompt_response"
    raise DataError(f"{source}: unknown record shape with keys {sorted(present)}; expected {ACCEPTED_SHAPES}.")


def to_messages(record: dict[str, Any], fmt: str) -> list[dict[str, str]]:
    """Normalise one record of a known shape to OpenAI messages ``[{role, content}]``; content given as a list of
    parts (``[{"type": "text", "text": ...}]``) is joined."""
    if fmt == "messages":
        return [text_message(m["role"], m["content"]) for m in _turns(record, "messages", ("role", "content"))]
    if fmt == "prompt_response":
        return [text_message("user", record["prompt"]), text_message("assistant", record["response"])]
    if fmt == "sharegpt":
        messages = []
        for turn in _turns(record, "conversations", ("from", "value")):
            if not isinstance(turn["from"], str) or turn["from"] not in SHAREGPT_ROLES:
                raise DataError(f"ShareGPT turn has from={turn['from']!r}; expected one of {sorted(SHAREGPT_ROLES)}.")
            messages.append(text_message(SHAREGPT_ROLES[turn["from"]], turn["value"]))
        return messages
    raise DataError(f"format={fmt!r} is not one of {FORMATS}.")


def _turns(record: dict[str, Any], key: str, fields: tuple[str, str]) -> list[dict[str, Any]]:
    """The turns under ``key``, each checked for its two ``fields``: a turn of the other shape (SpecForge writes
    ``role``/``content`` turns under ``conversations``) names the key its shape is read under."""
    turns = record.get(key)
    if not isinstance(turns, list):
        raise DataError(f"{key!r} holds a {type(turns).__name__}; expected a list of turns with {list(fields)}")
    other_key, other_fields = (
        ("messages", {"role", "content"}) if key == "conversations" else ("conversations", {"from", "value"})
    )
    for turn in turns:
        if not isinstance(turn, dict) or not set(fields) <= turn.keys():
            found = sorted(turn) if isinstance(turn, dict) else type(turn).__name__
            hint = (
                f"; turns of {sorted(other_fields)} are read under {other_key!r}" if other_fields <= set(found) else ""
            )
            raise DataError(f"a turn under {key!r} has {found}; expected {list(fields)}{hint}")
    return turns


def text_message(role: Any, content: Any) -> dict[str, str]:
    """One OpenAI message, its content joined when given as text parts, or a DataError naming what it holds."""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        content = "".join(str(p.get("text", "")) for p in content)
    if not isinstance(role, str) or not isinstance(content, str):
        raise DataError(
            f"a turn has role={role!r} and content of type {type(content).__name__} ({str(content)[:40]!r}); "
            "expected a role name and text (or a list of text parts)"
        )
    if role not in CHAT_ROLES:
        raise DataError(f"a turn has role={role!r}; expected one of {list(CHAT_ROLES)}")
    return {"role": role, "content": content}


def _first_user_turn(messages: list[dict[str, str]]) -> int | None:
    return next((i for i, m in enumerate(messages) if m["role"] == "user"), None)


def first_question(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The turns up to and including the first user turn (a system prompt and the question), or [] without one.
    An answer before it (ShareGPT records that open with the assistant) is another model's text and is left out."""
    first_user = _first_user_turn(messages)
    return [] if first_user is None else [m for m in messages[: first_user + 1] if m["role"] != "assistant"]


def from_first_question(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation less the answers before its first user turn (system turns kept), or [] without one."""
    first_user = _first_user_turn(messages)
    return [] if first_user is None else first_question(messages) + messages[first_user + 1 :]


def later_questions(messages: list[dict[str, str]]) -> list[str]:
    """The user turns after the first one, in order: what a multi-turn regeneration asks after its first answer."""
    first_user = _first_user_turn(messages)
    return [] if first_user is None else [m["content"] for m in messages[first_user + 1 :] if m["role"] == "user"]


def answered_conversation(messages: list[dict[str, str]], answers: list[str]) -> list[dict[str, str]]:
    """The conversation a regeneration of ``messages`` wrote: its first question, then each answer followed by the
    next user turn, ending in the last answer; the original assistant turns are not kept."""
    questions = later_questions(messages)
    if not first_question(messages) or len(answers) - 1 > len(questions):
        raise DataError(
            f"{len(answers)} answers need a first question and {len(answers) - 1} later user turns; the conversation "
            f"has {len(questions)} later user turns"
        )
    return interleave(first_question(messages), questions[: len(answers) - 1], answers)


def interleave(first: list[dict[str, str]], questions: list[str], answers: list[str]) -> list[dict[str, str]]:
    """``first`` (the first question), then each answer followed by the next of ``questions`` while any are left:
    one question per answer asks the next turn, one fewer ends in the last answer."""
    turns = list(first)
    for number, answer in enumerate(answers):
        turns.append({"role": "assistant", "content": answer})
        if number < len(questions):
            turns.append({"role": "user", "content": questions[number]})
    return turns


ANSWER_IDS_FIX = (
    "expected a list of the target's token ids (ints from 0 up to its vocabulary), as `specheads data generate` "
    "writes them; regenerate the answer, or remove answer_token_ids to train on its text re-encoded"
)
FINISHED_FIX = (
    "expected true, false (the answer was cut at max_new_tokens) or null, as `specheads data generate` writes it; "
    "write it as a JSON boolean, or remove finished to train the answer's end-of-turn token"
)


def answer_ids_problem(value: Any, vocab_size: int | None = None) -> str | None:
    """What a record's ``answer_token_ids`` holds that is not a token id below ``vocab_size`` (None: nothing)."""
    if not isinstance(value, list):
        return None if value is None else f"a {type(value).__name__} ({str(value)[:40]!r})"
    for position, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int):
            return f"a {type(token).__name__} ({str(token)[:40]!r}) at position {position}"
        if not 0 <= token < (vocab_size or math.inf):
            limit = f" (the tokenizer has {vocab_size} ids)" if vocab_size else ""
            return f"id {token} at position {position}{limit}"
    return None


def answer_fields_problem(answer_ids: Any, finished: Any, vocab_size: int | None = None) -> str | None:
    """What a self-distilled record's ``answer_token_ids`` or ``finished`` holds that training cannot read, and the
    fix (None: nothing)."""
    problem = answer_ids_problem(answer_ids, vocab_size)
    if problem is not None:
        return f"answer_token_ids holds {problem}; {ANSWER_IDS_FIX}"
    if finished is None or isinstance(finished, bool):
        return None
    return f"finished holds {json.dumps(finished, default=str)[:40]}; {FINISHED_FIX}"


def answer_fields(record: dict[str, Any]) -> tuple[Any, Any]:
    """A record's (answer_token_ids, finished), whole-number floats read as ids: the JSON reader reads a column's
    ints as floats when one record holds a float."""
    answer_ids, finished = record.get("answer_token_ids"), record.get("finished")
    if isinstance(answer_ids, list):
        answer_ids = [int(t) if isinstance(t, float) and t.is_integer() else t for t in answer_ids]
    return answer_ids, finished
