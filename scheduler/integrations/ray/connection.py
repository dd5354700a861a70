"""Talking to a Ray cluster: the lazy ``ray`` import, address parsing, and calls with a time limit.

Ray's own clients can wait a long time on an address where nothing answers (the GCS client retries for
tens of seconds, ``requests`` has no timeout by default), so every call here first checks that the TCP
port accepts a connection and then runs under a wall-clock limit.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

DEFAULT_DASHBOARD_ADDRESS = "http://127.0.0.1:8265"
DEFAULT_GCS_PORT = 6379
DEFAULT_TIMEOUT_SECONDS = 15.0


class RayIntegrationError(Exception):
    """Ray is missing, or the cluster cannot be reached or used. The CLI prints it and exits 2."""


def import_ray() -> ModuleType:
    """``import ray``, or a clear error naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise RayIntegrationError(
            "Ray is not installed; install it with `pip install 'vramfit[ray]'` (Ray 2.9 or newer, with the "
            "dashboard and job server of ray[default])"
        ) from None
    return ray


def split_host_port(address: str, default_port: int) -> tuple[str, int]:
    """``http://host:8265`` or ``host:6379`` -> (host, port)."""
    text = address.strip()
    if "://" not in text:
        text = "tcp://" + text
    parts = urlsplit(text)
    if not parts.hostname:
        raise RayIntegrationError(f"cannot read a host from the address {address!r}; write HOST:PORT or http://HOST:PORT")
    try:
        port = parts.port
    except ValueError:
        raise RayIntegrationError(f"the port of the address {address!r} is not a number") from None
    return parts.hostname, port or default_port


def dashboard_url(address: str) -> str:
    """The Ray Jobs (dashboard) URL, with ``http://`` added when missing."""
    text = address.strip().rstrip("/")
    return text if "://" in text else f"http://{text}"


def gcs_address_for(dashboard_address: str) -> str:
    """The GCS address of the cluster whose dashboard is at ``dashboard_address``: same host, Ray's default
    GCS port. Clusters started with another ``--port`` must be given their GCS address explicitly."""
    host, _ = split_host_port(dashboard_url(dashboard_address), 8265)
    return f"{host}:{DEFAULT_GCS_PORT}"


def check_reachable(address: str, default_port: int, what: str, timeout_seconds: float) -> None:
    """Fail fast, with a message, when nothing accepts connections at ``address``."""
    host, port = split_host_port(address, default_port)
    try:
        with socket.create_connection((host, port), timeout=timeout_seconds):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RayIntegrationError(f"no Ray {what} at {host}:{port} ({reason}); is the cluster running and is "
                                  f"the address right? (to preview a placement without a cluster: --no-discover "
                                  f"--dry-run)") from None


def auth_hint(exc: BaseException) -> str:
    """A hint for a Ray error that is the cluster's token authentication (on by default in recent Ray), or ''."""
    text = str(exc)
    if "InvalidAuthToken" in text or "Authentication token" in text or "auth token" in text.lower():
        return ("; this Ray cluster requires token authentication: run vramfit with RAY_AUTH_MODE=token and the "
                "cluster's token (RAY_AUTH_TOKEN, or its file, ~/.ray/auth_token by default), or start a local test "
                "cluster with RAY_AUTH_MODE=disabled")
    return ""


def bounded(call: Callable[[], T], timeout_seconds: float, what: str) -> T:
    """Run ``call`` in a daemon thread and give up after ``timeout_seconds`` (the thread is abandoned)."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"vramfit-ray-{what}", daemon=True)
    thread.start()
    thread.join(timeout_seconds)
    if thread.is_alive():
        raise RayIntegrationError(f"{what} did not answer within {timeout_seconds:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
