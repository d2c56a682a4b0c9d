"""``specheads export`` and ``specheads push`` on a target in a local folder: which engine an export folder is pushed
as, exporting an imported EAGLE-3 checkpoint, the names a push publishes, and what ``--overwrite`` replaces."""

import json
from types import SimpleNamespace

import pytest
from huggingface_hub import ModelCard

from specheads.cli import main
from specheads.heads import DraftModel, EagleConfig, EagleHead, MedusaConfig, MedusaHeads
from specheads.heads.interop import export_head
from tests.tiny_models import save_tiny_target


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A tiny target saved in a user's folder (an absolute path), and an EAGLE-3 head, a draft model and Medusa heads
    saved for it."""
    from specheads.target import load_target

    root = tmp_path_factory.mktemp("models")
    path = save_tiny_target(root / "llama-local")
    target, _ = load_target(str(path), check_tree_attention=False)
    EagleHead(EagleConfig(version=3), target).save_pretrained(root / "eagle3")
    DraftModel.from_target(target, 2).save_pretrained(root / "draft")
    MedusaHeads(MedusaConfig(num_heads=2), target).save_pretrained(root / "medusa")
    assert json.loads((root / "eagle3" / "config.json").read_text())["config"]["target"]["name_or_path"] == str(path)
    return SimpleNamespace(root=root, path=path, target=target)


def _card(fake_hub) -> ModelCard:
    return ModelCard(fake_hub.uploaded["README.md"].decode())


@pytest.mark.parametrize("head", ["eagle3", "draft"])
def test_push_of_an_sglang_export_is_pushed_for_sglang(local, tmp_path, fake_hub, capsys, head):
    """vLLM and SGLang read the same EAGLE-3 and draft-model folders: ``--format sglang`` was refused as "a vllm
    export", whose advice (export again) gave the same folder, and without it the card said vLLM."""
    algorithm = {"eagle3": "EAGLE3", "draft": "STANDALONE"}[head]
    for engine in ("sglang", "vllm"):
        assert main(["export", str(local.root / head), str(tmp_path / engine), "--engine", engine]) == 0
    target = ["--target", "me/llama"]  # given, it names the target instead of the one the export records
    assert main(["push", str(tmp_path / "sglang"), "me/x", "--format", "sglang", *target]) == 0
    assert f"--speculative-algorithm {algorithm}" in _card(fake_hub).text
    assert main(["push", str(tmp_path / "sglang"), "me/x", *target]) == 0  # the engine it was exported for
    card = _card(fake_hub)
    assert "served by SGLang" in card.text and "sglang.launch_server" in card.text and "sglang" in card.data.tags
    assert main(["push", str(tmp_path / "vllm"), "me/x", *target]) == 0
    assert "served by vLLM" in _card(fake_hub).text
    assert main(["push", str(tmp_path / "vllm"), "me/x", "--format", "sglang", *target]) == 0  # the same layout
    assert "sglang.launch_server" in _card(fake_hub).text


def test_push_refuses_an_engine_that_does_not_read_the_export(local, tmp_path, capsys):
    """Medusa heads export for vLLM alone: pushing their folder for SGLang stays an error."""
    assert main(["export", str(local.root / "medusa"), str(tmp_path / "medusa")]) == 0
    capsys.readouterr()
    assert main(["push", str(tmp_path / "medusa"), "me/x", "--format", "sglang", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a vllm export; push it without --format (sglang does not read" in err
    assert "export the head again" not in err  # SGLang serves no Medusa heads: that advice was refused in turn
    assert main(["export", str(local.root / "eagle3"), str(tmp_path / "eagle3")]) == 0
    capsys.readouterr()
    assert main(["push", str(tmp_path / "eagle3"), "me/x", "--format", "speculators", "--dry-run"]) == 2
    assert "layout), or export the head again with --engine speculators" in capsys.readouterr().err


def test_export_of_an_imported_eagle3_checkpoint_takes_the_target_it_names(local, tmp_path, capsys):
    """A SpecForge / vLLM or speculators EAGLE-3 folder that load_head reads exported without --target: the error
    was "config.json: unknown head_type None"."""
    from specheads.heads import load_head

    head = load_head(local.root / "eagle3", local.target)
    for engine in ("vllm", "speculators"):
        export_head(head, local.target, tmp_path / f"imported-{engine}", engine=engine)
        assert main(["export", str(tmp_path / f"imported-{engine}"), str(tmp_path / f"out-{engine}")]) == 0
        exported = json.loads((tmp_path / f"out-{engine}" / "config.json").read_text())
        assert exported["base_model_name_or_path"] == str(local.path)
    config = tmp_path / "imported-vllm" / "config.json"
    meta = json.loads(config.read_text())
    refusals = {"meta-llama/Llama-3.1-8B": "names its target 'meta-llama/Llama-3.1-8B', not a local folder"}
    for name, says in [*refusals.items(), (None, "is an EAGLE-3 checkpoint that names no target")]:
        meta["base_model_name_or_path"] = name  # a Hub id would be a download: never one a checkpoint chose
        config.write_text(json.dumps(meta))
        assert main(["export", str(tmp_path / "imported-vllm"), str(tmp_path / "refused")]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]  # after the target's loading progress
        assert err.startswith("specheads export: ") and says in err and "pass --target" in err
        assert "head_type" not in err
    assert main(["export", str(tmp_path / "imported-vllm"), str(tmp_path / "given"), "--target", str(local.path)]) == 0


@pytest.mark.parametrize(
    "head, argv",
    [("eagle3", []), ("draft", []), ("eagle3", ["--format", "speculators"]), ("draft", ["--format", "sglang"])],
)
def test_push_publishes_a_local_target_by_the_name_the_card_uses(local, fake_hub, capsys, head, argv):
    """The head's config.json (its target record, a draft model's own config) and the exported configs (the engines'
    base model, speculators' verifier, the export's specheads record) reached the Hub with the user's absolute path;
    the local files keep it. ``--format`` printed export's "wrote" line and serve command for its temporary folder."""
    before = (local.root / head / "config.json").read_bytes()
    assert main(["push", str(local.root / head), "me/x", *argv]) == 0
    leaked = [name for name, content in fake_hub.uploaded.items() if str(local.root).encode() in content]
    assert not leaked and fake_hub.uploaded, leaked
    config = json.loads(fake_hub.uploaded["config.json"])
    named = [
        (config.get("config") or {}).get("target", {}).get("name_or_path"),
        config.get("base_model_name_or_path"),
        ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path"),
        ((config.get("specheads") or {}).get("target") or {}).get("name_or_path"),
    ]
    assert "llama-local" in named
    assert "llama-local" in _card(fake_hub).text
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith(("wrote", "vllm serve"))]
    assert (local.root / head / "config.json").read_bytes() == before


def test_push_to_hub_publishes_a_local_target_by_its_public_name(local, fake_hub):
    from specheads.heads import load_head

    load_head(local.root / "eagle3", local.target).push_to_hub("me/x")
    assert json.loads(fake_hub.uploaded["config.json"])["config"]["target"]["name_or_path"] == "llama-local"
    assert not [name for name, content in fake_hub.uploaded.items() if str(local.root).encode() in content]


def test_export_overwrite_leaves_only_what_this_export_writes(local, tmp_path, capsys):
    """An earlier draft model's shards, index and tokenizer stayed beside the new export (vLLM prefers the index),
    and push uploaded them; a file no export writes is never deleted, and a failed export keeps the earlier one."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("model-00001-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json", "spiece.model"):
        (out / name).write_text("{}")
    assert main(["export", str(local.root / "eagle3"), str(out), "--overwrite"]) == 0
    written = sorted(path.name for path in out.iterdir())
    assert written == ["README.md", "config.json", "model.safetensors"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]  # no staging folder left

    assert main(["export", str(local.root / "medusa"), str(out), "--engine", "sglang", "--overwrite"]) == 2
    assert "vLLM only" in capsys.readouterr().err
    assert sorted(path.name for path in out.iterdir()) == written and "Eagle3" in (out / "config.json").read_text()

    (out / "notes.txt").write_text("mine")
    assert main(["export", str(local.root / "eagle3"), str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"output {out} holds files no export writes (notes.txt)" in err
    assert (out / "notes.txt").read_text() == "mine" and sorted(path.name for path in out.iterdir()) == [
        *written,
        "notes.txt",
    ]


def test_a_card_for_an_eagle3_checkpoint_exported_elsewhere_serves_it_as_eagle3():
    """A SpecForge checkpoint carries no specheads record: its card named it a draft model (the wrong serve command)."""
    from specheads.heads.serving_card import exported_method

    assert exported_method({"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32}) == ("eagle3", 3)
    assert exported_method({"architectures": ["LlamaForCausalLM"]}) == ("draft_model", 4)


def test_pushing_an_export_names_the_target_it_was_exported_against(local, tmp_path, fake_hub):
    """An export of the built-in target named it by its Hub id alone, so its pushed card lost the target's license
    and the note on which weights the head was trained with; a draft model's export named no target at all."""
    assert main(["export", str(local.root / "draft"), str(tmp_path / "draft")]) == 0
    assert main(["push", str(tmp_path / "draft"), "me/x"]) == 0  # no --target: the export records it
    assert "vllm serve llama-local --speculative-config" in _card(fake_hub).text
    assert main(["export", str(local.root / "eagle3"), str(tmp_path / "eagle3")]) == 0
    config = tmp_path / "eagle3" / "config.json"
    meta = json.loads(config.read_text())
    assert meta["specheads"]["target"] == {"name_or_path": str(local.path)}
    meta["specheads"]["target"]["name_or_path"] = "smollm2-135m-instruct"  # as an export of the built-in target
    meta["base_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    config.write_text(json.dumps(meta))
    assert main(["push", str(tmp_path / "eagle3"), "me/x"]) == 0
    card = _card(fake_hub)
    assert card.data.license == "apache-2.0" and card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "This head was trained on" in card.text and "vllm serve HuggingFaceTB/SmolLM2-135M-Instruct" in card.text


def test_push_format_of_a_head_with_a_corrupt_config_names_the_file(local, tmp_path, capsys):
    """``--format`` read config.json before checking the folder: the error was json's "Expecting value" alone."""
    folder = tmp_path / "head"
    folder.mkdir()
    (folder / "config.json").write_text("{")
    (folder / "model.safetensors").write_bytes((local.root / "eagle3" / "model.safetensors").read_bytes())
    assert main(["push", str(folder), "me/x", "--format", "vllm", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specheads push: ") and f"{folder / 'config.json'} is not valid JSON" in err
