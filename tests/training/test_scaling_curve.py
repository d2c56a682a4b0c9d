"""scripts/scaling_curve.py writes its table and plot, alone and with another run's curve drawn beside it."""

from __future__ import annotations

import json

from tests.scripts_loader import load_script


def rows(scale: float) -> list[dict]:
    return [
        {
            "step": step,
            "target_tokens": 3 * tokens,
            "loss_tokens": tokens,
            "all": {"depth1": scale * step / 100, "depth2": scale * step / 200, "tau": 1 + scale * step / 100},
            "qa": {"depth1": 0.5, "depth2": 0.25, "tau": 1.5},
        }
        for step, tokens in ((25, 80_000), (50, 160_000))
    ]


def test_the_curve_table_and_plot_alone_and_compared(tmp_path):
    curve = load_script("scaling_curve.py")
    curve.write_outputs(rows(0.5), ["all", "qa"], 2, tmp_path / "alone")
    table = (tmp_path / "alone" / "curve.md").read_text()
    assert "| 50 | 160,000 | 0.250 | 0.125 | 1.25 |" in table
    assert "Depth-1 acceptance per category at step 50" in table and "| 0.250 | 0.500 |" in table
    assert json.loads((tmp_path / "alone" / "curve.json").read_text()) == rows(0.5)
    curve.write_outputs(rows(1.0), ["all"], 2, tmp_path / "compared", ("regen", ("fixed", rows(0.5))))
    png = tmp_path / "compared" / "curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > (tmp_path / "alone" / "curve.png").stat().st_size  # four more lines drawn


def test_token_counts_keep_growing_past_the_first_epoch():
    """A checkpoint in the third epoch has seen the data two times and part of a third, in each epoch's own order."""
    from types import SimpleNamespace

    script = load_script("scaling_curve.py")
    lengths, losses = [5, 9, 2, 7, 4], [3, 6, 1, 5, 2]
    for grouped in (False, True):
        tc = SimpleNamespace(batch_size=2, grad_accum=1, group_by_length=grouped, seed=0)
        totals = script.replay_tokens(lengths, losses, tc, 7)
        assert len(totals) == 9  # 3 steps an epoch (2 + 2 + 1 samples), whole epochs until step 7 is covered
        assert totals[2] == (27, 17) and totals[5] == (54, 34) and totals[8] == (81, 51)
        assert totals[5][0] < totals[6][0] < totals[8][0]


def test_a_step_of_several_micro_batches_spans_an_epochs_end_as_in_training():
    """With grad_accum or several processes a step takes several micro-batches from one stream across epochs; the
    replay started each epoch on a fresh step, so every point after the first epoch's end was off."""
    from types import SimpleNamespace

    script = load_script("scaling_curve.py")
    lengths, losses = [5, 9, 2, 7, 4], [3, 6, 1, 5, 2]  # micro-batches of 2: (5, 9) (2, 7) (4) each epoch, in order
    tc = SimpleNamespace(batch_size=2, grad_accum=2, group_by_length=False, seed=0)
    totals = script.replay_tokens(lengths, losses, tc, 3)
    assert totals[:3] == [(23, 15), (27 + 14, 17 + 9), (27 + 27, 17 + 17)]  # step 2: epoch 0's (4), epoch 1's (5, 9)
    assert (
        script.replay_tokens(lengths, losses, SimpleNamespace(**{**vars(tc), "grad_accum": 1}), 3, 2)[:3]
        == (totals[:3])
    )  # two processes of one micro-batch each consume the stream as one process accumulating two


def test_the_process_count_is_read_from_the_checkpoint(tmp_path):
    script = load_script("scaling_curve.py")
    (tmp_path / "trainer_state.json").write_text('{"step": 9, "num_processes": 4}')
    assert script.run_processes(tmp_path) == 4
    (tmp_path / "trainer_state.json").write_text('{"step": 9}')
    assert script.run_processes(tmp_path) == 1


def test_a_warm_started_run_counts_its_starting_heads_tokens():
    script = load_script("scaling_curve.py")
    shifted = script.offset_tokens(rows(0.5), 1_000_000)
    assert [row["loss_tokens"] for row in shifted] == [1_080_000, 1_160_000]
    assert all(row["base_loss_tokens"] == 1_000_000 for row in shifted)
    assert [row["target_tokens"] for row in shifted] == [240_000, 480_000]  # this run's own, unshifted
    assert script.offset_tokens(rows(0.5), 0)[0]["loss_tokens"] == 80_000


def test_an_answer_past_max_length_is_left_out_and_the_categories_stay_aligned(tiny_target_dir, tmp_path):
    """A benchmark prompt longer than max_length leaves no answer token, so the eval dataset drops it; the rows of the
    answers after it move up, and each category must still select its own answers."""
    from transformers import AutoTokenizer

    from specheads.training.data import DataConfig, build_datasets

    script = load_script("scaling_curve.py")
    tokenizer = AutoTokenizer.from_pretrained(tiny_target_dir)
    records = [
        {"id": str(i), "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "fine thanks"}]}
        for i, q in enumerate(["hi there", "long " * 200, "how are you"])
    ]
    data = tmp_path / "answers.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    dataset, _ = build_datasets(DataConfig(paths=[str(data)], max_length=64, eval_size=0), tokenizer)
    assert list(dataset["source"]) == [0, 2]
    groups = script.category_rows(list(dataset["source"]), records, {"0": "chat", "1": "summary", "2": "qa"})
    assert groups == {"chat": [0], "qa": [1]}
    assert "how are you" in tokenizer.decode(dataset[groups["qa"][0]]["input_ids"])  # the third answer's own row


def test_a_cached_measurement_is_reused_only_for_the_same_answers_groups_and_depths(tmp_path):
    """Before: the cache was keyed on the answers file's name only, so a rerun with --categories or more --depths
    read rows without those keys and failed writing the table (KeyError)."""
    script = load_script("scaling_curve.py")
    setting = {"data_sha256": "ab", "groups": {"all": 24}, "depths": 3}
    path = tmp_path / "acceptance-specbench.json"
    assert script.cached_row(path, setting) is None  # nothing measured yet
    path.write_text(json.dumps(rows(0.5)[0] | {"measured_with": setting}))
    assert script.cached_row(path, setting) == rows(0.5)[0]
    for changed in ({"groups": {"all": 24, "qa": 4}}, {"depths": 4}, {"data_sha256": "cd"}):
        assert script.cached_row(path, setting | changed) is None
    path.write_text(json.dumps(rows(0.5)[0]))  # written before measurements recorded their setting
    assert script.cached_row(path, setting) is None
