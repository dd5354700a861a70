"""A bearer token kept in a file and re-read when the file changes.

Kubernetes updates a mounted Secret by swapping a symlink, so a rotated ledger token reaches the pod without a
restart; the collector (which requires the token) and the webhook replicas (which send it) follow it here. A new
content that is not a valid token (empty, two lines, a space) is logged and the last good token kept, as the TLS
and pools reloaders keep their last good files.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("vramfit.token")


def _token_problem(token: str) -> str | None:
    from scheduler.integrations.forwarder import token_problem

    return token_problem(token)


class TokenFile:
    """Callable: the current token of ``path``, checked for a change at most every ``check_seconds``."""

    def __init__(self, path: Path, token: str, check_seconds: float = 1.0) -> None:
        self.path = Path(path)
        self._token = token  # read and checked by the caller at start (read_token: a bad file is an input error)
        self.check_seconds = check_seconds
        self._stamp = self._stat()
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)  # follows the Secret's symlink: a swap changes the inode
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def __call__(self) -> str:
        now = time.monotonic()
        if now - self._checked < self.check_seconds:
            return self._token
        with self._lock:
            self._checked = now
            stamp = self._stat()
            if stamp is None or stamp == self._stamp:
                return self._token
            self._stamp = stamp
            try:
                token = self.path.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                log.warning("token file unreadable; keeping the last good token",
                            extra={"fields": {"path": str(self.path), "error": type(exc).__name__}})
                return self._token
            problem = "is empty" if not token else _token_problem(token)
            if problem:
                log.warning("token file changed to no valid token; keeping the last good token",
                            extra={"fields": {"path": str(self.path), "problem": problem}})
                return self._token
            if token != self._token:
                log.info("token file changed; using the new token", extra={"fields": {"path": str(self.path)}})
                self._token = token
            return self._token
