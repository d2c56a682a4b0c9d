"""Generator contracts on a tiny random Llama: greedy output equals generate's with drafts accepted, stop conditions
(the context's end included), errors, and sampled generation on every drafter."""

from __future__ import annotations

import pytest
import torch

from specheads.decoding.draft import Sampling
from specheads.decoding.draft_model_drafter import DraftModelDrafter
from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.lookup_branch import LookupBranchDrafter
from specheads.decoding.medusa_drafter import MedusaDrafter
from specheads.decoding.prompt_lookup_drafter import PromptLookupDrafter
from specheads.decoding.tree import DynamicTreeConfig, static_tree
from specheads.heads import DraftModel, EagleConfig, EagleHead, MedusaConfig, MedusaHeads
from tests.decoding.helpers import TinyTokenizer
from tests.decoding.planted import PlantedDrafter, greedy_continuation
from tests.tiny_models import tiny_family, tiny_named

PROMPT = torch.tensor([3, 17, 42, 5, 17, 42, 9, 3, 17])


DRAFTERS = ["medusa", "eagle1", "eagle3", "eagle3-d2t", "draft_model", "lookup", "eagle3+lookup", "medusa+lookup"]
DRAFTERS += ["eagle1+lookup-solo", "draft_model+lookup-solo"]
CHAINS = ["draft_model", "lookup", "draft_model+lookup-solo"]  # every path is the first branch


@pytest.fixture
def tiny_llama(tiny_llama):
    """The tiny random Llama without an EOS token, so runs last exactly max_new_tokens unless a test sets one."""
    tiny_llama.generation_config.eos_token_id = None
    return tiny_llama


def tiny_drafters(target) -> dict[str, object]:
    torch.manual_seed(0)
    drafters = {
        "medusa": MedusaDrafter(
            MedusaHeads(MedusaConfig(num_heads=3), target).eval(),
            static_tree([[0], [1], [0, 0], [1, 0], [0, 0, 0], [1, 0, 0]]),
        ),
        "eagle1": EagleTreeDrafter(EagleHead(EagleConfig(version=1), target).eval(), DynamicTreeConfig(3, 3, 8)),
        "eagle3": EagleTreeDrafter(EagleHead(EagleConfig(version=3), target).eval(), DynamicTreeConfig(3, 2, 5)),
        "eagle3-d2t": EagleTreeDrafter(
            EagleHead(EagleConfig(version=3, draft_vocab_size=64), target, d2t=torch.arange(0, 128, 2)).eval(),
            DynamicTreeConfig(3, 2, 5),
        ),
        "draft_model": DraftModelDrafter(DraftModel.from_target(target, 1).eval(), draft_length=3),
        "lookup": PromptLookupDrafter(num_tokens=4),
    }
    for name in ("eagle3", "medusa"):  # the head's tree plus a lookup branch (min_ngram=1: it fires on PROMPT)
        drafters[f"{name}+lookup"] = LookupBranchDrafter(drafters[name], num_tokens=3, min_ngram=1)
    for name in ("eagle1", "draft_model"):  # 2-gram matches: the lookup chain alone, the head skips the step
        drafters[f"{name}+lookup-solo"] = LookupBranchDrafter(drafters[name], num_tokens=3, min_ngram=1, solo_ngram=2)
    return drafters


def assert_stats_add_up(stats, max_new_tokens: int) -> None:
    """One target forward per step plus the prefill; each step commits its accepted drafts and one more token, and
    only the last step can be cut short by max_new_tokens."""
    accepted = stats.accepted_lengths
    assert stats.target_forwards == 1 + len(accepted)
    assert stats.target_forwards - 1 + sum(accepted[:-1]) < max_new_tokens <= stats.target_forwards + sum(accepted)


@pytest.mark.parametrize("name", DRAFTERS)
def test_sampled_generation_is_valid_and_reproducible(tiny_llama, name):
    generator = SpeculativeGenerator(tiny_llama, TinyTokenizer(), tiny_drafters(tiny_llama)[name])
    first = generator.generate(PROMPT, max_new_tokens=20, temperature=1.0, seed=123)
    again = generator.generate(PROMPT, max_new_tokens=20, temperature=1.0, seed=123)
    assert len(first.token_ids) == 20 and all(0 <= t < 128 for t in first.token_ids)
    assert first.token_ids == again.token_ids
    assert first.stats.acceptance == "speculative" and not first.stats.lossy
    assert first.stats.new_tokens == 20
    assert_stats_add_up(first.stats, 20)
    other = generator.generate(PROMPT, max_new_tokens=20, temperature=1.0, seed=7)
    assert other.token_ids != first.token_ids  # 20 tokens from a ~uniform 128-way model: a clash is ~impossible


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_matches_generate_on_tiny(tiny_llama, name):
    """Greedy output is the target's generate(do_sample=False), token for token: with the random drafter alone
    (which gets few drafts accepted, often none) and with the target's own continuation planted in its tree on
    every other step, so whole paths are accepted, off the first branch wherever the tree branches."""
    expected = greedy_continuation(tiny_llama, PROMPT, 24 + 4)
    drafter = tiny_drafters(tiny_llama)[name]
    alone = SpeculativeGenerator(tiny_llama, TinyTokenizer(), drafter).generate(PROMPT, max_new_tokens=24)
    assert alone.token_ids == expected[:24]
    assert_stats_add_up(alone.stats, 24)
    planted = PlantedDrafter(drafter, expected)
    ours = SpeculativeGenerator(tiny_llama, TinyTokenizer(), planted).generate(PROMPT, max_new_tokens=24)
    assert ours.token_ids == expected[:24] and ours.stats.new_tokens == 24
    assert_stats_add_up(ours.stats, 24)
    (state,) = planted.states
    assert len(state.planted) == len(ours.stats.accepted_lengths) and sum(state.planted) > 0
    assert all(accepted >= depth for accepted, depth in zip(ours.stats.accepted_lengths, state.planted))
    if name not in CHAINS:
        assert not all(state.first_branch)


def test_typical_acceptance_is_labelled_lossy(tiny_llama):
    drafter = tiny_drafters(tiny_llama)["medusa"]
    generator = SpeculativeGenerator(tiny_llama, TinyTokenizer(), drafter, acceptance="typical")
    result = generator.generate(PROMPT, max_new_tokens=8, temperature=0.7, seed=0)
    assert result.stats.lossy and result.stats.acceptance == "typical" and len(result.token_ids) == 8
    assert "LOSSY" in result.stats.summary()


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 13])
def test_never_more_than_max_new_tokens(tiny_llama, max_new_tokens):
    generator = SpeculativeGenerator(tiny_llama, TinyTokenizer(), PromptLookupDrafter(num_tokens=8))
    repetitive = torch.tensor([4, 5, 6, 7] * 6)
    result = generator.generate(repetitive, max_new_tokens=max_new_tokens)
    assert len(result.token_ids) == max_new_tokens and result.stats.stop_reason == "max_new_tokens"


def test_stops_at_eos_and_keeps_it(tiny_llama):
    plain = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(PROMPT, max_new_tokens=12).token_ids
    eos = plain[5]
    tiny_llama.generation_config.eos_token_id = eos  # where generate reads it
    result = SpeculativeGenerator(tiny_llama, TinyTokenizer(), PromptLookupDrafter()).generate(
        PROMPT, max_new_tokens=12
    )
    assert result.token_ids == plain[: plain.index(eos) + 1] and result.stats.stop_reason == "eos"


def test_stop_string_cuts_text_and_tokens(tiny_llama):
    plain = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(PROMPT, max_new_tokens=12)
    stop = f" w{plain.token_ids[3]}"
    streamed = []
    result = SpeculativeGenerator(tiny_llama, TinyTokenizer(), tiny_drafters(tiny_llama)["eagle1"]).generate(
        PROMPT, max_new_tokens=12, stop=[stop], stream=streamed.append
    )
    first = plain.text.index(stop) + len(stop)
    assert result.text == plain.text[:first] and result.stats.stop_reason == "stop_string"
    assert "".join(streamed) == result.text
    assert result.token_ids == plain.token_ids[: len(result.token_ids)] and len(result.token_ids) <= 4


def test_prompt_errors(tiny_llama):
    generator = SpeculativeGenerator(tiny_llama, TinyTokenizer())
    with pytest.raises(ValueError, match="empty"):
        generator.generate("", max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        generator.generate(torch.tensor([], dtype=torch.long), max_new_tokens=4)
    with pytest.raises(ValueError, match="batch"):
        generator.generate(torch.ones(2, 5, dtype=torch.long), max_new_tokens=4)
    with pytest.raises(ValueError, match="the prompt has 513 tokens but the target's context is 512 tokens"):
        generator.generate(torch.ones(513, dtype=torch.long), max_new_tokens=4)  # tiny context: 512 positions
    with pytest.raises(ValueError, match="acceptance"):
        SpeculativeGenerator(tiny_llama, TinyTokenizer(), acceptance="nope")


def test_generation_stops_when_context_is_full(tiny_llama):
    result = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(torch.ones(508, dtype=torch.long), 50)
    assert result.stats.stop_reason == "context_full" and len(result.token_ids) <= 5
    full = torch.ones(512, dtype=torch.long)  # the whole context: its last logits still give one token, as generate's
    result = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(full, 4)
    expected = tiny_llama.generate(full[None], max_new_tokens=1, do_sample=False)[0, 512:].tolist()
    assert result.token_ids == expected and result.stats.stop_reason == "context_full"


@pytest.mark.parametrize("name", ["eagle1", "medusa", "draft_model", "lookup"])
def test_drafting_uses_every_position_of_the_context(tiny_llama, name):
    """Near the end of the context a tree that does not fit is cut to the root: every drafter stops exactly where
    plain decoding does, after the last position (512 here) is used, and with the same tokens."""
    prompt = torch.randint(0, 128, (495,), generator=torch.Generator().manual_seed(1))
    plain = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(prompt, max_new_tokens=40)
    # positions 495..511 take the first 17 new tokens, the 18th comes from the last position's logits
    assert len(plain.token_ids) == 512 - 495 + 1 and plain.stats.stop_reason == "context_full"
    drafter = tiny_drafters(tiny_llama)[name]
    ours = SpeculativeGenerator(tiny_llama, TinyTokenizer(), drafter).generate(prompt, max_new_tokens=40)
    assert ours.token_ids == plain.token_ids and ours.stats.stop_reason == "context_full"


def test_an_accepting_drafter_stops_at_the_last_position_of_the_context(tiny_llama):
    """A draft model that is the whole target gets every draft accepted, so the steps land where this test says:
    from a 497-token prompt its 3-token chains commit 4 tokens at 497, 501 and 505; at 509 the chain's last node
    would sit at position 512, past the 512-position context, so that step and the next two verify the root alone,
    and decoding stops after position 511 with generate's tokens."""
    prompt = torch.randint(0, 128, (497,), generator=torch.Generator().manual_seed(1))
    expected = greedy_continuation(tiny_llama, prompt, 512 - 497 + 1)  # the last one from position 511's logits
    whole_target = DraftModel.from_target(tiny_llama, tiny_llama.config.num_hidden_layers).eval()
    perfect = DraftModelDrafter(whole_target, draft_length=3, min_length=3, max_length=3)
    ours = SpeculativeGenerator(tiny_llama, TinyTokenizer(), perfect).generate(prompt, max_new_tokens=40)
    assert ours.token_ids == expected and ours.stats.stop_reason == "context_full"
    assert ours.stats.accepted_lengths == [3, 3, 3, 0, 0, 0]


@pytest.mark.parametrize("family", ["gpt2", "opt", "gpt_bigcode"])
def test_a_draft_model_with_learned_positions_stops_at_the_end_of_the_context(family):
    """GPT-2, OPT and GPTBigCode embed positions from a table of max_position_embeddings rows: a draft model of
    theirs must not feed a token past it (an IndexError before), and must not draft at all once the root has no
    position left, even for a prompt that fills the whole context (which still yields one token)."""
    target = tiny_named(family, attn="sdpa")
    target.generation_config.eos_token_id = None
    context = target.config.max_position_embeddings
    for length in (context - 10, context):
        prompt = torch.randint(0, 128, (length,), generator=torch.Generator().manual_seed(1))
        plain = SpeculativeGenerator(target, TinyTokenizer()).generate(prompt, max_new_tokens=40)
        drafter = DraftModelDrafter(DraftModel.from_target(target, 1).eval(), draft_length=4)
        ours = SpeculativeGenerator(target, TinyTokenizer(), drafter).generate(prompt, max_new_tokens=40)
        assert ours.token_ids == plain.token_ids and len(plain.token_ids) == context - length + 1
        assert ours.stats.stop_reason == plain.stats.stop_reason == "context_full"


def test_a_draft_model_with_a_shorter_context_than_the_target_shortens_its_chains_there(tiny_llama):
    """A draft model made for 490 positions beside a 512-position target: its chain is cut where it would pass its
    own last position (the root at 488 leaves room for 2 tokens), then it drafts nothing, and every token is still
    the target's. The whole target as draft model gets every draft accepted, so the lengths show the cut."""
    prompt = torch.randint(0, 128, (480,), generator=torch.Generator().manual_seed(1))
    expected = greedy_continuation(tiny_llama, prompt, 512 - 480 + 1)
    whole_target = DraftModel.from_target(tiny_llama, tiny_llama.config.num_hidden_layers).eval()
    whole_target.model.config.max_position_embeddings = 490
    perfect = DraftModelDrafter(whole_target, draft_length=3, min_length=3, max_length=3)
    ours = SpeculativeGenerator(tiny_llama, TinyTokenizer(), perfect).generate(prompt, max_new_tokens=40)
    assert ours.token_ids == expected and ours.stats.stop_reason == "context_full"
    assert ours.stats.accepted_lengths == [3, 3, 2] + [0] * 21  # roots at 480, 484, 488; then 491..511 alone


def test_greedy_acceptance_refuses_sampling_and_typical_honours_top_k(tiny_llama):
    drafter = tiny_drafters(tiny_llama)["medusa"]
    with pytest.raises(ValueError, match="acceptance='greedy' keeps the target's argmax"):
        SpeculativeGenerator(tiny_llama, TinyTokenizer(), drafter, acceptance="greedy").generate(
            PROMPT, max_new_tokens=4, temperature=0.8
        )
    plain = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(PROMPT, max_new_tokens=16)
    typical = SpeculativeGenerator(tiny_llama, TinyTokenizer(), drafter, acceptance="typical")
    for seed in range(3):  # top_k=1 leaves the argmax alone: typical acceptance must then decode greedily
        result = typical.generate(PROMPT, max_new_tokens=16, temperature=1.0, top_k=1, seed=seed)
        assert result.token_ids == plain.token_ids


def test_a_stop_string_longer_than_64_tokens_stops(tiny_llama):
    """Stop strings were looked for in the last 64 tokens' text only: one spanning more never fired."""
    plain = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(PROMPT, max_new_tokens=100)
    stop = TinyTokenizer().decode(plain.token_ids[10:80])  # 70 tokens
    result = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(PROMPT, max_new_tokens=100, stop=stop)
    assert result.stats.stop_reason == "stop_string" and result.token_ids == plain.token_ids[:80]


def test_a_stop_string_is_looked_for_in_the_text_returned_without_special_tokens(tiny_llama):
    """The check read the tail with special tokens, the returned text without: a stop string that the returned text
    holds across a special token never fired."""
    plain = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(PROMPT, max_new_tokens=12).token_ids
    special = plain[3]

    class SpecialTokenizer(TinyTokenizer):
        def decode(self, ids, skip_special_tokens: bool = False) -> str:
            return super().decode([i for i in ids if not (skip_special_tokens and int(i) == special)])

    tokenizer = SpecialTokenizer()
    seen = tokenizer.decode(plain, skip_special_tokens=True)
    assert special not in (plain[2], plain[4])  # so the stop string spans the special token
    stop = f" w{plain[2]} w{plain[4]}"
    result = SpeculativeGenerator(tiny_llama, tokenizer).generate(PROMPT, max_new_tokens=12, stop=stop)
    first = seen.index(stop) + len(stop)
    assert result.stats.stop_reason == "stop_string" and result.text == seen[:first]
    assert result.token_ids == plain[: len(result.token_ids)] and len(result.token_ids) <= 5


def test_a_stop_string_given_alone_is_one_string(tiny_llama):
    plain = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(PROMPT, max_new_tokens=12)
    stop = f" w{plain.token_ids[6]}"
    alone = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(PROMPT, max_new_tokens=12, stop=stop)
    listed = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(PROMPT, max_new_tokens=12, stop=[stop])
    assert alone.token_ids == listed.token_ids and alone.stats.stop_reason == "stop_string"
    assert len(listed.token_ids) > 1  # read letter by letter, " w..." would stop at the first token's space
    unset = SpeculativeGenerator(tiny_llama, TinyTokenizer()).generate(PROMPT, max_new_tokens=12, stop=None)
    assert unset.token_ids == plain.token_ids and unset.stats.stop_reason == "max_new_tokens"


SLIDING_TARGETS = {  # window 16; every layer sliding (Mistral), or sliding and full layers mixed
    "mistral": dict(sliding_window=16),
    "qwen2": dict(use_sliding_window=True, sliding_window=16, max_window_layers=1),
    "gemma2": dict(sliding_window=16, head_dim=16, query_pre_attn_scalar=16, attn_logit_softcapping=50.0),
    "gemma3_text": dict(sliding_window=16, head_dim=16, layer_types=["sliding_attention", "full_attention"] * 2),
}


def sliding_target(model_type: str):
    target = tiny_family(model_type, max_position_embeddings=512, **SLIDING_TARGETS[model_type])
    target.generation_config.eos_token_id = None
    return target


def record_cache_sizes(target) -> list[tuple[int, list[int], list[int]]]:
    """Before each target forward on a cache: (position, keys held by each sliding layer, by each full one)."""
    sizes: list[tuple[int, list[int], list[int]]] = []

    def before(module, args, kwargs):
        if kwargs.get("cache") is None:  # a forward from scratch (the generator's exactness probe)
            return
        layers = [layer for layer in kwargs["cache"].layers if layer.is_initialized]
        sliding = [layer.keys.shape[-2] for layer in layers if getattr(layer, "is_sliding", False)]
        full = [layer.keys.shape[-2] for layer in layers if not getattr(layer, "is_sliding", False)]
        sizes.append((kwargs["cache"].get_seq_length(), sliding, full))

    target.register_forward_pre_hook(before, with_kwargs=True)
    return sizes


@pytest.mark.parametrize("model_type", list(SLIDING_TARGETS))
def test_sliding_window_targets_decode_past_the_window_exactly_as_generate(model_type):
    """A target whose sliding layers see only the last W positions, on a request three windows long: the sliding
    layers record their past while a tree is verified and are trimmed back to the last W-1 committed keys after
    each commit, so their memory stays bounded, and get a windowed tree mask over just those keys; every drafter's
    greedy output is the target's own, with drafts accepted."""
    from specheads.decoding.verify import attention_layout

    target = sliding_target(model_type)
    layout = attention_layout(target)
    assert (
        layout.window == 16
        and layout.layer_types == ((), ("full_attention", "sliding_attention"))[model_type != "mistral"]
    )
    prompt = torch.tensor([3, 17, 42, 5, 17, 42, 9, 3, 17, 42, 5, 17])  # 12 tokens + 36 new: 48 = 3 windows
    expected = greedy_continuation(target, prompt, 36)
    drafters = tiny_drafters(target)
    sizes = record_cache_sizes(target)
    for name in ("medusa", "eagle3", "draft_model", "lookup", "eagle3+lookup"):
        planted = PlantedDrafter(drafters[name], expected)
        result = SpeculativeGenerator(target, TinyTokenizer(), planted).generate(prompt, max_new_tokens=36)
        assert result.token_ids == expected, name
        if name != "lookup":  # (no n-gram match, no tree to plant in)
            assert result.stats.target_forwards < 30, name  # planted paths were accepted past the window too
    verifies = [(position, sliding, full) for position, sliding, full in sizes if position]  # not the prompt's
    assert verifies and all(max(sliding) <= 15 and set(full) <= {position} for position, sliding, full in verifies)
    assert max(position for position, _, _ in verifies) >= 40 and {15} == {
        size for position, sliding, _ in verifies if position >= 15 for size in sliding
    }  # past the window every sliding layer holds exactly W-1 keys, wherever the sequence is
    assert (model_type == "mistral") == all(not full for _, _, full in verifies)  # mixed: full layers hold all
    plain = SpeculativeGenerator(target, TinyTokenizer()).generate(prompt, max_new_tokens=36)
    assert plain.token_ids == expected
    sampled = SpeculativeGenerator(target, TinyTokenizer(), drafters["eagle3"], acceptance="speculative")
    assert len(sampled.generate(prompt, max_new_tokens=36, temperature=1.0, seed=0).token_ids) == 36
    long_prompt = prompt.repeat(2)  # 24 tokens: the prompt alone is past the window (the prefill's own mask)
    expected = greedy_continuation(target, long_prompt, 24)
    planted = PlantedDrafter(drafters["eagle3"], expected)
    assert SpeculativeGenerator(target, TinyTokenizer(), planted).generate(long_prompt, 24).token_ids == expected


def test_sliding_layers_with_different_windows_are_refused(monkeypatch):
    """One sliding mask serves every sliding layer, so a target whose sliding layers have different windows (none in
    transformers 5.24 does; the cache allows it) is refused when the generator is built."""
    from transformers import DynamicCache

    from specheads.heads import tree_layers

    target = sliding_target("mistral")

    def two_windows(config):
        cache = DynamicCache(config=config)
        cache.layers[0].sliding_window = 8
        return cache

    monkeypatch.setattr(tree_layers, "DynamicCache", two_windows)  # the one home of the capability check
    with pytest.raises(ValueError, match=r"different windows \(\[8, 16\]\).*one window"):
        SpeculativeGenerator(target, TinyTokenizer())


def test_the_window_is_what_makes_sliding_targets_exact(monkeypatch):
    """The same request with the sliding layers' mask hiding nothing of the W-1 keys they hold (a node d deep then
    sees d keys past its window) decodes other tokens: the test above would catch a mask that ignored the window."""
    from specheads.decoding import verify

    target = sliding_target("mistral")
    prompt = torch.tensor([3, 17, 42, 5, 17, 42, 9, 3, 17, 42, 5, 17])
    expected = greedy_continuation(target, prompt, 36)
    generator = SpeculativeGenerator(target, TinyTokenizer(), tiny_drafters(target)["medusa"])
    unwindowed = lambda mask, positions, prefix_len, window, start=0: mask[..., start:]  # noqa: E731
    monkeypatch.setattr(verify, "windowed", unwindowed)  # a deliberately wrong mask, for this check only
    assert generator.generate(prompt, max_new_tokens=36).token_ids != expected


@pytest.mark.parametrize("name", ["eagle1", "eagle3-d2t", "draft_model"])
def test_sampled_trees_carry_the_q_their_children_came_from(tiny_llama, name):
    """Every child must be a token its parent's q row could have drawn; q rows are distributions over the target
    vocabulary, and greedy trees carry no q at all."""
    drafter = tiny_drafters(tiny_llama)[name]
    out = tiny_llama(input_ids=PROMPT.unsqueeze(0), output_hidden_states=drafter.layer_ids or None)
    hidden = out.hidden_states if drafter.layer_ids else None
    generator = torch.Generator().manual_seed(0)
    state = drafter.begin(PROMPT, hidden, 11, Sampling(temperature=1.0), generator)
    tree = drafter.propose(state)
    assert tree.draft_probs.shape == (tree.num_nodes, 128)
    parents = tree.parents[1:]
    assert (tree.draft_probs[parents, tree.tokens[1:]] > 0).all()
    torch.testing.assert_close(tree.draft_probs[parents].sum(-1), torch.ones(parents.numel()))
    greedy_state = drafter.begin(PROMPT, hidden, 11, Sampling(), None)
    assert drafter.propose(greedy_state).draft_probs is None


def test_the_prompt_forward_counts_as_target_time_and_the_drafter_start_as_drafting(tiny_llama):
    """The time split books every target forward as verify, the prefill included, as the benchmark does for
    transformers' methods (one token: the prefill is the only forward); the drafter's start on the prompt is
    drafting, not bookkeeping."""
    one = SpeculativeGenerator(tiny_llama, TinyTokenizer(), tiny_drafters(tiny_llama)["eagle1"]).generate(
        PROMPT, max_new_tokens=1
    )
    assert one.stats.target_forwards == 1 and one.stats.verify_s > 0 and one.stats.draft_s > 0
