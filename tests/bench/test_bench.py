"""The benchmark end to end on the real target (tiny), and the report's bookkeeping with stub methods."""

from __future__ import annotations

import json
import re

import pytest
import torch

from specheads.bench.cli import BenchSettings, bench_main, run_bench
from specheads.bench.methods import Method, MethodRun
from specheads.bench.questions import Question
from specheads.bench.report import OVERALL, aggregate, markdown_report
from specheads.bench.runner import run_benchmark

QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write one sentence about the sea.", "More."]},
    {"question_id": 161, "category": "translation", "turns": ["Translate to English: Guten Morgen, Welt."]},
    {"question_id": 162, "category": "translation", "turns": ["Translate to English: Danke."]},
]


@pytest.mark.slow
def test_bench_end_to_end_on_smollm2(smollm2, tmp_path):
    from specheads.heads import MedusaConfig, MedusaHeads

    target, tokenizer = smollm2
    torch.manual_seed(0)
    head_dir = tmp_path / "medusa-untrained"
    MedusaHeads(MedusaConfig(num_heads=2, num_layers=1), target).save_pretrained(head_dir)
    questions = tmp_path / "question.jsonl"
    questions.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    settings = BenchSettings(
        questions=str(questions),
        per_category=1,
        max_new_tokens=16,
        heads=[str(head_dir)],
        trees=["chain:2"],
        methods=["specheads-plain"],
        out=str(tmp_path / "out"),
        backoff=True,
        lookup_branch=4,
        lookup_solo=2,
        progress=False,
    )
    report, paths = run_bench(settings, target, tokenizer)

    assert set(paths) == {"json", "markdown", "speedup_png", "acceptance_png"}
    loaded = json.loads(paths["json"].read_text())
    assert loaded["categories"] == ["mt_bench", "translation"]
    rows = loaded["config"]["cpu_kernel_rows"]  # what every method's few-row products ran with, as measured here
    assert all(isinstance(n, int) and 1 <= n <= 64 for n in rows) and rows == sorted(rows)
    assert list(loaded["results"]) == [
        "generate",
        "specheads-plain",
        "specheads-medusa-untrained",
        "specheads-medusa-untrained+backoff",
        "specheads-medusa-untrained+lookup",
        "specheads-medusa-untrained+lookup-solo",
    ]
    backoff = loaded["results"]["specheads-medusa-untrained+backoff"][OVERALL]
    assert backoff["identical"] == backoff["compared"] == 2  # drafting switched off and on stays lossless
    assert loaded["methods"]["specheads-medusa-untrained+backoff"]["backoff"] is True
    branch = loaded["results"]["specheads-medusa-untrained+lookup"][OVERALL]
    assert branch["identical"] == branch["compared"] == 2
    assert "chain:2 + lookup branch (up to 4 tokens" in loaded["methods"]["specheads-medusa-untrained+lookup"]["tree"]
    solo = loaded["results"]["specheads-medusa-untrained+lookup-solo"][OVERALL]
    assert solo["identical"] == solo["compared"] == 2
    assert "alone, without the head, on 2-gram" in loaded["methods"]["specheads-medusa-untrained+lookup-solo"]["tree"]
    plain = loaded["results"]["specheads-plain"][OVERALL]
    assert plain["tau"] == 1.0 and plain["identical"] == plain["compared"] == 2  # the loop alone: one token a step
    medusa = loaded["results"]["specheads-medusa-untrained"]
    assert medusa[OVERALL]["compared"] == 2 and medusa[OVERALL]["identical"] == 2  # greedy Medusa is lossless
    assert loaded["mismatches"] == []
    assert len(medusa[OVERALL]["acceptance_per_depth"]) == 2
    # tau from the steps: one prefill forward per prompt and one verify forward per step, each committing the drafts
    # it accepted and one token more (fewer where max_new_tokens or the end of the turn cuts the last step); the
    # per-prompt records give the same forwards
    hist = {int(k): n for k, n in medusa[OVERALL]["accepted_length_hist"].items()}
    forwards, accepted = medusa[OVERALL]["prompts"] + sum(hist.values()), sum(k * n for k, n in hist.items())
    assert medusa[OVERALL]["target_forwards"] == forwards
    assert forwards <= medusa[OVERALL]["new_tokens"] <= forwards + accepted
    per_prompt = [r for r in loaded["per_prompt"] if r["method"] == "specheads-medusa-untrained"]
    tokens = [r["new_tokens"] for r in per_prompt]
    assert sum(t / r["tau"] for t, r in zip(tokens, per_prompt)) == pytest.approx(forwards)
    assert medusa[OVERALL]["tau"] == pytest.approx(sum(tokens) / forwards)
    assert loaded["results"]["generate"][OVERALL]["speedup"] == 1.0
    markdown = paths["markdown"].read_text()
    assert "| specheads-medusa-untrained |" in markdown
    # the target handed in is the one named, not the settings' default; every category measured its 1 prompt
    assert loaded["config"]["target"] == target.config.name_or_path
    assert (
        f"Target `{target.config.name_or_path}`" in markdown and "16 new tokens, 1 prompt(s) per category," in markdown
    )
    for png in (paths["speedup_png"], paths["acceptance_png"]):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_says_when_a_category_had_fewer_prompts_than_asked():
    from specheads.bench.report import _prompts_per_category

    def report(counts):
        groups = {category: {"prompts": n} for category, n in counts.items()}
        return {"config": {"per_category": 3}, "baseline": "generate", "results": {"generate": groups}}

    assert _prompts_per_category(report({"qa": 3, "rag": 3, OVERALL: 6})) == "3 prompt(s) per category"
    assert _prompts_per_category(report({"qa": 3, "rag": 1, OVERALL: 4})) == (
        "up to 3 prompt(s) per category (measured: qa 3, rag 1)"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tree", "chain:3", "--backoff"], "--tree --backoff shape the heads' methods: they need --head DIR"),
        (["--lookup-branch", "4"], "--lookup-branch shape the heads' methods"),
        (["--methods", "specheads-plain", "--assistant", "runs/dm"], "hf-assisted, which --methods leaves out"),
        (["--assistant", "runs/dm", "--assistant-layers", "3"], "--assistant replaces it: give one"),
        (["--head", "h", "--tree", "chain:2", "--recalibrate"], "--recalibrate calibrate --tree auto, and every"),
        (["--head", "h", "--tree", "chain:2", "--calibration-data", "c.jsonl", "--calibration-prompts", "3"], "fixed"),
    ],
)
def test_options_that_would_be_ignored_are_refused(argv, message, capsys):
    """Without --head, the heads' options ran nothing and were still recorded in results.json as if applied; an
    --assistant without hf-assisted was never loaded."""
    with pytest.raises(SystemExit):
        bench_main(argv)
    assert message in capsys.readouterr().err


def test_baselines_decode_the_models_own_distribution(tiny_llama):
    """transformers' methods run without the target's own logits processing (repetition penalty, n-gram blocking:
    the speculative loop applies none, and warns), so at T=0 they match specheads; several EOS ids and no pad id
    (Llama-3 style) work; the target's generation config is left as it was."""
    from specheads.bench.methods import hf_method, specheads_method
    from tests.decoding.helpers import TinyTokenizer

    own = tiny_llama.generation_config
    own.repetition_penalty, own.no_repeat_ngram_size = 1.3, 2
    own.eos_token_id, own.pad_token_id = [126, 127], None
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning, match="which speculative decoding does not apply"):
        loop = specheads_method("specheads-plain", tiny_llama, TinyTokenizer(), None, "greedy")
    expected = loop.run(ids, 24, 0.0, 0).token_ids
    for method in (hf_method("generate", tiny_llama), hf_method("pl", tiny_llama, prompt_lookup_num_tokens=4)):
        assert method.run(ids, 24, 0.0, 0).token_ids == expected
    assert tiny_llama.generation_config is own and own.repetition_penalty == 1.3


def test_transformers_methods_run_with_the_kernels_specheads_verifies_with(tiny_llama):
    """Where this machine measured the other matrix kernel faster for few-row products, transformers' prompt lookup
    and assisted generation get it as specheads' methods do (target and assistant alike, for the call only), so the
    comparison measures drafting, not kernels; their output is unchanged and the layers are restored after."""
    from specheads.bench.methods import hf_method
    from specheads.decoding.tuning.cpu_kernels import SmallBatchLinear
    from specheads.heads import DraftModel

    kernels = SmallBatchLinear(rows=range(2, 65))  # as if this machine measured every few-row count faster
    assistant = DraftModel.from_target(tiny_llama, 1).model.eval()
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(2))
    seen = []  # (model, several rows?, swapped?) for every linear layer call

    def record(name):
        def hook(module, args):
            seen.append((name, args[0].numel() // args[0].shape[-1] > 1, "forward" in module.__dict__))

        return hook

    handles = [
        layer.register_forward_pre_hook(record(name))
        for name, model in (("target", tiny_llama), ("assistant", assistant))
        for layer in model.modules()
        if type(layer) is torch.nn.Linear
    ]
    stock = [
        hf_method(name, tiny_llama, **options).run(ids, 16, 0.0, 0).token_ids
        for name, options in (("pl", {"prompt_lookup_num_tokens": 4}), ("as", {"assistant": assistant}))
    ]
    assert seen and not any(swapped for *_, swapped in seen)
    seen.clear()
    shared = [
        hf_method(name, tiny_llama, kernels=kernels, **options).run(ids, 16, 0.0, 0).token_ids
        for name, options in (("pl", {"prompt_lookup_num_tokens": 4}), ("as", {"assistant": assistant}))
    ]
    for handle in handles:
        handle.remove()
    assert shared == stock
    assert {(name, True) for name in ("target", "assistant")} <= {(name, rows) for name, rows, _ in seen}
    assert all(swapped for *_, swapped in seen)  # every call ran inside the block (one row keeps F.linear inside)
    assert not any("forward" in layer.__dict__ for m in (tiny_llama, assistant) for layer in m.modules())


def test_assistant_must_be_a_draft_model(tiny_llama, tmp_path):
    from specheads.bench.cli import build_methods
    from specheads.heads import EagleConfig, EagleHead

    EagleHead(EagleConfig(version=1), tiny_llama).save_pretrained(tmp_path / "eagle")
    settings = BenchSettings(methods=["hf-assisted"], assistant=str(tmp_path / "eagle"))
    with pytest.raises(ValueError, match="is a head of type 'eagle'; transformers' assisted generation needs a draft"):
        build_methods(settings, tiny_llama, None, [])


@pytest.mark.slow
def test_calibration_names_only_the_questions_it_used(smollm2, tmp_path):
    from specheads.bench.calibration import calibration_prompts

    _, tokenizer = smollm2
    held_out = [Question(81, "mt_bench", "Write one sentence about the sea.")]
    prompts, source, ids = calibration_prompts(tokenizer, 1, torch.device("cpu"), held_out)
    assert len(prompts) == 1 and ids == [81] and source.startswith("held-out")
    prompts, source, ids = calibration_prompts(tokenizer, 3, torch.device("cpu"), held_out)  # too few: the data
    assert len(prompts) == 3 and ids == [] and "training data" in source

    # --calibration-data: the first user turn of each chat (after a system message too)
    chats = tmp_path / "chats.jsonl"
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a blue fruit."}]
    chats.write_text(json.dumps({"messages": turns}) + "\n" + json.dumps({"messages": turns[1:]}) + "\n")
    prompts, source, ids = calibration_prompts(tokenizer, 3, torch.device("cpu"), held_out, chats)
    assert len(prompts) == 2 and ids == [] and source == "chats.jsonl (chats)"
    assert all("Name a blue fruit." in tokenizer.decode(p) and "Be brief" not in tokenizer.decode(p) for p in prompts)
    chats.write_text('{"text": "not a chat"}\n')
    with pytest.raises(ValueError, match=r"chats.jsonl, line 1: expected a JSON chat with a 'messages' list"):
        calibration_prompts(tokenizer, 3, torch.device("cpu"), held_out, chats)


def _auto_bench(tmp_path, tiny_llama, monkeypatch, **settings):
    """Settings for --tree auto on a question file whose one question is measured: nothing is left to calibrate on,
    and (as in an installed wheel) there is no data/ folder to fall back on."""
    import specheads.bench.calibration
    import specheads.target
    from specheads.heads import MedusaConfig, MedusaHeads

    def no_target(*args, **kwargs):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr(specheads.target, "load_target", no_target)
    monkeypatch.setattr(specheads.bench.calibration, "DEFAULT_CALIBRATION_DATA", tmp_path / "not-in-a-wheel.jsonl")
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    MedusaHeads(MedusaConfig(num_heads=2, num_layers=1), tiny_llama).save_pretrained(tmp_path / "medusa")
    questions = tmp_path / "question.jsonl"
    questions.write_text(json.dumps(QUESTIONS[0]) + "\n")
    head, out = str(tmp_path / "medusa"), str(tmp_path / "out")
    defaults = dict(questions=str(questions), per_category=1, heads=[head], methods=[], out=out, progress=False)
    return BenchSettings(**{**defaults, **settings})


def test_an_auto_tree_with_nothing_to_calibrate_on_fails_before_the_target_loads(tiny_llama, tmp_path, monkeypatch):
    """It calibrated on zero prompts, recorded ``question_ids: []`` and cached that tree for specheads generate."""
    settings = _auto_bench(tmp_path, tiny_llama, monkeypatch)
    with pytest.raises(ValueError, match=r"has none left after the 1 measured ones.*Pass --calibration-data FILE"):
        run_bench(settings)
    with pytest.raises(ValueError, match=r"--calibration-prompts N >= 1, got 0"):
        run_bench(_auto_bench(tmp_path, tiny_llama, monkeypatch, calibration_prompts=0))
    with pytest.raises(FileNotFoundError, match=r"--calibration-data .*missing.jsonl: no such file"):
        run_bench(_auto_bench(tmp_path, tiny_llama, monkeypatch, calibration_data=str(tmp_path / "missing.jsonl")))
    fixed = _auto_bench(tmp_path, tiny_llama, monkeypatch, trees=["chain:2"])  # a fixed tree needs no calibration
    with pytest.raises(AssertionError, match="the target was loaded"):
        run_bench(fixed)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_no_auto_tree_is_chosen_or_cached_from_no_calibration_prompts(tiny_llama, tmp_path, monkeypatch):
    from specheads.bench.cli import build_methods

    settings = _auto_bench(tmp_path, tiny_llama, monkeypatch)
    with pytest.raises(ValueError, match=r"--tree auto needs calibration prompts and got none; pass --calibration"):
        build_methods(settings, tiny_llama, None, [])
    assert not (tmp_path / "cache").exists()


def test_bench_without_matplotlib_says_so_before_measuring(tmp_path, capsys, monkeypatch):
    import sys

    import specheads.bench.cli as bench_cli

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError

    def measuring(settings):
        raise ValueError("the measurement would start here")

    monkeypatch.setattr(bench_cli, "run_bench", measuring)
    assert bench_main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    note = "note: matplotlib is not installed, so the plots (speedup.png, acceptance.png) are skipped; pip install "
    assert err.index(note + "'specheads[plots]'") < err.index("the measurement would start here")


def test_recalibrate_is_accepted_from_older_command_lines_with_a_note(tmp_path, capsys, monkeypatch):
    """Every auto calibration now times the verify cost itself: --recalibrate (in results.md's older commands) runs
    and says it is no longer needed, instead of failing on an unknown option."""
    import specheads.bench.cli as bench_cli

    def measuring(settings):
        raise ValueError(f"the measurement would start here, recalibrate={settings.recalibrate}")

    monkeypatch.setattr(bench_cli, "run_bench", measuring)
    assert bench_main(["--head", "h", "--tree", "auto", "--recalibrate", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "note: --recalibrate is no longer needed: every --tree auto calibration times the target's verify" in err
    assert "the measurement would start here, recalibrate=True" in err


def stub(name: str, tokens: list[int], seconds: float, forwards: int, lossless: bool = True) -> Method:
    def run(input_ids, max_new_tokens, temperature, seed):
        return MethodRun(list(tokens), seconds, forwards, accepted_lengths=[1] * (forwards - 1))

    return Method(name, run, lossless=lossless)


def test_the_report_prints_each_auto_trees_curve_once_with_its_context():
    """Each auto tree is priced on the curve its calibration timed, at its own context: the report prints each
    one (a head's variants share their head's) instead of one curve as if it were every head's."""
    prompts = [(Question(1, "a", "p"), torch.zeros(1, 3, dtype=torch.long))]
    curve = {"sizes": [1, 2], "seconds": [0.040, 0.044], "device": "cpu-x", "dtype": "float32", "prefix_len": 412}
    longer = {**curve, "seconds": [0.050, 0.061], "prefix_len": 690}
    methods = [stub("base", [1, 2], 2.0, 2)]
    given = {"sizes": [1, 2], "seconds": [0.030, 0.031], "device": "", "dtype": ""}  # by hand: no context length
    for name, timed in (("head-a", curve), ("head-a+lookup", curve), ("head-b", longer), ("head-c", given)):
        methods.append(stub(name, [1, 2], 1.0, 1))
        methods[-1].extra = {"tree": "auto", "auto_tree": {"choices": [[0]]}, "cost_curve": timed}
    records = run_benchmark(methods, prompts, max_new_tokens=2, warmup_tokens=0, progress=False)
    text = markdown_report(aggregate(records, methods, {"temperature": 0.0}))
    assert "as each auto tree's calibration timed it (cpu-x, float32):" in text
    assert "- `head-a`, `head-a+lookup` (412-token context): 1: 40 ms, 2: 44 ms" in text
    assert "- `head-b` (690-token context): 1: 50 ms, 2: 61 ms" in text
    assert "- `head-c`: 1: 30 ms, 2: 31 ms" in text


def test_identical_counts_speedup_and_loud_mismatches():
    prompts = [(Question(i, c, "p"), torch.zeros(1, 3, dtype=torch.long)) for i, c in [(1, "a"), (2, "b")]]
    methods = [
        stub("base", [1, 2, 3, 4], 2.0, 4),
        stub("same", [1, 2, 3, 4], 1.0, 2),
        stub("wrong", [1, 2, 9, 9], 1.0, 2),
        stub("typical", [1, 2, 9, 9], 0.5, 2, lossless=False),
    ]
    records = run_benchmark(methods, prompts, max_new_tokens=4, warmup_tokens=0, progress=False)
    report = aggregate(records, methods, {"temperature": 0.0})
    overall = {name: groups[OVERALL] for name, groups in report["results"].items()}
    assert overall["same"]["identical"] == 2 and overall["wrong"]["identical"] == 0
    assert overall["same"]["speedup"] == 2.0 and overall["same"]["tau"] == 2.0
    assert {(m["method"], m["question_id"]) for m in report["mismatches"]} == {("wrong", 1), ("wrong", 2)}
    assert "MISMATCHES" in markdown_report(report)
    sampled = aggregate(records, methods, {"temperature": 1.0})
    assert sampled["mismatches"] == []  # outputs are not expected to match when sampling
    sampled_overall = sampled["results"]["same"][OVERALL]
    assert sampled_overall["identical"] is None and sampled_overall["compared"] == 0  # nothing compared, not "0 of 2"
    # on the CPU no per-method peak memory is claimed; the process's peak RSS is reported once
    assert overall["same"]["peak_mem_mb"] is None and report["process_peak_rss_mb"] > 0
    assert "| n/a (CPU) |" in markdown_report(report) and "MB RSS" in markdown_report(report)


def timed_stub(name: str, tokens: list[int], seconds: list[float], forwards: int) -> Method:
    """A method whose successive runs take the given times in turn (a slow outlier among them)."""
    times = iter(seconds)

    def run(input_ids, max_new_tokens, temperature, seed):
        return MethodRun(list(tokens), next(times), forwards, accepted_lengths=[1] * (forwards - 1))

    return Method(name, run, lossless=True)


def test_repeats_report_the_median_run_and_the_noise_floor():
    prompts = [(Question(1, "a", "p"), torch.zeros(1, 3, dtype=torch.long))]
    methods = [
        timed_stub("base", [1, 2, 3, 4], [2.0, 2.2, 2.1], 4),
        timed_stub("specheads-plain", [1, 2, 3, 4], [2.0, 30.0, 2.1], 4),  # one 30 s outlier on a busy machine
        timed_stub("fast", [1, 2, 3, 4], [1.0, 1.1, 9.0], 2),
    ]
    records = run_benchmark(methods, prompts, max_new_tokens=4, warmup_tokens=0, progress=False, repeats=3)
    assert [r.run.seconds for r in records] == [2.1, 2.1, 1.1]  # the medians: the outliers move nothing
    assert records[1].repeat_seconds == [2.0, 30.0, 2.1]
    report = aggregate(records, methods, {"temperature": 0.0, "repeats": 3})
    assert report["noise"]["plain_loop_speedup"] == 1.0
    assert report["results"]["fast"][OVERALL]["speedup"] == pytest.approx(2.1 / 1.1)
    header = markdown_report(report).split("\n")[0]
    assert "each (prompt, method) ran 3 times" in header and "`specheads-plain` (drafts nothing) read 1.00x" in header
    # a single run says nothing about repeats, and no plain loop means no noise floor to print
    base = [timed_stub("base", [1, 2, 3, 4], [2.0], 4)]
    single = run_benchmark(base, prompts, max_new_tokens=4, warmup_tokens=0, progress=False)
    single_header = markdown_report(aggregate(single, base, {"temperature": 0.0})).split("\n")[0]
    assert "times" not in single_header and "noise floor" not in single_header


def test_repeats_report_the_largest_peak_memory(monkeypatch):
    """The record kept the last repeat's peak, not the largest."""
    peaks = iter([5.0, 9.0, 7.0])
    monkeypatch.setattr("specheads.bench.runner.peak_memory_mb", lambda device: next(peaks))
    prompts = [(Question(1, "a", "p"), torch.zeros(1, 3, dtype=torch.long))]
    methods = [timed_stub("base", [1, 2], [2.0, 2.2, 2.1], 2)]
    records = run_benchmark(methods, prompts, max_new_tokens=2, warmup_tokens=0, progress=False, repeats=3)
    assert records[0].peak_mem_mb == 9.0


def test_repeats_that_disagree_on_tokens_at_t0_are_mismatches_not_a_lost_run(capsys):
    """A greedy method whose repeats differed raised a RuntimeError at that prompt: every measurement of the run was
    lost. Each repeat is now compared with the baseline, a differing one is the method's mismatch in the report, and
    a baseline that disagrees with itself is a warning."""
    prompts = [(Question(i, "a", "p"), torch.zeros(1, 3, dtype=torch.long)) for i in (1, 2)]
    base_out = iter([[1, 2], [1, 2], [5, 6], [5, 7]])  # question 2: the baseline's own repeats differ
    other_out = iter([[1, 2], [1, 3], [5, 6], [5, 6]])  # question 1: its second repeat differs

    def base(input_ids, max_new_tokens, temperature, seed):
        return MethodRun(next(base_out), 1.0, 2)

    def other(input_ids, max_new_tokens, temperature, seed):
        return MethodRun(next(other_out), 1.0, 2)

    methods = [Method("base", base), Method("other", other)]
    records = run_benchmark(methods, prompts, max_new_tokens=2, warmup_tokens=0, progress=False, repeats=2)
    assert [(r.question.question_id, r.method, r.identical) for r in records] == [
        (1, "base", None),
        (1, "other", False),
        (2, "base", None),
        (2, "other", True),  # equal to the baseline's first run
    ]
    report = aggregate(records, methods, {"temperature": 0.0, "repeats": 2})
    assert [(m["method"], m["question_id"]) for m in report["mismatches"]] == [("other", 1)]
    # what a near-tie check compares: the repeat that differed, not the median run (which may not differ)
    assert records[1].parted == ([1, 2], [[1, 3]]) and records[3].parted is None
    assert "base gave different tokens on repeats of question 2 at T=0" in capsys.readouterr().err


def test_sampled_repeats_may_differ_and_keep_the_run_of_median_time_per_token():
    """At T>0 draft backoff (timed decisions) spends the random stream differently each run: the benchmark raised
    after running every prompt, and the whole run was lost."""
    prompts = [(Question(1, "a", "p"), torch.zeros(1, 3, dtype=torch.long))]
    outputs = iter([([1, 2], 1.0), ([1, 3, 4, 5], 1.2), ([1, 3, 4], 3.0)])  # 0.5, 0.3 and 1.0 s a token

    def run(input_ids, max_new_tokens, temperature, seed):
        tokens, seconds = next(outputs)
        return MethodRun(tokens, seconds, 2)

    methods = [Method("base", run)]
    records = run_benchmark(methods, prompts, 4, temperature=1.0, warmup_tokens=0, progress=False, repeats=3)
    assert records[0].run.token_ids == [1, 2] and records[0].repeat_seconds == [1.0, 1.2, 3.0]
    # their spread is read per token: 0.3 to 1.0 s a token around 0.5 (in raw seconds it read (3.0 - 1.0) / 1.2)
    spread = aggregate(records, methods, {"temperature": 1.0, "repeats": 3})["noise"]["repeat_spread"]
    assert spread == pytest.approx((1.0 - 0.3) / 0.5)


def test_repeats_below_one_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench_main(["--repeats", "0"])
    assert "--repeats 0: expected a number of runs per (prompt, method), at least 1" in capsys.readouterr().err


def test_report_header_says_which_rows_ran_the_other_kernel():
    prompts = [(Question(1, "a", "p"), torch.zeros(1, 3, dtype=torch.long))]
    methods = [stub("base", [1, 2], 2.0, 2), stub("same", [1, 2], 1.0, 1)]
    records = run_benchmark(methods, prompts, max_new_tokens=2, warmup_tokens=0, progress=False)

    def header(rows):
        return markdown_report(aggregate(records, methods, {"temperature": 0.0, "cpu_kernel_rows": rows})).split("\n")[
            0
        ]

    assert "W @ x.T" not in header([])  # stock kernels everywhere (a GPU, bf16, or a CPU where F.linear won)
    assert "Matrix products of 2-8 rows ran as `(W @ x.T).T` in every method" in header(list(range(2, 9)))
    assert "Matrix products of 2, 4 rows" in header([2, 4])
    assert "Matrix products of 1-8 rows ran as `(W @ x.T).T` (one row padded to two) in every" in header([*range(1, 9)])
    gqa = markdown_report(aggregate(records, methods, {"temperature": 0.0, "cpu_gqa_attention": True}))
    assert "ran as grouped-query SDPA" in gqa.split("\n")[0] and "grouped-query" not in header([2, 4])


def test_report_files_replace_an_earlier_runs_together(tmp_path):
    """The four report files are made aside and renamed into place: no earlier run's plot survives beside new
    numbers, and no temporary folder is left."""
    from specheads.bench.report import write_report

    prompts = [(Question(1, "a", "p"), torch.zeros(1, 3, dtype=torch.long))]
    methods = [stub("base", [1, 2], 2.0, 2), stub("fast", [1, 2], 1.0, 1)]
    report = aggregate(run_benchmark(methods, prompts, 2, warmup_tokens=0, progress=False), methods, {})
    (tmp_path / "speedup.png").write_bytes(b"an earlier run's plot")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no method drafted a tree: a note on the plot, not an empty legend's warning
        paths = write_report(report, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths.values())
    assert paths["speedup_png"].read_bytes()[:4] == b"\x89PNG" and json.loads(paths["json"].read_text())["results"]


def test_report_without_matplotlib_still_writes_the_numbers(tmp_path, monkeypatch):
    """Without the plots extra the benchmark ran, then lost everything in the plotting step: the JSON and markdown
    are written whatever happens to the plots, and an earlier run's plots are not left beside the new numbers."""
    import sys

    from specheads.bench.report import write_report

    prompts = [(Question(1, "a", "p"), torch.zeros(1, 3, dtype=torch.long))]
    methods = [stub("base", [1, 2], 2.0, 2), stub("fast", [1, 2], 1.0, 1)]
    report = aggregate(run_benchmark(methods, prompts, 2, warmup_tokens=0, progress=False), methods, {})
    (tmp_path / "speedup.png").write_bytes(b"an earlier run's plot")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    with pytest.warns(UserWarning, match=r"matplotlib is not installed.*skipped; pip install 'specheads\[plots\]'"):
        paths = write_report(report, tmp_path)
    assert set(paths) == {"json", "markdown"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]
    assert json.loads(paths["json"].read_text())["results"]["fast"][OVERALL]["speedup"] == 2.0
    assert "| fast |" in paths["markdown"].read_text()


def test_16bit_mismatches_at_an_exact_tie_are_near_ties_and_others_stay_mismatches():
    """In bf16 a verify forward over several tokens rounds differently from generate's one-token steps, which can
    flip a tie. A tiny bf16 target whose lm_head has two equal rows ties them exactly: an output taking the twin is a
    near-tie (reported, not a failure); one taking a token the target rated far lower stays a mismatch; in fp32
    every difference is a mismatch."""
    from specheads.bench.runner import mark_near_ties
    from tests.tiny_models import make_tiny_llama

    model = make_tiny_llama().to(torch.bfloat16)
    prompt = torch.tensor([[5, 17, 3, 99, 42]])
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=4)
    expected = expected[0, prompt.shape[1] :].tolist()
    with torch.no_grad():
        logits = model(input_ids=torch.cat([prompt[0], torch.tensor(expected[:2])])[None]).logits[0, -1]
    chosen = expected[2]
    twin = next(t for t in range(chosen + 1, 128) if t not in expected)  # a higher id: greedy still picks `chosen`
    worst = int(logits.argmin())
    with torch.no_grad():
        model.lm_head.weight[twin] = model.lm_head.weight[chosen]
    prompts = [(Question(1, "a", "p"), prompt)]
    methods = [
        stub("base", expected, 2.0, 4),
        stub("tie", [*expected[:2], twin, *expected[3:]], 1.0, 2),
        stub("wrong", [*expected[:2], worst, *expected[3:]], 1.0, 2),
    ]
    records = run_benchmark(methods, prompts, max_new_tokens=4, warmup_tokens=0, progress=False)
    mark_near_ties(records, model, prompts)
    report = aggregate(records, methods, {"temperature": 0.0, "dtype": "bfloat16"})
    assert [m["method"] for m in report["mismatches"]] == ["wrong"]
    assert [(m["method"], m["gap"]) for m in report["near_ties"]] == [("tie", 0.0)]
    assert report["results"]["tie"][OVERALL]["near_ties"] == 1
    assert "0/1 (+1 near-tie)" in markdown_report(report)

    records = run_benchmark(methods, prompts, max_new_tokens=4, warmup_tokens=0, progress=False)
    mark_near_ties(records, model.float(), prompts)
    assert [m["method"] for m in aggregate(records, methods, {"temperature": 0.0})["mismatches"]] == ["tie", "wrong"]

    # repeats that differ each their own way: one near-tie does not excuse a repeat that took a far worse token
    outputs = iter([[*expected[:2], twin, *expected[3:]], [*expected[:2], worst, *expected[3:]]])
    mixed = Method("mixed", lambda input_ids, max_new_tokens, temperature, seed: MethodRun(next(outputs), 1.0, 2))
    pair = [stub("base", expected, 2.0, 4), mixed]
    records = run_benchmark(pair, prompts, max_new_tokens=4, warmup_tokens=0, progress=False, repeats=2)
    mark_near_ties(records, model, prompts)
    assert records[1].near_tie is None and len(records[1].parted[1]) == 2
    assert [m["method"] for m in aggregate(records, pair, {"temperature": 0.0})["mismatches"]] == ["mixed"]


def test_a_16bit_runner_up_a_few_ulps_below_is_a_mismatch_not_a_near_tie():
    """Near-ties were allowed 8 ulps of the largest logit (a whole logit at SmolLM2's scale in bf16), where real
    kernel-order flips measure 0-2: a method picking the runner-up by mistake was often excused."""
    from specheads.bench.runner import NEAR_TIE_ULPS, mark_near_ties
    from tests.tiny_models import make_tiny_llama

    model = make_tiny_llama().to(torch.bfloat16)
    prompt = torch.tensor([[5, 17, 3, 99, 42]])

    def greedy():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=4)
        return out[0, prompt.shape[1] :].tolist()

    def last_logits(prefix):
        with torch.no_grad():
            return model(input_ids=torch.cat([prompt[0], torch.tensor(prefix)])[None]).logits[0, -1].float()

    expected = greedy()
    chosen = expected[2]
    other = next(t for t in range(chosen + 1, 128) if t not in expected)
    row = model.lm_head.weight[chosen].clone()
    for factor in torch.linspace(0.999, 0.9, 200):  # a runner-up 5 to 8 ulps below the chosen token
        with torch.no_grad():
            model.lm_head.weight[other] = row * factor
        logits = last_logits(expected[:2])
        ulp = 2.0 ** (torch.floor(torch.log2(logits.abs().max())).item() - 7)
        gap = (logits[chosen] - logits[other]).item() / ulp
        if 5 <= gap <= 8:
            break
    assert 5 <= gap <= 8 and greedy() == expected
    methods = [stub("base", expected, 2.0, 4), stub("runner-up", [*expected[:2], other, *expected[3:]], 1.0, 2)]
    prompts = [(Question(1, "a", "p"), prompt)]
    records = run_benchmark(methods, prompts, max_new_tokens=4, warmup_tokens=0, progress=False)
    mark_near_ties(records, model, prompts)
    report = aggregate(records, methods, {"temperature": 0.0, "dtype": "bfloat16"})
    assert [m["method"] for m in report["mismatches"]] == ["runner-up"] and NEAR_TIE_ULPS < gap


def test_lookup_solo_without_a_branch_is_refused_before_loading_anything(capsys):
    with pytest.raises(SystemExit):
        bench_main(["--head", "runs/none", "--lookup-solo", "2"])
    assert "--lookup-solo 2 needs --lookup-branch N (N >= 1)" in capsys.readouterr().err


def test_bench_refuses_an_automatic_solo_length_on_a_fixed_tree_and_bad_lengths(capsys):
    with pytest.raises(SystemExit):
        bench_main(["--head", "runs/none", "--tree", "chain:2", "--lookup-branch", "5", "--lookup-solo", "auto"])
    assert "priced on the auto tree's calibration: it needs --tree auto" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["--head", "runs/none", "--lookup-branch", "5", "--lookup-solo", "two"])
    assert "expected an n-gram length (2 or 3) or 'auto', got 'two'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["--head", "runs/none", "--lookup-branch", "5", "--lookup-solo", "4"])
    assert "the lookup branch matches, 2 to 3, or 'auto'; got 4" in capsys.readouterr().err


def test_one_head_under_two_trees_gets_a_method_each(tmp_path, tiny_llama):
    """The same folder given twice with another tree (auto and a fixed chain) is told apart by its tree, variants
    included; given twice with one tree it is still refused (the case below)."""
    from specheads.bench.lineup import build_methods
    from specheads.bench.settings import BenchSettings
    from specheads.heads import MedusaConfig, MedusaHeads
    from tests.decoding.helpers import TinyTokenizer

    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(tmp_path / "x")
    settings = BenchSettings(heads=[str(tmp_path / "x")] * 2, trees=["chain:2", "chain:1"], methods=[], lookup_branch=3)
    methods = build_methods(settings, tiny_llama, TinyTokenizer(), [])
    names = [
        "generate",
        "specheads-x@chain:2",
        "specheads-x@chain:2+lookup",
        "specheads-x@chain:1",
        "specheads-x@chain:1+lookup",
    ]
    assert [m.name for m in methods] == names
    assert [methods[i].extra["tree"].split(" ")[0] for i in (1, 2, 3, 4)] == ["chain:2"] * 2 + ["chain:1"] * 2


@pytest.mark.parametrize(
    ("heads", "flags", "clash"),
    [
        (["a/plain"], [], "specheads-plain"),  # a built-in method's name
        (["a/x+backoff", "b/x"], ["--backoff"], "specheads-x+backoff"),  # the second head's variant
        (["a/x", "b/x+lookup"], ["--lookup-branch", "4"], "specheads-x+lookup"),
        (["a/x", "b/x"], [], "specheads-x"),
    ],
)
def test_a_head_named_like_another_method_is_refused(tmp_path, tiny_llama, heads, flags, clash):
    """Runs are keyed by method name: a head named like a variant of another (x+backoff beside x --backoff) got two
    methods of one name, whose runs were mixed into one median; a folder named like a built-in got a wrong error."""
    from specheads.bench.lineup import build_methods
    from specheads.bench.settings import BenchSettings
    from specheads.heads import MedusaConfig, MedusaHeads
    from tests.decoding.helpers import TinyTokenizer

    for head in heads:
        MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(tmp_path / head)
    options = {"backoff": "--backoff" in flags, "lookup_branch": 4 if "--lookup-branch" in flags else 0}
    folders = [str(tmp_path / head) for head in heads]
    settings = BenchSettings(heads=folders, trees=["chain:2"], methods=["specheads-plain"], **options)
    with pytest.raises(ValueError, match=f"would be reported as '{re.escape(clash)}', a name another method"):
        build_methods(settings, tiny_llama, TinyTokenizer(), [])
