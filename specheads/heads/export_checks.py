"""What ``export_head`` checks before it writes a head in an engine's format: the engines run EAGLE drafters as Llama
layers and project every drafter's features with a bare lm_head, so a head that computes anything else (other tensors,
norms, activations, scales, no rotary embedding, a logit finish) is refused with the reason rather than written to be
run as something it is not."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from specheads.heads.base import DraftHead
from specheads.heads.borrowed import LogitTransform, logit_transform
from specheads.heads.eagle import EagleDrafter


class ExportError(ValueError):
    """A head cannot be written in (or read from) a serving engine's format."""


def check_no_logit_finish(head: DraftHead, target: PreTrainedModel) -> None:
    """A head's logits get the target family's finish (``LogitTransform``: Gemma2's soft cap, Granite's and Cohere's
    scales); the engines' Medusa and EAGLE drafter formats project with a bare lm_head, so their drafts would come
    from another distribution. (A draft model is exported as the family's own model, which keeps its finish.)"""
    finish = logit_transform(target)
    if finish != LogitTransform():
        raise ExportError(
            f"{type(target).__name__} finishes its logits after the lm_head ({finish}); the engines' "
            f"{type(head).__name__} formats have no place for that, so an engine would draft from other "
            "probabilities than this head's. Serve it with specheads, or train a draft model (exported as the "
            "family's own model)"
        )


def check_llama_layer(head: EagleDrafter, tensors: dict[str, Any], prefix: str, expected: frozenset | set) -> None:
    """The engines' drafters are Llama layers: a target layer with other tensors (biases, q/k norms) cannot map."""
    found = {name for name in tensors if name.startswith(prefix)}
    if found != expected:
        raise ExportError(
            f"the drafter's decoder layer ({type(head.layer).__name__}) is not a plain Llama layer, which is what the "
            f"engines' EAGLE drafters are: extra tensors {sorted(found - expected)}, missing {sorted(expected - found)}"
        )
    # Same tensor names do not make the same layer: Gemma's norms scale by (1 + w), and its MLP uses GELU; an engine
    # running the weights as a Llama layer would compute something else, silently.
    norm = head.layer.post_attention_layernorm  # the input norm may be an Identity (EAGLE-1, input_norm=false)
    if hasattr(norm, "weight"):
        probe = copy.deepcopy(norm).float()
        with torch.no_grad():
            probe.weight.fill_(2.0)
            scaled = probe(torch.ones(1, probe.weight.shape[0])).mean().item()  # x * w on a unit-RMS input: 2
        if abs(scaled - 2.0) > 1e-3:
            raise ExportError(
                f"the drafter's norms ({type(norm).__name__}) do not compute x * w as a Llama RMSNorm does (a weight "
                f"of 2 gives {scaled:.3f}); the engines would run this layer as a Llama layer and compute another thing"
            )
    act = getattr(head.layer.mlp, "act_fn", None)
    probe = torch.tensor([-2.0, 0.5, 3.0])
    if act is not None and not torch.allclose(act(probe), nn.functional.silu(probe), atol=1e-4):
        raise ExportError(
            f"the drafter's MLP activation ({type(act).__name__}) is not SiLU, which the engines' Llama drafter layer "
            "uses: it would compute something else"
        )
    _check_llama_scales(head)


def _check_llama_scales(head: EagleDrafter) -> None:
    """Numbers a Llama layer does not have: Granite's attention_multiplier (scores scaled by it instead of
    1/sqrt(head_dim)) and residual_multiplier (each branch scaled before the residual add), SmolLM3's NoPE layers."""
    attn = head.layer.self_attn
    llama_scaling = attn.head_dim**-0.5 if hasattr(attn, "head_dim") else None
    scaling = getattr(attn, "scaling", llama_scaling)
    if llama_scaling is not None and abs(scaling - llama_scaling) > 1e-6 * llama_scaling:
        raise ExportError(
            f"the drafter's attention scales its scores by {scaling:.6g} (its family's attention multiplier) where a "
            f"Llama layer, which the engines run, scales by 1/sqrt(head_dim) = {llama_scaling:.6g}"
        )
    if not getattr(attn, "use_rope", True):
        raise ExportError(
            "the drafter's attention has no rotary embedding (SmolLM3's NoPE layer pattern starts with one); the "
            "engines' Llama drafter layer applies it"
        )
    residual = head.residual_multiplier
    if residual != 1.0:
        raise ExportError(
            f"the drafter's layer scales attention's and the MLP's outputs by residual_multiplier={residual} before "
            "adding them to the residual; the engines' Llama drafter layer does not"
        )


def check_reads_last_hidden_state(head: DraftHead) -> None:
    """vLLM and SGLang feed Medusa and EAGLE-1 drafters the target's final (post-norm) hidden state only."""
    last = head.config.target.num_hidden_layers
    if list(head.config.layer_ids) != [last]:
        raise ExportError(
            f"the engines feed this drafter the target's last hidden state (layer_ids [{last}]); this head reads "
            f"{list(head.config.layer_ids)}"
        )
