"""Accept rules: rigged-logit edge cases, and statistical proof that speculative sampling is lossless.

The statistical tests draw drafts from a known q, run the accept rule many times and compare the first two
committed tokens with the target's exact two-token distribution (chi-square and total variation). Two
deliberately wrong rules, written here and not in the library, must fail the same test: it has power.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from specheads.decoding.accept import (
    LOSSY_ACCEPTANCE,
    AcceptResult,
    accept_greedy,
    accept_speculative,
    accept_typical,
    warp_logits_to_probs,
)

V = 5
# Target: P0 is the distribution of the first token after the root, P1[a] that of the second given the first a.
# So the exact two-token target distribution is P0[a] * P1[a, b].
P0 = torch.tensor([0.05, 0.40, 0.25, 0.20, 0.10])
P1 = torch.tensor(
    [
        [0.10, 0.20, 0.30, 0.40, 0.00],
        [0.50, 0.05, 0.05, 0.20, 0.20],
        [0.00, 0.60, 0.10, 0.10, 0.20],
        [0.25, 0.25, 0.25, 0.25, 0.00],
        [0.10, 0.10, 0.10, 0.10, 0.60],
    ]
)
# Draft: deliberately far from the target (Q0 favours what P0 dislikes; Q1[3] misses a token P1[3] likes).
Q0 = torch.tensor([0.40, 0.05, 0.10, 0.15, 0.30])
Q1 = torch.tensor(
    [
        [0.60, 0.10, 0.10, 0.10, 0.10],
        [0.05, 0.50, 0.05, 0.10, 0.30],
        [0.20, 0.20, 0.20, 0.20, 0.20],
        [0.00, 0.10, 0.10, 0.10, 0.70],
        [0.30, 0.30, 0.20, 0.10, 0.10],
    ]
)
UNIFORM = torch.full((V,), 1 / V)  # rows for depth-2 nodes: they never decide the first two tokens
TARGET_PAIRS = (P0[:, None] * P1).flatten()  # (V * V,) exact P(first = a, second = b) at index a * V + b
N_TRIALS = 10_000  # empirical total variation of the pairs from the exact target: mean 0.016, 99.99% < 0.03
N_TRIALS_WRONG = 2_000  # fewer trials make rejecting a wrong rule harder, so this proves more power
AcceptFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Generator], AcceptResult]


@dataclass(frozen=True)
class Scenario:
    """A tree shape; the draft tokens are drawn per trial from Q0 / Q1 (or fixed when `fixed_tokens` is set)."""

    parents: list[int]
    fixed_tokens: list[int] | None = None  # deterministic proposals: draft_probs=None
    grafted: tuple[tuple[int, int], ...] = ()  # (node, token): fixed proposals among drawn siblings (lookup branch)

    def depths(self) -> list[int]:
        depth = [0] * len(self.parents)
        for node, parent in enumerate(self.parents[1:], 1):
            depth[node] = depth[parent] + 1
        return depth


CHAIN = Scenario(parents=[-1, 0, 1])
# Root: 3 siblings drawn without replacement from Q0; first sibling: 2 children; second: 1; third: none.
TREE = Scenario(parents=[-1, 0, 0, 0, 1, 1, 2])
# Fixed proposals (e.g. top-k of Medusa heads), including tokens the target gives zero mass (P1[2, 0] = 0).
FIXED = Scenario(parents=[-1, 0, 0, 0, 1, 1, 2], fixed_tokens=[0, 2, 4, 0, 0, 1, 4])
# A lookup branch grafted onto a sampled tree: after the root's 2 drawn children, a fixed child (token 1, which
# the draws may also have produced) with a fixed child of its own (token 0); the drawn nodes keep their q rows.
# Both grafted tokens are ones q rarely draws, so judging them as draws (min(1, p/q)) would over-accept them.
GRAFTED = Scenario(parents=[-1, 0, 0, 1, 0, 4], grafted=((4, 1), (5, 0)))


def _rows(depth: int, token: torch.Tensor, first: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """(N, V) rows for a node: `first` at the root, `rest[token]` at depth 1, uniform deeper."""
    if depth == 0:
        return first.expand(token.shape[0], V)
    if depth == 1:
        return rest[token]
    return UNIFORM.expand(token.shape[0], V)


def _draw_trees(scenario: Scenario, n_trials: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Tokens (N, n), target_probs (N, n, V) and draft_probs (N, n, V) for every trial. Each node's children are
    drawn from its q row without replacement, in sibling order, by Gumbel-top-k."""
    depth, n = scenario.depths(), len(scenario.parents)
    tokens = torch.zeros(n_trials, n, dtype=torch.long)
    if scenario.fixed_tokens is not None:
        tokens[:] = torch.tensor(scenario.fixed_tokens)
    draft = torch.zeros(n_trials, n, V)
    grafted = dict(scenario.grafted)
    for node, token in grafted.items():
        tokens[:, node] = token
    for node in range(n):
        draft[:, node] = _rows(depth[node], tokens[:, node], Q0, Q1)
        children = [c for c, parent in enumerate(scenario.parents) if parent == node and c not in grafted]
        if children and scenario.fixed_tokens is None:
            gumbel = -torch.log(-torch.log(torch.rand(n_trials, V, generator=gen).clamp_min(1e-12)))
            order = torch.topk(draft[:, node].log() + gumbel, len(children), dim=-1).indices  # (N, k)
            tokens[:, children] = order
    target = torch.stack([_rows(depth[i], tokens[:, i], P0, P1) for i in range(n)], dim=1)  # (N, n, V)
    return tokens, target, draft


def _first_two_tokens(accept: AcceptFn, scenario: Scenario, n_trials: int, seed: int) -> torch.Tensor:
    """(N,) index a * V + b of the first two committed tokens; when a step commits only one token, the second
    is drawn from the target's conditional P1[a], as the next decode step would."""
    gen = torch.Generator().manual_seed(seed)
    tokens, target, draft = _draw_trees(scenario, n_trials, gen)
    parents = torch.tensor(scenario.parents)
    drafts = [None] * n_trials if scenario.fixed_tokens is not None else draft.unbind(0)
    fixed = torch.zeros(len(scenario.parents), dtype=torch.bool)
    fixed[[node for node, _ in scenario.grafted]] = True
    extra = {"fixed": fixed} if scenario.grafted else {}
    first, second = [], []
    for tokens_t, target_t, draft_t, token_list in zip(tokens.unbind(0), target.unbind(0), drafts, tokens.tolist()):
        result = accept(tokens_t, parents, target_t, draft_t, gen, **extra)
        committed = [*(token_list[node] for node in result.path[1:]), result.next_token]
        first.append(committed[0])
        second.append(committed[1] if len(committed) > 1 else -1)
    first, second = torch.tensor(first), torch.tensor(second)
    missing = second < 0
    second[missing] = torch.multinomial(P1[first[missing]], 1, generator=gen).squeeze(-1)
    return first * V + second


def _compare_with_target(pairs: torch.Tensor) -> tuple[float, float, float]:
    """(chi-square p-value of the pairs, of the first token, total variation of the pairs) against the target.
    A pair the target gives zero probability is impossible under it: its p-value is then 0."""
    n_trials = pairs.shape[0]
    observed = torch.bincount(pairs, minlength=V * V).double()
    target = TARGET_PAIRS.double() / TARGET_PAIRS.double().sum()
    total_variation = 0.5 * (observed / n_trials - target).abs().sum().item()
    support = target > 0
    if observed[~support].sum() > 0:
        return 0.0, 0.0, total_variation
    pair_p = chisquare(observed[support].numpy(), (target[support] * n_trials).numpy()).pvalue
    first_observed = observed.view(V, V).sum(dim=1)
    first_p = chisquare(first_observed.numpy(), (target.view(V, V).sum(dim=1) * n_trials).numpy()).pvalue
    return float(pair_p), float(first_p), total_variation


# ---------------------------------------------------------------------------------------------------------------
# Wrong rules (test-only): the statistical test must reject them.


def _wrong_walk(accept_probability: Callable, residual: Callable, without_replacement: bool = True) -> AcceptFn:
    """A tree walk like accept_speculative's, with a pluggable (wrong) acceptance probability and residual."""

    def accept(tokens, parents, target_probs, draft_probs, generator) -> AcceptResult:
        parent_list, token_list = parents.tolist(), tokens.tolist()
        path, p, q = [0], target_probs[0], draft_probs[0]
        while True:
            for child in [c for c, parent in enumerate(parent_list) if parent == path[-1]]:
                x = token_list[child]
                if torch.rand((), generator=generator).item() < accept_probability(p[x].item(), q[x].item()):
                    path.append(child)
                    break
                p = residual(p, q)
                if without_replacement:
                    q = q.clone()
                    q[x] = 0
                    q = q / q.sum()
            else:
                return AcceptResult(path, int(torch.multinomial(p, 1, generator=generator).item()))
            p, q = target_probs[path[-1]], draft_probs[path[-1]]

    return accept


def _min_one_ratio(p_x: float, q_x: float) -> float:
    return min(1.0, p_x / q_x)


def _true_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return torch.clamp(p - q, min=0) / torch.clamp(p - q, min=0).sum()


accept_only_if_p_at_least_q = _wrong_walk(lambda p_x, q_x: float(p_x >= q_x), _true_residual)
resample_from_softmax_of_difference = _wrong_walk(_min_one_ratio, lambda p, q: torch.softmax(p - q, dim=-1))
forget_siblings_were_drawn_without_replacement = _wrong_walk(_min_one_ratio, _true_residual, without_replacement=False)


# ---------------------------------------------------------------------------------------------------------------
# Lossless: statistical tests.


@pytest.mark.parametrize(
    "scenario", [CHAIN, TREE, FIXED, GRAFTED], ids=["chain", "tree-without-replacement", "fixed", "grafted-lookup"]
)
def test_speculative_sampling_reproduces_target_distribution(scenario: Scenario) -> None:
    pairs = _first_two_tokens(accept_speculative, scenario, N_TRIALS, seed=0)
    pair_p, first_p, total_variation = _compare_with_target(pairs)
    assert pair_p > 1e-3, f"two-token distribution differs from the target (chi-square p={pair_p:.2e})"
    assert first_p > 1e-3, f"first-token distribution differs from the target (chi-square p={first_p:.2e})"
    assert total_variation < 0.03, f"total variation {total_variation:.4f} from the target"


@pytest.mark.parametrize(
    "scenario,wrong_rule",
    [
        (CHAIN, accept_only_if_p_at_least_q),
        (CHAIN, resample_from_softmax_of_difference),
        (TREE, accept_only_if_p_at_least_q),
        (TREE, resample_from_softmax_of_difference),
        (TREE, forget_siblings_were_drawn_without_replacement),
    ],
    ids=["chain-p>=q", "chain-softmax(p-q)", "tree-p>=q", "tree-softmax(p-q)", "tree-q-not-updated"],
)
def test_statistical_test_rejects_wrong_rules(scenario: Scenario, wrong_rule: AcceptFn) -> None:
    pairs = _first_two_tokens(wrong_rule, scenario, N_TRIALS_WRONG, seed=0)
    pair_p, _, total_variation = _compare_with_target(pairs)
    assert pair_p < 1e-6, f"the test cannot tell a wrong rule from the target (p={pair_p:.2e}, tv={total_variation})"


def test_statistical_test_rejects_grafted_nodes_judged_as_draws() -> None:
    """Without ``fixed``, a grafted token that q can draw is judged by min(1, p/q) as if it had been drawn."""

    def ignore_fixed(tokens, parents, target_probs, draft_probs, generator, fixed):
        return accept_speculative(tokens, parents, target_probs, draft_probs, generator)

    pairs = _first_two_tokens(ignore_fixed, GRAFTED, N_TRIALS_WRONG, seed=0)
    pair_p, _, total_variation = _compare_with_target(pairs)
    assert pair_p < 1e-6, f"the test cannot tell a wrong rule from the target (p={pair_p:.2e}, tv={total_variation})"


# ---------------------------------------------------------------------------------------------------------------
# Lossless: rigged edge cases.


def test_speculative_never_accepts_a_token_the_target_rules_out() -> None:
    tokens, parents = torch.tensor([0, 1, 2]), torch.tensor([-1, 0, 0])
    target = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.25] * 4, [0.25] * 4])  # p(1) = p(2) = 0
    draft = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4, [0.25] * 4])
    gen = torch.Generator().manual_seed(0)
    for draft_probs in (draft, None):
        for _ in range(200):
            assert accept_speculative(tokens, parents, target, draft_probs, gen) == AcceptResult([0], 3)


def test_speculative_accepts_every_token_when_draft_equals_target() -> None:
    tokens, parents = torch.tensor([0, 2, 1, 3]), torch.tensor([-1, 0, 1, 2])
    probs = torch.softmax(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)), dim=-1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(100):
        assert accept_speculative(tokens, parents, probs, probs, gen).path == [0, 1, 2, 3]


def test_speculative_treats_a_zero_q_token_as_a_fixed_proposal() -> None:
    """min(1, p/q) with q(x) = 0 would always accept x; as a point mass it is accepted with probability p(x)."""
    tokens, parents = torch.tensor([0, 1]), torch.tensor([-1, 0])
    target = torch.tensor([[0.7, 0.3, 0.0], [1 / 3] * 3])
    draft = torch.tensor([[0.5, 0.0, 0.5], [1 / 3] * 3])  # q(1) = 0, yet token 1 was proposed
    gen = torch.Generator().manual_seed(0)
    results = [accept_speculative(tokens, parents, target, draft, gen) for _ in range(2000)]
    accepted = sum(len(r.path) == 2 for r in results) / len(results)
    assert abs(accepted - 0.3) < 0.04
    assert all(r.next_token == 0 for r in results if len(r.path) == 1), "after rejecting 1, only 0 is left"


def test_speculative_keeps_p_when_the_residual_has_no_mass() -> None:
    """q >= p everywhere (here q is not normalised) leaves max(0, p - q) = 0; no division by zero follows."""
    tokens, parents = torch.tensor([0, 0]), torch.tensor([-1, 0])
    target = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    draft = torch.tensor([[0.9, 0.5], [0.5, 0.5]])
    gen = torch.Generator().manual_seed(0)
    results = [accept_speculative(tokens, parents, target, draft, gen) for _ in range(300)]
    assert any(len(r.path) == 1 for r in results)
    assert {r.next_token for r in results} <= {0, 1}


def test_speculative_is_reproducible_with_a_seeded_generator() -> None:
    tokens, parents = torch.tensor([0, 1, 2, 3]), torch.tensor([-1, 0, 0, 1])
    probs = torch.softmax(torch.randn(4, 5, generator=torch.Generator().manual_seed(0)), dim=-1)
    run = [
        [accept_speculative(tokens, parents, probs, None, gen) for _ in range(20)]
        for gen in (torch.Generator().manual_seed(7), torch.Generator().manual_seed(7))
    ]
    assert run[0] == run[1]


def test_speculative_rejects_a_malformed_tree() -> None:
    probs = torch.full((3, 4), 0.25)
    with pytest.raises(ValueError, match="parents"):
        accept_speculative(torch.tensor([0, 1, 2]), torch.tensor([-1, 2, 0]), probs, None)
    with pytest.raises(ValueError, match="draft_probs"):
        accept_speculative(torch.tensor([0, 1, 2]), torch.tensor([-1, 0, 1]), probs, torch.full((3, 8), 0.125))


# ---------------------------------------------------------------------------------------------------------------
# Greedy.


def _rigged_logits(argmax_per_node: list[int], vocab_size: int = 10) -> torch.Tensor:  # (n, vocab_size)
    logits = torch.randn(len(argmax_per_node), vocab_size, generator=torch.Generator().manual_seed(0))
    logits[torch.arange(len(argmax_per_node)), argmax_per_node] = 10.0
    return logits


def test_greedy_accepts_a_fully_matching_chain_and_adds_the_bonus_token() -> None:
    tokens, parents = torch.tensor([7, 3, 1, 4]), torch.tensor([-1, 0, 1, 2])
    result = accept_greedy(tokens, parents, _rigged_logits([3, 1, 4, 2]))
    assert result == AcceptResult(path=[0, 1, 2, 3], next_token=2)


def test_greedy_rejects_the_first_token_and_corrects_it() -> None:
    tokens, parents = torch.tensor([7, 3, 1]), torch.tensor([-1, 0, 1])
    assert accept_greedy(tokens, parents, _rigged_logits([5, 1, 4])) == AcceptResult(path=[0], next_token=5)


def test_greedy_stops_a_chain_at_the_first_mismatch() -> None:
    tokens, parents = torch.tensor([7, 3, 1, 4]), torch.tensor([-1, 0, 1, 2])
    result = accept_greedy(tokens, parents, _rigged_logits([3, 6, 4, 2]))  # node 2 (token 1) is not the argmax 6
    assert result == AcceptResult(path=[0, 1], next_token=6)


def test_greedy_picks_the_longer_matching_branch() -> None:
    # Both root children match; the first branch matches 2 deep, the second 3 deep.
    tokens = torch.tensor([7, 5, 5, 1, 1, 6, 8])
    parents = torch.tensor([-1, 0, 0, 1, 2, 4, 3])
    result = accept_greedy(tokens, parents, _rigged_logits([5, 1, 1, 9, 6, 2, 0]))
    assert result == AcceptResult(path=[0, 2, 4, 5], next_token=2)


def test_greedy_prefers_the_first_drafted_branch_on_equal_length() -> None:
    tokens, parents = torch.tensor([7, 5, 5, 1, 1]), torch.tensor([-1, 0, 0, 1, 2])
    result = accept_greedy(tokens, parents, _rigged_logits([5, 1, 1, 3, 4]))
    assert result == AcceptResult(path=[0, 1, 3], next_token=3)


def test_greedy_breaks_logit_ties_like_torch_argmax() -> None:
    logits = torch.zeros(3, 6)
    logits[0, [2, 4]] = 5.0  # tie: argmax (and greedy generate) picks token 2
    tokens, parents = torch.tensor([0, 4, 2]), torch.tensor([-1, 0, 0])
    assert accept_greedy(tokens, parents, logits).path == [0, 2]


# ---------------------------------------------------------------------------------------------------------------
# Typical acceptance (lossy).


def test_typical_acceptance_is_labelled_lossy() -> None:
    assert "typical" in LOSSY_ACCEPTANCE
    assert not {"greedy", "speculative"} & LOSSY_ACCEPTANCE


def test_typical_accepts_above_threshold_and_rejects_below() -> None:
    # Peaked row 0: H = 0.52 nats, so alpha * exp(-H) = 0.18 and the threshold is posterior_threshold = 0.09.
    peaked = torch.tensor([0.85, 0.10, 0.05] + [0.0] * 17)
    # Flat row 1 (20 equal tokens): H = ln 20, threshold = 0.3 / 20 = 0.015, so a 0.05 token is typical here.
    flat = torch.full((20,), 0.05)
    logits = torch.stack([peaked, flat, flat, flat]).log()  # (4, 20), -inf where the probability is 0
    parents = torch.tensor([-1, 0, 1, 0])
    gen = torch.Generator().manual_seed(0)
    accepted = accept_typical(torch.tensor([0, 1, 7, 2]), parents, logits, temperature=1.0, generator=gen)
    assert accepted.path == [0, 1, 2]  # 0.10 > 0.09 at the root, then 0.05 > 0.015 at the flat node
    rejected = accept_typical(torch.tensor([0, 2, 7, 2]), parents, logits, temperature=1.0, generator=gen)
    assert rejected.path == [0]  # 0.05 < 0.09 at the root, for both root children
    assert rejected.next_token in {0, 1, 2}


def test_typical_ties_go_to_the_path_the_target_finds_likeliest() -> None:
    """Two typical root children of the same depth: Medusa keeps the one with the higher sum of log p (0.6 over 0.3),
    whichever was drafted first."""
    row = torch.tensor([0.3, 0.6, 0.1] + [0.0] * 5)
    logits = torch.stack([row, row, row]).log()
    parents = torch.tensor([-1, 0, 0])
    assert accept_typical(torch.tensor([5, 0, 1]), parents, logits, temperature=1.0).path == [0, 2]
    assert accept_typical(torch.tensor([5, 1, 0]), parents, logits, temperature=1.0).path == [0, 1]


def test_typical_at_temperature_zero_is_greedy() -> None:
    tokens, parents = torch.tensor([7, 5, 5, 1, 1, 6]), torch.tensor([-1, 0, 0, 1, 2, 4])
    logits = _rigged_logits([5, 1, 1, 9, 6, 2])
    assert accept_typical(tokens, parents, logits, temperature=0.0) == accept_greedy(tokens, parents, logits)


# ---------------------------------------------------------------------------------------------------------------
# Warping.


def test_warp_scales_by_temperature() -> None:
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(warp_logits_to_probs(logits, 0.7), torch.softmax(logits / 0.7, dim=-1))
    with pytest.raises(ValueError, match="temperature"):
        warp_logits_to_probs(logits, 0.0)


def test_warp_top_k_and_top_p_keep_the_right_support() -> None:
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert (warp_logits_to_probs(logits, 1.0, top_k=2) > 0).tolist() == [True, True, False, False]
    assert (warp_logits_to_probs(logits, 1.0, top_p=0.7) > 0).tolist() == [True, True, False, False]
    assert (warp_logits_to_probs(logits, 1.0, top_p=0.85) > 0).tolist() == [True, True, True, False]
    assert (warp_logits_to_probs(logits, 1.0, top_p=0.3) > 0).tolist() == [True, False, False, False]
    torch.testing.assert_close(warp_logits_to_probs(logits, 1.0, top_k=2), torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_top_p_keeps_the_tokens_tied_at_the_nucleus_edge_that_transformers_keeps() -> None:
    """The nucleus was cut from a descending sort, keeping the lowest ids of tokens tied at its edge, where
    transformers' ascending sort keeps the highest: sampled output followed another law than ``generate``'s."""
    assert (warp_logits_to_probs(torch.tensor([2.0, 1.0, 1.0]), 1.0, top_p=0.7) > 0).tolist() == [True, False, True]
    generator = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 4, (500, 12), generator=generator).float()  # small integers: ties everywhere
    for top_p in (0.2, 0.5, 0.75, 0.9):
        kept = TopPLogitsWarper(top_p)(None, logits.clone()) > float("-inf")
        assert torch.equal(warp_logits_to_probs(logits, 1.0, top_p=top_p) > 0, kept)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 5, None), (0.8, None, 0.9), (1.3, 8, 0.6)])
def test_warp_matches_transformers_warpers(temperature: float, top_k: int | None, top_p: float | None) -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    expected = logits / temperature
    if top_k is not None:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p is not None:
        expected = TopPLogitsWarper(top_p)(None, expected)
    probs = warp_logits_to_probs(logits, temperature, top_k=top_k, top_p=top_p)
    torch.testing.assert_close(probs, torch.softmax(expected, dim=-1))
    torch.testing.assert_close(probs.sum(dim=-1), torch.ones(4))


def test_the_draft_noise_reaches_past_what_float32_uniforms_can_give() -> None:
    """Float32 uniforms cap Gumbel noise at -log(-log(1 - 2**-24)) ~ 16.6: a draft token over e^16.6 times less
    likely than the best one was drawn less often than q says (measured: 5 tail draws where 45 were due), and
    acceptance trusts q. In float64 the cap is ~36.7. Of 5e7 draws the largest passes 16.6 with probability ~0.9."""
    from specheads.decoding.draft import gumbel_noise

    float32_cap = -math.log(-math.log1p(-(2.0**-24)))
    noise = gumbel_noise(torch.Size([50_000_000]), torch.Generator().manual_seed(0), torch.device("cpu"))
    assert noise.dtype == torch.float64 and float(noise.max()) > float32_cap
