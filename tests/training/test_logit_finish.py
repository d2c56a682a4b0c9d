"""A draft model trains on the logits its own forward drafts with. The objective projects only the trained rows
through the lm_head, so it must also give them the family's finish (Granite's ``logits_scaling``, Gemma2's soft cap):
without it a draft model that copies the whole target was trained as if 4x sharper than the target it equals."""

from __future__ import annotations

import pytest
import torch

from specheads.heads import DraftModel
from specheads.training.config import LossSection
from specheads.training.features import extract_features
from specheads.training.objective import DraftModelObjective
from tests.heads.test_logit_transform import FINISHED
from tests.tiny_models import TINY_FAMILY_CONFIG, tiny_family


@pytest.mark.parametrize("model_type", ["granite", "gemma2", "llama"])
def test_a_draft_model_that_copies_the_target_has_zero_distillation_gap(model_type):
    target = tiny_family(model_type, **FINISHED.get(model_type, {}))
    head = DraftModel.from_target(target, num_layers=TINY_FAMILY_CONFIG["num_hidden_layers"])  # all: the target
    objective = DraftModelObjective(head, LossSection(draft_labels="soft"))
    input_ids = torch.tensor([[1, 5, 9, 33, 7, 12, 40, 8, 17, 3]])
    attention_mask = torch.ones_like(input_ids)
    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1]])
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
    features = extract_features(target, input_ids, attention_mask, [], with_logits=True)
    with torch.no_grad():
        loss, _ = objective(batch, features, 0)
    valid = loss_mask[:, 1:].bool()
    p = torch.softmax(features.logits[:, :-1][valid].float(), dim=-1)  # (N, V)
    entropy = -(p * p.log()).sum(-1).mean()
    torch.testing.assert_close(loss, entropy, rtol=1e-4, atol=1e-5)  # soft CE = H(p) + KL(p || q), and q = p
