"""specheads' exports read by the ``speculators`` package itself (vllm-project/speculators, the format library vLLM
serves ``vllm serve DIR`` folders with), not by this project's reading of it.

speculators pins another transformers than specheads, so it lives in its own environment (``make speculators-venv``,
which ``make test`` builds); ``tests/heads/speculators_check.py`` runs there in a subprocess, loads every export with
speculators' classes (an engines-format export through speculators' own converter) and runs its EAGLE-3 drafter.
"""

import json
import subprocess
from pathlib import Path

import pytest
import safetensors.torch
import torch

from specheads.heads import EagleConfig, EagleHead, build_vocab_maps
from specheads.heads.interop import export_head
from tests.tiny_models import make_tiny_llama

REPO = Path(__file__).resolve().parents[2]
SPECULATORS_PYTHON = REPO / ".venv-speculators" / "bin" / "python"
CHECK = Path(__file__).with_name("speculators_check.py")


def _head(target, draft_vocab, draft_layer, seed):
    d2t, _ = build_vocab_maps(
        torch.randint(0, 90, (900,), generator=torch.Generator().manual_seed(seed)), 128, draft_vocab
    )
    head = EagleHead(EagleConfig(version=3, draft_vocab_size=draft_vocab, draft_layer=draft_layer), target, d2t=d2t)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # random weights everywhere: an initialised block (zeros, ones) would hide a wrong mapping
        for param in head.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2 + (1.0 if param.ndim == 1 else 0.0))
    return head.eval()


@pytest.mark.skipif(
    not SPECULATORS_PYTHON.is_file(),
    reason=f"{SPECULATORS_PYTHON.relative_to(REPO)} is absent: `make speculators-venv` builds it (`make test` does)",
)
def test_speculators_loads_every_export_and_its_drafter_computes_the_heads_logits(tmp_path):
    target = make_tiny_llama(num_layers=6)
    target_dir = tmp_path / "target"
    target.save_pretrained(target_dir)  # speculators reads the verifier's config from its name_or_path
    target.config.name_or_path = str(target_dir)
    heads = {"reduced": _head(target, 32, "target", 1), "full": _head(target, 128, "llama", 2)}
    exports = []
    for name, head in heads.items():
        export_head(head, target, tmp_path / name, engine="speculators")
        exports.append({"name": name, "folder": str(tmp_path / name), "format": "speculators"})
    export_head(heads["reduced"], target, tmp_path / "vllm", engine="vllm")
    exports.append({"name": "vllm-converted", "folder": str(tmp_path / "vllm"), "format": "vllm"})

    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(3))
    layer_ids = heads["reduced"].layer_ids
    with torch.no_grad():
        states = target(ids, output_hidden_states=True).hidden_states
    # the engines' capture: each listed state once, in ascending order, concatenated (B, T, 3H)
    features = torch.cat([s for i, s in enumerate(states) if i in set(layer_ids)], dim=-1)
    positions = torch.arange(9)[None]
    inputs = tmp_path / "inputs.safetensors"
    safetensors.torch.save_file({"features": features, "input_ids": ids, "position_ids": positions}, str(inputs))
    job = tmp_path / "job.json"
    out = tmp_path / "logits.safetensors"
    job.write_text(json.dumps({"target": str(target_dir), "inputs": str(inputs), "out": str(out), "exports": exports}))
    run = subprocess.run(
        [str(SPECULATORS_PYTHON), str(CHECK), str(job)], capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    logits = safetensors.torch.load_file(str(out))

    for name, head_name in (("reduced", "reduced"), ("full", "full"), ("vllm-converted", "reduced")):
        head = heads[head_name]
        parsed = report[name]
        assert parsed["layer_ids"] == head.layer_ids == [2, 3, 4], name
        assert (parsed["draft_vocab_size"], parsed["target_vocab_size"]) == (head.draft_vocab_size, 128), name
        assert parsed["verifier"] == str(target_dir) and parsed["norm_before_residual"] is False, name
        if head.draft_vocab_size < 128:  # speculators' d2t: offsets, target id = draft id + d2t[id]
            assert parsed["d2t"] == (head.d2t - torch.arange(head.draft_vocab_size)).tolist(), name
        else:
            assert parsed["d2t"] is None, name
        with torch.no_grad():
            _, expected = head(head.fuse(states), ids, positions)
        torch.testing.assert_close(logits[name], expected, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    assert report["reduced"]["speculative_tokens"] == 3
