"""Loading EAGLE-3 checkpoints written for the serving engines (SpecForge / vLLM / SGLang layout, speculators format):
the same checks and the same precision as a head saved by specheads."""

import copy
import json

import pytest
import safetensors.torch
import torch

from specheads.heads import EagleConfig, EagleHead, build_vocab_maps, load_head
from specheads.heads.config import HeadLoadError
from specheads.heads.interop import export_head
from tests.tiny_models import make_tiny_llama


def _exported(folder, engine="vllm", draft_vocab=32):
    """A random EAGLE-3 head with a Llama drafter layer on a 6-layer tiny target, exported in fp32 for ``engine``."""
    target = make_tiny_llama(num_layers=6)
    d2t, _ = build_vocab_maps(
        torch.randint(0, 60, (800,), generator=torch.Generator().manual_seed(0)), 128, draft_vocab
    )
    head = EagleHead(EagleConfig(version=3, draft_vocab_size=draft_vocab, draft_layer="llama"), target, d2t=d2t)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # values no bf16 holds exactly, so that rounding shows
        for param in head.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2 + (1.0 if param.ndim == 1 else 0.0))
    export_head(head.eval(), target, folder, engine=engine, dtype=torch.float32)
    return head, target


def _repeat_first_token(offsets):
    offsets[1] = offsets[0] - 1  # draft id 1 names draft id 0's token
    return offsets


def _past_the_vocabulary(offsets):
    offsets[-1] += 1000
    return offsets


@pytest.mark.parametrize("engine", ["vllm", "speculators"])
@pytest.mark.parametrize("damage", [_repeat_first_token, _past_the_vocabulary])
def test_an_imported_d2t_that_names_a_token_twice_or_none_is_refused(tmp_path, engine, damage):
    """An engine checkpoint's d2t offsets were never checked: two draft ids naming one token loaded silently (sampled
    drafts then skew the output away from the target's distribution), an id past the vocabulary was an IndexError."""
    _, target = _exported(tmp_path, engine)
    tensors = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    tensors["d2t"] = damage(tensors["d2t"].clone())
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(HeadLoadError, match=r"d2t must name 32 distinct target token ids in \[0, 128\)"):
        load_head(tmp_path, target)


def test_a_speculators_config_without_norm_before_residual_is_read_as_vllm_reads_it(tmp_path):
    """vLLM takes an absent norm_before_residual as True, another drafter than specheads' (False): it loaded."""
    _, target = _exported(tmp_path, "speculators")
    meta = json.loads((tmp_path / "config.json").read_text())
    del meta["norm_before_residual"]
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(
        HeadLoadError, match="found speculators_model_type='eagle3' with .*'norm_before_residual': True"
    ):
        load_head(tmp_path, target)


def test_an_fp32_engine_checkpoint_loaded_for_training_onto_a_bf16_target_keeps_its_values(tmp_path):
    """``trainable=True`` cast the imported head to fp32 after loading it in the target's bf16: rounded weights."""
    head, target = _exported(tmp_path)
    loaded = load_head(tmp_path, copy.deepcopy(target).to(torch.bfloat16), trainable=True)
    assert loaded.training and all(p.requires_grad and p.dtype == torch.float32 for p in loaded.parameters())
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_a_head_built_with_a_d2t_that_names_a_token_twice_is_refused():
    """Only the loaders checked d2t: a head built in code with a repeated id drafted two siblings of one token, and
    mapping q back to the target's vocabulary dropped one's mass."""
    target = make_tiny_llama(num_layers=6)
    d2t = torch.arange(32)
    d2t[1] = 0
    with pytest.raises(HeadLoadError, match="d2t must name 32 distinct target token ids"):
        EagleHead(EagleConfig(version=3, draft_vocab_size=32), target, d2t=d2t)


def test_a_16bit_checkpoint_shipping_the_fp32_targets_embedding_in_its_dtype_loads(tmp_path):
    """SpecForge saves the drafter with the target's embedding, in the training dtype: a bf16 checkpoint of a target
    whose weights are fp32 was refused as an embedding that "differs from the target's". Another embedding still is."""
    head, target = _exported(tmp_path)
    tensors = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    tensors = {name: t.to(torch.bfloat16) if t.is_floating_point() else t for name, t in tensors.items()}
    embedding = target.get_input_embeddings().weight.detach()
    tensors["embed_tokens.weight"] = embedding.to(torch.bfloat16)
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded = load_head(tmp_path, target)
    for name, tensor in head.state_dict().items():
        rounded = tensor.to(torch.bfloat16).float() if tensor.is_floating_point() else tensor
        assert torch.equal(loaded.state_dict()[name], rounded), name
    tensors["embed_tokens.weight"] = (embedding * 1.1).to(torch.bfloat16)
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(HeadLoadError, match="ships an embedding that differs from the target's"):
        load_head(tmp_path, target)


@pytest.mark.parametrize("engine", ["vllm", "speculators"])
def test_a_truncated_engine_checkpoint_is_refused_with_what_is_wrong(tmp_path, engine):
    """A cut-off model.safetensors in an engine's folder was safetensors' own traceback, not a HeadLoadError."""
    _, target = _exported(tmp_path, engine)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(HeadLoadError, match="is not a readable safetensors file .* corrupt or truncated"):
        load_head(tmp_path, target)


def test_a_speculators_config_without_its_layer_config_is_refused_by_name(tmp_path):
    """A speculators config.json lacking transformer_layer_config was a bare KeyError ('transformer_layer_config')."""
    _, target = _exported(tmp_path, "speculators")
    meta = json.loads((tmp_path / "config.json").read_text())
    del meta["transformer_layer_config"]
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(HeadLoadError, match="has no transformer_layer_config, which every speculators EAGLE-3"):
        load_head(tmp_path, target)
