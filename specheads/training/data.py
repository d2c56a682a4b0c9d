"""Chat datasets for training draft heads: read common JSON shapes, render with the target's chat template, mask.

Draft heads learn to predict what the *target* says, so the loss covers assistant tokens only: the assistant's
text and the end-of-turn token that closes it (the target must learn when to stop), never the template's role
header (``<|im_start|>assistant\\n``), the system prompt or the user's turns.

The mask is found on characters, not tokens: each assistant turn's character span is read off incremental renders
of the template (``messages[:i]`` + generation prompt, then ``messages[:i+1]``), the full render is tokenized once
with an offset mapping, and a token is trained only when all of its characters lie inside a span. A token that
merges the header's last character with the answer's first ones (SmolLM2's ``\\n`` after ``assistant`` with an
answer's leading ``\\n`` or space, as one ``ĊĊ`` or ``ĊĠ``) is template in part, and the target never writes it (its
prompt ends at the header): it carries no loss, and the answer's loss starts at the next token.

Self-distilled records (``specheads data generate``) also carry the target's own ids for the final answer
(``answer_token_ids``), used instead of re-encoding its text, and ``finished``: an answer cut at ``max_new_tokens``
keeps its end-of-turn token in the input but not in the loss (the target did not stop there).
"""

from __future__ import annotations

import gzip
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import datasets
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from specheads.training.chat_format import (
    ACCEPTED_SHAPES,
    FORMATS,
    DataError,
    answer_fields,
    answer_fields_problem,
    detect_format,
    from_first_question,
    require_file,
    to_messages,
)

logger = logging.getLogger(__name__)


@dataclass
class DataConfig:
    """Where the training conversations come from and how they are cut. Plain types only (an OmegaConf schema).

    ``eval_size`` (a number of samples) wins over ``eval_fraction`` when set; both are held out with ``seed``.
    """

    paths: list[str] = field(default_factory=list)
    format: str = "auto"
    max_length: int = 1024
    eval_fraction: float = 0.05
    eval_size: int | None = None
    seed: int = 0
    max_samples: int | None = None
    num_proc: int | None = None


SHAPE_FIELDS = {"sharegpt": ("conversations",), "messages": ("messages",), "prompt_response": ("prompt", "response")}
"""The fields a record of each shape holds (``chat_format.to_messages`` reads them)."""


def _checked_messages(record: dict[str, Any], fmt: str, source: str, detected: bool) -> list[dict[str, str]]:
    present = sorted(k for k, v in record.items() if v is not None)  # a JSON reader fills absent keys with None
    missing = [key for key in SHAPE_FIELDS.get(fmt, ()) if key not in present]
    if missing:
        shape, fix = (
            (f"the {fmt} shape of the file's first record", "give each shape its own file")
            if detected
            else (f"the {fmt} shape the format setting names", "format auto reads each file's own shape")
        )
        raise DataError(
            f"{source}: a record does not have {shape} (no {missing}; fields present: {present}); {fix} "
            f"(accepted: {ACCEPTED_SHAPES})."
        )
    try:
        return to_messages(record, fmt)
    except DataError as err:
        raise DataError(f"{source}: {err}") from None


CONVERSATION_FEATURES = datasets.Features(
    {
        "messages": datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")}),
        "answer_token_ids": datasets.List(datasets.Value("int64")),  # None: re-encode the answer's text
        "finished": datasets.Value("bool"),  # None: the file does not say (taken as finished)
    }
)


def _conversation(record: dict[str, Any], fmt: str, source: str, detected: bool, vocab: int | None) -> dict[str, Any]:
    messages = _checked_messages(record, fmt, source, detected)
    if not messages:
        raise DataError(f"{source}: the conversation has no turns; expected at least a user turn and an answer")
    # an answer before any question (ShareGPT records often open with one) has no prompt to be drafted from
    messages = from_first_question(messages)
    if not messages:
        raise DataError(f"{source}: the conversation has no user turn; expected a user turn before an answer")
    answer_ids, finished = answer_fields(record)
    problem = answer_fields_problem(answer_ids, finished, vocab)
    if problem is not None:
        raise DataError(f"{source}: {problem}")
    if (answer_ids is not None or finished is not None) and (not messages or messages[-1]["role"] != "assistant"):
        raise DataError(f"{source}: answer_token_ids/finished describe the last turn, which is not an answer")
    return {"messages": messages, "answer_token_ids": answer_ids, "finished": finished}


def _record_label(path: str, record: dict[str, Any], row: int, packed: bool) -> str:
    """Where a record is in its file: its number, or in a packed answers file (joined, some left out) its id."""
    return f"{path} (id {record['id']!r})" if packed else f"{path} (record {row + 1})"


def _read_json_records(path: Path) -> datasets.Dataset:
    """A JSON or JSONL file as a dataset, or a DataError naming the file (and for JSONL, the first line that is not
    a JSON record) instead of the JSON reader's chained tracebacks."""
    with _open_text(path) as handle:
        empty = not any(line.strip() for line in handle)
    if empty:
        raise DataError(f"{path} holds no records.")
    try:
        raw = datasets.load_dataset("json", data_files=str(path), split="train")
    except Exception as err:  # noqa: BLE001 - datasets wraps the JSON reader's errors in several types
        raise DataError(f"{path}: {_first_bad_line(path) or f'not readable as JSON or JSONL ({err})'}") from None
    if len(raw) == 0:
        raise DataError(f"{path} holds no records.")
    return raw


def _first_bad_line(path: Path) -> str | None:
    """Where a JSONL file stops being one JSON object per line (None for a JSON file that is one document), else the
    first line whose answer fields the reader could not take."""
    field_problem = None
    with _open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                return None if number == 1 and line.lstrip().startswith("[") else f"line {number}: {err}"
            if not isinstance(record, dict):
                return f"line {number}: found a JSON {type(record).__name__}; expected one JSON object per line"
            problem = None if field_problem else answer_fields_problem(*answer_fields(record))
            field_problem = field_problem or (problem and f"line {number}: {problem}")
    return field_problem


def _open_text(path: Path) -> IO[str]:
    """A data file's text, decompressed when its name ends in ``.gz`` (as the JSON reader reads it)."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="replace")
    return path.open(encoding="utf-8-sig", errors="replace")


def load_conversations(cfg: DataConfig, vocab_size: int | None = None) -> datasets.Dataset:
    """Read every file in ``cfg.paths`` (JSON or JSONL) into one dataset with columns ``messages`` and the
    self-distillation fields ``answer_token_ids`` (each id below ``vocab_size`` when given) and ``finished`` (None
    where a file has none)."""
    from specheads.training.answers import packed_answers_dataset  # it imports this module

    if cfg.format not in FORMATS:
        raise DataError(f"data format={cfg.format!r} is not one of {FORMATS}.")
    if not cfg.paths:
        raise DataError("no data files given: set data.paths to one or more JSON/JSONL files.")
    parts = []
    for path in cfg.paths:
        require_file(path, "data file")
        try:
            joined = packed_answers_dataset(Path(path))
            raw = joined if joined is not None else _read_json_records(Path(path))
        except (OSError, EOFError, UnicodeDecodeError) as err:  # a .gz file that is not gzip, cut short or not text
            raise DataError(
                f"{path}: unreadable ({err}); expected a UTF-8 JSON or JSONL file, gzipped or not"
            ) from None
        fmt = "messages" if joined is not None else cfg.format
        detected = fmt == "auto"
        fmt = detect_format(raw[0], path) if detected else fmt
        parts.append(
            raw.map(
                lambda record, row, fmt=fmt, path=path, detected=detected, packed=joined is not None: _conversation(
                    record, fmt, _record_label(path, record, row, packed), detected, vocab_size
                ),
                with_indices=True,
                remove_columns=raw.column_names,
                features=CONVERSATION_FEATURES,
                num_proc=cfg.num_proc,
                desc=f"reading {Path(path).name} ({fmt})",
            )
        )
    conversations = datasets.concatenate_datasets(parts)
    if cfg.max_samples is not None:
        conversations = conversations.select(range(min(cfg.max_samples, len(conversations))))
    return conversations


def _end_of_turn_tokens(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    special = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    return sorted(special | set(tokenizer.all_special_tokens), key=len, reverse=True)


def assistant_char_spans(
    messages: list[dict[str, str]], tokenizer: PreTrainedTokenizerBase
) -> tuple[str, list[tuple[int, int]]]:
    """Render a conversation; return the text and the ``[start, end)`` character span of each assistant turn.

    A span starts after the assistant header (the generation prompt) and ends after the first special token that
    follows, i.e. the end-of-turn token (``<|im_end|>``). Templates that rewrite earlier turns when later ones are
    added (the prefix renders do not agree with the full render) are rejected: their mask would be wrong.
    """
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    end_tokens = _end_of_turn_tokens(tokenizer)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        through_turn = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (through_turn.startswith(prompt) and text.startswith(through_turn)):
            raise DataError(
                "the chat template does not render conversations incrementally (the render of the first turns is "
                "not a prefix of the full render), so assistant tokens cannot be located; use a template that "
                "renders earlier turns unchanged."
            )
        turn = through_turn[len(prompt) :]
        content_at = turn.find(message["content"])  # special-token text inside the answer does not end the turn
        after = content_at + len(message["content"]) if content_at >= 0 else 0
        hits = [(turn.find(tok, after), tok) for tok in end_tokens if tok in turn[after:]]
        end = len(through_turn) if not hits else len(prompt) + min(hits)[0] + len(min(hits)[1])
        spans.append((len(prompt), end))
    return text, spans


def tokenize_conversation(
    messages: list[dict[str, str]],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    answer_token_ids: list[int] | None = None,
    finished: bool | None = None,
) -> dict[str, Any]:
    """Token ids and the assistant-only loss mask of one conversation, truncated to ``max_length`` tokens.

    ``answer_token_ids``: the target's own ids for the last turn's text, used as they are; ``finished=False``: the
    last answer was cut, so the end-of-turn token the template closes it with carries no loss."""
    text, spans = assistant_char_spans(messages, tokenizer)
    exact = answer_token_ids is not None or finished is False
    content = messages[-1]["content"] if exact else ""
    at = text.find(content, spans[-1][0], spans[-1][1]) if exact and spans else -1
    if at < 0 and exact and spans and content.strip() != content:  # templates that `trim` the answer
        content = content.strip()
        at = text.find(content, spans[-1][0], spans[-1][1]) if content else -1
    if at < 0:  # nothing to place (or a template that rewrites the answer): one encode of the whole render
        input_ids, loss_mask = _encode_masked(text, 0, spans, tokenizer)
    else:
        after = at + len(content)
        head_ids, head_mask = _encode_masked(text[:at], 0, spans, tokenizer)
        if answer_token_ids is None:
            answer_token_ids = tokenizer(content, add_special_tokens=False)["input_ids"]
        kept = spans if finished is not False else [*spans[:-1], (spans[-1][0], after)]
        tail_ids, tail_mask = _encode_masked(text[after:], after, kept, tokenizer)
        input_ids = head_ids + list(answer_token_ids) + tail_ids
        loss_mask = head_mask + [1] * len(answer_token_ids) + tail_mask
    truncated = len(input_ids) > max_length
    return {
        "input_ids": input_ids[:max_length],
        "loss_mask": loss_mask[:max_length],
        "truncated": truncated,
        "num_loss_tokens": sum(loss_mask[:max_length]),
    }


def _encode_masked(
    text: str, offset: int, spans: list[tuple[int, int]], tokenizer: PreTrainedTokenizerBase
) -> tuple[list[int], list[int]]:
    """Encode ``text`` (which starts at character ``offset`` of the render); mask the tokens that lie inside ``spans``,
    each from the previous token's end (offsets trimmed of whitespace would hide a space taken from the header)."""
    if not text:
        return [], []
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask, previous_end = [], 0
    for s, e in encoded["offset_mapping"]:
        first = offset + min(s, previous_end)
        mask.append(int(any(start <= first and offset + e <= end for start, end in spans)))
        previous_end = max(previous_end, e)
    return list(encoded["input_ids"]), mask


def tokenize_dataset(conversations: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, cfg: DataConfig):
    """Tokenize and mask every conversation; drop those left without an assistant token, log what was cut.

    Each sample keeps ``source``, its conversation's index in ``conversations``, so a caller can find a record's row
    after the drops."""
    if not tokenizer.is_fast:
        raise DataError(f"{type(tokenizer).__name__} is not a fast tokenizer; the loss mask needs offset mappings.")
    tokenized = conversations.map(
        lambda record, index: _tokenized_row(record, index, tokenizer, cfg.max_length),
        with_indices=True,
        remove_columns=conversations.column_names,
        num_proc=cfg.num_proc,
        desc="tokenizing",
    )
    total = len(tokenized)
    truncated = int(np.sum(tokenized["truncated"]))
    empty = np.asarray(tokenized["num_loss_tokens"]) == 0
    kept = tokenized.select(np.flatnonzero(~empty)).remove_columns(["truncated", "num_loss_tokens"])
    log = logger.warning if empty.any() else logger.info
    log(
        "%d samples: %d truncated to max_length=%d, %d dropped (no assistant token within max_length)",
        total,
        truncated,
        cfg.max_length,
        int(empty.sum()),
    )
    if len(kept) == 0:
        raise DataError(
            f"all {total} samples were dropped: {int(empty.sum())} had no assistant tokens within "
            f"max_length={cfg.max_length} ({truncated} were truncated). Raise max_length or check that the data "
            "holds assistant turns."
        )
    return kept


def _tokenized_row(
    record: dict[str, Any], index: int, tokenizer: PreTrainedTokenizerBase, max_length: int
) -> dict[str, Any]:
    try:
        row = tokenize_conversation(
            record["messages"], tokenizer, max_length, record["answer_token_ids"], record["finished"]
        )
    except Exception as err:  # noqa: BLE001 - chat templates raise ValueError, jinja2 errors, ...
        raise DataError(f"conversation {index + 1} of data.paths (files in order, records in order): {err}") from err
    return {**row, "source": index}


def split_train_eval(dataset: datasets.Dataset, cfg: DataConfig) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Hold out a seeded random subset for evaluation; both parts keep the file order."""
    n = len(dataset)
    if cfg.eval_size is not None:
        n_eval = cfg.eval_size
    else:
        n_eval = min(n - 1, max(1, math.ceil(n * cfg.eval_fraction))) if cfg.eval_fraction > 0 and n > 1 else 0
    if not 0 <= n_eval < n:
        raise DataError(f"eval split of {n_eval} samples leaves nothing to train on ({n} samples after filtering).")
    order = np.random.default_rng(cfg.seed).permutation(n)
    return dataset.select(np.sort(order[n_eval:])), dataset.select(np.sort(order[:n_eval]))


def build_datasets(cfg: DataConfig, tokenizer: PreTrainedTokenizerBase) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Train and eval datasets with columns ``input_ids`` and ``loss_mask`` (lists of ints) and ``source`` (the
    sample's record index across ``cfg.paths``, in order), deterministic."""
    return split_train_eval(tokenize_dataset(load_conversations(cfg, len(tokenizer)), tokenizer, cfg), cfg)


def collate(batch: list[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of samples into ``input_ids``, ``attention_mask``, ``loss_mask``, all ``(B, T)`` long."""
    width = max(len(sample["input_ids"]) for sample in batch)
    input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    loss_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, sample in enumerate(batch):
        length = len(sample["input_ids"])
        input_ids[row, :length] = torch.as_tensor(sample["input_ids"], dtype=torch.long)
        attention_mask[row, :length] = 1
        loss_mask[row, :length] = torch.as_tensor(sample["loss_mask"], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
