"""How actuals reach /metrics through the real HTTP server and SQLite ledger: every report of a job is scored by
what it changed (several ranks or nodes report one job), and a restarted collector exports the zero series of the
pools and methods it placed jobs in before the restart."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from scheduler.integrations.ledger import SqliteLedger
from scheduler.integrations.server import create_app
from tests.integrations.payloads import decision_payload
from tests.integrations.test_server import samples, value

LABELS = {"pool": "a100", "method": "lora", "source": "reporter"}


def report(decision_id: str, peak_bytes: int | None, **extra: Any) -> dict[str, Any]:
    return {"decision_id": decision_id, "peak_vram_bytes": peak_bytes, "runtime_seconds": 3000.0, "oom": False,
            "source": "reporter"} | extra


def post(client: TestClient, path: str, body: dict[str, Any]) -> None:
    r = client.post(path, json=body)
    assert r.status_code in (200, 201, 202), r.text


def scores(client: TestClient) -> dict[str, float]:
    return {
        "ratio_count": value(client, "vramfit_vram_prediction_ratio_count", **LABELS),
        "ratio_sum": value(client, "vramfit_vram_prediction_ratio_sum", **LABELS),
        "peak_count": value(client, "vramfit_actual_peak_vram_bytes_count", **LABELS),
        "point": value(client, "vramfit_vram_under_predictions_total", bound="point", **LABELS),
        "upper": value(client, "vramfit_vram_under_predictions_total", bound="upper", **LABELS),
        "ooms": value(client, "vramfit_ooms_total", pool="a100", method="lora"),
        "runtime_count": value(client, "vramfit_runtime_prediction_ratio_count", **LABELS),
    }


def test_a_later_rank_with_a_higher_peak_counts_the_under_prediction_once(ledger_path: Path) -> None:
    body = decision_payload("ranks")
    point, upper = body["peak_vram_bytes"], body["peak_vram_upper_bytes"]
    with TestClient(create_app(SqliteLedger(ledger_path))) as client:
        post(client, "/v1/decisions", body)
        post(client, "/v1/actuals", report("ranks", int(point * 0.9)))  # rank 0: within the prediction
        first = scores(client)
        assert (first["ratio_count"], first["point"], first["upper"], first["runtime_count"]) == (1, 0, 0, 1)
        post(client, "/v1/actuals", report("ranks", upper + 1))  # rank 1: the job's real peak, above both bounds
        post(client, "/v1/actuals", report("ranks", upper + 2))  # rank 2: higher still, nothing newly crossed
        post(client, "/v1/actuals", report("ranks", int(point * 0.5)))  # rank 3: lower, the ledger keeps the max
        after = scores(client)
        assert (after["point"], after["upper"]) == (1, 1)
        # histograms observe the job once (the first reading): an observation cannot be taken back
        assert (after["ratio_count"], after["peak_count"], after["runtime_count"]) == (1, 1, 1)
        assert after["ratio_sum"] == first["ratio_sum"]
        assert client.get("/v1/decisions/ranks").json()["actual"]["peak_vram_bytes"] == upper + 2


def test_a_peak_and_an_oom_in_a_later_report_are_scored(ledger_path: Path) -> None:
    """The audit's reproducer: the first report has no peak, the second has the peak and the OOM."""
    body = decision_payload("j2")
    point = body["peak_vram_bytes"]
    peak = int(point * 1.3)
    assert peak < body["peak_vram_upper_bytes"]  # above the point prediction, within the placement bound
    with TestClient(create_app(SqliteLedger(ledger_path))) as client:
        post(client, "/v1/decisions", body)
        post(client, "/v1/actuals", report("j2", None))
        assert scores(client)["ratio_count"] == 0
        post(client, "/v1/actuals", report("j2", peak, oom=True, exit_reason="CudaOOM"))
        assert scores(client)["ooms"] == 1
        post(client, "/v1/actuals", report("j2", peak, oom=True, exit_reason="CudaOOM"))  # a retry
        post(client, "/v1/actuals", report("j2", None, oom=True, source="kubernetes", exit_reason="CudaOOM"))
        got = scores(client)
        assert (got["ratio_count"], got["peak_count"], got["point"], got["ooms"]) == (1, 1, 1, 1)
        assert got["ratio_sum"] == peak / point and got["upper"] == 0


def test_reports_that_arrive_before_the_decision_are_scored_once_merged(ledger_path: Path) -> None:
    body = decision_payload("early")
    point, upper = body["peak_vram_bytes"], body["peak_vram_upper_bytes"]
    with TestClient(create_app(SqliteLedger(ledger_path))) as client:
        post(client, "/v1/actuals", report("early", int(point * 0.9)))
        post(client, "/v1/actuals", report("early", upper + 1, oom=True))
        post(client, "/v1/decisions", body)
        got = scores(client)
        assert (got["ratio_count"], got["point"], got["upper"], got["ooms"]) == (1, 1, 1, 1)
        assert got["ratio_sum"] == (upper + 1) / point
        post(client, "/v1/actuals", report("early", upper + 5, oom=True))  # a late rank after the join
        assert scores(client) == got


def series(client: TestClient, name: str) -> set[tuple[str, str]]:
    return {(dict(ls)["pool"], dict(ls)["method"]) for (n, ls) in samples(client) if n == name}


def test_a_restarted_collector_exports_the_zeros_of_earlier_placements(ledger_path: Path) -> None:
    """The first under-prediction after a restart must be visible to increase(): its series exists at 0 first."""
    recent = datetime.now(timezone.utc) - timedelta(days=2)
    with TestClient(create_app(SqliteLedger(ledger_path))) as before:
        post(before, "/v1/decisions", decision_payload("h", pool="h100", decided_at=recent.isoformat()))
        post(before, "/v1/decisions", decision_payload("q", pool="l40s", method="qlora"))
        old = datetime.now(timezone.utc) - timedelta(days=90)
        post(before, "/v1/decisions", decision_payload("old", pool="v100", decided_at=old.isoformat()))
        post(before, "/v1/decisions", decision_payload("nofit", pool=None, outcome="no_fit"))

    with TestClient(create_app(SqliteLedger(ledger_path))) as after:  # a new process over the same ledger
        expected = {("h100", "lora"), ("l40s", "qlora")}
        assert series(after, "vramfit_ooms_total") == expected
        assert series(after, "vramfit_vram_under_predictions_total") == expected
        assert series(after, "vramfit_vram_prediction_ratio_count") == expected
        assert value(after, "vramfit_vram_under_predictions_total") == 0
        assert value(after, "vramfit_ooms_total") == 0
        # the first outcome then moves a series that was already scraped at 0
        upper = decision_payload("h")["peak_vram_upper_bytes"]
        post(after, "/v1/actuals", report("h", upper + 1))
        assert value(after, "vramfit_vram_under_predictions_total", pool="h100", bound="upper",
                     source="reporter") == 1


def test_a_job_re_created_under_its_name_keeps_each_runs_report_to_itself(tmp_path: Path) -> None:
    """Reports keyed by namespace/kind/name (no decision id). Run A ran out of memory; the job is re-created under
    the same name the next day and decided again (run B). Before, decision B re-joined A's report (scored again:
    two OOMs, two ratio observations for one report), A lost it, and B's own report merged into it (B showed as an
    OOM at 10 GiB and "Completed" at once). Now each report stays with the decision of its run."""
    from scheduler.integrations.metrics import Metrics
    from scheduler.integrations.records import ActualIn, DecisionIn
    from scheduler.integrations.server import store_actual, store_decision

    ledger, metrics = SqliteLedger(tmp_path / "ledger.sqlite"), Metrics()
    gib = 2**30

    def total(metric: str) -> float:
        return sum(s.value for family in metrics.registry.collect() for s in family.samples if s.name == metric)

    name = {"namespace": "ml", "kind": "Job", "name": "train", "source": "reporter"}
    try:
        store_decision(ledger, metrics, DecisionIn.model_validate(
            decision_payload("run-a", name="train", decided_at="2026-11-01T10:00:00Z")))
        store_actual(ledger, metrics, ActualIn.model_validate({
            **name, "peak_vram_bytes": 10 * gib, "runtime_seconds": 3000, "oom": True, "exit_reason": "CudaOOM",
            "finished_at": "2026-11-01T11:00:00Z"}))
        ooms, ratios = total("vramfit_ooms_total"), total("vramfit_vram_prediction_ratio_count")
        result = store_decision(ledger, metrics, DecisionIn.model_validate(
            decision_payload("run-b", name="train", decided_at="2026-11-02T10:00:00Z")))
        assert result.newly_joined == ()
        assert total("vramfit_ooms_total") == ooms == 1
        assert total("vramfit_vram_prediction_ratio_count") == ratios == 1
        store_actual(ledger, metrics, ActualIn.model_validate({
            **name, "peak_vram_bytes": 5 * gib, "runtime_seconds": 2000, "oom": False, "exit_reason": "Completed",
            "finished_at": "2026-11-02T11:00:00Z"}))
        run_a, run_b = ledger.joined_row("run-a"), ledger.joined_row("run-b")
        assert run_a is not None and run_b is not None
        [a], [b] = run_a.actuals, run_b.actuals
        assert (a.actual.peak_vram_bytes, a.actual.oom, a.actual.exit_reason) == (10 * gib, True, "CudaOOM")
        assert (b.actual.peak_vram_bytes, b.actual.oom, b.actual.exit_reason) == (5 * gib, False, "Completed")
        # run A's report arriving late, after B was decided, still goes to A (it started before B was decided)
        store_actual(ledger, metrics, ActualIn.model_validate({
            **name, "source": "manual", "peak_vram_bytes": 11 * gib, "runtime_seconds": 3000, "oom": True,
            "finished_at": "2026-11-01T11:00:00Z"}))
        assert {x.actual.source for x in ledger.joined_row("run-a").actuals} == {"reporter", "manual"}
    finally:
        ledger.close()


def test_a_re_created_jobs_report_that_comes_before_its_decision_waits_for_it(tmp_path: Path) -> None:
    """A job that ran to its end is re-created under its name, run B's report arriving before decision B (a forwarder
    or the ledger writer still held the decision). It was pinned to run A's decision: A's row took B's figures, B
    never got its report, and B's report was scored against A. Now it waits under the name and joins B when B
    comes. Another rank's report of A (no runtime given), and a retry after A failed, still merge into A."""
    from scheduler.integrations.metrics import Metrics
    from scheduler.integrations.records import ActualIn, DecisionIn
    from scheduler.integrations.server import store_actual, store_decision

    ledger, metrics = SqliteLedger(tmp_path / "ledger.sqlite"), Metrics()
    gib = 2**30
    name = {"namespace": "ml", "kind": "Job", "name": "train", "source": "reporter"}

    def total(metric: str) -> float:
        return sum(s.value for family in metrics.registry.collect() for s in family.samples if s.name == metric)

    try:
        store_decision(ledger, metrics, DecisionIn.model_validate(
            decision_payload("run-a", name="train", decided_at="2026-11-01T10:00:00Z")))
        store_actual(ledger, metrics, ActualIn.model_validate({
            **name, "peak_vram_bytes": 10 * gib, "runtime_seconds": 3000, "oom": False, "exit_reason": "Completed",
            "finished_at": "2026-11-01T11:00:00Z"}))
        rank = store_actual(ledger, metrics, ActualIn.model_validate({
            **name, "peak_vram_bytes": 11 * gib, "runtime_seconds": None, "oom": False, "exit_reason": "Completed",
            "finished_at": "2026-11-01T11:00:05Z"}))
        assert rank.decision is not None and rank.decision.decision_id == "run-a"
        early = store_actual(ledger, metrics, ActualIn.model_validate({
            **name, "peak_vram_bytes": 5 * gib, "runtime_seconds": 2000, "oom": False, "exit_reason": "Completed",
            "finished_at": "2026-11-02T11:00:00Z"}))
        assert early.decision is None and total("vramfit_vram_prediction_ratio_count") == 1
        joined = store_decision(ledger, metrics, DecisionIn.model_validate(
            decision_payload("run-b", name="train", decided_at="2026-11-02T10:00:00Z")))
        assert [a.actual.peak_vram_bytes for a in joined.newly_joined] == [5 * gib]
        [a] = ledger.joined_row("run-a").actuals  # type: ignore[union-attr]
        [b] = ledger.joined_row("run-b").actuals  # type: ignore[union-attr]
        assert (a.actual.peak_vram_bytes, b.actual.peak_vram_bytes) == (11 * gib, 5 * gib)
        assert total("vramfit_vram_prediction_ratio_count") == 2
    finally:
        ledger.close()
