"""Token-weighted accumulation: one optimizer step follows the mean loss over its tokens, however its samples are
split into micro-batches (``train.grad_accum``). Averaging the micro-batches' own means instead gives a short
micro-batch's tokens more weight, which these runs would show.

One step with ``GRADIENT_AS_UPDATE`` makes the update the gradient, so the trained weights compare the steps' gradients
through the real loop. Across processes: ``test_distributed.py``.
"""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

from specheads.training.accumulation import accumulation_rounds, loss_tokens
from specheads.training.config import load_config
from specheads.training.loop import train
from specheads.training.metrics import Throughput
from tests.training.train_helpers import GRADIENT_AS_UPDATE, REPO, tiny_overrides

EAGLE1 = REPO / "configs" / "eagle1" / "smollm2-135m.yaml"
COUNT = Throughput.count  # the loop hands it every training micro-batch


def one_step(
    target_dir, data_file, out, batch_size: int, grad_accum: int, monkeypatch, extra: tuple[str, ...] = ()
) -> tuple[dict, list[float]]:
    """The weights after one step, and the loss tokens of each micro-batch the step read."""
    counts: list[float] = []

    def recording(self: Throughput, batch) -> None:
        counts.append(loss_tokens(batch).item())
        COUNT(self, batch)

    monkeypatch.setattr(Throughput, "count", recording)
    kw = dict(max_steps=1, batch_size=batch_size, grad_accum=grad_accum, max_grad_norm=0, warmup_steps=0)
    cfg = load_config(EAGLE1, [*GRADIENT_AS_UPDATE, *extra] + tiny_overrides(target_dir, data_file, out, **kw))
    assert train(cfg).step == 1
    return safetensors.torch.load_file(str(out / "model.safetensors")), counts


def test_a_step_is_the_mean_over_its_tokens_however_it_is_split(
    tiny_target_dir, small_chat_file, tmp_path, monkeypatch
):
    overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "lr0", max_steps=1)
    train(load_config(EAGLE1, [*GRADIENT_AS_UPDATE, "train.lr=0"] + overrides))
    start = safetensors.torch.load_file(str(tmp_path / "lr0" / "model.safetensors"))  # the initial weights
    whole, counts = one_step(tiny_target_dir, small_chat_file, tmp_path / "b4", 4, 1, monkeypatch)
    assert len(counts) == 1
    moved = sum((whole[k] - start[k]).abs().sum().item() for k in whole)
    assert moved > 1e-3, "the step did not move the weights: the comparison below would be empty"
    for batch_size, grad_accum in [(2, 2), (1, 4)]:
        split, split_counts = one_step(
            tiny_target_dir, small_chat_file, tmp_path / f"b{batch_size}", batch_size, grad_accum, monkeypatch
        )
        assert sum(split_counts) == sum(counts)  # the same samples, split
        # micro-batches of unequal token counts, so that the mean of their means would differ from the tokens' mean
        assert len(set(split_counts)) > 1, split_counts
        for name in whole:
            update, expected = split[name] - start[name], whole[name] - start[name]
            torch.testing.assert_close(
                update,
                expected,
                rtol=1e-3,
                atol=1e-4 * expected.abs().max().item(),
                msg=lambda m, name=name: f"{name}: {m}",
            )
    # each micro-batch's mean counting alike (train.weight_by_tokens=false) takes another step on the same samples
    means, _ = one_step(
        tiny_target_dir, small_chat_file, tmp_path / "means", 1, 4, monkeypatch, ("train.weight_by_tokens=false",)
    )
    gap = max(((means[k] - whole[k]).abs().max() / (whole[k] - start[k]).abs().max()).item() for k in whole)
    assert gap > 0.05, gap  # well clear of float noise: per-micro-batch means really differ from the whole mean


def test_accumulation_rounds_group_micro_batches_in_order():
    assert list(accumulation_rounds(iter(range(7)), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(accumulation_rounds([], 2)) == []


def test_loss_tokens_of_online_and_offline_batches():
    rows = {"loss_mask": torch.tensor([[0, 1, 1], [1, 1, 0]])}
    assert loss_tokens(rows).item() == 4.0
    assert loss_tokens((rows, object())).item() == 4.0


@pytest.mark.parametrize("value", ["0", "-1e-8"])
def test_adam_eps_must_be_positive(value):
    from specheads.training.config import ConfigError

    with pytest.raises(ConfigError, match="train.adam_eps must be > 0"):
        load_config(EAGLE1, [f"train.adam_eps={value}"])
