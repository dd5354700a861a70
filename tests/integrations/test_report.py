from __future__ import annotations

import json
import math

import pytest

from predictors.accuracy import ape_summary
from predictors.reference import parse_runs
from scheduler.cli import main
from scheduler.integrations.ledger import SqliteLedger
from scheduler.integrations.records import ActualIn, DecisionIn
from tests.integrations.payloads import GIB, decision_payload


def test_ape_summary_figures():
    s = ape_summary([(110, 100), (90, 100), (100, 200), (100, 0)])
    assert s["n"] == 3  # measured 0 is skipped
    assert s["median_ape"] == pytest.approx(0.1)
    assert s["max_ape"] == pytest.approx(0.5)
    assert s["bias"] == pytest.approx(-0.1)
    assert s["under_fraction"] == pytest.approx(2 / 3)
    assert math.isnan(ape_summary([])["median_ape"])


@pytest.fixture
def filled_ledger(ledger_path):  # type: ignore[no-untyped-def]
    ledger = SqliteLedger(ledger_path)
    for i, (factor, pool) in enumerate([(0.9, "a100"), (1.1, "a100"), (1.3, "h100")]):
        body = decision_payload(f"d{i}", pool=pool)
        body["peak_vram_upper_bytes"] = int(body["peak_vram_bytes"] * 1.15)  # a fixed bound for the figures
        ledger.record_decision(DecisionIn.model_validate(body))
        ledger.record_actual(ActualIn(decision_id=f"d{i}", peak_vram_bytes=int(body["peak_vram_bytes"] * factor),
                                      peak_reserved_bytes=int(body["peak_reserved_bytes"] * factor),
                                      runtime_seconds=1800.0, oom=False, source="reporter"))
    ledger.record_actual(ActualIn(decision_id="unknown", peak_vram_bytes=GIB, runtime_seconds=1.0, oom=False,
                                  source="dcgm"))
    ledger.close()
    return ledger_path


def test_report_json_and_export(filled_ledger, tmp_path, capsys):
    export = tmp_path / "runs.jsonl"
    assert main(["report", "--ledger", str(filled_ledger), "--format", "json", "--by", "pool",
                 "--export", str(export)]) == 0
    out = json.loads(capsys.readouterr().out)
    device = out["accuracy"]["device"]
    assert device["n"] == 3
    assert device["median_ape"] == pytest.approx(0.1 / 0.9, rel=1e-3)  # APEs 0.1/0.9, 0.1/1.1, 0.3/1.3
    assert device["under_fraction"] == pytest.approx(2 / 3)
    assert out["accuracy"]["runtime"]["bias"] == pytest.approx(1.0)  # predicted 3600 s, measured 1800 s
    assert out["accuracy"]["runtime"]["n"] == 3
    assert out["accuracy"]["allocated"]["n"] == 0 and out["accuracy"]["allocated"]["median_ape"] is None
    assert out["pending_actuals"] == 1 and out["with_actuals"] == 3
    assert out["upper_bound_exceeded_fraction"] == pytest.approx(1 / 3)  # 1.3 x > 1.15 x
    assert set(out["by_pool"]) == {"a100", "h100"}
    assert out["export"]["written"] == 3
    runs = parse_runs(export.read_text())
    assert {r.source_id for r in runs} == {"vramfit_ledger"}
    assert all(r.measured.metric == "nvml" for r in runs)


def test_report_table(filled_ledger, capsys):
    assert main(["report", "--ledger", str(filled_ledger)]) == 0
    text = capsys.readouterr().out
    assert "decisions 3, with actuals 3" in text
    assert "device" in text and "reserved" in text


def test_report_without_ledger(tmp_path, capsys):
    assert main(["report", "--ledger", str(tmp_path / "none.sqlite")]) == 2
    assert "no ledger" in capsys.readouterr().err


def test_runtime_accuracy_counts_only_jobs_that_ran_to_their_end(ledger_path, capsys):
    """A job that failed or ran out of memory stopped early: its runtime is not compared with the prediction."""
    ledger = SqliteLedger(ledger_path)
    for name, fields in (("done", {"exit_reason": "Completed"}), ("manual", {}), ("oom", {"oom": True}),
                         ("error", {"exit_reason": "Error"})):
        ledger.record_decision(DecisionIn.model_validate(decision_payload(name)))
        ledger.record_actual(ActualIn(decision_id=name, peak_vram_bytes=GIB, runtime_seconds=1800.0,
                                      **{"oom": False, "source": "reporter", **fields}))
    ledger.close()
    assert main(["report", "--ledger", str(ledger_path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["accuracy"]["runtime"]["n"] == 2
    assert out["accuracy"]["device"]["n"] == 3  # the OOM job's reading is where it stopped, not its peak
