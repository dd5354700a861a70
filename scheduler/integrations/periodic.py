"""A check run in a daemon thread every few seconds (files re-loaded when they change: the TLS pair, the residual
models), stopped with the server."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TypeVar

log = logging.getLogger("vramfit.periodic")

_Self = TypeVar("_Self", bound="PeriodicCheck")

Stamp = tuple[int, int, int]


def file_stamp(path: str | Path) -> Stamp:
    """The identity of a file's contents (inode, size, modification time); ``OSError`` when it cannot be read.
    Follows symlinks, as a mounted ConfigMap or Secret uses them."""
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def file_stamp_or_none(path: str | Path) -> Stamp | None:
    """:func:`file_stamp`, or ``None`` for a file that is missing or unreadable now."""
    try:
        return file_stamp(path)
    except OSError:
        return None


class PeriodicCheck:
    """Runs :meth:`check` in a daemon thread every ``interval_seconds`` from :meth:`start` until :meth:`stop`;
    an exception in one check is logged and the next check runs. Subclasses define :meth:`check` and may say
    there is nothing to watch (:meth:`_has_work`: then no thread starts)."""

    thread_name = "vramfit-periodic-check"

    def __init__(self, interval_seconds: float) -> None:
        self.interval_seconds = interval_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> object:
        raise NotImplementedError

    def _has_work(self) -> bool:
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            try:
                self.check()
            except Exception:  # the thread must outlive any surprise: the server keeps what it has
                log.exception("%s failed", self.thread_name)

    def start(self: _Self) -> _Self:
        """Check in a daemon thread every ``interval_seconds`` until :meth:`stop`."""
        if self._has_work() and self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_seconds + 1)
            self._thread = None
