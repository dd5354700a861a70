"""Forward admission decisions from stateless webhook replicas to the collector's ``POST /v1/decisions``.

A webhook replica started with ``--ledger-url`` owns no ledger: each decision it makes is handed to a
:class:`DecisionForwarder`, which queues it and posts it from one background thread. An admission request
never waits for, or fails because of, the collector (a webhook that owns its ledger writes it the same way,
through a :class:`LedgerWriter`):

- :meth:`DecisionForwarder.submit` only appends to a bounded queue (``capacity`` records). When the queue is
  full the oldest record is dropped and ``on_drop("queue_full")`` is called (the CLI counts it in
  ``vramfit_decisions_forward_dropped_total``).
- Connection errors, timeouts, 429 and 5xx are retried with exponential backoff (``backoff_seconds``
  doubling up to ``max_backoff_seconds``). While the collector is unreachable the record at the head waits,
  however long; a record the collector answers 5xx to ``max_attempts`` times is dropped
  (``on_drop("failed")``) so that one bad record cannot stop the others.
- 408 (the collector timed the request out) is retried and counts towards ``max_attempts`` like a 5xx.
- Any other 4xx is the collector refusing the record (a schema mismatch, a wrong token): it is dropped at
  once (``on_drop("rejected")``). So is a redirect (3xx): it is not followed, since following it sent the
  bearer token to whatever host the ``Location`` named and, the POST turned into a GET there, counted a
  decision nobody recorded as sent.
- The token is checked when the forwarder is made (one line of visible ASCII) and never written to a log.

Posts are idempotent on the collector's side (a decision is keyed by its ``decision_id``), so a record sent
twice after a lost reply is harmless. Standard library only (``urllib.request``, ``ssl``).
"""

from __future__ import annotations

import collections
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("vramfit.forwarder")

DEFAULT_CAPACITY = 10_000
DropHook = Callable[[str], None]  # called with the reason: queue_full, rejected, failed


class _Retry(Exception):
    """A transient failure: try the same record again after a backoff."""

    def __init__(self, message: str, server_error: bool = False) -> None:
        super().__init__(message)
        self.server_error = server_error  # the collector answered 5xx or 408 (counts towards max_attempts)


class _Reject(Exception):
    """The collector refused the record: do not send it again."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx answer stays an ``HTTPError`` (urllib would otherwise re-send the Authorization header to the
    ``Location``, as a GET without the record)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        return None


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be sent as ``Authorization: Bearer <token>`` (one run of visible ASCII characters), or
    None. The message never contains the token."""
    if not token:
        return "is empty"
    for position, char in enumerate(token):
        if not "!" <= char <= "~":
            what = "whitespace" if char.isspace() else f"the character U+{ord(char):04X}"
            return (f"contains {what} at position {position} of {len(token)}: a bearer token is one line of "
                    "visible ASCII characters")
    return None


class QueuedSender:
    """A bounded queue of decision records and the one thread that delivers them (:meth:`_post`, in a subclass),
    retrying transient failures with backoff; the webhook side only appends (see the module's docstring)."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        timeout_seconds: float = 5.0,
        backoff_seconds: float = 0.5,
        max_backoff_seconds: float = 30.0,
        max_attempts: int = 8,
        on_drop: DropHook | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.timeout_seconds = timeout_seconds
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.max_attempts = max_attempts
        self.on_drop = on_drop
        self.sent = 0  # records delivered (the collector's 2xx, or written to the ledger)
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._capacity = capacity
        self._busy = False  # the thread holds a record outside the queue
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the webhook side: never blocks -------------------------------------------------------------
    def submit(self, record: dict[str, Any]) -> None:
        """Queue ``record`` for posting; drops the oldest queued record when the queue is full."""
        dropped = False
        with self._cond:
            if len(self._queue) >= self._capacity:
                self._queue.popleft()
                dropped = True
            self._queue.append(record)
            self._cond.notify()
        if dropped:
            self._dropped("queue_full")

    def pending(self) -> int:
        """Records not yet acknowledged: queued, plus the one being sent."""
        with self._cond:
            return len(self._queue) + int(self._busy)

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> QueuedSender:
        self._thread = threading.Thread(target=self._run, name=f"vramfit-{self.thread_name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush_seconds: float = 5.0) -> int:
        """Give the queue up to ``flush_seconds`` to drain, then stop the thread; returns records left unsent."""
        deadline = time.monotonic() + flush_seconds
        with self._cond:
            while (self._queue or self._busy) and self._thread is not None and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.05))
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_seconds + 1)
        left_unsent = self.pending()
        if left_unsent:
            log.warning(f"decisions not {self.verb} at shutdown", extra={"fields": {"count": left_unsent}})
        return left_unsent

    thread_name = "decision-sender"
    verb = "delivered"  # in log lines: "decisions not <verb> at shutdown"

    def _post(self, record: dict[str, Any]) -> None:
        """Deliver one record; raise :class:`_Retry` (try again later) or :class:`_Reject` (drop it)."""
        raise NotImplementedError

    # --- the sending thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait()
                if self._stop.is_set():
                    return
                record = self._queue.popleft()
                self._busy = True
            try:
                self._deliver(record)
            except Exception:  # never let one record end the thread
                log.exception(f"a decision not {self.verb}", extra={"fields": {
                    "decision_id": record.get("decision_id")}})
                self._dropped("failed")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _deliver(self, record: dict[str, Any]) -> None:
        """Post one record until it is acknowledged, refused, has failed too often, or we stop."""
        failures = 0  # 5xx answers; unreachable collectors do not count (nothing is wrong with the record)
        delay = self.backoff_seconds
        while not self._stop.is_set():
            try:
                self._post(record)
                self.sent += 1
                return
            except _Reject as exc:
                log.warning(f"a decision refused ({self.verb})", extra={"fields": {
                    "decision_id": record.get("decision_id"), "error": str(exc)}})
                self._dropped("rejected")
                return
            except _Retry as exc:
                if exc.server_error:
                    failures += 1
                    if failures >= self.max_attempts:
                        log.warning(f"gave up: a decision not {self.verb}", extra={"fields": {
                            "decision_id": record.get("decision_id"), "error": str(exc), "attempts": failures}})
                        self._dropped("failed")
                        return
                log.info(f"a decision not {self.verb} yet; retrying", extra={"fields": {
                    "decision_id": record.get("decision_id"), "error": str(exc), "retry_in_seconds": delay}})
            if self._stop.wait(delay):
                break
            delay = min(delay * 2, self.max_backoff_seconds)
        with self._cond:  # stopped mid-retry: put it back so pending() counts it
            self._queue.appendleft(record)

    def _dropped(self, reason: str) -> None:
        if self.on_drop is not None:
            try:
                self.on_drop(reason)
            except Exception:
                log.exception("drop hook failed")


class DecisionForwarder(QueuedSender):
    """A bounded queue of decision records and the thread that posts them to ``<url>/v1/decisions``."""

    thread_name = "decision-forwarder"
    verb = "forwarded"

    def __init__(self, url: str, token: str | Callable[[], str] | None = None, ca_file: Path | None = None,
                 **queue: Any) -> None:
        """``queue``: :class:`QueuedSender`'s settings (capacity, timeout_seconds, backoff_seconds,
        max_backoff_seconds, max_attempts, on_drop)."""
        super().__init__(**queue)
        if isinstance(token, str) and (problem := token_problem(token)):
            raise ValueError(f"the bearer token {problem}")
        self.endpoint = url.rstrip("/") + "/v1/decisions"
        self.token = token
        self.context = ssl.create_default_context(cafile=str(ca_file)) if ca_file is not None else None
        handlers: list[urllib.request.BaseHandler] = [_NoRedirects()]
        if self.context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=self.context))
        self._opener = urllib.request.build_opener(*handlers)

    def _post(self, record: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/json"}
        token = self.token() if callable(self.token) else self.token  # a TokenFile follows a rotated Secret
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.endpoint, data=json.dumps(record, default=str).encode(),
                                         headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout_seconds) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise _Reject(f"HTTP {exc.code}: redirected to {exc.headers.get('Location')!r}, not followed; give "
                              "the collector's own address (--ledger-url)") from None
            detail = exc.read()[:300].decode(errors="replace")
            if exc.code in (408, 429) or exc.code >= 500:
                raise _Retry(f"HTTP {exc.code}: {detail}", server_error=exc.code != 429) from None
            raise _Reject(f"HTTP {exc.code}: {detail}") from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, resets, TLS errors, a bad status line
            raise _Retry(f"cannot reach {self.endpoint}: {exc}") from None


class LedgerWriter(QueuedSender):
    """The decisions of a webhook that owns its ledger, written by one background thread (``write``: record and
    count one), so that an admission request never waits for the ledger: another writer holding the SQLite file
    (a collector on the same file, a prune) or a slow disk used to stall the event loop, /healthz included, for up
    to the ledger's 10 s busy timeout, past the API server's webhook timeout, and then lose the decision. A
    write that fails (the file locked, a full disk) is retried with backoff and dropped after ``max_attempts``;
    a record the ledger refuses (ValueError) is dropped at once."""

    thread_name = "ledger-writer"
    verb = "written to the ledger"

    def __init__(self, write: Callable[[dict[str, Any]], None], **queue: Any) -> None:
        super().__init__(**queue)
        self._write = write

    def _post(self, record: dict[str, Any]) -> None:
        from scheduler.integrations.ledger import LedgerError

        try:
            self._write(record)
        except LedgerError as exc:
            raise _Retry(str(exc)[:300], server_error=True) from None
        except ValueError as exc:
            raise _Reject(str(exc)[:300]) from None
