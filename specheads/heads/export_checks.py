"""What ``export_head`` checks before it writes a head in an engine's format: the engines run EAGLE drafters as Llama
layers and project every drafter's features with a bare lm_head, so a head that computes anything else (other tensors,
norms, activations, scales, no rotary embedding, a logit finish) is refused with the reason rather than written to be
run as something it is not."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRotaryEmbedding

from specheads.heads.base import DraftHead
from specheads.heads.borrowed import LogitTransform, logit_transform
from specheads.heads.eagle import EagleHead
from specheads.heads.masks import causal_additive_mask

LLAMA_NUMBERS_TOLERANCE = 1e-4
"""The largest difference, relative to the output's largest value, between the drafter's attention or MLP and the
engines' Llama ones on a random fp32 input: rounding is ~1e-6; another rotary layout or formula is far off."""


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


def check_llama_layer(head: EagleHead, tensors: dict[str, Any], prefix: str, expected: frozenset | set) -> None:
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


def _check_llama_scales(head: EagleHead) -> None:
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


def check_computes_as_llama(head: EagleHead, config: dict[str, Any]) -> None:
    """The engines run the exported layer as transformers' Llama attention and MLP built from the exported
    ``config``: the drafter's own must compute the same numbers. Same tensors and settings can still differ in how
    the rotary embedding is applied (Helium's and ERNIE 4.5's interleave pairs of channels; Llama rotates halves) or
    in a rotary setting the config does not carry, which the checks by name cannot see. Run both on one random
    input, positions past 0 and a causal mask, in fp32."""
    llama_config = LlamaConfig.from_dict({**config, "attn_implementation": "eager"})
    attn = copy.deepcopy(head.layer.self_attn).to("cpu", torch.float32).eval()  # on the CPU, whatever the head's device
    llama_attn = LlamaAttention(llama_config, 0)
    for name in ("q_proj", "k_proj", "v_proj"):  # EAGLE-3 widens them to 2H inputs, as the engines' layer does
        own = getattr(attn, name)
        setattr(llama_attn, name, nn.Linear(own.in_features, own.out_features, bias=False))
    mlp, llama_mlp = copy.deepcopy(head.layer.mlp).to("cpu", torch.float32).eval(), LlamaMLP(llama_config)
    generator = torch.Generator().manual_seed(0)
    length = 7
    x = torch.randn(1, length, attn.q_proj.in_features, generator=generator)
    positions = torch.arange(5, 5 + length)[None]
    mask = causal_additive_mask(length, 0, x.dtype, x.device).expand(1, 1, -1, -1)
    rotary = copy.deepcopy(head.rotary).to("cpu", torch.float32)
    with torch.no_grad():
        try:
            llama_attn.load_state_dict(attn.state_dict())
            llama_mlp.load_state_dict(mlp.state_dict())
        except RuntimeError as error:
            raise ExportError(
                f"the drafter's layer ({type(head.layer).__name__}) does not load into the engines' Llama layer: "
                f"{error}"
            ) from error
        own_out = attn(
            hidden_states=x, position_embeddings=rotary(x, positions, *head.rotary_args), attention_mask=mask
        )
        llama_out = llama_attn(
            x, position_embeddings=LlamaRotaryEmbedding(llama_config)(x, positions), attention_mask=mask
        )
        features = torch.randn(1, length, llama_config.hidden_size, generator=generator)
        pairs = {"attention": (own_out[0], llama_out[0]), "MLP": (mlp(features), llama_mlp(features))}
    for part, (own, llama) in pairs.items():
        gap = float((own - llama).abs().max() / llama.abs().max().clamp_min(1e-6))
        if gap > LLAMA_NUMBERS_TOLERANCE:
            raise ExportError(
                f"the drafter's {part} ({type(head.layer).__name__}) computes other numbers than the engines' Llama "
                f"{part} built from the exported config, with the same weights: {gap:.1%} of the output's range off "
                "on a random input (its family applies the rotary embedding or computes the block otherwise, as "
                "Helium and ERNIE 4.5 interleave rotary channels). An engine would run it as something it is not; "
                "serve this head with specheads"
            )
