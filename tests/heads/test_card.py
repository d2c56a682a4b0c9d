"""Model cards: what a published head's card claims (Medusa-2 decodes the adapted target), names (no local paths) and
records (license, the head's version); and the LoRA adapter as training publishes it beside the heads."""

from __future__ import annotations

import copy
import json
import os
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
from huggingface_hub import ModelCard

from specheads.heads import (
    DraftModel,
    DraftModelConfig,
    EagleConfig,
    EagleHead,
    MedusaConfig,
    MedusaHeads,
    load_head,
    load_lora_adapter,
)

REPO = Path(__file__).resolve().parents[2]
MEDUSA2 = REPO / "configs" / "medusa2" / "smollm2-135m.yaml"


def _title(folder: Path) -> str:
    return next(line for line in (folder / "README.md").read_text().splitlines() if line.startswith("# "))


def _save_medusa2_as_training_does(target, out: Path, target_name: str):
    """The training loop's own final save (``_save_final``) of a Medusa-2 objective built by ``build_objective``
    (peft's ``get_peft_model`` on a copy of the target), without the training: only the accelerator's gather and
    unwrap are stood in for, as on one process."""
    from specheads.training.config import load_config
    from specheads.training.loop import _save_final
    from specheads.training.objective import build_objective

    cfg = load_config(MEDUSA2, [f"target.name={target_name}", f"train.output_dir={out}", "lora.r=4"])
    adapted_target = copy.deepcopy(target)
    objective = build_objective(MedusaHeads(MedusaConfig(num_heads=2), target), adapted_target, cfg.loss, cfg.lora, 0)
    with torch.no_grad():  # a trained adapter: B is zero at initialisation, which would leave the target unchanged
        for name, param in objective.adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    accelerator = SimpleNamespace(
        get_state_dict=lambda model: model.state_dict(), is_main_process=True, unwrap_model=lambda model: model
    )
    _save_final(accelerator, objective, cfg, target, {}, out)
    return objective


def test_medusa2_card_says_decoding_reproduces_the_adapted_target_not_the_base(tiny_llama, tmp_path):
    """The card is written before ``lora/`` is moved into place, so training tells it that an adapter comes."""
    _save_medusa2_as_training_does(tiny_llama, tmp_path / "head", "tiny-random-llama")
    card = ModelCard.load(tmp_path / "head" / "README.md")
    assert {"medusa", "medusa2", "lora"} <= set(card.data.tags)
    assert _title(tmp_path / "head") == "# Medusa-2 heads for tiny-random-llama"
    assert "lossless" not in card.text and "frozen target" not in card.text
    assert "the output is exactly the adapted model's" in card.text and "not equal to the base" in card.text
    assert "apply_lora_adapter(target" in card.text and "`specheads generate` applies it" in card.text
    assert "adapter_applied=applied" in card.text
    assert "## Metrics" not in card.text  # no evaluation ran: no empty section


def test_saved_adapter_has_no_peft_card_nor_local_path_and_still_loads(tiny_llama, tmp_path):
    """peft's template README is not published, and the adapter names the target as the user gave it (an absolute
    path: its last component); load_lora_adapter applies it to the target it is given whatever that field says, and
    the merged target is the trained one."""
    target_dir = tmp_path / "models" / "tiny-target"
    objective = _save_medusa2_as_training_does(tiny_llama, tmp_path / "head", str(target_dir))
    lora = tmp_path / "head" / "lora"
    assert sorted(p.name for p in lora.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert json.loads((lora / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-target"
    assert str(tmp_path) not in (lora / "adapter_config.json").read_text()

    adapted = load_lora_adapter(copy.deepcopy(tiny_llama), tmp_path / "head")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_head(tmp_path / "head", adapted, adapter_applied=True)
    assert not [w for w in caught if "LoRA" in str(w.message)]  # "... which this target does not carry"
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        expected = objective.adapted(input_ids=ids).logits
        base = tiny_llama(input_ids=ids).logits
    torch.testing.assert_close(adapted(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(base, expected, atol=1e-3)  # the adapter changes the target's output


def test_card_names_local_targets_and_paths_without_their_directories(tiny_llama, tmp_path, monkeypatch):
    """Title, Target section, Use command and training record: a path outside the home and working directories
    becomes its last component; the Use command names a placeholder for a local target and this repo for the head."""
    monkeypatch.chdir(tmp_path)
    head = EagleHead(EagleConfig(version=3), tiny_llama)
    head.config.target.name_or_path = "/opt/private-models/llama-x"
    training = {"target": {"name": "/opt/private-models/llama-x"}, "data": {"paths": ["/srv/corpora/y.jsonl"]}}
    head.save_pretrained(tmp_path / "head", card={"training": training})
    text = (tmp_path / "head" / "README.md").read_text()
    assert "/opt/" not in text and "/srv/" not in text and "private-models" not in text
    assert "# EAGLE-3 draft head for llama-x" in text and "- name: `llama-x`" in text
    assert "Its decoder layer is a `LlamaDecoderLayer` (`draft_layer: target`: the target's own)." in text
    assert '"y.jsonl"' in text
    assert "specheads generate --target PATH_TO_TARGET --head OWNER/REPO" in text
    assert "`--head` takes this repository's Hub id (`OWNER/REPO`) or a local copy of this folder" in text

    home = os.path.expanduser("~")
    head.config.target.name_or_path = f"{home}/models/llama-y"
    head.save_pretrained(tmp_path / "head")
    text = (tmp_path / "head" / "README.md").read_text()
    assert f"{home}/" not in text and "# EAGLE-3 draft head for ~/models/llama-y" in text

    head.config.target.name_or_path = "meta-llama/Llama-3.1-8B"  # a Hub id is what everyone can load
    head.save_pretrained(tmp_path / "head")
    assert "--target meta-llama/Llama-3.1-8B --head OWNER/REPO" in (tmp_path / "head" / "README.md").read_text()


def test_card_records_license_head_version_and_only_what_is_known(tiny_llama, tmp_path):
    head = EagleHead(EagleConfig(version=3), tiny_llama)
    head.config.target.name_or_path = "smollm2-135m-instruct"
    head.config.target.revision = None
    head.save_pretrained(tmp_path / "e3", card={"metrics": {}, "training": {"steps": 1}})
    card = ModelCard.load(tmp_path / "e3" / "README.md")
    assert card.data.license == "apache-2.0"  # the built-in target's
    assert _title(tmp_path / "e3") == "# EAGLE-3 draft head for smollm2-135m-instruct"
    assert "revision" not in card.text and "None" not in card.text
    assert "## Metrics" not in card.text and "{}" not in card.text and "## Training" in card.text

    EagleHead(EagleConfig(version=1), tiny_llama).save_pretrained(tmp_path / "e1")
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(tmp_path / "m1")
    DraftModel(DraftModelConfig(copy_target_layers=1), tiny_llama).save_pretrained(tmp_path / "dm")
    assert {name: _title(tmp_path / name) for name in ("e1", "m1", "dm")} == {
        "e1": "# EAGLE-1 draft head for tiny-random-llama",
        "m1": "# Medusa-1 heads for tiny-random-llama",
        "dm": "# Draft model for tiny-random-llama",
    }
    tiny = ModelCard.load(tmp_path / "m1" / "README.md")
    assert tiny.data.license is None and "medusa2" not in tiny.data.tags  # an unknown target's license is not guessed
