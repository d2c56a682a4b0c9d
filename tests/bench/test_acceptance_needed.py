"""``scripts/acceptance_needed.py``: the step model reproduces the run it is anchored on and prices longer chains
from the report's cost curve."""

from __future__ import annotations

import pytest

from tests.scripts_loader import load_script

script = load_script("acceptance_needed.py")


def _report() -> dict:
    """A head with one guess a step: 100 steps over 2 prompts, tau 1.3, 1.2x; a verify costs 10 ms a new token."""
    curve = {"sizes": [1, 2, 3, 4, 8], "seconds": [0.010, 0.010, 0.020, 0.030, 0.070]}
    overall = {"target_forwards": 102, "prompts": 2, "verify_s": 1.02, "draft_s": 0.2, "other_s": 0.1, "tau": 1.3,
               "speedup": 1.2, "acceptance_per_depth": [0.3]}  # fmt: skip
    return {"methods": {"head": {"cost_curve": curve, "auto_tree": {"choices": [[0]]}}},
            "results": {"head": {"overall": overall}}}  # fmt: skip


def test_the_model_reproduces_its_anchor_and_prices_longer_chains():
    model = script.StepModel(_report(), "head")
    assert model.verify(1) == pytest.approx(0.010)  # 1.02 s over 102 forwards, the curve's 2 tokens
    assert (model.draft_per_depth, model.other) == (pytest.approx(0.002), pytest.approx(0.001))
    assert model.speedup(0.3, 1) == pytest.approx(1.2)  # the measured run
    # a chain of 3 at a = 0.9: tau 1 + .9 + .81 + .729, verify of 4 tokens 30 ms + 3 drafter steps + the loop
    expected = 1.2 * (3.439 / 1.3) * (0.013 / (0.030 + 3 * 0.002 + 0.001))
    assert model.speedup(0.9, 3) == pytest.approx(expected)
    assert model.best(0.3) == (pytest.approx(1.2), 1)  # one guess is the best chain at the measured acceptance


def test_a_head_without_an_auto_tree_is_refused():
    report = _report()
    report["methods"]["head"]["auto_tree"]["choices"] = []
    with pytest.raises(SystemExit, match="expected a head run with --tree auto"):
        script.StepModel(report, "head")
