"""Modules a head borrows from its frozen target instead of owning a copy.

EAGLE drafters reuse the target's token embedding and (EAGLE-1) its lm_head; Medusa heads may reuse the lm_head.
They are kept in a plain frozen dataclass, not registered as submodules, so they never appear in the head's
``parameters()`` or ``state_dict()``: they are never saved with the head, never trained, and never wrapped or
sharded by DDP, FSDP or DeepSpeed when only the head is handed to Accelerate.

Some families finish their logits after the lm_head, in the causal-LM forward rather than in a module a head could
borrow: Gemma2/3 soft-cap them, Granite divides them by ``logits_scaling``, Cohere multiplies them by
``logit_scale``. A head's logits get the same finish (``LogitTransform``), so that they are on the target's scale:
its distillation targets, its sampled drafts q and its typical-acceptance entropy are then what the target's would
be, and a head's copied lm_head starts out computing the target's own distribution.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from specheads.heads.config import is_partitioned

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogitTransform:
    """What a causal-LM forward does to ``lm_head(hidden)``: multiply by ``scale``, then soft-cap at ``softcap``
    (``softcap * tanh(logits / softcap)``; None = no cap). The identity for Llama-style families."""

    scale: float = 1.0
    softcap: float | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _softcapped(config: PretrainedConfig) -> LogitTransform:
    return LogitTransform(softcap=config.final_logit_softcapping)


def _divided_by_logits_scaling(config: PretrainedConfig) -> LogitTransform:
    return LogitTransform(scale=1.0 / config.logits_scaling)


def _times_logit_scale(config: PretrainedConfig) -> LogitTransform:
    return LogitTransform(scale=config.logit_scale)


def _times_logits_scaling(config: PretrainedConfig) -> LogitTransform:
    return LogitTransform(scale=config.logits_scaling)


LOGIT_TRANSFORMS: dict[str, Callable[[PretrainedConfig], LogitTransform]] = {
    "gemma2": _softcapped,
    "gemma3_text": _softcapped,  # Gemma3ForCausalLM, and the text model of Gemma3ForConditionalGeneration
    "gemma4_text": _softcapped,
    "vaultgemma": _softcapped,
    "nanochat": _softcapped,
    "granite": _divided_by_logits_scaling,
    "granite_swa": _divided_by_logits_scaling,
    "granitemoe": _divided_by_logits_scaling,
    "granitemoe_swa": _divided_by_logits_scaling,
    "granitemoeshared": _divided_by_logits_scaling,
    "cohere": _times_logit_scale,
    "cohere2": _times_logit_scale,
    "cohere2_moe": _times_logit_scale,
    "hyperclovax": _times_logits_scaling,
}
"""Text-config ``model_type`` -> the finish its causal-LM forward gives ``lm_head``'s output (transformers 5.24's
``modeling_<family>.py``). A literal list: a field of the same name can mean the opposite in another family
(HyperCLOVA X multiplies by ``logits_scaling`` where Granite divides), so nothing is inferred from config fields.
Families not listed finish with the identity; ``tests/heads/test_logit_transform.py`` checks every entry against the
family's own forward."""


def logit_transform(model: PreTrainedModel) -> LogitTransform:
    """The finish ``model``'s causal-LM forward gives its lm_head's output (``LOGIT_TRANSFORMS``)."""
    config = model.config.get_text_config()
    rule = LOGIT_TRANSFORMS.get(config.model_type)
    return LogitTransform() if rule is None else rule(config)


class UnsupportedTargetError(ValueError):
    """The target architecture does not expose the parts a head needs."""


@dataclass(frozen=True)
class BorrowedModules:
    embed_tokens: nn.Embedding
    lm_head: nn.Linear
    finish: LogitTransform = LogitTransform()
    """The target's logit finish, applied by ``logits`` to the borrowed lm_head's output and to a head's own."""

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The target's token embedding as the serving engines' and SpecForge's drafters read it: the plain rows of
        its weight. (B, T) -> (B, T, H). Some families' embedding modules scale their output (Gemma's by
        sqrt(hidden), MiniCPM3's, XGLM's, BioGPT's); vLLM and SGLang share the target's embedding with the drafter as
        a plain lookup and apply such scales in the target's own forward, so a drafter trained on the scaled rows
        would get other inputs once exported. A plain ``nn.Embedding`` is called as a module (its hooks run:
        accelerate's device-map placement); a subclass that overrides ``forward`` is looked up directly."""
        module = self.embed_tokens
        if not isinstance(module, nn.Embedding) or type(module).forward is nn.Embedding.forward:
            return module(input_ids)
        return nn.functional.embedding(input_ids, module.weight, module.padding_idx)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Linear | None = None) -> torch.Tensor:
        """Vocabulary logits on the target's scale: ``lm_head`` (default: the borrowed one) then the target's
        finish. (..., H) -> (..., V). The input is cast to the projection's dtype: a borrowed lm_head keeps the
        target's while training runs a head in fp32 (or DeepSpeed in bf16)."""
        lm_head = self.lm_head if lm_head is None else lm_head
        return self.finish(lm_head(hidden.to(lm_head.weight.dtype)))


HYPER_CONNECTIONS = "hyper-connection residual streams, (B, T, hc_mult, H), mixed down to one only after the last layer"
STACKED_HIDDEN_STATES: dict[str, tuple[str, bool]] = {
    "gemma3n_text": ("AltUp's parallel streams, (altup_num_inputs, B, T, H), mixed down to one by its forward", True),
    "deepseek_v4": (HYPER_CONNECTIONS, False),
    "hy_v4": (HYPER_CONNECTIONS, False),
}
"""Text-config ``model_type`` -> what its ``hidden_states`` hold instead of one (B, T, H) feature per layer, and
whether the last one (index N) is stacked too. Heads read those features, so a head that reads a stacked index is
refused; draft models and prompt lookup read none."""


def check_readable_hidden_states(target: PreTrainedModel, layer_ids: Sequence[int]) -> None:
    """Refuse a head whose ``layer_ids`` are hidden states the family stacks (``STACKED_HIDDEN_STATES``), which
    would otherwise fail on their shape deep inside training or decoding."""
    text = target.config.get_text_config()
    entry = STACKED_HIDDEN_STATES.get(text.model_type)
    if entry is None:
        return
    what, last_too = entry
    last = text.num_hidden_layers
    stacked = [i for i in layer_ids if last_too or i != last]
    if stacked:
        works = "" if last_too else f"Medusa and EAGLE-1 heads, which read the last hidden state ({last}), work; "
        raise UnsupportedTargetError(
            f"{type(target).__name__}'s hidden states {'are' if last_too else f'before index {last} are'} {what}; "
            f"heads read one (B, T, H) feature per layer, and this one reads indices {list(stacked)}. {works}"
            "Draft models (head.type: draft_model) and prompt lookup (specheads generate --prompt-lookup) read no "
            "hidden states"
        )


def borrow(target: PreTrainedModel, layer_ids: Sequence[int] = ()) -> BorrowedModules:
    """The target modules a head uses; ``layer_ids`` are the hidden-state indices it reads, refused where the family
    stacks them (``check_readable_hidden_states``)."""
    check_readable_hidden_states(target, layer_ids)
    embed = target.get_input_embeddings()
    lm_head = target.get_output_embeddings()
    if embed is None or lm_head is None:
        raise UnsupportedTargetError(
            f"{type(target).__name__} does not expose input embeddings and an lm_head "
            "(get_input_embeddings/get_output_embeddings returned None); draft heads need both."
        )
    return BorrowedModules(embed_tokens=embed, lm_head=lm_head, finish=logit_transform(target))


def decoder_layer_parts(target: PreTrainedModel) -> tuple[type[nn.Module], type[nn.Module]]:
    """The target's own decoder-layer and rotary-embedding classes, so drafters never copy modeling code."""
    decoder = target.get_decoder()
    layers = getattr(decoder, "layers", None)
    rotary = getattr(decoder, "rotary_emb", None)
    missing = [name for name, part in (("`.layers`", layers), ("`.rotary_emb`", rotary)) if not part]
    if missing:
        raise UnsupportedTargetError(
            f"{type(target).__name__}: expected a decoder ({type(decoder).__name__}) with `.layers` and `.rotary_emb` "
            f"(Llama-style, as in Llama, Qwen2/3, Mistral, SmolLM); it has no {' and no '.join(missing)}. EAGLE "
            "drafters build their layer from these classes. Medusa heads and draft models work with this target, and "
            "so does an EAGLE drafter with a Llama layer: head.options.draft_layer=llama "
            "(EagleConfig(draft_layer='llama'))."
        )
    return type(layers[0]), type(rotary)


LOGIT_FINISH_TOLERANCE = 1e-3
"""Largest gap, relative to the logits' size, between the target's logits and ``BorrowedModules.logits`` of its last
hidden state that counts as the same finish: the same matmul in the same dtype, so rounding only."""


def logit_finish_gap(target: PreTrainedModel, length: int = 4) -> float | None:
    """How far ``borrow(target).logits(last hidden state)`` is from the target's own logits on a short input, relative
    to their size: ~0 when ``LOGIT_TRANSFORMS`` knows the family's finish (or it has none). A larger gap means the
    causal-LM forward changes the logits (or the last hidden state) in a way heads do not repeat, so their logits are
    off the target's scale. None when the target cannot run here: weights on the meta device or split by ZeRO-3 or
    FSDP (the check is made before they are), or when heads cannot read its hidden states
    (``STACKED_HIDDEN_STATES``)."""
    if any(p.device.type == "meta" or is_partitioned(p) for p in target.parameters()):
        return None
    if STACKED_HIDDEN_STATES.get(target.config.get_text_config().model_type, ("", False))[1]:  # stacked last state
        return None
    vocab = target.config.get_text_config().vocab_size
    device = next(target.parameters()).device
    input_ids = (torch.arange(length, device=device)[None] * 7919 + 11) % vocab  # (1, T): a few ordinary ids
    with torch.no_grad():
        out = target(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        ours = borrow(target).logits(out.hidden_states[-1]).float()  # (1, T, V)
        theirs = out.logits.float()
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1.0))


def warn_on_unknown_logit_finish(target: PreTrainedModel) -> None:
    """Heads learn against the target's distribution through its lm_head: a family whose causal-LM forward changes
    the logits in a way not in ``LOGIT_TRANSFORMS`` trains heads whose logits are off its scale. They still decode
    losslessly (the target verifies every token), but sampled drafts and soft labels are miscalibrated."""
    gap = logit_finish_gap(target)
    if gap is not None and gap > LOGIT_FINISH_TOLERANCE:
        logger.warning(
            "%s's logits are not its lm_head applied to its last hidden state (relative gap %.3g): its causal-LM "
            "forward finishes them in a way specheads.heads.borrowed.LOGIT_TRANSFORMS does not list, so the heads' "
            "logits will be off the target's scale (decoding stays lossless; acceptance under sampling suffers). "
            "Add the family's finish to LOGIT_TRANSFORMS.",
            type(target).__name__,
            gap,
        )
