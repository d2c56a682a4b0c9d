"""Lossless sampling, end to end: sequences sampled by ``SpeculativeGenerator`` follow the target's distribution.

``test_accept.py`` proves the acceptance rule on hand-made distributions. This test runs the whole loop (drafting
with the drafter's own cache, one-forward tree verification, the acceptance walk, KV commit, truncation at
``max_new_tokens``) on a tiny random Llama with an 8-token vocabulary whose lm_head is scaled so that its
next-token distributions are far from uniform. The exact probability of every 2-token continuation is computed
from the target's conditionals (1 + 8 forwards), and the counts of N speculative samples are compared with a
chi-square goodness-of-fit test. A drafter that is merely plausible would fail: the drafters here are random,
so their q differs from the target's p and acceptance walks through both the accept and the residual branches.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specheads.decoding.draft_model_drafter import DraftModelDrafter
from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.lookup_branch import LookupBranchDrafter
from specheads.decoding.medusa_drafter import MedusaDrafter
from specheads.decoding.tree import DynamicTreeConfig, static_tree
from specheads.heads import DraftModel, EagleConfig, EagleHead, MedusaConfig, MedusaHeads
from tests.decoding.helpers import TinyTokenizer
from tests.tiny_models import make_tiny_llama

pytestmark = pytest.mark.slow  # minutes on tiny models: in make test, not make test-fast

VOCAB = 8
NEW_TOKENS = 2
SAMPLES = 1000
PROMPT = torch.tensor([1, 5, 2, 7, 3, 0, 6, 4, 2])  # every token of the vocabulary: prompt lookup always matches


@pytest.fixture(scope="module")
def peaked_target():
    target = make_tiny_llama(seed=3, vocab_size=VOCAB)
    target.generation_config.eos_token_id = None
    with torch.no_grad():
        target.lm_head.weight.mul_(6.0)  # entropy well below log(8): some tokens likely, some rare
    return target


WARPED = {"temperature": 0.7, "top_k": 5, "top_p": 0.9}
"""Sampling settings whose law is computed with transformers' own warpers (the reference, not specheads' code)."""


def exact_distribution(target, temperature=1.0, top_k=None, top_p=None) -> dict[tuple[int, ...], float]:
    """P(x1, x2 | PROMPT) from the target's conditionals, warped as transformers' generate warps them."""
    warp = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    warp += [TopKLogitsWarper(top_k)] if top_k else []
    warp += [TopPLogitsWarper(top_p)] if top_p else []
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(NEW_TOKENS):
        nxt = {}
        for prefix, mass in probs.items():
            ids = torch.cat([PROMPT, torch.tensor(prefix, dtype=torch.long)]).unsqueeze(0)
            with torch.no_grad():
                logits = target(input_ids=ids).logits[0, -1:].double()
                p = torch.softmax(warp(ids, logits)[0], dim=-1)
            for token in range(VOCAB):
                nxt[prefix + (token,)] = mass * float(p[token])
        probs = nxt
    return probs


def make_drafter(name: str, target):
    torch.manual_seed(1)
    if name == "eagle3-dynamic":
        return EagleTreeDrafter(EagleHead(EagleConfig(version=3), target).eval(), DynamicTreeConfig(3, 2, 5))
    if name == "eagle1-dynamic":
        return EagleTreeDrafter(EagleHead(EagleConfig(version=1), target).eval(), DynamicTreeConfig(2, 3, 6))
    if name == "medusa-tree":
        tree = static_tree([[0], [1], [2], [0, 0], [0, 1], [1, 0]])
        return MedusaDrafter(MedusaHeads(MedusaConfig(num_heads=2), target).eval(), tree)
    if name == "draft-model-chain":
        return DraftModelDrafter(DraftModel.from_target(target, 1).eval(), draft_length=3)
    if (
        name == "eagle3-dynamic+lookup"
    ):  # min_ngram=1 on a PROMPT holding every token: the branch fires almost every step
        return LookupBranchDrafter(make_drafter("eagle3-dynamic", target), num_tokens=2, min_ngram=1)
    if name == "eagle3-dynamic+lookup-solo":  # after "2 7" (a 2-gram of PROMPT) the chain alone, else the branch
        return LookupBranchDrafter(make_drafter("eagle3-dynamic", target), num_tokens=2, min_ngram=1, solo_ngram=2)
    raise KeyError(name)


def pooled_chisquare(counts: dict[tuple[int, ...], int], probs: dict[tuple[int, ...], float], n: int) -> float:
    """Chi-square p-value, pooling cells whose expected count is below 5 into one cell."""
    observed, expected, rare_obs, rare_exp = [], [], 0, 0.0
    for seq, p in probs.items():
        if p * n >= 5:
            observed.append(counts.get(seq, 0))
            expected.append(p * n)
        else:
            rare_obs += counts.get(seq, 0)
            rare_exp += p * n
    if rare_exp > 0:
        observed.append(rare_obs)
        expected.append(rare_exp)
    return float(chisquare(observed, expected).pvalue)


# The acceptance rules themselves are proven per tree shape in test_accept.py; here the whole loop runs for a
# dynamic tree (EAGLE-3, siblings drawn without replacement), the same tree with a prompt-lookup
# branch grafted on (fixed proposals after drawn siblings), a static Medusa tree (top-k proposals, point masses), a
# chain (draft model), and one of them under temperature, top-k and top-p together.
@pytest.mark.parametrize(
    ("name", "sampling"),
    [
        ("eagle3-dynamic", {}),
        ("eagle3-dynamic+lookup", {}),
        ("eagle3-dynamic+lookup-solo", {}),
        ("medusa-tree", {}),
        ("draft-model-chain", {}),
        ("eagle3-dynamic+lookup", WARPED),
    ],
)
def test_sampled_sequences_follow_the_target_distribution(peaked_target, name, sampling):
    probs = exact_distribution(peaked_target, **sampling)
    assert len(probs) == VOCAB**NEW_TOKENS and abs(sum(probs.values()) - 1) < 1e-9
    enough = 10 if sampling else 15  # top-k/top-p leave fewer possible sequences
    assert max(probs.values()) < 0.5 and sum(p * SAMPLES >= 5 for p in probs.values()) >= enough  # non-trivial
    generator = SpeculativeGenerator(peaked_target, TinyTokenizer(), make_drafter(name, peaked_target))
    counts: dict[tuple[int, ...], int] = {}
    attempts = accepts = 0
    for seed in range(SAMPLES):
        result = generator.generate(PROMPT, max_new_tokens=NEW_TOKENS, seed=seed, **{"temperature": 1.0, **sampling})
        seq = tuple(result.token_ids)
        assert len(seq) == NEW_TOKENS
        assert probs[seq] > 0, f"{name}: sampled {seq}, which the warped target never produces"
        counts[seq] = counts.get(seq, 0) + 1
        attempts += sum(result.stats.depth_attempts)
        accepts += sum(result.stats.depth_accepts)
    # both branches of the acceptance walk were exercised often: drafts accepted and drafts rejected
    assert accepts >= 100 and attempts - accepts >= 100, (accepts, attempts)
    p_value = pooled_chisquare(counts, probs, SAMPLES)
    assert p_value > 1e-3, f"{name}: sampled sequences do not follow the target distribution (p={p_value:.2e})"


def test_the_end_to_end_check_detects_a_biased_sampler(peaked_target):
    """The same statistic and sample size on draws from a slightly wrong law (T=0.7 instead of 1) must fail."""
    probs = exact_distribution(peaked_target)
    generator = SpeculativeGenerator(peaked_target, TinyTokenizer())  # plain sampling: only the law is wrong
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(SAMPLES):
        seq = tuple(generator.generate(PROMPT, max_new_tokens=NEW_TOKENS, temperature=0.7, seed=seed).token_ids)
        counts[seq] = counts.get(seq, 0) + 1
    assert pooled_chisquare(counts, probs, SAMPLES) < 1e-4
