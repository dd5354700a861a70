"""``vramfit train --ledger`` reads the ledger file itself (SQLite, as ``vramfit serve --ledger`` writes it), not
only its JSONL export: one command from a cluster's actuals to its own residual models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.integrations.ledger import SqliteLedger
from scheduler.integrations.records import ActualIn, DecisionIn
from tests.integrations.payloads import decision_payload

DEV_RUNS = next((p for p in (Path(__file__).resolve().parents[3] / "shared" / "reference" / "runs-dev.jsonl",
                             Path(__file__).resolve().parents[4] / "shared" / "reference" / "runs-dev.jsonl")
                 if p.exists()), None)


def _cluster_ledger(path: Path, jobs: int) -> None:
    """Jobs whose device peak is 25 % above the prediction and that run at 80 % of the predicted throughput."""
    ledger = SqliteLedger(path)
    for i in range(jobs):
        spec = {"model": "llama-3.2-1b", "method": ("lora", "full")[i % 2], "gpu": "A100-80GB",
                "seq_len": 512 * (1 + i % 4), "micro_batch_size": 1 + i % 3, "train_tokens": 5e7}
        body = decision_payload(f"job-{i}", spec)
        ledger.record_decision(DecisionIn.model_validate(body))
        ledger.record_actual(ActualIn(decision_id=f"job-{i}", peak_vram_bytes=int(body["peak_vram_bytes"] * 1.25),
                                      runtime_seconds=body["runtime_seconds"] / 0.8, oom=False,
                                      exit_reason="Completed", source="reporter"))
    ledger.close()


def test_train_reads_the_ledger_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if DEV_RUNS is None:
        pytest.skip("shared/reference/runs-dev.jsonl not found")
    ledger = tmp_path / "vramfit-ledger.sqlite"
    _cluster_ledger(ledger, 24)
    vram, runtime = tmp_path / "vram.skops", tmp_path / "runtime.skops"
    assert main(["train", "--runs", str(DEV_RUNS), "--ledger", str(ledger), "--out", str(vram),
                 "--runtime-out", str(runtime), "--no-cv"]) == 0
    printed = capsys.readouterr().out
    assert f"ledger {ledger}: 24 joined actuals (skipped: none)" in printed
    assert "site stage: 24 ledger actuals; offsets" in printed
    assert "site stage: 24 ledger actuals; throughput offsets" in printed
    site = json.loads(vram.with_suffix(".json").read_text())["site"]
    assert site["offset_used"] and all(0.15 < v < 0.25 for v in site["offsets"].values())  # ln 1.25 = 0.22
    runtime_site = json.loads(runtime.with_suffix(".json").read_text())["site"]
    assert runtime_site["offset_used"] and all(-0.3 < v < -0.15 for v in runtime_site["offsets"].values())


def test_a_broken_ledger_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "ledger.sqlite"
    broken.write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)
    runs = tmp_path / "runs.jsonl"
    runs.write_text("", encoding="utf-8")
    assert main(["train", "--runs", str(runs), "--ledger", str(broken), "--out", str(tmp_path / "m.skops")]) == 2
    err = capsys.readouterr().err
    assert "--ledger" in err and str(broken) in err
