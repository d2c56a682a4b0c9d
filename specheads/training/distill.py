"""Self-distillation: the frozen target answers a prompt file, and heads are then trained on its own outputs.

Medusa-2 (https://arxiv.org/abs/2401.10774, section 2.3.2) and EAGLE (https://arxiv.org/abs/2401.15077) both train
on the target's own responses: a draft head is judged by how often it agrees with the target, not with whoever
wrote a dataset's reference answers.

Output is JSONL in messages format, one complete line per conversation, flushed after every batch. A rerun reads
the ids already written and answers only the rest; a line cut short by a kill is removed first, so a killed run
loses at most the batch in flight.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class GenerationSettings:
    """How the target answers. ``temperature == 0`` means greedy; sampling is seeded per batch (see ``_seed``)."""

    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    batch_size: int = 8


def read_prompts(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The first ``limit`` records of a prompt file as ``{"id", "messages", ...}``, ready for the chat template.

    A record holds ``id`` and either ``prompt`` (one user turn) or ``messages`` (trailing assistant turns are
    dropped: they are what the target answers again).
    """
    records = []
    for line_number, record in enumerate(read_jsonl(path), start=1):
        if limit is not None and len(records) >= limit:
            break
        if "id" not in record:
            raise ValueError(f"{path}:{line_number}: record has no 'id' (keys {sorted(record)}); resuming needs ids.")
        if "messages" in record:
            messages = [{"role": m["role"], "content": m["content"]} for m in record["messages"]]
            while messages and messages[-1]["role"] == "assistant":
                messages.pop()
        elif "prompt" in record:
            messages = [{"role": "user", "content": record["prompt"]}]
        else:
            raise ValueError(f"{path}:{line_number}: record needs 'prompt' or 'messages', found keys {sorted(record)}.")
        if not messages:
            raise ValueError(f"{path}:{line_number}: no user turn to answer.")
        out = {"id": str(record["id"]), "messages": messages}
        if "source" in record:
            out["source"] = record["source"]
        records.append(out)
    return records


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of a JSONL file (a trailing line without newline, cut by a kill, is ignored)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.endswith("\n") and line.strip()]


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


@torch.no_grad()
def answer_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: list[list[dict[str, str]]],
    settings: GenerationSettings,
    seed: int = 0,
) -> list[str]:
    """The target's answers to a batch of conversations (left-padded, one ``generate`` call, cut at EOS)."""
    prompts = [
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        for messages in conversations
    ]
    token_lists = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids, attention_mask = left_pad(token_lists, pad_id)
    eos_ids = stop_ids(model, tokenizer)
    sampling = settings.temperature > 0
    if sampling:
        torch.manual_seed(seed)
    output = model.generate(
        input_ids=input_ids.to(model.device),
        attention_mask=attention_mask.to(model.device),
        max_new_tokens=settings.max_new_tokens,
        do_sample=sampling,
        temperature=settings.temperature if sampling else None,
        top_p=settings.top_p if sampling else None,
        top_k=None,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
    )
    answers = []
    for row in output[:, input_ids.shape[1] :].tolist():
        cut = next((i for i, token in enumerate(row) if token in eos_ids), len(row))
        answers.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
    return answers


def generate_dataset(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts_path: str | Path,
    out_path: str | Path,
    settings: GenerationSettings,
    limit: int | None = None,
) -> int:
    """Answer the first ``limit`` prompts not yet in ``out_path``, appending one line each; return how many."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = finished_ids(out_path)
    todo = [record for record in read_prompts(prompts_path, limit) if record["id"] not in done]
    with open(out_path, "a", encoding="utf-8") as out, tqdm(total=len(todo), desc="self-distilling") as bar:
        for start in range(0, len(todo), settings.batch_size):
            batch = todo[start : start + settings.batch_size]
            ids = [record["id"] for record in batch]
            answers = answer_batch(model, tokenizer, [r["messages"] for r in batch], settings, _seed(settings, ids))
            lines = []
            for record, answer in zip(batch, answers):
                messages = record["messages"] + [{"role": "assistant", "content": answer}]
                lines.append(json.dumps({**record, "messages": messages}, ensure_ascii=False) + "\n")
            out.write("".join(lines))
            out.flush()
            os.fsync(out.fileno())
            bar.update(len(batch))
    return len(todo)
