"""LongSpec's anchor-offset position ids in EAGLE training: as specified, only while training, and a run trains."""

from __future__ import annotations

import pytest
import torch

from specheads.heads import EagleConfig, EagleHead
from specheads.target import load_target
from specheads.training.config import LoraSection, LossSection, load_config
from specheads.training.features import extract_features
from specheads.training.loop import train
from specheads.training.metrics import teacher_forced_acceptance
from specheads.training.objective import anchor_offset_positions, build_objective
from tests.training.train_helpers import REPO, tiny_overrides


def test_anchor_offset_positions_keep_the_anchor_and_shift_the_rest():
    positions = anchor_offset_positions(256, 12, 4, 6000, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert positions.shape == (256, 12)
    assert (positions[:, :4] == torch.arange(4)).all()  # the anchor keeps its own positions
    offsets = positions[:, 4:] - torch.arange(4, 12)
    assert (offsets == offsets[:, :1]).all()  # one offset per sequence: the rest stays contiguous
    assert offsets.min() >= 0 and offsets.max() <= 6000
    assert offsets[:, 0].unique().numel() > 200 and offsets.float().mean() > 2000  # spread over the range
    plain = anchor_offset_positions(3, 12, 4, 0, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert (plain == torch.arange(12)).all()


class PositionRecorder:
    """Records the position ids of every drafter forward (a forward pre-hook on the real head)."""

    def __init__(self, head: EagleHead) -> None:
        self.seen: list[torch.Tensor] = []
        head.register_forward_pre_hook(lambda module, args: self.seen.append(args[2].clone()))


@pytest.mark.parametrize("version", [1, 3])
def test_eagle_objectives_train_at_offset_positions(tiny_target_dir, version):
    target, _ = load_target(tiny_target_dir)
    head = EagleHead(EagleConfig(version=version), target)
    loss_cfg = LossSection(ttt_steps=3, position_offset=5000, anchor_tokens=2, input_noise=0.0)
    objective = build_objective(head, target, loss_cfg, LoraSection(), seed=0)
    ids = torch.randint(0, 1000, (3, 20), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    features = extract_features(target, ids, batch["attention_mask"], head.layer_ids)
    recorder = PositionRecorder(head)
    objective.train()
    loss, _ = objective(batch, features, 7)
    loss.backward()
    assert torch.isfinite(loss) and head.fc.weight.grad.abs().sum() > 0
    steps = len(recorder.seen)
    assert steps == (1 if version == 1 else 3)
    first = recorder.seen[0]
    assert (first[:, :2] == torch.arange(2)).all() and (first[:, 2:] - torch.arange(2, 19) >= 0).all()
    assert (first[:, 2:] - torch.arange(2, 19)).max() > 0
    for j, later in enumerate(recorder.seen):
        assert (later == first + j).all()  # a training-time-test step j sits j positions further
    objective(batch, features, 7)
    assert (recorder.seen[steps] == first).all()  # the same micro-batch draw, the same offsets (resume-safe)
    objective(batch, features, 8)
    assert not (recorder.seen[2 * steps] == first).all()
    objective.eval()
    objective(batch, features, 7)
    assert (recorder.seen[3 * steps] == torch.arange(19)).all()  # evaluation measures the true positions


def test_a_training_run_with_anchor_offsets(tiny_target_dir, small_chat_file, tmp_path):
    overrides = ["loss.position_offset=4000", "loss.anchor_tokens=4", "loss.ttt_steps=2", "data.max_samples=16"]
    config = load_config(
        REPO / "configs" / "eagle3" / "smollm2-135m.yaml",
        overrides + tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "run", max_steps=2, batch_size=2),
    )
    result = train(config)
    assert result.finished and result.step == 2 and (tmp_path / "run" / "model.safetensors").is_file()


def test_teacher_forced_acceptance_by_band_of_positions(tiny_target_dir):
    """What scripts/position_acceptance.py measures: features computed once and passed with each band's loss mask
    give the same acceptance as computing them online, and the bands' position counts add up to the whole."""
    target, _ = load_target(tiny_target_dir)
    torch.manual_seed(0)
    head = EagleHead(EagleConfig(version=3), target).eval()
    ids = torch.randint(0, 1000, (1, 48), generator=torch.Generator().manual_seed(2))
    ones = torch.ones_like(ids)
    features = extract_features(target, ids, ones, head.layer_ids)

    def band(start: int, end: int) -> dict[str, torch.Tensor]:
        mask = torch.zeros_like(ids)
        mask[0, start:end] = 1
        return {"input_ids": ids, "attention_mask": ones, "loss_mask": mask}

    online = teacher_forced_acceptance(head, target, [band(0, 47)], depths=2)
    cached = teacher_forced_acceptance(head, target, [(band(0, 47), features)], depths=2)
    assert online == pytest.approx(cached)
    assert set(online) == {"depth1", "depth2", "tau"} and 0.0 <= online["depth1"] <= 1.0 and online["tau"] >= 1.0
    early = teacher_forced_acceptance(head, target, [(band(0, 20), features)], depths=1)["depth1"]
    late = teacher_forced_acceptance(head, target, [(band(20, 47), features)], depths=1)["depth1"]
    whole = teacher_forced_acceptance(head, target, [(band(0, 47), features)], depths=1)["depth1"]
    assert whole == pytest.approx((early * 20 + late * 27) / 47, abs=1e-6)  # the last position has no next token
