"""Medusa heads: K extra decoding heads on the target's last hidden state (Cai et al. 2024,
https://arxiv.org/abs/2401.10774).

Head k (k = 1..K; the target's own lm_head is k = 0) reads the hidden state at position t and predicts token
t + k + 1 (``MEDUSA_HEAD_OFFSET``). Each head is L residual blocks ``x + SiLU(W x + b)``
whose weights start at zero, so an untrained head reproduces the target's own next-token distribution, followed by
a vocabulary projection (its own copy initialised from the target's lm_head, or the frozen lm_head itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from specheads.heads.base import DraftHead
from specheads.heads.borrowed import borrow
from specheads.heads.config import HeadConfig, HeadConfigError, TargetRecord, default_dtype_of

MEDUSA_HEAD_OFFSET = 1
"""Head k predicts token t + k + MEDUSA_HEAD_OFFSET from the hidden state at position t.

With the target's lm_head as head 0 (it predicts t + 1), head 1 predicts t + 2, head 2 predicts t + 3, ...
"""


def predicted_offset(k: int) -> int:
    """How many positions after t the token predicted by head k lies (k = 0 is the target's lm_head)."""
    return k + MEDUSA_HEAD_OFFSET


@dataclass
class MedusaConfig(HeadConfig):
    num_heads: int = 4
    num_layers: int = 1
    share_lm_head: bool = False
    """Reuse the frozen target lm_head in every head (far fewer parameters) instead of a trainable copy each."""

    def __post_init__(self) -> None:  # here, so training's config check refuses it before the target loads
        if isinstance(self.num_heads, int) and isinstance(self.num_layers, int):
            if self.num_heads < 1 or self.num_layers < 0:
                raise HeadConfigError(
                    f"MedusaConfig needs num_heads >= 1 and num_layers >= 0, found num_heads={self.num_heads}, "
                    f"num_layers={self.num_layers}"
                )


class ResBlock(nn.Module):
    """``x + SiLU(W x + b)`` with W, b zero-initialised: the identity at initialisation."""

    def __init__(self, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size, dtype=dtype)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(DraftHead):
    head_type = "medusa"
    config_class = MedusaConfig
    card_tags = ("medusa",)

    def __init__(self, config: MedusaConfig, target: PreTrainedModel, copy_lm_head: bool = True) -> None:
        super().__init__(config)
        record = TargetRecord.from_model(target)
        if not config.target.name_or_path:
            config.target = record
        if not config.layer_ids:
            config.layer_ids = [record.num_hidden_layers]  # the post-norm last hidden state
        if len(config.layer_ids) != 1 or not 0 <= config.layer_ids[0] <= record.num_hidden_layers:
            raise HeadConfigError(
                f"Medusa heads read one hidden-state index in [0, {record.num_hidden_layers}], found layer_ids="
                f"{list(config.layer_ids)}"
            )
        hidden, vocab, dtype = record.hidden_size, record.vocab_size, default_dtype_of(target)
        self.borrowed = borrow(target, config.layer_ids)
        # One independent list of blocks per head (never `[ResBlock(h)] * L`, which shares one block L times).
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(hidden, dtype) for _ in range(config.num_layers))) for _ in range(config.num_heads)
        )
        if config.share_lm_head:
            self.lm_heads = None
        else:
            source = self.borrowed.lm_head.weight.detach()
            self.lm_heads = nn.ModuleList(
                nn.Linear(hidden, vocab, bias=False, dtype=dtype) for _ in range(config.num_heads)
            )
            with torch.no_grad():
                for head in self.lm_heads if copy_lm_head else ():
                    head.weight.copy_(source)

    @classmethod
    def for_loading(cls, config: MedusaConfig, target: PreTrainedModel) -> MedusaHeads:
        """An instance whose weights a strict state-dict load overwrites: its own lm_heads are not copied from the
        target's (under ZeRO-3 the adapted target of Medusa-2 holds only a partition of that weight)."""
        return cls(config, target, copy_lm_head=False)

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    def head_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Per-head features before the vocabulary projection: (B, T, H) -> (K, B, T, H)."""
        return torch.stack([blocks(hidden) for blocks in self.blocks])

    def project(self, k: int, head_hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits of head k+1 (0-based index k) from its features: (..., H) -> (..., V)."""
        return self.borrowed.logits(head_hidden, None if self.lm_heads is None else self.lm_heads[k])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, H) target hidden states -> (K, B, T, V) logits; ``logits[k-1]`` is head k (predicts t+k+1)."""
        features = self.head_hidden(hidden)  # (K, B, T, H)
        return torch.stack([self.project(k, features[k]) for k in range(self.num_heads)])
