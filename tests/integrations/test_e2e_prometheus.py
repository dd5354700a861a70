"""End to end: ``vramfit serve`` and a fake DCGM exporter, scraped by a real Prometheus on loopback."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import httpx
import pytest

from scheduler.cli.collect import sweep_dcgm
from scheduler.integrations.ledger import SqliteLedger
from scheduler.integrations.prom_actuals import MIB, dcgm_actual, query_device_peak
from scheduler.integrations.records import ActualIn, DecisionIn
from tests.integrations.payloads import GIB, decision_payload
from tests.integrations.processes import NO_PROMETHEUS, PROMETHEUS, FakeDcgmExporter, PrometheusProcess, ServeProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS),
]

PREDICTED = 10 * GIB
RATIOS = (0.8, 0.95, 1.05, 1.25)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):  # type: ignore[no-untyped-def]
    work = tmp_path_factory.mktemp("stack")
    serve = ServeProcess(work / "ledger.sqlite", work / "serve.log")
    dcgm = FakeDcgmExporter()
    try:
        prom = PrometheusProcess(work, {"vramfit": f"127.0.0.1:{serve.port}", "dcgm": dcgm.address})
    except BaseException:
        serve.stop()
        dcgm.stop()
        raise
    yield serve, prom, dcgm, work
    prom.stop()
    dcgm.stop()
    serve.stop()


def test_prometheus_records_the_prediction_ratios(stack):
    serve, prom, _, _ = stack
    with httpx.Client(base_url=serve.url, timeout=5) as client:
        for i, ratio in enumerate(RATIOS):
            body = decision_payload(f"r{i}", peak_vram_bytes=PREDICTED, peak_vram_upper_bytes=int(PREDICTED * 1.15))
            assert client.post("/v1/decisions", json=body).status_code == 201
            actual = {"decision_id": f"r{i}", "peak_vram_bytes": int(PREDICTED * ratio), "runtime_seconds": 1800.0,
                      "oom": ratio > 1.2, "source": "reporter"}
            assert client.post("/v1/actuals", json=actual).status_code == 202
        # The Kubernetes watcher reports the same OOM: still one job that ran out of memory.
        oom_job = {"decision_id": f"r{len(RATIOS) - 1}", "peak_vram_bytes": None, "runtime_seconds": 1700.0,
                   "oom": True, "exit_reason": "CudaOOM", "source": "kubernetes"}
        assert client.post("/v1/actuals", json=oom_job).status_code == 202

    prom.wait_for('sum(vramfit_vram_prediction_ratio_count{source="reporter"})', len(RATIOS))
    prom.wait_for('sum(vramfit_actuals_received_total{source="kubernetes"})', 1)
    assert prom.scalar('sum(vramfit_vram_prediction_ratio_sum{source="reporter"})') == pytest.approx(sum(RATIOS))
    assert prom.scalar('sum(vramfit_vram_under_predictions_total{bound="point"})') == 2
    assert prom.scalar('sum(vramfit_vram_under_predictions_total{bound="upper"})') == 1
    assert prom.scalar("sum(vramfit_ooms_total)") == 1
    # VramfitOomAfterPlacement tells a restarted collector from a newly scraped one by the counter's start time.
    assert prom.scalar('count(time() - vramfit_ooms_start_time_seconds{pool="a100", method="lora"} < 1800)') == 1
    # Rank 2 of 4 falls on the 0.95 bucket boundary.
    median = prom.scalar('histogram_quantile(0.5, sum by (le) (vramfit_vram_prediction_ratio_bucket'
                         '{source="reporter"}))')
    assert median == pytest.approx(0.95)
    assert prom.scalar('sum(vramfit_placements_total{pool="a100", outcome="placed"})') == len(RATIOS)
    assert prom.scalar('vramfit_ledger_records{table="decisions"}') >= len(RATIOS)
    assert prom.scalar("sum(vramfit_runtime_prediction_ratio_sum) / sum(vramfit_runtime_prediction_ratio_count)") \
        == pytest.approx(0.5)
    assert prom.scalar("count(vramfit_build_info)") == 1
    # No series carries a job id.
    series = httpx.get(prom.url + "/api/v1/series", params={"match[]": '{__name__=~"vramfit_.+"}'}, timeout=5)
    assert not any(v.startswith("r") and v[1:].isdigit() for s in series.json()["data"] for v in s.values())


def test_dcgm_peak_becomes_the_device_actual(stack):
    serve, prom, dcgm, work = stack
    ns, job = "ml", "llama-ft"
    pod = f"{job}-worker-0"
    start = datetime.now(timezone.utc)
    dcgm.set(ns, pod, "0", 2000)
    dcgm.set(ns, pod, "1", 1500)
    dcgm.set(ns, "other-job-worker-0", "2", 79000)  # another job's GPU never counts
    time.sleep(3)
    dcgm.set(ns, pod, "0", 30000)  # the peak, on GPU 0
    dcgm.set(ns, pod, "1", 28000)
    time.sleep(4)
    dcgm.set(ns, pod, "0", 500)
    dcgm.set(ns, pod, "1", 500)
    time.sleep(3)
    end = datetime.now(timezone.utc)

    peak = query_device_peak(prom.url, ns, f"{job}-.+", start, end, slack_seconds=0)
    assert peak is not None and peak.devices == 2
    assert peak.peak_vram_bytes == 30000 * MIB
    assert query_device_peak(prom.url, ns, "nobody-.+", start, end) is None

    body = decision_payload("dcgm-1", namespace=ns, name=job, kind="PyTorchJob", peak_vram_bytes=25000 * MIB)
    with httpx.Client(base_url=serve.url, timeout=5) as client:
        assert client.post("/v1/decisions", json=body).status_code == 201
        stored = SqliteLedger(work / "ledger.sqlite").get_decision("dcgm-1")
        assert stored is not None
        actual = dcgm_actual(prom.url, stored, finished_at=end, started_at=start, slack_seconds=0)
        assert actual is not None and actual.peak_vram_bytes == 30000 * MIB
        r = client.post("/v1/actuals", json=actual.model_dump(mode="json"))
        assert r.status_code == 202 and r.json()["decision_id"] == "dcgm-1"
    prom.wait_for('sum(vramfit_vram_prediction_ratio_count{source="dcgm"})', 1)
    assert prom.scalar('sum(vramfit_vram_prediction_ratio_sum{source="dcgm"})') == pytest.approx(30000 / 25000)

    # The collector's sweep does the same from the Kubernetes actual's finish time and runtime.
    ledger = SqliteLedger(work / "collector.sqlite")
    ledger.record_decision(DecisionIn.model_validate(body))
    ledger.record_actual(ActualIn(decision_id="dcgm-1", peak_vram_bytes=None, oom=False, source="kubernetes",
                                  runtime_seconds=(end - start).total_seconds(), finished_at=end))
    assert sweep_dcgm(ledger, prom.url) == 1
    assert sweep_dcgm(ledger, prom.url) == 0  # done once
    merged = ledger.joined_rows()[0].merged
    assert merged is not None and merged.peak_vram_bytes == 30000 * MIB and merged.sources == ("kubernetes", "dcgm")
