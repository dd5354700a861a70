"""Accuracy regression guard: the analytic model on the dev reference runs must not get worse.

The figures are the ones reported in the README (``vramfit evaluate`` on runs-dev.jsonl, quality high and
medium, per-GPU scope). Improving them is welcome: lower the limits in the same commit.
"""

from __future__ import annotations

from pathlib import Path

from predictors.accuracy import ape_summary
from predictors.evaluation import evaluate, select_runs
from predictors.reference import parse_runs

# measured 2026-11-24 (autocast weight copies): median 13.0 %, p90 41.2 %, OOM 5/7 (small float tolerance)
MEDIAN_APE_LIMIT = 0.133
P90_APE_LIMIT = 0.416
OOM_RIGHT_MIN = 5


def test_dev_set_accuracy_does_not_regress(dev_runs_path: Path) -> None:
    runs = select_runs(parse_runs(dev_runs_path.read_text()), {"high", "medium"})
    ev = evaluate(runs)
    s = ev.summary()
    assert s["n"] >= 190
    assert s["median_ape"] <= MEDIAN_APE_LIMIT, s
    assert s["p90_ape"] <= P90_APE_LIMIT, s
    assert ev.oom_right >= OOM_RIGHT_MIN


def test_ape_summary_by_hand() -> None:
    s = ape_summary([(110, 100), (90, 100), (150, 100), (100, 100)])
    assert s["n"] == 4
    assert abs(s["median_ape"] - 0.10) < 1e-12
    assert abs(s["max_ape"] - 0.5) < 1e-12
    assert s["under_fraction"] == 0.25
    assert ape_summary([])["n"] == 0
