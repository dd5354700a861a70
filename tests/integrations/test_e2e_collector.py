"""The cluster topology on loopback: a stateless webhook replica (``vramfit serve --ledger-url``, HTTPS) forwards
its decision to the collector (``vramfit collect --serve-port``, the only ledger owner); the training-side
actual posted to the collector joins it, and the collector's /metrics scores the prediction."""

from __future__ import annotations

import re
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integrations.certs import make_ca, write_server_pair
from tests.integrations.manifests import REPO, admission_review, patch_ops, pod
from tests.integrations.processes import free_port, stop_process, wait_until
from tests.integrations.serving import ready, start_webhook

pytestmark = [pytest.mark.slow, pytest.mark.integration]

GIB = 2**30


def start_collector(directory: Path, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    """``vramfit collect`` serving only (no --kube, no Prometheus) on 127.0.0.1:``port``."""
    log_path = directory / "collector.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", "collect", "--serve-host", "127.0.0.1", "--serve-port", str(port),
             "--ledger", str(directory / "ledger.sqlite")],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return process, log_path


def test_decision_forwarded_by_a_stateless_webhook_joins_its_actual_in_the_collector(tmp_path: Path) -> None:
    ca = make_ca()
    (tmp_path / "ca.crt").write_bytes(ca.pem())
    write_server_pair(ca, tmp_path)
    verify = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    collector_port, webhook_port = free_port(), free_port()
    collector_url, webhook_url = f"http://127.0.0.1:{collector_port}", f"https://127.0.0.1:{webhook_port}"

    collector, collector_log = start_collector(tmp_path, collector_port)
    webhook = None
    try:
        wait_until(lambda: ready(collector_url, collector, collector_log), 30, "the collector's /readyz")
        webhook, webhook_log = start_webhook(tmp_path, webhook_port, ["--ledger-url", collector_url])
        wait_until(lambda: ready(webhook_url, webhook, webhook_log, verify=verify), 60, "the webhook's /readyz")

        # The API server sends a GPU pod to the webhook replica, which owns no ledger.
        review = httpx.post(webhook_url + "/mutate", json=admission_review(pod(), uid="e2e-1"), verify=verify,
                            timeout=10).json()
        assert review["response"]["allowed"] is True
        [decision_id] = [op["value"] for op in patch_ops(review)
                         if op["path"] == "/metadata/annotations/vramfit.io~1decision-id"]

        # The job ran; its reporter posts the actual to the collector (possibly before the decision arrives).
        predicted = review["response"]["auditAnnotations"]
        actual = {"decision_id": decision_id, "peak_vram_bytes": 30 * GIB, "runtime_seconds": 1800.0, "oom": False,
                  "source": "reporter"}
        assert httpx.post(collector_url + "/v1/actuals", json=actual, timeout=5).status_code == 202

        def joined() -> dict | None:
            reply = httpx.get(f"{collector_url}/v1/decisions/{decision_id}", timeout=2)
            row = reply.json() if reply.status_code == 200 else None
            return row if row and row["actual"] else None

        row = wait_until(joined, 15, f"decision {decision_id} joined with its actual in the collector")
        assert row["decision"]["decision_id"] == decision_id
        assert row["decision"]["pool"] == predicted["pool"]
        assert row["decision"]["namespace"] == "team-a" and row["decision"]["kind"] == "Pod"
        assert row["actual"]["peak_vram_bytes"] == 30 * GIB and row["actual"]["sources"] == ["reporter"]

        metrics = httpx.get(collector_url + "/metrics", timeout=5).text
        count = re.search(r'^vramfit_vram_prediction_ratio_count\{[^}]*pool="' + re.escape(predicted["pool"])
                          + r'"[^}]*source="reporter"\} (\S+)$', metrics, re.M)
        assert count and float(count.group(1)) == 1.0, metrics
        assert re.search(r'^vramfit_placements_total\{outcome="placed",pool="[^"]+"\} 1\.0$', metrics, re.M)
        webhook_metrics = httpx.get(webhook_url + "/metrics", verify=verify, timeout=5).text
        assert 'vramfit_decisions_forward_dropped_total{reason="queue_full"} 0.0' in webhook_metrics
        assert "vramfit_placements_total{" not in webhook_metrics  # counted once, by the collector
    finally:
        if webhook is not None:
            stop_process(webhook)
        stop_process(collector)
    # Both shut down cleanly on SIGTERM (the collector's background threads included).
    assert collector.returncode == 0, collector_log.read_text()
    assert webhook is not None and webhook.returncode == 0
