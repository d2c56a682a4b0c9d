"""SpeculativeGenerator as a Python library: prompt forms, RNG use, EOS, placement and attention checks, the CPU
kernel patch shared between overlapping calls, and the Medusa-2 adapter warning (tiny random Llama)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers import BatchEncoding

from specheads.decoding import build_drafter
from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.medusa_drafter import MedusaDrafter
from specheads.decoding.tree import DynamicTreeConfig, static_tree
from specheads.decoding.tuning.cpu_kernels import SmallBatchLinear
from specheads.heads import (
    EagleConfig,
    EagleHead,
    MedusaConfig,
    MedusaHeads,
    apply_lora_adapter,
    load_head,
    load_lora_adapter,
)
from tests.decoding.helpers import TinyTokenizer

PROMPT = [3, 17, 42, 5, 17, 42, 9]


@pytest.fixture
def target(tiny_llama):
    tiny_llama.generation_config.eos_token_id = None
    return tiny_llama


def _plain(target) -> SpeculativeGenerator:
    return SpeculativeGenerator(target, TinyTokenizer())


def test_tokenizer_output_with_left_padding_is_the_unpadded_prompt(target):
    generator = _plain(target)
    expected = generator.generate(PROMPT, max_new_tokens=6).token_ids
    padded = BatchEncoding(
        {"input_ids": torch.tensor([[0, 0] + PROMPT]), "attention_mask": torch.tensor([[0, 0] + [1] * 7])}
    )
    assert generator.generate(padded, max_new_tokens=6).token_ids == expected
    assert generator.generate({"input_ids": torch.tensor([PROMPT])}, max_new_tokens=6).token_ids == expected
    assert generator.generate(tuple(PROMPT), max_new_tokens=6).token_ids == expected
    right = {"input_ids": torch.tensor([PROMPT + [0]]), "attention_mask": torch.tensor([[1] * 7 + [0]])}
    with pytest.raises(ValueError, match="right or inner padding"):
        generator.generate(right, max_new_tokens=6)


@pytest.mark.parametrize(
    ("prompt", "error", "match"),
    [
        (torch.tensor([3.7, 4.0]), TypeError, "must be integers"),
        ({"attention_mask": [1, 1]}, TypeError, "needs 'input_ids'"),
        (["one prompt", "another"], ValueError, "one sequence at a time"),
        (42, TypeError, "got int"),
        ([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], ValueError, "batch of 2"),
        ([[3, 17, 42], [5]], ValueError, "batch of 2"),  # ragged: torch's own error named no batch
        ([3, 17, 500], ValueError, r"\[0, 128\).*got \[500\]"),  # else an IndexError deep in the embedding
        ([3, -100, 17], ValueError, r"got \[-100\].*-100"),
    ],
)
def test_unusable_prompts_are_named(target, prompt, error, match):
    with pytest.raises(error, match=match):
        _plain(target).generate(prompt, max_new_tokens=2)


def test_unseeded_sampling_follows_torch_manual_seed_and_does_not_reseed(target):
    generator = _plain(target)
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(generator.generate(PROMPT, max_new_tokens=8, temperature=1.0).token_ids)
        assert torch.initial_seed() == 123  # the global generator was not reseeded
    assert runs[0] == runs[1]


def test_eos_is_read_at_each_call(target):
    generator = _plain(target)
    tokens = generator.generate(PROMPT, max_new_tokens=8).token_ids
    target.generation_config.eos_token_id = tokens[2]  # set after the generator was built
    assert generator.generate(PROMPT, max_new_tokens=8).token_ids == tokens[: tokens.index(tokens[2]) + 1]


def test_attention_without_tree_masks_is_refused(target):
    target.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="does not apply the additive 4D tree mask"):
        _plain(target)


LINEAR = dict(linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)
LAYERS_WITHOUT_TREES = {  # family: (its options, what the refusal names)
    "qwen3_next": (
        dict(head_dim=16, num_experts=0, layer_types=["linear_attention", "full_attention"] * 2, **LINEAR),
        "LinearAttentionLayer",
    ),
    "lfm2": (dict(layer_types=["conv", "full_attention"] * 2), "LinearAttentionLayer"),
    "falcon_h1": ({}, "LinearAttentionAndFullAttentionLayer"),
    "jamba": ({}, "LinearAttentionLayer"),
    "deepseek_v4": ({}, "DeepseekV4HCACache.*compressed or indexed attention caches"),  # compressed attention
    "hy_v4": ({}, "DynamicIndexedLayer"),  # indexed attention
    "rwkv": ({}, "RwkvForCausalLM's forward takes no `cache`"),  # its recurrent state is its own `state` argument
    "openai-gpt": ({}, "forward takes no `cache`"),  # no cache at all
    "llama4_text": (
        dict(
            head_dim=16,
            attention_chunk_size=8,
            layer_types=["chunked_attention", "full_attention"] * 2,
            num_local_experts=1,
            interleave_moe_layer_step=1,
        ),
        "chunked_attention",
    ),
}
WITHOUT_SDPA = ("deepseek_v4", "hy_v4", "rwkv", "openai-gpt")


@pytest.mark.parametrize("model_type", list(LAYERS_WITHOUT_TREES))
def test_targets_with_layers_that_cannot_take_a_tree_are_refused_before_decoding(model_type):
    """Recurrent layers (linear attention, state-space, convolution) fold every node of a tree into one state that
    cannot be cut back to the accepted path, as compressed or indexed attention caches (DeepSeek-V4, HY-V4, which
    have no sdpa) keep summaries over several tokens, chunked attention needs another mask, and RWKV and GPT-1 take no
    cache at all: refused at construction, naming the layers, where they would otherwise fail mid-request inside
    transformers' cache (or decode wrongly)."""
    from tests.tiny_models import tiny_family

    options, named = LAYERS_WITHOUT_TREES[model_type]
    model = tiny_family(model_type, attn="eager" if model_type in WITHOUT_SDPA else "sdpa", **options)
    with pytest.raises(ValueError, match=f"{named}.*Decode this target with transformers' generate"):
        SpeculativeGenerator(model, TinyTokenizer())


def test_a_head_moved_to_another_dtype_is_named_before_decoding(target):
    head = EagleHead(EagleConfig(version=1), target).eval()
    generator = SpeculativeGenerator(target, TinyTokenizer(), EagleTreeDrafter(head, DynamicTreeConfig(2, 2, 4)))
    generator.generate(PROMPT, max_new_tokens=4)
    head.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"drafter's head is on cpu in torch.bfloat16, the target on cpu"):
        generator.generate(PROMPT, max_new_tokens=4)
    medusa = MedusaDrafter(MedusaHeads(MedusaConfig(num_heads=2), target).eval(), static_tree([[0], [0, 0]]))
    medusa.heads.to(torch.bfloat16)
    with pytest.raises(ValueError, match="drafter's heads"):
        SpeculativeGenerator(target, TinyTokenizer(), medusa).generate(PROMPT, max_new_tokens=4)


def test_the_default_eagle_tree_on_a_cpu_warns(target):
    head = EagleHead(EagleConfig(version=1), target).eval()
    with pytest.warns(UserWarning, match="sized for a GPU"):
        build_drafter(head)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_drafter(head, "chain:3")


def test_overlapping_kernel_patches_restore_once(target):
    """Two generate calls sharing a target and its kernel choice (threads) overlap their patch blocks: the layers
    stay patched until the last block ends, then are restored exactly once."""
    layer = target.lm_head
    kernels = SmallBatchLinear(rows=range(2, 9))  # forced: whether this CPU would swap any count is not the point
    first, second = kernels(target), kernels(target)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert "forward" in layer.__dict__  # still in use by the second block
    second.__exit__(None, None, None)
    assert "forward" not in layer.__dict__
    with kernels(target):  # and it patches again afterwards
        assert "forward" in layer.__dict__


def test_a_medusa2_head_without_its_adapter_warns(target, tmp_path):
    from peft import LoraConfig, get_peft_model

    MedusaHeads(MedusaConfig(num_heads=2), target).save_pretrained(tmp_path)
    adapted = get_peft_model(copy.deepcopy(target), LoraConfig(r=2, target_modules=["q_proj"]))
    adapted.save_pretrained(tmp_path / "lora")
    with pytest.warns(UserWarning, match="apply_lora_adapter"):
        load_head(tmp_path, target)
    ready, applied = apply_lora_adapter(copy.deepcopy(target), tmp_path)
    assert applied and not hasattr(ready, "specheads_lora_adapter")  # said by the return value, not on the model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_head(tmp_path, ready, adapter_applied=applied)
    assert load_lora_adapter(copy.deepcopy(target), tmp_path) is not target


def test_a_generation_config_that_samples_is_flagged(target):
    """Chat models often ship do_sample=True: generate() takes the sampling settings as arguments, and says so."""
    target.generation_config.do_sample, target.generation_config.temperature = True, 0.6
    target.generation_config.min_new_tokens = 5
    with pytest.warns(UserWarning, match=r"asks to sample \({'temperature': 0.6") as caught:
        _plain(target)
    assert any("min_new_tokens" in str(w.message) for w in caught)


@pytest.mark.parametrize("setting", [dict(top_h=0.4), dict(token_healing=True), dict(min_p=0.1)])
def test_settings_that_generate_applies_when_it_samples_or_encodes_are_flagged(target, setting):
    """transformers' generate applies top-h whenever it samples and heals the prompt's last token first; the loop
    does neither, so a config with either set is named (as min-p is), not passed over."""
    for key, value in setting.items():
        setattr(target.generation_config, key, value)
    with pytest.warns(UserWarning, match=f"sets {setting}, which speculative decoding does not apply"):
        _plain(target)


def test_generation_settings_changed_after_construction_are_flagged_at_generate(target):
    """The target's generation config is read on every call (as EOS is): a repetition penalty set after the
    generator was built, or a forced first token, is flagged when generate runs, once per change."""
    generator = _plain(target)
    target.generation_config.repetition_penalty = 1.5
    with pytest.warns(UserWarning, match=r"sets {'repetition_penalty': 1.5}, which speculative decoding does not"):
        generator.generate(PROMPT, max_new_tokens=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generator.generate(PROMPT, max_new_tokens=2)  # unchanged since: said once
    target.generation_config.forced_bos_token_id, target.generation_config.stop_strings = 7, ["done"]
    with pytest.warns(UserWarning, match=r"'forced_bos_token_id': 7, 'stop_strings': \['done'\]"):
        generator.generate(PROMPT, max_new_tokens=2)


def test_a_head_passed_as_the_drafter_is_named_when_the_generator_is_built(target):
    """A loaded head is not a drafter: said at once, with the call that makes one, not after the prompt's forward."""
    with pytest.raises(TypeError, match=r"got MedusaHeads; wrap.*build_drafter\(head\)"):
        SpeculativeGenerator(target, TinyTokenizer(), MedusaHeads(MedusaConfig(num_heads=2), target))


def test_a_tree_of_another_kind_is_named_when_the_drafter_is_built(target):
    """Medusa's own choices list, or a tree setting string, fail at once with the call that compiles them, not
    with an AttributeError at the first step."""
    with pytest.raises(TypeError, match=r"StaticTree, got list.*static_tree\(choices\)"):
        MedusaDrafter(MedusaHeads(MedusaConfig(num_heads=2), target), [[0], [1], [0, 0]])
    with pytest.raises(TypeError, match=r"DynamicTreeConfig, got 'dynamic:5,8,60'.*build_drafter"):
        EagleTreeDrafter(EagleHead(EagleConfig(version=3), target), "dynamic:5,8,60")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(stop=""), "non-empty strings"),  # in every text: one token and an empty text came back
        (dict(stop=["\n", ""]), "non-empty strings"),
        (dict(stop=[2]), "non-empty strings"),  # a token id: stop tokens are EOS ids
        (dict(max_new_tokens=None), "whole number >= 1, got None"),
        (dict(max_new_tokens=2.5), "whole number >= 1, got 2.5"),  # three tokens came back
        (dict(temperature=None), "temperature must be a number >= 0"),  # a TypeError from '<'
        (dict(temperature=float("nan")), "temperature must be a number >= 0"),
        (dict(temperature=1.0, top_k=2.5), "top_k must be None, 0 .off. or a whole number"),  # failed inside topk
        (dict(top_p=1.5), r"top_p must be None or a number in \(0, 1\]"),  # checked before the prompt's forward
        (dict(temperature=1.0, seed="a"), "seed must be a whole number or None"),  # torch's manual_seed error
    ],
)
def test_unusable_request_settings_are_named(target, options, match):
    with pytest.raises(ValueError, match=match):
        _plain(target).generate(PROMPT, **{"max_new_tokens": 4, **options})


def test_no_eos_in_the_generation_config_runs_on_as_generate_does(target):
    """generate reads EOS from the generation config only: with none there, a tokenizer's EOS must not stop the
    loop early (that would cut the output short of generate's), and the user is told how to stop at it."""
    expected = SpeculativeGenerator(target, TinyTokenizer()).generate(PROMPT, max_new_tokens=8).token_ids
    tokenizer = TinyTokenizer()
    tokenizer.eos_token_id = expected[2]
    with pytest.warns(UserWarning, match="generation_config.eos_token_id is None"):
        result = SpeculativeGenerator(target, tokenizer).generate(PROMPT, max_new_tokens=8)
    assert result.token_ids == expected
    assert (
        result.token_ids == target.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False)[0, 7:].tolist()
    )
