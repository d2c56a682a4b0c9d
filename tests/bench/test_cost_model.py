"""Tree selection by the cost model, on synthetic cost curves (no timing)."""

from __future__ import annotations

import pytest
import torch

from specheads.decoding.draft import DraftTree
from specheads.decoding.draft_model_drafter import DraftModelDrafter
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.tuning.cost_curve import CostCurve
from specheads.decoding.tuning.cost_model import (
    CalibrationStep,
    DraftCost,
    RankAcceptance,
    RecordingDrafter,
    TreeChoice,
    best_first_paths,
    choose_lookup_solo,
    choose_tree,
)
from specheads.heads import DraftModel
from tests.decoding.helpers import TinyTokenizer

SIZES = [1, 2, 4, 8, 16, 32, 64]
# CPU-like: 64 nodes cost several times one step; GPU-like: flat until far past 64.
CPU = CostCurve(SIZES, [0.051, 0.07, 0.087, 0.097, 0.114, 0.138, 0.177])
GPU = CostCurve(SIZES, [0.020, 0.020, 0.020, 0.0201, 0.0202, 0.0205, 0.021])
# For auto trees calibrated here: the tiny drafters' measured cost is milliseconds, but tens of them on a loaded
# machine; with verification this slow and flat, drafting pays whatever the machine's load.
SLOW_FLAT = CostCurve(SIZES, [2.0, 2.0, 2.0, 2.0, 2.0, 2.01, 2.02])
# A decent head: rank 0 right 70% of the time at depth 1, decaying with depth; lower ranks less likely.
ACCEPTANCE = RankAcceptance([[0.7 * 0.9**d, 0.12, 0.05, 0.03] for d in range(6)])


def test_cost_curve_interpolates_and_extrapolates():
    assert CPU.at(1) == pytest.approx(0.051)
    assert CPU.at(3) == pytest.approx((0.07 + 0.087) / 2)
    assert CPU.at(96) == pytest.approx(0.177 + (0.177 - 0.138) / 32 * 32)
    assert CPU.relative()[-1] == pytest.approx(0.177 / 0.051)


def test_a_size_timed_above_a_larger_one_is_priced_at_the_larger_ones_cost():
    # the reference-head benchmark's curve: one token timed at 76 ms, two at 63 ms (noise only adds time)
    noisy = CostCurve([1, 2, 3, 8], [0.076, 0.063, 0.066, 0.088])
    assert noisy.envelope() == [0.063, 0.063, 0.066, 0.088] and noisy.at(1) == 0.063
    assert noisy.at(5) == pytest.approx(0.066 + 0.022 * 2 / 5) and noisy.relative()[0] == 1.0
    assert CPU.envelope() == CPU.seconds and CPU.at(4) == CPU.seconds[2]  # a rising curve is priced as measured


def test_best_first_paths_form_valid_trees_in_decreasing_probability():
    paths = best_first_paths(ACCEPTANCE, 40)
    probs = [p for _, p in paths]
    assert probs == sorted(probs, reverse=True)
    seen = set()
    for path, _ in paths:  # every prefix of the list is a tree: a node's parent comes before it
        assert len(path) == 1 or path[:-1] in seen
        seen.add(path)
    assert paths[0][0] == (0,)


def test_cpu_and_gpu_choose_different_trees():
    draft = DraftCost(per_depth_s=0.002)
    cpu = choose_tree(ACCEPTANCE, CPU.at, draft)
    gpu = choose_tree(ACCEPTANCE, GPU.at, draft)
    assert cpu.num_nodes < gpu.num_nodes, (cpu.describe(), gpu.describe())
    assert gpu.num_nodes >= 32  # verification is ~free on the GPU: use a big tree
    assert cpu.expected_tau < gpu.expected_tau
    # the chosen tree is the best of every candidate size considered
    assert cpu.expected_tokens_per_s == pytest.approx(max(c["tokens_per_s"] for c in cpu.candidates))


def test_useless_drafter_chooses_no_tree():
    never = RankAcceptance([[0.0, 0.0]] * 3)
    choice = choose_tree(never, CPU.at, DraftCost(fixed_s=0.01))
    assert choice.num_nodes == 0 and choice.expected_tau == 1.0


def test_expensive_drafting_shrinks_depth():
    cheap = choose_tree(ACCEPTANCE, GPU.at, DraftCost(per_depth_s=0.0005))
    costly = choose_tree(ACCEPTANCE, GPU.at, DraftCost(per_depth_s=0.05))
    assert costly.depth < cheap.depth


def test_recording_drafter_counts_rank_hits():
    recorder = RecordingDrafter(type("D", (), {"layer_ids": []})())
    # root 0 with children 1 (token 10, rank 0) and 2 (token 11, rank 1); node 1 has child 3 (token 12)
    tokens, parents = [5, 10, 11, 12], [-1, 0, 0, 1]
    assert recorder.record(tokens, parents, [10, 12, 99]) == [0, 0]  # accepted 10, 12, bonus 99 (no children left)
    assert recorder.record(tokens, parents, [11, 7]) == [1]  # rank 1 accepted at depth 1, node 2 has no children
    assert recorder.record(tokens, parents, [3]) == []  # nothing accepted
    assert recorder.trials == [[3, 3], [1]]
    assert recorder.hits == [[1, 1], [1]]
    assert recorder.acceptance().probs == [[1 / 3, 1 / 3], [1.0]]


class FixedTreeDrafter:
    """Proposes the same tree every step (tokens 10, 11 under the root; 12 under 10)."""

    layer_ids: list[int] = []

    def begin(self, prompt_ids, hidden_states, root, sampling, generator):
        return None

    def propose(self, state):
        return DraftTree(tokens=torch.tensor([5, 10, 11, 12]), parents=torch.tensor([-1, 0, 0, 1]))

    def observe(self, state, fed_tokens, hidden_states, root):
        pass


def test_recording_drafter_keeps_each_steps_position_ranks_and_first_path():
    recorder = RecordingDrafter(FixedTreeDrafter())
    for prompt_len in (5, 3):  # two requests
        recorder.begin(torch.zeros(1, prompt_len, dtype=torch.long), None, 7, None, None)
        recorder.propose(None)
        recorder.observe(None, torch.tensor([7, 10, 12]), None, 8)  # root, two accepted drafts; new root 8
        recorder.propose(None)
        recorder.observe(None, torch.tensor([8]), None, 4)  # nothing accepted
    first, second = recorder.steps
    # the prompt and the root are in the context at the first step; three tokens are committed by it
    assert first == [CalibrationStep(6, [0, 0], [10, 12], 4), CalibrationStep(9, [], [10, 12], 4)]
    assert [step.position for step in second] == [4, 7]


REPEATED = list(range(10, 30))
# ``auto`` chose a 2-deep chain; its step costs what the cost model priced it at.
CHAIN2 = TreeChoice([[0], [0, 0]], expected_tau=1.5, step_seconds=CPU.at(3) + 0.002)


def price(sequence: list[int], steps: list[CalibrationStep]):
    return choose_lookup_solo(
        [torch.tensor(sequence)], [steps], CHAIN2, CPU.at, DraftCost(per_depth_s=0.001), 0.0, 5, 2, 3
    )


def test_lookup_goes_alone_where_it_is_right_and_the_head_is_wrong():
    sequence = REPEATED + REPEATED  # the second half repeats the first: every lookup chain there is right
    steps = [CalibrationStep(position, [], [1, 2]) for position in range(23, 38, 6)]  # the head guesses wrong
    choice = price(sequence, steps)
    rates = choice.tokens_per_s
    assert choice.solo_ngram in (2, 3) and choice.matched_steps == 1.0
    assert rates[f"alone >= {choice.solo_ngram}"] > rates["branch"] > rates["no branch"]
    assert "lookup alone on" in choice.describe()


def test_lookup_stays_a_branch_where_it_matches_but_the_head_is_right():
    # "1 2" recurs with a different continuation each time: the lookup proposes its last one, which is wrong
    sequence = [1, 2, 50, 51, 1, 2, 60, 61, 1, 2, 70, 71, 72]
    steps = [CalibrationStep(10, [0, 0], [70, 71])]  # after the third "1 2" the head's first choices are right
    choice = price(sequence, steps)
    rates = choice.tokens_per_s
    assert choice.solo_ngram is None and choice.matched_steps == 1.0
    assert rates["branch"] > rates["alone >= 2"]
    assert "lookup alone never" in choice.describe()


class WordTokenizer:
    """Stand-in tokenizer for the tiny random Llama (no chat template, no EOS)."""

    chat_template = None
    eos_token_id = None

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(f" w{int(i)}" for i in ids)


def test_auto_tree_builds_a_working_medusa_drafter(tiny_llama):
    import torch

    from specheads.decoding.generator import SpeculativeGenerator
    from specheads.decoding.tuning.auto_tree import auto_drafter
    from specheads.heads import MedusaConfig, MedusaHeads

    torch.manual_seed(0)
    head = MedusaHeads(MedusaConfig(num_heads=3, num_layers=1), tiny_llama).eval()
    prompts = [torch.randint(0, 128, (12,)) for _ in range(2)]
    spec = auto_drafter(head, tiny_llama, WordTokenizer(), GPU, prompts, max_new_tokens=12)
    assert spec.auto is not None and spec.tree.startswith("auto:")
    assert spec.calibration is not None and spec.calibration.curve is GPU  # a given curve is taken as is
    assert spec.auto.depth <= head.num_heads
    plain = SpeculativeGenerator(tiny_llama, WordTokenizer()).generate(prompts[0], max_new_tokens=12)
    drafted = SpeculativeGenerator(tiny_llama, WordTokenizer(), spec.drafter).generate(prompts[0], max_new_tokens=12)
    assert drafted.token_ids == plain.token_ids


def test_calibration_times_the_verify_cost_at_its_own_context(tiny_llama):
    """A curve cached once at a 128-token context priced a 3-token verify at 1.02x one token where a 700-token prompt
    made it 1.24x, and on an hour's clock that drafting was not timed on: auto trees took nodes that did not pay.
    Without a given curve, the calibration times one right after its run, at its steps' mean context."""
    from specheads.decoding.tuning.auto_tree import auto_drafter
    from specheads.decoding.tuning.cost_curve import COST_SIZES, device_label
    from specheads.heads import MedusaConfig, MedusaHeads

    torch.manual_seed(0)
    head = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1), tiny_llama).eval()
    prompts = [torch.randint(0, 128, (n,)) for n in (30, 70)]
    spec = auto_drafter(head, tiny_llama, WordTokenizer(), None, prompts, max_new_tokens=8)
    calibration = spec.calibration
    assert calibration is not None and spec.auto is not None
    positions = [step.position for request in calibration.steps for step in request]
    assert min(positions) >= 31 and max(positions) <= 79  # each prompt's steps, root committed
    curve = calibration.curve
    assert curve.prefix_len == round(sum(p - 1 for p in positions) / len(positions))  # the cache, not the root
    assert curve.sizes == list(COST_SIZES) and all(s > 0 for s in curve.seconds)  # a tree of up to 64 tokens
    assert curve.device == device_label(tiny_llama.device) and curve.model == "tiny-random-llama"
    assert spec.auto.step_seconds >= curve.at(spec.auto.num_nodes + 1)  # the tree was priced on this curve
    # a context past what the target holds is timed where the largest size still fits
    room = tiny_llama.config.max_position_embeddings
    long = auto_drafter(head, tiny_llama, WordTokenizer(), None, [torch.randint(0, 128, (room - 30,))], 4)
    assert long.calibration is not None and long.calibration.curve.prefix_len == room - COST_SIZES[-1]
    plain = SpeculativeGenerator(tiny_llama, WordTokenizer()).generate(prompts[0], max_new_tokens=4).stats
    assert 0 < plain.prefill_s <= plain.verify_s  # the prompt's forward, which no curve prices, is told apart


def test_cost_sizes_cover_the_largest_tree_and_fit_the_target():
    """A draft model's chain is at most 9 tokens: it was timed at 32 and 64 tokens too, ~10 s a calibration on
    SmolLM2; and a target with few positions had 64 tokens timed past its end."""
    from specheads.decoding.tuning.cost_curve import COST_SIZES, cost_sizes

    assert cost_sizes(64) == list(COST_SIZES)
    assert cost_sizes(9) == [1, 2, 3, 4, 6, 8, 16]  # the first size past 9 too: the curve interpolates up to it
    assert cost_sizes(8) == [1, 2, 3, 4, 6, 8]
    assert cost_sizes(64, max_context=40) == [1, 2, 3, 4, 6, 8, 16]  # a prefix as long as the largest still fits
    assert cost_sizes(64, max_context=1) == [1]


def test_a_draft_models_calibration_times_only_the_sizes_its_chain_needs(tiny_llama):
    from specheads.decoding.tuning.auto_tree import CALIBRATION_CHAIN_DEPTH, auto_drafter
    from specheads.heads import DraftModel

    torch.manual_seed(0)
    head = DraftModel.from_target(tiny_llama, 1).eval()
    spec = auto_drafter(head, tiny_llama, WordTokenizer(), None, [torch.randint(0, 128, (20,))], max_new_tokens=6)
    assert spec.calibration is not None and spec.auto is not None
    sizes = spec.calibration.curve.sizes
    assert sizes[-1] >= CALIBRATION_CHAIN_DEPTH + 1 and 32 not in sizes and 64 not in sizes
    assert spec.auto.num_nodes <= CALIBRATION_CHAIN_DEPTH


def test_calibration_prices_each_step_s_bookkeeping(tiny_llama):
    """The per-step overhead is what the steps' bookkeeping took. It subtracted a prompt forward's cost from it,
    from when the prompt's forward was counted as bookkeeping, so on a slow target it read 0 on every machine."""
    from specheads.decoding.tuning.auto_tree import auto_drafter
    from specheads.heads import MedusaConfig, MedusaHeads

    torch.manual_seed(0)
    head = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1), tiny_llama).eval()
    prompts = [torch.randint(0, 128, (12,)) for _ in range(2)]
    spec = auto_drafter(head, tiny_llama, WordTokenizer(), SLOW_FLAT, prompts, max_new_tokens=8)
    assert spec.calibration is not None and 0.0 < spec.calibration.overhead_s < 1.0


def test_auto_tree_decodes_plainly_when_no_guess_pays(tiny_llama):
    """A device where verifying a second token costs 50x the first: the auto tree is the root alone, no drafter."""
    import torch

    from specheads.decoding.tuning.auto_tree import auto_drafter
    from specheads.heads import MedusaConfig, MedusaHeads

    torch.manual_seed(0)
    head = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1), tiny_llama).eval()
    steep = CostCurve(sizes=[1, 2, 64], seconds=[0.01, 0.5, 5.0])
    spec = auto_drafter(head, tiny_llama, WordTokenizer(), steep, [torch.randint(0, 128, (12,))], max_new_tokens=8)
    assert spec.auto is not None and spec.auto.num_nodes == 0 and spec.auto.expected_tau == 1.0
    assert spec.drafter is None
    assert "plain decoding" in spec.tree


def test_auto_solo_length_builds_a_lossless_branch_and_needs_an_auto_tree(tiny_llama):
    from specheads.decoding.generator import SpeculativeGenerator
    from specheads.decoding.lookup_branch import LookupBranchDrafter
    from specheads.decoding.tuning.auto_tree import auto_drafter, fixed_drafter, with_lookup_branch
    from specheads.heads import DraftModel

    torch.manual_seed(0)
    # A draft model with all of the target's layers guesses every token, so auto drafts (a random head would not)
    head = DraftModel.from_target(tiny_llama, tiny_llama.config.num_hidden_layers).eval()
    block = torch.randint(0, 128, (6,))
    prompts = [block.repeat(3), torch.randint(0, 128, (12,))]  # the first prompt repeats itself: lookup matches
    spec = auto_drafter(head, tiny_llama, WordTokenizer(), SLOW_FLAT, prompts, max_new_tokens=12)
    assert spec.drafter is not None and spec.auto is not None and spec.auto.depth > 1
    assert spec.calibration is not None and len(spec.calibration.steps) == 2
    assert spec.calibration.sequences[0][:18].tolist() == prompts[0].tolist()
    solo = with_lookup_branch(spec, 4, "auto")
    assert isinstance(solo.drafter, LookupBranchDrafter)
    # the choice is the cost model's on the recorded calibration (which one depends on the measured draft cost)
    cal = spec.calibration
    priced = choose_lookup_solo(
        cal.sequences, cal.steps, spec.auto, SLOW_FLAT.at, cal.draft_cost, cal.overhead_s, 4, 2, 3
    )
    assert solo.drafter.solo_ngram == priced.solo_ngram and f"auto: {priced.describe()}" in solo.tree
    assert priced.matched_steps > 0  # the repeated prompt gave the lookup something to match
    plain = SpeculativeGenerator(tiny_llama, WordTokenizer()).generate(prompts[0], max_new_tokens=12)
    drafted = SpeculativeGenerator(tiny_llama, WordTokenizer(), solo.drafter).generate(prompts[0], max_new_tokens=12)
    assert drafted.token_ids == plain.token_ids
    with pytest.raises(ValueError, match="use --tree auto, or give the length"):
        with_lookup_branch(fixed_drafter(head, "chain:2"), 4, "auto")


class CharTokenizer(WordTokenizer):
    """Encodes text as one id per character (mod the tiny vocabulary), so built-in prompts reach the tiny target."""

    def __call__(self, text: str, return_tensors: str | None = None):
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=torch.tensor([[ord(c) % 128 for c in text]]))


def test_auto_tree_is_keyed_by_the_architecture_not_the_folder_name(tmp_path):
    """Two folders with the same architecture (and file stamps) share an auto tree; a folder overwritten with a
    bigger model (same name) gets its own instead of reusing the smaller one's."""
    from specheads.decoding.tuning.auto_tree import auto_tree_cache_path
    from specheads.heads import DraftModel
    from tests.tiny_models import make_tiny_llama

    small, copy, bigger = make_tiny_llama(), make_tiny_llama(seed=1), make_tiny_llama(num_layers=6)
    small.config.name_or_path, copy.config.name_or_path = str(tmp_path / "a" / "model"), str(tmp_path / "b" / "model")
    bigger.config.name_or_path = small.config.name_or_path
    DraftModel.from_target(small, 1).save_pretrained(tmp_path / "head")
    first = auto_tree_cache_path(tmp_path / "cache", tmp_path / "head", small)
    assert auto_tree_cache_path(tmp_path / "cache", tmp_path / "head", copy) == first
    assert auto_tree_cache_path(tmp_path / "cache", tmp_path / "head", bigger) != first


def test_auto_tree_cache_entry_changes_when_the_target_folder_is_overwritten(tmp_path):
    """The acceptance an ``auto`` tree was chosen from belongs to the target's weights: a target folder saved over
    with other weights (same name, same architecture) gets a new entry; the same files keep theirs."""
    import os

    from specheads.decoding.tuning.auto_tree import auto_tree_cache_path
    from specheads.heads import DraftModel
    from tests.tiny_models import make_tiny_llama

    target_dir, head_dir = tmp_path / "target", tmp_path / "head"
    target = make_tiny_llama()
    target.save_pretrained(target_dir)
    target.config.name_or_path = str(target_dir)
    DraftModel.from_target(target, 1).save_pretrained(head_dir)
    path = auto_tree_cache_path(tmp_path / "cache", head_dir, target)
    assert auto_tree_cache_path(tmp_path / "cache", head_dir, target) == path

    make_tiny_llama(seed=1).save_pretrained(target_dir)  # fine-tuned in place
    weights = target_dir / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # coarse clocks
    assert auto_tree_cache_path(tmp_path / "cache", head_dir, target) != path


def test_auto_tree_for_a_saved_head_is_calibrated_once_cached_and_keyed_by_its_weights(tiny_llama, tmp_path):
    """``generate --tree auto``: calibrate on the built-in prompts, reuse the cached choice (whichever the measured
    costs made it), recalibrate on request or when the entry is damaged, a new entry when the head's weights change."""
    from specheads.decoding.tuning.auto_tree import BUILTIN_CALIBRATION_PROMPTS, auto_tree_cache_path, auto_tree_drafter
    from specheads.heads import DraftModel, load_head

    head_dir, cache = tmp_path / "draft", tmp_path / "cache"
    DraftModel.from_target(tiny_llama, tiny_llama.config.num_hidden_layers).save_pretrained(head_dir)
    head = load_head(head_dir, tiny_llama).eval()
    lines: list[str] = []
    first = auto_tree_drafter(head, head_dir, tiny_llama, CharTokenizer(), cache, log=lines.append)
    assert any(f"calibrating the head on {len(BUILTIN_CALIBRATION_PROMPTS)} built-in prompts" in x for x in lines)
    path = auto_tree_cache_path(cache, head_dir, tiny_llama)
    assert path.is_file() and first.auto is not None and first.tree.startswith("auto:")

    lines.clear()
    again = auto_tree_drafter(head, head_dir, tiny_llama, CharTokenizer(), cache, log=lines.append)
    assert lines == [] and again.auto == first.auto  # read back, nothing measured
    assert again.tree.startswith(f"auto, cached from {len(BUILTIN_CALIBRATION_PROMPTS)} built-in prompts:")
    assert (again.drafter is None) == (first.drafter is None) == (first.auto.num_nodes == 0)

    stamp = path.stat().st_mtime_ns
    auto_tree_drafter(head, head_dir, tiny_llama, CharTokenizer(), cache, recalibrate=True, log=lines.append)
    assert any("calibrating" in x and "then timing the target's verify cost on cpu-" in x for x in lines)
    assert path.stat().st_mtime_ns != stamp and not (cache / "cost_model").exists()  # no curve cached apart

    path.write_text("{not json")  # a damaged cache entry is measured again, not an error
    lines.clear()
    auto_tree_drafter(head, head_dir, tiny_llama, CharTokenizer(), cache, log=lines.append)
    assert any("calibrating" in x for x in lines) and isinstance(cached_choice(path), list)  # rewritten whole

    (head_dir / "checkpoints" / "step-1").mkdir(parents=True)  # training checkpoints are not part of the head
    (head_dir / "checkpoints" / "step-1" / "model.safetensors").write_bytes(b"other weights")
    assert auto_tree_cache_path(cache, head_dir, tiny_llama) == path

    retrained = DraftModel.from_target(tiny_llama, 1)
    retrained.save_pretrained(head_dir)
    assert auto_tree_cache_path(cache, head_dir, tiny_llama) != path  # new weights, new cache entry


def test_an_unwritable_cache_costs_a_recalibration_not_the_generation(tiny_llama, tmp_path):
    """``generate --tree auto`` with a cache folder it cannot write (here a file stands where the folder should be;
    a read-only or full disk fails the same way): the tree is chosen and used, the user told it was not cached."""
    from specheads.decoding.tuning.auto_tree import auto_tree_drafter
    from specheads.heads import DraftModel, load_head

    head_dir, cache = tmp_path / "draft", tmp_path / "cache"
    cache.write_text("not a folder")
    DraftModel.from_target(tiny_llama, 1).save_pretrained(head_dir)
    head = load_head(head_dir, tiny_llama).eval()
    lines: list[str] = []
    spec = auto_tree_drafter(head, head_dir, tiny_llama, CharTokenizer(), cache, log=lines.append)
    assert spec.auto is not None and any("auto tree: could not cache it (" in line for line in lines), lines
    assert cache.read_text() == "not a folder"


def test_auto_tree_caches_the_priced_lookup_solo_length_per_branch_size(tiny_llama, tmp_path):
    """``generate --tree auto --lookup-branch N --lookup-solo auto``: the solo length priced on the calibration run
    is cached with the tree for that N; a cached tree without it (another N) is calibrated again."""
    import json

    from specheads.decoding.lookup_branch import LookupBranchDrafter
    from specheads.decoding.tuning.auto_tree import auto_tree_cache_path, auto_tree_drafter
    from specheads.heads import DraftModel, load_head

    head_dir, cache = tmp_path / "draft", tmp_path / "cache"
    DraftModel.from_target(tiny_llama, tiny_llama.config.num_hidden_layers).save_pretrained(head_dir)
    head = load_head(head_dir, tiny_llama).eval()
    lines: list[str] = []

    def build(branch: int, solo):
        lines.clear()
        return auto_tree_drafter(
            head, head_dir, tiny_llama, CharTokenizer(), cache, log=lines.append, lookup_branch=branch, lookup_solo=solo
        )

    with pytest.raises(ValueError, match="2 to 3, or 'auto'; got 5"):  # before the calibration, not after it
        build(4, 5)
    assert lines == [] and not auto_tree_cache_path(cache, head_dir, tiny_llama).exists()
    first = build(4, "auto")
    record = json.loads(auto_tree_cache_path(cache, head_dir, tiny_llama).read_text())
    assert any("calibrating" in x for x in lines) and list(record["lookup_solo"]) == ["4"]
    # which tree wins depends on the measured costs; with no head tree (plain) the lookup chain drafts alone
    solo = first.drafter.solo_ngram if isinstance(first.drafter, LookupBranchDrafter) else None
    assert record["lookup_solo"]["4"] == solo
    again = build(4, "auto")
    assert lines == [] and type(again.drafter) is type(first.drafter) and again.auto == first.auto
    assert getattr(again.drafter, "solo_ngram", None) == solo
    assert ("lookup alone: auto, cached" in again.tree) == isinstance(first.drafter, LookupBranchDrafter)
    fixed = build(4, 3)  # a length given by the user needs no price: the cached tree serves
    assert lines == [] and getattr(fixed.drafter, "solo_ngram", 3) == 3
    build(6, "auto")
    assert any("no lookup-alone length priced for a 6-token branch" in x for x in lines)
    assert any("calibrating" in x for x in lines)
    record = json.loads(auto_tree_cache_path(cache, head_dir, tiny_llama).read_text())
    assert list(record["lookup_solo"]) == ["6"]  # recalibrated: prices made on the old calibration are dropped


def cached_choice(path):
    import json

    return json.loads(path.read_text())["choice"]["choices"]


def test_bench_auto_tree_is_cached_for_generate(tiny_llama, tmp_path, monkeypatch):
    """The benchmark's auto choice (calibrated on its held-out questions) is what ``generate --tree auto`` reuses."""
    from specheads.bench.cli import BenchSettings, build_methods
    from specheads.decoding.tuning.auto_tree import auto_tree_cache_path, auto_tree_drafter
    from specheads.heads import MedusaConfig, MedusaHeads, load_head

    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    head_dir = tmp_path / "medusa"
    MedusaHeads(MedusaConfig(num_heads=2, num_layers=1), tiny_llama).save_pretrained(head_dir)
    settings = BenchSettings(heads=[str(head_dir)], trees=["auto"], methods=[])
    prompts = [torch.randint(0, 128, (12,))]
    methods = build_methods(settings, tiny_llama, WordTokenizer(), prompts, "2 held-out questions")
    path = auto_tree_cache_path(tmp_path / "cache", head_dir, tiny_llama)
    assert path.is_file() and [m.name for m in methods] == ["generate", "specheads-medusa"]
    lines: list[str] = []
    head = load_head(head_dir, tiny_llama)
    spec = auto_tree_drafter(head, head_dir, tiny_llama, WordTokenizer(), tmp_path / "cache", log=lines.append)
    assert lines == [] and spec.tree.startswith("auto, cached from specheads bench on 2 held-out questions:")
    assert spec.auto is not None and spec.auto.choices == cached_choice(path)
    curve = methods[1].extra["cost_curve"]  # what the report prints: the curve the tree was priced on
    assert curve["device"].startswith("cpu-") and 13 <= curve["prefix_len"] <= 12 + 32  # the questions' context
    assert not (tmp_path / "cache" / "cost_model").exists()


def test_bench_lookup_solo_auto_is_cached_for_generate(tiny_llama, tmp_path, monkeypatch):
    """The benchmark's priced solo length (``--lookup-solo auto``) is cached with its tree for that branch size."""
    import json

    from specheads.bench.cli import BenchSettings, build_methods
    from specheads.decoding.tuning.auto_tree import auto_tree_cache_path, auto_tree_drafter
    from specheads.heads import DraftModel, load_head

    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    # a fixed cost curve, not this machine's measured one: under load that can make plain decoding win, and a head
    # with no tree has no +lookup-solo method (the measurement itself is tested above)
    monkeypatch.setattr("specheads.decoding.tuning.auto_tree.measure_cost_curve", lambda *_, **__: SLOW_FLAT)
    head_dir = tmp_path / "draft"
    DraftModel.from_target(tiny_llama, tiny_llama.config.num_hidden_layers).save_pretrained(head_dir)
    settings = BenchSettings(heads=[str(head_dir)], trees=["auto"], methods=[], lookup_branch=4, lookup_solo="auto")
    block = torch.randint(0, 128, (6,))
    methods = build_methods(settings, tiny_llama, WordTokenizer(), [block.repeat(3)], "1 held-out question")
    solo = next(m for m in methods if m.name.endswith("+lookup-solo"))
    record = json.loads(auto_tree_cache_path(tmp_path / "cache", head_dir, tiny_llama).read_text())
    assert list(record["lookup_solo"]) == ["4"]
    lines: list[str] = []
    head = load_head(head_dir, tiny_llama)
    spec = auto_tree_drafter(
        head,
        head_dir,
        tiny_llama,
        WordTokenizer(),
        tmp_path / "cache",
        log=lines.append,
        lookup_branch=4,
        lookup_solo="auto",
    )
    assert lines == [] and spec.drafter.solo_ngram == record["lookup_solo"]["4"]
    assert solo.name == "specheads-draft+lookup-solo"


def test_auto_tree_of_a_hub_head_is_keyed_by_its_snapshot(tiny_llama, tmp_path, monkeypatch):
    """A head given as a Hub id is fingerprinted from its downloaded files, not from a folder that does not exist."""
    from specheads.decoding.tuning.auto_tree import head_fingerprint
    from specheads.heads import MedusaConfig, MedusaHeads
    from tests.tiny_models import in_local_hub_cache

    torch.manual_seed(0)
    MedusaHeads(MedusaConfig(num_heads=2), tiny_llama).save_pretrained(tmp_path / "a")
    MedusaHeads(MedusaConfig(num_heads=3), tiny_llama).save_pretrained(tmp_path / "b")
    hub_a = in_local_hub_cache(tmp_path / "a", "someone/medusa-a", monkeypatch)
    hub_b = in_local_hub_cache(tmp_path / "b", "someone/medusa-b", monkeypatch)
    assert head_fingerprint(hub_a) == head_fingerprint(tmp_path / "a")
    assert head_fingerprint(hub_a) != head_fingerprint(hub_b)


def test_default_assistant_fits_a_target_with_fewer_layers_than_six(tiny_llama):
    """--assistant-layers 6 (the default) raised a HeadConfigError traceback for targets of 6 layers or fewer."""
    from specheads.bench.cli import BenchSettings, build_methods

    settings = BenchSettings(heads=[], methods=["hf-assisted"])
    methods = build_methods(settings, tiny_llama, WordTokenizer(), [torch.randint(0, 128, (8,))], "none")
    assisted = next(m for m in methods if m.name == "hf-assisted")
    layers = tiny_llama.config.num_hidden_layers
    assert layers < 6 and f"first {layers - 1} target layers" in assisted.description


def test_calibration_counts_no_guess_of_a_tree_the_context_could_not_hold(tiny_llama):
    """At the end of the context the generator verifies the root alone; the recorder counted the dropped tree's
    guesses against the target's next token as if they had been verified."""
    prompt = torch.randint(0, 128, (497,), generator=torch.Generator().manual_seed(1))
    whole_target = DraftModel.from_target(tiny_llama, tiny_llama.config.num_hidden_layers).eval()
    recorder = RecordingDrafter(DraftModelDrafter(whole_target, draft_length=3, min_length=3, max_length=3))
    generator = SpeculativeGenerator(tiny_llama, TinyTokenizer(), recorder)
    recorder.max_context = generator.max_context
    result = generator.generate(prompt, max_new_tokens=40)
    # three 3-token chains fit (at 497, 501, 505) and are all accepted; the three steps after verify the root alone
    assert result.stats.accepted_lengths == [3, 3, 3, 0, 0, 0]
    assert recorder.trials == [[3], [3], [3]] and recorder.hits == [[3], [3], [3]]
    assert [step.ranks for step in recorder.steps[0]] == [[0, 0, 0]] * 3 + [[]] * 3


def test_one_level_trees_are_priced_on_their_replayed_tau():
    """The acceptance model's depth-1 counts come from the wide calibration tree's harder positions (0.145 where a
    one-guess chain read 0.195, ``make demo``'s reference head): on a CPU that priced one guess below plain decoding
    and ``auto`` chose no tree where a one-guess chain ran 1.30x. Replayed taus price the one-level candidates."""
    low = RankAcceptance([[0.10, 0.05], [0.3, 0.1]])
    demo = CostCurve(SIZES, [0.035, 0.036, 0.043, 0.064, 0.085, 0.121, 0.196])  # `make demo`'s calibration timed it
    model_only = choose_tree(low, demo.at, DraftCost(per_depth_s=0.004))
    assert model_only.num_nodes == 0
    replayed = choose_tree(low, demo.at, DraftCost(per_depth_s=0.004), one_level_tau={1: 1.30, 2: 1.33})
    assert replayed.num_nodes == 1 and replayed.expected_tau == pytest.approx(1.30)
    by_nodes = {c["nodes"]: c for c in replayed.candidates}
    assert by_nodes[2]["expected_tau"] == pytest.approx(1.33)  # both siblings at depth 1: replayed
    deeper = next(c for c in replayed.candidates if c["depth"] == 2)
    assert deeper["expected_tau"] < 1.30  # a deeper tree keeps the model's estimate
