"""Prompts of the benchmark's task types, built from ShareGPT's own text: translation, summaries, passage QA.

Open chat does not teach a head the tasks where it accepts least on Spec-Bench (translating, summarising a long
passage, answering from one), and no licensed source of such prompts is installed. So each prompt here is cut from a
cleaned ShareGPT conversation by a fixed rule and the target answers it (``specheads data generate``):

- ``translate``: one German sentence of a user or assistant turn, "Translate German to English: ...";
- ``summarize``: an assistant turn of prose (no code) as the passage, "Summarize: ...";
- ``context_qa``: such a turn as the passage, then the question it answered, as a passage-QA prompt.

A prompt's id is ``<conversation id>#<task>:<turn>:<piece>``, so ``task_prompt`` rebuilds it from the conversation
alone: a packed answers file (``specheads.training.answers``) joins back without committing ShareGPT's text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator
from typing import Any

from specheads.training.chat_format import DataError, to_messages

TASKS = ("translate", "summarize", "context_qa")
TRANSLATE = "Translate German to English: "
_ID = re.compile(r"^(?P<conversation>.+)#(?P<task>[a-z_]+):(?P<turn>\d+):(?P<piece>\d+)$")
_WORDS = re.compile(r"[a-zäöüß]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-ZÄÖÜ0-9\"„])")
_GERMAN = frozenset(
    "der die das und ist nicht ich sie wir mit für auf ein eine einen dem den zu von sich auch es wie werden wird "
    "sind oder aber wenn dass nach bei noch nur kann über".split()
)  # no "im" (English chat's "I'm") and no "des" (French)
_ENGLISH = frozenset("the and is of to in that it for with as on are be this was by".split())
_FRENCH = frozenset("le la les et est une du pour dans pas que qui sur avec".split())
_NOT_PROSE = ("|", "#", "*", "`", "<", "{")
SENTENCE_WORDS = (6, 60)  # a translated sentence, as long as the benchmark's (8-64 words)
PASSAGE_WORDS = (150, 700)  # a passage to summarise or answer from (the benchmark's: 109-1,137 words)
QUESTION_WORDS = 60  # a passage-QA question longer than this is a task of its own, not a question


def is_german(text: str) -> bool:
    """Whether ``text`` reads as German: three or more German function words, a high share of them, and almost no
    English or French ones."""
    words = _WORDS.findall(text.lower())
    if len(words) < SENTENCE_WORDS[0]:
        return False
    german = [word for word in words if word in _GERMAN]
    foreign = sum(word in _ENGLISH or word in _FRENCH for word in words)
    return len(set(german)) >= 3 and len(german) / len(words) > 0.12 and foreign / len(words) < 0.05


def sentences(text: str) -> list[str]:
    """Every sentence of ``text`` in order, one line each with single spaces: a translation prompt's piece number
    counts in this list, so a change to which sentences qualify renumbers none."""
    found = []
    for line in text.splitlines():
        found.extend(" ".join(s.split()) for s in _SENTENCE_END.split(line.strip()) if s.strip())
    return found


def is_translatable(sentence: str) -> bool:
    """A German sentence of a benchmark-like length, not a table row, heading or markup."""
    if any(mark in sentence for mark in _NOT_PROSE):
        return False
    return SENTENCE_WORDS[0] <= len(sentence.split()) <= SENTENCE_WORDS[1] and is_german(sentence)


def german_sentences(text: str) -> list[tuple[int, str]]:
    """(piece number, sentence) of the translatable German sentences of ``text``."""
    return [(piece, sentence) for piece, sentence in enumerate(sentences(text)) if is_translatable(sentence)]


def is_passage(text: str) -> bool:
    """Whether an assistant turn is prose of a passage's length (no code, mostly English)."""
    words = len(text.split())
    if not PASSAGE_WORDS[0] <= words <= PASSAGE_WORDS[1] or "```" in text:
        return False
    lowered = _WORDS.findall(text.lower())
    return sum(word in _ENGLISH for word in lowered) / max(len(lowered), 1) > 0.12


def task_prompt(messages: list[dict[str, str]], task: str, turn: int, piece: int) -> str | None:
    """The prompt of ``task`` cut from turn ``turn`` (piece ``piece``) of a cleaned conversation's messages, or None
    when that turn does not give one (another version of the conversation)."""
    if not 0 <= turn < len(messages):
        return None
    text = messages[turn]["content"]
    if task == "translate":
        pieces = sentences(text)
        return f"{TRANSLATE}{pieces[piece]}" if piece < len(pieces) and is_translatable(pieces[piece]) else None
    is_answer = messages[turn]["role"] == "assistant"
    if piece != 0 or not is_answer or not is_passage(text):
        return None
    if task == "summarize":
        return "Summarize: " + " ".join(text.split())
    if task == "context_qa":
        question = messages[turn - 1]["content"].strip()
        if turn == 0 or messages[turn - 1]["role"] != "user" or not 0 < len(question.split()) <= QUESTION_WORDS:
            return None
        return f"{' '.join(text.split())}\n{question}"
    raise DataError(f"task {task!r} is not one of {TASKS}")


def parse_task_id(prompt_id: str) -> tuple[str, str, int, int] | None:
    """(conversation id, task, turn, piece) of a task prompt's id, or None for a plain conversation id."""
    match = _ID.match(prompt_id)
    if match is None or match["task"] not in TASKS:
        return None
    return match["conversation"], match["task"], int(match["turn"]), int(match["piece"])


def candidates(conversation: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(task, id, prompt) of every task prompt one cleaned conversation gives."""
    messages = to_messages(conversation, "sharegpt")
    for turn, entry in enumerate(messages):
        for piece, sentence in german_sentences(entry["content"]):
            yield "translate", f"{conversation['id']}#translate:{turn}:{piece}", f"{TRANSLATE}{sentence}"
        for task in ("summarize", "context_qa"):
            prompt = task_prompt(messages, task, turn, 0)
            if prompt is not None:
                yield task, f"{conversation['id']}#{task}:{turn}:0", prompt


def make_task_prompts(
    conversations: Iterable[dict[str, Any]], counts: dict[str, int], seed: int = 0
) -> tuple[list[dict[str, str]], dict[str, int]]:
    """A seeded sample of up to ``counts[task]`` prompts per task, at most one passage task per conversation (so a
    passage is summarised or questioned, not both); returns the prompts and how many candidates each task had (a
    conversation's passage counted under the task picked for it)."""
    unknown = sorted(set(counts) - set(TASKS))
    if unknown:
        raise DataError(f"unknown task(s) {unknown}; expected some of {TASKS}")
    found: dict[str, list[dict[str, str]]] = {task: [] for task in TASKS}
    for number, conversation in enumerate(conversations, 1):
        if not isinstance(conversation, dict) or not {"id", "conversations"} <= conversation.keys():
            found_keys = sorted(conversation) if isinstance(conversation, dict) else type(conversation).__name__
            raise DataError(
                f"record {number} has no ShareGPT id and conversations (found {found_keys}); expected a file "
                "written by `specheads data sharegpt`"
            )
        passages = []
        for task, prompt_id, prompt in candidates(conversation):
            record = {"id": prompt_id, "prompt": prompt, "task": task}
            (found[task] if task == "translate" else passages).append(record)
        if passages:
            pick = random.Random(f"{seed}:{conversation['id']}").choice(passages)
            found[pick["task"]].append(pick)
    chosen = []
    for task in TASKS:
        pool = found[task]
        random.Random(seed).shuffle(pool)
        chosen.extend(pool[: counts.get(task, 0)])
    return chosen, {task: len(found[task]) for task in TASKS}
