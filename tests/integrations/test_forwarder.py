"""The decision forwarder of stateless webhook replicas (``vramfit serve --ledger-url``), against a stub
collector on 127.0.0.1, and the argument checks of ``serve``/``collect`` around it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import main
from scheduler.integrations.forwarder import DecisionForwarder
from tests.integrations.processes import free_port, wait_until
from tests.integrations.stub_http import StubHttpServer


class StubCollector(StubHttpServer):
    """Answers POST /v1/decisions with the next status of ``statuses`` (then 201), recording the bodies."""


@pytest.fixture
def stub() -> Iterator[StubCollector]:
    collector = StubCollector()
    yield collector
    collector.stop()


def record(i: int) -> dict[str, Any]:
    return {"decision_id": f"d-{i}", "outcome": "placed", "pool": "h100"}


def test_forwards_in_order_with_the_token(stub: StubCollector) -> None:
    forwarder = DecisionForwarder(stub.url, token="s3cret", backoff_seconds=0.01).start()
    for i in range(5):
        forwarder.submit(record(i))
    assert forwarder.stop(flush_seconds=10) == 0
    assert [r["decision_id"] for r in stub.received] == [f"d-{i}" for i in range(5)]
    assert all(h["Authorization"] == "Bearer s3cret" for h in stub.headers)
    assert forwarder.sent == 5


def test_retries_5xx_and_429_then_delivers(stub: StubCollector) -> None:
    stub.statuses = [503, 429, 500]
    drops: list[str] = []
    forwarder = DecisionForwarder(stub.url, backoff_seconds=0.01, on_drop=drops.append).start()
    forwarder.submit(record(1))
    wait_until(lambda: stub.received, 10, "the decision after three failures")
    forwarder.stop()
    assert [r["decision_id"] for r in stub.received] == ["d-1"] and drops == []


def test_a_rejected_record_is_dropped_and_the_next_goes_through(stub: StubCollector) -> None:
    stub.statuses = [422]
    drops: list[str] = []
    forwarder = DecisionForwarder(stub.url, backoff_seconds=0.01, on_drop=drops.append).start()
    forwarder.submit(record(1))
    forwarder.submit(record(2))
    assert forwarder.stop(flush_seconds=10) == 0
    assert drops == ["rejected"] and [r["decision_id"] for r in stub.received] == ["d-2"]


def test_a_record_the_collector_keeps_failing_is_given_up(stub: StubCollector) -> None:
    stub.statuses = [500] * 3
    drops: list[str] = []
    forwarder = DecisionForwarder(stub.url, backoff_seconds=0.01, max_attempts=3, on_drop=drops.append).start()
    forwarder.submit(record(1))
    forwarder.submit(record(2))
    assert forwarder.stop(flush_seconds=10) == 0
    assert drops == ["failed"] and [r["decision_id"] for r in stub.received] == ["d-2"]


def test_a_full_queue_drops_the_oldest_and_submit_never_blocks() -> None:
    drops: list[str] = []
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: every post is a connection error
    forwarder = DecisionForwarder(dead, capacity=10, backoff_seconds=0.05, on_drop=drops.append).start()
    start = time.perf_counter()
    for i in range(1000):
        forwarder.submit(record(i))
    elapsed_seconds = time.perf_counter() - start
    assert elapsed_seconds < 5, f"1000 submits took {elapsed_seconds:.3f} s"  # generous: no network wait
    # capacity 10 queued plus at most one in flight survive; every other record was dropped and counted.
    assert 1000 - 11 <= len(drops) <= 1000 - 10 and set(drops) == {"queue_full"}
    assert forwarder.pending() <= 11
    started = time.perf_counter()
    assert forwarder.stop(flush_seconds=0.2) <= 11  # unreachable collector: stop is still bounded
    assert time.perf_counter() - started < 7


def test_records_wait_while_the_collector_is_down_then_arrive() -> None:
    port = free_port()
    forwarder = DecisionForwarder(f"http://127.0.0.1:{port}", backoff_seconds=0.05, max_backoff_seconds=0.2).start()
    forwarder.submit(record(1))
    time.sleep(0.5)  # a few failed attempts
    assert forwarder.pending() == 1
    collector = StubCollector()
    try:
        forwarder.endpoint = collector.url + "/v1/decisions"  # the collector came up (at a new port)
        wait_until(lambda: collector.received, 10, "the queued decision")
        assert forwarder.stop() == 0
    finally:
        collector.stop()


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--ledger-token-file", "t"], "go with --ledger-url"),
    (["serve", "--ledger-url", "collector:8080"], "must start with http:// or https://"),
    (["serve", "--ledger-url", "http://x", "--forward-queue-size", "0"], "at least 1"),
    (["collect", "--ledger", "l.sqlite"], "give --kube, --prometheus-url, --serve-port"),
    (["collect", "--serve-port", "8080", "--once"], "does not go with --serve-port"),
    (["collect", "--prometheus-url", "http://p", "--token-file", "t"], "go with --serve-port"),
    (["collect", "--serve-port", "8080", "--tls-cert", "c"], "give both --tls-cert and --tls-key"),
    (["serve", "--prune-unjoined-days", "30"], "--prune-unjoined-days goes with --ledger"),
    (["serve", "--ledger", "l.sqlite", "--prune-unjoined-days", "0"], "must be a positive number of days; got 0"),
    (["collect", "--serve-port", "8080", "--prune-unjoined-days", "nan"], "positive number of days; got nan"),
    (["collect", "--serve-port", "8080", "--dcgm-lookback-days", "0"], "--dcgm-lookback-days must be a positive"),
    (["serve", "--port", "99999"], "--port must be a TCP port, 0-65535; got 99999"),
    (["collect", "--serve-port", "-1"], "--serve-port must be a TCP port"),
    (["serve", "--tls-cert", "/nonexistent/tls.crt", "--tls-key", "/nonexistent/tls.key"],
     "cannot load the TLS pair --tls-cert /nonexistent/tls.crt"),
])
def test_argument_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_ledger_and_ledger_url_are_mutually_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["serve", "--ledger", "l.sqlite", "--ledger-url", "http://127.0.0.1:8080"])
    assert caught.value.code == 2
    assert "not allowed with argument --ledger" in capsys.readouterr().err


def test_a_key_that_is_not_the_certificates_is_an_argument_error(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from tests.integrations.certs import issue_server_cert, make_ca

    ca = make_ca()
    cert_pem, _, _ = issue_server_cert(ca)
    _, other_key_pem, _ = issue_server_cert(ca)
    (tmp_path / "tls.crt").write_bytes(cert_pem)
    (tmp_path / "tls.key").write_bytes(other_key_pem)
    argv = ["serve", "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")]
    assert main(argv) == 2
    assert "cannot load the TLS pair" in capsys.readouterr().err
