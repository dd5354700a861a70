"""What ``vramfit serve`` and ``vramfit collect`` share: the ledger, the token, and running the HTTP(S) server.

Not a subcommand (it is not listed in ``scheduler.cli.COMMANDS``).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

DEFAULT_LEDGER = "vramfit-ledger.sqlite"


def package_version() -> str:
    try:
        return metadata.version("vramfit")
    except metadata.PackageNotFoundError:
        return "unknown"


def open_ledger_for(command: str, location: str) -> Any:
    """Open the ledger, or print why not (prefixed by the command) and return None."""
    from scheduler.integrations.ledger import LedgerError, open_ledger

    try:
        return open_ledger(location)
    except LedgerError as exc:
        print(f"vramfit {command}: {exc}", file=sys.stderr)
        return None


def read_token(path: Path | None, command: str = "serve", flag: str = "token file") -> str | None:
    """The bearer token in ``path`` (stripped), None without a path; exits when the file is empty."""
    if path is None:
        return None
    token = path.read_text().strip()
    if not token:
        raise SystemExit(f"vramfit {command}: the {flag} {path} is empty")
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


def start_pruner(ledger: Any, days: float | None) -> Any:
    """The started :class:`LedgerPruner` of ``--prune-unjoined-days`` (None without it)."""
    from scheduler.integrations.ledger import LedgerPruner

    return LedgerPruner(ledger, days).start() if days is not None else None


def add_tls_arguments(p: argparse.ArgumentParser, cert: str = "--tls-cert", key: str = "--tls-key") -> None:
    p.add_argument(cert, type=Path, help="PEM certificate (reloaded when the file changes); plain HTTP without it")
    p.add_argument(key, type=Path, help=f"PEM private key of {cert}")
    p.add_argument("--tls-reload-seconds", type=float, default=5.0, help="how often to check the TLS files (s)")


def tls_pair_problem(cert: Path | None, key: Path | None, command: str) -> str | None:
    """Why ``--tls-cert``/``--tls-key`` cannot serve (one without the other, a missing file, a pair that does
    not load), or ``None``: checked before the server starts, so a typo is a message, not a traceback."""
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


def port_problem(port: int | None, flag: str, command: str) -> str | None:
    """Why ``port`` cannot be listened on (0 picks a free port), or ``None``."""
    if port is not None and not 0 <= port <= 65535:
        return f"vramfit {command}: {flag} must be a TCP port, 0-65535; got {port}"
    return None


class _Terminated(Exception):
    """SIGTERM arrived and uvicorn has shut down gracefully."""


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated


def run_http_server(app: Any, host: str, port: int, tls_cert: Path | None, tls_key: Path | None,
                    tls_reload_seconds: float, on_exit: Callable[[], None] | None = None) -> None:
    """Serve ``app`` with uvicorn in this thread until SIGINT/SIGTERM, then call ``on_exit`` (always).

    uvicorn shuts down gracefully on SIGTERM, then raises the signal again for the handler it found; with the
    default handler the process would die there, before ``on_exit`` (stopping threads, flushing queues,
    closing the ledger). So in the main thread SIGTERM raises an exception here instead, and this returns.
    """
    import uvicorn

    from scheduler.integrations.tls import CertReloader

    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False)
    reloader = None
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        if tls_cert is not None:
            config.load()
            reloader = CertReloader(str(tls_cert), str(tls_key), tls_reload_seconds)
            config.ssl = reloader.context  # uvicorn serves this context; the reloader updates it in place
            reloader.start()
        uvicorn.Server(config).run()
    except _Terminated:
        pass
    finally:
        if main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if reloader is not None:
            reloader.stop()
        if on_exit is not None:
            on_exit()
