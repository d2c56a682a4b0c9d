"""``specheads export`` loads the target that a head's config.json names, and a downloaded head names whatever its
author chose: a target with pickled weights only is refused there too, before anything is unpickled."""

import torch

from specheads.heads import MedusaConfig, MedusaHeads
from specheads.heads.export_cli import export_main
from tests.tiny_models import make_tiny_llama


def test_export_refuses_a_target_with_pickled_weights_named_by_the_head(tmp_path, capsys, monkeypatch):
    target = make_tiny_llama()
    pickled = tmp_path / "pickled-target"
    target.config.save_pretrained(pickled)
    torch.save(target.state_dict(), pickled / "pytorch_model.bin")
    target.config.name_or_path = str(pickled)  # what the head records as its target
    MedusaHeads(MedusaConfig(num_heads=2), target).save_pretrained(tmp_path / "head")

    def no_unpickling(*args, **kwargs):
        raise AssertionError(f"torch.load was called on {args[0] if args else kwargs}")

    monkeypatch.setattr(torch, "load", no_unpickling)
    assert export_main([str(tmp_path / "head"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "pickled weights only (pytorch_model.bin)" in err and "reads weights only from safetensors" in err
    assert not (tmp_path / "out").exists()
