"""The prompts ``--tree auto`` calibrates each head on: Spec-Bench questions the benchmark does not measure, else the
first user turns of a chat file (by default the repository's self-distilled data)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from specheads.bench.questions import Question
from specheads.bench.settings import BenchSettings

DEFAULT_CALIBRATION_DATA = Path(__file__).resolve().parents[2] / "data" / "smollm2-135m-instruct-greedy-1k.jsonl"
"""The chats ``--tree auto`` calibrates on when too few questions are left unmeasured. It is in the repository's
checkout, not in an installed wheel: there ``--calibration-data`` names a file."""


def render_prompt(tokenizer: PreTrainedTokenizerBase, text: str, device: torch.device) -> torch.Tensor:
    """The first turn as a user message through the chat template: ``(1, T)`` ids."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids if torch.is_tensor(ids) else ids["input_ids"]
    return ids.to(device)


def calibration_data_file(settings: BenchSettings) -> Path | None:
    """``--calibration-data``, else the repository's self-distilled data where it exists (a checkout, not a wheel)."""
    if settings.calibration_data:
        path = Path(settings.calibration_data)
        if not path.is_file():
            raise FileNotFoundError(f"--calibration-data {path}: no such file; expected JSONL chats with 'messages'")
        return path
    return DEFAULT_CALIBRATION_DATA if DEFAULT_CALIBRATION_DATA.is_file() else None


def check_calibration_source(
    settings: BenchSettings, held_out: list[Question], measured: int, questions_path: Path
) -> None:
    """``--tree auto`` with nothing to calibrate on fails before the target loads, not with a tree chosen from no
    data (recorded as ``question_ids: []`` and cached for ``specheads generate``); so does a missing
    ``--calibration-data`` file, even where held-out questions leave it unread."""
    data = calibration_data_file(settings)
    if not any(tree == "auto" for tree in settings.trees or ["auto"]) or not settings.heads:
        return
    if settings.calibration_prompts < 1:
        raise ValueError(f"--tree auto calibrates on --calibration-prompts N >= 1, got {settings.calibration_prompts}")
    if held_out or data is not None:
        return
    raise ValueError(
        f"--tree auto calibrates each head on questions that are not measured, and {questions_path} has none left "
        f"after the {measured} measured ones; the fallback data/{DEFAULT_CALIBRATION_DATA.name} exists only in a "
        "checkout of the repository. Pass --calibration-data FILE (JSONL chats, as `specheads data generate` writes "
        "them), a question file with more questions, a lower --per-category, or a fixed --tree (e.g. chain:3)."
    )


def calibration_prompts(
    tokenizer: PreTrainedTokenizerBase,
    count: int,
    device: torch.device,
    held_out: list[Question],
    data: Path | None = DEFAULT_CALIBRATION_DATA,
) -> tuple[list[torch.Tensor], str, list[int]]:
    """Prompts for ``--tree auto``: Spec-Bench questions that are not measured (``held_out``), else the first user
    turns of the chats in ``data`` (by default the committed self-distilled data). The heads were trained on that
    data, so it overstates their acceptance (docs/results.md); held-out
    questions from the benchmark's own distribution do not. Returns the prompts, where they came from, and the ids of
    the questions used (none for the data)."""
    used = held_out[:count]
    texts, source = [q.prompt for q in used], "held-out Spec-Bench questions (not measured)"
    if len(texts) < count and data is not None and data.is_file():
        used, source = [], f"{data.name} ({'training data' if data == DEFAULT_CALIBRATION_DATA else 'chats'})"
        texts = _first_user_turns(data, count)
    return [render_prompt(tokenizer, t, device)[0] for t in texts], source, [q.question_id for q in used]


def _first_user_turns(path: Path, count: int) -> list[str]:
    texts = []
    with path.open() as f:
        for number, line in enumerate(f, 1):
            if len(texts) == count:
                break
            try:
                messages = json.loads(line)["messages"]
                texts.append(next(m["content"] for m in messages if m["role"] == "user"))
            except (json.JSONDecodeError, KeyError, TypeError, StopIteration):
                raise ValueError(
                    f"{path}, line {number}: expected a JSON chat with a 'messages' list holding a user turn "
                    '({"messages": [{"role": "user", "content": ...}, ...]})'
                ) from None
    return texts
