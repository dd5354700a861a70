"""What ``vramfit serve`` and ``vramfit collect`` share: the ledger, the token, and running the HTTP(S) server
(and, with ``vramfit calibrate``, turning SIGTERM into an exception that unwinds cleanly).

Not a subcommand (it is not listed in ``scheduler.cli.COMMANDS``).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from predictors.errors import SpecError

DEFAULT_LEDGER = "vramfit-ledger.sqlite"
# How often the TLS files may be checked at most: a file stat, but 0 or less would be a busy loop.
MIN_TLS_RELOAD_SECONDS = 0.1
# After SIGTERM, requests in progress get this long to finish before they are cancelled; the clean-up after them
# (flushing the decision forwarder: 5 s, and joining its thread and the file watchers') must still end inside the
# pod's terminationGracePeriodSeconds (30 s by default, which the shipped manifests keep). Without a limit uvicorn
# waited for ever on a request whose body never finished, the kubelet's SIGKILL came first and the clean-up
# never ran.
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS = 10.0
# A connection that has not sent a whole request head (request line and headers) this long after it opened, or after
# its previous response, is closed: uvicorn times out a request's body and an idle keep-alive connection, but not a
# head sent a byte at a time or never finished, and each such connection held a TLS session and buffers (about 50 KB:
# ~9,000 of them took the webhook past the chart's 512Mi limit). The API server sends a whole AdmissionReview at once.
HEADER_TIMEOUT_SECONDS = 10.0
# Connections and requests in flight beyond which uvicorn answers 503 at once: memory stays bounded whatever a client
# opens (the API server keeps a few connections per webhook)
MAX_CONCURRENT_CONNECTIONS = 1000


def package_version() -> str:
    try:
        return metadata.version("vramfit")
    except metadata.PackageNotFoundError:
        return "unknown"


def open_ledger_for(command: str, location: str, read_only: bool = False) -> Any:
    """Open the ledger (``read_only``: an existing one, never written), or print why not (prefixed by the
    command) and return None."""
    from scheduler.integrations.ledger import LedgerError, open_ledger

    try:
        return open_ledger(location, read_only=read_only)
    except LedgerError as exc:
        print(f"vramfit {command}: {exc}", file=sys.stderr)
        return None


def token_source(path: Path | None, flag: str = "--token-file") -> Any:
    """The token of ``path`` checked now (an input error naming ``flag`` if bad), then followed as the file changes
    (a rotated Secret): a :class:`~scheduler.integrations.token_file.TokenFile`; None without a path."""
    token = read_token(path, flag)
    if path is None or token is None:
        return None
    from scheduler.integrations.token_file import TokenFile

    return TokenFile(path, token)


def read_token(path: Path | None, flag: str = "--token-file") -> str | None:
    """The bearer token in ``path`` (stripped), None without a path; a missing, unreadable or empty file, or one
    holding more than one line of visible ASCII, is an input error naming ``flag`` (never showing the token)."""
    if path is None:
        return None
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise SpecError.one(flag, f"cannot read the token file {path}: {why}") from None
    if not token:
        raise SpecError.one(flag, f"the token file {path} is empty", "write the bearer token into it")
    from scheduler.integrations.forwarder import token_problem

    if problem := token_problem(token):  # a second line, a space: no client could send it (and http.client
        # refused the header with the token in its message, which the forwarder logged at every retry)
        raise SpecError.one(flag, f"the token in {path} {problem}", "write only the token into the file")
    return token


def add_prune_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prune-unjoined-days", type=float, metavar="DAYS",
                   help="hourly, delete decisions older than DAYS that no actual names, and actuals older than DAYS "
                        "that name no decision (joined ones are kept: they are training data); default: keep all")


def days_problem(days: float | None, flag: str, command: str) -> str | None:
    """Why ``days`` given to ``flag`` is not a positive finite number of days (None: it is, or it was not given)."""
    if days is not None and not (math.isfinite(days) and days > 0):
        return f"vramfit {command}: {flag} must be a positive number of days; got {days:g}"
    return None


def seconds_problem(seconds: float, flag: str, command: str, minimum: float) -> str | None:
    """Why ``seconds`` given to ``flag`` (a period: how often something is checked) is not a finite number of
    seconds of at least ``minimum`` (0 or less would check in a busy loop), or ``None``."""
    if not (math.isfinite(seconds) and seconds >= minimum):
        return f"vramfit {command}: {flag} must be a number of seconds, at least {minimum:g}; got {seconds:g}"
    return None


def start_pruner(ledger: Any, days: float | None) -> Any:
    """The started :class:`LedgerPruner` of ``--prune-unjoined-days`` (None without it)."""
    from scheduler.integrations.ledger import LedgerPruner

    return LedgerPruner(ledger, days).start() if days is not None else None


def add_tls_arguments(p: argparse.ArgumentParser, cert: str = "--tls-cert", key: str = "--tls-key") -> None:
    p.add_argument(cert, type=Path, help="PEM certificate (reloaded when the file changes); plain HTTP without it")
    p.add_argument(key, type=Path, help=f"PEM private key of {cert}")
    p.add_argument("--tls-reload-seconds", type=float, default=5.0,
                   help=f"how often to check the TLS files (s, at least {MIN_TLS_RELOAD_SECONDS:g}; default 5)")


def tls_problem(args: argparse.Namespace, command: str) -> str | None:
    """Why the TLS flags of :func:`add_tls_arguments` cannot serve (one file without the other, a missing file, a
    pair that does not load, a reload period that is not a positive time), or ``None``: checked before the
    server starts, so a typo is a message, not a traceback."""
    return (seconds_problem(args.tls_reload_seconds, "--tls-reload-seconds", command, MIN_TLS_RELOAD_SECONDS)
            or _tls_pair_problem(args.tls_cert, args.tls_key, command))


def _tls_pair_problem(cert: Path | None, key: Path | None, command: str) -> str | None:
    """Why ``--tls-cert``/``--tls-key`` cannot serve (one without the other, a missing file, a pair that does
    not load), or ``None``."""
    if (cert is None) != (key is None):
        return f"vramfit {command}: give both --tls-cert and --tls-key, or neither"
    if cert is None or key is None:
        return None
    import ssl

    from scheduler.integrations.tls import server_context

    try:
        server_context(cert, key)
    except (OSError, ssl.SSLError) as exc:  # FileNotFoundError, PermissionError, a key that is not the cert's
        return f"vramfit {command}: cannot load the TLS pair --tls-cert {cert} --tls-key {key}: {exc}"
    return None


def host_problem(host: str | None, flag: str, command: str) -> str | None:
    """Why ``host`` cannot be listened on (an address or a name that resolves to one), or ``None``: uvicorn's own
    "Name or service not known" named no flag and exited 3."""
    if host is None:
        return None
    import socket

    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as exc:
        return f"vramfit {command}: {flag} {host!r} is not an address to listen on ({exc})"
    return None


def port_problem(port: int | None, flag: str, command: str) -> str | None:
    """Why ``port`` cannot be listened on (0 picks a free port), or ``None``."""
    if port is not None and not 0 <= port <= 65535:
        return f"vramfit {command}: {flag} must be a TCP port, 0-65535; got {port}"
    return None


class Terminated(Exception):
    """SIGTERM arrived (in :func:`sigterm_raises`)."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """In the main thread, SIGTERM raises :class:`Terminated` inside the block (instead of ending the process
    there and then), so that the code unwinding it can clean up: stop threads, close the ledger, kill child
    processes. Elsewhere (signal handlers belong to the main thread) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:  # None: the previous handler was not set from Python (the default is what such processes have)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def header_timeout_protocol(timeout_seconds: float = HEADER_TIMEOUT_SECONDS) -> type:
    """uvicorn's HTTP protocol (httptools when installed, else h11) that closes a connection whose request head is not
    complete ``timeout_seconds`` after the connection opened or its last response ended
    (:data:`HEADER_TIMEOUT_SECONDS`). A request whose head arrived is left to the body and handler limits."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # httptools is optional
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base  # type: ignore[assignment]

    class HeaderTimeoutProtocol(Base):  # type: ignore[misc, valid-type]
        _head_timer: Any = None
        _responses_seen = 0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(timeout_seconds, self._head_timeout, self._responses_seen)

        def _head_timeout(self, responses_then: int) -> None:
            self._head_timer = None
            cycle = self.cycle
            waiting = cycle is None or cycle.response_complete
            if waiting and self._responses_seen == responses_then and not self.transport.is_closing():
                self.transport.close()  # no request head in time: nothing of the client's is lost

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._responses_seen += 1
            self._arm()  # the next request's head gets the same time

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

    return HeaderTimeoutProtocol


def run_http_server(app: Any, host: str, port: int, tls_cert: Path | None, tls_key: Path | None,
                    tls_reload_seconds: float, on_exit: Callable[[], None] | None = None,
                    shutdown_timeout_seconds: float = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS) -> None:
    """Serve ``app`` with uvicorn in this thread until SIGINT/SIGTERM, then call ``on_exit`` (always).

    On the signal uvicorn stops accepting, closes idle connections and gives the requests in progress
    ``shutdown_timeout_seconds`` to finish, then cancels them.

    uvicorn shuts down gracefully on SIGTERM, then raises the signal again for the handler it found; with the
    default handler the process would die there, before ``on_exit`` (stopping threads, flushing queues,
    closing the ledger). So in the main thread SIGTERM raises an exception here instead, and this returns.
    """
    import uvicorn

    from scheduler.integrations.tls import CertReloader

    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                            timeout_graceful_shutdown=shutdown_timeout_seconds,
                            http=header_timeout_protocol(), limit_concurrency=MAX_CONCURRENT_CONNECTIONS,
                            )  # type: ignore[arg-type]
    reloader = None
    try:
        with sigterm_raises():
            if tls_cert is not None:
                config.load()
                reloader = CertReloader(str(tls_cert), str(tls_key), tls_reload_seconds)
                config.ssl = reloader.context  # uvicorn serves this context; the reloader updates it in place
                reloader.start()
            uvicorn.Server(config).run()
    except Terminated:
        pass
    finally:
        if reloader is not None:
            reloader.stop()
        if on_exit is not None:
            on_exit()
