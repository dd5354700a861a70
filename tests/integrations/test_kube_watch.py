from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.integrations.kube_watch import handle_pod_event
from scheduler.integrations.ledger import SqliteLedger

EVENTS = json.loads((Path(__file__).parent / "data/pod_watch_events.json").read_text())


def results():  # type: ignore[no-untyped-def]
    return [handle_pod_event(e) for e in EVENTS]


def test_only_finished_annotated_pods_give_actuals():
    actuals = [r.actual for r in results() if r.actual is not None]
    assert [a.decision_id for a in actuals] == ["dec-ok", "dec-cuda-oom", "dec-host-oom", "dec-evicted"]
    assert all(a.source == "kubernetes" and a.peak_vram_bytes is None for a in actuals)
    ignored = [r.ignored for r in results()[:2]] + [results()[5].ignored]
    assert ignored == ["phase Pending", "phase Running", "no vramfit annotation"]


@pytest.mark.parametrize(
    ("decision_id", "oom", "reason", "exit_code", "runtime_seconds"),
    [
        ("dec-ok", False, "Completed", 0, 3000.0),
        ("dec-cuda-oom", True, "CudaOOM", 1, 151.0),
        ("dec-host-oom", False, "OOMKilled", 137, 600.0),  # host memory, not a VRAM miss
        ("dec-evicted", False, "Evicted", None, None),
    ],
)
def test_exit_reasons(decision_id, oom, reason, exit_code, runtime_seconds):
    (a,) = [r.actual for r in results() if r.actual is not None and r.actual.decision_id == decision_id]
    assert (a.oom, a.exit_reason, a.exit_code, a.runtime_seconds) == (oom, reason, exit_code, runtime_seconds)


def test_bookmark_and_expired_watch():
    *_, bookmark, _, error = results()
    assert bookmark.resource_version == "110" and bookmark.actual is None
    assert error.resync and "too old resource version" in error.ignored


def test_replaying_the_stream_is_idempotent_in_the_ledger(tmp_path):
    ledger = SqliteLedger(tmp_path / "l.sqlite")
    for _ in range(2):
        for r in results():
            if r.actual is not None:
                ledger.record_actual(r.actual)
    assert ledger.counts()["actuals"] == 4


def finished_pod(decision_id: str, **container: object) -> dict:  # type: ignore[type-arg]
    terminated = {"exitCode": 1, "reason": "Error", "startedAt": "2025-01-01T00:00:00Z",
                  "finishedAt": "2025-01-01T00:10:00Z"}
    status = {"name": "train", "state": {"terminated": terminated}, **container}
    return {"type": "MODIFIED", "object": {"metadata": {"annotations": {"vramfit.io/decision-id": decision_id}},
                                           "status": {"phase": "Failed", "containerStatuses": [status]}}}


def test_a_pod_whose_status_is_no_actual_is_ignored_not_raised():
    # each of these ended the collector's watch thread for good before: any user can make such a pod
    long_id = handle_pod_event(finished_pod("x" * 300))
    assert long_id.actual is None and "not readable as an actual" in long_id.ignored
    bad_time = finished_pod("ok")
    bad_time["object"]["status"]["containerStatuses"][0]["state"]["terminated"]["startedAt"] = "yesterday"
    assert "not readable as an actual" in handle_pod_event(bad_time).ignored
    backwards = finished_pod("ok")
    backwards["object"]["status"]["containerStatuses"][0]["state"]["terminated"]["startedAt"] = "2025-01-02T00:00:00Z"
    assert handle_pod_event(backwards).actual.runtime_seconds is None  # clock skew: no runtime, still an actual


def test_a_cuda_oom_of_an_earlier_attempt_counts():
    restarted = finished_pod("ok", lastState={"terminated": {"exitCode": 1, "message": "torch.OutOfMemoryError: "
                                                                                       "CUDA out of memory"}})
    assert handle_pod_event(restarted).actual.oom is True


def _terminated(name: str, phase: str, code: int, reason: str, start: str, end: str) -> dict:
    return {"type": "MODIFIED", "object": {
        "metadata": {"name": name, "annotations": {"vramfit.io/decision-id": "d1"}},
        "status": {"phase": phase, "containerStatuses": [{"name": "t", "state": {"terminated": {
            "exitCode": code, "reason": reason, "startedAt": start, "finishedAt": end}}}]}}}


def test_the_pod_that_ended_last_tells_how_the_job_ended_whatever_order_the_events_come_in(tmp_path: Path) -> None:
    """Two ranks of one job: rank 0 failed at 10:20, rank 1 completed at 10:19. A watch's re-list re-sends every
    finished pod; before, the event delivered last decided (the failed job turned "Completed" and its runtime was
    scored a second time). A retried pod that succeeds after a failed one ends later, and the job completed."""
    from scheduler.integrations.metrics import Metrics
    from scheduler.integrations.records import DecisionIn
    from scheduler.integrations.server import store_actual, store_decision
    from tests.integrations.payloads import decision_payload

    failed = _terminated("w-0", "Failed", 1, "Error", "2026-11-01T10:00:00Z", "2026-11-01T10:20:00Z")
    completed = _terminated("w-1", "Succeeded", 0, "Completed", "2026-11-01T10:00:00Z", "2026-11-01T10:19:00Z")
    retried = _terminated("w-0-retry", "Succeeded", 0, "Completed", "2026-11-01T10:21:00Z", "2026-11-01T11:00:00Z")
    ledger, metrics = SqliteLedger(tmp_path / "l.sqlite"), Metrics()
    try:
        store_decision(ledger, metrics, DecisionIn.model_validate(decision_payload("d1")))
        ends = []
        for event in (completed, failed, completed, failed, completed):
            store_actual(ledger, metrics, handle_pod_event(event).actual)  # type: ignore[union-attr]
            merged = ledger.joined_row("d1").merged  # type: ignore[union-attr]
            ends.append((merged.exit_reason, merged.ran_to_end))
        assert ends == [("Completed", True)] + [("Error", False)] * 4
        observed = sum(s.value for f in metrics.registry.collect() for s in f.samples
                       if s.name == "vramfit_runtime_prediction_ratio_count")
        assert observed == 1  # the first Completed only; the re-sent one is not scored again
        store_actual(ledger, metrics, handle_pod_event(retried).actual)  # type: ignore[union-attr]
        merged = ledger.joined_row("d1").merged  # type: ignore[union-attr]
        assert (merged.exit_reason, merged.ran_to_end) == ("Completed", True)
        assert merged.runtime_seconds == pytest.approx(39 * 60)  # the latest pod's own runtime, the longest here
    finally:
        ledger.close()
