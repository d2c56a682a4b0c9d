"""``specheads generate``: plain decoding, a saved head, prompt lookup; tree settings for every head type."""

from __future__ import annotations

import json

import pytest
import torch

from specheads.decoding.cli import generate_main
from specheads.decoding.draft_model_drafter import DraftModelDrafter
from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.head_drafter import build_drafter
from specheads.decoding.medusa_drafter import MedusaDrafter
from specheads.heads import DraftModel, EagleConfig, EagleHead, MedusaConfig, MedusaHeads
from specheads.heads.interop import export_head

pytestmark = pytest.mark.slow


def test_generate_plain_then_medusa_head_then_lookup(smollm2, tmp_path, capsys):
    model, _ = smollm2
    MedusaHeads(MedusaConfig(num_heads=2, share_lm_head=True), model).save_pretrained(tmp_path / "medusa")
    common = ["--prompt", "Name a colour.", "--max-new-tokens", "6"]
    assert generate_main(common) == 0
    plain = capsys.readouterr()
    assert "plain decoding" in plain.err and "tau 1.00" in plain.err and plain.out.strip()
    assert generate_main([*common, "--head", str(tmp_path / "medusa"), "--tree", "chain:2"]) == 0
    medusa = capsys.readouterr()
    assert medusa.out == plain.out and "MedusaDrafter" in medusa.err  # greedy: same text
    assert generate_main([*common, "--prompt-lookup", "--temperature", "0.8", "--seed", "3"]) == 0
    assert "PromptLookupDrafter" in capsys.readouterr().err
    assert (
        generate_main([*common, "--head", str(tmp_path / "medusa"), "--tree", "chain:2", "--lookup-branch", "4"]) == 0
    )
    branch = capsys.readouterr()
    assert (
        branch.out == plain.out
        and "LookupBranchDrafter" in branch.err
        and "lookup branch (up to 4 tokens" in branch.err
    )
    medusa_branch = ["--head", str(tmp_path / "medusa"), "--tree", "chain:2", "--lookup-branch", "4"]
    assert generate_main([*common, *medusa_branch, "--lookup-solo", "2"]) == 0
    solo = capsys.readouterr()
    assert solo.out == plain.out and "alone, without the head, on 2-gram or longer matches" in solo.err
    for bad in (["--lookup-branch", "3"], ["--head", str(tmp_path / "medusa"), "--lookup-branch", "-1"]):
        with pytest.raises(SystemExit):
            generate_main([*common, *bad])
    assert "--lookup-branch takes a token count >= 1 and needs --head" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        generate_main([*common, "--head", str(tmp_path / "medusa"), "--lookup-solo", "2"])
    assert "--lookup-solo 2 needs --lookup-branch N" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        generate_main([*common, *medusa_branch, "--lookup-solo", "1"])
    assert "the lookup-alone length is an n-gram length the lookup branch matches, 2 to 3" in capsys.readouterr().err


def test_generate_with_a_medusa2_head_says_it_decodes_the_adapted_target(smollm2, tmp_path, capsys):
    """A Medusa-2 head's LoRA adapter is applied to the target before decoding: the output is exact for the adapted
    model, not for the --target named, and the CLI says so (once up front, and in the stats line)."""
    from peft import LoraConfig, get_peft_model

    from specheads.target import load_target

    model, _ = smollm2
    MedusaHeads(MedusaConfig(num_heads=2, share_lm_head=True), model).save_pretrained(tmp_path / "medusa2")
    private, _ = load_target("smollm2-135m-instruct")  # peft injects into the model it wraps: not the fixture's
    get_peft_model(private, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(
        tmp_path / "medusa2" / "lora"
    )
    argv = ["--prompt", "Name a colour.", "--max-new-tokens", "4", "--head", str(tmp_path / "medusa2")]
    assert generate_main([*argv, "--tree", "chain:2"]) == 0
    err = capsys.readouterr().err
    assert "is a Medusa-2 head, trained with a LoRA adapter on the target: decoding runs smollm2-135m-instruct" in err
    assert "cpu float32, target + LoRA adapter]" in err
    assert "trained for target" not in err  # its own adapter: no "other weights" warning


def test_generate_in_bfloat16_with_a_medusa_head_and_clear_device_errors(smollm2, tmp_path, capsys):
    """--dtype/--device load the target as asked (the default, auto, is bf16 on a GPU); a head saved from the fp32
    target loads onto the bf16 one and decodes."""
    model, _ = smollm2
    MedusaHeads(MedusaConfig(num_heads=2, share_lm_head=True), model).save_pretrained(tmp_path / "medusa")
    common = ["--prompt", "Name a colour.", "--max-new-tokens", "6", "--device", "cpu"]
    assert generate_main([*common, "--dtype", "bfloat16", "--head", str(tmp_path / "medusa"), "--tree", "chain:2"]) == 0
    out = capsys.readouterr()
    assert "MedusaDrafter" in out.err and "; cpu bfloat16]" in out.err and out.out.strip()
    assert generate_main([*common, "--max-new-tokens", "1"]) == 0
    assert "; cpu float32]" in capsys.readouterr().err  # auto on a CPU
    for flag, value, message in [
        ("--device", "cuda:99", "--device 'cuda:99': this machine has"),
        ("--device", "tpu-ish", "expected a device such as auto, cpu, cuda or cuda:1, got 'tpu-ish'"),
        ("--dtype", "int8", "--dtype: expected one of ('auto', 'float32', 'bfloat16', 'float16'), got 'int8'"),
    ]:
        with pytest.raises(SystemExit):
            generate_main([*common, flag, value])
        assert message in capsys.readouterr().err


def test_generate_auto_tree_calibrates_once_then_reuses_the_cache(smollm2, tmp_path, capsys, monkeypatch):
    from specheads.decoding.tuning import auto_tree
    from specheads.target import cache_root

    model, _ = smollm2
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "targets").symlink_to(cache_root() / "targets")  # the converted SmolLM2, not the auto trees
    monkeypatch.setenv("SPECHEADS_CACHE", str(cache))
    # fewer and shorter calibration runs than the built-in six (the tiny-model test covers those)
    monkeypatch.setattr(auto_tree, "BUILTIN_CALIBRATION_PROMPTS", auto_tree.BUILTIN_CALIBRATION_PROMPTS[:2])
    monkeypatch.setattr(auto_tree, "CALIBRATION_TOKENS", 8)
    MedusaHeads(MedusaConfig(num_heads=2, num_layers=1), model).save_pretrained(tmp_path / "medusa")
    common = ["--prompt", "Name a colour.", "--max-new-tokens", "6", "--head", str(tmp_path / "medusa")]
    assert generate_main([*common, "--tree", "auto"]) == 0
    first = capsys.readouterr()
    assert "auto tree: calibrating the head on 2 built-in prompts (8 tokens each)" in first.err
    assert "tree auto: " in first.err and len(list((cache / "auto_trees").glob("*.json"))) == 1
    assert "then timing the target's verify cost on cpu-" in first.err and not (cache / "cost_model").exists()
    assert generate_main([*common, "--tree", "auto", "--lookup-branch", "4"]) == 0
    second = capsys.readouterr()
    assert "calibrating" not in second.err and "tree auto, cached from 2 built-in prompts" in second.err
    assert second.out == first.out and "lookup branch (up to 4 tokens" in second.err  # greedy: the target's text
    # --lookup-solo auto is priced on a calibration run, which a cached tree does not keep: calibrate once more, then
    # the priced length is cached with the tree for this branch size
    solo_auto = [*common, "--tree", "auto", "--lookup-branch", "4", "--lookup-solo", "auto"]
    assert generate_main(solo_auto) == 0
    third = capsys.readouterr()
    assert "has no lookup-alone length priced for a 4-token branch" in third.err and "calibrating" in third.err
    (entry,) = (cache / "auto_trees").glob("*.json")
    assert third.out == first.out and list(json.loads(entry.read_text())["lookup_solo"]) == ["4"]
    assert generate_main(solo_auto) == 0
    fourth = capsys.readouterr()
    assert "calibrating" not in fourth.err and "tree auto, cached from 2 built-in prompts" in fourth.err
    assert fourth.out == first.out and len(list((cache / "auto_trees").glob("*.json"))) == 1
    assert generate_main(common) == 0
    assert capsys.readouterr().out == first.out
    for bad, message in [
        (["--tree", "chain:2"], "--tree chain:2 needs --head DIR"),
        (["--acceptance", "greedy", "--temperature", "0.7"], "--acceptance greedy keeps the target's argmax"),
        ([*common, "--tree", "chain:x"], "--tree: tree setting 'chain:x': expected chain:D"),
        ([*common, "--recalibrate"], "--recalibrate re-measures the auto tree: it needs --tree auto"),
        ([*common, "--lookup-branch", "4", "--lookup-solo", "auto"], "--lookup-solo auto is priced on the auto tree"),
        ([*common, "--lookup-branch", "4", "--lookup-solo", "two"], "expected an n-gram length (2 or 3) or 'auto'"),
        # refused as it is parsed, not after --tree auto's calibration
        ([*common, "--tree", "auto", "--lookup-branch", "4", "--lookup-solo", "5"], "2 to 3, or 'auto'; got 5"),
    ]:
        with pytest.raises(SystemExit):
            generate_main(["--prompt", "Hi", *bad])
        assert message in capsys.readouterr().err


def test_build_drafter_tree_settings(tiny_llama):
    medusa = MedusaHeads(MedusaConfig(num_heads=4), tiny_llama)
    assert isinstance(build_drafter(medusa, None), MedusaDrafter)
    assert build_drafter(medusa, "medusa60").tree.num_nodes == 61
    assert build_drafter(medusa, "chain").tree.num_nodes == 5
    three = MedusaHeads(MedusaConfig(num_heads=3), tiny_llama)  # the default recipe's head count
    assert build_drafter(three, None).tree.max_depth == 3 and build_drafter(three, None).tree.num_nodes == 10
    with pytest.raises(ValueError, match="the tree is 4 deep but the Medusa head set has only 3 heads"):
        build_drafter(three, "small10")  # a tree asked for by name is not cut: the error says what to do
    eagle = EagleHead(EagleConfig(version=1), tiny_llama)
    assert build_drafter(eagle, None).tree.total_tokens == 60
    assert build_drafter(eagle, "dynamic:4,3,10").tree.top_k == 3
    assert build_drafter(eagle, "chain:3").tree.top_k == 1
    draft = DraftModel.from_target(tiny_llama, 1)
    assert isinstance(build_drafter(draft, None), DraftModelDrafter)
    assert build_drafter(draft, "chain:2").max_length == 2
    with pytest.raises(ValueError, match="neither a file"):
        build_drafter(medusa, "no-such-tree")
    for bad, form in [("dynamic:5,8", "dynamic:D,K,N"), ("dynamic:5,0,60", "dynamic:D,K,N"), ("chain:x", "chain:D")]:
        with pytest.raises(ValueError, match=f"tree setting '{bad}': expected {form} with"):
            build_drafter(eagle, bad)
    with pytest.raises(ValueError, match="EAGLE"):
        build_drafter(eagle, "small10")
    assert isinstance(build_drafter(eagle, "dynamic"), EagleTreeDrafter)
    with pytest.raises(ValueError, match="a draft model drafts an adaptive chain"):
        build_drafter(draft, "dynamic:2,2,4")
    for head in (eagle, draft, medusa):  # auto is measured, not built: it was a draft model's default, an IndexError
        with pytest.raises(ValueError, match="tree 'auto' is chosen by measurement: use auto_tree_drafter"):
            build_drafter(head, "auto")


def test_a_tree_the_head_cannot_draft_is_refused_before_the_target_loads(tiny_llama, tmp_path, capsys, monkeypatch):
    """``generate --tree`` was checked when the drafter was built, after the target had loaded."""
    import specheads.target

    def no_target(*args, **kwargs):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr(specheads.target, "load_target", no_target)
    EagleHead(EagleConfig(version=1), tiny_llama).save_pretrained(tmp_path / "eagle")
    # an EAGLE-3 checkpoint in the serving engines' layout has no head_type: its type comes from its architecture
    export_head(EagleHead(EagleConfig(version=3), tiny_llama), tiny_llama, tmp_path / "vllm", dtype=torch.float32)
    for folder, tree, message in [
        ("eagle", "small10", "EAGLE heads take --tree chain"),
        ("eagle", "dynamic:5,8", "tree setting 'dynamic:5,8': expected dynamic:D,K,N"),
        ("vllm", "small10", "EAGLE heads take --tree chain"),
    ]:
        with pytest.raises(SystemExit):
            generate_main(["--head", str(tmp_path / folder), "--tree", tree, "--prompt", "hi"])
        assert f"--tree: {message}" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="the target was loaded"):  # a tree it drafts passes the check
        generate_main(["--head", str(tmp_path / "vllm"), "--tree", "chain:2", "--prompt", "hi"])


def test_a_medusa_tree_deeper_than_the_heads_or_of_the_wrong_shape_is_refused_before_the_target_loads(
    tiny_llama, tmp_path, capsys
):
    """``--tree small10`` (4 deep) on a 3-head Medusa set was refused once the target and head had loaded; a tree file
    ``{"choices": [0, 1, 2]}`` was a TypeError past the check, a traceback. A missing --target shows which came
    first: its error is returned (status 2) after the checks, where these are usage errors raised before it."""
    MedusaHeads(MedusaConfig(num_heads=3), tiny_llama).save_pretrained(tmp_path / "medusa")
    (tmp_path / "flat.json").write_text('{"choices": [0, 1, 2]}')
    argv = ["--head", str(tmp_path / "medusa"), "--target", str(tmp_path / "no-target"), "--prompt", "hi"]
    for tree, message in [
        ("small10", "--tree: the tree is 4 deep but the Medusa head set has only 3 heads; use a tree at most 3 deep"),
        ("chain:5", "--tree: the tree is 5 deep but the Medusa head set has only 3 heads"),
        (
            str(tmp_path / "flat.json"),
            f'--tree: tree file {tmp_path / "flat.json"}: expected a JSON object {{"choices"',
        ),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            generate_main([*argv, "--tree", tree])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert generate_main([*argv, "--tree", "chain:3"]) == 2  # a tree it drafts passes: then the missing target
    assert "no-target" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--max-new-tokens", "0", "argument --max-new-tokens: expected an integer >= 1, got 0"),
        ("--temperature", "-1", "argument --temperature: expected a number >= 0 (0 = greedy), got -1"),
        ("--top-p", "1.5", "argument --top-p: expected a number in (0, 1] (1 = no cut), got 1.5"),
        ("--top-k", "-1", "argument --top-k: expected an integer >= 0, got -1"),
        ("--drafter-window", "-5", "argument --drafter-window: expected an integer >= 0, got -5"),
        ("--drafter-sinks", "-1", "argument --drafter-sinks: expected an integer >= 0, got -1"),
    ],
)
def test_numbers_out_of_range_are_usage_errors_before_the_target_loads(tmp_path, capsys, flag, value, message):
    """These were checked by the generator, after the target loaded (and after a --tree auto calibration); bench
    refuses the same values as it parses them (``specheads.arg_types``)."""
    with pytest.raises(SystemExit) as exit_info:
        generate_main(["--prompt", "hi", "--target", str(tmp_path / "no-target"), flag, value])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_options_that_need_a_head_name_only_the_ones_given(capsys):
    """``--tree chain:3`` alone said "--tree chain:3 and --recalibrate need --head"; ``--recalibrate`` alone said
    "--tree None ..."."""
    for argv, message in [
        (["--tree", "chain:3"], "error: --tree chain:3 needs --head DIR: it sets how a head drafts\n"),
        (["--recalibrate"], "error: --recalibrate needs --head DIR: it sets how a head drafts\n"),
        (["--tree", "auto", "--recalibrate"], "error: --tree auto and --recalibrate need --head DIR: they set how"),
        (["--head", "h", "--recalibrate"], "it needs --tree auto, got --tree (default)\n"),
    ]:
        with pytest.raises(SystemExit):
            generate_main(["--prompt", "hi", *argv])
        assert message in capsys.readouterr().err


def test_a_drafter_window_on_an_auto_tree_that_chose_plain_decoding_is_a_note(tmp_path, capsys, monkeypatch):
    """``--head EAGLE --tree auto --lookup-branch N --drafter-window W`` where the auto tree is plain decoding: the
    lookup chain drafts alone, and the window was refused with "got PromptLookupDrafter: use an EAGLE head"."""
    from specheads.decoding.tuning.auto_tree import auto_tree_cache_path, remember_tree
    from specheads.decoding.tuning.cost_model import TreeChoice
    from specheads.target import load_target
    from tests.tiny_models import save_tiny_target

    target, _ = load_target(str(save_tiny_target(tmp_path / "target")))
    EagleHead(EagleConfig(version=1), target).save_pretrained(tmp_path / "eagle")
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    plain = TreeChoice(choices=[], expected_tau=1.0, step_seconds=0.01)  # what a calibration where no guess pays keeps
    assert remember_tree(auto_tree_cache_path(tmp_path / "cache", tmp_path / "eagle", target), plain, "a test") is None
    argv = ["--target", str(tmp_path / "target"), "--head", str(tmp_path / "eagle"), "--tree", "auto"]
    argv += ["--lookup-branch", "2", "--drafter-window", "8", "--prompt", "hi hi hi", "--max-new-tokens", "4"]
    assert generate_main(argv) == 0
    err = capsys.readouterr().err
    assert "note: --drafter-window 8 is not applied: the auto tree for" in err and "with no EAGLE drafter" in err
    assert "[PromptLookupDrafter, tree auto, cached from a test" in err and "drafter cache" not in err


def test_a_request_the_target_cannot_take_is_a_one_line_error(tmp_path, capsys):
    """A prompt longer than the target's context; a sliding-window target decodes past its window."""
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    from specheads.target import ensure_builtin_converted

    config = MistralConfig(
        vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, sliding_window=16, max_position_embeddings=64,
    )  # fmt: skip
    MistralForCausalLM(config).save_pretrained(tmp_path / "mistral")
    AutoTokenizer.from_pretrained(ensure_builtin_converted("smollm2-135m-instruct")).save_pretrained(
        tmp_path / "mistral"
    )
    argv = ["--target", str(tmp_path / "mistral"), "--raw", "--max-new-tokens", "40"]
    assert generate_main([*argv, "--prompt", "Hello there"]) == 0  # 2 + 40 tokens: past the 16-token window
    assert "stop max_new_tokens" in capsys.readouterr().err
    assert generate_main([*argv, "--prompt", "Hello there " * 40]) == 2
    err = capsys.readouterr().err
    assert "specheads generate: error:" in err and "the target's context is 64 tokens" in err
    assert "Traceback" not in err


def test_a_target_the_verifier_refuses_and_an_unknown_rule_are_one_line_errors(tmp_path, capsys):
    """An ALiBi target (MPT) failed the exactness probe in the generator's constructor, outside the error handling:
    a traceback. An unknown --acceptance went as far as the constructor too, after loading the target."""
    from transformers import AutoTokenizer

    from specheads.target import ensure_builtin_converted
    from tests.tiny_models import tiny_family

    tiny_family("mpt").save_pretrained(tmp_path / "mpt")
    AutoTokenizer.from_pretrained(ensure_builtin_converted("smollm2-135m-instruct")).save_pretrained(tmp_path / "mpt")
    assert generate_main(["--target", str(tmp_path / "mpt"), "--raw", "--prompt", "Hello"]) == 2
    err = capsys.readouterr().err
    assert "specheads generate: error: MptForCausalLM's forward over a draft tree does not match" in err
    assert "Traceback" not in err
    with pytest.raises(SystemExit) as exit_info:
        generate_main(["--target", str(tmp_path / "missing"), "--prompt", "Hi", "--acceptance", "bogus"])
    assert exit_info.value.code == 2
    assert "argument --acceptance: invalid choice: 'bogus'" in capsys.readouterr().err


def test_ctrl_c_and_a_closed_pipe_end_generate_without_a_traceback():
    """A real `specheads generate` process: SIGINT mid-stream keeps the text printed so far and exits 130 with one
    line; a reader that goes away (`| head -c 10`) ends it quietly (141, as Unix tools under SIGPIPE)."""
    import os
    import signal
    import subprocess
    import sys

    argv = [sys.executable, "-m", "specheads.cli", "generate", "--prompt", "Tell a long story about a dragon."]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for how in ("sigint", "close"):
        proc = subprocess.Popen(
            [*argv, "--max-new-tokens", "200"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            # as from a terminal: CI runners and background jobs start with SIGINT ignored, which a child inherits
            # (and Python then installs no KeyboardInterrupt handler)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        first = proc.stdout.read(10)
        assert len(first) == 10
        if how == "sigint":
            proc.send_signal(signal.SIGINT)
        else:
            proc.stdout.close()
        _, err = proc.communicate(timeout=120) if how == "close" else (proc.stdout.read(), proc.stderr.read())
        code = proc.wait(timeout=120)
        err = err.decode()
        assert "Traceback" not in err, err
        if how == "sigint":
            assert code == 130 and "specheads generate: interrupted" in err
        else:
            assert code == 141
