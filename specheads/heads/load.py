"""Strict loading of saved heads: every mismatch is an error that names what was expected and what was found."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedModel

from specheads.heads.base import CHECKPOINT_STATE_NAME, CONFIG_NAME, LORA_DIR, WEIGHTS_NAME, DraftHead
from specheads.heads.borrowed import UnsupportedTargetError
from specheads.heads.card import ADAPTER_KEY
from specheads.heads.config import FORMAT_VERSION, HeadConfigError, HeadLoadError, TargetRecord
from specheads.heads.draft_model import DraftModel
from specheads.heads.eagle import EagleHead
from specheads.heads.eagle3_checkpoint import is_eagle3_checkpoint, load_eagle3_checkpoint
from specheads.heads.eagle_config import check_vocab_maps
from specheads.heads.files import safetensors_header
from specheads.heads.medusa import MedusaHeads

HEADS: dict[str, type[DraftHead]] = {
    "medusa": MedusaHeads,
    "eagle": EagleHead,
    "draft_model": DraftModel,
}
"""The literal registry of head types, keyed by the ``head_type`` written into ``config.json``."""


ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
"""The LoRA adapter's weights as peft saves them by default; peft would also unpickle an ``adapter_model.bin``,
which ``load_lora_adapter`` refuses."""


def load_head(
    dir_or_hub_id: str | os.PathLike,
    target: PreTrainedModel,
    revision: str | None = None,
    trainable: bool = False,
    adapter_applied: bool = False,
) -> DraftHead:
    """Load a saved head onto ``target``, strictly, in eval mode with gradients off (inference use).

    ``trainable=True`` keeps train mode and the gradients of a freshly built head (to continue training from it), in
    fp32 whatever the target's dtype: optimizer updates to bf16 weights would mostly round away.
    A Llama EAGLE-3 draft checkpoint as SpecForge, vLLM and SGLang use it loads too (``specheads.heads.interop``).
    A Medusa-2 head's LoRA adapter (``lora/`` beside it) is not applied here: call ``apply_lora_adapter(target,
    folder)`` first, as ``specheads generate`` does, and pass on whether it applied one as ``adapter_applied``;
    loading such a head without ``adapter_applied=True`` warns.
    """
    folder = resolve_head_folder(dir_or_hub_id, revision)
    raw = _read_json(folder / CONFIG_NAME)
    adapter = required_adapter(folder, raw)
    if is_eagle3_checkpoint(raw):
        head = load_eagle3_checkpoint(folder, target, dtype=torch.float32 if trainable else None)
        if trainable:
            head.train().requires_grad_(True)
        return head
    meta = _checked_head_config(raw, folder / CONFIG_NAME)
    head_cls = HEADS[meta["head_type"]]
    config = head_cls.config_class.from_saved(meta["config"])
    actual = TargetRecord.from_model(target)
    if not trainable and adapter is not None and not adapter_applied:
        warnings.warn(
            f"{folder} was trained jointly with a LoRA adapter on the target (Medusa-2, in {adapter}), which this "
            "target does not carry: drafts will come from the unadapted target. Call target, applied = "
            f"specheads.heads.apply_lora_adapter(target, {str(folder)!r}) and pass adapter_applied=applied",
            stacklevel=2,
        )
    if adapter is not None and adapter_applied:
        actual.weight_probe = []  # its own Medusa-2 adapter, merged: other weights by design; names decide
    _check_target(config.target, actual, reads_features=head_cls is not DraftModel)
    builder = getattr(head_cls, "for_loading", head_cls)
    try:
        head = builder(config, target)
    except (HeadConfigError, HeadLoadError, UnsupportedTargetError):
        raise
    except (ValueError, TypeError, ZeroDivisionError, RuntimeError, StrictDataclassError) as err:
        # values of the right type that no module takes (a head_dim of 0, heads that do not divide the width)
        reason = str(err).strip().splitlines()
        raise HeadConfigError(
            f"{folder / CONFIG_NAME} describes a {head_cls.__name__} that cannot be built "
            f"({type(err).__name__}: {' '.join(line.strip() for line in reason[:3])}); the file was edited by hand or "
            "written by another tool: fix the value or re-save the head"
        ) from err
    if trainable:
        head.float()  # before loading, so an fp32 file's values arrive unrounded
    _load_weights_strict(head, folder / WEIGHTS_NAME)
    head.loaded_adapter = adapter
    head.to(target.device)
    if not trainable:
        head.eval()
        head.requires_grad_(False)
    return head


def head_type_of(folder: Path) -> str:
    """The head type a folder loads as, read from its config.json alone: ``eagle`` for a Llama EAGLE-3 checkpoint
    written by SpecForge, a serving engine or speculators (no specheads record), else the saved ``head_type``."""
    raw = _read_json(folder / CONFIG_NAME)
    return "eagle" if is_eagle3_checkpoint(raw) else _checked_head_config(raw, folder / CONFIG_NAME)["head_type"]


def read_head_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_NAME
    return _checked_head_config(_read_json(path), path)


def recorded_target_name(folder: Path) -> str:
    """The target a saved head's ``config.json`` records (empty for a head built in code without a name)."""
    meta = read_head_config(folder)
    target = meta["config"].get("target") if isinstance(meta["config"], dict) else None
    if not isinstance(target, dict):
        raise HeadLoadError(f"{folder / CONFIG_NAME} records no target (config.target); pass --target")
    return str(target.get("name_or_path") or "")


def _checked_head_config(meta: dict[str, Any], path: Path) -> dict[str, Any]:
    head_type = meta.get("head_type")
    if not isinstance(head_type, str) or head_type not in HEADS:
        raise HeadLoadError(f"{path}: unknown head_type {head_type!r}; expected one of {sorted(HEADS)}")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise HeadLoadError(
            f"{path}: format_version {version!r} is not supported by this specheads (expected {FORMAT_VERSION}); "
            "upgrade specheads or re-save the head"
        )
    if "config" not in meta:
        raise HeadLoadError(f"{path} has no 'config' section")
    return meta


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise HeadLoadError(f"{path.parent} has no {CONFIG_NAME}; expected a folder written by head.save_pretrained()")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise HeadLoadError(f"{path} is not valid JSON ({err}); the file is corrupt or truncated") from err
    if not isinstance(meta, dict):
        raise HeadLoadError(f"{path}: expected a JSON object, found a {type(meta).__name__}")
    return meta


def resolve_head_folder(dir_or_hub_id: str | os.PathLike, revision: str | None = None) -> Path:
    """The local folder of a head: ``dir_or_hub_id`` itself when it exists, else the Hub repo's snapshot (downloaded,
    or from the local Hub cache). Resolve once and pass the folder on, so every reader sees the same files."""
    path = Path(dir_or_hub_id)
    if path.exists():
        if not path.is_dir():
            raise HeadLoadError(f"{path} is a file; expected a head folder with {CONFIG_NAME} and {WEIGHTS_NAME}")
        return path
    if looks_like_a_path(str(dir_or_hub_id)):
        raise HeadLoadError(
            f"head folder {dir_or_hub_id} does not exist; expected a folder written by head.save_pretrained() (a "
            "finished training run's output folder): check the path"
        )
    from specheads.heads.hub import download_head

    return download_head(str(dir_or_hub_id), revision=revision)


def looks_like_a_path(text: str) -> bool:
    """A name that cannot be a Hub id (``OWNER/NAME`` or ``NAME``): absolute, relative to ``.``, ``..`` or ``~``, or
    with more than one ``/``."""
    return text.startswith(("/", ".", "~")) or text.count("/") > 1 or (os.sep != "/" and os.sep in text)


def _check_target(record: TargetRecord, actual: TargetRecord, reads_features: bool = True) -> None:
    """A head that reads the target's hidden states needs its sizes; a draft model reads only token ids, so any
    target with its vocabulary takes it (another size of its family, say), with a warning."""
    mismatches = record.shape_mismatches(actual)
    if mismatches and not reads_features:
        vocab = [m for m in mismatches if m.startswith("vocab_size")]
        if not vocab:
            warnings.warn(
                f"draft model was distilled for target {record.name_or_path!r} ({'; '.join(mismatches)}); it reads "
                f"only token ids and shares the vocabulary of {actual.name_or_path!r}, so it loads, but acceptance "
                "may be poor (the output stays lossless: the target verifies every token)",
                stacklevel=3,
            )
            return
        mismatches = vocab
    if mismatches:
        raise HeadConfigError(
            f"head was built for target {record.name_or_path!r}, which differs from the given target "
            f"{actual.name_or_path!r}: " + "; ".join(mismatches) + f"; load it with the target it was trained on "
            f"({record.name_or_path!r}), or train a head for this one"
        )
    other = record.other_weights(actual)
    if other:
        warnings.warn(
            f"head was trained for target {other}; the shapes match, so it loads, but acceptance may be poor (the "
            "output stays lossless: the target verifies every token)",
            stacklevel=3,
        )


def _load_weights_strict(head: DraftHead, path: Path) -> None:
    header = safetensors_header(path)
    saved = {name: shape for name, (shape, _) in header.items()}
    saved_kinds = {name: _stored_kind(code) for name, (_, code) in header.items()}
    state = head.state_dict()
    expected = {name: tuple(t.shape) for name, t in state.items()}
    tied = _tied_aliases(head, set(saved))
    missing = sorted(set(expected) - set(saved) - tied)
    unexpected = sorted(set(saved) - set(expected))
    if missing or unexpected:
        raise HeadLoadError(
            f"{path} does not match a {type(head).__name__} with this config: missing tensors {missing[:10]}"
            f"{' ...' if len(missing) > 10 else ''}, unexpected tensors {unexpected[:10]}"
            f"{' ...' if len(unexpected) > 10 else ''}"
        )
    wrong = [f"{n}: expected {expected[n]}, found {saved[n]}" for n in saved if saved[n] != expected[n]]
    if wrong:
        raise HeadLoadError(f"{path}: tensor shapes do not match the config: " + "; ".join(wrong[:10]))
    # another float width loads (a bf16 head into an fp32 target); another kind would be converted without a word
    kinds = [
        f"{n}: expected {_kind(state[n].dtype)}, found {saved_kinds[n]}"
        for n in saved
        if saved_kinds[n] != _kind(state[n].dtype)
    ]
    if kinds:
        raise HeadLoadError(f"{path}: tensor kinds do not match the head's: " + "; ".join(kinds[:10]))
    try:
        safetensors.torch.load_model(head, str(path), strict=True)
    except Exception as err:  # noqa: BLE001 - a truncated payload only shows up while reading tensor data
        raise HeadLoadError(f"{path} could not be read ({err}); the file is corrupt or truncated") from err
    if isinstance(head, EagleHead) and head.version == 3:  # EAGLE-1 drafts over the whole vocabulary
        check_vocab_maps(path, head.d2t, head.t2d.numel(), head.t2d)


def _kind(dtype: torch.dtype) -> str:
    return "bool" if dtype == torch.bool else "float" if dtype.is_floating_point else "integer"


def _stored_kind(code: str) -> str:
    """The kind of a safetensors dtype code (``F32``, ``BF16``, ``F8_E4M3``, ``I64``, ``U8``, ``BOOL``)."""
    return "bool" if code == "BOOL" else "float" if code.startswith(("F", "BF")) else "integer"


def _tied_aliases(head: DraftHead, saved: set[str]) -> set[str]:
    """Names that share storage with a saved name: safetensors stores a tied group once, under one of its names
    (``save_model`` keeps the alphabetically first, e.g. ``lm_head.weight`` over ``model.embed_tokens.weight``)."""
    groups: dict[tuple[int, int], list[str]] = {}
    for name, tensor in head.state_dict().items():
        groups.setdefault((tensor.untyped_storage().data_ptr(), tensor.storage_offset()), []).append(name)
    return {name for names in groups.values() if len(names) > 1 and saved & set(names) for name in names}


def refuse_checkpoint_as_head(folder: str | os.PathLike, option: str) -> None:
    """A training checkpoint given where a saved head is expected is an error that says which folder to pass
    instead: a checkpoint holds the optimizer's state and no ``config.json``, so it does not load as a head."""
    path = Path(folder)
    if (path / CHECKPOINT_STATE_NAME).is_file() and not (path / CONFIG_NAME).is_file():
        raise HeadLoadError(
            f"{option}={folder} is a training checkpoint, not a saved head; pass the run's output folder (written "
            f"when training finishes), or continue training from it with train.resume={folder}"
        )


def required_adapter(folder: Path, meta: dict[str, Any] | None = None) -> Path | None:
    """The LoRA adapter folder a head needs on its target (Medusa-2), or None. A ``config.json`` that records one
    (``lora_adapter``) without its ``lora/`` folder is an error: drafts would come from the bare target."""
    meta = _read_json(folder / CONFIG_NAME) if meta is None else meta
    adapter = folder / LORA_DIR
    if meta.get(ADAPTER_KEY) and not adapter.is_dir():
        raise HeadLoadError(
            f"{folder} is a Medusa-2 head trained with a LoRA adapter on its target ({CONFIG_NAME} says "
            f"{ADAPTER_KEY}: true), but its {LORA_DIR}/ folder is missing; copy the whole head folder again (its "
            f"{LORA_DIR}/ too), or retrain"
        )
    return adapter if adapter.is_dir() else None


def load_lora_adapter(target: PreTrainedModel, head_folder: str | os.PathLike) -> PreTrainedModel:
    """``apply_lora_adapter``'s model alone: ``target`` with the head's Medusa-2 adapter applied (unchanged without
    one); ``load_head`` then needs ``adapter_applied=True``."""
    return apply_lora_adapter(target, head_folder)[0]


def apply_lora_adapter(target: PreTrainedModel, head_folder: str | os.PathLike) -> tuple[PreTrainedModel, bool]:
    """Merge a Medusa-2 LoRA adapter saved beside a head (a folder or a Hub id) into ``target``; return the merged,
    frozen model and whether an adapter was applied (pass it to ``load_head`` as ``adapter_applied``).

    Heads without an adapter return ``target`` unchanged. Merging changes the target's weights in place: the
    adapted target is the model whose output decoding then reproduces exactly. A bf16/fp16 target keeps the adapter
    unmerged (injected into its layers, as in training): adding a small LoRA update to a low-precision weight would
    mostly round it away, so the merged model would not be the one that was trained.
    """
    adapter = required_adapter(resolve_head_folder(head_folder))
    if adapter is None:
        return target, False
    if not (adapter / ADAPTER_WEIGHTS_NAME).is_file():  # else peft falls back to unpickling adapter_model.bin
        found = sorted(p.name for p in adapter.iterdir())
        raise HeadLoadError(
            f"{adapter} has no {ADAPTER_WEIGHTS_NAME} (found {found}); specheads reads adapter weights only from "
            "safetensors (unpickling a .bin can run code). If you trust the adapter, convert it once: "
            "PeftModel.from_pretrained(target, LORA_DIR).save_pretrained(LORA_DIR, safe_serialization=True)"
        )
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(target, str(adapter))
    exact_merge = all(p.dtype == torch.float32 for p in target.parameters() if p.is_floating_point())
    model = adapted.merge_and_unload() if exact_merge else adapted.get_base_model()
    model.eval()
    model.requires_grad_(False)
    return model, True
