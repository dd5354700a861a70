"""The decision forwarder of stateless webhook replicas (``vramfit serve --ledger-url``), against a stub
collector on 127.0.0.1, and the argument checks of ``serve``/``collect`` around it."""

from __future__ import annotations

import argparse
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from predictors.errors import SpecError
from scheduler.cli import main
from scheduler.cli.serve import make_forwarder
from scheduler.cli.server_common import read_token
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


def test_a_rotated_token_file_reaches_the_next_post(stub: StubCollector, tmp_path: Path) -> None:
    from scheduler.integrations.token_file import TokenFile

    path = tmp_path / "token"
    path.write_text("old-token\n")
    forwarder = DecisionForwarder(stub.url, token=TokenFile(path, "old-token", check_seconds=0.0),
                                  backoff_seconds=0.01).start()
    forwarder.submit(record(0))
    deadline = time.monotonic() + 10
    while len(stub.received) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    path.write_text("a-newer-token\n")  # another size and mtime: the Secret was rotated
    forwarder.submit(record(1))
    assert forwarder.stop(flush_seconds=10) == 0
    assert [h["Authorization"] for h in stub.headers] == ["Bearer old-token", "Bearer a-newer-token"]


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


class _RedirectingCollector:
    """Answers every POST with 301 to another loopback server, which records every request it gets."""

    def __init__(self) -> None:
        self.elsewhere: list[tuple[str, str | None]] = []  # (method, Authorization) seen at the Location
        seen = self.elsewhere

        class Elsewhere(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append((self.command, self.headers.get("Authorization")))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
        location = f"http://127.0.0.1:{self.other.server_address[1]}/login"

        class Redirect(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(301)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        for server in (self.server, self.other):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        for server in (self.server, self.other):
            server.shutdown()
            server.server_close()


def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else() -> None:
    """Before: urllib followed the 301 as a GET without the record, sent `Bearer s3cret` to the Location's host,
    and counted the decision as sent."""
    collector = _RedirectingCollector()
    drops: list[str] = []
    try:
        forwarder = DecisionForwarder(collector.url, token="s3cret", on_drop=drops.append).start()
        forwarder.submit(record(1))
        assert forwarder.stop(flush_seconds=10) == 0
    finally:
        collector.stop()
    assert collector.elsewhere == [] and forwarder.sent == 0 and drops == ["rejected"]


def test_a_408_is_retried(stub: StubCollector) -> None:
    """The collector answers 408 to a body that does not arrive in time: a transient failure, not a refusal."""
    stub.statuses = [408]
    drops: list[str] = []
    forwarder = DecisionForwarder(stub.url, backoff_seconds=0.01, on_drop=drops.append).start()
    forwarder.submit(record(1))
    assert forwarder.stop(flush_seconds=10) == 0
    assert drops == [] and [r["decision_id"] for r in stub.received] == ["d-1"]


@pytest.mark.parametrize("token", ["abc\nSECRETPART", "abc SECRETPART", "abc\u2019SECRETPART"])
def test_a_token_that_cannot_be_a_header_is_refused_without_showing_it(token: str, tmp_path: Path) -> None:
    """Before: http.client refused the header at every post, the forwarder retried for ever and logged
    `Invalid header value b'Bearer abc\\nSECRETPART'` (the token) each time."""
    with pytest.raises(ValueError) as caught:
        DecisionForwarder("http://127.0.0.1:1", token=token)
    assert "SECRETPART" not in str(caught.value) and "position 3 of 14" in str(caught.value)
    path = tmp_path / "token"
    path.write_text(token + "\n", encoding="utf-8")
    with pytest.raises(SpecError) as spec_error:
        read_token(path, "--ledger-token-file")
    message = spec_error.value.render()
    assert "--ledger-token-file" in message and "one line of visible ASCII" in message and "SECRETPART" not in message


@pytest.mark.parametrize(("ca_text", "message"), [
    (None, "No such file or directory"),
    ("not a certificate", "no certificate"),
])
def test_a_ca_file_that_cannot_be_loaded_is_an_input_error(tmp_path: Path, ca_text: str | None,
                                                           message: str) -> None:
    """Before: a FileNotFoundError / ssl.SSLError traceback from `vramfit serve`."""
    ca_file = tmp_path / "ca.pem"
    if ca_text is not None:
        ca_file.write_text(ca_text)
    args = argparse.Namespace(ledger_url="https://127.0.0.1:8443", ledger_token_file=None, ledger_ca_file=ca_file,
                              forward_queue_size=10)
    with pytest.raises(SpecError) as caught:
        make_forwarder(args)
    rendered = caught.value.render()
    assert "--ledger-ca-file" in rendered and str(ca_file) in rendered and message in rendered


def test_a_full_queue_drops_the_oldest_and_submit_never_blocks() -> None:
    """A collector that accepts connections and never answers holds the sender's post for its whole timeout; submit
    must neither wait for it nor grow the queue: the records past capacity are dropped and counted. Checked by what
    happens (drops, pending), not by timing: the submits run in a thread that a hang would leave alive."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel accepts; nothing ever answers
    drops: list[str] = []
    forwarder = DecisionForwarder(f"http://127.0.0.1:{silent.getsockname()[1]}", capacity=10, timeout_seconds=30,
                                  backoff_seconds=0.05, on_drop=drops.append).start()
    try:
        submitter = threading.Thread(target=lambda: [forwarder.submit(record(i)) for i in range(1000)])
        submitter.start()
        submitter.join(timeout=60)  # a hang detector: a submit that waited on the post would still be running
        assert not submitter.is_alive(), "submit waited for the collector"
        # capacity 10 queued plus at most one in flight survive; every other record was dropped and counted.
        assert 1000 - 11 <= len(drops) <= 1000 - 10 and set(drops) == {"queue_full"}
        assert forwarder.pending() <= 11
    finally:
        silent.close()  # the in-flight post fails now, and stop drains what it can
    assert forwarder.stop(flush_seconds=0.2) <= 11


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


def test_the_ledger_writer_retries_a_locked_ledger_and_drops_what_it_refuses() -> None:
    """A webhook's own ledger is written from the writer's thread: a LedgerError (the file locked by another
    writer, a full disk) is retried with backoff until the write goes through, in order; a record the ledger
    refuses (ValueError) is dropped at once and counted as rejected; one that keeps failing is given up."""
    from scheduler.integrations.forwarder import LedgerWriter
    from scheduler.integrations.ledger import LedgerError

    written: list[str] = []
    failures = {"d-1": 3, "d-3": 100}
    drops: list[str] = []

    def write(rec: dict[str, Any]) -> None:
        if rec["decision_id"] == "d-2":
            raise ValueError("not a decision")
        if failures.get(rec["decision_id"], 0) > 0:
            failures[rec["decision_id"]] -= 1
            raise LedgerError("cannot write to the ledger: database is locked")
        written.append(rec["decision_id"])

    writer = LedgerWriter(write, backoff_seconds=0.01, max_backoff_seconds=0.02, max_attempts=5,
                          on_drop=drops.append).start()
    for i in range(5):
        writer.submit(record(i))
    wait_until(lambda: writer.pending() == 0, 10, "the writer's queue to drain")
    assert writer.stop() == 0
    assert written == ["d-0", "d-1", "d-4"] and drops == ["rejected", "failed"] and writer.sent == 3


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--ledger-token-file", "t"], "go with --ledger-url"),
    (["serve", "--ledger-url", "collector:8080"], "must start with http:// or https://"),
    (["serve", "--ledger-url", "http://x", "--forward-queue-size", "0"], "at least 1"),
    # Before, each of these started and then retried (or, for the port, failed with a traceback) every decision.
    (["serve", "--ledger-url", "http://collector:80x80"], "--ledger-url has a port that is not a number"),
    (["serve", "--ledger-url", "http://"], "--ledger-url names no host"),
    (["serve", "--ledger-url", "http://u:pw@collector:8080"], "must not hold credentials"),
    (["serve", "--ledger-url", "http://collector:8080/?x=1"], "without ?query or #fragment"),
    (["serve", "--ledger-url", "http://collector:8080", "--ledger-ca-file", "ca.pem"],
     "--ledger-ca-file goes with an https:// --ledger-url"),
    (["serve", "--shutdown-timeout-seconds", "-1"], "--shutdown-timeout-seconds must be a number of seconds"),
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


def test_the_reporters_post_does_not_follow_a_redirect_either() -> None:
    """The training-side reporter (and `vramfit ray submit --ledger-url`) posted with urllib's default opener: on a
    302 it sent `Bearer s3cret` to the Location's host as a GET and returned True, the report stored nowhere."""
    from scheduler.integrations.reporter import post_json

    collector = _RedirectingCollector()
    try:
        sent = post_json(collector.url + "/v1/actuals", {"decision_id": "d-1"}, "s3cret", timeout_seconds=5,
                         attempts=3, backoff_seconds=0.01)
    finally:
        collector.stop()
    assert sent is False and collector.elsewhere == []
