"""Certificate rotation under load: no handshake may fail while the webhook's pair is replaced.

Loading a rotated chain into the live ``ssl.SSLContext`` set the new certificate before the new key; a handshake
between the two met a mismatched pair and failed (``SSLV3_ALERT_HANDSHAKE_FAILURE``, an EOF to some clients: 252 of
2,235 handshakes during 404 rotations in 5 s, and a CI run's rotation test saw one). The reloader now builds a
whole new context and each handshake switches to the newest one.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path

from scheduler.integrations.tls import CertReloader
from tests.integrations.certs import make_ca, write_server_pair


def test_handshakes_never_fail_while_the_pair_rotates(tmp_path: Path) -> None:
    ca = make_ca()
    (tmp_path / "ca.crt").write_bytes(ca.pem())
    write_server_pair(ca, tmp_path)
    reloader = CertReloader(tmp_path / "tls.crt", tmp_path / "tls.key", interval_seconds=3600)
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    port = listener.getsockname()[1]
    stop = threading.Event()
    handshake_failures: list[str] = []
    handshakes = [0]

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return

            def answer(conn: socket.socket = conn) -> None:
                try:
                    with reloader.context.wrap_socket(conn, server_side=True) as tls:
                        tls.sendall(b"x")
                except (OSError, ssl.SSLError):
                    pass  # the client's failure is what the test counts

            threading.Thread(target=answer, daemon=True).start()

    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

    def connect() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                        client.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    tls.recv(1)
                    handshakes[0] += 1
            except ssl.SSLError as exc:  # a handshake that met a half-loaded pair
                handshake_failures.append(repr(exc))
            except OSError:
                pass  # connection-level noise (a reset as the listener closes) is not what this pins

    threading.Thread(target=serve, daemon=True).start()
    clients = [threading.Thread(target=connect, daemon=True) for _ in range(4)]
    for thread in clients:
        thread.start()
    rotations = 0
    deadline = time.monotonic() + 20
    try:
        while (rotations < 150 or handshakes[0] < 400) and time.monotonic() < deadline:
            write_server_pair(ca, tmp_path, common_name=f"rotated-{rotations}")
            assert reloader.check()
            rotations += 1
    finally:
        stop.set()
        listener.close()
        for thread in clients:
            thread.join(timeout=10)
    assert rotations >= 150 and handshakes[0] >= 400, (rotations, handshakes[0])
    assert handshake_failures == [], handshake_failures[:3]
    assert reloader.reloads == rotations
