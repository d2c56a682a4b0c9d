"""``masked_gqa_attention``: masked few-token CPU forwards run as grouped-query SDPA (no per-head copy of the KV
cache), with the same outputs as transformers' SDPA path, only inside the block; decoding stays token-identical."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specheads.decoding.tuning import cpu_attention
from specheads.decoding.tuning.cpu_attention import NAME, masked_gqa_attention
from specheads.decoding.tuning.cpu_kernels import CpuKernels


def count_grouped_calls(monkeypatch) -> list[bool]:
    """Whether each SDPA call was a masked grouped-query one (stock transformers asks for GQA only without a mask)."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("enable_gqa", False) and kwargs.get("attn_mask") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu_attention.F, "scaled_dot_product_attention", spy)
    return calls


def tree_step(model, prefix: int = 20, width: int = 4) -> torch.Tensor:
    """Logits of a ``width``-token masked forward (a two-branch tree) on top of a ``prefix``-token cache."""
    torch.manual_seed(1)
    ids = torch.randint(3, 128, (1, prefix + width))
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :prefix], cache=cache)
    mask = torch.ones(1, 1, width, prefix + width, dtype=torch.bool)
    mask[..., prefix:] = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    positions = torch.tensor([[prefix, prefix + 1, prefix + 1, prefix + 2]])
    return model(input_ids=ids[:, prefix:], attention_mask=mask, position_ids=positions, cache=cache).logits


@torch.no_grad()
def test_grouped_attention_gives_sdpa_outputs_inside_the_block_only(tiny_llama, monkeypatch):
    calls = count_grouped_calls(monkeypatch)
    stock = tree_step(tiny_llama)
    assert not any(calls)
    calls.clear()
    with masked_gqa_attention(tiny_llama):
        assert tiny_llama.config._attn_implementation == NAME
        grouped = tree_step(tiny_llama)
    assert calls.count(True) == tiny_llama.config.num_hidden_layers  # the tree step, one call per layer
    assert tiny_llama.config._attn_implementation == "sdpa"
    torch.testing.assert_close(grouped, stock, atol=1e-5, rtol=1e-5)


def test_overlapping_blocks_restore_sdpa_when_the_last_one_ends(tiny_llama):
    first, second = masked_gqa_attention(tiny_llama), masked_gqa_attention(tiny_llama)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert tiny_llama.config._attn_implementation == NAME
    second.__exit__(None, None, None)
    assert tiny_llama.config._attn_implementation == "sdpa"


def test_models_on_another_attention_implementation_are_left_alone(tiny_llama):
    from tests.tiny_models import tiny_family

    eager = tiny_family("llama")
    with masked_gqa_attention(eager, tiny_llama):
        assert eager.config._attn_implementation == "eager" and tiny_llama.config._attn_implementation == NAME


def chain_generator(model, kernels):
    """A speculative generator drafting 3-token chains with a one-layer draft model (greedy)."""
    from specheads.decoding.draft_model_drafter import DraftModelDrafter
    from specheads.decoding.generator import SpeculativeGenerator
    from specheads.heads import DraftModel
    from tests.decoding.helpers import TinyTokenizer

    draft = DraftModel.from_target(model, 1).eval()
    drafter = DraftModelDrafter(draft, draft_length=3, min_length=3, max_length=3)
    return SpeculativeGenerator(model, TinyTokenizer(), drafter, kernels=kernels)


PROMPT = [1, 5, 9, 3, 7, 11, 4]


@torch.no_grad()
def greedy_reference(model, new_tokens: int = 24) -> list[int]:
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
    return out[0, len(PROMPT) :].tolist()


def test_speculative_decoding_with_the_cpu_kernels_matches_generate(tiny_llama):
    """Greedy decoding with a 3-token chain verified under ``CpuKernels`` is the target's own ``generate``."""
    out = chain_generator(tiny_llama, CpuKernels(rows=range(2, 65))).generate(PROMPT, max_new_tokens=24)
    assert out.token_ids == greedy_reference(tiny_llama)
    assert tiny_llama.config._attn_implementation == "sdpa"


def test_a_generator_built_inside_the_kernels_block_verifies_trees(tiny_llama):
    """A script that switches the target first (``with CpuKernels()(model):``) then builds its generator is accepted:
    the grouped-query implementation applies the tree mask as SDPA does, and the output is still ``generate``'s."""
    expected = greedy_reference(tiny_llama)
    kernels = CpuKernels(rows=range(2, 65))
    with kernels(tiny_llama):
        assert tiny_llama.config._attn_implementation == NAME
        out = chain_generator(tiny_llama, kernels).generate(PROMPT, max_new_tokens=24)
    assert out.token_ids == expected
    assert tiny_llama.config._attn_implementation == "sdpa"


def test_applies_only_to_grouped_sdpa_models_on_cpu(tiny_llama):
    from specheads.decoding.tuning.cpu_attention import applies_to
    from tests.tiny_models import tiny_family

    assert applies_to(tiny_llama)
    assert not applies_to(tiny_family("llama"))  # eager attention
    assert not applies_to(tiny_family("llama", attn="sdpa", num_key_value_heads=4))  # one KV head per query head
