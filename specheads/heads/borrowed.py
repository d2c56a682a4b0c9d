"""Modules a head borrows from its frozen target instead of owning a copy.

EAGLE drafters reuse the target's token embedding and (EAGLE-1) its lm_head; Medusa heads may reuse the lm_head.
They are kept in a plain frozen dataclass, not registered as submodules, so they never appear in the head's
``parameters()`` or ``state_dict()``: they are never saved with the head, never trained, and never wrapped or
sharded by DDP, FSDP or DeepSpeed when only the head is handed to Accelerate.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from transformers import PreTrainedModel


class UnsupportedTargetError(ValueError):
    """The target architecture does not expose the parts a head needs."""


@dataclass(frozen=True)
class BorrowedModules:
    embed_tokens: nn.Embedding
    lm_head: nn.Linear


def borrow(target: PreTrainedModel) -> BorrowedModules:
    embed = target.get_input_embeddings()
    lm_head = target.get_output_embeddings()
    if embed is None or lm_head is None:
        raise UnsupportedTargetError(
            f"{type(target).__name__} does not expose input embeddings and an lm_head "
            "(get_input_embeddings/get_output_embeddings returned None); draft heads need both."
        )
    return BorrowedModules(embed_tokens=embed, lm_head=lm_head)


def decoder_layer_parts(target: PreTrainedModel) -> tuple[type[nn.Module], type[nn.Module]]:
    """The target's own decoder-layer and rotary-embedding classes, so drafters never copy modeling code."""
    decoder = target.get_decoder()
    layers = getattr(decoder, "layers", None)
    rotary = getattr(decoder, "rotary_emb", None)
    if layers is None or len(layers) == 0 or rotary is None:
        raise UnsupportedTargetError(
            f"{type(target).__name__}: expected a decoder with `.layers` and `.rotary_emb` (Llama-style, as in "
            "Llama, Qwen2/3, Mistral, SmolLM); found neither. EAGLE drafters build their layer from these classes."
        )
    return type(layers[0]), type(rotary)
