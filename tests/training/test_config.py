"""The training config schema: every file under configs/ loads strictly; errors say what is valid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file

from specheads.training.config import ConfigError, load_config
from specheads.training.train_cli import train_main
from tests.training.train_helpers import REPO, tiny_overrides

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TRAIN_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name not in ("accelerate", "trees"))


def test_there_is_a_training_config_per_head_type():
    names = {p.parent.name for p in TRAIN_CONFIGS}
    assert {"medusa", "medusa2", "eagle1", "eagle3"} <= names


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_training_configs_load_strictly(path):
    cfg = load_config(path)
    assert cfg.data.paths and all("${" not in p for p in cfg.data.paths)  # interpolations resolved


@pytest.mark.parametrize("path", sorted((CONFIGS / "accelerate").glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_configs_load(path):
    config = load_config_from_file(str(path))  # accelerate rejects unknown keys itself
    deepspeed_file = (config.deepspeed_config or {}).get("deepspeed_config_file")
    if deepspeed_file:
        assert (CONFIGS.parent / deepspeed_file).is_file()


@pytest.mark.parametrize("path", sorted((CONFIGS / "deepspeed").glob("*.json")), ids=lambda p: p.name)
def test_deepspeed_configs_parse(path):
    assert json.loads(path.read_text())["zero_optimization"]["stage"] in (2, 3)


def test_data_paths_point_at_committed_data_and_may_use_the_environment(monkeypatch):
    cfg = load_config(CONFIGS / "medusa" / "smollm2-135m.yaml")
    assert (CONFIGS.parent / cfg.data.paths[0]).is_file()
    monkeypatch.setenv("SPECHEADS_DATA", "/elsewhere")
    cfg = load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", ["data.paths=['${oc.env:SPECHEADS_DATA}/chats.jsonl']"])
    assert cfg.data.paths == ["/elsewhere/chats.jsonl"]


def test_dotted_overrides_apply_and_are_typed():
    cfg = load_config(CONFIGS / "eagle3" / "smollm2-135m.yaml", ["train.max_steps=7", "loss.ttt_steps=2"])
    assert cfg.train.max_steps == 7 and cfg.loss.ttt_steps == 2
    with pytest.raises(ConfigError, match="max_steps"):
        load_config(CONFIGS / "eagle3" / "smollm2-135m.yaml", ["train.max_steps=many"])


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.max_stepz=3", r"unknown key 'train.max_stepz'; valid keys in section 'train' are \[.*'max_steps'"),
        ("bogus=1", r"unknown key 'bogus'; valid keys in the top level are \['data', 'features', 'head'"),
        ("head.options.num_headz=2", r"head.options: MedusaConfig: unknown keys \['num_headz'\]; valid keys"),
        ("train.scheduler=cosin", r"train.scheduler='cosin' is not valid; expected one of \['cosine'"),
        ("head.type=hydra", r"head.type='hydra' is not valid"),
        ("features.mode=offline", r"needs features.cache_dir"),
        ("features.extra_cache_dirs=[runs/more]", r"read only with features.mode=offline; found .*'online'"),
        ("features.cache_dir=runs/features", r"features.cache_dir='runs/features' is read only with features.mode="),
        ("target.dtype=int8", r"target.dtype='int8' is not valid; expected one of \['float32', 'fp32', 'bfloat16'"),
        ("train.resume=yes", r"train.resume='True' \(YAML reads a bare yes/on/true as a boolean\).*train.resume=auto"),
    ],
)
def test_invalid_configs_fail_with_what_is_valid(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", [override])


def test_mixed_precision_no_survives_yaml_booleans():
    cfg = load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", ["train.mixed_precision=no"])
    assert cfg.train.mixed_precision == "no"


@pytest.mark.parametrize("value", ["no", "off", "false", "'no'"])
def test_resume_no_survives_yaml_booleans(value):
    assert load_config(CONFIGS / "medusa" / "smollm2-135m.yaml").train.resume == "no"  # the file says `resume: no`
    cfg = load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", [f"train.resume={value}"])
    assert cfg.train.resume == "no"


@pytest.mark.parametrize("value, torch_name", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")])
def test_target_dtype_short_names_become_torch_dtypes(value, torch_name):
    import torch

    cfg = load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", [f"target.dtype={value}"])
    assert cfg.target.dtype == torch_name and isinstance(getattr(torch, cfg.target.dtype), torch.dtype)


def test_cli_refuses_resume_flag_with_an_explicit_resume(capsys, monkeypatch):
    """``--resume`` means train.resume=auto; with an explicit train.resume=PATH it must not silently win."""
    import specheads.training.loop

    def no_training(cfg):
        raise AssertionError(f"training started with train.resume={cfg.train.resume}")

    monkeypatch.setattr(specheads.training.loop, "train", no_training)
    argv = ["--config", str(CONFIGS / "medusa" / "smollm2-135m.yaml"), "train.resume=runs/x/checkpoints/step-00000200"]
    assert train_main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--resume (train.resume=auto) and train.resume=runs/x/checkpoints/step-00000200 were both given" in err


def test_cli_refuses_resume_flag_with_a_checkpoint_named_in_the_yaml_file(tmp_path, capsys, monkeypatch):
    """A ``resume:`` path inside the config file must not be replaced silently by ``--resume`` either; a file that
    says ``resume: auto`` or nothing resumes as asked."""
    import specheads.training.loop

    seen = []

    def record(cfg):
        seen.append(cfg.train.resume)
        return types.SimpleNamespace(finished=False)

    monkeypatch.setattr(specheads.training.loop, "train", record)
    text = (CONFIGS / "medusa" / "smollm2-135m.yaml").read_text()
    assert "resume:" not in text
    named = tmp_path / "named.yaml"
    named.write_text(text.replace("train:\n", "train:\n  resume: runs/x/checkpoints/step-00000200\n", 1))
    assert train_main(["--config", str(named), "--resume"]) == 2
    assert "the config file sets train.resume='runs/x/checkpoints/step-00000200'" in capsys.readouterr().err
    assert seen == []

    plain = tmp_path / "plain.yaml"
    plain.write_text(text)
    auto = tmp_path / "auto.yaml"
    auto.write_text(text.replace("train:\n", "train:\n  resume: auto\n", 1))
    assert train_main(["--config", str(plain), "--resume"]) == 0
    assert train_main(["--config", str(auto), "--resume"]) == 0
    assert seen == ["auto", "auto"]


def test_fp16_on_a_cpu_only_machine_is_an_error_not_a_silent_fp32_run(tmp_path):
    from specheads.training.loop import train

    # another output folder than the config's: a checkout where that head was trained holds its checkpoints there
    overrides = ["train.mixed_precision=fp16", f"train.output_dir={tmp_path / 'run'}"]
    cfg = load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", overrides)
    with pytest.raises(ValueError, match="fp16 needs a GPU.*use train.mixed_precision=bf16"):
        train(cfg)


def test_missing_file_is_an_error():
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("configs/nope.yaml")


def test_cli_reports_config_errors(capsys):
    assert train_main(["--config", str(CONFIGS / "medusa" / "smollm2-135m.yaml"), "train.nope=1"]) == 2
    assert "unknown key 'train.nope'" in capsys.readouterr().err


def test_deepspeed_clipping_and_accumulation_follow_the_training_config():
    """Accelerate fills a DeepSpeed ``"gradient_clipping": "auto"`` with 1.0 and lets a set
    ``gradient_accumulation_steps`` (an `accelerate config` file writes 1) override ``train.grad_accum``, so every
    micro-batch stepped the optimizer and the schedule. Training puts its own values where the JSON says ``auto``
    (the ZeRO-2 launch test checks the engine got them) and refuses values that disagree."""
    from specheads.training.launch import sync_deepspeed_config

    config = json.loads((CONFIGS / "deepspeed" / "zero2.json").read_text())
    sync_deepspeed_config(config, 0.5, 4)
    assert config["gradient_clipping"] == 0.5 and config["gradient_accumulation_steps"] == 4
    sync_deepspeed_config(config, 0.5, 4)  # explicit equal values are fine
    with pytest.raises(ConfigError, match=r"gradient_clipping=0.5 but train.max_grad_norm=1.0.*\"auto\""):
        sync_deepspeed_config(config, 1.0, 4)
    with pytest.raises(ConfigError, match=r"gradient_accumulation_steps=1 but train.grad_accum=4.*\"auto\""):
        sync_deepspeed_config({"gradient_accumulation_steps": 1}, 1.0, 4)


def test_loss_settings_another_heads_objective_reads_are_refused():
    """Before: ``loss.input_noise`` on an EAGLE-3 head or ``loss.ttt_steps`` on Medusa trained as if unset."""
    with pytest.raises(
        ConfigError, match=r"loss.input_noise=0.5 is read only by the eagle1 objective; .* trains eagle3"
    ):
        load_config(CONFIGS / "eagle1" / "smollm2-135m.yaml", ["head.options.version=3", "loss.input_noise=0.5"])
    with pytest.raises(ConfigError, match=r"loss.ttt_steps=3 is read only by the eagle3 objective; .* trains medusa"):
        load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", ["loss.ttt_steps=3"])
    with pytest.raises(ConfigError, match=r"loss.decay=0.5 is read only by the eagle3 and medusa objectives"):
        load_config(CONFIGS / "draft_model" / "smollm2-135m.yaml", ["loss.decay=0.5"])
    for head in ("medusa", "medusa2", "eagle1", "eagle3", "draft_model"):  # what each shipped config sets is read
        load_config(CONFIGS / head / "smollm2-135m.yaml")
    load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", ["loss.ttt_steps=7"])  # a default is no setting


@pytest.mark.parametrize(
    "text, expected",
    [
        ("train:\n  lr: [1, 2\n", r"broken.yaml: not valid YAML: line 3, column 1: did not find expected ',' or '\]'"),
        ("train:\n  lr: 1\n  lr: 2\n", r"broken.yaml: not valid YAML: line 3, column 3: found duplicate key lr"),
        ("train:\n\tlr: 1\n", r"broken.yaml: not valid YAML: line 2, column 1: found character that cannot start"),
        ("- train\n- data\n", r"broken.yaml: expected a mapping of sections at the top level \(target:.*found a list"),
        ("3\n", r"broken.yaml: expected a mapping of sections at the top level .*found a single value"),
        ("train:\n  max_step: 3\n", r"broken.yaml: unknown key 'train.max_step'.*Did you mean 'train.max_steps'\?"),
        ("train:\n  lr: abc\n", r"broken.yaml: train.lr: expected a float, found 'abc'.$"),
        ("data:\n  paths: chats.jsonl\n", r"data.paths: expected a list of strings, found 'chats.jsonl'; write a YAML"),
    ],
    ids=["syntax", "duplicate-key", "tab", "list", "scalar", "unknown-key", "type", "scalar-for-list"],
)
def test_broken_config_files_are_one_line_errors_that_say_where(tmp_path, text, expected):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "train.max_step=3",
            r"^command-line override train.max_step=3: unknown key 'train.max_step'; valid keys in section 'train' "
            r"are \[.*\]. Did you mean 'train.max_steps'\?$",
        ),
        ("train.lr=abc", r"^command-line override train.lr=abc: train.lr: expected a float, found 'abc'.$"),
        ("train.max_steps", r"^command-line override 'train.max_steps': expected KEY=VALUE"),
        ("=3", r"^command-line override '=3': expected KEY=VALUE"),
        (
            "data.paths=foo.jsonl",
            r"^command-line override data.paths=foo.jsonl: data.paths: expected a list of strings, found 'foo.jsonl'; "
            r"write data.paths=\[foo.jsonl\].$",
        ),
        ("train.eval_batches=all", r"train.eval_batches: expected an integer or null, found 'all'"),
        ("train.adam_betas=[0.9,x]", r"train.adam_betas\[1\]: expected a float, found 'x'"),
        ("train.group_by_length=maybe", r"train.group_by_length: expected a boolean \(true or false\), found 'maybe'"),
        ("train.lr=[1,", r"^command-line override train.lr=\[1,: the value is not valid YAML: line"),
    ],
)
def test_override_errors_name_the_override_not_the_file(override, expected):
    """The file and each override are merged in turn, so a mistyped override is blamed on itself, not on the YAML
    file, in one line rather than OmegaConf's multi-line dump."""
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", [override])
    assert "\n" not in str(info.value) and "smollm2-135m.yaml" not in str(info.value)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.lr=-0.001", r"train.lr must be >= 0, found -0.001"),
        ("train.warmup_steps=-1", r"train.warmup_steps must be >= 0, found -1"),
        ("train.save_every=-5", r"train.save_every must be >= 0, found -5"),
        ("data.eval_fraction=1.0", r"data.eval_fraction must be in \[0, 1\) .*found 1.0"),
        ("data.eval_fraction=-0.1", r"data.eval_fraction must be in \[0, 1\)"),
        ("lora.r=0", r"lora.r \(the adapters' rank\) must be >= 1, found 0"),
        ("loss.decay=0", r"loss.decay must be > 0 .*found 0.0"),
        ("loss.decay=-0.5", r"loss.decay must be > 0"),
        # each of these was taken as given and then turned off or inverted what it names, or crashed later
        ("train.eval_batches=0", r"train.eval_batches must be >= 1 \(or unset\), found 0"),
        ("train.stop_after=0", r"train.stop_after must be >= 1 \(or unset\), found 0"),
        ("data.max_samples=0", r"data.max_samples must be >= 1 \(or unset\), found 0"),
        ("data.max_length=-5", r"data.max_length must be >= 1 \(tokens per sample\), found -5"),
        ("data.eval_size=-1", r"data.eval_size must be >= 0 .*found -1"),
        ("train.seed=-1", r"train.seed must be in \[0, 2\*\*32\), found -1"),
        ("data.seed=4294967296", r"data.seed must be in \[0, 2\*\*32\), found 4294967296"),
        ("data.num_proc=0", r"data.num_proc must be >= 1 \(or unset\), found 0"),
        ("data.format=sharegtp", r"data.format='sharegtp' is not valid; expected one of \['auto', 'sharegpt'"),
        ("loss.feature_weight=-1", r"loss.feature_weight must be >= 0 \(a negative weight maximises its loss\)"),
        ("lora.distill_weight=-0.5", r"lora.distill_weight must be >= 0"),
        ("lora.alpha=0", r"lora.alpha must be > 0 .*at 0 they never train"),
        ("train.adam_betas=[0.9]", r"train.adam_betas must be two numbers in \[0, 1\).*found \[0.9\]"),
        ("train.adam_betas=[1.5,0.9]", r"train.adam_betas must be two numbers in \[0, 1\)"),
        ("train.adam_betas=[0.9,0.95,0.99]", r"train.adam_betas must be two numbers"),
        ("train.output_dir=''", r"train.output_dir is empty: .*over any README.md or config.json there"),
        ("head.options.num_heads=0", r"head.options: MedusaConfig needs num_heads >= 1"),
    ],
)
def test_values_out_of_their_range_are_refused(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", [override])


@pytest.mark.parametrize("value", [-5, 0])
def test_a_draft_vocabulary_of_no_tokens_is_refused(value):
    with pytest.raises(ConfigError, match=f"draft_vocab_size={value}: expected a token count >= 1"):
        load_config(CONFIGS / "eagle3" / "smollm2-135m.yaml", [f"head.options.draft_vocab_size={value}"])


def test_zero_is_valid_where_it_means_none():
    edges = ["train.lr=0", "train.warmup_steps=0", "train.save_every=0", "data.eval_fraction=0", "lora.r=1"]
    cfg = load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", edges)
    assert (cfg.train.lr, cfg.train.save_every, cfg.data.eval_fraction) == (0, 0, 0)


@pytest.mark.slow  # a whole run in a subprocess: in make test, not make test-fast
def test_a_rank_other_than_0_logs_no_data_summary_and_no_saved_head_line(tiny_target_dir, small_chat_file, tmp_path):
    """With 2 processes every rank logged the data summary and "saved head to ...", rank 0's copy and rank 1's. Rank 1
    now logs warnings only. One process with RANK=1 is a second rank's view of its logging (the run itself is a
    world of one)."""
    out = tmp_path / "run"
    overrides = ["head.options.num_heads=1", *tiny_overrides(tiny_target_dir, small_chat_file, out, max_steps=1)]
    command = [
        sys.executable,
        str(REPO / "scripts" / "train_heads.py"),
        "--config",
        str(CONFIGS / "medusa" / "smollm2-135m.yaml"),
    ]
    env = dict(os.environ, RANK="1", OMP_NUM_THREADS="1")
    done = subprocess.run([*command, *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "model.safetensors").is_file()
    assert "saved head to" not in done.stderr and "samples:" not in done.stderr, done.stderr[-3000:]


FAKE_TOKEN = "hf_FAKEtestTOKEN1234567890"


@pytest.mark.parametrize(
    "run_name, variable",
    [
        ("${oc.env:HF_TOKEN}", "HF_TOKEN"),
        ("run-${oc.env:hf_token}", "hf_token"),  # any case, inside a longer string
        ('${oc.env:"WANDB_API_KEY",none}', "WANDB_API_KEY"),
        ("${oc.env:DB_PASSWORD,x}", "DB_PASSWORD"),
        ("${oc.env:GITHUB_AUTH}", "GITHUB_AUTH"),
        ("${oc.env:AWS_SECRET_ACCESS_KEY}", "AWS_SECRET_ACCESS_KEY"),
        ("${oc.env:GCP_CREDENTIALS}", "GCP_CREDENTIALS"),
        ("${oc.env:RUN_LABEL,${oc.env:HF_TOKEN}}", "HF_TOKEN"),  # as another variable's default
    ],
)
def test_a_config_may_not_read_a_secret_from_the_environment(tmp_path, monkeypatch, run_name, variable):
    """The resolved config goes into the model card (published with the head), train_config.yaml and the tracker's
    run config: ``${oc.env:HF_TOKEN}`` would copy the token into all three."""
    monkeypatch.setenv(variable, FAKE_TOKEN)
    path = tmp_path / "evil.yaml"
    path.write_text((CONFIGS / "medusa" / "smollm2-135m.yaml").read_text() + f"  run_name: '{run_name}'\n")
    expected = rf"evil.yaml: train.run_name: .* reads {variable}, which looks like a secret \(the name contains \w+\)"
    with pytest.raises(ConfigError, match=expected + "; the resolved config is copied into the model card") as info:
        load_config(path)
    assert FAKE_TOKEN not in str(info.value) and "\n" not in str(info.value)


def test_a_secret_cannot_be_read_through_a_computed_name_or_pasted_in(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    medusa = CONFIGS / "medusa" / "smollm2-135m.yaml"
    with pytest.raises(ConfigError, match=r"reads an environment variable whose name is computed; expected a literal"):
        load_config(medusa, ["train.project=HF_TOKEN", "train.run_name=${oc.env:${train.project}}"])
    expected = r"^command-line override train.run_name=.*: train.run_name contains the value of the environment "
    with pytest.raises(ConfigError, match=expected + "variable HF_TOKEN, which looks like a secret") as info:
        load_config(medusa, [f"train.run_name=mine-{FAKE_TOKEN}"])
    assert FAKE_TOKEN not in str(info.value) and "train.run_name=mine-<HF_TOKEN>" in str(info.value)  # never shown


def test_ordinary_environment_variables_still_resolve(monkeypatch):
    """``${oc.env:...}`` stays for what configs use it for: data locations, run names, the wandb project."""
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)  # set, and not read
    monkeypatch.setenv("RUN_LABEL", "nightly")
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    cfg = load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", ["train.run_name=${oc.env:RUN_LABEL}-medusa"])
    assert cfg.train.run_name == "nightly-medusa" and cfg.train.project == "from-env"


def test_values_read_from_the_environment_are_written_as_their_reference(tmp_path, monkeypatch):
    """``train_config.yaml``, the model card and the tracker's config (what ``push`` uploads) held the value a
    ``${oc.env:VAR}`` read, a path or name of the machine that ran it; they keep the reference."""
    from omegaconf import OmegaConf

    from specheads.training.config import to_container, to_yaml

    monkeypatch.setenv("RUN_LABEL", "private-label")
    monkeypatch.setenv("MY_DATA", str(tmp_path / "private-place"))
    overrides = ["train.run_name=${oc.env:RUN_LABEL}-medusa", "data.paths=['${oc.env:MY_DATA}/chats.jsonl']"]
    cfg = load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", overrides)
    assert cfg.train.run_name == "private-label-medusa"  # the run itself reads the values
    assert cfg.data.paths == [f"{tmp_path}/private-place/chats.jsonl"]
    written = to_yaml(cfg)
    assert "private" not in written and "private" not in str(to_container(cfg))
    assert to_container(cfg)["data"]["paths"] == ["${oc.env:MY_DATA}/chats.jsonl"]
    assert OmegaConf.create(written).train.run_name == "private-label-medusa"  # read back, it resolves again
    path = tmp_path / "train_config.yaml"
    path.write_text(written)
    assert load_config(path).train.run_name == "private-label-medusa"


def test_a_path_held_by_a_secret_looking_variable_is_not_taken_for_a_secret(tmp_path, monkeypatch):
    """``SSH_AUTH_SOCK`` and the like hold paths that an output folder may well contain; only values without a path
    separator (tokens, keys) are looked for."""
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
    monkeypatch.setenv("KEYS_HOME", str(tmp_path))
    cfg = load_config(CONFIGS / "medusa" / "smollm2-135m.yaml", [f"train.output_dir={tmp_path}/runs/medusa"])
    assert cfg.train.output_dir == f"{tmp_path}/runs/medusa"


def test_the_cli_refuses_a_secret_before_anything_is_written(tmp_path, capsys, monkeypatch):
    import specheads.training.loop

    def no_training(cfg):
        raise AssertionError("training started")

    monkeypatch.setattr(specheads.training.loop, "train", no_training)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    out = tmp_path / "out"
    argv = ["--config", str(CONFIGS / "medusa" / "smollm2-135m.yaml"), f"train.output_dir={out}"]
    assert train_main([*argv, "train.run_name=${oc.env:HF_TOKEN}"]) == 2
    err = capsys.readouterr().err
    assert "reads HF_TOKEN, which looks like a secret" in err and FAKE_TOKEN not in err
    assert not out.exists()


def test_a_missing_data_file_is_said_before_the_target_loads(tmp_path, monkeypatch, capsys):
    import specheads.training.loop as loop

    monkeypatch.setattr(loop, "load_target", lambda *a, **k: pytest.fail("the target was loaded first"))
    missing = tmp_path / "typo.jsonl"
    overrides = tiny_overrides(tmp_path / "target", missing, tmp_path / "run")
    assert train_main(["--config", str(CONFIGS / "medusa" / "smollm2-135m.yaml"), *overrides]) == 2
    assert f"data file not found: {missing}" in capsys.readouterr().err
    folder = tmp_path / "data"  # a folder where its files belong: named as a folder, not as missing
    folder.mkdir()
    overrides = tiny_overrides(tmp_path / "target", folder, tmp_path / "run")
    assert train_main(["--config", str(CONFIGS / "medusa" / "smollm2-135m.yaml"), *overrides]) == 2
    assert f"data file {folder} is a folder; give the file(s) in it" in capsys.readouterr().err


@pytest.mark.parametrize("scheduler, warned", [("cosine", True), ("constant_with_warmup", False)])
def test_growing_max_steps_on_resume_warns_where_the_schedule_stretches(tmp_path, caplog, scheduler, warned):
    """A decaying schedule is rebuilt for the new length at the restored step, so its learning rate jumps up."""
    import logging

    from specheads.training.config import to_yaml
    from specheads.training.resume import check_resume_config

    config = CONFIGS / "eagle3" / "smollm2-135m.yaml"
    saved = load_config(config, ["train.max_steps=100", f"train.scheduler={scheduler}"])
    (tmp_path / "train_config.yaml").write_text(to_yaml(saved))
    caplog.set_level(logging.WARNING)
    check_resume_config(tmp_path, to_yaml(load_config(config, ["train.max_steps=200", f"train.scheduler={scheduler}"])))
    said = [r.getMessage() for r in caplog.records if "learning rate jumps up" in r.getMessage()]
    assert bool(said) == warned, said
    if warned:
        assert "train.max_steps grows 100 -> 200 under train.scheduler=cosine" in said[0]
