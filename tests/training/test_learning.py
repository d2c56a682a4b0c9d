"""A short run on the real SmolLM2-135M-Instruct target per head type: the held-out loss goes down and the head's
held-out top-1 accuracy beats the untrained head (evaluated at step 0 of the same run) by a clear margin.

Kept small for a 2-core CI machine: 2 x 128-token samples per step, a dozen steps, a few held-out samples.
"""

from __future__ import annotations

import pytest
from conftest import REPO

from specheads.heads import load_head
from specheads.training.config import load_config
from specheads.training.loop import train

pytestmark = pytest.mark.slow

CASES = {
    "medusa": ["head.options.num_heads=2", "train.lr=5e-3"],
    "medusa2": ["head.options.num_heads=2", "train.lr=5e-3", "lora.r=4"],
    "eagle1": ["train.lr=3e-3", "loss.input_noise=0.0"],
    "eagle3": ["head.options.draft_vocab_size=4096", "loss.ttt_steps=2", "train.lr=3e-3"],
}


@pytest.mark.parametrize("name", list(CASES))
def test_short_run_learns(name, smollm2, distill_path, tmp_path):
    model, tokenizer = smollm2
    overrides = CASES[name] + [
        f"data.paths=[{distill_path}]",
        "data.max_samples=160",
        "data.max_length=128",
        "data.eval_size=6",
        "train.batch_size=2",
        "train.eval_batch_size=6",
        "train.max_steps=12",
        "train.eval_every=12",
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
    assert before["step"] == 0 and after["step"] == 12
    assert after["eval/loss"] < before["eval/loss"]
    key = "eval/top1/head1" if name.startswith("medusa") else "eval/top1/step1"
    assert after[key] > before[key] + 0.05, (before, after)
    assert after["eval/tau"] > before["eval/tau"]
    head = load_head(tmp_path / "run", smollm2[0])
    assert head.head_type == ("medusa" if name.startswith("medusa") else "eagle")
    if name == "medusa2":
        assert (tmp_path / "run" / "lora" / "adapter_config.json").is_file()
        assert after["eval/lora/top1_agree"] > 0.9  # the adapted target still says what the original says
