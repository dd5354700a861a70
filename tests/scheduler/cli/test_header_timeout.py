"""A connection that never finishes its request head is closed after HEADER_TIMEOUT_SECONDS; a whole request on the
same server is answered. Half-sent heads were held for ever: about 50 KB each over TLS, ~9,000 of them took the
webhook past its 512Mi limit (slowloris)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from scheduler.cli.server_common import header_timeout_protocol


async def _app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def server() -> Iterator[int]:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    config = uvicorn.Config(_app, host="127.0.0.1", port=port, log_config=None, access_log=False,
                            http=header_timeout_protocol(0.5), lifespan="off")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(100):
        if srv.started:
            break
        time.sleep(0.05)
    yield port
    srv.should_exit = True
    thread.join(10)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_request_head_never_finished_is_closed(server: int) -> None:
    slow = socket.create_connection(("127.0.0.1", server))
    slow.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")  # no blank line
    assert _closed_within(slow, 5.0)
    whole = socket.create_connection(("127.0.0.1", server))
    whole.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    whole.settimeout(5.0)
    response = b""
    while not response.endswith(b"ok"):
        response += whole.recv(4096)
    assert response.startswith(b"HTTP/1.1 200")
    # the next head on a kept-alive connection gets the same time
    whole.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert _closed_within(whole, 5.0)


def test_a_connection_that_sends_nothing_is_closed(server: int) -> None:
    idle = socket.create_connection(("127.0.0.1", server))
    assert _closed_within(idle, 5.0)
