"""The invariant that matters most: greedy speculative output is token-identical to greedy ``target.generate``.

Real target (SmolLM2-135M-Instruct), chat-templated Spec-Bench prompts (tests/decoding/fixtures, 22 varied
questions: MT-bench categories, translation, summarization, QA, math reasoning), 64 new tokens each. Drafters are
untrained or random: correctness must not depend on draft quality. On every other step the target's own continuation
is planted in the drafter's tree, so that whole paths are accepted too (see ``check_equivalence``).

CI budget (2 CPU cores): every prompt's greedy baseline is computed once per test run, by whichever pytest-xdist
worker gets to it first, and shared with the others through files (a worker that waits for a baseline computes a
missing one meanwhile). Every drafter
runs on at least 20 prompts with its default tree: prompt lookup (chain) on all 22, Medusa on a static tree,
EAGLE-1 and EAGLE-3 on dynamic trees and a 4-layer truncated draft model (adaptive chain) on 20. The chain
variants of Medusa and EAGLE-3, EAGLE-3's tree with a prompt-lookup branch and EAGLE-1's with a branch that
proposes alone where it matches, run on 5 prompts spread over the categories.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
import torch
from filelock import FileLock, Timeout

from specheads.decoding.draft_model_drafter import DraftModelDrafter
from specheads.decoding.eagle_draft import EagleTreeDrafter
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.lookup_branch import LookupBranchDrafter
from specheads.decoding.medusa_drafter import MedusaDrafter
from specheads.decoding.prompt_lookup_drafter import PromptLookupDrafter
from specheads.decoding.tree import DynamicTreeConfig, chain_tree, load_tree
from specheads.heads import DraftModel, EagleConfig, EagleHead, MedusaConfig, MedusaHeads
from tests.decoding.planted import PlantedDrafter

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures"
TREES = Path(__file__).resolve().parents[2] / "specheads" / "decoding" / "trees"
MAX_NEW_TOKENS = 64
PROMPTS = [json.loads(line)["prompt"] for line in (FIXTURES / "spec_bench_prompts.jsonl").read_text().splitlines()]
FEW = [0, 5, 9, 16, 19]  # writing, reasoning, coding, translation, math reasoning
TWENTY = [i for i in range(len(PROMPTS)) if i not in (3, 13)][:20]  # two of the 22 left out to fit CI time


@pytest.fixture(scope="session")
def greedy_baseline(smollm2, tmp_path_factory, worker_id) -> Callable[[int], tuple[torch.Tensor, list[int]]]:
    """prompt index -> (chat-templated ids (T,), greedy new ids from target.generate), computed once per test run.

    With xdist, each baseline is written to a folder all workers of this run share (the parent of each worker's base
    temp folder), under a per-prompt file lock, so no two workers spend ~5 s of CPU on the same prompt. A worker that
    finds its prompt being computed elsewhere computes a missing one from the other end of the list meanwhile."""
    model, tokenizer = smollm2
    base = tmp_path_factory.getbasetemp()
    folder = (base if worker_id == "master" else base.parent) / "greedy-baselines"
    folder.mkdir(exist_ok=True)

    def prompt_ids(index: int) -> torch.Tensor:  # (1, T)
        messages = [{"role": "user", "content": PROMPTS[index]}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"]

    def result_file(index: int) -> Path:
        return folder / f"{index}.json"

    def compute_unless_claimed(index: int) -> bool:
        """Compute and write prompt `index`'s baseline unless another worker holds it; False if one does."""
        lock = FileLock(folder / f"{index}.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        try:
            if not result_file(index).exists():
                ids = prompt_ids(index)
                out = model.generate(
                    ids, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, attention_mask=torch.ones_like(ids)
                )
                partial = folder / f"{index}.json.partial"
                partial.write_text(json.dumps(out[0, ids.shape[1] :].tolist()))
                partial.replace(result_file(index))  # readers never see a half-written file
        finally:
            lock.release()
        return True

    @cache
    def baseline(index: int) -> tuple[torch.Tensor, list[int]]:
        while not result_file(index).exists():
            if compute_unless_claimed(index):
                break
            missing = [j for j in reversed(range(len(PROMPTS))) if not result_file(j).exists()]
            if not any(compute_unless_claimed(j) for j in missing if j != index):
                with FileLock(folder / f"{index}.lock"):  # nothing else to do: wait for the worker computing it
                    pass
        return prompt_ids(index)[0], json.loads(result_file(index).read_text())

    return baseline


def make_drafter(name: str, target):
    torch.manual_seed(0)  # random drafters, but the same ones on every run
    if name == "medusa-tree":
        return MedusaDrafter(MedusaHeads(MedusaConfig(num_heads=4), target).eval(), load_tree(TREES / "small10.json"))
    if name == "medusa-chain":
        return MedusaDrafter(MedusaHeads(MedusaConfig(num_heads=3), target).eval(), chain_tree(3))
    if name == "eagle1-dynamic":
        return EagleTreeDrafter(EagleHead(EagleConfig(version=1), target).eval(), DynamicTreeConfig(3, 3, 8))
    if name == "eagle3-dynamic":
        return EagleTreeDrafter(EagleHead(EagleConfig(version=3), target).eval(), DynamicTreeConfig(3, 2, 6))
    if name == "eagle3-chain":
        return EagleTreeDrafter(EagleHead(EagleConfig(version=3), target).eval(), DynamicTreeConfig(3, 1, 3))
    if name == "draft-model":
        return DraftModelDrafter(DraftModel.from_target(target, 4).eval(), draft_length=3)
    if name == "prompt-lookup":
        return PromptLookupDrafter(num_tokens=6)
    if name == "eagle3-dynamic+lookup":  # the defaults: a match of >= 2 tokens, up to 5 tokens grafted on
        return LookupBranchDrafter(make_drafter("eagle3-dynamic", target))
    if name == "eagle1-dynamic+lookup-solo":  # steps with a lookup match skip the head (its re-feed waits)
        return LookupBranchDrafter(make_drafter("eagle1-dynamic", target), solo_ngram=2)
    raise KeyError(name)


def check_equivalence(smollm2, greedy_baseline, drafter_name: str, indices: list[int]) -> None:
    """Each prompt decodes with the drafter's own proposals on odd steps and, on even ones, with the target's greedy
    continuation planted along the tree's last-created deepest path (tests/decoding/planted.py): random heads alone
    get almost nothing accepted, and the accepted paths, off the first branch in a branching tree, are what the
    cache commit and the drafter's re-feed must get right (they also make each prompt ~2x cheaper)."""
    model, tokenizer = smollm2
    drafter = make_drafter(drafter_name, model)
    planted_steps = 0
    for index in indices:
        ids, expected = greedy_baseline(index)
        planted = PlantedDrafter(drafter, expected)
        result = SpeculativeGenerator(model, tokenizer, planted).generate(ids, max_new_tokens=MAX_NEW_TOKENS)
        assert result.token_ids == expected, f"{drafter_name} diverged from greedy generate on prompt {index}"
        # One forward per step plus the prefill; a step commits its accepted drafts and one more token, and only the
        # last step can be cut short (EOS, max_new_tokens): the counts must add up to the tokens returned.
        forwards, accepted = result.stats.target_forwards, result.stats.accepted_lengths
        assert forwards == 1 + len(accepted)
        assert forwards - 1 + sum(accepted[:-1]) < len(expected) <= forwards + sum(accepted)
        (state,) = planted.states
        assert len(state.planted) == len(accepted)
        # a planted path is the target's own continuation: all of it is accepted (the last step may stop early)
        assert all(taken >= depth for taken, depth in zip(accepted[:-1], state.planted[:-1])), (index, accepted)
        planted_steps += sum(depth > 0 for depth in state.planted)
    assert planted_steps >= len(indices)  # every prompt got at least one planted path on average


def test_prompt_lookup_all_prompts(smollm2, greedy_baseline):
    check_equivalence(smollm2, greedy_baseline, "prompt-lookup", list(range(len(PROMPTS))))


@pytest.mark.parametrize("drafter_name", ["medusa-tree", "eagle1-dynamic", "eagle3-dynamic", "draft-model"])
def test_drafters_twenty_prompts(smollm2, greedy_baseline, drafter_name):
    assert len(TWENTY) == 20
    check_equivalence(smollm2, greedy_baseline, drafter_name, TWENTY)


@pytest.mark.parametrize(
    "drafter_name", ["medusa-chain", "eagle3-chain", "eagle3-dynamic+lookup", "eagle1-dynamic+lookup-solo"]
)
def test_chains_few_prompts(smollm2, greedy_baseline, drafter_name):
    check_equivalence(smollm2, greedy_baseline, drafter_name, FEW)
