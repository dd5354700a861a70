"""A server TLS context from certificate and key files, reloaded in place when the files change.

Kubernetes mounts a rotated Secret by swapping a symlink, and cert-manager renews certificates
before they expire: the server must pick up the new pair without a restart. :class:`CertReloader`
checks the files' identity (inode, size, mtime) every ``interval_seconds`` and loads the new pair
into a new :class:`ssl.SSLContext`; the context the server listens with hands every handshake to the
newest one (its ``sni_callback``, which OpenSSL calls for every ClientHello, with or without a server
name), so every handshake after that presents the new certificate. The live context is never changed
in place: loading a chain into it set the certificate before the key, and a handshake between the two
met a mismatched pair and failed (seen as an EOF by a client during a rotation). A half-written or
mismatched pair fails to load and is skipped (and retried on the next check).
"""

from __future__ import annotations

import logging
import ssl
import threading
from pathlib import Path

from scheduler.integrations.periodic import PeriodicCheck, file_stamp

log = logging.getLogger("vramfit.tls")

Stamp = tuple[tuple[int, int, int], tuple[int, int, int]]


def server_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context holding the pair (raises ``ssl.SSLError``/``OSError`` on a bad pair)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert_file), str(key_file))
    return context




class CertReloader(PeriodicCheck):
    """Keeps ``context`` serving the current contents of ``cert_file``/``key_file`` (:meth:`start` checks in a
    daemon thread every ``interval_seconds``)."""

    thread_name = "vramfit-tls-reload"

    def __init__(self, cert_file: str | Path, key_file: str | Path, interval_seconds: float = 5.0) -> None:
        super().__init__(interval_seconds)
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.context = server_context(self.cert_file, self.key_file)
        self._current = self.context  # the newest valid pair's context: every handshake switches to it
        self.context.sni_callback = self._switch
        self.reloads = 0
        self._stamp: Stamp = (file_stamp(self.cert_file), file_stamp(self.key_file))
        self._lock = threading.Lock()

    def check(self) -> bool:
        """Reload when either file changed and the new pair is valid; True when it reloaded."""
        with self._lock:
            try:
                stamp = (file_stamp(self.cert_file), file_stamp(self.key_file))
            except OSError as exc:
                log.warning("tls files unreadable, keeping the current certificate: %s", exc)
                return False
            if stamp == self._stamp:
                return False
            try:
                fresh = server_context(self.cert_file, self.key_file)  # a whole, valid pair or nothing
            except (OSError, ssl.SSLError) as exc:
                log.warning("new tls pair not loaded (will retry): %s", exc)
                return False
            self._current = fresh  # one reference swap: a handshake sees the old pair or the new one
            self._stamp = stamp
            self.reloads += 1
            log.info("tls certificate reloaded from %s", self.cert_file)
            return True

    def _switch(self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                context: ssl.SSLContext) -> None:
        """``sni_callback`` of the listening context: the handshake continues with the newest pair's context."""
        current = self._current
        if current is not context:
            connection.context = current

