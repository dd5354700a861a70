"""What `vramfit serve` does with clients that never finish a request, over real HTTPS on 127.0.0.1: a body that
trickles in is answered 408 and its connection closed, and SIGTERM ends the process (and its clean-up runs)
while such a request is in progress."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("cryptography")

from scheduler.integrations import http_body  # noqa: E402
from scheduler.integrations.ledger import open_ledger  # noqa: E402
from scheduler.integrations.server import create_app  # noqa: E402
from scheduler.integrations.tls import server_context  # noqa: E402
from scheduler.integrations.webhook import WebhookState, webhook_routes  # noqa: E402
from tests.integrations.certs import make_ca, write_server_pair  # noqa: E402
from tests.integrations.processes import wait_until  # noqa: E402
from tests.integrations.serving import free_port, ready, start_webhook, stop  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SLOW_HEAD = (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 1000\r\n\r\n{")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("serve-audit")
    ca = make_ca()
    (directory / "ca.crt").write_bytes(ca.pem())
    write_server_pair(ca, directory)
    return directory


def _client_context(certs: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs / "ca.crt"))


@pytest.fixture
def https_app(certs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The webhook routes (body limit 0.5 s) and a ledger's /v1 routes (the module's default limit, set to
    0.5 s here) served in this process by uvicorn over TLS; yields the port."""
    monkeypatch.setattr(http_body, "BODY_TIMEOUT_SECONDS", 0.5)
    ledger = open_ledger(str(tmp_path / "ledger.sqlite"))
    app = create_app(ledger, extra_routes=webhook_routes(WebhookState(body_timeout_seconds=0.5)))
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    config.load()
    config.ssl = server_context(certs / "tls.crt", certs / "tls.key")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "uvicorn in a thread")
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        ledger.close()


def _slow_request(port: int, certs: Path, path: bytes) -> ssl.SSLSocket:
    """A TLS connection that has sent the head of a 1000-byte body and one byte of it."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    tls = _client_context(certs).wrap_socket(raw, server_hostname="127.0.0.1")
    tls.sendall(SLOW_HEAD % path)
    return tls


def _read_until_closed(tls: ssl.SSLSocket) -> bytes:
    """Everything the server sends until it closes the connection (a socket timeout of 10 s fails the test)."""
    received = b""
    while chunk := tls.recv(65536):
        received += chunk
    return received


@pytest.mark.parametrize("path", [b"/mutate", b"/validate", b"/v1/actuals", b"/v1/decisions"])
def test_a_body_that_never_completes_is_answered_408_and_the_connection_closed(
        https_app: int, certs: Path, path: bytes) -> None:
    # Before: no limit; the server waited for the other 999 bytes for ever (this read timed out).
    with _slow_request(https_app, certs, path) as tls:
        answer = _read_until_closed(tls)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in head.lower()
    assert b"request body not complete within 0.5 s (1 bytes arrived)" in body


def test_sigterm_ends_the_server_while_a_body_trickles_in(certs: Path, tmp_path: Path) -> None:
    """A request in progress gets --shutdown-timeout-seconds, then the clean-up runs and the process exits 0 (before:
    uvicorn waited on it for ever, and the kubelet's SIGKILL after the grace period skipped the clean-up)."""
    directory = tmp_path / "server"
    directory.mkdir()
    for name in ("tls.crt", "tls.key"):
        (directory / name).write_bytes((certs / name).read_bytes())
    port = free_port()
    process, log_path = start_webhook(directory, port, ["--shutdown-timeout-seconds", "1"])
    try:
        url = f"https://127.0.0.1:{port}"
        wait_until(lambda: ready(url, process, log_path, verify=_client_context(certs)), 60, "the webhook's /readyz")
        with _slow_request(port, certs, b"/mutate") as tls:
            tls.sendall(b" ")
            # answered after the slow request's head was read (one event loop, bytes handled in arrival order)
            assert httpx.get(url + "/healthz", verify=_client_context(certs), timeout=10).status_code == 200
            process.send_signal(signal.SIGTERM)
            returncode: Any = wait_until(lambda: process.poll() is not None and (process.returncode,), 20,
                                         "the server to exit after SIGTERM")
        assert returncode == (0,), log_path.read_text()
        assert '"msg": "server stopping"' in log_path.read_text()
    finally:
        if process.poll() is None:
            stop(process)


def test_the_start_up_log_says_where_it_listens_and_what_it_loaded() -> None:
    import argparse
    from types import SimpleNamespace

    from scheduler.cli.serve import _startup_fields
    from scheduler.pools import default_pools

    args = argparse.Namespace(host="0.0.0.0", port=8443, tls_cert=Path("/tls/tls.crt"), pools=None, ledger=None,
                              ledger_url="http://vramfit-collector.vramfit-system.svc:8080")
    fields = _startup_fields(args, SimpleNamespace(pools=default_pools))
    assert fields["address"] == "0.0.0.0:8443" and fields["tls_cert"] == "/tls/tls.crt"
    assert fields["pools_file"] == "embedded" and fields["pools"] == ["l40s", "a100-80gb", "h100-80gb", "b200"]
    assert fields["residual_models"]["vram"].startswith("residual-")
    assert fields["residual_models"]["runtime"].startswith("runtime-residual-")


def test_readyz_is_503_while_the_residual_model_it_is_told_to_use_is_missing(
        certs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$VRAMFIT_RESIDUAL_MODEL naming a missing file used to leave /readyz at 200 while every prediction fell back to
    the analytic model; now the pod is not ready, says why, and becomes ready once the file is there (the model
    watch loads it)."""
    import shutil

    from predictors.persistence import shipped_model_path

    directory = tmp_path / "server"
    directory.mkdir()
    for name in ("tls.crt", "tls.key"):
        (directory / name).write_bytes((certs / name).read_bytes())
    model = tmp_path / "cluster.skops"
    monkeypatch.setenv("VRAMFIT_RESIDUAL_MODEL", str(model))
    port = free_port()
    process, log_path = start_webhook(directory, port)
    url = f"https://127.0.0.1:{port}"
    verify = _client_context(certs)

    def readyz() -> Any:
        if process.poll() is not None:
            raise AssertionError(log_path.read_text())
        try:
            return httpx.get(url + "/readyz", verify=verify, timeout=2)
        except httpx.TransportError:
            return None

    try:
        reply = wait_until(readyz, 60, "the webhook to answer /readyz")
        assert reply.status_code == 503, reply.text
        assert f"$VRAMFIT_RESIDUAL_MODEL names {model}" in reply.json()["error"]
        assert httpx.get(url + "/healthz", verify=verify, timeout=2).status_code == 200  # alive, not ready
        shipped = shipped_model_path()
        shutil.copy(shipped.with_name(shipped.stem + ".serving.npz"), model.with_name(model.stem + ".serving.npz"))
        shutil.copy(shipped, model)
        wait_until(lambda: (r := readyz()) is not None and r.status_code == 200, 30, "/readyz 200 after the model")
    finally:
        stop(process)


def test_bodies_the_ledger_could_not_store_are_422_over_https_and_the_server_keeps_serving(
        https_app: int, certs: Path) -> None:
    """A lone surrogate in a decision's notes and features 400 levels deep were 500s (the ledger's JSON writer raised),
    features 250 levels deep were stored and then broke every read of the job; a measured runtime of 1e-320 s made the
    report's figures infinite. Each is answered 422 naming the field, nothing is stored, and the next post is served."""
    from tests.integrations.payloads import decision_payload

    url = f"https://127.0.0.1:{https_app}"
    verify = _client_context(certs)
    deep: Any = 1
    for _ in range(250):
        deep = {"a": deep}
    actual = {"decision_id": "ok", "peak_vram_bytes": 2**30, "oom": False, "source": "reporter"}
    bodies = [
        ("/v1/decisions", json.dumps(decision_payload("bad", notes=["XX"])).replace('"XX"', '"\\ud800"'), "notes"),
        ("/v1/decisions", json.dumps(decision_payload("bad") | {"features": {"x": deep}}), "features"),
        ("/v1/actuals", json.dumps(actual | {"runtime_seconds": 1e-320}), "runtime_seconds"),
    ]
    with httpx.Client(base_url=url, verify=verify, timeout=10) as client:
        for path, body, field in bodies:
            r = client.post(path, content=body.encode(), headers={"content-type": "application/json"})
            assert r.status_code == 422, r.text
            assert [p["field"] for p in r.json()["problems"]] == [field]
        assert client.get("/v1/decisions/bad").status_code == 404
        assert client.post("/v1/decisions", json=decision_payload("ok")).status_code == 201
        assert client.post("/v1/actuals", json=actual | {"runtime_seconds": 60.0}).json()["decision_id"] == "ok"
        assert client.get("/readyz").status_code == 200
