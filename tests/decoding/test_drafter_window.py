"""The windowed EAGLE drafter cache (sinks + recent rows): bounded, true positions, and lossless decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specheads.decoding.draft import Sampling
from specheads.decoding.eagle_draft import DrafterWindow, EagleTreeDrafter, with_drafter_window
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.lookup_branch import LookupBranchDrafter
from specheads.decoding.tree import DynamicTreeConfig
from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads
from specheads.heads.masks import blocked_value, causal_additive_mask
from tests.decoding.helpers import TinyTokenizer
from tests.decoding.planted import PlantedDrafter, greedy_continuation

LONG_QUESTIONS = Path(__file__).resolve().parents[2] / "data" / "long_context" / "questions.jsonl"


class CacheProbe:
    """Wraps an EAGLE drafter and records, after every proposal, the committed rows its cache holds and its whole
    length (the tree rows included)."""

    def __init__(self, inner: EagleTreeDrafter) -> None:
        self.inner, self.head, self.layer_ids = inner, inner.head, inner.layer_ids
        self.held: list[int] = []
        self.lengths: list[int] = []
        self.states: list = []

    def begin(self, prompt_ids, hidden_states, root, sampling, generator):
        state = self.inner.begin(prompt_ids, hidden_states, root, sampling, generator)
        self.states.append(state)
        return state

    def propose(self, state):
        tree = self.inner.propose(state)
        self.held.append(state.cache_len - state.evicted)
        self.lengths.append(state.cache.get_seq_length())
        return tree

    def observe(self, state, fed_tokens, hidden_states, root):
        self.inner.observe(state, fed_tokens, hidden_states, root)


def windowed_eagle(target, version: int, window: DrafterWindow | None) -> EagleTreeDrafter:
    torch.manual_seed(version)
    head = EagleHead(EagleConfig(version=version), target).eval()
    return EagleTreeDrafter(head, DynamicTreeConfig(3, 2, 5), window)


@pytest.mark.parametrize("version", [1, 3])
@torch.inference_mode()
def test_windowed_drafter_keeps_true_positions(tiny_llama, version):
    """After a long prompt, the root's drafter feature is what the full drafter computes when the last row sees only
    the sink and recent rows at their own positions (a one-layer drafter's keys do not depend on what rows saw), and
    the cache keeps exactly the sink and recent rows."""
    window = DrafterWindow(sinks=3, recent=8)
    drafter = windowed_eagle(tiny_llama, version, window)
    prompt = torch.randint(0, 128, (30,), generator=torch.Generator().manual_seed(1))
    hidden = tiny_llama(input_ids=prompt.unsqueeze(0), output_hidden_states=drafter.layer_ids).hidden_states
    state = drafter.begin(prompt, hidden, 11, Sampling(), None)
    drafter.flush(state)
    assert state.cache_len == 30 and state.evicted == 30 - 11 and state.cache.get_seq_length() == 11
    next_tokens = torch.cat([prompt[1:], torch.tensor([11])]).unsqueeze(0)
    mask = causal_additive_mask(30, 0, torch.float32, "cpu").clone()
    # fed in chunks of 8: rows 24-29 come last, after rows 8-15 were evicted; the last row sees rows 0-2 and 16-29
    mask[0, 0, -1, 3:16] = blocked_value(torch.float32)
    features = drafter.head.fuse(hidden)
    reference, logits = drafter.head(features, next_tokens, torch.arange(30).unsqueeze(0), attention_mask=mask)
    torch.testing.assert_close(state.hidden[0, -1], reference[0, -1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.logits, logits[0, -1], atol=1e-4, rtol=1e-4)
    unwindowed = windowed_eagle(tiny_llama, version, None)
    full = unwindowed.begin(prompt, hidden, 11, Sampling(), None)
    unwindowed.flush(full)
    kept = torch.cat([torch.arange(3), torch.arange(22, 30)])
    for ours, theirs in zip(state.cache.layers, full.cache.layers):  # the kept keys are the full cache's rows
        torch.testing.assert_close(ours.keys, theirs.keys[:, :, kept], atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_windowed_drafter_is_lossless_and_bounded(tiny_llama):
    """Greedy output equals the target's generate (accepted paths planted on every other step), and the drafter's
    cache never holds more than sinks + recent committed rows, or that plus one tree's rows while drafting."""
    window, tree_rows = DrafterWindow(sinks=2, recent=8), 2 * 2  # depth 3, top_k 2: two expansions of two rows
    prompt = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(2))
    expected = greedy_continuation(tiny_llama, prompt, 48)
    for drafter in (windowed_eagle(tiny_llama, 3, window), LookupBranchDrafter(windowed_eagle(tiny_llama, 1, window))):
        eagle = drafter if isinstance(drafter, EagleTreeDrafter) else drafter.inner
        probe = CacheProbe(eagle)
        if isinstance(drafter, LookupBranchDrafter):
            drafter.inner = probe
        else:
            drafter = probe
        planted = PlantedDrafter(drafter, expected)
        result = SpeculativeGenerator(tiny_llama, TinyTokenizer(), planted).generate(prompt, max_new_tokens=48)
        assert result.token_ids == expected
        (state,) = probe.states
        assert state.cache_len > 40 + len(expected) // 2 and state.evicted == state.cache_len - 10
        assert len(probe.held) > 10 and max(probe.held) == 10
        assert max(probe.lengths) <= 10 + tree_rows


def test_window_reaches_the_eagle_drafter_inside_a_lookup_branch(tiny_llama):
    window = DrafterWindow(4, 16)
    branch = with_drafter_window(LookupBranchDrafter(windowed_eagle(tiny_llama, 3, None)), window)
    assert branch.inner.window == window and isinstance(branch, LookupBranchDrafter)
    assert with_drafter_window(windowed_eagle(tiny_llama, 3, None), window).window == window
    with pytest.raises(ValueError, match="bounds an EAGLE drafter"):
        with_drafter_window(object(), window)
    with pytest.raises(ValueError, match="recent >= 1"):
        DrafterWindow(4, 0)


@pytest.mark.slow
@torch.inference_mode()
def test_windowed_drafter_on_a_long_smollm2_prompt(smollm2):
    """SmolLM2 on the 4k-token 'continue' question of the long-context set: the same greedy tokens as generate with
    a 4 + 256-row drafter window, whose cache stays bounded."""
    model, tokenizer = smollm2
    record = next(
        r
        for r in map(json.loads, LONG_QUESTIONS.read_text().splitlines())
        if r["category"] == "long-4k" and r["task"] == "continue"
    )
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": record["turns"][0]}], add_generation_prompt=True, return_tensors="pt"
    )["input_ids"][0]
    expected = greedy_continuation(model, ids, 32)
    probe = CacheProbe(windowed_eagle(model, 3, DrafterWindow(sinks=4, recent=256)))
    result = SpeculativeGenerator(model, tokenizer, PlantedDrafter(probe, expected)).generate(ids, max_new_tokens=32)
    assert result.token_ids == expected
    assert ids.numel() > 4000 and max(probe.held) == 260


def test_bench_runs_an_eagle_head_with_and_without_the_window(tmp_path, capsys):
    """``specheads bench --drafter-window`` adds NAME+window beside an EAGLE head, with the same greedy outputs, and
    leaves the other heads as they are (a Medusa head beside it stopped the run after the target had loaded)."""
    from specheads.bench.cli import bench_main
    from specheads.target import load_target
    from tests.tiny_models import save_tiny_target

    target_dir = save_tiny_target(tmp_path / "target", num_layers=4)
    target, _ = load_target(str(target_dir), device="cpu")
    EagleHead(EagleConfig(version=3), target).save_pretrained(tmp_path / "eagle")
    MedusaHeads(MedusaConfig(num_heads=2), target).save_pretrained(tmp_path / "medusa")
    questions = tmp_path / "questions.jsonl"
    turns = ["Summarise: " + "the sea is wide and the sea is deep. " * 12, "Repeat: one two three one two three."]
    questions.write_text(
        "".join(
            json.dumps({"question_id": i, "category": "long", "turns": [t]}) + "\n" for i, t in enumerate(turns, 500)
        )
    )
    out = tmp_path / "out"
    argv = ["--target", str(target_dir), "--questions", str(questions), "--device", "cpu", "--out", str(out)]
    argv += ["--max-new-tokens", "12", "--no-progress", "--methods"]
    argv += ["--head", str(tmp_path / "eagle"), "--head", str(tmp_path / "medusa")]
    argv += ["--tree", "dynamic:3,2,5", "--tree", "chain:2", "--drafter-window", "8", "--drafter-sinks", "2"]
    assert bench_main(argv) == 0  # 1 if an output differed from generate's
    assert f"--drafter-window adds no method for {tmp_path / 'medusa'}" in capsys.readouterr().err
    report = json.loads((out / "results.json").read_text())
    assert list(report["results"]) == ["generate", "specheads-eagle", "specheads-eagle+window", "specheads-medusa"]
    assert "drafter cache 2 + 8 rows" in report["methods"]["specheads-eagle+window"]["description"]
