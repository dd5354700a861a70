"""`vramfit report` and the collector, from an audit of the predictions-vs-actuals side: runtimes no GPU could
reach, OOM readings, unreadable ledgers, one read of a large ledger, `collect --once`, DCGM series scraped without
honor_labels."""

from __future__ import annotations

import json
import math
import random
import sqlite3
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from predictors.reference import parse_runs
from scheduler.cli import main
from scheduler.integrations.ledger import SqliteLedger
from scheduler.integrations.prom_actuals import MIB, pod_regex, query_device_peak
from scheduler.integrations.records import STORED, ActualIn, DecisionIn
from tests.integrations.payloads import GIB, decision_payload
from tests.integrations.processes import (
    NO_PROMETHEUS,
    PROMETHEUS,
    FakeDcgmExporter,
    free_port,
    stop_process,
    wait_until,
)

# The reason the export gives (scheduler.integrations.ledger.RUNTIME_ABOVE_PEAK), spelled out as users read it.
RUNTIME_ABOVE_PEAK = "throughput above the GPUs' peak FLOP/s (the runtime cannot be the whole job's)"
# 50 M tokens of Llama-3.2-1B LoRA on one A100: predicted at about 27 minutes.
TOKENS_SPEC = {"model": "llama-3.2-1b", "method": "lora", "gpu": "A100-80GB", "train_tokens": 50_000_000}


def _decide(ledger: SqliteLedger, decision_id: str, spec: dict[str, Any] | None = None, **fields: Any) -> DecisionIn:
    body = decision_payload(decision_id, spec=spec, **fields)
    decision = DecisionIn.model_validate(body)
    ledger.record_decision(decision)
    return decision


def _report_json(ledger_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert main(["report", "--ledger", str(ledger_path), "--format", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_a_runtime_no_gpu_could_reach_is_left_out_of_the_report_as_of_the_export(
        ledger_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reporter's smoke test without a GPU posts 1.5 s, Completed, for a job predicted at half an hour: the
    export already drops that throughput (above the A100's dense peak); the report scored it as a runtime error of
    tens of thousands of percent."""
    ledger = SqliteLedger(ledger_path)
    for name, runtime_seconds in (("smoke", 1.5), ("real", 2400.0)):
        _decide(ledger, name, spec=TOKENS_SPEC, predicted_runtime_seconds=1800.0)
        ledger.record_actual(ActualIn(decision_id=name, peak_vram_bytes=None, runtime_seconds=runtime_seconds,
                                      oom=False, exit_reason="Completed", source="reporter"))
    ledger.close()
    export = tmp_path / "runs.jsonl"
    out = _report_json(ledger_path, capsys, "--export", str(export))
    runtime = out["accuracy"]["runtime"]
    assert runtime["n"] == 1 and runtime["median_ape"] == pytest.approx(0.25)  # 1800 s predicted, 2400 s measured
    assert out["runtime_left_out"] == {RUNTIME_ABOVE_PEAK: 1}
    # the export agrees: the same job is the one it leaves out
    assert out["export"] == {"path": str(export), "written": 1, "skipped": {RUNTIME_ABOVE_PEAK: 1}}
    [run] = parse_runs(export.read_text())
    assert run.id == "ledger-real" and run.measured.tokens_per_second == pytest.approx(50e6 / 2400)

    assert main(["report", "--ledger", str(ledger_path)]) == 0
    table = capsys.readouterr().out
    assert f"runtime of 1 jobs left out: {RUNTIME_ABOVE_PEAK}" in table
    [runtime_line] = [line for line in table.splitlines() if line.split()[:1] == ["runtime"] and "left out" not in line]
    assert runtime_line.split()[1:3] == ["1", "25.0%"]


def test_report_and_export_score_the_runtimes_of_the_same_jobs(ledger_path: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Over jobs of train_tokens and of steps, on one and on eight GPUs, with runtimes from 0.1 s to days: a
    job's runtime is in the report's figures exactly when its export line carries a throughput."""
    rng = random.Random(7)
    specs = [TOKENS_SPEC, {**TOKENS_SPEC, "gpus": 8, "gpu": "H100-80GB"},
             {"model": "llama-3.1-8b", "method": "qlora", "gpu": "H100-80GB", "steps": 500, "seq_len": 2048}]
    ledger = SqliteLedger(ledger_path)
    for i in range(24):
        name = f"j{i}"
        _decide(ledger, name, spec=specs[i % len(specs)])
        ledger.record_actual(ActualIn(decision_id=name, peak_vram_bytes=10 * GIB,
                                      runtime_seconds=10 ** rng.uniform(-1, 5.5), oom=False,
                                      exit_reason="Completed", source="reporter"))
    ledger.close()
    export = tmp_path / "runs.jsonl"
    out = _report_json(ledger_path, capsys, "--export", str(export))
    runs = parse_runs(export.read_text())
    with_throughput = sum(1 for r in runs if r.measured.tokens_per_second is not None)
    left_out = out["runtime_left_out"].get(RUNTIME_ABOVE_PEAK, 0)
    assert 0 < left_out < 24 and with_throughput == 24 - left_out  # the seed gives both kinds
    assert out["accuracy"]["runtime"]["n"] == with_throughput


def test_an_oom_jobs_reading_is_not_scored_as_its_peak(ledger_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`vramfit evaluate` leaves OOM runs out of the APE (the reading is where the job stopped, below what it
    needed); an OOM job needed more than its upper bound, whatever was read before it stopped."""
    ledger = SqliteLedger(ledger_path)
    for name, factor, oom in (("ok", 1.0, False), ("oom", 0.5, True)):
        d = _decide(ledger, name)
        assert d.peak_vram_bytes is not None
        ledger.record_actual(ActualIn(decision_id=name, peak_vram_bytes=int(d.peak_vram_bytes * factor),
                                      runtime_seconds=60.0, oom=oom, source="reporter"))
    ledger.close()
    out = _report_json(ledger_path, capsys)
    assert out["ooms"] == 1
    assert out["accuracy"]["device"]["n"] == 1 and out["accuracy"]["device"]["median_ape"] == 0.0
    assert out["upper_bound_exceeded_fraction"] == 0.5


def _rewrite(ledger_path: Path, sql: str, *args: Any) -> None:
    db = sqlite3.connect(ledger_path)
    db.execute(sql, args)
    db.commit()
    db.close()


def test_unreadable_records_are_counted_and_named_not_a_traceback(ledger_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A broken payload, or a record with a field of a newer vramfit, left out and named; the rest reported."""
    ledger = SqliteLedger(ledger_path)
    for name in ("good", "broken", "newer"):
        _decide(ledger, name)
        ledger.record_actual(ActualIn(decision_id=name, peak_vram_bytes=GIB, runtime_seconds=60.0, oom=False,
                                      source="reporter"))
    ledger.close()
    _rewrite(ledger_path, "UPDATE decisions SET payload = '{' WHERE decision_id = 'broken'")
    _rewrite(ledger_path, "UPDATE actuals SET payload = json_set(payload, '$.gpu_count', 8) WHERE job_ref = 'id:newer'")
    out = _report_json(ledger_path, capsys)
    assert out["decisions"] == 2 and out["with_actuals"] == 1  # good; newer has lost its only actual
    assert out["pending_actuals"] == 1  # broken's actual: its decision could not be read
    assert out["unreadable"]["decisions"]["count"] == 1
    assert out["unreadable"]["decisions"]["first"][0].startswith("broken: Invalid JSON")
    assert out["unreadable"]["actuals"]["first"] == ["id:newer (reporter): `gpu_count` Extra inputs are not permitted"]
    assert main(["report", "--ledger", str(ledger_path)]) == 0
    table = capsys.readouterr().out
    assert "decisions left out, unreadable: 1 (first: broken: Invalid JSON" in table


def test_a_damaged_ledger_file_is_an_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ledger.sqlite"
    ledger = SqliteLedger(path)
    for i in range(300):
        _decide(ledger, f"d{i}")
    ledger.close()
    size = path.stat().st_size
    with path.open("r+b") as f:  # a disk or copy that lost the second half of the file
        f.seek(size // 2)
        f.write(b"\xff" * (size - size // 2))
    assert main(["report", "--ledger", str(path)]) == 2
    assert f"vramfit report: cannot read the ledger {path}: database disk image is malformed" in capsys.readouterr().err


def test_the_report_read_joins_as_joined_rows_does(ledger_path: Path) -> None:
    """One read for the report gives the rows and pending count of joined_rows() and pending_actuals(), over
    re-decided names and uids, tied decision times, and actuals keyed by id, uid and name."""
    rng = random.Random(3)
    ledger = SqliteLedger(ledger_path)
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for i in range(60):
        _decide(ledger, f"d{i}", uid=f"u{rng.randrange(20)}", name=f"job-{rng.randrange(15)}",
                decided_at=(base + timedelta(minutes=rng.randrange(30))).isoformat())
    for i in range(80):
        key = rng.choice([{"decision_id": f"d{rng.randrange(70)}"}, {"uid": f"u{rng.randrange(25)}"},
                          {"namespace": "ml", "kind": "Job", "name": f"job-{rng.randrange(18)}"}])
        ledger.record_actual(ActualIn(**key, peak_vram_bytes=GIB * (1 + i), runtime_seconds=60.0, oom=False,
                                      source=rng.choice(["reporter", "kubernetes", "dcgm"])))
    read = ledger.report_rows()
    assert read.rows == ledger.joined_rows()
    assert read.pending_actuals == len(ledger.pending_actuals()) and read.unreadable == {}
    assert read.pending_actuals > 0 and any(r.actuals for r in read.rows)


def test_an_empty_ledger_says_there_is_nothing_to_compare(ledger_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    SqliteLedger(ledger_path).close()
    assert main(["report", "--ledger", str(ledger_path)]) == 0
    assert "(no prediction with a measurement to compare it with yet)" in capsys.readouterr().out


def test_collect_once_with_the_pod_watch_is_an_argument_error(ledger_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`--kube --once` exited 0 having watched nothing (the watch does not run with --once)."""
    assert main(["collect", "--kube", "--once", "--ledger", str(ledger_path)]) == 2
    assert "the pod watch (--kube) runs until stopped, drop --once" in capsys.readouterr().err
    assert not ledger_path.exists()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS)
def test_dcgm_peaks_are_found_when_prometheus_renamed_the_exporters_labels(tmp_path: Path) -> None:
    """Scraped through Kubernetes service discovery without honor_labels (the dcgm-exporter and GPU Operator
    ServiceMonitors' default), the target's namespace/pod are the exporter's own and the job's become
    exported_namespace/exported_pod; the collector asked only for namespace/pod and never found a peak."""
    dcgm = FakeDcgmExporter()
    dcgm.set("ml", "train-a-x7k2p", "0", 30_000)
    dcgm.set("ml", "train-a-x7k2p", "1", 41_000)
    dcgm.set("ml", "train-b-q9w4z", "2", 70_000)  # another job on the node
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n"
        f"      - targets: ['{dcgm.address}']\n"
        "        labels: {namespace: gpu-operator, pod: nvidia-dcgm-exporter-4x2kd}\n")
    log = (tmp_path / "prometheus.log").open("ab")
    assert PROMETHEUS is not None
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        start = datetime.now(timezone.utc)

        def scraped() -> bool:
            reply = httpx.get(url + "/api/v1/query", params={"query": "count(DCGM_FI_DEV_FB_USED)"}, timeout=2)
            result = reply.json()["data"]["result"] if reply.status_code == 200 else []
            return bool(result) and result[0]["value"][1] == "3"

        wait_until(scraped, 60, "Prometheus scraped the DCGM exporter")
        time.sleep(1.0)
        peak = query_device_peak(url, "ml", pod_regex("Job", "train-a"), start, datetime.now(timezone.utc))
        assert peak is not None and (peak.peak_vram_bytes, peak.devices) == (41_000 * MIB, 2)
    finally:
        stop_process(proc)
        log.close()
        dcgm.stop()


def test_the_export_writes_the_spec_as_reference_runs_do(tmp_path: Path) -> None:
    """Contract field names, every field out with its method's defaults resolved (was `api_version: null`,
    `sharding: null`, `lora: null`): each line also reads back as a ReferenceRun."""
    path = tmp_path / "ledger.sqlite"
    ledger = SqliteLedger(path)
    _decide(ledger, "lora-job", {"model": "llama-3.2-1b", "method": "lora", "gpu": "A100-80GB"})
    ledger.record_actual(ActualIn(decision_id="lora-job", peak_vram_bytes=9 * GIB, runtime_seconds=600.0, oom=False,
                                  exit_reason="Completed", source="reporter"))
    out = tmp_path / "runs.jsonl"
    with out.open("w", encoding="utf-8") as handle:
        assert ledger.export_reference_runs(handle).written == 1
    ledger.close()
    [line] = out.read_text(encoding="utf-8").splitlines()
    spec = json.loads(line)["spec"]
    assert "api_version" not in spec and "apiVersion" not in spec
    assert spec["sharding"] == "none" and spec["lora"]["rank"] > 0
    assert parse_runs(line)[0].spec.method == "lora"


def test_a_dcgm_query_leaves_out_the_pods_of_jobs_whose_names_extend_its_own(tmp_path: Path) -> None:
    """Job `llama`'s pod pattern (llama-...) also matches `llama-70b`'s pods: the query excludes them."""
    from scheduler.integrations.prom_actuals import device_peaks_query

    ledger = SqliteLedger(tmp_path / "ledger.sqlite")
    for decision_id, name in (("a", "llama"), ("b", "llama-70b"), ("c", "llama-70b"), ("d", "llama-x.y"),
                              ("e", "llamas")):
        ledger.record_decision(DecisionIn.model_validate(decision_payload(decision_id, name=name)))
    assert ledger.names_extending("ml", "llama") == ["llama-70b", "llama-x.y"]
    assert ledger.names_extending("other", "llama") == []
    ledger.close()
    query = device_peaks_query("ml", "llama-.+", 60, exclude="(llama-70b-.+)|(llama-x\\.y-.+)")
    assert 'pod!~"(llama-70b-.+)|(llama-x\\\\.y-.+)"' in query and "exported_pod!~" in query
    assert "pod!~" not in device_peaks_query("ml", "llama-.+", 60)


def _strict_json(text: str) -> Any:
    """``text`` parsed as JSON proper: NaN, Infinity and -Infinity (which Python's json writes and reads) refused."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_the_json_report_is_valid_json_with_a_runtime_stored_before_its_lower_bound(
        ledger_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A measured runtime of 1e-320 s was accepted: the report's runtime error was infinite, the table said inf% and
    --format json wrote `Infinity` (NaN was the only value made null). Now such a runtime is refused at input (1 ms at
    least), one stored before is no whole job's runtime, and no figure of the JSON can be NaN or infinite."""
    from scheduler.cli.jsonout import finite

    ledger = SqliteLedger(ledger_path)
    _decide(ledger, "tiny", predicted_runtime_seconds=1800.0)
    ledger.record_actual(ActualIn.model_validate({  # as the older vramfit stored it
        "decision_id": "tiny", "peak_vram_bytes": GIB, "runtime_seconds": 1e-320, "oom": False,
        "exit_reason": "Completed", "source": "reporter"}, context=STORED))
    ledger.close()
    assert main(["report", "--ledger", str(ledger_path), "--format", "json"]) == 0
    out = _strict_json(capsys.readouterr().out)
    assert out["accuracy"]["runtime"]["n"] == 0 and out["accuracy"]["runtime"]["max_ape"] is None
    assert out["accuracy"]["device"]["n"] == 1
    assert main(["report", "--ledger", str(ledger_path)]) == 0
    assert "inf%" not in capsys.readouterr().out
    figures = {"a": math.inf, "b": [-math.inf, math.nan, 1.5], "c": {"d": math.nan}, "e": "x"}
    assert _strict_json(json.dumps(finite(figures), allow_nan=False)) == {"a": None, "b": [None, None, 1.5],
                                                                         "c": {"d": None}, "e": "x"}


# Values a damaged (or hand-edited) timestamp column held; `datetime.fromtimestamp` raised OverflowError (1e30, -1e30),
# OSError (1e17: `vramfit report` caught the first but not this), ValueError (a year past 9999) or TypeError (text).
DAMAGED_TIMESTAMPS = [("decisions", "decided_at", "1e30"), ("decisions", "decided_at", "-1e30"),
                      ("decisions", "recorded_at", "1e17"), ("decisions", "decided_at", "1e12"),
                      ("decisions", "decided_at", "'NaN'"), ("actuals", "received_at", "'yesterday'")]


@pytest.mark.parametrize(("table", "column", "damage"), DAMAGED_TIMESTAMPS)
def test_a_damaged_timestamp_leaves_its_row_out_naming_the_row_and_column(
        ledger_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, column: str,
        damage: str) -> None:
    ledger = SqliteLedger(ledger_path)
    for name in ("good", "bad"):
        _decide(ledger, name)
        ledger.record_actual(ActualIn(decision_id=name, peak_vram_bytes=GIB, runtime_seconds=60.0, oom=False,
                                      exit_reason="Completed", source="reporter"))
    ledger.close()
    key = "decision_id = 'bad'" if table == "decisions" else "job_ref = 'id:bad'"
    _rewrite(ledger_path, f"UPDATE {table} SET {column} = {damage} WHERE {key}")
    shown = "bad" if table == "decisions" else "id:bad (reporter)"
    export = tmp_path / "runs.jsonl"
    out = _report_json(ledger_path, capsys, "--export", str(export))
    assert list(out["unreadable"]) == [table] and out["unreadable"][table]["count"] == 1
    assert out["unreadable"][table]["first"][0].startswith(f"{shown}: `{column}` is not a timestamp: ")
    assert out["with_actuals"] == 1 and out["export"]["written"] == 1  # the good row
    assert main(["report", "--ledger", str(ledger_path)]) == 0
    assert f"{table} left out, unreadable: 1 (first: {shown}: `{column}` is not a timestamp" in capsys.readouterr().out
