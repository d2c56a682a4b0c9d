"""A short run on the real SmolLM2-135M-Instruct target per head type: the held-out loss goes down and the head's
held-out top-1 accuracy beats the untrained head (evaluated at step 0 of the same run) by a clear margin.

Kept small for a 2-core CI machine: 2 x 96-token samples per step, 6-10 steps, six held-out samples.
"""

from __future__ import annotations

import pytest

from specheads.heads import load_head
from specheads.training.config import load_config
from specheads.training.loop import train
from tests.training.train_helpers import REPO

pytestmark = pytest.mark.slow

CASES = {  # (overrides, steps)
    "medusa": (["head.options.num_heads=2", "train.lr=5e-3"], 10),
    "medusa2": (
        ["head.options.num_heads=2", "train.lr=5e-3", "lora.r=4", "lora.lr=1e-4", "lora.heads_warmup_steps=2"],
        6,
    ),
    "eagle1": (["train.lr=1e-3", "loss.input_noise=0.0"], 10),
    "eagle3": (["head.options.draft_vocab_size=4096", "loss.ttt_steps=2", "train.lr=3e-3"], 10),
    # The untrained draft model is the target's first 2 layers with its final norm and lm_head (weights copied).
    "draft_model": (["head.options.copy_target_layers=2", "train.lr=1e-3"], 10),
}


@pytest.mark.parametrize("name", list(CASES))
def test_short_run_learns(name, smollm2, distill_path, tmp_path):
    model, tokenizer = smollm2
    extra, steps = CASES[name]
    overrides = extra + [
        f"data.paths=[{distill_path}]",
        "data.max_samples=160",
        "data.max_length=96",
        "data.eval_size=6",
        "train.batch_size=2",
        "train.eval_batch_size=6",
        f"train.max_steps={steps}",
        f"train.eval_every={steps}",
        "train.warmup_steps=0",
        "train.scheduler=constant",
        "train.progress_bar=false",
        f"train.output_dir={tmp_path / 'run'}",
    ]
    cfg = load_config(REPO / "configs" / name / "smollm2-135m.yaml", overrides)
    if name == "medusa2":  # LoRA rewrites the target's modules: train on a private copy, keep the fixture pristine
        import copy

        model = copy.deepcopy(model)
    result = train(cfg, target=model, tokenizer=tokenizer)
    before, after = result.history[0], result.history[-1]
    assert before["step"] == 0 and after["step"] == steps
    assert after["eval/loss"] < before["eval/loss"]
    key = "eval/top1/head1" if name.startswith("medusa") else "eval/top1/step1"
    assert after[key] > before[key] + 0.05, (before, after)
    assert after["eval/tau"] > before["eval/tau"]
    head = load_head(tmp_path / "run", smollm2[0])
    assert head.head_type == {"medusa2": "medusa", "eagle1": "eagle", "eagle3": "eagle"}.get(name, name)
    if name == "medusa2":
        assert (tmp_path / "run" / "lora" / "adapter_config.json").is_file()
        assert after["eval/lora/top1_agree"] > 0.9  # the adapted target still says what the original says
