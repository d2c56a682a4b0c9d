"""EagleHead v1/v3: forward shapes, KV-cache consistency, vocabulary maps, and the real SmolLM2 target."""

import pytest
import torch

from specheads.heads import EagleConfig, EagleHead, build_vocab_maps, default_eagle3_layer_ids
from specheads.heads.borrowed import borrow
from specheads.heads.config import HeadConfigError
from tests.tiny_models import ARCHITECTURES, make_tiny_llama, tiny_named


def _inputs(target, length=7, batch=2, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.config.vocab_size, (batch, length), generator=generator)
    positions = torch.arange(length)[None].expand(batch, -1)
    return ids, positions


@pytest.mark.parametrize("version", [1, 3])
def test_forward_shapes_and_borrowed_modules(tiny_llama, version):
    drafter = EagleHead(EagleConfig(version=version), tiny_llama)
    ids, positions = _inputs(tiny_llama)
    hidden_states = tiny_llama(ids, output_hidden_states=True).hidden_states
    features = drafter.fuse(hidden_states)
    hidden, logits = drafter(features, ids, positions)
    assert features.shape == hidden.shape == (2, 7, 64)
    assert logits.shape == (2, 7, 128)
    names = drafter.state_dict().keys()
    assert not any("embed_tokens" in n for n in names), "the target embedding is borrowed, never saved"
    if version == 1:
        assert not any("lm_head" in n for n in names), "EAGLE-1 borrows the target lm_head"
    else:
        assert drafter.layer.self_attn.q_proj.in_features == 128  # attends over concat(embedding, feature)
        assert "lm_head.weight" in names and "d2t" in names


@pytest.mark.parametrize("version", [1, 3])
def test_incremental_cache_equals_full_forward(tiny_llama, version):
    drafter = EagleHead(EagleConfig(version=version), tiny_llama)
    ids, positions = _inputs(tiny_llama)
    features = drafter.fuse(tiny_llama(ids, output_hidden_states=True).hidden_states)
    _, full = drafter(features, ids, positions)
    cache = drafter.new_cache()
    _, first = drafter(features[:, :4], ids[:, :4], positions[:, :4], cache=cache)
    _, rest = drafter(features[:, 4:], ids[:, 4:], positions[:, 4:], cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == 7


def test_causal_mask_is_applied(tiny_llama):
    """Changing a later token must not change earlier positions' outputs."""
    drafter = EagleHead(EagleConfig(version=3), tiny_llama)
    ids, positions = _inputs(tiny_llama, batch=1)
    features = torch.randn(1, 7, 64)
    _, logits = drafter(features, ids, positions)
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 128
    _, logits2 = drafter(features, changed, positions)
    torch.testing.assert_close(logits[:, :-1], logits2[:, :-1])
    assert not torch.allclose(logits[:, -1], logits2[:, -1])


def test_drafters_embed_tokens_as_the_engines_do():
    """A drafter reads the plain rows of the target's embedding, as vLLM's, SGLang's and SpecForge's drafters do.
    Gemma's embedding module multiplies them by sqrt(hidden) (8 here) where those engines scale in the target's
    forward instead; a Gemma head trained on scaled rows, once exported, was fed rows 8x smaller by the engine."""
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(0))
    scaling = set()
    for name in sorted(ARCHITECTURES):
        target = tiny_named(name)
        borrowed, module = borrow(target), target.get_input_embeddings()
        torch.testing.assert_close(borrowed.embed(ids), module.weight[ids], rtol=0, atol=0)
        if not torch.equal(module(ids), module.weight[ids]):
            scaling.add(name)
    assert scaling == {"gemma", "gemma2", "gemma3_text"}  # the families whose module scales, so the check can fail
    target = tiny_named("llama")
    calls = []
    target.get_input_embeddings().register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    borrow(target).embed(ids)
    assert calls == [ids.shape], "a plain nn.Embedding is called as a module: accelerate's device-map hooks run"


def test_default_layer_ids_are_distinct_ascending_layer_inputs_the_engines_capture():
    assert default_eagle3_layer_ids(30) == [2, 15, 27]  # SmolLM2-135M: HF indices {2, N//2, N-3}
    assert default_eagle3_layer_ids(4) == [1, 2, 3] and default_eagle3_layer_ids(6) == [2, 3, 4]
    for n in range(4, 200):  # each in [1, N - 1]: neither the embeddings nor the normed output, which no engine hands
        ids = default_eagle3_layer_ids(n)
        assert ids == sorted(set(ids)) and len(ids) == 3 and 1 <= ids[0] and ids[-1] <= n - 1, (n, ids)
    for n in (1, 2, 3):  # three distinct inputs among layers 1..N-1 need N >= 4
        with pytest.raises(HeadConfigError, match=f"at least 4 layers; this one has {n}: pass explicit layer_ids"):
            default_eagle3_layer_ids(n)


def test_eagle3_layer_ids_must_be_distinct_and_ascending_from_the_start(tiny_llama):
    """The engines capture each listed layer once, in ascending order: [3, 1, 2] would be served as [1, 2, 3] and
    [2, 2, 3] as two features for a 3H fc. The config refuses both before any module is built."""
    for ids in ([3, 1, 2], [2, 2, 3]):
        with pytest.raises(HeadConfigError, match=r"not distinct and ascending.*give three distinct indices"):
            EagleConfig(version=3, layer_ids=ids)
    assert EagleConfig(version=1, layer_ids=[4]).layer_ids == [4]
    assert EagleHead(EagleConfig(version=3, layer_ids=[0, 2, 4]), tiny_llama).layer_ids == [0, 2, 4]
    with pytest.raises(HeadConfigError, match="at least 4 layers; this one has 2"):
        EagleHead(EagleConfig(version=3), make_tiny_llama(num_layers=2))


def test_vocab_maps_pick_most_frequent_tokens_and_round_trip():
    tokens = torch.tensor([5] * 10 + [3] * 7 + [9] * 7 + [1] * 2 + [0])
    d2t, t2d = build_vocab_maps(tokens, target_vocab_size=12, draft_vocab_size=3)
    assert d2t.tolist() == [3, 5, 9]  # sorted ids of the three most frequent tokens
    assert t2d[d2t].tolist() == [0, 1, 2]
    assert t2d[torch.tensor([0, 1, 11])].tolist() == [-1, -1, -1]
    d2t_ties, _ = build_vocab_maps(tokens, target_vocab_size=12, draft_vocab_size=2)
    assert d2t_ties.tolist() == [3, 5]  # 3 and 9 tie at 7: the lower id wins
    d2t_lists, _ = build_vocab_maps([[5, 5, 3], [9]], target_vocab_size=12, draft_vocab_size=12)
    assert d2t_lists.tolist() == list(range(12))  # the full vocabulary is a valid choice


def test_reduced_draft_vocabulary_converts_ids(tiny_llama):
    corpus = torch.randint(0, 40, (500,))
    d2t, _ = build_vocab_maps(corpus, 128, 32)
    drafter = EagleHead(EagleConfig(version=3, draft_vocab_size=32), tiny_llama, d2t=d2t)
    ids, positions = _inputs(tiny_llama)
    _, logits = drafter(torch.randn(2, 7, 64), ids, positions)
    assert logits.shape == (2, 7, 32)
    draft_ids = torch.arange(32)
    target_ids = drafter.draft_to_target(draft_ids)
    assert torch.equal(target_ids, d2t)
    assert torch.equal(drafter.target_to_draft(target_ids), draft_ids)
    outside = torch.tensor([i for i in range(128) if i not in set(d2t.tolist())][:5])
    assert drafter.target_to_draft(outside).tolist() == [-1] * 5
    # the draft lm_head starts from the target's output embedding rows of the kept tokens
    torch.testing.assert_close(drafter.lm_head.weight, tiny_llama.lm_head.weight[d2t])


def test_reduced_vocabulary_without_map_is_an_error(tiny_llama):
    with pytest.raises(HeadConfigError, match="build_vocab_maps"):
        EagleHead(EagleConfig(version=3, draft_vocab_size=32), tiny_llama)


def test_bad_layer_ids_and_version(tiny_llama):
    with pytest.raises(HeadConfigError, match="layer_ids"):
        EagleHead(EagleConfig(version=3, layer_ids=[1, 2]), tiny_llama)
    with pytest.raises(HeadConfigError, match="version"):
        EagleHead(EagleConfig(version=2), tiny_llama)


def test_missing_hidden_states_are_a_clear_error(tiny_llama):
    drafter = EagleHead(EagleConfig(version=3), tiny_llama)
    with pytest.raises(ValueError, match="output_hidden_states"):
        drafter.fuse([None] * 5)


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 3])
def test_forward_on_smollm2(smollm2, version):
    model, tokenizer = smollm2
    drafter = EagleHead(EagleConfig(version=version), model)
    ids = tokenizer("Speculative decoding drafts tokens cheaply.", return_tensors="pt").input_ids
    positions = torch.arange(ids.shape[1])[None]
    with torch.no_grad():
        out = model(ids, output_hidden_states=drafter.layer_ids)
        hidden, logits = drafter(drafter.fuse(out.hidden_states)[:, :-1], ids[:, 1:], positions[:, :-1])
    assert hidden.shape == (1, ids.shape[1] - 1, 576)
    assert logits.shape == (1, ids.shape[1] - 1, 49152)
    assert torch.isfinite(logits).all()
    expected_ids = [30] if version == 1 else [2, 15, 27]
    assert drafter.layer_ids == expected_ids


def test_eagle1_reference_layout_round_trips(tiny_llama, tmp_path):
    """input_norm=False / fc_bias=False: the layer's input norm and fc's bias are gone from the module and the saved
    file, and the head loads back strictly with the same outputs."""
    from specheads.heads import load_head

    drafter = EagleHead(EagleConfig(version=1, input_norm=False, fc_bias=False), tiny_llama)
    names = set(drafter.state_dict())
    assert "layer.input_layernorm.weight" not in names and "fc.bias" not in names and "fc.weight" in names
    with torch.no_grad():
        drafter.fc.weight.normal_(0, 0.1)
    drafter.save_pretrained(tmp_path)
    loaded = load_head(tmp_path, tiny_llama)
    assert (loaded.config.input_norm, loaded.config.fc_bias) == (False, False)
    ids, positions = _inputs(tiny_llama)
    features = torch.randn(2, 7, 64)
    torch.testing.assert_close(loaded(features, ids, positions)[1], drafter(features, ids, positions)[1])


def test_building_a_head_leaves_the_config_it_was_given_as_it_was(tiny_llama):
    """The head resolves a copy (target record, layer ids, the layer ``auto`` picks, the draft vocabulary size); a
    config reused for a second head on another target must not carry the first one's choices."""
    config = EagleConfig(version=3)
    given = config.to_dict()
    head = EagleHead(config, tiny_llama)
    assert config.to_dict() == given and config.draft_layer == "auto" and config.layer_ids == []
    assert head.config is not config and head.config.draft_layer == "target" and head.config.layer_ids == [1, 2, 3]
    assert head.config.draft_vocab_size == 128 and head.config.target.name_or_path


def test_the_old_name_eagle_drafter_still_imports_with_a_deprecation_warning():
    import specheads.heads
    import specheads.heads.eagle

    for module in (specheads.heads, specheads.heads.eagle):
        with pytest.warns(DeprecationWarning, match="EagleDrafter is renamed EagleHead"):
            assert module.EagleDrafter is EagleHead
    with pytest.warns(DeprecationWarning, match="EagleDrafter is renamed EagleHead"):
        from specheads.heads import EagleDrafter
    assert EagleDrafter is EagleHead
    with pytest.raises(AttributeError, match="has no attribute 'EagleHeads'"):
        specheads.heads.EagleHeads  # noqa: B018
