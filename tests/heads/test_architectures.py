"""Targets other than Llama: EAGLE drafters are built from the target's decoder layer where that layer is a
Llama-style pre-norm block or Gemma2/3's (and compute exactly that layer's own forward, checked on 17 families with
the settings that would expose mis-wiring: Granite's residual multiplier, StableLM's q/k norms, SmolLM3's NoPE
layers, Qwen3-MoE's sparse MLP), layers they would wire differently are refused (Olmo2, Cohere, StableLM's parallel
block), exports refuse layers the engines would run as Llama layers, and a target that refuses sdpa attention loads
with eager (found by training heads for tiny Gemma, Gemma2, Gemma3 and Phi-3 targets)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from specheads.decoding import SpeculativeGenerator, build_drafter
from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads, UnsupportedTargetError, load_head
from specheads.heads.config import HeadConfigError
from specheads.heads.interop import ExportError, export_head
from specheads.heads.masks import causal_additive_mask
from tests.decoding.helpers import TinyTokenizer
from tests.tiny_models import ARCHITECTURES, EAGLE_REFUSED, TINY_FAMILY_CONFIG
from tests.tiny_models import tiny_named as tiny

LLAMA_STYLE = (
    "mistral qwen2 glm stablelm starcoder2 granite olmo smollm3 qwen3_moe seed_oss arcee gpt_oss mixtral qwen2_moe "
    "olmoe hunyuan_v1_dense ministral helium ernie4_5 nemotron"
).split()
"""Families whose decoder layer the drafter wires as a Llama-style pre-norm block (beyond Llama, Qwen3 and Phi-3)."""
EAGLE1_ONLY = ["deepseek_v3", "glm4_moe_lite", "persimmon"]
"""Llama-style blocks whose attention has no separate q/k/v projections for EAGLE-3 to widen (latent, fused)."""


@pytest.mark.parametrize(
    "model_type, version, refusal",
    [
        ("olmo2", 1, "no `input_layernorm`; norms the drafter's block would not apply \\(post_feedforward_layernorm"),
        ("cohere", 3, "no `post_attention_layernorm`"),
        ("phi3", 3, "fused attention projections"),
        ("stablelm_parallel", 1, "no `post_attention_layernorm`; a parallel attention/MLP block"),
        ("stablelm_parallel", 3, "no `post_attention_layernorm`; a parallel attention/MLP block"),
        ("gemma", 1, None),
        ("gemma", 3, None),
        ("gemma2", 1, None),
        ("gemma2", 3, None),
        ("gemma3_text", 1, None),
        ("gemma3_text", 3, None),
        ("phi3", 1, None),
        ("qwen3", 3, None),
    ],
)
def test_eagle_drafters_are_built_only_from_layers_they_wire_right(model_type, version, refusal):
    """Gemma2's extra feed-forward norms were once left at zero (never applied), Gemma3's rotary and Phi-3's fused
    qkv crashed at the first training step, StableLM's parallel block at the first call. Layers the drafter cannot
    wire are refused when it is built."""
    target = tiny(model_type)
    if refusal is None:
        EagleHead(EagleConfig(version=version, draft_layer="target"), target)
        return
    with pytest.raises(UnsupportedTargetError, match=refusal):
        EagleHead(EagleConfig(version=version, draft_layer="target"), target)


def test_a_rotary_embedding_that_needs_more_than_a_layer_type_is_refused():
    """Gemma3's rotary takes a layer type, which the drafter passes; an argument it does not know would fail at the
    first step. A Llama whose rotary embedding wants one more argument stands in for such a family."""
    target = tiny("llama")
    rotary_cls = type(target.model.rotary_emb)

    class NeedsMore(rotary_cls):
        def forward(self, x, position_ids, segment_ids):
            return super().forward(x, position_ids)

    target.model.rotary_emb = NeedsMore(target.config)
    with pytest.raises(UnsupportedTargetError, match="a rotary embedding that also needs \\['segment_ids'\\]"):
        EagleHead(EagleConfig(version=1, draft_layer="target"), target)


def test_a_layer_setting_the_drafter_does_not_apply_is_refused():
    """Granite's layer scales each branch by ``residual_multiplier``, which the hand wiring once skipped (its block
    was off by up to 3.4 on a tiny model). Any float on a layer that the wiring does not know is refused: a Llama
    layer with a made-up branch scale stands in for the next such family."""
    target = tiny("llama")
    layer_cls = type(target.model.layers[0])

    class Scaled(layer_cls):
        def __init__(self, config, layer_idx):
            super().__init__(config, layer_idx)
            self.branch_scale = 0.5

    class Bookkept(layer_cls):  # flags and names a later transformers may add: not scales, so not refused
        def __init__(self, config, layer_idx):
            super().__init__(config, layer_idx)
            self.gradient_checkpointing, self.attention_kind = False, "full"

    target.model.layers = torch.nn.ModuleList([Scaled(target.config, i) for i in range(2)])
    with pytest.raises(UnsupportedTargetError, match="scales the drafter's block would not apply \\(branch_scale\\)"):
        EagleHead(EagleConfig(version=1, draft_layer="target"), target)
    target.model.layers = torch.nn.ModuleList([Bookkept(target.config, i) for i in range(2)])
    EagleHead(EagleConfig(version=1, draft_layer="target"), target)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_eagle_drafters_build_on_exactly_the_families_they_wire(name):
    """Across every tested family, EAGLE-1 and EAGLE-3 refuse exactly the layers they do not wire (GPT-2's, Falcon's,
    post-norm Olmo3's, ...) with the reason, and build on every other one."""
    target = tiny(name)
    for version in (1, 3):
        if name in EAGLE_REFUSED[version]:
            with pytest.raises(UnsupportedTargetError, match="draft models work with this target.*draft_layer=llama"):
                EagleHead(EagleConfig(version=version, draft_layer="target"), target)
        else:
            EagleHead(EagleConfig(version=version, draft_layer="target"), target)


@pytest.mark.parametrize("name", sorted(set(ARCHITECTURES) - EAGLE_REFUSED[1]))
def test_a_fresh_drafter_starts_from_its_familys_initialisation_not_from_stale_memory(name, monkeypatch):
    """Fused MoE experts and routers (Qwen3-MoE, Mixtral, OLMoE, GPT-OSS) and GPT-OSS's attention sinks are
    ``torch.empty`` parameters that only the model's ``_init_weights`` fills; GPT-OSS's drafter once started at ~1e29
    and never trained. With every ``torch.empty`` poisoned with NaN, no parameter of a new drafter may keep it."""
    target = tiny(name)
    empty = torch.empty

    def poisoned(*args, **kwargs):
        tensor = empty(*args, **kwargs)
        return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

    monkeypatch.setattr(torch, "empty", poisoned)
    for version in (1,) if name in EAGLE_REFUSED[3] else (1, 3):
        drafter = EagleHead(EagleConfig(version=version, draft_layer="target"), target)
        stale = [n for n, p in drafter.named_parameters() if not p.isfinite().all()]
        assert not stale, (version, stale)


@pytest.mark.parametrize("name", ["qwen3_moe", "gpt2", "gemma3_text", "gpt_oss"])
def test_a_llama_layer_drafter_saves_its_layer_settings_and_reloads_identically(tmp_path, name):
    """``draft_layer=llama`` on an MoE, a GPT-2 (no rotary, no ``.layers``), a Gemma3 (one rotary per layer type) and
    a GPT-OSS (YaRN) target: a dense Llama layer with the target's sizes and its full-attention rotary, whose
    settings are saved in config.json, so the head reloads as the same layer and computes the same numbers."""
    target = tiny(name)
    torch.manual_seed(0)
    head = EagleHead(EagleConfig(version=3, draft_layer="llama"), target).eval()
    text = target.config.get_text_config()
    assert type(head.layer).__name__ == "LlamaDecoderLayer" and head.layer.mlp.gate_proj.in_features == 64
    settings = head.config.llama_layer
    assert settings["num_attention_heads"] == text.num_attention_heads
    rope = dict(text.rope_parameters or {}) if name != "gpt2" else {"rope_theta": 10000.0}  # GPT-2: Llama's default
    rope = rope.get("full_attention", rope)  # Gemma3: the global layers' rotary
    assert settings["rope_parameters"]["rope_theta"] == rope["rope_theta"]
    head.save_pretrained(tmp_path / "head")
    saved = json.loads((tmp_path / "head" / "config.json").read_text())["config"]
    assert saved["draft_layer"] == "llama" and saved["llama_layer"] == settings
    card = (tmp_path / "head" / "README.md").read_text()
    assert "decoder layer is a `LlamaDecoderLayer` (`draft_layer: llama`: a Llama layer with the target's" in card
    loaded = load_head(tmp_path / "head", target)
    features, ids, positions = torch.randn(1, 6, 64), torch.randint(0, 128, (1, 6)), torch.arange(3, 9)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(features, ids, positions), head(features, ids, positions), rtol=0, atol=0)


@pytest.mark.parametrize("model_type", ["deepseek_v4", "hy_v4"])
def test_heads_read_only_hidden_states_a_hyper_connection_family_does_not_stack(model_type):
    """DeepSeek-V4's and HY-V4's hidden states before the last are their hyper-connections' (B, T, hc_mult, H)
    streams: an EAGLE-3 head, which fuses a low, a middle and a high one, is refused when it is built (it would fail
    on their shape mid-training); Medusa and EAGLE-1 heads read the last, one (B, T, H) feature, and build."""
    from tests.tiny_models import tiny_family

    target = tiny_family(model_type)
    states = target(torch.tensor([[3, 5, 7]]), output_hidden_states=True).hidden_states
    assert [state.dim() for state in states] == [4] * (len(states) - 1) + [3]  # what the refusal is about
    medusa = MedusaHeads(MedusaConfig(num_heads=2), target)
    assert medusa(states[-1]).shape == (2, 1, 3, 128)
    eagle1 = EagleHead(EagleConfig(version=1), target)
    assert eagle1.fuse(states).shape == (1, 3, 64) and eagle1.config.draft_layer == "llama"  # its own is not wired
    own_layer = r"does not build as the full-attention layer.*KeyError|submodules the drafter's block would not call"
    with pytest.raises(UnsupportedTargetError, match=own_layer):  # DeepSeek-V4's had no full-attention form: KeyError
        EagleHead(EagleConfig(version=1, draft_layer="target"), target)
    with pytest.raises(UnsupportedTargetError, match=r"before index 4 are hyper-connection.*reads indices \[1, 2, 3\]"):
        EagleHead(EagleConfig(version=3), target)


MIXTURE_OF_EXPERTS = {"qwen3_moe", "gpt_oss", "mixtral", "qwen2_moe", "olmoe"}
"""The ``ARCHITECTURES`` entries whose layer 0 (the one a drafter copies) routes over experts."""


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_the_default_draft_layer_is_the_targets_own_when_dense_and_wired_and_a_llama_layer_otherwise(
    tmp_path, name, monkeypatch
):
    """``draft_layer="auto"`` (the default): the target's own layer where it is dense and the drafter wires it (the
    heads trained on SmolLM2 are unchanged), a dense Llama layer for an MoE target (no copy of every expert, and an
    export the engines load) and for a family whose own layer is refused (GPT-2, Falcon, Cohere, ...). The choice is
    saved, and a config.json without the field loads with the target's own layer."""
    target = tiny(name)
    built = []  # every expert module whose parameters were really allocated
    experts = [type(m) for n, m in target.named_modules() if n.endswith(".experts")]
    for cls in set(experts):
        monkeypatch.setattr(cls, "__init__", _recording_init(cls.__init__, built))
    heads = {version: EagleHead(EagleConfig(version=version), target) for version in (1, 3)}
    for version, head in heads.items():
        own = name not in EAGLE_REFUSED[version] and name not in MIXTURE_OF_EXPERTS
        assert head.config.draft_layer == ("target" if own else "llama"), version
        assert own or type(head.layer).__name__ == "LlamaDecoderLayer"
    assert not built, "the MoE layer looked at by auto is built on the meta device, never allocated"
    if name in EAGLE_REFUSED[1] | MIXTURE_OF_EXPERTS:
        return
    heads[1].save_pretrained(tmp_path / "head")
    config_path = tmp_path / "head" / "config.json"
    meta = json.loads(config_path.read_text())
    assert meta["config"]["draft_layer"] == "target"
    del meta["config"]["draft_layer"]  # a config.json without the field
    config_path.write_text(json.dumps(meta))
    assert load_head(tmp_path / "head", target).config.draft_layer == "target"


def _recording_init(init, built):
    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if any(p.device.type != "meta" for p in self.parameters()):
            built.append(type(self).__name__)

    return recording


def test_an_moe_target_whose_saved_head_has_no_draft_layer_loads_its_moe_layer(tmp_path):
    """A Qwen3-MoE head saved without ``draft_layer`` holds a copy of the MoE layer: it loads as such, strictly."""
    target = tiny("qwen3_moe")
    head = EagleHead(EagleConfig(version=3, draft_layer="target"), target)
    assert any(n.endswith("experts") for n, _ in head.named_modules())
    head.save_pretrained(tmp_path / "head")
    config_path = tmp_path / "head" / "config.json"
    meta = json.loads(config_path.read_text())
    del meta["config"]["draft_layer"]
    config_path.write_text(json.dumps(meta))
    loaded = load_head(tmp_path / "head", target)
    assert type(loaded.layer) is type(head.layer) and loaded.config.draft_layer == "target"


@pytest.mark.parametrize("version", [1, 3])
def test_on_a_llama_target_the_llama_layer_is_the_target_layer(version):
    """The two ``draft_layer`` choices build the same drafter on a Llama target: same tensors from the same seed,
    same numbers (so SmolLM2's heads are what either setting trains)."""
    target = tiny("llama")
    drafters = []
    for draft_layer in ("target", "llama"):
        torch.manual_seed(0)
        drafters.append(EagleHead(EagleConfig(version=version, draft_layer=draft_layer), target).eval())
    own, llama = (drafter.state_dict() for drafter in drafters)
    assert own.keys() == llama.keys() and all(torch.equal(own[name], llama[name]) for name in own)
    features, ids, positions = torch.randn(1, 6, 64), torch.randint(0, 128, (1, 6)), torch.arange(3, 9)[None]
    with torch.no_grad():
        torch.testing.assert_close(drafters[1](features, ids, positions), drafters[0](features, ids, positions))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(draft_layer="mlp"), "draft_layer must be one of \\('auto', 'target', 'llama'\\), found 'mlp'"),
        (dict(draft_layer="target", llama_layer={"hidden_size": 64}), "llama_layer applies to draft_layer='llama'"),
        (dict(draft_layer="llama", llama_layer={"hidden_size": 64}), "missing \\['head_dim', 'intermediate_size'"),
    ],
)
def test_draft_layer_settings_that_cannot_build_a_layer_are_refused(options, message):
    with pytest.raises(HeadConfigError, match=message):
        EagleHead(EagleConfig(version=3, **options), tiny("llama"))


@pytest.mark.parametrize(
    "model_type", ["llama", "gemma", "gemma2", "gemma3_text", "qwen3", "phi3", *LLAMA_STYLE, *EAGLE1_ONLY]
)
def test_the_eagle1_block_computes_the_target_layer_classs_own_forward(model_type):
    """EAGLE-1's block is the target's decoder layer applied to fc(embedding, feature). The drafter wires the
    layer's submodules itself (EAGLE-3 widens attention's input), so with every weight random (Gemma's norms start
    at zero) its output must equal the layer class's own forward on the same input: Gemma2/3's norms after
    attention and around the MLP, Granite's residual multiplier, Qwen3's and StableLM's q/k norms, Qwen3-MoE's
    routed experts and Gemma3's per-type rotary all included."""
    drafter = EagleHead(EagleConfig(version=1, draft_layer="target"), tiny(model_type)).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in drafter.parameters():
            p.normal_(0, 0.3)
    features, ids, positions = torch.randn(1, 6, 64), torch.randint(0, 128, (1, 6)), torch.arange(3, 9)[None]
    with torch.no_grad():
        hidden, _ = drafter(features, ids, positions)
        x = drafter.fc(torch.cat([drafter.borrowed.embed(ids), features], dim=-1))
        mask = causal_additive_mask(6, 0, x.dtype, x.device).expand(1, 1, -1, -1)
        rotary = drafter.rotary(x, positions, *drafter.rotary_args)
        own = drafter.layer(x, position_embeddings=rotary, attention_mask=mask)
    own = own[0] if isinstance(own, tuple) else own
    torch.testing.assert_close(hidden, own, rtol=1e-5, atol=1e-5)
    assert hidden.abs().mean() > 0.1  # not a degenerate all-zero comparison


@pytest.mark.parametrize(
    "model_type, version",
    [(name, version) for name in ["gemma2", "gemma3_text", *LLAMA_STYLE] for version in (1, 3)]
    + [(name, 1) for name in EAGLE1_ONLY],
)
def test_eagle_decodes_exactly_the_targets_greedy_tokens(model_type, version):
    """An EAGLE drafter on a Gemma2/3 target (soft-capped logits, sliding-window layers, Gemma3's two rotary
    embeddings) or a Llama-style one (Mistral past its window, Granite's scaled logits, Qwen3-MoE's experts, ...)
    decodes the target's own greedy tokens, through a chain and an EAGLE-2 dynamic tree."""
    target = tiny(model_type)
    head = EagleHead(EagleConfig(version=version, draft_layer="target"), target).eval()
    prompt = torch.tensor([[1, 5, 9, 33, 7, 5, 9, 33, 12, 40]])
    expected = target.generate(prompt, max_new_tokens=16, do_sample=False)[0, prompt.shape[1] :].tolist()
    for tree in ("chain:3", "dynamic:3,2,6"):
        generator = SpeculativeGenerator(target, TinyTokenizer(), build_drafter(head, tree))
        result = generator.generate(prompt, max_new_tokens=16)
        assert result.token_ids == expected, tree


@pytest.mark.parametrize(
    "model_type, refusal",
    [("gemma", "do not compute x \\* w|is not SiLU"), ("gemma2", "not a plain Llama layer.*extra tensors")],
)
@pytest.mark.parametrize("version", [1, 3])
def test_gemma_eagle_export_is_refused_not_silently_wrong(tmp_path, version, model_type, refusal):
    """Gemma's layer has Llama's tensor names but norms of x * (1 + w) and a GELU MLP: exported as a Llama layer, an
    engine computed another drafter (logits off by up to 7 on a tiny model). Gemma2/3's also has feed-forward norms
    that a Llama layer lacks."""
    target = tiny(model_type)
    options = dict(input_norm=False, fc_bias=False) if version == 1 else {}
    head = EagleHead(EagleConfig(version=version, **options), target)
    with pytest.raises(ExportError, match=refusal):
        export_head(head, target, tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_target_that_refuses_sdpa_loads_with_eager_and_decodes_losslessly(tmp_path):
    """load_target asked every target for sdpa; Gemma2 (soft-capped attention) refuses it, so no command could load
    it. Eager takes the same additive tree mask: greedy output with a Medusa head is the target's own."""
    from transformers import AutoTokenizer

    from specheads.target import ensure_builtin_converted, load_target

    tiny("gemma2").save_pretrained(tmp_path / "gemma2")
    AutoTokenizer.from_pretrained(ensure_builtin_converted("smollm2-135m-instruct")).save_pretrained(
        tmp_path / "gemma2"
    )
    target, tokenizer = load_target(tmp_path / "gemma2")
    assert target.config._attn_implementation == "eager"
    head = MedusaHeads(MedusaConfig(num_heads=2), target)
    prompt = torch.tensor([[1, 5, 9, 33, 7, 5, 9, 33]])
    result = SpeculativeGenerator(target, tokenizer, build_drafter(head, "chain:2")).generate(prompt, max_new_tokens=12)
    expected = target.generate(prompt, max_new_tokens=12, do_sample=False)[0, 8:].tolist()
    assert result.token_ids == expected[: len(result.token_ids)] and len(result.token_ids) > 0
    assert len(result.token_ids) == 12 or result.token_ids[-1] == tokenizer.eos_token_id


def test_a_multimodal_gemma3_decodes_text_past_its_window_with_every_head():
    """Gemma3's 4B+ checkpoints load as ``Gemma3ForConditionalGeneration`` (a vision tower around the text model):
    heads are built from its text model's layer and vocabulary, and text decoding past the sliding window is the
    target's own greedy output."""
    from transformers import Gemma3Config

    text = dict(
        TINY_FAMILY_CONFIG, head_dim=16, sliding_window=16, layer_types=["sliding_attention", "full_attention"] * 2
    )
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28)
    config = Gemma3Config(
        text_config=text, vision_config={**vision, "patch_size": 14}, mm_tokens_per_image=4, image_token_index=127
    )
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval().requires_grad_(False)
    assert type(target).__name__ == "Gemma3ForConditionalGeneration"
    target.generation_config.eos_token_id = None
    prompt = torch.tensor([[1, 5, 9, 33, 7, 5, 9, 33, 12, 40, 5, 9]])
    expected = target.generate(prompt, max_new_tokens=24, do_sample=False)[0, prompt.shape[1] :].tolist()
    heads = [MedusaHeads(MedusaConfig(num_heads=2), target)]
    heads += [EagleHead(EagleConfig(version=version, draft_layer="target"), target) for version in (1, 3)]
    for head in heads:
        generator = SpeculativeGenerator(target, TinyTokenizer(), build_drafter(head.eval(), "chain:2"))
        assert generator.generate(prompt, max_new_tokens=24).token_ids == expected, type(head).__name__
