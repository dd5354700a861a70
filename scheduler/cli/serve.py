"""``vramfit serve``: the HTTPS server — admission webhook, ledger endpoints, metrics and health.

One process serves ``/mutate`` and ``/validate`` (the admission webhook), ``/healthz``, ``/readyz``,
``/metrics`` and, when it owns a ledger (``--ledger``), ``/v1/decisions`` and ``/v1/actuals``. Webhook
replicas in a cluster run without ``--ledger`` (stateless: the decision travels in the object's
annotations) and with ``--ledger-url``: each decision is forwarded, from a background thread with a bounded
queue, to the single collector (``vramfit collect --serve-port``), which owns the ledger. For small clusters
and local use one process does both.
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
from pathlib import Path
from typing import Any

from predictors import persistence
from predictors.errors import SpecError
from scheduler.cli import validation_problems
from scheduler.cli.server_common import (
    DEFAULT_LEDGER,
    DEFAULT_SHUTDOWN_TIMEOUT_SECONDS,
    add_prune_argument,
    add_tls_arguments,
    days_problem,
    host_problem,
    open_ledger_for,
    package_version,
    port_problem,
    read_token,
    run_http_server,
    seconds_problem,
    start_pruner,
    tls_problem,
    token_source,
)
from scheduler.integrations.forwarder import DEFAULT_CAPACITY
from scheduler.spec.yamltext import YAML_ERRORS, safe_load

# Decision ids a webhook without a ledger remembers having counted (its /mutate and /validate answers of one job
# arrive within seconds of each other; a day of a busy cluster's admissions is far fewer)
_COUNTED_DECISION_IDS = 100_000

__all__ = ["DEFAULT_LEDGER", "build_app", "open_ledger_for", "package_version", "read_token", "register"]

log = logging.getLogger("vramfit.serve")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="run the HTTPS server: admission webhook, /v1/actuals, /metrics, health")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8443, help="port (default 8443)")
    add_tls_arguments(p)
    p.add_argument("--pools", help="node pools YAML (re-read when it changes); default: the embedded pools")
    p.add_argument("--settings", type=Path, help="admission settings YAML (failure_mode, objective, ...)")
    p.add_argument("--failure-mode", choices=("fail_open", "fail_closed"),
                   help="on an internal error allow with a warning (fail_open) or deny (fail_closed)")
    p.add_argument("--kueue-flavor-label", help="turn on the Kueue integration with this node label key of the "
                   "ResourceFlavors (e.g. vramfit.io/pool): a job with a Kueue queue-name label gets only that label")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--ledger", help="own a ledger (SQLite file): enables /v1/decisions and /v1/actuals")
    where.add_argument("--ledger-url", help="stateless replica: forward each decision to the collector's "
                       "POST <URL>/v1/decisions, e.g. http://vramfit-collector.vramfit-system.svc:8080")
    add_prune_argument(p)
    p.add_argument("--ledger-token-file", type=Path, help="bearer token for --ledger-url (file)")
    p.add_argument("--ledger-ca-file", type=Path, help="CA bundle (PEM) that signed an https --ledger-url")
    p.add_argument("--forward-queue-size", type=int, default=DEFAULT_CAPACITY,
                   help=f"decisions held for --ledger-url while the collector is away, or for --ledger while its "
                   f"file is locked (default {DEFAULT_CAPACITY}); when full the oldest is dropped")
    p.add_argument("--token-file", type=Path, help="file holding the bearer token required on /v1/*")
    p.add_argument("--shutdown-timeout-seconds", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_SECONDS,
                   help="on SIGTERM, how long requests in progress may take before they are cancelled (s; default "
                   f"{DEFAULT_SHUTDOWN_TIMEOUT_SECONDS:g}); the decision forwarder then has 5 s to flush: keep the sum "
                   "inside the pod's terminationGracePeriodSeconds")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=_serve)


def admission_settings(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from scheduler.integrations.admission import AdmissionSettings

    data: dict[str, Any] = {}
    if args.settings is not None:
        try:
            loaded = safe_load(args.settings.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, *YAML_ERRORS) as exc:
            raise SpecError.one("--settings", f"cannot read {args.settings}: {exc}") from None
        if not isinstance(loaded, dict):
            raise SpecError.one("--settings", "must be a mapping of admission settings")
        data.update(loaded)
    if args.failure_mode:
        data["failure_mode"] = args.failure_mode
    if args.kueue_flavor_label is not None:  # an empty one is refused as a label key, not ignored
        data.update(kueue=True, kueue_flavor_label_key=args.kueue_flavor_label)
    try:
        return AdmissionSettings.model_validate(data)
    except ValidationError as exc:
        raise SpecError(validation_problems(exc, AdmissionSettings, prefix="settings"),
                        source=str(args.settings or "")) from None


def valid_decision(record: dict[str, Any]) -> Any:
    """The webhook's decision ``record`` as a :class:`~scheduler.integrations.records.DecisionIn`. A value out of the
    ledger's bounds (a runtime of more than 1000 years on a slow pool, a name longer than Kubernetes allows) leaves
    that optional field empty, with a warning, rather than losing the whole decision; None when even that fails."""
    from pydantic import ValidationError

    from scheduler.integrations.records import DecisionIn

    try:
        return DecisionIn.model_validate(record)
    except ValidationError as exc:
        fields = {str(e["loc"][0]) for e in exc.errors() if e.get("loc")}
    optional = {f for f in fields if f in DecisionIn.model_fields and not DecisionIn.model_fields[f].is_required()}
    log.warning("decision out of the ledger's bounds; recorded without those fields",
                extra={"fields": {"decision_id": record.get("decision_id"), "dropped": sorted(optional),
                                  "invalid": sorted(fields - optional)}})
    try:
        return DecisionIn.model_validate({k: v for k, v in record.items() if k not in optional})
    except ValidationError as exc:
        log.warning("decision not recorded", extra={"fields": {"decision_id": record.get("decision_id"),
                                                               "error": str(exc)[:300]}})
        return None


def build_app(args: argparse.Namespace, ledger: Any, forwarder: Any = None) -> Any:
    """The ASGI app for ``args``: webhook routes mounted into the shared server, its state, and the
    :class:`~scheduler.integrations.forwarder.LedgerWriter` of ``ledger`` (None without one; not started).

    Each decision goes to ``ledger`` when this process owns one (through the writer's queue: an admission request
    never waits for the ledger), else to ``forwarder`` (a
    :class:`~scheduler.integrations.forwarder.DecisionForwarder`, ``--ledger-url``: the collector records and
    counts it), else it is only counted here, once per decision id (``/mutate`` and ``/validate`` both return the
    same decision).
    """
    from scheduler.integrations.forwarder import LedgerWriter
    from scheduler.integrations.metrics import Metrics
    from scheduler.integrations.server import ServerSettings, create_app, store_decision
    from scheduler.integrations.webhook import PoolsSource, ResidualModelsWatch, WebhookState, webhook_routes

    settings = ServerSettings(token=token_source(args.token_file), version=package_version())
    metrics = Metrics(version=settings.version)
    pools = PoolsSource(args.pools)
    pools()  # fail at start-up, with the file's path and field, when the pools file is broken

    def write(record: dict[str, Any]) -> None:
        decision = valid_decision(record)
        if decision is not None:
            store_decision(ledger, metrics, decision)

    writer = LedgerWriter(write, capacity=args.forward_queue_size) if ledger is not None else None
    for sender in (forwarder, writer):
        if sender is not None:
            for reason in ("queue_full", "rejected", "failed"):
                metrics.decisions_forward_dropped.labels(reason)  # export the zeros from the start
            sender.on_drop = lambda reason: metrics.decisions_forward_dropped.labels(reason).inc()
    counted: collections.OrderedDict[str, None] = collections.OrderedDict()  # decision ids counted (no ledger)

    def on_timing(webhook: str, outcome: str, seconds: float) -> None:
        metrics.admission_request_duration_seconds.labels(webhook, outcome).observe(seconds)

    def on_decision(record: dict[str, Any]) -> None:
        if writer is not None:
            writer.submit(record)  # validated, recorded and counted on the writer's thread
            return
        decision = valid_decision(record)
        if decision is None:
            return
        if forwarder is not None:
            # The collector counts placements when it records them; counting here too would double them.
            forwarder.submit(decision.model_dump(mode="json", exclude_none=True))
        else:
            if decision.decision_id in counted:  # /validate's record of the decision /mutate already counted
                counted.move_to_end(decision.decision_id)
                return
            counted[decision.decision_id] = None
            if len(counted) > _COUNTED_DECISION_IDS:
                counted.popitem(last=False)
            pool = decision.pool or "none"
            metrics.placements.labels(pool, decision.outcome).inc()
            if decision.outcome == "placed" and decision.predicted_cost_usd is not None:
                metrics.predicted_cost_usd.labels(pool).inc(decision.predicted_cost_usd)

    metrics.watch_residual_models()
    state = WebhookState(settings=admission_settings(args), pools=pools, on_timing=on_timing,
                         on_decision=on_decision, models=ResidualModelsWatch(on_reload=metrics.on_model_reload))
    return create_app(ledger, settings, extra_routes=webhook_routes(state), metrics=metrics,
                      ready_checks=[persistence.configured_model_problems]), state, writer


def make_forwarder(args: argparse.Namespace) -> Any:
    """The decision forwarder of ``--ledger-url`` (not started), or None without it."""
    from scheduler.integrations.forwarder import DecisionForwarder

    if not args.ledger_url:
        return None
    import ssl

    token = token_source(args.ledger_token_file, "--ledger-token-file")
    try:
        return DecisionForwarder(args.ledger_url, token=token, ca_file=args.ledger_ca_file,
                                 capacity=args.forward_queue_size)
    except (OSError, ssl.SSLError) as exc:  # a missing file, or one holding no PEM certificate
        why = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise SpecError.one("--ledger-ca-file", f"cannot load the CA bundle {args.ledger_ca_file}: {why}",
                            "give a PEM file of the CA certificates that signed the collector's") from None


def _ledger_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the collector's address (checked at start: a typo in it made every decision be
    retried for ever, or fail with a traceback each, while the webhook looked healthy), or None. Not echoed
    back whole when it holds credentials."""
    from urllib.parse import urlsplit

    if not url.startswith(("http://", "https://")):
        return f"must start with http:// or https://; got {url!r}"
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        return "must not hold credentials (user:password@); give the bearer token in --ledger-token-file"
    if not parts.hostname:
        return f"names no host; got {url!r}"
    try:
        parts.port  # noqa: B018  (raises ValueError for a port that is not 0-65535)
    except ValueError:
        return f"has a port that is not a number 0-65535; got {url!r}"
    if parts.query or parts.fragment:
        return f"must be the collector's base address, without ?query or #fragment; got {url!r}"
    return None


def _argument_problem(args: argparse.Namespace) -> str | None:
    problem = (host_problem(args.host, "--host", "serve") or port_problem(args.port, "--port", "serve")
               or tls_problem(args, "serve"))
    if problem:
        return problem
    if args.prune_unjoined_days is not None and not args.ledger:
        return "vramfit serve: --prune-unjoined-days goes with --ledger"
    if problem := days_problem(args.prune_unjoined_days, "--prune-unjoined-days", "serve"):
        return problem
    if not args.ledger_url and (args.ledger_token_file or args.ledger_ca_file):
        return "vramfit serve: --ledger-token-file and --ledger-ca-file go with --ledger-url"
    if args.ledger_url and (problem := _ledger_url_problem(args.ledger_url)):
        return f"vramfit serve: --ledger-url {problem}"
    if args.ledger_ca_file and args.ledger_url and not args.ledger_url.startswith("https://"):
        return "vramfit serve: --ledger-ca-file goes with an https:// --ledger-url"
    if args.forward_queue_size < 1:
        return "vramfit serve: --forward-queue-size must be at least 1"
    return seconds_problem(args.shutdown_timeout_seconds, "--shutdown-timeout-seconds", "serve", 0)


def _startup_fields(args: argparse.Namespace, state: Any) -> dict[str, Any]:
    """Where it listens and what it loaded: address, TLS files, pools (file and names), residual model versions."""

    models = {}
    for kind, loader in (("vram", persistence.load_default_model), ("runtime", persistence.load_default_runtime_model)):
        loaded = loader()
        models[kind] = loaded.version if loaded is not None else "analytic"
    return {"address": f"{args.host}:{args.port}", "tls_cert": str(args.tls_cert) if args.tls_cert else None,
            "pools_file": str(args.pools) if args.pools else "embedded",
            "pools": [p.name for p in state.pools().pools], "residual_models": models,
            "ledger": str(args.ledger) if args.ledger else None,
            "ledger_url": args.ledger_url}


def _serve(args: argparse.Namespace) -> int:
    problem = _argument_problem(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        import uvicorn  # noqa: F401

        from scheduler.integrations.server import configure_logging
        from scheduler.integrations.webhook import warm_up
    except ImportError as exc:
        print(f"vramfit serve: {exc.name} is not installed; install vramfit[server]", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    if args.ledger:  # read the other inputs first: a typo in one of them must not leave a new, empty ledger behind
        from scheduler.pools import load_pools

        read_token(args.token_file)
        admission_settings(args)
        if args.pools:
            load_pools(args.pools)
    ledger = None
    if args.ledger:
        ledger = open_ledger_for("serve", args.ledger)
        if ledger is None:
            return 2
    forwarder = make_forwarder(args)
    app, state, writer = build_app(args, ledger, forwarder)
    pruner = start_pruner(ledger, args.prune_unjoined_days)
    warm_up(state)  # load the catalogs before the first review (a dry run: nothing is recorded)
    log.info("serving", extra={"fields": _startup_fields(args, state)})  # what an operator checks first
    if state.models is not None:
        state.models.start()  # re-load this cluster's residual models when their files change
    if forwarder is not None:
        forwarder.start()
        log.info("forwarding decisions", extra={"fields": {"endpoint": forwarder.endpoint}})
    if writer is not None:
        writer.start()

    def on_exit() -> None:
        if state.models is not None:
            state.models.stop()
        for sender in (forwarder, writer):
            if sender is not None:
                sender.stop(flush_seconds=5.0)
        if pruner is not None:
            pruner.stop()
        if ledger is not None:
            ledger.close()

    run_http_server(app, args.host, args.port, args.tls_cert, args.tls_key, args.tls_reload_seconds, on_exit,
                    shutdown_timeout_seconds=args.shutdown_timeout_seconds)
    return 0
