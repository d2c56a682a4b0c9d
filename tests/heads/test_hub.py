"""Sharing: the card's Hub metadata, what a push would upload, and the one-line offline error.

The Hub is unreachable from CI machines, so everything up to the network call runs with huggingface_hub's own
code (ModelCard parsing, HfApi with offline mode); the upload itself is not exercised here.
"""

import pytest
from huggingface_hub import ModelCard

from specheads.cli import main
from specheads.heads import EagleConfig, EagleDrafter, MedusaConfig, MedusaHeads
from specheads.heads.card import base_model_id
from specheads.heads.hub import HubError, files_to_upload, push_folder


def test_card_has_hub_metadata_and_metrics(tiny_llama, tmp_path):
    EagleDrafter(EagleConfig(version=3), tiny_llama).save_pretrained(
        tmp_path, card={"metrics": {"tau": 3.2}, "training": {"steps": 10}}
    )
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.library_name == "specheads"
    assert set(card.data.tags) == {"speculative-decoding", "eagle", "eagle3"}
    assert '"tau": 3.2' in card.text and '"steps": 10' in card.text


def test_builtin_target_maps_to_its_hub_id():
    assert base_model_id("smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_id("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
    assert base_model_id("/models/local-llama") is None


def test_files_to_upload_include_lora_adapter(tiny_llama, tmp_path):
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(tmp_path)
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "adapter_model.safetensors").write_bytes(b"x")
    (tmp_path / "scratch.txt").write_text("not uploaded")
    assert files_to_upload(tmp_path) == [
        "config.json",
        "model.safetensors",
        "README.md",
        "lora/adapter_model.safetensors",
    ]


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
    assert main(["push", str(folder), "someone/head", "--dry-run"]) == 0
    assert "config.json, model.safetensors, README.md" in capsys.readouterr().out
