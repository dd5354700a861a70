"""``vramfit collect``: the collector. Owns the ledger; pulls actuals (Kubernetes pod watch, DCGM peaks from
Prometheus) and, with ``--serve-port``, serves the ledger over HTTP(S).

Run one replica (leader election through a Lease is not implemented yet). Each sweep looks for decisions
whose job finished (the Kubernetes actual has ``finished_at``) and that have no DCGM actual yet, and asks
Prometheus for their device peak.

With ``--serve-port`` it runs the same server app as ``vramfit serve --ledger`` over its ledger (``/healthz``,
``/readyz``, ``/metrics``, ``POST /v1/decisions`` that stateless webhook replicas forward to, ``POST
/v1/actuals`` that the training-side reporter posts to, ``GET /v1/decisions/{id}``) in the main thread; the
DCGM sweeps and the pod watch then run in background threads and stop when the server shuts down. Every
actual, whoever brings it, goes through the same path, so the accuracy metrics on ``/metrics`` cover all
sources. Serving alone (no ``--kube``, no ``--prometheus-url``) is allowed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from scheduler.cli.server_common import (
    DEFAULT_LEDGER,
    add_prune_argument,
    add_tls_arguments,
    days_problem,
    host_problem,
    open_ledger_for,
    package_version,
    port_problem,
    run_http_server,
    seconds_problem,
    start_pruner,
    tls_problem,
    token_source,
)

log = logging.getLogger("vramfit.collect")

THREAD_JOIN_SECONDS = 10.0
# Jobs that finished longer ago than this are not asked of Prometheus: its samples are gone (15 days is the
# default --storage.tsdb.retention.time), and a job DCGM never saw would otherwise be queried every sweep forever.
DCGM_LOOKBACK_DAYS = 15.0
# DCGM sweeps closer together than this would only load Prometheus and the ledger (0 was a busy loop).
MIN_INTERVAL_SECONDS = 1.0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("collect", help="collect actuals (pod watch, DCGM peaks) into the ledger; optionally serve it")
    p.add_argument("--ledger", default=DEFAULT_LEDGER, help=f"ledger file (default {DEFAULT_LEDGER})")
    p.add_argument("--prometheus-url", help="Prometheus that scrapes the DCGM exporter, e.g. http://prometheus:9090")
    p.add_argument("--kube", action="store_true", help="watch pods (needs vramfit[kube] and cluster access)")
    p.add_argument("--namespace", help="watch only this namespace")
    p.add_argument("--interval-seconds", type=float, default=60.0,
                   help=f"time between DCGM sweeps (s, at least {MIN_INTERVAL_SECONDS:g}; default 60)")
    p.add_argument("--dcgm-lookback-days", type=float, default=DCGM_LOOKBACK_DAYS,
                   help="ask Prometheus only about jobs that finished within this many days (its retention; "
                        f"default {DCGM_LOOKBACK_DAYS:g})")
    p.add_argument("--once", action="store_true", help="one DCGM sweep (and prune), then exit")
    add_prune_argument(p)
    p.add_argument("--serve-host", default="127.0.0.1", help="address --serve-port listens on (default 127.0.0.1)")
    p.add_argument("--serve-port", type=int,
                   help="serve /healthz, /readyz, /metrics, /v1/decisions and /v1/actuals over the ledger here")
    add_tls_arguments(p)
    p.add_argument("--token-file", type=Path, help="file holding the bearer token required on /v1/*")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=_collect)


# A finished job Prometheus had no DCGM samples for, asked again after this long, has none later either (scrapes
# come every 15-60 s): the sweep stops asking about it (for as long as the process remembers; see sweep_dcgm).
DCGM_SETTLED_SECONDS = 3600.0
MAX_REMEMBERED_EMPTY = 100_000


def sweep_dcgm(ledger: object, prometheus_url: str, sink: Callable[[Any], object] | None = None,
               lookback_days: float = DCGM_LOOKBACK_DAYS, now: datetime | None = None,
               empty: set[str] | None = None) -> int:
    """Store a DCGM actual for every job that finished in the last ``lookback_days`` and has none yet; returns
    how many were stored.

    ``sink`` records one actual (default ``ledger.record_actual``; the served collector also scores it).
    ``empty``: decision ids Prometheus answered with no samples once the job had been finished for
    ``DCGM_SETTLED_SECONDS``; they are not asked again (the loop keeps the set between sweeps; before, such a job
    was queried at every sweep for the whole look-back, 15 days).
    """
    from scheduler.integrations.ledger import Ledger
    from scheduler.integrations.prom_actuals import PrometheusError, dcgm_actual
    from scheduler.integrations.records import utc

    assert isinstance(ledger, Ledger)
    record = sink or ledger.record_actual
    stored = 0
    moment = now or datetime.now(timezone.utc)
    since = moment - timedelta(days=lookback_days)
    for row in ledger.rows_awaiting("dcgm", after="kubernetes"):
        sources = {a.actual.source: a.actual for a in row.actuals}
        kube = sources.get("kubernetes")
        if "dcgm" in sources or kube is None or kube.finished_at is None or utc(kube.finished_at) < since:
            continue
        if empty is not None and row.decision.decision_id in empty:
            continue
        started = None if kube.runtime_seconds is None else kube.finished_at - timedelta(seconds=kube.runtime_seconds)
        d = row.decision.decision
        if d.generated_name and d.namespace and d.name and _shares_its_pods(
                ledger, row.decision, started or row.decision.decided_at, kube.finished_at):
            continue  # another job of the same generateName ran alongside: their pods cannot be told apart
        try:
            # jobs whose names extend this one's (llama-70b for llama) have pods its pattern also matches
            others = ledger.names_extending(d.namespace, d.name) if d.namespace and d.name else []
            actual = dcgm_actual(prometheus_url, row.decision, finished_at=kube.finished_at, started_at=started,
                                 other_names=others)
        except PrometheusError as exc:
            log.warning("DCGM query failed for %s: %s", row.decision.decision_id, exc)
            continue
        except (ValueError, OverflowError) as exc:  # a reading the actual refuses: that job only, not the sweep
            log.warning("DCGM reading for %s not stored: %s", row.decision.decision_id, exc)
            continue
        if actual is not None:
            record(actual)
            stored += 1
        elif empty is not None and (moment - utc(kube.finished_at)).total_seconds() >= DCGM_SETTLED_SECONDS:
            if len(empty) >= MAX_REMEMBERED_EMPTY:
                empty.clear()
            empty.add(row.decision.decision_id)
    return stored


def _shares_its_pods(ledger: Any, decision: Any, started: datetime, finished: datetime) -> bool:
    """Whether another job of ``decision``'s generateName (same namespace and kind) may have run while it did:
    decided before it finished, and finished after it started (or not known to have finished and decided less
    than a day before it started). Their pod names match one pattern, so a DCGM peak could be the other job's."""
    from scheduler.integrations.records import utc

    d = decision.decision
    for other in ledger.decisions_named(d.namespace, d.kind, d.name):
        if other.decision_id == decision.decision_id or not other.decision.generated_name:
            continue
        if utc(other.decided_at) >= utc(finished):
            continue
        row = ledger.joined_row(other.decision_id)
        ends = [utc(a.actual.finished_at) for a in (row.actuals if row else ()) if a.actual.finished_at is not None]
        if (max(ends) > utc(started)) if ends else (utc(other.decided_at) > utc(started) - timedelta(days=1)):
            return True
    return False


def _sweep_loop(ledger: Any, args: argparse.Namespace, stop: threading.Event,
                sink: Callable[[Any], object] | None) -> None:
    """DCGM sweeps (with ``--prometheus-url``) every ``--interval-seconds`` until ``stop``, or one with ``--once``."""
    empty: set[str] = set()  # jobs Prometheus has no samples for: not asked again
    while True:
        if args.prometheus_url:
            try:
                stored = sweep_dcgm(ledger, args.prometheus_url, sink, args.dcgm_lookback_days, empty=empty)
                log.info("DCGM sweep stored %d actuals", stored)
            except Exception:  # a failed sweep (ledger momentarily unwritable, ...) must not end the loop
                log.exception("DCGM sweep failed")
        if args.once or stop.wait(args.interval_seconds):
            return


def _prometheus_problem(url: str) -> str | None:
    """Why Prometheus at ``url`` cannot answer a query (None: it answers). A sweep with no finished job asks nothing,
    so a wrong URL would otherwise go unnoticed until the first job ends."""
    from scheduler.integrations.prom_actuals import PrometheusError, query_instant

    try:
        query_instant(url, "vector(1)", datetime.now(timezone.utc), timeout_seconds=5.0)
    except PrometheusError as exc:
        return str(exc)
    return None


def _argument_problem(args: argparse.Namespace) -> str | None:
    if not args.kube and not args.prometheus_url and args.serve_port is None:
        return "vramfit collect: give --kube, --prometheus-url, --serve-port, or several"
    if args.once and args.serve_port is not None:
        return "vramfit collect: --once is one DCGM sweep; it does not go with --serve-port"
    if args.once and args.kube:  # the watch ran nowhere with --once: `--kube --once` exited 0 having done nothing
        return ("vramfit collect: --once is one DCGM sweep (give --prometheus-url); the pod watch (--kube) runs "
                "until stopped, drop --once for it")
    if problem := days_problem(args.prune_unjoined_days, "--prune-unjoined-days", "collect"):
        return problem
    if problem := days_problem(args.dcgm_lookback_days, "--dcgm-lookback-days", "collect"):
        return problem
    if args.serve_port is None and (args.tls_cert or args.tls_key or args.token_file):
        return "vramfit collect: --tls-cert, --tls-key and --token-file go with --serve-port"
    return (seconds_problem(args.interval_seconds, "--interval-seconds", "collect", MIN_INTERVAL_SECONDS)
            or port_problem(args.serve_port, "--serve-port", "collect") or tls_problem(args, "collect")
            or (host_problem(args.serve_host, "--serve-host", "collect") if args.serve_port is not None else None))


def _server_app(args: argparse.Namespace, ledger: Any) -> tuple[Any, Callable[[Any], object]]:
    """The shared server app over ``ledger``, and the sink that records an actual and scores it on /metrics."""
    from scheduler.integrations.metrics import Metrics
    from scheduler.integrations.server import ServerSettings, create_app, store_actual

    settings = ServerSettings(token=token_source(args.token_file), version=package_version())
    metrics = Metrics(version=settings.version)

    def sink(actual: Any) -> object:
        return store_actual(ledger, metrics, actual)

    return create_app(ledger, settings, metrics=metrics), sink


def _collect(args: argparse.Namespace) -> int:
    from scheduler.integrations.server import configure_logging

    problem = _argument_problem(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    watch_pods = None
    if args.kube and not args.once:
        try:
            import kubernetes  # noqa: F401  # type: ignore[import-not-found]

            from scheduler.integrations.kube_watch import watch_pods
        except ImportError:
            print("vramfit collect: --kube needs the kubernetes client; install vramfit[kube]", file=sys.stderr)
            return 2
    if args.serve_port is not None:
        try:
            import uvicorn  # noqa: F401
        except ImportError:
            print("vramfit collect: uvicorn is not installed; install vramfit[server]", file=sys.stderr)
            return 2
    ledger = open_ledger_for("collect", args.ledger)
    if ledger is None:
        return 2
    app, sink = _server_app(args, ledger) if args.serve_port is not None else (None, ledger.record_actual)
    pruner = start_pruner(ledger, None if args.once else args.prune_unjoined_days)
    if args.once and args.prune_unjoined_days is not None:
        from scheduler.integrations.ledger import LedgerPruner

        LedgerPruner(ledger, args.prune_unjoined_days).check()

    unreachable = _prometheus_problem(args.prometheus_url) if args.prometheus_url else None
    if unreachable and args.once:  # a one-shot sweep (a CronJob) that cannot reach Prometheus fails visibly
        print(f"vramfit collect: {unreachable}", file=sys.stderr)
        ledger.close()  # (--once starts no pruner thread)
        return 1
    if unreachable:  # a long-running collector keeps trying at every sweep
        log.warning("Prometheus not reachable at start; the sweeps will retry", extra={"fields": {
            "error": unreachable}})

    stop = threading.Event()
    threads: list[threading.Thread] = []
    if watch_pods is not None:
        threads.append(threading.Thread(target=watch_pods, args=(sink, stop, args.namespace), daemon=True,
                                        name="vramfit-pod-watch"))
    if app is not None and args.prometheus_url:
        threads.append(threading.Thread(target=_sweep_loop, args=(ledger, args, stop, sink), daemon=True,
                                        name="vramfit-dcgm-sweep"))
    for thread in threads:
        thread.start()

    def shut_down() -> None:
        stop.set()
        if pruner is not None:
            pruner.stop()
        for thread in threads:
            thread.join(THREAD_JOIN_SECONDS)
            if thread.is_alive():  # the pod watch can sit in a long poll; it is a daemon thread
                log.warning("thread did not stop in time", extra={"fields": {"thread": thread.name}})
        ledger.close()

    if app is not None:
        log.info("collector serving", extra={"fields": {"host": args.serve_host, "port": args.serve_port}})
        run_http_server(app, args.serve_host, args.serve_port, args.tls_cert, args.tls_key, args.tls_reload_seconds,
                        on_exit=shut_down)
        return 0
    try:
        _sweep_loop(ledger, args, stop, sink)  # in this thread, as long as the process lives
    except KeyboardInterrupt:
        pass
    finally:
        shut_down()
    return 0
