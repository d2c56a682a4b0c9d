"""Pick a draft tree from what it costs on this device and what the drafter gets accepted (the ``auto`` tree).

Verifying many tree nodes costs several decode steps on a small CPU but about one on a GPU (docs/results.md), so the
best tree is a property of the hardware as much as of the head. Each calibration measures the drafter's acceptance
per (depth, rank) on a few short generations, then times the target's forward for a few sizes at those steps' mean
context length (``cost_curve``, not cached apart); the tree picked maximises expected tokens per second:

    rate(tree) = E[committed tokens per step] / (draft_cost(depth) + verify_cost(nodes) + overhead)

Under greedy acceptance a node is committed iff every guess on its path was the target's token, so
E[committed] = 1 + sum over nodes of prod_d p(d, rank_d) (tau counts the bonus token), with p(d, r) the probability
that depth d's rank-r guess is right given its parent was. Since a child is never likelier than its parent, the best
tree of each size is grown best-first (as Medusa's tree construction, https://arxiv.org/abs/2401.10774, and
Sequoia's, https://arxiv.org/abs/2402.12374, under a position-independence assumption).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specheads.decoding.draft import inner_modules
from specheads.decoding.lookup_branch import first_choice_path
from specheads.decoding.prompt_lookup_drafter import lookup_match
from specheads.decoding.tree import children_lists, fits_context, node_depths

Path_ = tuple[int, ...]  # ranks from the root's children down: (r1, r2, ...) as in Medusa "choices"


@dataclass
class RankAcceptance:
    """``probs[d][r]``: P(the target's token at depth d+1 is the drafter's rank-r guess | its parent was accepted)."""

    probs: list[list[float]]

    def path_prob(self, path: Path_) -> float:
        prob = 1.0
        for depth, rank in enumerate(path):
            if depth >= len(self.probs) or rank >= len(self.probs[depth]):
                return 0.0
            prob *= self.probs[depth][rank]
        return prob


@dataclass
class DraftCost:
    """Seconds to draft a tree of a given depth: ``fixed + per_depth * depth`` (0 when nothing is drafted)."""

    fixed_s: float = 0.0
    per_depth_s: float = 0.0

    def __call__(self, depth: int) -> float:
        return 0.0 if depth == 0 else self.fixed_s + self.per_depth_s * depth


@dataclass
class TreeChoice:
    """A tree (Medusa choices; no choices = plain decoding) and the rate the cost model expects from it."""

    choices: list[list[int]]
    expected_tau: float
    step_seconds: float
    candidates: list[dict[str, float]] = field(default_factory=list)  # every size considered, for the report

    @property
    def num_nodes(self) -> int:
        """Draft nodes, root excluded."""
        return len(self.choices)

    @property
    def depth(self) -> int:
        return max((len(c) for c in self.choices), default=0)

    @property
    def top_k(self) -> int:
        return max((max(c) + 1 for c in self.choices), default=1)

    @property
    def expected_tokens_per_s(self) -> float:
        return self.expected_tau / self.step_seconds

    def describe(self) -> str:
        nodes = f"{self.num_nodes} node{'' if self.num_nodes == 1 else 's'}"
        return (
            f"{nodes}, depth {self.depth}, top-{self.top_k}: expected tau {self.expected_tau:.2f}, "
            f"{self.expected_tokens_per_s:.1f} tokens/s decoding (the prompt's forward apart)"
        )


def best_first_paths(acceptance: RankAcceptance, max_nodes: int) -> list[tuple[Path_, float]]:
    """The ``max_nodes`` likeliest paths, grown best-first so every prefix of the list is a valid tree."""
    widths = [len(row) for row in acceptance.probs]
    heap: list[tuple[float, int, Path_]] = []
    for rank in range(widths[0] if widths else 0):
        heapq.heappush(heap, (-acceptance.path_prob((rank,)), 1, (rank,)))
    chosen: list[tuple[Path_, float]] = []
    while heap and len(chosen) < max_nodes:
        neg_prob, depth, path = heapq.heappop(heap)
        if neg_prob == 0.0:
            break  # nothing left that can ever be accepted
        chosen.append((path, -neg_prob))
        if depth < len(widths):
            for rank in range(widths[depth]):
                child = (*path, rank)
                heapq.heappush(heap, (-acceptance.path_prob(child), depth + 1, child))
    return chosen


def choose_tree(
    acceptance: RankAcceptance,
    verify_cost: Callable[[int], float],
    draft_cost: Callable[[int], float],
    overhead_s: float = 0.0,
    max_nodes: int = 63,
    one_level_tau: dict[int, float] | None = None,
) -> TreeChoice:
    """The tree size (and shape) maximising expected tokens/s; ``verify_cost(n)`` takes nodes incl. the root.
    ``one_level_tau``: the replayed tau of n guesses at depth 1 (``replay.one_level_taus``), which prices a
    candidate of that shape in place of the acceptance model (whose depth-1 counts come from harder positions)."""
    paths = best_first_paths(acceptance, max_nodes)
    best: TreeChoice | None = None
    candidates = []
    expected, depth = 1.0, 0
    for n in range(len(paths) + 1):
        if n:
            expected += paths[n - 1][1]
            depth = max(depth, len(paths[n - 1][0]))
        tau = (one_level_tau or {}).get(n, expected) if depth == 1 else expected
        step = draft_cost(depth) + verify_cost(n + 1) + overhead_s
        candidates.append({"nodes": n, "depth": depth, "expected_tau": tau, "tokens_per_s": tau / step})
        if best is None or tau / step > best.expected_tokens_per_s:
            best = TreeChoice([list(p) for p, _ in paths[:n]], tau, step)
    assert best is not None
    best.candidates = candidates
    return best


@dataclass
class CalibrationStep:
    """One calibration step, kept to price a prompt-lookup branch afterwards (``choose_lookup_solo``)."""

    position: int  # context length (prompt + committed tokens, root included) when the tree was proposed
    ranks: list[int]  # the accepted path as ranks among each node's children, root down (empty: nothing accepted)
    first_path: list[int]  # the tokens of the first-choice path (first child at every level), root excluded
    nodes: int = 1  # tokens the target verified at this step, root included


class RecordingDrafter:
    """Wraps any drafter and counts, per (depth, rank), how often the target's token was that guess.

    After each step the accepted path is walked from the root: at each reached node, every child is a trial of its
    rank (children are in draft order, best first) and the child whose token the target committed is a hit. Every
    step is also kept per request (``steps``) with its position, so a lookup branch can be priced afterwards.
    """

    def __init__(self, drafter: Any, max_context: int = 0) -> None:
        self.drafter, self.layer_ids = drafter, list(drafter.layer_ids)
        self.max_context = max_context  # the generator's: a tree past it is not verified, so it is not counted
        self.model, self.head, self.heads = inner_modules(drafter)  # calibration times the kernels decoding runs
        self.trials: list[list[int]] = []
        self.hits: list[list[int]] = []
        self.steps: list[list[CalibrationStep]] = []  # one list per request, in ``begin`` order
        self._tree: tuple[list[int], list[int]] = ([], [])
        self._first_path: list[int] = []
        self._length = 0

    def begin(self, prompt_ids, hidden_states, root, sampling, generator) -> Any:
        self.steps.append([])
        self._length = prompt_ids.numel() + 1  # the root is committed already
        return self.drafter.begin(prompt_ids, hidden_states, root, sampling, generator)

    def propose(self, state: Any) -> Any:
        tree = self.drafter.propose(state)
        self._tree = (tree.tokens.tolist(), tree.parents.tolist())
        self._first_path = first_choice_path(tree).tokens[1:].tolist()
        if not fits_context(self.max_context, self._length - 1, int(node_depths(tree.parents).max())):
            self._tree, self._first_path = (self._tree[0][:1], [-1]), []  # the generator verifies the root alone
        return tree

    def observe(self, state: Any, fed_tokens: torch.Tensor, hidden_states: Any, root: int) -> None:
        tokens, parents = self._tree
        ranks = self.record(tokens, parents, fed_tokens.view(-1).tolist()[1:] + [root])
        self.steps[-1].append(CalibrationStep(self._length, ranks, self._first_path, len(tokens)))
        self._length += fed_tokens.numel()  # the accepted drafts and the new root
        self.drafter.observe(state, fed_tokens, hidden_states, root)

    def record(self, tokens: list[int], parents: list[int], committed: list[int]) -> list[int]:
        """``committed``: the tokens the target committed after the root (accepted drafts, then the bonus).
        Returns the ranks of the accepted drafts, root down."""
        children = children_lists(parents)
        node, ranks = 0, []
        for depth, token in enumerate(committed):
            kids = children[node]
            if not kids:
                break
            while len(self.trials) <= depth:
                self.trials.append([])
                self.hits.append([])
            row_t, row_h = self.trials[depth], self.hits[depth]
            row_t += [0] * (len(kids) - len(row_t))
            row_h += [0] * (len(kids) - len(row_h))
            match = None
            for rank, kid in enumerate(kids):
                row_t[rank] += 1
                if tokens[kid] == token and match is None:
                    match = kid
                    row_h[rank] += 1
                    ranks.append(rank)
            if match is None:
                break
            node = match
        return ranks

    def acceptance(self) -> RankAcceptance:
        return RankAcceptance(
            [[h / t if t else 0.0 for h, t in zip(hits, trials)] for hits, trials in zip(self.hits, self.trials)]
        )


@dataclass
class SoloChoice:
    """For a head's tree plus a lookup branch: the n-gram length from which the lookup chain should go alone."""

    solo_ngram: int | None  # None: never alone, always the narrow branch beside the head's first-choice path
    tokens_per_s: dict[str, float]  # expected rate of every setting considered, for the report
    matched_steps: float  # share of calibration steps where the lookup matched at all

    def describe(self) -> str:
        rates = ", ".join(f"{name} {rate:.1f}" for name, rate in self.tokens_per_s.items())
        chosen = "never" if self.solo_ngram is None else f"on {self.solo_ngram}-gram or longer matches"
        matched = f"lookup matched on {self.matched_steps:.0%} of steps"
        return f"lookup alone {chosen} (expected tokens/s: {rates}; {matched})"


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def choose_lookup_solo(
    sequences: Sequence[torch.Tensor],
    steps: Sequence[Sequence[CalibrationStep]],
    choice: TreeChoice,
    verify_cost: Callable[[int], float],
    draft_cost: Callable[[int], float],
    overhead_s: float,
    num_tokens: int,
    min_ngram: int,
    max_ngram: int,
) -> SoloChoice:
    """Price a lookup branch on the greedy calibration run: when should the lookup chain propose alone?

    ``sequences[i]`` is request i's prompt and greedy output, ``steps[i]`` its recorded steps. Greedy output is the
    target's own continuation, so at every recorded position the lookup chain's accepted length is known exactly:
    its common prefix with what follows. Each step is then replayed under every setting, as ``LookupBranchDrafter``
    would build its tree:
    - no match: the head's chosen tree (accepts the longest prefix of the step's rank path that the tree holds);
    - a match below the solo length: the head's first-choice path to the tree's depth with the chain grafted on
      (accepts the longer of the two);
    - a match at or above it: the chain alone, nothing drafted.
    Expected tokens/s of a setting = committed tokens / seconds summed over all steps, with the cost model's prices.
    """
    chosen, depth = {tuple(c) for c in choice.choices}, choice.depth
    head_step_s = choice.step_seconds
    settings: dict[str, int | None] = {"branch": None, **{f"alone >= {n}": n for n in range(min_ngram, max_ngram + 1)}}
    tokens = {name: 0.0 for name in ["no branch", *settings]}
    seconds = dict.fromkeys(tokens, 0.0)
    total = matched = 0
    for sequence, request in zip(sequences, steps):
        sequence = sequence.view(-1)
        for step in request:
            total += 1
            in_tree = next(k for k in range(len(step.ranks), -1, -1) if k == 0 or tuple(step.ranks[:k]) in chosen)
            head = (1 + in_tree, head_step_s)
            chain, ngram = lookup_match(sequence[: step.position], num_tokens, max_ngram, min_ngram)
            chain_list = chain.tolist()
            matched += bool(chain_list)
            lookup_ok = _common_prefix(chain_list, sequence[step.position : step.position + len(chain_list)].tolist())
            first_ok = min(next((k for k, r in enumerate(step.ranks) if r), len(step.ranks)), depth)
            shared = _common_prefix(chain_list, step.first_path[:depth])
            nodes = 1 + depth + len(chain_list) - shared
            branch = (1 + max(first_ok, lookup_ok), draft_cost(depth) + verify_cost(nodes) + overhead_s)
            alone = (1 + lookup_ok, verify_cost(1 + len(chain_list)) + overhead_s)
            outcomes = {"no branch": head}
            for name, solo in settings.items():
                outcomes[name] = head if not chain_list else alone if solo is not None and ngram >= solo else branch
            for name, (step_tokens, step_s) in outcomes.items():
                tokens[name] += step_tokens
                seconds[name] += step_s
    rates = {name: tokens[name] / seconds[name] if seconds[name] else 0.0 for name in tokens}
    best = max(settings, key=lambda name: rates[name])
    return SoloChoice(settings[best], rates, matched / max(total, 1))
