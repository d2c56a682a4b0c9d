"""Resume: a run stopped after k steps and resumed ends with the same weights as an uninterrupted run."""

from __future__ import annotations

import gzip
import json

import pytest
import safetensors.torch
import torch

from specheads.heads import load_head
from specheads.target import load_target
from specheads.training.checkpoint import STATE_FILE, completed_checkpoints, latest_checkpoint
from specheads.training.config import load_config
from specheads.training.loop import train
from specheads.training.run_setup import EpochLengthGroupedSampler
from tests.training.train_helpers import REPO, tiny_overrides

EAGLE1 = REPO / "configs" / "eagle1" / "smollm2-135m.yaml"


def _weights(folder) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("group_by_length", [False, True], ids=["shuffled", "grouped-by-length"])
def test_resumed_run_matches_uninterrupted_run(tiny_target_dir, small_chat_file, tmp_path, group_by_length):
    # 8 training samples / batch 2 = 4 micro-batches per epoch; 2 micro-batches per step, so 6 steps cross epochs
    # and the stop at step 3 lands mid-epoch. Input noise checks that random draws line up after resuming too.
    common = ["loss.input_noise=0.2", "data.max_samples=16", f"train.group_by_length={group_by_length}"]
    train_kw = dict(max_steps=6, batch_size=2, grad_accum=2, save_every=3, keep_last=1, warmup_steps=1)
    full = load_config(EAGLE1, common + tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "full", **train_kw))
    full_result = train(full)
    assert full_result.finished and full_result.step == 6

    part_kw = dict(train_kw, stop_after=3)
    first = load_config(EAGLE1, common + tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "part", **part_kw))
    stopped = train(first)
    assert not stopped.finished and stopped.step == 3
    assert not (tmp_path / "part" / "model.safetensors").exists()  # no final head from a stopped run
    assert latest_checkpoint(tmp_path / "part").name == "step-00000003"

    (tmp_path / "part" / "checkpoints" / ".tmp-step-00000005").mkdir()  # a save killed half-way is ignored
    resumed_kw = dict(train_kw, resume="auto")
    second = load_config(
        EAGLE1, common + tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "part", **resumed_kw)
    )
    resumed = train(second)
    assert resumed.finished and resumed.step == 6

    expected, found = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    assert expected.keys() == found.keys()
    for name in expected:
        torch.testing.assert_close(found[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)
    assert [p.name for p in completed_checkpoints(tmp_path / "part")] == ["step-00000006"]  # keep_last=1

    target, _ = load_target(tiny_target_dir)
    head = load_head(tmp_path / "part", target)
    assert head.version == 1
    assert "## Training" in (tmp_path / "part" / "README.md").read_text()


def test_length_grouped_order_is_a_seeded_permutation_per_epoch():
    lengths = [int(x) for x in torch.randint(5, 500, (400,), generator=torch.Generator().manual_seed(0))]
    sampler = EpochLengthGroupedSampler(batch_size=4, lengths=lengths, seed=3)
    sampler.set_epoch(0)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    sampler.set_epoch(0)
    assert list(sampler) == first  # an epoch's order depends on the epoch only (what resume relies on)
    assert sorted(first) == sorted(second) == list(range(400)) and first != second

    def padded_tokens(order):
        return sum(4 * max(lengths[i] for i in order[b : b + 4]) for b in range(0, len(order), 4))

    shuffled = torch.randperm(400, generator=torch.Generator().manual_seed(1)).tolist()
    assert padded_tokens(first) < 0.75 * padded_tokens(shuffled)


def test_resume_on_data_that_grew_is_refused(tiny_target_dir, small_chat_file, tmp_path):
    """`specheads data generate` appends to its file: resuming a run after the file grew would redraw the held-out
    split over the new sample count (held-out samples end up trained on) and silently break the data order."""
    data = tmp_path / "chats.jsonl"
    lines = small_chat_file.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:24]))
    kw = dict(max_steps=4, batch_size=2, save_every=2)
    first = train(load_config(EAGLE1, tiny_overrides(tiny_target_dir, data, tmp_path / "run", **kw, stop_after=2)))
    assert first.step == 2 and latest_checkpoint(tmp_path / "run") is not None
    data.write_text("".join(lines[:34]))
    resume = tiny_overrides(tiny_target_dir, data, tmp_path / "run", **kw, resume="auto")
    with pytest.raises(ValueError, match=r"resuming from .* with other data than the run that wrote it"):
        train(load_config(EAGLE1, resume))
    data.write_text("".join(lines[:24]))  # the data it was made with: resumes
    assert train(load_config(EAGLE1, resume)).step == 4


def test_resume_from_the_same_data_under_another_path(tiny_target_dir, small_chat_file, tmp_path):
    """A run moved to another machine, or pointed at a gzipped copy of its file, resumes: the data digest, not the
    path's text, decides. A checkpoint without a digest cannot tell, so there a changed path is still refused."""
    kw = dict(max_steps=4, batch_size=2, save_every=2)
    first = train(
        load_config(EAGLE1, tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "run", **kw, stop_after=2))
    )
    assert first.step == 2
    moved = tmp_path / "elsewhere" / "chats.jsonl.gz"
    moved.parent.mkdir()
    moved.write_bytes(gzip.compress(small_chat_file.read_bytes()))
    resume = tiny_overrides(tiny_target_dir, moved, tmp_path / "run", **kw, resume="auto")

    state = latest_checkpoint(tmp_path / "run") / STATE_FILE
    recorded = json.loads(state.read_text())
    state.write_text(json.dumps({k: v for k, v in recorded.items() if k != "data_digest"}))  # an older checkpoint
    with pytest.raises(ValueError, match=r"settings that differ from the run that wrote it \(data.paths: "):
        train(load_config(EAGLE1, resume))

    state.write_text(json.dumps(recorded))
    resumed = train(load_config(EAGLE1, resume))
    assert resumed.finished and resumed.step == 4


def test_warm_start_continues_from_a_saved_head(tiny_target_dir, small_chat_file, tmp_path):
    """``head.init_from``: a second run starts from the first run's saved weights (not a fresh init) and trains on."""
    kw = dict(max_steps=2, batch_size=2, warmup_steps=1)
    first = train(
        load_config(
            EAGLE1, ["data.max_samples=16"] + tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "a", **kw)
        )
    )
    assert first.finished
    zero_lr = ["data.max_samples=16", f"head.init_from={tmp_path / 'a'}", "train.lr=0.0"]
    still = train(load_config(EAGLE1, zero_lr + tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "b", **kw)))
    assert still.finished
    saved, kept = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    for name in saved:  # lr 0: the warm-started head is exactly the saved one
        torch.testing.assert_close(kept[name], saved[name], msg=name)

    moved = ["data.max_samples=16", f"head.init_from={tmp_path / 'a'}"]
    train(load_config(EAGLE1, moved + tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "c", **kw)))
    trained = _weights(tmp_path / "c")
    assert any(not torch.equal(trained[name], saved[name]) for name in saved)  # gradients flow after a warm start

    # The finished head in `a` has no checkpoint (save_every=0): neither a resume nor a new run may train over it
    for resume in ("auto", "no"):
        again = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "a", **kw) + [f"train.resume={resume}"]
        with pytest.raises(ValueError, match=rf"train.resume={resume}.*holds a finished head .*head.init_from="):
            train(load_config(EAGLE1, again))
    torch.testing.assert_close(_weights(tmp_path / "a"), saved)

    wrong = ["data.max_samples=16", f"head.init_from={tmp_path / 'a'}", "head.options.version=3", "loss.input_noise=0"]
    with pytest.raises(ValueError, match="head.options disagree"):
        train(load_config(EAGLE1, wrong + tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "d", **kw)))
    medusa = REPO / "configs" / "medusa" / "smollm2-135m.yaml"
    with pytest.raises(ValueError, match="holds a 'eagle' head but head.type is 'medusa'"):
        train(load_config(medusa, moved + tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "e", **kw)))


def test_resume_refuses_settings_the_restored_state_overrides(tiny_target_dir, small_chat_file, tmp_path):
    """The restored optimizer and scheduler would keep the old learning rate while train_config.yaml and the model
    card record the new one: such changes are errors; a longer run and another logging cadence are not."""
    medusa = REPO / "configs" / "medusa" / "smollm2-135m.yaml"
    kw = dict(max_steps=2, batch_size=2, save_every=1, lr=0.01, scheduler="constant", warmup_steps=0)

    def run(*extra, **changes):
        overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path, **{**kw, **changes})
        return train(load_config(medusa, ["data.max_samples=16", *overrides, *extra]))

    assert run(stop_after=1).step == 1
    assert (latest_checkpoint(tmp_path) / "train_config.yaml").is_file()
    with pytest.raises(ValueError, match=r"differ from the run that wrote it \(train.lr: 0.01 -> 0.1\).*train_config"):
        run(resume="auto", lr=0.1)
    with pytest.raises(ValueError, match=r"\(head.options.num_heads: 3 -> 2; train.batch_size: 2 -> 4\)"):
        run("head.options.num_heads=2", resume="auto", batch_size=4)
    with pytest.raises(ValueError, match=r"train.max_steps: 2 -> 1 \(it may only grow\)"):
        run(resume="auto", max_steps=1)
    longer = run(resume="auto", max_steps=3, log_every=2, eval_every=3, save_every=2, keep_last=1)
    assert longer.finished and longer.step == 3


def test_resume_after_an_upgrade_that_added_a_setting(tiny_target_dir, small_chat_file, tmp_path):
    """A checkpoint whose saved config lacks a setting (here lora.heads_warmup_steps) ran with the setting's
    default, so resuming with the default continues it; another value of the
    new setting, or of any setting it did save, is still refused."""
    medusa = REPO / "configs" / "medusa" / "smollm2-135m.yaml"
    kw = dict(max_steps=2, batch_size=2, save_every=1)

    def run(*extra, **changes):
        overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path, **{**kw, **changes})
        return train(load_config(medusa, ["data.max_samples=16", "head.options.num_heads=1", *overrides, *extra]))

    assert run(stop_after=1).step == 1
    saved = latest_checkpoint(tmp_path) / "train_config.yaml"
    text = saved.read_text()
    assert "  heads_warmup_steps: 0\n" in text
    saved.write_text(text.replace("  heads_warmup_steps: 0\n", ""))  # a saved config without the setting
    with pytest.raises(ValueError, match=r"differ from the run that wrote it \(lora.heads_warmup_steps: 0 -> 5\)"):
        run("lora.heads_warmup_steps=5", resume="auto")
    with pytest.raises(ValueError, match=r"differ from the run that wrote it \(train.batch_size: 2 -> 4\)"):
        run(resume="auto", batch_size=4)
    resumed = run(resume="auto")
    assert resumed.finished and resumed.step == 2


def test_a_finished_run_resumed_keeps_its_head_and_numbers(tiny_target_dir, small_chat_file, tmp_path):
    """Resuming a run whose last checkpoint is at max_steps trains nothing; the head was re-saved with no metrics,
    which wiped the card's held-out numbers. It now evaluates, so the head and its numbers are the run's own."""
    overrides = tiny_overrides(tiny_target_dir, small_chat_file, tmp_path, max_steps=2, save_every=2, eval_every=2)
    first = train(load_config(EAGLE1, ["data.max_samples=16", *overrides]))
    card, weights = (tmp_path / "README.md").read_text(), _weights(tmp_path)
    assert "eval/tau" in card
    again = train(load_config(EAGLE1, ["data.max_samples=16", *overrides, "train.resume=auto"]))
    assert again.step == 2 and again.metrics == pytest.approx(first.metrics)
    assert "eval/tau" in (tmp_path / "README.md").read_text()
    torch.testing.assert_close(_weights(tmp_path), weights)


def test_another_runs_checkpoint_does_not_train_over_this_folder(tiny_target_dir, small_chat_file, tmp_path):
    """train.resume=CHECKPOINT of run A with train.output_dir holding run B's finished head trained over B's head;
    into a folder with checkpoints of its own, it mixed two runs' checkpoints. Both are refused; an empty folder takes
    the other run's checkpoint and goes on from it."""
    kw = dict(max_steps=2, save_every=2)
    train(
        load_config(
            EAGLE1, ["data.max_samples=16", *tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "a", **kw)]
        )
    )
    train(
        load_config(EAGLE1, ["data.max_samples=16", *tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "b")])
    )
    other = _weights(tmp_path / "b")
    from_a = f"train.resume={latest_checkpoint(tmp_path / 'a')}"
    more = dict(max_steps=3, save_every=2)
    with pytest.raises(ValueError, match=r"continues another run's checkpoint here, but .*b holds a finished head"):
        train(
            load_config(
                EAGLE1,
                [
                    "data.max_samples=16",
                    from_a,
                    *tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "b", **more),
                ],
            )
        )
    torch.testing.assert_close(_weights(tmp_path / "b"), other)
    train(
        load_config(
            EAGLE1, ["data.max_samples=16", *tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "c", **kw)]
        )
    )
    with pytest.raises(ValueError, match=r"checkpoint of another run than .*c's, whose .*holds checkpoints of its own"):
        train(
            load_config(
                EAGLE1,
                [
                    "data.max_samples=16",
                    from_a,
                    *tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "c", **more),
                ],
            )
        )
    forked = train(
        load_config(
            EAGLE1,
            ["data.max_samples=16", from_a, *tiny_overrides(tiny_target_dir, small_chat_file, tmp_path / "d", **more)],
        )
    )
    assert forked.finished and forked.step == 3
