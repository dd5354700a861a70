"""The vramfit HTTP server: health, metrics, and the ledger's write endpoints (ASGI, Starlette).

Routes: ``GET /healthz`` (the process is up), ``GET /readyz`` (the ledger answers), ``GET /metrics``,
``POST /v1/decisions``, ``POST /v1/actuals`` (answers 202 with the stored record once it is committed),
``GET /v1/decisions/{decision_id}`` (the decision joined with its actuals).

Extending it: other modules add routes without editing this one, ``create_app(ledger, settings,
extra_routes=[Route("/mutate", mutate, methods=["POST"])])``. Their handlers reach the shared state as
``request.app.state.ledger``, ``.metrics`` and ``.settings``, record decisions with :func:`store_decision`
(the same function ``POST /v1/decisions`` uses), and can time themselves with
``metrics.time_admission("mutate")``.

Bad input is answered 400 (not JSON, too large) or 422 (a field is wrong; every problem is listed with its
field path); a ledger that cannot be written is 503 so that clients retry. Logs are one JSON object a line.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.integrations.http_body import read_body
from scheduler.integrations.ledger import ActualResult, DecisionResult, Ledger, LedgerError
from scheduler.integrations.metrics import Metrics
from scheduler.integrations.records import ActualIn, DecisionIn
from scheduler.integrations.webhook import JsonFormatter

log = logging.getLogger("vramfit.server")

M = TypeVar("M", bound=BaseModel)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class ServerSettings:
    """How the server behaves; the webhook adds its own settings next to these."""

    # bearer token required on /v1/*, or a callable giving the current one (a TokenFile); None = no authentication
    token: str | Callable[[], str] | None = None
    max_body_bytes: int = 1 << 20
    version: str = "unknown"


# --- structured logs ----------------------------------------------------------------------------------

def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("vramfit")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = [handler]


class AccessLog:
    """ASGI middleware: one JSON log line per request (method, path, status, duration), no bodies."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            log.info("request", extra={"fields": {
                "method": scope["method"], "path": scope["path"], "status": status["code"],
                "duration_seconds": round(time.perf_counter() - start, 6),
            }})


# --- the ledger operations the routes (and the webhook, in-process) share -----------------------------

def store_decision(ledger: Ledger, metrics: Metrics, decision: DecisionIn) -> DecisionResult:
    """Record a decision durably, then count it; actuals that were waiting for it are scored now."""
    result = ledger.record_decision(decision)
    if result.created:
        metrics.observe_decision(result.stored)
        for waiting in result.newly_joined:
            metrics.observe_outcome(result.stored, waiting.actual)
    return result


def store_actual(ledger: Ledger, metrics: Metrics, actual: ActualIn) -> ActualResult:
    """Record an actual durably, then score it against its decision if that is known. A repeated report of the
    same source (another rank or node of the job) is scored by what it changed in the stored one: a higher peak
    that now exceeds the prediction, an OOM (see :meth:`Metrics.observe_outcome`)."""
    result = ledger.record_actual(actual)
    metrics.observe_actual_received(actual)
    if result.decision is not None:
        metrics.observe_outcome(result.decision, result.stored.actual, previous=result.previous)
    return result


# --- request handling ---------------------------------------------------------------------------------

class BadRequest(Exception):
    def __init__(self, status: int, message: str, problems: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.problems = problems or []


def _utf8(text: str) -> str:
    """``text`` with lone UTF-16 surrogates (which a JSON body can carry in a key it names, and the answer could not
    encode) written as ``\\udXXX`` escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _problems(exc: ValidationError) -> list[dict[str, str]]:
    out = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err.get("loc", ())) or "(body)"
        out.append({"field": _utf8(path), "message": _utf8(err.get("msg", "is invalid").replace("Value error, ", ""))})
    return out


class DuplicateKey(ValueError):
    """A JSON object names a key twice (Python's json keeps the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(key)
        seen[key] = value
    return seen


async def parse_body(request: Request, model: type[M]) -> M:
    """Read, size-check, JSON-decode and validate a request body, raising :class:`BadRequest`."""
    settings: ServerSettings = request.app.state.settings
    raw = await read_body(request, settings.max_body_bytes)
    if raw is None:
        raise BadRequest(413, f"body is larger than {settings.max_body_bytes} bytes")
    try:
        data = json.loads(raw, object_pairs_hook=_unique_keys)
    except DuplicateKey as exc:  # which decision_id an actual belongs to must not be the last one written
        raise BadRequest(400, f"body has the key {str(exc)!r} twice; give each field once") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4,300 digits
        raise BadRequest(400, f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest(400, "body is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest(422, f"body must be a JSON object; got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = _problems(exc)
        text = "; ".join(f"`{p['field']}` {p['message']}" for p in problems)
        raise BadRequest(422, f"invalid {model.__name__}: {text}", problems) from None


def _check_token(request: Request) -> None:
    token = request.app.state.settings.token
    if token is None:
        return
    if callable(token):
        token = token()
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise BadRequest(401, "missing or wrong bearer token (header `Authorization: Bearer <token>`)")


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    for check in request.app.state.ready_checks:  # e.g. a residual model the operator named but that is not in use
        problems = await run_in_threadpool(check)
        if problems:
            return JSONResponse({"status": "not ready", "error": "; ".join(problems)}, status_code=503)
    ledger = request.app.state.ledger
    if ledger is None:  # a stateless webhook replica: nothing to check beyond being up
        return JSONResponse({"status": "ready", "ledger": "none"})
    try:
        await run_in_threadpool(ledger.ping)
    except LedgerError as exc:
        return JSONResponse({"status": "not ready", "error": str(exc)}, status_code=503)
    return JSONResponse({"status": "ready"})


async def metrics_endpoint(request: Request) -> Response:
    from prometheus_client import generate_latest

    body = await run_in_threadpool(generate_latest, request.app.state.metrics.registry)
    return Response(body, media_type=METRICS_CONTENT_TYPE)


async def post_decision(request: Request) -> Response:
    _check_token(request)
    decision = await parse_body(request, DecisionIn)
    state = request.app.state
    result = await run_in_threadpool(store_decision, state.ledger, state.metrics, decision)
    log.info("decision recorded", extra={"fields": {"decision_id": result.stored.decision_id,
                                                    "created": result.created, "joined": len(result.newly_joined)}})
    return JSONResponse({"created": result.created, "decision": result.stored.to_dict(),
                         "joined_actuals": len(result.newly_joined)}, status_code=201 if result.created else 200)


async def post_actual(request: Request) -> Response:
    _check_token(request)
    actual = await parse_body(request, ActualIn)
    state = request.app.state
    result = await run_in_threadpool(store_actual, state.ledger, state.metrics, actual)
    log.info("actual recorded", extra={"fields": {"job_ref": actual.job_ref, "source": actual.source,
                                                  "created": result.created, "joined": result.decision is not None}})
    return JSONResponse({
        "created": result.created,
        "actual": result.stored.to_dict(),
        "decision_id": result.decision.decision_id if result.decision else None,
    }, status_code=202)


async def get_decision(request: Request) -> Response:
    _check_token(request)
    decision_id = request.path_params["decision_id"]
    ledger: Ledger = request.app.state.ledger
    row = await run_in_threadpool(ledger.joined_row, decision_id)
    if row is None:
        raise BadRequest(404, f"no decision {decision_id!r} in the ledger")
    return JSONResponse(row.to_dict())


async def _bad_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BadRequest)
    body: dict[str, Any] = {"error": exc.message}
    if exc.problems:
        body["problems"] = exc.problems
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(body, status_code=exc.status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def _ledger_error(request: Request, exc: Exception) -> Response:
    log.error("ledger error", extra={"fields": {"path": request.url.path, "error": str(exc)}})
    return JSONResponse({"error": f"ledger unavailable: {exc}"}, status_code=503, headers={"Retry-After": "1"})


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc, extra={"fields": {"path": request.url.path}})
    return JSONResponse({"error": "internal error"}, status_code=500)


def create_app(
    ledger: Ledger | None,
    settings: ServerSettings | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    metrics: Metrics | None = None,
    ready_checks: Sequence[Callable[[], list[str]]] = (),
) -> Starlette:
    """The ASGI app over ``ledger``. ``extra_routes`` come before the built-in ones; ``/readyz`` answers 503 with
    their problems while any of ``ready_checks`` reports one.

    Without a ledger (stateless webhook replicas: the decision travels in the object's annotations and the
    collector owns the ledger) the ``/v1`` routes are not mounted, so nothing can be acknowledged and lost.
    """
    settings = settings or ServerSettings()
    metrics = metrics or Metrics(version=settings.version)
    if ledger is not None:
        metrics.watch_ledger(ledger)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        log.info("server started", extra={"fields": {"version": settings.version}})
        yield
        log.info("server stopping")

    routes: list[BaseRoute] = [
        *extra_routes,
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    if ledger is not None:
        routes += [
            Route("/v1/decisions", post_decision, methods=["POST"]),
            Route("/v1/decisions/{decision_id}", get_decision, methods=["GET"]),
            Route("/v1/actuals", post_actual, methods=["POST"]),
        ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            BadRequest: _bad_request,
            HTTPException: _http_error,
            LedgerError: _ledger_error,
            Exception: _unexpected,
        },
    )
    app.state.ledger = ledger
    app.state.ready_checks = tuple(ready_checks)
    app.state.metrics = metrics
    app.state.settings = settings
    app.add_middleware(AccessLog)
    return app
