"""Load specheads' exports with the ``speculators`` package's own classes and run its EAGLE-3 drafter.

Runs under the speculators environment's python (``make speculators-venv``; speculators pins another transformers
than specheads), started by tests/heads/test_speculators.py, which compares what this prints with specheads' head:

    .venv-speculators/bin/python tests/heads/speculators_check.py JOB.json

JOB.json: ``{"target": DIR, "inputs": FILE, "out": FILE, "exports": [{"name", "folder", "format"}]}`` where
``format`` is ``speculators`` (loaded as it is) or ``vllm`` (converted first by speculators' ``Eagle3Converter``).
``inputs`` holds ``features`` (1, T, 3H), the target's feature layers concatenated in ascending order,
``input_ids`` and ``position_ids`` (1, T). Writes each drafter's logits (1, T, Vd) to ``out`` and prints a JSON report
of the config speculators parsed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import safetensors.torch
import torch
from speculators.convert.eagle.eagle3_converter import Eagle3Converter
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig


def load_drafter(folder: str) -> Eagle3DraftModel:
    """speculators' EAGLE-3 drafter from a speculators-format folder, with eager attention (flex attention's block
    masks are for GPUs)."""
    config = Eagle3SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"
    return Eagle3DraftModel.from_pretrained(folder, config=config).eval()


def drafter_logits(model: Eagle3DraftModel, target: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """One drafting step of speculators' own forward (ttt_steps=1), its lm_head's output captured: (1, T, Vd)."""
    embedding = safetensors.torch.load_file(str(Path(target) / "model.safetensors"))["model.embed_tokens.weight"]
    captured = []
    model.lm_head.register_forward_hook(lambda module, args, output: captured.append(output))
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embedding)  # the target's, which vLLM shares with the drafter
        model(
            hidden_states=inputs["features"],
            input_ids=inputs["input_ids"],
            document_ids=torch.zeros_like(inputs["input_ids"]),
            position_ids=inputs["position_ids"],
            ttt_steps=1,
        )
    return captured[0]


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    inputs = safetensors.torch.load_file(job["inputs"])
    report, logits = {}, {}
    for export in job["exports"]:
        folder = export["folder"]
        if export["format"] == "vllm":
            converted = tempfile.mkdtemp(prefix="speculators-converted-")
            ids = json.loads((Path(folder) / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"]
            Eagle3Converter().convert(
                folder, converted, base_model=job["target"], validate=False, eagle_aux_hidden_state_layer_ids=ids
            )
            folder = converted
        model = load_drafter(folder)
        config = model.config
        report[export["name"]] = {
            "layer_ids": list(config.eagle_aux_hidden_state_layer_ids),
            "draft_vocab_size": config.draft_vocab_size,
            "target_vocab_size": config.target_vocab_size,
            "verifier": config.speculators_config.verifier.name_or_path,
            "norm_before_residual": config.norm_before_residual,
            "speculative_tokens": config.speculators_config.proposal_methods[0].speculative_tokens,
            "d2t": None if model.d2t is None else model.d2t.tolist(),
        }
        logits[export["name"]] = drafter_logits(model, job["target"], inputs).contiguous()
    safetensors.torch.save_file(logits, job["out"])
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
