from __future__ import annotations

import io
import json
import random
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from predictors.reference import parse_runs
from scheduler.cli import main
from scheduler.integrations.ledger import (
    MIGRATIONS,
    Ledger,
    LedgerError,
    LedgerPruner,
    PruneResult,
    SqliteLedger,
    open_ledger,
)
from scheduler.integrations.records import ActualIn, DecisionIn
from tests.integrations.payloads import GIB, decision_payload


def actual(**fields):  # type: ignore[no-untyped-def]
    base = {"peak_vram_bytes": 11 * GIB, "runtime_seconds": 3000.0, "oom": False, "source": "reporter"}
    return ActualIn.model_validate(base | fields)


def test_decision_from_prediction_dict_round_trips(ledger_path):
    ledger = SqliteLedger(ledger_path)
    body = decision_payload("d1")
    result = ledger.record_decision(DecisionIn.model_validate(body))
    assert result.created
    again = SqliteLedger(ledger_path).get_decision("d1")
    assert again is not None
    assert again.decision.peak_vram_bytes == body["peak_vram_bytes"]
    assert again.decision.features["model"] == "llama-3.2-1b"
    assert again.spec_hash == result.stored.spec_hash and len(again.spec_hash) == 16


def test_decision_writes_are_idempotent(ledger_path):
    ledger = SqliteLedger(ledger_path)
    first = ledger.record_decision(DecisionIn.model_validate(decision_payload("d1")))
    second = ledger.record_decision(DecisionIn.model_validate(decision_payload("d1", pool="h100")))
    assert first.created and not second.created
    assert ledger.counts() == {"decisions": 1, "actuals": 0}
    stored = ledger.get_decision("d1")
    assert stored is not None and stored.decision.pool == "h100"
    assert stored.recorded_at == first.stored.recorded_at


def test_decision_keyed_by_uid_when_it_has_no_id(ledger_path):
    ledger = SqliteLedger(ledger_path)
    body = decision_payload("x")
    del body["decision_id"]
    body["uid"] = "4b1f-uid"
    ledger.record_decision(DecisionIn.model_validate(body))
    assert ledger.get_decision("4b1f-uid") is not None
    res = ledger.record_actual(actual(uid="4b1f-uid"))
    assert res.decision is not None and res.decision.decision_id == "4b1f-uid"


def test_actual_before_decision_is_kept_and_joined_later(ledger_path):
    ledger = SqliteLedger(ledger_path)
    early = ledger.record_actual(actual(decision_id="d1"))
    assert early.created and early.decision is None
    assert len(ledger.pending_actuals()) == 1
    result = ledger.record_decision(DecisionIn.model_validate(decision_payload("d1")))
    assert [a.actual.source for a in result.newly_joined] == ["reporter"]
    assert ledger.pending_actuals() == []
    (row,) = ledger.joined_rows()
    assert row.merged is not None and row.merged.peak_vram_bytes == 11 * GIB


def test_actual_joins_by_namespace_kind_name(ledger_path):
    ledger = SqliteLedger(ledger_path)
    ledger.record_decision(DecisionIn.model_validate(decision_payload("d1")))
    res = ledger.record_actual(actual(decision_id=None, namespace="ml", kind="Job", name="train-d1"))
    assert res.decision is not None and res.decision.decision_id == "d1"
    # An actual that names another decision never joins by name.
    other = ledger.record_actual(actual(decision_id="zzz", namespace="ml", kind="Job", name="train-d1"))
    assert other.decision is None


def test_sources_merge_and_repeats_are_idempotent(ledger_path):
    ledger = SqliteLedger(ledger_path)
    ledger.record_decision(DecisionIn.model_validate(decision_payload("d1")))
    ledger.record_actual(actual(decision_id="d1", peak_vram_bytes=10 * GIB, peak_reserved_bytes=9 * GIB))
    ledger.record_actual(actual(decision_id="d1", source="dcgm", peak_vram_bytes=12 * GIB, runtime_seconds=None))
    kube = actual(decision_id="d1", source="kubernetes", peak_vram_bytes=None, runtime_seconds=3100.0,
                  exit_reason="Completed")
    assert ledger.record_actual(kube).created
    assert not ledger.record_actual(kube).created
    # A later kubernetes report without memory keeps what was known, and OOM sticks once seen.
    ledger.record_actual(actual(decision_id="d1", source="kubernetes", peak_vram_bytes=None, runtime_seconds=None,
                                oom=True, exit_reason="CudaOOM"))
    assert ledger.counts() == {"decisions": 1, "actuals": 3}
    merged = ledger.joined_rows()[0].merged
    assert merged is not None
    assert merged.peak_vram_bytes == 12 * GIB  # the largest device reading
    assert merged.peak_reserved_bytes == 9 * GIB
    assert merged.runtime_seconds == 3000.0  # the reporter comes before kubernetes
    assert merged.oom and merged.exit_reason == "CudaOOM"
    assert merged.sources == ("reporter", "kubernetes", "dcgm")


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"peak_vram_bytes": 1, "runtime_seconds": 1, "oom": False, "source": "reporter"}, "decision_id"),
        ({"decision_id": "d", "runtime_seconds": 1, "oom": False, "source": "reporter"}, "peak_vram_bytes"),
        ({"decision_id": "d", "peak_vram_bytes": -1, "runtime_seconds": 1, "oom": False, "source": "reporter"},
         "peak_vram_bytes"),
        ({"decision_id": "d", "peak_vram_bytes": 1, "runtime_seconds": 1, "oom": False, "source": "gut"}, "source"),
        ({"namespace": "ml", "name": "x", "peak_vram_bytes": 1, "runtime_seconds": 1, "oom": False,
          "source": "reporter"}, "kind"),
    ],
)
def test_actual_schema_names_the_field(fields, needle):
    with pytest.raises(ValidationError) as info:
        ActualIn.model_validate(fields)
    assert needle in str(info.value)


def test_decision_schema_is_strict():
    body = decision_payload("d1")
    body["peak_vram_gb"] = 3
    with pytest.raises(ValidationError) as info:
        DecisionIn.model_validate(body)
    assert "peak_vram_gb" in str(info.value)
    # features stay free-form
    DecisionIn.model_validate(decision_payload("d1") | {"features": {"anything": [1, 2]}})


def test_schema_versioned_and_migrated(ledger_path):
    ledger = SqliteLedger(ledger_path)
    assert ledger.schema_version == len(MIGRATIONS)
    ledger.record_decision(DecisionIn.model_validate(decision_payload("d1")))
    ledger.close()
    extra = (*MIGRATIONS, "ALTER TABLE decisions ADD COLUMN note TEXT; CREATE INDEX d_note ON decisions (note)")
    upgraded = SqliteLedger(ledger_path, migrations=extra)
    assert upgraded.schema_version == len(MIGRATIONS) + 1
    assert upgraded.get_decision("d1") is not None
    upgraded.close()
    with pytest.raises(LedgerError, match="newer than this vramfit"):
        SqliteLedger(ledger_path)


def test_failed_migration_leaves_the_old_version(ledger_path):
    SqliteLedger(ledger_path).close()
    with pytest.raises(LedgerError, match="no such table: nope"):
        SqliteLedger(ledger_path, migrations=(*MIGRATIONS, "ALTER TABLE nope ADD COLUMN x TEXT"))
    assert SqliteLedger(ledger_path).schema_version == len(MIGRATIONS)


def test_wal_journal(ledger_path):
    SqliteLedger(ledger_path)
    with sqlite3.connect(ledger_path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_open_ledger_rejects_unknown_schemes(tmp_path):
    assert isinstance(open_ledger(f"sqlite:///{tmp_path}/a.sqlite"), SqliteLedger)
    with pytest.raises(LedgerError, match="unsupported"):
        open_ledger("postgres://db/vramfit")


def test_export_reference_runs_is_valid_reference_jsonl(ledger_path):
    ledger = SqliteLedger(ledger_path)
    ledger.record_decision(DecisionIn.model_validate(decision_payload("d1")))
    ledger.record_decision(DecisionIn.model_validate(decision_payload("d2")))
    ledger.record_decision(DecisionIn.model_validate(decision_payload("d3", features={"model": "x", "seq_len": -1})))
    ledger.record_decision(DecisionIn.model_validate(decision_payload("d4")))
    ledger.record_actual(actual(decision_id="d1", peak_vram_bytes=12 * GIB))
    ledger.record_actual(actual(decision_id="d2", peak_vram_bytes=None, oom=True))
    ledger.record_actual(actual(decision_id="d3"))
    out = io.StringIO()
    result = ledger.export_reference_runs(out)
    assert result.written == 2
    assert result.skipped == {"features are not a valid TrainingSpec": 1, "no actual": 1}
    runs = parse_runs(out.getvalue())
    assert [r.id for r in runs] == ["ledger-d1", "ledger-d2"]
    assert {r.source_id for r in runs} == {"vramfit_ledger"}
    assert runs[0].measured.metric == "nvml" and runs[0].measured.peak_bytes == 12 * GIB
    assert runs[0].gpu == "A100-80GB" and runs[0].spec.gpu == "A100-80GB"
    assert runs[1].measured.oom and runs[1].measured.peak_bytes is None
    assert json.loads(out.getvalue().splitlines()[0])["spec"]["method"] == "lora"


def test_device_peaks_no_gpu_can_have_are_refused_or_left_out_of_training(ledger_path):
    """/v1/actuals took a peak of 2^62 bytes on an A100-80GB, and `train --ledger` learned it (and a 1-byte one):
    Llama-3.1-8B LoRA was then bounded at 8,277 PiB, or at 15.1 GiB. A peak above the named GPU's memory is refused
    naming the field; the export leaves out a stored peak above the decision's GPU or below any CUDA context."""
    with pytest.raises(ValidationError, match=r"peak_vram_bytes .* is more than the A100-80GB's"):
        actual(decision_id="d1", peak_vram_bytes=2**62, gpu="A100-80GB")
    assert actual(decision_id="d1", peak_vram_bytes=30 * GIB, gpu="V100").gpu == "V100"  # a V100-32GB, maybe
    ledger = SqliteLedger(ledger_path)
    for name in ("tiny", "huge"):
        ledger.record_decision(DecisionIn.model_validate(decision_payload(name)))  # on an A100-80GB
    ledger.record_actual(actual(decision_id="tiny", peak_vram_bytes=1))
    ledger.record_actual(actual(decision_id="huge", peak_vram_bytes=2**62))  # no gpu named on the actual
    out = io.StringIO()
    ledger.export_reference_runs(out)
    runs = {r.id: r for r in parse_runs(out.getvalue())}
    assert runs["ledger-tiny"].measured.peak_bytes is None and runs["ledger-huge"].measured.peak_bytes is None
    assert "below any CUDA context" in runs["ledger-tiny"].notes
    assert "is more than the A100-80GB's" in runs["ledger-huge"].notes


def test_export_carries_the_jobs_throughput_when_it_ran_to_its_end(ledger_path):
    """A finished job's throughput is its work over its runtime (per job): train_tokens, or steps x the tokens
    of a step on its GPUs. Failed, OOM and unfinished jobs give none; a job with a runtime but no device peak
    (only the Kubernetes watcher saw it) is still exported, for the runtime residual."""
    ledger = SqliteLedger(ledger_path)
    tokens = {"model": "llama-3.2-1b", "method": "lora", "gpu": "A100-80GB", "train_tokens": 3.6e8}
    steps = {"model": "llama-3.2-1b", "method": "full", "gpu": "A100-80GB", "gpus": 4, "steps": 1000,
             "micro_batch_size": 2, "seq_len": 1024, "grad_accum_steps": 8}
    for name, spec in (("tok", tokens), ("steps", steps), ("failed", tokens), ("k8s", tokens), ("oom", tokens),
                       ("nowork", None)):
        ledger.record_decision(DecisionIn.model_validate(decision_payload(name, spec)))
    ledger.record_actual(actual(decision_id="tok", runtime_seconds=36000.0, exit_reason="Completed"))
    ledger.record_actual(actual(decision_id="steps", runtime_seconds=2000.0))
    ledger.record_actual(actual(decision_id="failed", runtime_seconds=100.0, exit_reason="Error"))
    ledger.record_actual(actual(decision_id="k8s", peak_vram_bytes=None, runtime_seconds=72000.0,
                                exit_reason="Completed", source="kubernetes"))
    ledger.record_actual(actual(decision_id="oom", peak_vram_bytes=None, oom=True, runtime_seconds=60.0))
    ledger.record_actual(actual(decision_id="nowork", peak_vram_bytes=None, runtime_seconds=60.0,
                                source="kubernetes"))
    # 3.6e8 tokens of a 1B model in 1 s on one A100 would need ~2,700 PFLOP/s: not the whole job's runtime
    ledger.record_decision(DecisionIn.model_validate(decision_payload("restarted", tokens)))
    ledger.record_actual(actual(decision_id="restarted", runtime_seconds=1.0))
    ledger.record_decision(DecisionIn.model_validate(decision_payload("restarted-k8s", tokens)))
    ledger.record_actual(actual(decision_id="restarted-k8s", peak_vram_bytes=None, runtime_seconds=1.0,
                                source="kubernetes"))
    out = io.StringIO()
    result = ledger.export_reference_runs(out)
    assert result.skipped == {"no device peak; runtime without train_tokens or steps": 1,
                              "throughput above the GPUs' peak FLOP/s (the runtime cannot be the whole job's)": 1}
    runs = {r.id: r for r in parse_runs(out.getvalue())}
    assert set(runs) == {"ledger-tok", "ledger-steps", "ledger-failed", "ledger-k8s", "ledger-oom", "ledger-restarted"}
    assert runs["ledger-restarted"].measured.tokens_per_second is None  # its peak stays, its runtime does not
    assert "above the GPUs' peak" in runs["ledger-restarted"].notes
    assert runs["ledger-tok"].measured.tokens_per_second == pytest.approx(3.6e8 / 36000)
    assert runs["ledger-tok"].measured.tokens_per_second_scope == "per_job"
    # 1000 steps x 2 x 1024 tokens x 8 micro-batches x 4 data-parallel GPUs in 2000 s
    assert runs["ledger-steps"].measured.tokens_per_second == pytest.approx(1000 * 2 * 1024 * 8 * 4 / 2000)
    assert runs["ledger-failed"].measured.tokens_per_second is None  # its peak is still a measurement
    assert runs["ledger-failed"].measured.peak_bytes == 11 * GIB
    assert runs["ledger-k8s"].measured.peak_bytes is None
    assert runs["ledger-k8s"].measured.tokens_per_second == pytest.approx(3.6e8 / 72000)
    assert runs["ledger-oom"].measured.oom and runs["ledger-oom"].measured.tokens_per_second is None


def test_one_joined_row_equals_its_row_of_the_whole_join(ledger_path):
    """GET /v1/decisions/{id} reads one row by index; it must be the row the full join gives, with re-decided
    names and uids, actuals keyed by id, uid or name (some before their decision), and ties of decided_at."""
    rng = random.Random(7)
    ledger = SqliteLedger(ledger_path)
    template = DecisionIn.model_validate(decision_payload("t")).model_dump(exclude_none=True)
    times = [datetime(2025, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=rng.randrange(6)) for _ in range(40)]
    writes = []
    for i, decided_at in enumerate(times):
        body = template | {"decision_id": f"d{i}", "name": f"job-{rng.randrange(8)}", "decided_at": decided_at}
        if rng.random() < 0.5:
            body["uid"] = f"u{rng.randrange(6)}"
        writes.append(("decision", DecisionIn.model_validate(body)))
    for _ in range(60):
        key = rng.choice([{"decision_id": f"d{rng.randrange(45)}"}, {"uid": f"u{rng.randrange(7)}"},
                          {"namespace": "ml", "kind": "Job", "name": f"job-{rng.randrange(9)}"}])
        writes.append(("actual", actual(**key, source=rng.choice(["reporter", "dcgm", "kubernetes"]))))
    rng.shuffle(writes)
    for what, record in writes:
        ledger.record_decision(record) if what == "decision" else ledger.record_actual(record)
    rows = ledger.joined_rows()
    assert sum(len(r.actuals) for r in rows) > 20  # the draw joins a fair share of the actuals
    for row in rows:
        assert ledger.joined_row(row.decision.decision_id) == row
        assert Ledger.joined_row(ledger, row.decision.decision_id) == row  # the default, by the full join
    assert ledger.joined_row("d99") is None
    # the DCGM sweep's rows: by index lookups, the same as filtering the whole join
    awaiting = {r.decision.decision_id: r for r in ledger.rows_awaiting("dcgm", after="kubernetes")}
    assert awaiting == {r.decision.decision_id: r for r in Ledger.rows_awaiting(ledger, "dcgm", "kubernetes")}
    assert 0 < len(awaiting) < len(rows)


def _pruning_ledger(ledger_path):  # type: ignore[no-untyped-def]
    """Joined pairs keyed by id, uid and name; a lone decision; actuals naming nothing by id, uid and name."""
    ledger = SqliteLedger(ledger_path)
    old = datetime.now(timezone.utc) - timedelta(days=100)
    by_uid = decision_payload("d-uid") | {"uid": "u-1", "decided_at": old}
    for body in (decision_payload("d-id", decided_at=old), by_uid, decision_payload("d-name", decided_at=old),
                 decision_payload("d-lone", decided_at=old)):
        ledger.record_decision(DecisionIn.model_validate(body))
    ledger.record_actual(actual(decision_id="d-id"))
    ledger.record_actual(actual(uid="u-1", source="dcgm"))
    ledger.record_actual(actual(namespace="ml", kind="Job", name="train-d-name", source="kubernetes"))
    for key in ({"decision_id": "ghost"}, {"uid": "u-ghost"}, {"namespace": "ml", "kind": "Job", "name": "nobody"}):
        ledger.record_actual(actual(**key))
    return ledger


def test_pruning_deletes_only_what_names_nothing(ledger_path):
    ledger = _pruning_ledger(ledger_path)
    joined_before = [r for r in ledger.joined_rows() if r.actuals]
    assert ledger.prune_unjoined(datetime.now(timezone.utc) - timedelta(days=1)).decisions == 1  # d-lone (old)
    # the actuals were received just now: only a cut-off after them reaches the three that name nothing
    assert ledger.prune_unjoined(datetime.now(timezone.utc) + timedelta(seconds=1)) == PruneResult(0, 3)
    assert ledger.counts() == {"decisions": 3, "actuals": 3}
    assert ledger.joined_rows() == joined_before and ledger.pending_actuals() == []
    assert ledger.prune_unjoined(datetime.now(timezone.utc) + timedelta(seconds=1)) == PruneResult(0, 0)


def test_a_cut_off_before_everything_prunes_nothing(ledger_path):
    ledger = _pruning_ledger(ledger_path)
    assert ledger.prune_unjoined(datetime.now(timezone.utc) - timedelta(days=365)) == PruneResult(0, 0)
    assert ledger.counts() == {"decisions": 4, "actuals": 6}


def test_the_pruner_cuts_keep_days_back_from_now(ledger_path):
    ledger = _pruning_ledger(ledger_path)
    month_later = datetime.now(timezone.utc) + timedelta(days=30)
    assert LedgerPruner(ledger, keep_days=29, now=lambda: month_later).check() == PruneResult(1, 3)
    assert LedgerPruner(ledger, keep_days=29, now=lambda: month_later).check() == PruneResult(0, 0)


def test_collect_once_prunes_with_the_flag(ledger_path):
    _pruning_ledger(ledger_path).close()
    argv = ["collect", "--ledger", str(ledger_path), "--prometheus-url", "http://127.0.0.1:9", "--once"]
    # nothing listens on port 9: the one-shot sweep fails visibly (exit 1), after pruning
    assert main(argv) == 1 and SqliteLedger(ledger_path).counts()["decisions"] == 4
    assert main([*argv, "--prune-unjoined-days", "30"]) == 1
    assert SqliteLedger(ledger_path).get_decision("d-lone") is None
    assert SqliteLedger(ledger_path).counts()["decisions"] == 3


def test_collect_once_names_an_unreachable_prometheus(ledger_path, capsys):
    """A sweep with no finished job asks Prometheus nothing; the start-up query still finds a wrong URL."""
    argv = ["collect", "--ledger", str(ledger_path), "--prometheus-url", "http://127.0.0.1:9/", "--once"]
    assert main(argv) == 1
    assert "cannot query Prometheus at http://127.0.0.1:9/" in capsys.readouterr().err


def test_the_dcgm_sweep_asks_only_about_jobs_within_the_lookback(ledger_path, monkeypatch):
    from scheduler.cli.collect import sweep_dcgm
    from scheduler.integrations import prom_actuals

    asked: list[str] = []

    def fake_dcgm_actual(url, decision, finished_at, started_at, other_names=()):  # type: ignore[no-untyped-def]
        asked.append(decision.decision_id)
        return None  # Prometheus has no samples for it

    monkeypatch.setattr(prom_actuals, "dcgm_actual", fake_dcgm_actual)
    ledger = SqliteLedger(ledger_path)
    now = datetime.now(timezone.utc)
    for name, finished_days_ago in (("recent", 1), ("old", 20)):
        ledger.record_decision(DecisionIn.model_validate(decision_payload(name)))
        ledger.record_actual(ActualIn(decision_id=name, peak_vram_bytes=None, oom=False, source="kubernetes",
                                      runtime_seconds=60.0,
                                      finished_at=now - timedelta(days=finished_days_ago)))
    assert sweep_dcgm(ledger, "http://127.0.0.1:9", now=now) == 0 and asked == ["recent"]
    assert sweep_dcgm(ledger, "http://127.0.0.1:9", lookback_days=30, now=now) == 0
    assert sorted(asked) == ["old", "recent", "recent"]
    # a job that had been finished an hour when Prometheus had no samples for it is not asked about again
    empty: set[str] = set()
    asked.clear()
    for _ in range(3):
        sweep_dcgm(ledger, "http://127.0.0.1:9", now=now, empty=empty)
    assert asked == ["recent"] and empty == {"recent"}


def test_one_absurd_dcgm_reading_stops_neither_the_sweep_nor_the_other_jobs(ledger_path, monkeypatch):
    """A reading of 1e20 MiB (an exporter or unit error) was past the ledger's bound, 1e308 MiB overflowed: the
    exception aborted the whole sweep, and the job was retried first at every sweep, so no later job got its DCGM
    actual. Now that reading is refused with a warning, and the other jobs are stored."""
    from scheduler.cli.collect import sweep_dcgm
    from scheduler.integrations import prom_actuals

    readings = {"first": [[0, "1e20"]], "second": [[0, "20480"]], "third": [[0, "1e308"]]}

    def fake_query(url, query, at, timeout_seconds=10.0):  # type: ignore[no-untyped-def]
        name = next(n for n in readings if f'"{n}' in query or f"={n}" in query or n in query)
        value = readings[name][0][1] if query.startswith("max(") else "1"
        return [{"metric": {}, "value": [0, value]}]

    monkeypatch.setattr(prom_actuals, "query_instant", fake_query)
    ledger = SqliteLedger(ledger_path)
    now = datetime.now(timezone.utc)
    for name in readings:
        ledger.record_decision(DecisionIn.model_validate(decision_payload(name)))
        ledger.record_actual(ActualIn(decision_id=name, peak_vram_bytes=None, oom=False, source="kubernetes",
                                      runtime_seconds=60.0, finished_at=now - timedelta(hours=2)))
    assert sweep_dcgm(ledger, "http://127.0.0.1:9", now=now) == 1
    awaiting = sorted(row.decision.decision_id for row in ledger.rows_awaiting("dcgm", after="kubernetes"))
    assert awaiting == ["first", "third"]  # "second" stored; the absurd ones are asked again, still refused
    assert sweep_dcgm(ledger, "http://127.0.0.1:9", now=now) == 0


@pytest.mark.parametrize(("kind", "name", "pods", "others"), [
    ("Job", "llama", ["llama-x7k2p", "llama-3-ab12c"], ["llama-70b-x7k2p", "llama-70b-3-x7k2p"]),
    ("PyTorchJob", "ft", ["ft-master-0", "ft-worker-12"], ["ft-70b-worker-0"]),
    ("JobSet", "js", ["js-trainer-0-1-ab12c"], ["js2-trainer-0-1-ab12c"]),
    ("RayJob", "rj", ["rj-ab12c-head-xy12z", "rj-ab12c-gpu-worker-xy12z"], ["rj-70b-head-ab12c"]),
    ("Pod", "p", ["p"], ["p-1"]),
])
def test_dcgm_pod_patterns_take_a_jobs_pods_and_not_a_longer_named_jobs(kind, name, pods, others):
    import re

    from scheduler.integrations.prom_actuals import pod_regex

    pattern = re.compile(pod_regex(kind, name))  # Prometheus anchors =~ at both ends
    assert all(pattern.fullmatch(p) for p in pods) and not any(pattern.fullmatch(p) for p in others)


def test_a_generate_name_jobs_pods_are_matched_and_a_job_of_the_same_prefix_beside_it_is_not_swept(
        ledger_path, monkeypatch):
    """A job created with metadata.generateName is admitted before the API server completes its name: the decision
    holds the prefix. Its pods were never matched (the pattern took the prefix for the whole name), so such jobs
    got no DCGM peak. Now the pattern adds the server's 5 characters; a sweep skips a job when another job of the
    same prefix ran alongside it (their pods cannot be told apart)."""
    import re

    from scheduler.cli.collect import sweep_dcgm
    from scheduler.integrations import prom_actuals
    from scheduler.integrations.prom_actuals import pod_regex

    assert re.fullmatch(pod_regex("Pod", "train-", generated=True), "train-7x2kq")
    assert re.fullmatch(pod_regex("Job", "train-", generated=True), "train-7x2kq-abcde")
    assert not re.fullmatch(pod_regex("Job", "train-", generated=True), "train-long-7x2kq-abcde")
    assert not re.fullmatch(pod_regex("Pod", "train-"), "train-7x2kq")  # what the sweep asked before

    asked: list[str] = []
    monkeypatch.setattr(prom_actuals, "dcgm_actual",
                        lambda url, decision, finished_at, started_at, other_names=(): asked.append(
                            decision.decision_id))
    ledger = SqliteLedger(ledger_path)
    now = datetime.now(timezone.utc)
    runs = {"alone": (now - timedelta(days=3), now - timedelta(days=3) + timedelta(hours=1), "solo-"),
            "a": (now - timedelta(hours=5), now - timedelta(hours=2), "pair-"),  # b ran while a did
            "b": (now - timedelta(hours=4), now - timedelta(hours=1), "pair-")}
    for decision_id, (decided, finished, prefix) in runs.items():
        ledger.record_decision(DecisionIn.model_validate(decision_payload(
            decision_id, name=prefix, generated_name=True, decided_at=decided.isoformat())))
        ledger.record_actual(ActualIn(decision_id=decision_id, peak_vram_bytes=None, oom=False, source="kubernetes",
                                      runtime_seconds=(finished - decided).total_seconds(), finished_at=finished))
    sweep_dcgm(ledger, "http://127.0.0.1:9", now=now)
    assert asked == ["alone"]


def test_a_row_stored_before_the_value_bounds_still_reads_back(ledger_path):
    """Rows an older vramfit accepted (a 1e308 cost, a 1e-300 s runtime) must not make the ledger unreadable."""
    ledger = SqliteLedger(ledger_path)
    ledger.record_decision(DecisionIn.model_validate(decision_payload("ok")))
    ledger.record_actual(actual(decision_id="ok"))
    with sqlite3.connect(ledger_path) as db:  # what the older vramfit wrote
        payload = json.loads(db.execute("SELECT payload FROM decisions").fetchone()[0])
        db.execute("UPDATE decisions SET payload = ?", (json.dumps(payload | {"predicted_cost_usd": 1e308,
                                                                               "runtime_seconds": 1e-300}),))
        db.execute("UPDATE actuals SET payload = json_set(payload, '$.runtime_seconds', 1e308)")
    (row,) = ledger.joined_rows()
    assert row.decision.decision.predicted_cost_usd == 1e308 and row.merged.runtime_seconds == 1e308
    result = ledger.record_actual(actual(decision_id="ok", runtime_seconds=None, peak_vram_bytes=12 * GIB))
    assert result.previous.runtime_seconds == 1e308 and result.stored.actual.peak_vram_bytes == 12 * GIB


def test_placed_pools_and_methods_is_the_default_answer_from_one_query(ledger_path):
    ledger = SqliteLedger(ledger_path)
    now = datetime.now(timezone.utc)
    for i, (pool, method, days, outcome) in enumerate([
            ("a100", "lora", 1, "placed"), ("a100", "lora", 3, "placed"), ("h100", "full", 2, "placed"),
            ("h100", "qlora", 40, "placed"), (None, "lora", 1, "no_fit"), ("l4", None, 5, "placed")]):
        decided_at = (now - timedelta(days=days)).isoformat()
        body = decision_payload(f"d{i}", pool=pool, outcome=outcome, decided_at=decided_at)
        if method is None:
            body.pop("method")
        else:
            body["method"] = method
        ledger.record_decision(DecisionIn.model_validate(body))
    since = now - timedelta(days=30)
    expected = [("a100", "lora"), ("h100", "full"), ("l4", None)]
    assert ledger.placed_pools_and_methods(since, limit=10) == expected
    assert Ledger.placed_pools_and_methods(ledger, since, limit=10) == expected
    assert ledger.placed_pools_and_methods(since, limit=2) == expected[:2]


def test_every_read_leaves_an_unreadable_row_out_with_a_warning_naming_it(ledger_path, caplog):
    """One damaged row (a timestamp no date has, a payload that is not JSON) raised out of every read of the ledger:
    the export, the DCGM sweep, pruning, the join of a new decision. Now each read leaves it out and logs which row
    and why, and the rest of the ledger reads as before."""
    ledger = SqliteLedger(ledger_path)
    for name in ("good", "bad-time", "bad-payload"):
        ledger.record_decision(DecisionIn.model_validate(decision_payload(name)))
        ledger.record_actual(actual(decision_id=name, source="kubernetes", peak_vram_bytes=None))
    ledger.record_actual(actual(namespace="ml", kind="Job", name="gone", source="kubernetes"))
    ledger.record_actual(actual(decision_id="late"))
    with sqlite3.connect(ledger_path) as db:
        db.execute("UPDATE decisions SET decided_at = 1e17 WHERE decision_id = 'bad-time'")  # OSError before
        db.execute("UPDATE decisions SET payload = '{' WHERE decision_id = 'bad-payload'")
        db.execute("UPDATE actuals SET received_at = 'x' WHERE job_ref = 'id:late'")  # TypeError before
        db.execute("UPDATE actuals SET payload = '[' WHERE job_ref = 'name:ml/Job/gone'")
    db.close()
    caplog.set_level("WARNING", logger="vramfit.ledger")
    assert [d.decision_id for d in ledger.decisions()] == ["good"]
    assert [r.decision.decision_id for r in ledger.joined_rows()] == ["good"]
    assert {a.actual.job_ref for a in ledger.actuals()} == {"id:good", "id:bad-time", "id:bad-payload"}
    assert ledger.get_decision("bad-time") is None and ledger.joined_row("bad-payload") is None
    assert [r.decision.decision_id for r in ledger.rows_awaiting("dcgm", "kubernetes")] == ["good"]
    assert ledger.export_reference_runs(io.StringIO()).skipped == {  # the good row, read
        "no device peak; runtime without train_tokens or steps": 1}
    # the unreadable name-keyed actual is kept: it cannot be judged (before: the pruner raised on it every hour)
    assert ledger.prune_unjoined(datetime.now(timezone.utc) + timedelta(seconds=1)) == PruneResult(0, 0)
    assert ledger.counts() == {"decisions": 3, "actuals": 5}
    # the decision that joins the unreadable actual is recorded
    assert ledger.record_decision(DecisionIn.model_validate(decision_payload("late"))).newly_joined == ()
    warnings = "\n".join(r.getMessage() for r in caplog.records)
    assert "decisions record bad-time left out, unreadable: `decided_at` is not a timestamp: 1e+17" in warnings
    assert "decisions record bad-payload left out, unreadable: Invalid JSON" in warnings
    assert "actuals record name:ml/Job/gone (kubernetes) left out, unreadable: Invalid JSON" in warnings
    assert ledger.placed_pools_and_methods(datetime.now(timezone.utc) - timedelta(days=1), 10) == [("a100", "lora")]


def test_a_new_report_replaces_an_unreadable_one_of_its_source(ledger_path, caplog):
    """Merging a repeated report into a stored one that cannot be read raised (a 500, the new report lost)."""
    ledger = SqliteLedger(ledger_path)
    ledger.record_decision(DecisionIn.model_validate(decision_payload("d1")))
    ledger.record_actual(actual(decision_id="d1"))
    with sqlite3.connect(ledger_path) as db:
        db.execute("UPDATE actuals SET payload = '{\"decision_id\": \"d1\"'")
    db.close()
    caplog.set_level("WARNING", logger="vramfit.ledger")
    result = ledger.record_actual(actual(decision_id="d1", peak_vram_bytes=12 * GIB))
    assert result.previous is None and result.decision is not None and result.decision.decision_id == "d1"
    assert "actuals record id:d1 (reporter) left out, unreadable" in caplog.text
    row = ledger.joined_row("d1")
    assert row is not None and row.merged is not None and row.merged.peak_vram_bytes == 12 * GIB


def test_an_fp32_jobs_throughput_cap_is_the_tf32_peak() -> None:
    """An fp32 job may run its matmuls as TF32 without its spec saying so (Lightning's and many scripts'
    set_float32_matmul_precision("high")): its throughput is implausible only above the TF32 peak (156 TFLOP/s on an
    A100), not the CUDA cores' 19.5, or a real TF32 job's runtime would be dropped as a restart."""
    from predictors.spec import TrainingSpec
    from scheduler.integrations.ledger import max_tokens_per_second

    fp32 = TrainingSpec.model_validate({"model": "llama-3.2-1b", "precision": "32-true", "train_tokens": 1e8})
    bf16 = fp32.model_copy(update={"precision": "bf16-true"})
    assert max_tokens_per_second(fp32, "A100-80GB") == pytest.approx(
        max_tokens_per_second(bf16, "A100-80GB") * 156 / 312)
    assert max_tokens_per_second(fp32.model_copy(update={"tf32": True}), "V100-32GB") == pytest.approx(
        max_tokens_per_second(fp32, "V100-32GB"))
