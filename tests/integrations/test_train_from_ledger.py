"""``vramfit train --ledger`` reads the ledger file itself (SQLite, as ``vramfit serve --ledger`` writes it), not
only its JSONL export: one command from a cluster's actuals to its own residual models."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.integrations.ledger import SqliteLedger
from scheduler.integrations.records import STORED, ActualIn, DecisionIn
from tests.integrations.payloads import decision_payload


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


def test_train_reads_the_ledger_file(tmp_path: Path, dev_runs_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "vramfit-ledger.sqlite"
    _cluster_ledger(ledger, 24)
    vram, runtime = tmp_path / "vram.skops", tmp_path / "runtime.skops"
    assert main(["train", "--runs", str(dev_runs_path), "--ledger", str(ledger), "--out", str(vram),
                 "--runtime-out", str(runtime), "--no-cv"]) == 0
    printed = capsys.readouterr().out
    assert f"ledger {ledger}: 24 joined actuals (skipped: none)" in printed
    assert "site stage: 24 ledger actuals; offsets" in printed
    assert "site stage: 24 ledger actuals; throughput offsets" in printed
    site = json.loads(vram.with_suffix(".json").read_text())["site"]
    assert site["offset_used"] and all(0.15 < v < 0.25 for v in site["offsets"].values())  # ln 1.25 = 0.22
    runtime_site = json.loads(runtime.with_suffix(".json").read_text())["site"]
    assert runtime_site["offset_used"] and all(-0.3 < v < -0.15 for v in runtime_site["offsets"].values())


def test_the_ledger_file_is_only_read(tmp_path: Path, dev_runs_path: Path) -> None:
    """A copy of a live ledger is read without a write: the same bytes after, nothing in its write-ahead log
    (a reader of a WAL database may leave SQLite's empty -wal/-shm files beside it; those are SQLite's own)."""
    ledger = tmp_path / "ledgers" / "copy.sqlite"
    ledger.parent.mkdir()
    _cluster_ledger(ledger, 6)
    before = ledger.read_bytes()
    assert main(["train", "--runs", str(dev_runs_path), "--ledger", str(ledger), "--out", str(tmp_path / "m.skops"),
                 "--no-cv"]) == 0
    assert ledger.read_bytes() == before
    wal = ledger.with_name("copy.sqlite-wal")
    assert not wal.exists() or wal.stat().st_size == 0


@pytest.mark.parametrize("damage", ["header only", "another database", "damaged pages"])
def test_a_file_that_is_no_ledger_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   damage: str) -> None:
    broken = tmp_path / "ledger.sqlite"
    if damage == "header only":
        broken.write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)
    elif damage == "another database":
        with sqlite3.connect(broken) as db:
            db.execute("CREATE TABLE notes (text TEXT)")
        db.close()
    else:
        _cluster_ledger(broken, 6)
        data = bytearray(broken.read_bytes())
        data[4096:8192] = b"\xff" * 4096  # a page of the tables overwritten
        broken.write_bytes(bytes(data))
    before = broken.read_bytes()
    runs = tmp_path / "runs.jsonl"
    runs.write_text("", encoding="utf-8")
    assert main(["train", "--runs", str(runs), "--ledger", str(broken), "--out", str(tmp_path / "m.skops")]) == 2
    err = capsys.readouterr().err
    assert "--ledger" in err and str(broken) in err and "Traceback" not in err
    assert broken.read_bytes() == before  # nothing added to a file that is not ours


def test_a_ledger_in_a_place_it_cannot_write_is_read_as_a_snapshot(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A WAL ledger's readers need an index file beside it; where SQLite cannot create one (a read-only volume),
    the file is read as an immutable snapshot instead of failing."""
    from scheduler.integrations import ledger as ledger_module

    path = tmp_path / "ledger.sqlite"
    _cluster_ledger(path, 3)
    real_connect = sqlite3.connect
    uris: list[str] = []

    def connect(database: str, *args: object, **kwargs: object) -> sqlite3.Connection:
        uris.append(database)
        if "immutable=1" not in database:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        return real_connect(database, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger_module.sqlite3, "connect", connect)
    ledger = SqliteLedger(path, read_only=True)
    try:
        assert len(ledger.joined_rows()) == 3
    finally:
        ledger.close()
    assert [u.endswith("?mode=ro") for u in uris] == [True, False] and uris[1].endswith("&immutable=1")


def test_a_few_ledger_actuals_do_not_move_the_reference_margins(tmp_path: Path, dev_runs_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """One job that ran 4x longer than predicted was a group weighing as much as a published source: it doubled
    every runtime bound. Below the site stage's minimum the ledger's actuals are held back, and train says so."""
    ledger_path = tmp_path / "vramfit-ledger.sqlite"
    ledger = SqliteLedger(ledger_path)
    body = decision_payload("slow", {"model": "llama-3.2-1b", "method": "lora", "gpu": "A100-80GB",
                                     "train_tokens": 5e7})
    ledger.record_decision(DecisionIn.model_validate(body))
    ledger.record_actual(ActualIn(decision_id="slow", peak_vram_bytes=int(body["peak_vram_bytes"]),
                                  runtime_seconds=body["runtime_seconds"] * 4, oom=False, exit_reason="Completed",
                                  source="reporter"))
    ledger.close()
    with_ledger, without = tmp_path / "with.skops", tmp_path / "without.skops"
    assert main(["train", "--runs", str(dev_runs_path), "--ledger", str(ledger_path),
                 "--out", str(tmp_path / "v.skops"), "--runtime-out", str(with_ledger), "--no-cv"]) == 0
    assert "site stage: 1 ledger actuals, fewer than 5: not used" in capsys.readouterr().out
    assert main(["train", "--runs", str(dev_runs_path), "--out", str(tmp_path / "v2.skops"),
                 "--runtime-out", str(without), "--no-cv"]) == 0
    quantile = [json.loads(p.with_suffix(".json").read_text())["conformal_quantile"] for p in (with_ledger, without)]
    assert quantile[0] == pytest.approx(quantile[1])


def _nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(("damage", "named"), [
    # a damaged timestamp column: OverflowError, OSError, TypeError from fromtimestamp were tracebacks (exit 1)
    ("UPDATE decisions SET decided_at = 1e30 WHERE decision_id = 'job-3'", "decisions left out (job-3: `decided_at`"),
    ("UPDATE decisions SET recorded_at = 1e17 WHERE decision_id = 'job-3'", "decisions left out (job-3: `recorded_at`"),
    ("UPDATE actuals SET received_at = 'x' WHERE job_ref = 'id:job-3'",
     "actuals left out (id:job-3 (reporter): `received_at`"),
    # features stored 250 levels deep (accepted before their bound): the whole ledger was refused (exit 2)
    ("deep features", "decisions left out (job-3: Invalid JSON: recursion limit exceeded"),
])
def test_an_unreadable_row_is_left_out_with_a_warning_and_the_rest_trains(
        tmp_path: Path, dev_runs_path: Path, capsys: pytest.CaptureFixture[str], damage: str, named: str) -> None:
    ledger = tmp_path / "vramfit-ledger.sqlite"
    _cluster_ledger(ledger, 8)
    if damage == "deep features":
        stored = SqliteLedger(ledger)
        body = decision_payload("job-3") | {"features": {"x": _nested(250)}}
        stored.record_decision(DecisionIn.model_validate(body, context=STORED))  # as the older vramfit stored it
        stored.close()
    else:
        with sqlite3.connect(ledger) as db:
            db.execute(damage)
        db.close()
    assert main(["train", "--runs", str(dev_runs_path), "--ledger", str(ledger), "--out", str(tmp_path / "m.skops"),
                 "--no-cv"]) == 0
    captured = capsys.readouterr()
    assert f"vramfit train: warning: ledger {ledger}: 1 unreadable {named}" in captured.err, captured.err
    assert "Traceback" not in captured.err
    assert f"ledger {ledger}: 7 joined actuals" in captured.out
    assert "site stage: 7 ledger actuals" in captured.out
