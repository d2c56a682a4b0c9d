"""``make demo`` wiring that can be checked without training: its data is committed, its config overrides are valid."""

from __future__ import annotations

import json

from specheads.bench import demo


def test_demo_data_is_committed_in_messages_format():
    first = json.loads(demo.DATA.read_text().splitlines()[0])
    assert [m["role"] for m in first["messages"]] == ["user", "assistant"]
    assert (demo.DATA.parent / "README.md").is_file()


def test_demo_training_overrides_are_a_valid_eagle3_config():
    from specheads.training.config import load_config

    cfg = load_config(demo.CONFIG, demo.TRAIN_OVERRIDES)
    assert cfg.head.type == "eagle" and cfg.head.options["version"] == 3
    assert cfg.data.paths == [str(demo.DATA)]
    assert cfg.train.output_dir == str(demo.HEAD_DIR)


def test_demo_bench_compares_against_plain_generate_with_the_noise_floor_beside_it():
    assert demo.BENCH.methods == ["specheads-plain"]  # the loop drafting nothing: what a head's speedup stands on
    assert demo.BENCH.heads == [str(demo.HEAD_DIR), str(demo.REFERENCE_HEAD), str(demo.REFERENCE_HEAD)]
    assert (demo.REFERENCE_HEAD / "config.json").is_file()  # committed: the demo benches it without training it
    assert demo.BENCH.lookup_branch == 5  # the head is also shown with a prompt-lookup branch (NAME+lookup)


def test_demo_shows_the_reference_head_under_auto_and_under_one_fixed_guess():
    """An auto tree priced out on a slow minute showed nothing of the reference head; one fixed guess always drafts."""
    from specheads.bench.lineup import head_method_names

    reference = f"specheads-{demo.REFERENCE_HEAD.name}"
    assert head_method_names(demo.BENCH) == [
        f"specheads-{demo.HEAD_DIR.name}",
        f"{reference}@auto",
        f"{reference}@chain:1",
    ]


def test_demo_checks_the_question_file_before_ten_minutes_of_training(tmp_path, monkeypatch, capsys):
    """Without Spec-Bench's questions the benchmark (the last stage) failed after training; --help ran the demo."""
    import pytest

    import specheads.shipped_data
    import specheads.target

    monkeypatch.setattr(specheads.target, "load_target", lambda *a, **k: pytest.fail("the demo started"))
    # a question file missing from where it is looked for
    monkeypatch.setattr(specheads.shipped_data, "DEFAULT_QUESTIONS", tmp_path / "missing" / "question.jsonl")
    assert demo.demo_main([]) == 2
    assert "no Spec-Bench question file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        demo.demo_main(["--help"])
    assert exit_info.value.code == 0 and "--questions" in capsys.readouterr().out


def _overall(tau: float, speedup: float) -> dict:
    return {"overall": {"tau": tau, "tokens_per_s": 20.0 * speedup, "speedup": speedup, "identical": 6, "compared": 6}}


def test_demo_summary_says_when_a_head_drafted_nothing(capsys):
    """An 80-step head whose auto tree is empty decodes as the plain loop: its row's speedup is not the head's."""
    report = {
        "baseline": "generate",
        "results": {"generate": _overall(1.0, 1.0), "weak": _overall(1.0, 1.1), "strong": _overall(1.35, 1.3)},
        "methods": {
            "generate": {"description": "transformers generate (baseline)"},
            "weak": {"auto_tree": {"choices": []}},
            "strong": {"auto_tree": {"choices": [[0]]}},
        },
    }
    demo.print_summary(report)
    lines = capsys.readouterr().out.splitlines()
    notes = [line for line in lines if "drafted nothing" in line]
    assert len(notes) == 1 and notes[0].startswith("  weak: its auto tree is empty"), lines
    assert "drafts anyway" not in notes[0], "the demo head has no fixed-tree row to point at"
    assert any(line.startswith("strong ") and "1.30x" in line for line in lines)


def test_demo_summary_points_an_empty_auto_row_at_its_fixed_tree_row(capsys):
    """The reference head is benched under auto and chain:1: an empty auto tree's note names the row that drafted."""
    report = {
        "baseline": "generate",
        "results": {
            "generate": _overall(1.0, 1.0),
            "specheads-ref@auto": _overall(1.0, 1.05),
            "specheads-ref@auto+lookup": _overall(1.0, 1.05),
            "specheads-ref@chain:1": _overall(1.35, 1.24),
        },
        "methods": {
            "generate": {"description": "transformers generate (baseline)"},
            "specheads-ref@auto": {"auto_tree": {"choices": []}},
            "specheads-ref@auto+lookup": {"auto_tree": {"choices": []}},
            "specheads-ref@chain:1": {"tree": "chain:1"},
        },
    }
    demo.print_summary(report)
    notes = [line for line in capsys.readouterr().out.splitlines() if "drafted nothing" in line]
    assert len(notes) == 2, notes
    assert notes[0].startswith("  specheads-ref@auto: its auto tree is empty")
    assert notes[0].endswith("; specheads-ref@chain:1 (a fixed tree) drafts anyway")
    # The +lookup variant's fixed twin would be specheads-ref@chain:1+lookup, which this report lacks.
    assert "drafts anyway" not in notes[1]
