"""Starting and stopping `vramfit serve` in a subprocess on 127.0.0.1 (tests and the load benchmark)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from tests.integrations.manifests import REPO
from tests.integrations.processes import free_port

__all__ = ["free_port", "ready", "start_webhook", "stop"]


def ready(url: str, process: subprocess.Popen, log_path: Path, **client: object) -> bool:
    """Whether the server at ``url`` answers ``/readyz`` with 200; fails with its log if the process has exited
    (use with :func:`tests.integrations.processes.wait_until`, which retries while it cannot connect)."""
    assert process.poll() is None, log_path.read_text()
    return httpx.get(url + "/readyz", timeout=1, **client).status_code == 200  # type: ignore[arg-type]


def start_webhook(directory: Path, port: int, extra: Sequence[str] = (),
                  preexec: Callable[[], None] | None = None) -> tuple[subprocess.Popen, Path]:
    """Serve ``directory``/tls.crt and tls.key on 127.0.0.1:``port``; output goes to server.log there."""
    log_path = directory / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--tls-cert", str(directory / "tls.crt"), "--tls-key", str(directory / "tls.key"), *extra],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec)
    return process, log_path


def stop(process: subprocess.Popen) -> None:
    """Terminate, then kill after 10 s."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
