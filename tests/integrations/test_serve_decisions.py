"""How `vramfit serve` records and counts its decisions, over real HTTPS on 127.0.0.1: with its own ledger, a
decision is written by a background thread, so a ledger file another process holds locked stalls neither the
admission answer nor /healthz, and the decision is recorded once the lock is gone; without a ledger, /mutate and
/validate of one job count one placement, not two."""

from __future__ import annotations

import re
import sqlite3
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integrations.certs import make_ca, write_server_pair
from tests.integrations.manifests import admission_review, apply, patch_ops, pod
from tests.integrations.processes import free_port, wait_until
from tests.integrations.serving import ready, start_webhook, stop

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SPEC = "model: llama-3.1-8b\nmethod: lora\ntrain_tokens: 100000000"


def _serve(directory: Path, extra: list[str]) -> Iterator[tuple[str, ssl.SSLContext, subprocess.Popen[bytes], Path]]:
    ca = make_ca()
    (directory / "ca.crt").write_bytes(ca.pem())
    write_server_pair(ca, directory)
    verify = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    port = free_port()
    process, log_path = start_webhook(directory, port, extra)
    url = f"https://127.0.0.1:{port}"
    try:
        wait_until(lambda: ready(url, process, log_path, verify=verify), 60, "the webhook's /readyz")
        yield url, verify, process, log_path
    finally:
        stop(process)


@pytest.fixture
def with_ledger(tmp_path: Path) -> Iterator[tuple[str, ssl.SSLContext, Path]]:
    ledger = tmp_path / "ledger.sqlite"
    for url, verify, _, _ in _serve(tmp_path, ["--ledger", str(ledger)]):
        yield url, verify, ledger


@pytest.fixture
def without_ledger(tmp_path: Path) -> Iterator[tuple[str, ssl.SSLContext]]:
    for url, verify, _, _ in _serve(tmp_path, []):
        yield url, verify


def _metric(text: str, name: str) -> float:
    values = [float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)]
    return sum(values)


def test_a_locked_ledger_stalls_no_admission_and_the_decision_is_recorded_after(
        with_ledger: tuple[str, ssl.SSLContext, Path]) -> None:
    """Another writer holds the ledger file (a collector on the same file, a long prune). The review is answered
    while the lock is still held (it used to wait the ledger's 10 s busy timeout on the event loop, /healthz with
    it, and then lose the decision), and the decision is in the ledger once the lock is released."""
    url, verify, ledger = with_ledger
    other = sqlite3.connect(str(ledger), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with httpx.Client(base_url=url, verify=verify, timeout=5) as client:  # under the 10 s busy timeout
            review = client.post("/mutate", json=admission_review(pod(spec=SPEC), uid="locked-1")).json()
            assert client.get("/healthz").status_code == 200
            decision_id = review["response"]["auditAnnotations"]["decision-id"]
    finally:
        other.execute("ROLLBACK")
        other.close()

    def recorded() -> dict[str, Any] | None:
        reply = httpx.get(f"{url}/v1/decisions/{decision_id}", verify=verify, timeout=5)
        return reply.json() if reply.status_code == 200 else None

    row = wait_until(recorded, 30, f"decision {decision_id} in the ledger after the lock was released")
    assert row["decision"]["pool"] == review["response"]["auditAnnotations"]["pool"]
    metrics = httpx.get(url + "/metrics", verify=verify, timeout=5).text
    assert _metric(metrics, "vramfit_placements_total") == 1.0
    assert _metric(metrics, "vramfit_decisions_forward_dropped_total") == 0.0


def test_without_a_ledger_mutate_and_validate_of_one_job_count_one_placement(
        without_ledger: tuple[str, ssl.SSLContext]) -> None:
    """/mutate and /validate both return the job's decision; without a ledger (which keys decisions by id) each
    was counted, so every job showed as two placements and twice its predicted cost."""
    url, verify = without_ledger
    job = pod(spec=SPEC)
    with httpx.Client(base_url=url, verify=verify, timeout=10) as client:
        mutated = client.post("/mutate", json=admission_review(job, uid="m-1")).json()
        patched = apply(job, patch_ops(mutated))
        validated = client.post("/validate", json=admission_review(patched, uid="v-1")).json()
        assert validated["response"]["allowed"] is True
        metrics = client.get("/metrics").text
    cost = float(patched["metadata"]["annotations"]["vramfit.io/predicted-cost-usd"])
    assert _metric(metrics, "vramfit_placements_total") == 1.0
    assert _metric(metrics, "vramfit_predicted_cost_usd_total") == pytest.approx(cost, rel=0.01)
