"""The HTTP shell around :func:`scheduler.integrations.admission.admit`: Starlette routes ``/mutate``
and ``/validate``, one structured JSON log line per request, HTTP 400 for a body that is not an
AdmissionReview v1 request.

Routes hold no globals: everything comes from a :class:`WebhookState` passed to
:func:`webhook_routes`, so any Starlette app can mount them. Two callbacks let other modules hook in
without this one importing them: ``on_timing(webhook, outcome, seconds)`` (metrics) and
``on_decision(record)`` (the ledger; never called for ``dryRun`` requests).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from predictors.errors import SpecError
from scheduler.integrations.admission import (
    Admission,
    AdmissionSettings,
    IdFactory,
    MalformedReview,
    Webhook,
    admit,
    check_review,
    stable_digest,
)
from scheduler.integrations.http_body import read_body
from scheduler.integrations.periodic import PeriodicCheck, Stamp, file_stamp_or_none
from scheduler.pools import PoolsConfig, default_pools, load_pools

MAX_BODY_BYTES = 8 * 1024 * 1024  # an AdmissionReview holds the object twice (object, oldObject)
# A training job's review is a few KiB (examples/jobs and the shared upstream fixtures are at most 4 KiB of YAML);
# above this, reviews wait for each other (see the endpoint).
LARGE_BODY_BYTES = 256 * 1024
OUTCOMES = ("allowed", "patched", "denied", "skipped", "error", "malformed")

TimingHook = Callable[[str, str, float], None]
DecisionHook = Callable[[dict[str, Any]], None]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class PoolsSource:
    """Node pools from a mounted file, re-read when the file changes; a broken new version is logged
    and the last good one kept. With no path: the embedded default pools."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._pools = load_pools(self.path) if self.path else default_pools()
        if self.path:
            self._stamp = file_stamp_or_none(self.path)

    def __call__(self) -> PoolsConfig:
        if self.path is None:
            return self._pools
        stamp = file_stamp_or_none(self.path)
        if stamp is not None and stamp != self._stamp:
            with self._lock:
                try:
                    self._pools = load_pools(self.path)
                    logging.getLogger("vramfit.webhook").info("pools reloaded", extra={"fields": {
                        "path": str(self.path), "pools": [p.name for p in self._pools.pools]}})
                except SpecError as exc:
                    logging.getLogger("vramfit.webhook").error("pools file invalid; keeping the last good pools",
                                                               extra={"fields": {"error": exc.render()}})
                self._stamp = stamp
        return self._pools


class ResidualModelsWatch(PeriodicCheck):
    """The residual models that ``$VRAMFIT_RESIDUAL_MODEL`` and ``$VRAMFIT_RUNTIME_RESIDUAL_MODEL`` name, re-loaded
    when their files change (a cluster model retrained with ``vramfit train --ledger`` and copied over the old
    one). :meth:`start` checks in a daemon thread every ``interval_seconds``, off the request path; :meth:`check`
    checks once. A changed model is loaded and checked first and, when usable, installed in one step (no moment
    without a model; the placement cache is emptied); a broken or incompatible one is logged and the model in
    use kept. A model file whose serving file is still the previous model's (``save_model`` writes the model,
    then its serving file) is left for the next checks (``SERVING_FILE_WAITS``). Without the variables (the
    shipped models) it does nothing."""

    thread_name = "vramfit-model-reload"
    # checks a model file beside a serving file of another model is left for (still being written); after
    # that it is loaded as it is (and, if it is no model, rejected)
    SERVING_FILE_WAITS = 3

    def __init__(self, interval_seconds: float = 2.0,
                 on_reload: Callable[[str, str], None] | None = None) -> None:
        """``on_reload(kind, outcome)``: called with ``vram``/``runtime`` and ``reloaded``/``rejected`` (metrics)."""
        from predictors import persistence

        super().__init__(interval_seconds)
        self._on_reload = on_reload
        self._lock = threading.Lock()
        self.reloads = 0
        self._watched: list[tuple[str, Path, Callable[[dict[str, Any]], None], Any]] = []
        for kind, variable, check, loader in (
                ("vram", persistence.MODEL_ENV, persistence.check_compatible, persistence.load_default_model),
                ("runtime", persistence.RUNTIME_MODEL_ENV, persistence.check_runtime_compatible,
                 persistence.load_default_runtime_model)):
            value = os.environ.get(variable, "").strip()
            if value:
                self._watched.append((kind, Path(value).expanduser(), check, loader))
        self._stamps = {path: self._stamp(path) for _, path, _, _ in self._watched}
        self._waits: dict[Path, int] = {}

    @staticmethod
    def _stamp(path: Path) -> tuple[Stamp | None, Stamp | None]:
        """Identity of the model file and of the serving file beside it (a retrain rewrites both)."""
        from predictors.persistence import serving_path

        return file_stamp_or_none(path), file_stamp_or_none(serving_path(path))

    def check(self) -> None:
        """Re-load every watched model whose files changed since the last check."""
        with self._lock:
            for kind, path, check, loader in self._watched:
                stamp = self._stamp(path)
                if stamp == self._stamps[path]:
                    continue
                outcome = self._reload(path, check, loader)
                if outcome is None:
                    continue  # half written: look again at the next check
                self._stamps[path] = stamp
                if self._on_reload is not None:
                    try:
                        self._on_reload(kind, outcome)
                    except Exception:
                        logging.getLogger("vramfit.webhook").exception("model reload hook failed")

    def _reload(self, path: Path, check: Callable[[dict[str, Any]], None], loader: Any) -> str | None:
        """Load and check the changed file: ``reloaded`` when it is now in use, ``rejected`` when it cannot be,
        ``None`` while its serving file is still the previous model's (for ``SERVING_FILE_WAITS`` checks)."""
        from predictors.persistence import load_model, serving_file_is_current
        from scheduler.placement import clear_prediction_cache

        log = logging.getLogger("vramfit.webhook")
        try:
            if serving_file_is_current(path) is False and self._waits.get(path, 0) < self.SERVING_FILE_WAITS:
                self._waits[path] = self._waits.get(path, 0) + 1
                return None
            self._waits.pop(path, None)
            loaded = load_model(path, check)
        except Exception as exc:  # whatever is wrong with the new file, the server keeps answering with the old
            log.error("residual model file unusable; keeping the model in use",
                      extra={"fields": {"path": str(path), "error": str(exc)[:300]}})
            return "rejected"
        loader.install(loaded)
        clear_prediction_cache()
        self.reloads += 1
        log.info("residual model reloaded", extra={"fields": {"path": str(path), "model_version": loaded.version}})
        return "reloaded"

    def _has_work(self) -> bool:
        return bool(self._watched)  # nothing configured: no thread


@dataclass
class WebhookState:
    """What the admission routes need; pass it in, keep no globals."""

    settings: AdmissionSettings = field(default_factory=AdmissionSettings)
    pools: Callable[[], PoolsConfig] = field(default_factory=PoolsSource)
    models: ResidualModelsWatch | None = None  # re-loads changed model files (vramfit serve starts it)
    on_timing: TimingHook | None = None
    on_decision: DecisionHook | None = None
    now: Callable[[], datetime] = utc_now
    id_factory: IdFactory = stable_digest
    max_body_bytes: int = MAX_BODY_BYTES
    body_timeout_seconds: float | None = None  # None: http_body.BODY_TIMEOUT_SECONDS
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("vramfit.webhook"))
    _large_reviews: anyio.CapacityLimiter | None = field(default=None, repr=False)

    def large_review_limiter(self) -> anyio.CapacityLimiter:
        """One token for reviews with a body above :data:`LARGE_BODY_BYTES` (made in the event loop)."""
        if self._large_reviews is None:
            self._large_reviews = anyio.CapacityLimiter(1)
        return self._large_reviews


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's ``fields`` extra."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_json_logging(level: int | str = logging.INFO, logger_name: str = "vramfit") -> None:
    """Send the ``vramfit`` loggers to stderr as JSON lines (idempotent)."""
    logger = logging.getLogger(logger_name)
    logger.setLevel(level)
    if not any(isinstance(h.formatter, JsonFormatter) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
    logger.propagate = False


def _summary(body: Any) -> dict[str, Any]:
    request = body.get("request") if isinstance(body, dict) else None
    request = request if isinstance(request, dict) else {}
    obj = request.get("object") if isinstance(request.get("object"), dict) else {}
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    return {
        "uid": request.get("uid"),
        "operation": request.get("operation"),
        "kind": obj.get("kind"),
        "namespace": request.get("namespace") or meta.get("namespace"),
        "name": meta.get("name") or meta.get("generateName") or request.get("name"),
        "dry_run": bool(request.get("dryRun")),
    }


def _decode_and_admit(state: WebhookState, webhook: Webhook, raw: bytes, fields: dict[str, Any]) -> Admission:
    """The body as an AdmissionReview, answered (raises ValueError / MalformedReview for a malformed one)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise MalformedReview("JSON nested too deeply") from None
    fields.update(_summary(body))
    check_review(body)
    return admit(body, state.settings, state.pools(), state.now(), state.id_factory, webhook)


def _endpoint(state: WebhookState, webhook: Webhook) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        start = time.perf_counter()
        fields: dict[str, Any] = {"webhook": webhook, "path": request.url.path}

        def done(outcome: str, status: int, response: Response) -> Response:
            seconds = time.perf_counter() - start
            fields.update(outcome=outcome, status=status, duration_ms=round(seconds * 1000, 3))
            level = logging.WARNING if status >= 400 else logging.INFO
            state.logger.log(level, "admission", extra={"fields": fields})
            if state.on_timing is not None:
                try:
                    state.on_timing(webhook, outcome, seconds)
                except Exception:
                    state.logger.exception("timing hook failed", extra={"fields": {"uid": fields.get("uid")}})
            return response

        try:
            raw = await read_body(request, state.max_body_bytes, state.body_timeout_seconds)
        except HTTPException as exc:  # 408: the body did not arrive in time
            fields["error"] = exc.detail
            return done("malformed", exc.status_code, JSONResponse({"error": exc.detail}, status_code=exc.status_code,
                                                                   headers=exc.headers))
        if raw is None:
            return done("malformed", 413, JSONResponse({"error": "body too large"}, status_code=413))
        # Off the event loop, so /healthz and small reviews are answered while a large one is worked on; large
        # bodies one at a time, so a burst of them takes one thread's share of the CPU, not all of it.
        limiter = state.large_review_limiter() if len(raw) > LARGE_BODY_BYTES else None
        try:
            result = await anyio.to_thread.run_sync(_decode_and_admit, state, webhook, raw, fields, limiter=limiter)
        except (ValueError, MalformedReview) as exc:  # JSON and UTF-8 errors are ValueErrors too
            fields["error"] = str(exc)[:300]
            return done("malformed", 400, JSONResponse({"error": f"not an AdmissionReview v1 request: {exc}"},
                                                       status_code=400))
        answer = result.response["response"]
        fields.update(allowed=answer["allowed"], warnings=len(answer.get("warnings", [])),
                      decision_id=answer.get("auditAnnotations", {}).get("decision-id"),
                      pool=answer.get("auditAnnotations", {}).get("pool"))
        if result.record is not None and state.on_decision is not None:
            try:
                state.on_decision(result.record)
            except Exception:
                state.logger.exception("decision hook failed", extra={"fields": {"uid": fields.get("uid")}})
        payload = json.dumps(result.response, separators=(",", ":"))
        return done(result.outcome, 200, Response(payload, media_type="application/json"))

    return endpoint


def webhook_routes(state: WebhookState) -> list[Route]:
    """``POST /mutate`` and ``POST /validate``, ready to mount in any Starlette app."""
    return [
        Route("/mutate", _endpoint(state, "mutate"), methods=["POST"], name="mutate"),
        Route("/validate", _endpoint(state, "validate"), methods=["POST"], name="validate"),
    ]


# A GPU job reviewed once at start-up, so the first real request does not pay for loading the catalogs.
_WARM_UP_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "vramfit-warm-up", "annotations": {"vramfit.io/spec": "model: llama-3.1-8b\nmethod: lora"}},
    "spec": {"containers": [{"name": "t", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
}


def warm_up(state: WebhookState) -> bool:
    """Review a sample GPU pod (dry run); True when the review placed it without an error."""
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "warm-up", "operation": "CREATE", "object": _WARM_UP_POD, "dryRun": True}}
    result = admit(body, state.settings, state.pools(), state.now(), state.id_factory)
    return result.outcome != "error"
