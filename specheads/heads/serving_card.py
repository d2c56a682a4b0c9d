"""The model card of a repository an engine serves as it is (``specheads push --format ENGINE``, or an export folder):
Hub metadata, the serve command, and the speed a ``specheads bench`` run measured, apart from training's estimate."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from specheads.heads.card import BUILTIN_LICENSES, base_model_id, builtin_weights_note, public_name
from specheads.heads.eagle3_checkpoint import is_eagle3_checkpoint
from specheads.heads.files import CARD_NAME, CONFIG_NAME

BENCH_OVERALL = "overall"
"""The key of a ``specheads bench`` results file's all-prompts summary per method (``specheads.bench.report``)."""

LIBRARY_NAMES = {"speculators": "speculators", "vllm": "specheads", "sglang": "specheads"}
"""The Hub's ``library_name`` per format: speculators' own library for its format; the engines' EAGLE and Medusa
layouts have no library of their own that loads them, so the producer's name."""


def exported_method(meta: dict[str, Any]) -> tuple[str, int]:
    """What an exported ``config.json`` holds, as vLLM's ``method`` name, and the draft steps to serve it with."""
    record = meta.get("specheads") or {}
    if record.get("head_type") == "medusa":
        return "medusa", int(meta.get("num_heads", 3))
    if record.get("head_type") == "eagle":
        return ("eagle3" if record.get("version") == 3 else "eagle"), 3
    if is_eagle3_checkpoint(meta):  # exported elsewhere (SpecForge, speculators): no specheads record
        return "eagle3", 3
    return "draft_model", 4


def serve_command(method: str, steps: int, engine: str, target: str, model: str) -> str:
    """The one command that serves ``model`` (an export folder or its Hub repo) with ``engine`` beside ``target``."""
    if engine == "speculators":  # the folder names its target (the verifier): vLLM serves it on its own
        return f"vllm serve {model}"
    if engine == "sglang":
        algorithm = {"eagle3": "EAGLE3", "eagle": "EAGLE"}.get(method, "STANDALONE")
        return (
            f"python -m sglang.launch_server --model-path {target} --speculative-algorithm {algorithm} "
            f"--speculative-draft-model-path {model} --speculative-num-steps {steps} --speculative-eagle-topk 4 "
            "--speculative-num-draft-tokens 16"
        )
    config = f'{{"method": "{method}", "model": "{model}", "num_speculative_tokens": {steps}}}'
    return f"vllm serve {target} --speculative-config '{config}'"


def write_serving_card(
    folder: Path,
    engine: str,
    target_name: str,
    repo_id: str,
    bench_results: str | os.PathLike | None = None,
    head_card: str | None = None,
) -> None:
    """Write ``folder/README.md`` for the export in ``folder``; ``head_card`` is the specheads head's own card, whose
    training-time tau and ``datasets`` carry over."""
    meta = json.loads((folder / CONFIG_NAME).read_text())
    method, steps = exported_method(meta)
    hub_target = base_model_id(target_name)
    tags = ["speculative-decoding", "specheads", engine, method.replace("_", "-")]
    data = ModelCardData(
        base_model=hub_target,
        library_name=LIBRARY_NAMES[engine],
        license=BUILTIN_LICENSES.get(target_name),
        pipeline_tag="text-generation",
        tags=tags,
        datasets=_head_card_datasets(head_card),
    )
    target = hub_target or public_name(target_name)
    lines = [
        f"# {method} drafter for {target}, served by {'vLLM' if engine != 'sglang' else 'SGLang'}",
        "",
        f"Exported by specheads in the {engine} format: this repository is what the engine loads, as it is.",
        "",
        "## Serve",
        "```bash",
        serve_command(method, steps, engine, target, repo_id),
        "```",
        *(["", note] if (note := builtin_weights_note(target_name)) else []),
        "",
        *_measured_section(bench_results, target_name),
        *_simulated_section(head_card),
    ]
    ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n").save(folder / CARD_NAME)


def _measured_section(bench_results: str | os.PathLike | None, target_name: str) -> list[str]:
    """tau and speedup per method from a ``specheads bench`` results file, with what it ran on; refused when the
    file records another target than the head's (its speeds would say nothing about this head)."""
    if bench_results is None:
        return ["## Measured speed", "", "Not measured for this card (`specheads push --bench-results PATH`).", ""]
    report = read_bench_results(bench_results)
    config = report.get("config", {})
    measured = config.get("target")
    if isinstance(measured, str) and not _same_target(measured, target_name):
        raise ValueError(
            f"--bench-results {bench_results} measured the target {public_name(measured)}, but the head drafts for "
            f"{public_name(target_name)}; benchmark the head on its own target (`specheads bench --target "
            f"{public_name(target_name)} --head ...`), or pass --target if both name one model"
        )
    lines = [
        "## Measured speed (`specheads bench`)",
        "",
        f"specheads' own decoder, {config.get('device', 'device not recorded')}, temperature "
        f"{config.get('temperature', 0)}, baseline `{report['baseline']}`; tau counts the bonus token.",
        "",
        "| method | tau | tokens/s | speedup |",
        "|---|---|---|---|",
    ]
    for name, groups in report["results"].items():
        s = groups[BENCH_OVERALL]
        lines.append(f"| {name} | {s['tau']:.2f} | {s['tokens_per_s']:.1f} | {s['speedup']:.2f}x |")
    return [*lines, ""]


def _same_target(a: str, b: str) -> bool:
    """Whether two target names or paths name one model: equal, one Hub id (built-in names map to theirs), or one
    local folder."""
    hub = base_model_id(a)
    if a == b or (hub is not None and hub == base_model_id(b)):
        return True
    return Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve()


def read_bench_results(path: str | os.PathLike) -> dict[str, Any]:
    """A ``specheads bench`` results.json with what the card reads (``baseline``, and tau, tokens/s and speedup per
    method), or a one-line ``ValueError`` naming the file, what it holds instead and what to pass."""
    path = Path(path)
    expected = "expected the results.json a `specheads bench --out DIR` run writes into DIR"
    if not path.is_file():
        found = "is a folder" if path.is_dir() else "does not exist"
        raise ValueError(f"--bench-results {path} {found}; {expected}")
    try:
        report = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--bench-results {path} is not JSON ({err}); {expected}") from None
    results = report.get("results") if isinstance(report, dict) else None
    keys = ("tau", "tokens_per_s", "speedup")
    if (
        not isinstance(results, dict)
        or "baseline" not in report
        or not all(isinstance(g, dict) and all(k in g.get(BENCH_OVERALL, {}) for k in keys) for g in results.values())
    ):
        raise ValueError(
            f"--bench-results {path} has no baseline and per-method {BENCH_OVERALL} {', '.join(keys)}; {expected}"
        )
    return report


def _simulated_section(head_card: str | None) -> list[str]:
    """Training's estimate of tau (a simulated chain on held-out data), never a measurement of serving."""
    found = re.search(r'"simulated_chain_tau":\s*([0-9.]+)', head_card or "")
    if not found:
        return []
    return [
        "## Training-time estimate",
        "",
        f"Simulated chain tau on held-out data at the end of training: {float(found.group(1)):.2f} (teacher-forced, "
        "not a serving measurement).",
    ]


def _head_card_datasets(head_card: str | None) -> list[str] | None:
    """The Hub datasets the head's own card names (its ``datasets`` metadata), if any."""
    if not head_card:
        return None
    try:
        return ModelCard(head_card).data.datasets or None
    except (ValueError, TypeError):
        return None
