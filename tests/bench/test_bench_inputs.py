"""``specheads bench`` as a user meets it: inputs refused before anything is measured, and a run stopped with Ctrl-C
that still reports the prompts it finished."""

from __future__ import annotations

import json

import pytest
import torch

from specheads.bench.cli import bench_main, run_bench
from specheads.bench.methods import Method, MethodRun
from specheads.bench.questions import Question, load_questions
from specheads.bench.runner import run_benchmark
from specheads.bench.settings import BenchSettings
from specheads.target import TargetLoadError
from tests.decoding.helpers import TinyTokenizer
from tests.tiny_models import make_tiny_llama

QUESTIONS = [
    {"question_id": 1, "category": "qa", "turns": ["Name a river."]},
    {"question_id": 2, "category": "rag", "turns": ["Name a mountain."]},
]


class ChatTokenizer(TinyTokenizer):
    """Stand-in for a chat tokenizer on the tiny random Llama: one id per character, no template text."""

    chat_template = "stand-in"

    def apply_chat_template(self, messages, add_generation_prompt=True, return_tensors="pt"):
        return torch.tensor([[3 + ord(c) % 120 for c in messages[0]["content"]]])


def _settings(tmp_path, **options) -> BenchSettings:
    questions = tmp_path / "question.jsonl"
    questions.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    defaults = dict(
        questions=str(questions),
        per_category=1,
        max_new_tokens=6,
        methods=["specheads-plain"],
        out=str(tmp_path / "out"),
        progress=False,
    )
    return BenchSettings(**{**defaults, **options})


@pytest.mark.parametrize("below", ["a-file", "a-file/bench"])
def test_an_out_that_is_a_file_is_refused_before_the_target_loads(tmp_path, monkeypatch, below):
    """The report folder was made only after every prompt ran: a file there raised FileExistsError (a traceback) at
    the very end, and the whole measurement was lost."""
    import specheads.target

    def no_target(*args, **kwargs):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr(specheads.target, "load_target", no_target)
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(ValueError, match=rf"--out .*{below}: .*a-file is a file; expected a folder for the report"):
        run_bench(_settings(tmp_path, out=str(tmp_path / below)))


def test_trees_that_do_not_match_the_heads_are_refused_before_the_target_loads(tiny_llama, tmp_path, monkeypatch):
    """Two --tree for one --head was refused only once the target had loaded (and a cost curve was timed)."""
    import specheads.target
    from specheads.heads import MedusaConfig, MedusaHeads

    def no_target(*args, **kwargs):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr(specheads.target, "load_target", no_target)
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(tmp_path / "medusa")
    settings = _settings(tmp_path, heads=[str(tmp_path / "medusa")], trees=["chain:2", "chain:3"])
    with pytest.raises(ValueError, match=r"got 2 --tree for 1 --head; give one --tree for all heads or one per"):
        run_bench(settings)


def test_a_later_heads_tree_is_checked_before_the_target_loads(tiny_llama, tmp_path, monkeypatch):
    """``--head medusa --head eagle --tree small10``: the EAGLE head's tree was refused when its drafter was built,
    after the target loaded and the Medusa head calibrated."""
    import specheads.target
    from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads

    def no_target(*args, **kwargs):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr(specheads.target, "load_target", no_target)
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(tmp_path / "medusa")
    EagleHead(EagleConfig(version=1), tiny_llama).save_pretrained(tmp_path / "eagle")
    heads = [str(tmp_path / "medusa"), str(tmp_path / "eagle")]
    with pytest.raises(ValueError, match=r"--head .*eagle: --tree EAGLE heads take --tree chain\[:D\] or dynamic"):
        run_bench(_settings(tmp_path, heads=heads, trees=["chain:2", "small10"]))
    with pytest.raises(ValueError, match=r"--head .*medusa: --tree Medusa tree 'no-such' is neither a file nor"):
        run_bench(_settings(tmp_path, heads=heads, trees=["no-such", "chain:2"]))


def test_head_and_calibration_mistakes_are_refused_before_the_target_loads(tiny_llama, tmp_path):
    """Each was refused only once the target had loaded: a Medusa-2 head (lora/ beside it), a Medusa tree deeper
    than the head set, a --calibration-data typo where held-out questions remain. A missing --target shows which
    came first: loading it would fail with a TargetLoadError, not these errors."""
    from peft import LoraConfig, get_peft_model

    from specheads.heads import MedusaConfig, MedusaHeads

    def lora(folder):
        get_peft_model(make_tiny_llama(), LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(folder)

    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(tmp_path / "medusa")
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(tmp_path / "medusa2", write_adapter=lora)
    no_target, medusa, medusa2 = (str(tmp_path / name) for name in ("no-target", "medusa", "medusa2"))
    with pytest.raises(ValueError, match=r"medusa2 is a Medusa-2 head with a LoRA adapter: it decodes an adapted"):
        run_bench(_settings(tmp_path, target=no_target, heads=[medusa2], trees=["chain:2"]))
    deep = r"--head .*medusa: --tree the tree is 4 deep but the Medusa head set has only 2 heads; use a tree at most"
    with pytest.raises(ValueError, match=deep):
        run_bench(_settings(tmp_path, target=no_target, heads=[medusa], trees=["small10"]))
    chats = str(tmp_path / "chats.jsonl")
    settings = _settings(tmp_path, target=no_target, heads=[medusa], trees=["auto"], calibration_data=chats)
    held_out = {"question_id": 3, "category": "qa", "turns": ["Name a lake."]}  # calibrates: the file goes unread
    (tmp_path / "question.jsonl").write_text("\n".join(json.dumps(q) for q in [*QUESTIONS, held_out]) + "\n")
    with pytest.raises(FileNotFoundError, match=r"--calibration-data .*chats.jsonl: no such file; expected JSONL"):
        run_bench(settings)
    (tmp_path / "chats.jsonl").write_text("")
    with pytest.raises(TargetLoadError):  # the same settings, the file there: on to loading the target
        run_bench(settings)


def test_a_question_folder_is_named_as_a_folder(tmp_path):
    """``--questions data/spec_bench/`` (the folder the help names as the default) said "not found"."""
    with pytest.raises(FileNotFoundError, match=r"is a folder; pass --questions the file in it \(such as .*question"):
        load_questions(tmp_path)


def test_a_binary_question_file_is_named(tmp_path):
    """A parquet file gave "'utf-8' codec can't decode byte 0x89 in position 0", naming neither file nor fix."""
    parquet = tmp_path / "question.parquet"
    parquet.write_bytes(b"PAR1\x89\x00\xff binary")
    with pytest.raises(ValueError, match=r"question file .*question.parquet is not UTF-8 text; expected a Spec-Bench"):
        load_questions(parquet)


@pytest.mark.parametrize(
    "argv, message",
    [
        # cut no layers: was refused after the target loaded as "the target has one layer"
        (["--assistant-layers", "0"], "argument --assistant-layers: expected an integer >= 1, got 0"),
        # transformers' "Invalid max_matching_ngram_size or num_output_tokens", after the target loaded
        (["--prompt-lookup-tokens", "0"], "argument --prompt-lookup-tokens: expected an integer >= 1, got 0"),
        (["--head", "h", "--lookup-branch", "-1"], "argument --lookup-branch: expected an integer >= 0, got -1"),
        (["--head", "h", "--drafter-window", "-2"], "argument --drafter-window: expected an integer >= 0, got -2"),
        (["--drafter-sinks", "-1"], "argument --drafter-sinks: expected an integer >= 0, got -1"),
    ],
)
def test_counts_below_their_floor_are_usage_errors(argv, message, capsys, monkeypatch):
    import specheads.bench.cli as bench_cli

    def measuring(settings):
        raise AssertionError("the benchmark would start here")

    monkeypatch.setattr(bench_cli, "run_bench", measuring)
    with pytest.raises(SystemExit):
        bench_main(argv)
    assert message in capsys.readouterr().err


def _stub(name: str, interrupt_on_call: int | None = None) -> Method:
    calls = iter(range(1, 100))

    def run(input_ids, max_new_tokens, temperature, seed):
        if next(calls) == interrupt_on_call:
            raise KeyboardInterrupt
        return MethodRun([1, 2, 3], 1.0, 3)

    return Method(name, run)


def test_ctrl_c_keeps_the_records_of_the_prompts_every_method_finished():
    from specheads.bench.runner import BenchmarkInterrupted

    prompts = [(Question(i, "qa", "p"), torch.zeros(1, 3, dtype=torch.long)) for i in (1, 2, 3)]
    methods = [_stub("base"), _stub("second", interrupt_on_call=2)]  # stopped in the second prompt, after base ran
    with pytest.raises(BenchmarkInterrupted) as stop:
        run_benchmark(methods, prompts, 3, warmup_tokens=0, progress=False)
    assert [(r.question.question_id, r.method) for r in stop.value.records] == [(1, "base"), (1, "second")]
    assert (stop.value.prompts_done, stop.value.prompts) == (1, 3) and isinstance(stop.value, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt) as nothing:  # nothing finished: nothing to report
        run_benchmark([_stub("base", interrupt_on_call=1)], prompts, 3, warmup_tokens=0, progress=False)
    assert not isinstance(nothing.value, BenchmarkInterrupted)


def test_a_bench_stopped_with_ctrl_c_reports_what_it_measured(tiny_llama, tmp_path, monkeypatch, capsys):
    """Ctrl-C during the timed runs lost every measurement: nothing was written. The finished prompts are now
    reported, marked partial, and the interrupt still stops the command (exit 130 from ``specheads``)."""
    import specheads.bench.cli as bench_cli

    real_build = bench_cli.build_methods
    settings = _settings(tmp_path)

    def build_then_stop_in_the_second_prompt(*args, **kwargs):
        methods = real_build(*args, **kwargs)
        last, timed = methods[-1], iter(range(1, 100))

        def run(input_ids, max_new_tokens, temperature, seed):
            if max_new_tokens == settings.max_new_tokens and next(timed) == 2:  # not the warm-up run
                raise KeyboardInterrupt
            return last.run(input_ids, max_new_tokens, temperature, seed)

        return [*methods[:-1], Method(last.name, run, last.lossless, last.description, last.extra)]

    monkeypatch.setattr(bench_cli, "build_methods", build_then_stop_in_the_second_prompt)
    with pytest.raises(KeyboardInterrupt):
        run_bench(settings, tiny_llama, ChatTokenizer())
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["config"]["interrupted"] == "after 1 of 2 prompts" and report["categories"] == ["qa"]
    assert report["results"]["specheads-plain"]["overall"]["prompts"] == 1
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "**Partial: interrupted (Ctrl-C) after 1 of 2 prompts;" in markdown.split("\n")[0]
    assert "interrupted after 1 of 2 prompts; the finished ones are in" in capsys.readouterr().err


def test_an_eagle3_checkpoint_from_another_tool_benches_like_a_saved_head(tiny_llama, tmp_path):
    """A SpecForge / vLLM-layout folder has no ``head_type``: its tree was checked from that field, and ``bench``
    stopped at "unknown head_type None" although ``load_head`` reads the folder."""
    from specheads.heads import EagleConfig, EagleHead, build_vocab_maps
    from specheads.heads.interop import export_head

    d2t, _ = build_vocab_maps(torch.randint(0, 128, (800,), generator=torch.Generator().manual_seed(0)), 128, 32)
    head = EagleHead(EagleConfig(version=3, draft_vocab_size=32), tiny_llama, d2t=d2t).eval()
    export_head(head, tiny_llama, tmp_path / "vllm-head", dtype=torch.float32)
    assert "head_type" not in json.loads((tmp_path / "vllm-head" / "config.json").read_text())
    settings = _settings(tmp_path, heads=[str(tmp_path / "vllm-head")], trees=["chain:2"])
    report, _ = run_bench(settings, tiny_llama, ChatTokenizer())
    row = report["results"]["specheads-vllm-head"]["overall"]
    assert row["compared"] == 2 and row["identical"] == 2, row
    with pytest.raises(ValueError, match=r"--head .*vllm-head: --tree EAGLE heads take --tree chain\[:D\]"):
        run_bench(_settings(tmp_path, heads=[str(tmp_path / "vllm-head")], trees=["small10"]))
