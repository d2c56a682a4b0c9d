"""Medusa-2 (heads + LoRA on the target): the frozen target stays frozen in every sense (eval mode, not saved in
checkpoints), and a run resumed from a checkpoint without it ends where an uninterrupted run does."""

from __future__ import annotations

import pytest
import safetensors
import safetensors.torch
import torch

from specheads.target import load_target
from specheads.training.checkpoint import latest_checkpoint
from specheads.training.config import load_config
from specheads.training.loop import train
from tests.training.train_helpers import REPO, tiny_overrides

MEDUSA2 = REPO / "configs" / "medusa2" / "smollm2-135m.yaml"


def _run(target_dir, chats, out, heads_warmup=1, **train_kw):
    """A Medusa-2 run on a fresh copy of the tiny target (LoRA adapters are injected into it in place)."""
    target, tokenizer = load_target(target_dir)
    overrides = tiny_overrides(target_dir, chats, out, batch_size=2, **train_kw)
    overrides += ["data.max_samples=16", "lora.r=4", f"lora.heads_warmup_steps={heads_warmup}"]
    return train(load_config(MEDUSA2, overrides), target, tokenizer)


def test_medusa2_trains_only_the_adapters_in_train_mode(tiny_target_dir, small_chat_file, tmp_path):
    """The frozen target is also the distillation teacher: its dropout must stay off (eval mode) while the heads and
    the LoRA modules train, and the caller's target comes back in the mode it was given in."""
    target, tokenizer = load_target(tiny_target_dir)
    assert not target.training
    seen = []  # (base model in train mode, a LoRA module in train mode) at every forward: teacher, student, eval
    unadapted = []  # forwards before the adapters are attached: the logit-finish check on the plain target

    def record(model, args):
        lora = getattr(model.layers[0].self_attn.q_proj, "lora_A", None)
        if lora is None:
            unadapted.append(model.training)
            return
        seen.append((model.training, lora["default"].training))

    target.model.register_forward_pre_hook(record)
    overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path, max_steps=2, batch_size=2, eval_every=1)
    overrides += ["data.max_samples=16", "lora.r=4", "lora.heads_warmup_steps=1"]
    train(load_config(MEDUSA2, overrides), target, tokenizer)
    assert seen and not any(base for base, _ in seen), seen
    assert unadapted == [False]  # one check, in eval mode, before training
    assert {lora for _, lora in seen} == {True, False}  # the adapters train, and are evaluated in eval mode
    assert not any(module.training for module in target.modules())


def test_medusa2_checkpoints_leave_the_frozen_target_out_and_resume_exactly(tiny_target_dir, small_chat_file, tmp_path):
    """Resumed after step 1 of 2, with the adapters held for step 1: the held schedule resumes too."""
    assert _run(tiny_target_dir, small_chat_file, tmp_path / "full", max_steps=2).finished
    stopped = _run(tiny_target_dir, small_chat_file, tmp_path / "part", max_steps=2, save_every=1, stop_after=1)
    assert not stopped.finished

    checkpoint = latest_checkpoint(tmp_path / "part")
    with safetensors.safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert names and all(name.startswith("head.") or ".lora_" in name for name in names), names

    resumed = _run(tiny_target_dir, small_chat_file, tmp_path / "part", max_steps=2, save_every=1, resume="auto")
    assert resumed.finished and resumed.step == 2
    for part in ("model.safetensors", "lora/adapter_model.safetensors"):
        expected = safetensors.torch.load_file(str(tmp_path / "full" / part))
        found = safetensors.torch.load_file(str(tmp_path / "part" / part))
        assert expected.keys() == found.keys()
        for name in expected:
            torch.testing.assert_close(found[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)


def test_lora_modules_the_target_lacks_are_a_config_error_naming_its_linear_layers():
    """Phi-3 fuses q/k/v into qkv_proj: the shipped Medusa-2 config's [q_proj, v_proj] was a peft traceback."""
    import pytest
    from transformers import Phi3Config, Phi3ForCausalLM

    from specheads.heads import MedusaConfig, MedusaHeads
    from specheads.training.config import ConfigError, LoraSection, LossSection
    from specheads.training.objective import build_objective

    config = Phi3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=0,
    )  # fmt: skip
    target = Phi3ForCausalLM(config).eval().requires_grad_(False)
    head = MedusaHeads(MedusaConfig(num_heads=2), target)
    lora = LoraSection(enabled=True, target_modules=["q_proj", "v_proj"])
    with pytest.raises(ConfigError, match="its Linear layers are named .*'qkv_proj'"):
        build_objective(head, target, LossSection(), lora, seed=0)
    build_objective(head, target, LossSection(), LoraSection(enabled=True, target_modules=["qkv_proj"]), seed=0)


def test_heads_train_alone_first_then_the_adapters_join(tiny_target_dir, small_chat_file, tmp_path):
    """Medusa-2's recipe: for lora.heads_warmup_steps the target's adapters stay exactly as initialised (LoRA B = 0,
    so the target is the original) while the heads learn; afterwards both train."""
    _run(tiny_target_dir, small_chat_file, tmp_path, heads_warmup=2, max_steps=3, save_every=1, keep_last=5)

    def tensors(step):
        return safetensors.torch.load_file(str(tmp_path / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))

    held, joined = tensors(2), tensors(3)
    lora_b = [name for name in held if ".lora_B." in name]
    assert lora_b and all(torch.count_nonzero(held[name]) == 0 for name in lora_b)
    assert any(torch.count_nonzero(joined[name]) > 0 for name in lora_b)
    first = tensors(1)
    assert any(not torch.equal(first[name], held[name]) for name in held if name.startswith("head."))


def test_heads_warmup_must_leave_steps_for_the_adapters():
    import pytest

    from specheads.training.config import ConfigError

    with pytest.raises(ConfigError, match=r"lora.heads_warmup_steps=5 is not below train.max_steps=5: the adapters"):
        load_config(MEDUSA2, ["train.max_steps=5", "lora.heads_warmup_steps=5"])


def test_the_adapters_schedule_counts_optimizer_steps_whatever_the_process_count():
    """Accelerate ticks a prepared scheduler once per process per optimizer step: the hold and the adapters' ramp
    after it must come out the same per optimizer step on 1, 2 or 8 processes."""
    from transformers import get_scheduler

    from specheads.training.objective import hold_adapters

    def adapter_lrs(processes: int, steps: int = 8) -> list[float]:
        groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 1.0} for _ in range(2)]
        optimizer = torch.optim.AdamW(groups)
        base = get_scheduler("linear", optimizer, num_warmup_steps=2 * processes, num_training_steps=steps * processes)
        scheduler = hold_adapters(base, hold=2, ramp=2, ticks_per_step=processes)
        lrs = []
        for _ in range(steps):
            lrs.append(optimizer.param_groups[1]["lr"])
            optimizer.step()
            for _ in range(processes):
                scheduler.step()
        return lrs

    one = adapter_lrs(1)
    assert one[:2] == [0.0, 0.0] and one[2] > 0
    for processes in (2, 8):
        assert adapter_lrs(processes) == pytest.approx(one, abs=1e-12)
