"""Prometheus metrics of vramfit: one prefix (``vramfit_``), base units, small fixed label sets.

Labels come only from small sets: ``pool`` (the first 64 names seen, then ``other``), ``method`` (full, lora,
qlora, none, other), ``source`` (reporter, dcgm, kubernetes, manual),
``outcome``, ``bound`` (point, upper), ``operation`` (mutate, validate), ``reason`` (queue_full, rejected,
failed). A job id is never a label: per-job
figures live in the ledger. Each server builds its own registry so tests can run several side by side.

Accuracy is observed once per job and source, when an actual and its decision first meet (whichever of the
two arrives second), so retried posts do not count twice. A source may report one job several times (each rank or
node of a job its own GPU; the ledger keeps the largest peak and an OOM once seen); a later report is scored by
what it changed: the ratio and peak histograms take the first reading of each quantity only (an observation cannot
be taken back), the under-prediction counters count when the job's peak first exceeds the bound, and an OOM counts
when it is first reported. ``vramfit_ooms_total`` has no ``source`` label, so it counts a job once however many
sources report its OOM (the reporter and the Kubernetes watcher both do).

A restarted exporter creates the zero series of the pools and methods the ledger placed jobs in lately
(:meth:`Metrics.watch_ledger`), so that the first outcome after a restart is visible to ``increase()``.

Every exported value stays finite: a ratio that is not (a predicted runtime of 1e-300 s) is not observed, and a
predicted cost above :data:`MAX_JOB_COST_USD` is not added, since one ``+Inf`` keeps a counter or a ``_sum`` at
``+Inf`` (and ``increase()`` of it at NaN) for the rest of the process's life.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from predictors.spec import Method
from scheduler.integrations.ledger import Ledger, LedgerError
from scheduler.integrations.records import MAX_JOB_COST_USD, ActualIn, ActualSource, StoredDecision, ran_to_end

PREFIX = "vramfit"
GIB = 2**30

VRAM_BUCKETS_BYTES: tuple[float, ...] = tuple(
    g * GIB for g in (1, 2, 4, 8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 141, 192, 256)
)
RATIO_BUCKETS: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.5, 2.0, 3.0)
RUNTIME_RATIO_BUCKETS: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0)
ADMISSION_BUCKETS_SECONDS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


METHODS: frozenset[str] = frozenset(get_args(Method))
# Pool names get their own label value up to this many; later new names share "other". A cluster has a
# handful of pools, but `pool` arrives in POST /v1/decisions, and every new value would be a new series for
# as long as the process lives.
MAX_POOL_LABELS = 64
# Jobs whose OOM was counted, remembered so that a second source reporting the same OOM does not count it again.
# OOMs are rare; beyond this many the oldest are forgotten (a source that reports that late counts again).
MAX_OOM_JOBS_REMEMBERED = 10_000
# MAX_JOB_COST_USD (records.py, where posts above it are refused): a decision stored before that bound existed may
# still carry more; adding a few such values (1e308) took the counter to +Inf for the rest of the process's life.
# At start, the zero series of the pools and methods jobs were placed in this recently (their actuals may still
# arrive; DCGM sweeps look 15 days back by default, and a training job can run for weeks).
ZERO_SERIES_LOOKBACK_DAYS = 30.0

log = logging.getLogger("vramfit.metrics")


def _label(value: str | None) -> str:
    return value or "none"


class PoolLabels:
    """The label value of a pool name: itself for the first :data:`MAX_POOL_LABELS` names seen, ``other``
    after (logged once)."""

    def __init__(self, limit: int = MAX_POOL_LABELS) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._warned = False

    def __call__(self, pool: str | None) -> str:
        value = _label(pool)
        with self._lock:
            if value in self._seen:
                return value
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
            if not self._warned:
                self._warned = True
                log.warning("more than %d pool names seen; later ones are exported as pool=\"other\"", self.limit)
        return "other"


def _method_label(method: str | None) -> str:
    value = _label(method)
    return value if value in METHODS or value == "none" else "other"


class LedgerSizeCollector(Collector):
    """``vramfit_ledger_records``: rows per ledger table, read at scrape time (right after a restart too)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(f"{PREFIX}_ledger_records", "Records in the ledger, per table", labels=["table"])
        try:
            for table, count in self.ledger.counts().items():
                family.add_metric([table], count)
        except Exception:  # a scrape must not fail because the ledger is momentarily unreadable
            pass
        yield family


class ResidualModelsCollector(Collector):
    """``vramfit_residual_model_info{kind, model_version}``: the residual models this process predicts with now
    (value 1), read at scrape time, so a re-loaded model shows at once. A kind this process has not loaded yet
    (a collector that only stores actuals) is left out rather than loaded for the scrape."""

    def __init__(self, loaders: dict[str, Any]) -> None:
        self.loaders = loaders  # kind -> the DefaultModel loader of predictors.persistence

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(f"{PREFIX}_residual_model_info",
                                   "Residual model in use per kind (vram, runtime); the value is 1; "
                                   "model_version 'analytic' when none is usable", labels=["kind", "model_version"])
        for kind, loader in self.loaders.items():
            try:
                if loader.cache_info().currsize == 0:
                    continue
                loaded = loader()
            except Exception:  # a scrape must not fail because a model file is momentarily unreadable
                continue
            family.add_metric([kind, loaded.version if loaded is not None else "analytic"], 1)
        yield family


# A measured/predicted ratio above this is not a prediction's error but a prediction of almost nothing (a spec of
# `train_tokens: 1` is predicted at microseconds, a posted runtime of 1e-300 s): one such observation would dominate
# the histogram's `_sum`, and so every mean-ratio panel, for the rest of the process's life.
MAX_OBSERVED_RATIO = 1e6


def _observe_ratio(histogram: Histogram, ratio: float, what: str, decision_id: str) -> None:
    """Observe a measured/predicted ratio unless it is not finite or beyond :data:`MAX_OBSERVED_RATIO`."""
    if math.isfinite(ratio) and ratio <= MAX_OBSERVED_RATIO:
        histogram.observe(ratio)
    else:
        log.warning("decision %s: measured/predicted %s is %g, beyond what a prediction's error can be; not "
                    "observed", decision_id, what, ratio)


def _crossed(before: int | None, now: int, bound: int) -> bool:
    """Whether a peak of ``now`` exceeds ``bound`` and the peak known before (if any) did not."""
    return now > bound and (before is None or before <= bound)


class Metrics:
    """Every vramfit metric, registered on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None, version: str = "unknown") -> None:
        self.registry = registry or CollectorRegistry()
        self.pool_label = PoolLabels()
        self._oom_jobs: OrderedDict[str, None] = OrderedDict()
        self._oom_series: set[tuple[str, str]] = set()
        self._oom_lock = threading.Lock()
        r = self.registry
        self.predicted_peak_vram_bytes = Histogram(
            f"{PREFIX}_predicted_peak_vram_bytes", "Predicted device peak VRAM of placed jobs",
            ["pool", "method"], buckets=VRAM_BUCKETS_BYTES, registry=r)
        self.actual_peak_vram_bytes = Histogram(
            f"{PREFIX}_actual_peak_vram_bytes", "Measured device peak VRAM of jobs with a decision",
            ["pool", "method", "source"], buckets=VRAM_BUCKETS_BYTES, registry=r)
        self.vram_prediction_ratio = Histogram(
            f"{PREFIX}_vram_prediction_ratio", "Measured / predicted device peak VRAM",
            ["pool", "method", "source"], buckets=RATIO_BUCKETS, registry=r)
        self.vram_under_predictions = Counter(
            f"{PREFIX}_vram_under_predictions", "Jobs whose measured peak exceeded the prediction "
            "(bound=point: the predicted peak; bound=upper: the upper bound used for placement)",
            ["pool", "method", "source", "bound"], registry=r)
        self.ooms = Counter(
            f"{PREFIX}_ooms", "Jobs that ran out of GPU memory after placement", ["pool", "method"], registry=r)
        self.ooms_start_time_seconds = Gauge(
            f"{PREFIX}_ooms_start_time_seconds", "Unix time at which this process started counting "
            f"{PREFIX}_ooms_total of the pool and method (at 0)", ["pool", "method"], registry=r)
        self.runtime_prediction_ratio = Histogram(
            f"{PREFIX}_runtime_prediction_ratio", "Measured / predicted runtime", ["pool", "method", "source"],
            buckets=RUNTIME_RATIO_BUCKETS, registry=r)
        self.placements = Counter(
            f"{PREFIX}_placements", "Placement decisions recorded, by pool and outcome", ["pool", "outcome"],
            registry=r)
        self.predicted_cost_usd = Counter(
            f"{PREFIX}_predicted_cost_usd", "Sum of the predicted cost of placed jobs", ["pool"], registry=r)
        self.actuals_received = Counter(
            f"{PREFIX}_actuals_received", "Actual reports stored, by source", ["source"], registry=r)
        self.admission_request_duration_seconds = Histogram(
            f"{PREFIX}_admission_request_duration_seconds", "Time to answer an admission review",
            ["operation", "outcome"], buckets=ADMISSION_BUCKETS_SECONDS, registry=r)
        self.decisions_forward_dropped = Counter(
            f"{PREFIX}_decisions_forward_dropped", "Decisions a webhook did not deliver to the collector (a "
            "stateless replica) or write to its own ledger (reason=queue_full: the oldest queued was dropped; "
            "rejected: the collector answered 4xx, or the ledger refused the record; failed: the collector kept "
            "answering 5xx, or the ledger stayed locked or unwritable)", ["reason"], registry=r)
        self.build_info = Gauge(
            f"{PREFIX}_build_info", "vramfit build; the value is 1", ["version", "python_version"], registry=r)
        self.build_info.labels(version, ".".join(map(str, sys.version_info[:3]))).set(1)

    def watch_ledger(self, ledger: Ledger, now: datetime | None = None) -> None:
        """Export the ledger's size, and create the zero series of the pools and methods it placed jobs in during
        the last :data:`ZERO_SERIES_LOOKBACK_DAYS` (as a placement does): after a restart, the first ratio,
        under-prediction or OOM of a job placed before it would otherwise make its series appear at 1, which
        ``increase()`` does not see."""
        self.registry.register(LedgerSizeCollector(ledger))
        since = (now or datetime.now(timezone.utc)) - timedelta(days=ZERO_SERIES_LOOKBACK_DAYS)
        try:
            pairs = ledger.placed_pools_and_methods(since, limit=MAX_POOL_LABELS * (len(METHODS) + 2))
        except LedgerError as exc:  # the server still starts; /readyz reports the ledger
            log.warning("zero series of earlier placements not created: %s", exc)
            return
        pools: set[str | None] = set()
        for pool, method in pairs:  # the most recent first; never more pools than get their own label
            if pool not in pools and len(pools) >= MAX_POOL_LABELS:
                continue
            pools.add(pool)
            self._export_zeros(self.pool_label(pool), _method_label(method))

    def watch_residual_models(self) -> None:
        """Export the residual models in use, and count their re-loads (``on_model_reload``)."""
        from predictors import persistence

        self.registry.register(ResidualModelsCollector({"vram": persistence.load_default_model,
                                                        "runtime": persistence.load_default_runtime_model}))
        self.residual_model_reloads = Counter(
            f"{PREFIX}_residual_model_reloads", "Residual model files that changed while serving (outcome=reloaded: "
            "the new model is in use; rejected: it could not be used, the previous one stays)",
            ["kind", "outcome"], registry=self.registry)
        for kind in ("vram", "runtime"):
            for outcome in ("reloaded", "rejected"):
                self.residual_model_reloads.labels(kind, outcome)  # export the zeros from the start

    def on_model_reload(self, kind: str, outcome: str) -> None:
        self.residual_model_reloads.labels(kind, outcome).inc()

    # --- observations -------------------------------------------------------------------------------
    def observe_decision(self, stored: StoredDecision) -> None:
        d = stored.decision
        pool, method = self.pool_label(d.pool), _method_label(d.method)
        self.placements.labels(pool, d.outcome).inc()
        if d.outcome != "placed":
            return
        self._export_zeros(pool, method)
        if d.peak_vram_bytes is not None:
            self.predicted_peak_vram_bytes.labels(pool, method).observe(d.peak_vram_bytes)
        if d.predicted_cost_usd is not None:
            if d.predicted_cost_usd <= MAX_JOB_COST_USD:
                self.predicted_cost_usd.labels(pool).inc(d.predicted_cost_usd)
            else:
                log.warning("decision %s: predicted cost %g USD is above %g USD; not added to "
                            "%s_predicted_cost_usd_total", stored.decision_id, d.predicted_cost_usd,
                            MAX_JOB_COST_USD, PREFIX)

    def _export_zeros(self, pool: str, method: str) -> None:
        """Create the outcome counters of a pool/method at 0 when a job is placed there, hours before any
        outcome: a series that first appears at 1 is invisible to ``increase()``, so the first OOM or
        under-prediction would raise no alert."""
        self._ooms_of(pool, method)
        for source in get_args(ActualSource):
            self.vram_prediction_ratio.labels(pool, method, source)
            for bound in ("point", "upper"):
                self.vram_under_predictions.labels(pool, method, source, bound)

    def observe_actual_received(self, actual: ActualIn) -> None:
        self.actuals_received.labels(actual.source).inc()

    def observe_outcome(self, stored: StoredDecision, actual: ActualIn, previous: ActualIn | None = None) -> None:
        """Record how good the prediction was. ``actual`` is one source's report of the job as the ledger holds it
        now; ``previous`` is what it held before this report (None: the source's report meets the decision for
        the first time). Only what changed is counted, so every report of a job can be passed here."""
        d = stored.decision
        pool, method, source = self.pool_label(d.pool), _method_label(d.method), actual.source
        if actual.oom and not (previous is not None and previous.oom) and self._first_oom_of(stored.decision_id):
            self._ooms_of(pool, method).inc()
        peak = actual.peak_vram_bytes
        peak_before = previous.peak_vram_bytes if previous is not None else None
        if peak is not None:
            if peak_before is None:  # the first reading of this source: histograms observe each job once
                self.actual_peak_vram_bytes.labels(pool, method, source).observe(peak)
                if d.peak_vram_bytes:
                    _observe_ratio(self.vram_prediction_ratio.labels(pool, method, source),
                                   peak / d.peak_vram_bytes, "VRAM", stored.decision_id)
            if d.peak_vram_bytes and _crossed(peak_before, peak, d.peak_vram_bytes):
                self.vram_under_predictions.labels(pool, method, source, "point").inc()
            if d.peak_vram_upper_bytes and _crossed(peak_before, peak, d.peak_vram_upper_bytes):
                self.vram_under_predictions.labels(pool, method, source, "upper").inc()
        predicted_runtime = d.runtime_prediction_seconds
        # a failed or OOM job stopped early: its runtime is not the job's
        finished = ran_to_end(actual.oom, actual.exit_reason, actual.runtime_seconds)
        finished_before = previous is not None and ran_to_end(previous.oom, previous.exit_reason,
                                                              previous.runtime_seconds)
        if finished and not finished_before and predicted_runtime and actual.runtime_seconds is not None:
            _observe_ratio(self.runtime_prediction_ratio.labels(pool, method, source),
                           actual.runtime_seconds / predicted_runtime, "runtime", stored.decision_id)

    def _ooms_of(self, pool: str, method: str) -> Counter:
        """The OOM counter of a pool and method, its start time exported first. The start time tells
        VramfitOomAfterPlacement a series this process just created (after a restart, at its first OOM: every
        count is recent) from one Prometheus only starts to see (a new or emptied Prometheus, a scrape gap: the
        count is since this process started)."""
        with self._oom_lock:
            if (pool, method) not in self._oom_series:
                self.ooms_start_time_seconds.labels(pool, method).set(time.time())
                self._oom_series.add((pool, method))
        return self.ooms.labels(pool, method)

    def _first_oom_of(self, decision_id: str) -> bool:
        """Whether this is the first OOM report of the job that this process sees (and remember it)."""
        with self._oom_lock:
            if decision_id in self._oom_jobs:
                return False
            self._oom_jobs[decision_id] = None
            if len(self._oom_jobs) > MAX_OOM_JOBS_REMEMBERED:
                self._oom_jobs.popitem(last=False)
            return True

    @contextmanager
    def time_admission(self, operation: str) -> Iterator[dict[str, str]]:
        """Time one admission review: ``with metrics.time_admission("mutate") as obs: obs["outcome"] = ...``.

        The outcome defaults to ``error`` when the block raises, else to ``allowed``.
        """
        observation = {"outcome": "allowed"}
        start = time.perf_counter()
        try:
            yield observation
        except BaseException:
            observation["outcome"] = "error"
            raise
        finally:
            self.admission_request_duration_seconds.labels(operation, observation["outcome"]).observe(
                time.perf_counter() - start)
