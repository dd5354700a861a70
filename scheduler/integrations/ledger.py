"""The ledger: every placement decision and every measured actual, stored durably and joined.

``Ledger`` is the interface (a server database can implement it later); ``SqliteLedger`` is the default: one
file, WAL journal, ``synchronous=FULL``, and every write committed before the call returns, so whatever the
server acknowledged survives a crash of the process. The schema carries a version (``PRAGMA user_version``)
and is migrated forward on open.

Writes are idempotent: a decision is keyed by its ``decision_id`` (or the job uid when it has none); an
actual by the job it names and its source, and a repeated report from one source is merged into the stored
one. An actual that arrives before its decision is kept and joins when the decision is recorded.

Reads never fail on one record: a stored row that cannot be read back (a damaged payload or timestamp, a field of a
newer vramfit) is left out with a warning naming it, and a new actual of its job is still stored.
"""

from __future__ import annotations

import abc
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.hardware import gpu_catalog, lookup_gpu
from predictors.reference import ReferenceRun
from predictors.runtime import flops_per_token, job_tokens
from predictors.spec import TrainingSpec
from scheduler.calibrate.sweep import complete_spec_dict
from scheduler.integrations.periodic import PeriodicCheck
from scheduler.integrations.records import (
    STORED,
    ActualIn,
    DecisionIn,
    JoinedRow,
    MergedActual,
    StoredActual,
    StoredDecision,
    merge_same_source,
    ran_to_end,
    spec_hash,
    utc,
)

EXPORT_SOURCE_ID = "vramfit_ledger"
# Why a job's measured runtime is neither scored by `vramfit report` nor exported as a throughput.
RUNTIME_ABOVE_PEAK = "throughput above the GPUs' peak FLOP/s (the runtime cannot be the whole job's)"
log = logging.getLogger("vramfit.ledger")


class LedgerError(RuntimeError):
    """The ledger cannot be opened or written (a newer schema, a broken file, a full disk)."""


@dataclass(frozen=True)
class DecisionResult:
    stored: StoredDecision
    created: bool
    # Actuals that were waiting for this decision and join it now (empty unless ``created``).
    newly_joined: tuple[StoredActual, ...] = ()


@dataclass(frozen=True)
class ActualResult:
    stored: StoredActual
    created: bool  # first report of this source for this job
    decision: StoredDecision | None  # the decision it joins, if recorded yet
    # This source's report of the job as stored before this one (None when ``created``): ``stored`` is it merged
    # with this one, so the two tell what this report changed (a higher peak from another rank, an OOM).
    previous: ActualIn | None = None


@dataclass(frozen=True)
class PruneResult:
    decisions: int  # decisions deleted: made before the cut-off, named by no actual
    actuals: int  # actuals deleted: received before the cut-off, naming no decision


@dataclass(frozen=True)
class ReportRows:
    rows: list[JoinedRow]  # every readable decision with its actuals, oldest first
    pending_actuals: int  # readable actuals that join no decision (yet)
    # Records that could not be read (a broken payload, a field of a newer vramfit): table -> "key: why", so a
    # report can count and name them instead of failing on the first.
    unreadable: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class ExportResult:
    written: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


# Other jobs' names a DCGM query leaves out (names_extending); more are very unlikely in one namespace
MAX_EXTENDING_NAMES = 50


class Ledger(abc.ABC):
    """Storage of decisions and actuals. Implementations commit before returning from a write."""

    @abc.abstractmethod
    def record_decision(self, decision: DecisionIn) -> DecisionResult: ...

    @abc.abstractmethod
    def record_actual(self, actual: ActualIn) -> ActualResult: ...

    @abc.abstractmethod
    def get_decision(self, decision_id: str) -> StoredDecision | None: ...

    @abc.abstractmethod
    def decisions(self) -> list[StoredDecision]: ...

    @abc.abstractmethod
    def actuals(self) -> list[StoredActual]: ...

    @abc.abstractmethod
    def counts(self) -> dict[str, int]:
        """Rows per table: ``decisions``, ``actuals``."""

    @abc.abstractmethod
    def prune_unjoined(self, before: datetime) -> PruneResult:
        """Delete what can never be training data: decisions made before ``before`` that no actual names (by
        id, uid or name) and actuals received before it that name no decision. A decision and an actual that
        name each other are kept, however old."""

    @abc.abstractmethod
    def ping(self) -> None:
        """Raise :class:`LedgerError` when the storage cannot be read."""

    def close(self) -> None:  # noqa: B027 - optional for implementations without resources
        """Release the storage."""

    # --- derived views, the same for every implementation --------------------------------------
    def joined_rows(self) -> list[JoinedRow]:
        """Every decision with the actuals that belong to it (decisions without actuals included)."""
        return join(self.decisions(), self.actuals())[0]

    def report_rows(self) -> ReportRows:
        """What ``vramfit report`` reads: :meth:`joined_rows` and the actuals that join no decision, from one
        read of the ledger. This default raises on a record it cannot read; implementations may skip it and
        say so in ``unreadable``."""
        rows, pending = join(self.decisions(), self.actuals())
        return ReportRows(rows, len(pending))

    def joined_row(self, decision_id: str) -> JoinedRow | None:
        """The row of :meth:`joined_rows` for one decision (None when it is not recorded). This default reads
        the whole ledger; implementations answer from the decision's own keys."""
        return next((r for r in self.joined_rows() if r.decision.decision_id == decision_id), None)

    def rows_awaiting(self, source: str, after: str) -> list[JoinedRow]:
        """The rows of :meth:`joined_rows` that hold an actual from ``after`` and none from ``source`` (the DCGM
        sweep: jobs Kubernetes saw finish that have no DCGM peak yet). This default reads the whole ledger."""
        return [r for r in self.joined_rows() if _awaits(r, source, after)]

    def placed_pools_and_methods(self, since: datetime, limit: int) -> list[tuple[str | None, str | None]]:
        """The distinct (pool, method) pairs of decisions placed at or after ``since``, the most recently placed
        first, at most ``limit`` (what a restarted exporter creates its zero series for). This default reads
        the whole ledger."""
        latest: dict[tuple[str | None, str | None], datetime] = {}
        for stored in self.decisions():
            d = stored.decision
            if d.outcome == "placed" and stored.decided_at >= since:
                key = (d.pool, d.method)
                latest[key] = max(latest.get(key, stored.decided_at), stored.decided_at)
        return sorted(latest, key=lambda k: latest[k], reverse=True)[:limit]

    def names_extending(self, namespace: str, name: str, limit: int = MAX_EXTENDING_NAMES) -> list[str]:
        """Names of other jobs in ``namespace`` that start with ``name-`` (``llama-70b`` for ``llama``), longest
        first, at most ``limit``: their pods also match ``name-...``, so a DCGM query for ``name`` leaves them out.
        This default reads the whole ledger."""
        found = {s.decision.name for s in self.decisions()
                 if s.decision.namespace == namespace and s.decision.name
                 and s.decision.name.startswith(name + "-")}
        return sorted(found, key=lambda n: (-len(n), n))[:limit]  # type: ignore[arg-type]

    def decisions_named(self, namespace: str, kind: str | None, name: str) -> list[StoredDecision]:
        """Every decision of the job ``namespace``/``kind``/``name`` (re-creations, or jobs of one generateName).
        This default reads the whole ledger."""
        return [s for s in self.decisions() if (s.decision.namespace, s.decision.kind, s.decision.name)
                == (namespace, kind, name)]

    def pending_actuals(self) -> list[StoredActual]:
        """Actuals whose decision has not been recorded (yet)."""
        joined = {(a.actual.job_ref, a.actual.source) for row in self.joined_rows() for a in row.actuals}
        return [a for a in self.actuals() if (a.actual.job_ref, a.actual.source) not in joined]

    def export_reference_runs(self, out: TextIO, rows: list[JoinedRow] | None = None) -> ExportResult:
        """Write joined rows with a measured device peak (or an OOM) as reference-run JSONL.

        Each row is validated as :class:`predictors.reference.ReferenceRun` before it is written; rows whose
        features are not a valid TrainingSpec are skipped and counted by reason. ``rows``: these rows (what
        :meth:`report_rows` read) instead of reading :meth:`joined_rows` again.
        """
        result = ExportResult()
        cache: RuntimeLimitCache = {}
        for row in self.joined_rows() if rows is None else rows:
            line = reference_run_for(row, cache)
            if isinstance(line, str):
                result.skip(line)
                continue
            record = line.model_dump(mode="json", exclude_none=False)
            # the spec as reference runs write it (shared/reference/README.md): contract field names, every
            # field out with method-dependent defaults resolved, no nulls for them
            record["spec"] = complete_spec_dict(line.spec)
            out.write(json.dumps(record, sort_keys=False) + "\n")
            result.written += 1
        return result


def join(decisions: list[StoredDecision], actuals: list[StoredActual]) -> tuple[list[JoinedRow], list[StoredActual]]:
    """The rows of :meth:`Ledger.joined_rows` (oldest decision first), and the actuals that join none of them."""
    decisions = sorted(decisions, key=lambda d: d.decided_at)
    by_id = {d.decision_id: d for d in decisions}
    by_uid = {d.decision.uid: d for d in decisions if d.decision.uid}
    by_name = {(d.decision.namespace, d.decision.kind, d.decision.name): d for d in decisions}
    attached: dict[str, list[StoredActual]] = {d.decision_id: [] for d in decisions}
    pending: list[StoredActual] = []
    for stored in actuals:
        a = stored.actual
        if a.decision_id is not None:
            owner = by_id.get(a.decision_id)
        elif a.uid is not None:
            owner = by_uid.get(a.uid)
        else:
            owner = by_name.get((a.namespace, a.kind, a.name))
        if owner is not None:
            attached[owner.decision_id].append(stored)
        else:
            pending.append(stored)
    return [JoinedRow(d, tuple(attached[d.decision_id])) for d in decisions], pending


# A device peak below any CUDA context (a few hundred MiB) measured no training step
MIN_DEVICE_PEAK_BYTES = 64 * 2**20


def plausible_peak(peak: int | None, gpu_name: str | None, oom: bool) -> tuple[int | None, str]:
    """``(peak, "")`` for a device peak a GPU can have, else ``(None, why)``: above the GPU's memory (2 % for the
    reading's rounding), or below :data:`MIN_DEVICE_PEAK_BYTES`. The residual model learned such peaks as they were
    (a Llama-3.1-8B LoRA was then bounded at 15.1 GiB, or at 8,277 PiB)."""
    if peak is None:
        return None, ""
    if not oom and 0 < peak < MIN_DEVICE_PEAK_BYTES:
        return None, f"a device peak of {peak:,} bytes is below any CUDA context"
    if gpu_name:
        family = [g.memory_bytes for g in gpu_catalog().values() if g.name.lower().startswith(gpu_name.lower())]
        try:
            memory = max([*family, lookup_gpu(gpu_name).memory_bytes])
        except SpecError:
            if not family:
                return peak, ""
            memory = max(family)
        if peak > memory * 1.02:
            return None, f"a device peak of {peak:,} bytes is more than the {gpu_name}'s {memory:,}"
    return peak, ""


def reference_run_for(row: JoinedRow, cache: RuntimeLimitCache | None = None) -> ReferenceRun | str:
    """The reference-run row of a joined decision, or the reason it has none.

    The row carries the measured device peak (or the OOM) for the VRAM residual, and the job's achieved
    throughput for the runtime residual: the tokens of its work (``train_tokens``, or ``steps`` times the tokens of
    a step on its GPUs) over its measured runtime, when it ran to its end. A job with either is exported.
    ``cache`` keeps the physical throughput limit per distinct spec and GPU (see :func:`runtime_left_out`).
    """
    merged = row.merged
    if merged is None:
        return "no actual"
    finished = merged.ran_to_end
    if merged.peak_vram_bytes is None and not merged.oom and not finished:
        return "no device peak or runtime"
    d = row.decision.decision
    if not d.features:
        return "no features"
    peak, why = plausible_peak(merged.peak_vram_bytes, d.gpu, merged.oom)
    if why and not finished and not merged.oom:
        return why
    spec = dict(d.features)
    if d.gpus is not None:
        spec["gpus"] = d.gpus
    if d.gpu is not None:
        spec["gpu"] = d.gpu
    notes = f"pool={d.pool or 'none'}; model_version={d.model_version or 'unknown'}; " \
            f"sources={','.join(merged.sources)}; predicted_peak_vram_bytes={d.peak_vram_bytes}" \
            + (f"; peak_vram_bytes={merged.peak_vram_bytes} left out: {why}" if why else "")
    try:
        run = ReferenceRun.model_validate({
            "id": f"ledger-{row.decision.decision_id}",
            "source_id": EXPORT_SOURCE_ID,
            "quality": "high",
            "spec": spec,
            "gpu": d.gpu or "unknown",
            "measured": {
                "peak_bytes": peak,
                "metric": "nvml",
                "scope": "per_gpu",
                "oom": merged.oom,
                "unit_uncertain": False,
            },
            "notes": notes,
        })
    except ValidationError:
        return "features are not a valid TrainingSpec"
    tokens = job_tokens(run.spec) if finished else None
    if tokens is not None and merged.runtime_seconds:
        throughput = tokens / merged.runtime_seconds
        limit = _tokens_and_limit(row, lambda: run.spec, cache)[1]
        if limit is not None and throughput > limit:
            if merged.peak_vram_bytes is None and not merged.oom:
                return RUNTIME_ABOVE_PEAK
            run.notes += f"; runtime_seconds={merged.runtime_seconds:g} left out: above the GPUs' peak FLOP/s"
            return run
        run.measured.tokens_per_second = throughput
        run.measured.tokens_per_second_scope = "per_job"
        run.notes += f"; runtime_seconds={merged.runtime_seconds:g} for {tokens:.6g} tokens"
    elif merged.peak_vram_bytes is None and not merged.oom:
        return "no device peak; runtime without train_tokens or steps"
    return run


def max_tokens_per_second(spec: TrainingSpec, gpu_name: str) -> float | None:
    """The highest job throughput (tokens/s) the job's GPUs could reach at their dense peak FLOP/s for the model's
    forward and backward FLOPs alone; a measured throughput above it means the runtime is not the whole job's (a
    restart, a resumed run, a smoke test, a wrong report) and must not be scored or teach the runtime residual.
    ``None`` where the model or the GPU is not known (nothing to check against)."""
    if gpu_name == "unknown":
        return None
    try:
        resolved = resolve_model(spec)
        gpu = lookup_gpu(gpu_name)
    except SpecError:
        return None
    fpt = flops_per_token(spec, resolved.architecture)
    scale = resolved.params_override / resolved.architecture.params_total if resolved.params_override else 1.0
    gpus = spec.gpus if isinstance(spec.gpus, int) else 1
    flops_per_token_of_job = (fpt.forward + fpt.backward) * scale
    if not flops_per_token_of_job > 0:
        return None
    # an fp32 job may run its matmuls as TF32 without its spec saying so (set_float32_matmul_precision): the TF32 peak
    return gpu.dense_flops(spec.precision, tf32=True) * max(gpus, 1) / flops_per_token_of_job


# Per distinct (features hash, GPU type, GPU count): the job's tokens and its highest physical throughput
# (None: unknown).
RuntimeLimitCache = dict[tuple[str, str | None, int | None], tuple[float | None, float | None]]


def runtime_left_out(row: JoinedRow, merged: MergedActual, cache: RuntimeLimitCache | None = None) -> str | None:
    """Why the measured runtime of a job that ran to its end is not compared with the prediction, or ``None``:
    :data:`RUNTIME_ABOVE_PEAK` when its throughput (the tokens of its work over the runtime) would need more than
    the GPUs' dense peak FLOP/s. The same rule as the export's (:func:`reference_run_for`), from the same spec:
    the decision's features with its GPU type and count. A spec that cannot be checked (no ``train_tokens`` or
    ``steps``, features that are not a TrainingSpec, an unknown model or GPU) leaves the runtime in."""
    if not merged.ran_to_end or merged.runtime_seconds is None:
        return None
    d = row.decision.decision

    def spec() -> TrainingSpec | None:
        if not d.features:
            return None
        fields = dict(d.features) | {k: v for k, v in (("gpus", d.gpus), ("gpu", d.gpu)) if v is not None}
        try:
            return TrainingSpec.model_validate(fields)  # as reference_run_for builds it
        except ValidationError:
            return None

    tokens, limit = _tokens_and_limit(row, spec, cache)
    if tokens is not None and limit is not None and tokens / merged.runtime_seconds > limit:
        return RUNTIME_ABOVE_PEAK
    return None


def _tokens_and_limit(row: JoinedRow, spec: Callable[[], TrainingSpec | None],
                      cache: RuntimeLimitCache | None) -> tuple[float | None, float | None]:
    """The job's tokens and :func:`max_tokens_per_second` of the row's spec (built by ``spec`` from the decision's
    features, GPU type and count), looked up in ``cache`` by those first: resolving the model is most of the time
    of an export or report of many jobs of few specs."""
    d = row.decision.decision
    # the hash of the features themselves: a posted decision may carry a spec_hash of its own making
    key = (spec_hash(d.features), d.gpu, d.gpus)
    if cache is not None and key in cache:
        return cache[key]
    built = spec()
    found = (None, None) if built is None else (job_tokens(built), max_tokens_per_second(built, d.gpu or "unknown"))
    if cache is not None:
        cache[key] = found
    return found


# --- SQLite -------------------------------------------------------------------------------------------

# Migration N (1-based) brings a ledger from schema version N-1 to N. Append; never edit a released one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE decisions (
        decision_id TEXT PRIMARY KEY,
        uid TEXT,
        namespace TEXT,
        kind TEXT,
        name TEXT,
        spec_hash TEXT NOT NULL,
        pool TEXT,
        decided_at REAL NOT NULL,
        recorded_at REAL NOT NULL,
        payload TEXT NOT NULL
    );
    CREATE INDEX decisions_uid ON decisions (uid);
    CREATE INDEX decisions_name ON decisions (namespace, kind, name, decided_at);
    CREATE TABLE actuals (
        job_ref TEXT NOT NULL,
        source TEXT NOT NULL,
        received_at REAL NOT NULL,
        payload TEXT NOT NULL,
        PRIMARY KEY (job_ref, source)
    );
    """,
)


_DECISION_COLUMNS = "decision_id, uid, namespace, kind, name, spec_hash, pool, decided_at, recorded_at, payload"
# How far the clocks of the webhook (decided_at) and of the collector or the training job (received_at, finished_at)
# may disagree when an actual keyed by uid or name is matched to the decision of its run.
CLOCK_SKEW_SECONDS = 300.0


def _ts(value: datetime) -> float:
    return utc(value).timestamp()


def _awaits(row: JoinedRow, source: str, after: str) -> bool:
    sources = {a.actual.source for a in row.actuals}
    return after in sources and source not in sources


def _dt(value: Any, column: str) -> datetime:
    """The stored timestamp ``value`` of ``column``; :class:`UnreadableRecord` when it is none (a damaged or hand-edited
    row: text, a number no date has, which ``fromtimestamp`` answers with any of four exceptions)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, tz=timezone.utc)
        except (ValueError, OverflowError, OSError):
            pass
    raise UnreadableRecord(f"`{column}` is not a timestamp: {value!r:.60}")


class UnreadableRecord(ValueError):
    """A stored record that cannot be read back (its payload or one of its columns)."""


# What reading a stored record can raise: a broken or too deeply nested payload, a field of a newer vramfit
# (ValidationError), a damaged column (UnreadableRecord), anything else pydantic or datetime lets through.
READ_ERRORS: tuple[type[BaseException], ...] = (ValidationError, ValueError, TypeError, OverflowError, OSError,
                                                RecursionError)


def _why(exc: BaseException) -> str:
    """What is wrong with a record that raised ``exc`` when read, in one line of at most 200 characters."""
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        detail = f"`{where}` {first['msg']}" if where else first["msg"]
    else:
        detail = str(exc) or type(exc).__name__
    return " ".join(detail.split())[:200]


# Where the records a read could not parse go: table -> "key: why" (ReportRows.unreadable); None: logged.
Unreadable = dict[str, list[str]]


class SqliteLedger(Ledger):
    """The ledger in one SQLite file. Thread-safe: one connection behind a lock."""

    def __init__(self, path: str | Path, migrations: Sequence[str] = MIGRATIONS, read_only: bool = False) -> None:
        """Open (creating or migrating) the ledger at ``path``; with ``read_only``, read an existing ledger of
        this schema version without writing to it at all (no journal-mode change, no migration): what
        ``vramfit train --ledger`` does with a copy of a live ledger, and ``vramfit report`` with any."""
        self.path = str(path)
        self._lock = threading.Lock()
        try:
            if read_only:
                self._db = self._open_read_only()
                version = self.schema_version
                if version != len(migrations):
                    self._db.close()
                    hint = ("let `vramfit serve --ledger` or `vramfit collect --ledger` open it once to bring it "
                            "to this version"
                            if 0 < version < len(migrations) else "give the file `vramfit serve --ledger` writes")
                    raise LedgerError(f"{self.path} is not a vramfit ledger of this version (schema version "
                                      f"{version}, this vramfit reads {len(migrations)}): {hint}")
                return
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=10000")
            self._migrate(migrations)
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"cannot open the ledger {self.path}: {exc}") from exc

    def _open_read_only(self) -> sqlite3.Connection:
        """A read-only connection. A WAL ledger's readers share an index file beside it (``-shm``), which SQLite
        creates where it can; in a directory this process cannot write to (a read-only volume, a copy owned by
        someone else) the file is read as an immutable snapshot instead, which is right for a copy and wrong
        for a ledger a server is writing at that moment."""
        uri = Path(self.path).resolve().as_uri()
        try:
            db = sqlite3.connect(f"{uri}?mode=ro", uri=True, isolation_level=None, check_same_thread=False,
                                 timeout=10.0)
            db.execute("PRAGMA query_only=ON")
            db.execute("PRAGMA user_version").fetchone()
            return db
        except sqlite3.OperationalError as exc:
            if not Path(self.path).is_file():
                raise
            log.info("ledger %s read as an immutable snapshot (%s)", self.path, exc)
            db = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, isolation_level=None,
                                 check_same_thread=False, timeout=10.0)
            db.execute("PRAGMA query_only=ON")
            return db

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self, migrations: Sequence[str]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                current = self.schema_version
                if current > len(migrations):
                    raise LedgerError(f"the ledger {self.path} has schema version {current}, newer than this "
                                      f"vramfit knows ({len(migrations)}); upgrade vramfit")
                for version in range(current + 1, len(migrations) + 1):
                    for statement in migrations[version - 1].split(";"):
                        if statement.strip():
                            self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {version}")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _write(self, fn: Any, *args: Any) -> Any:
        """Run ``fn`` in one transaction and commit (durably) before returning its result."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    result = fn(*args)
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            except sqlite3.DatabaseError as exc:
                raise LedgerError(f"cannot write to the ledger {self.path}: {exc}") from exc
            return result

    # --- writes -------------------------------------------------------------------------------------
    def record_decision(self, decision: DecisionIn) -> DecisionResult:
        return self._write(self._record_decision, decision)  # type: ignore[no-any-return]

    def _record_decision(self, decision: DecisionIn) -> DecisionResult:
        now = datetime.now(timezone.utc)
        key = decision.key
        existing = self._db.execute("SELECT recorded_at FROM decisions WHERE decision_id = ?", (key,)).fetchone()
        recorded_at, repair = now, False
        if existing:
            try:
                recorded_at = _dt(existing[0], "recorded_at")
            except UnreadableRecord as exc:  # a damaged row: this write repairs it (below)
                self._unreadable("decisions", key, exc)
                repair = True
        stored = StoredDecision(
            decision=decision,
            spec_hash=decision.spec_hash or spec_hash(decision.features),
            decided_at=utc(decision.decided_at) if decision.decided_at else now,
            recorded_at=recorded_at,
        )
        self._db.execute(
            "INSERT INTO decisions (decision_id, uid, namespace, kind, name, spec_hash, pool, decided_at, "
            "recorded_at, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (decision_id) DO UPDATE SET "
            "uid = excluded.uid, namespace = excluded.namespace, kind = excluded.kind, name = excluded.name, "
            "spec_hash = excluded.spec_hash, pool = excluded.pool, decided_at = excluded.decided_at, "
            "payload = excluded.payload",
            (key, decision.uid, decision.namespace, decision.kind, decision.name, stored.spec_hash, decision.pool,
             _ts(stored.decided_at), _ts(stored.recorded_at), decision.model_dump_json(exclude_none=True)),
        )
        if repair:
            self._db.execute("UPDATE decisions SET recorded_at = ? WHERE decision_id = ?", (_ts(recorded_at), key))
        if existing:
            return DecisionResult(stored, created=False)
        refs = [f"id:{key}"]
        if decision.uid:
            refs.append(f"uid:{decision.uid}")
        if decision.namespace is not None and decision.kind is not None and decision.name is not None:
            refs.append(f"name:{decision.namespace}/{decision.kind}/{decision.name}")
        marks = ",".join("?" * len(refs))
        rows = self._db.execute(f"SELECT job_ref, source, payload, received_at FROM actuals WHERE job_ref IN ({marks})",
                                refs).fetchall()
        joined: list[StoredActual] = []
        earliest = stored.decided_at - timedelta(seconds=CLOCK_SKEW_SECONDS)
        for row in rows:
            found = self._actual_row(row)
            if found is None:
                continue
            if not row[0].startswith("id:"):
                # keyed by uid or name, received before any decision of that job: this decision's run, unless it
                # was received before this decision was made (an earlier run of a job re-created under the name)
                if found.received_at < earliest:
                    continue
                found = self._pin(row[0], row[1], found, key)
            joined.append(found)
        return DecisionResult(stored, created=True, newly_joined=tuple(joined))

    def _ended_before(self, decision_id: str, source: str, started: datetime | None) -> bool:
        """Whether the decision already holds a report of ``source`` of a run that finished its work more than the
        clock skew before this report's run started: an earlier run of a job re-created under the same name, whose own
        decision has not reached the ledger yet (a forwarder or the ledger writer still holds it). Such a report is
        kept under its uid or name until that decision comes (and pins it). Not when this report gives no runtime
        (its start is unknown: another rank's report, say), nor when the held run failed (a retried pod of the same
        job comes after it). The caller holds the lock."""
        if started is None:
            return False
        row = self._db.execute("SELECT payload FROM actuals WHERE job_ref = ? AND source = ?",
                               (f"id:{decision_id}", source)).fetchone()
        held = self._actual_payload(f"id:{decision_id}", source, row[0]) if row else None
        return (held is not None and held.finished_at is not None
                and ran_to_end(held.oom, held.exit_reason, held.runtime_seconds)
                and utc(held.finished_at) < started - timedelta(seconds=CLOCK_SKEW_SECONDS))

    def _pin(self, ref: str, source: str, found: StoredActual, decision_id: str) -> StoredActual:
        """Store an actual kept under its uid or name under its decision's id from now on (merged with a report of
        the same source already there), so that a later decision of the same uid or name, a re-created job's,
        neither scores it again nor merges its own run's reports into it; the caller holds the lock."""
        pinned = found.actual.model_copy(update={"decision_id": decision_id})
        there = self._db.execute("SELECT payload, received_at FROM actuals WHERE job_ref = ? AND source = ?",
                                 (f"id:{decision_id}", source)).fetchone()
        other = self._actual_row((f"id:{decision_id}", source, *there)) if there else None
        if other is not None:
            older, newer = sorted((other, StoredActual(pinned, found.received_at)), key=lambda a: a.received_at)
            pinned = merge_same_source(older.actual, newer.actual)
            found = StoredActual(pinned, newer.received_at)
        self._db.execute("DELETE FROM actuals WHERE job_ref = ? AND source = ?", (ref, source))
        self._db.execute(
            "INSERT INTO actuals (job_ref, source, received_at, payload) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (job_ref, source) DO UPDATE SET received_at = excluded.received_at, "
            "payload = excluded.payload",
            (f"id:{decision_id}", source, _ts(found.received_at), pinned.model_dump_json()))
        return StoredActual(pinned, found.received_at)

    def record_actual(self, actual: ActualIn) -> ActualResult:
        return self._write(self._record_actual, actual)  # type: ignore[no-any-return]

    def _record_actual(self, actual: ActualIn) -> ActualResult:
        now = datetime.now(timezone.utc)
        waits = False  # a report of a re-created job whose own decision has not come yet: scored when it does
        if actual.decision_id is None:
            # keyed by uid or name: stored under the decision of the run it reports (the latest decided before the
            # run started, the report's end less its runtime), so that a job re-created under the same name starts
            # a row of its own and this report is never scored against the next run's decision
            started = utc(actual.finished_at) if actual.finished_at is not None else now
            if actual.runtime_seconds is not None:
                started -= timedelta(seconds=min(float(actual.runtime_seconds), 1e9))
            owner = self._decision_for(actual, started + timedelta(seconds=CLOCK_SKEW_SECONDS))
            waits = owner is not None and self._ended_before(
                owner.decision_id, actual.source, started if actual.runtime_seconds is not None else None)
            if owner is not None and not waits:
                actual = actual.model_copy(update={"decision_id": owner.decision.decision_id})
        ref = actual.job_ref
        old = self._db.execute("SELECT payload FROM actuals WHERE job_ref = ? AND source = ?",
                               (ref, actual.source)).fetchone()
        previous = None
        if old:
            try:
                previous = ActualIn.model_validate_json(old[0], context=STORED)
            except READ_ERRORS as exc:  # replaced by this report rather than losing it
                self._unreadable("actuals", f"{ref} ({actual.source})", exc)
        merged = merge_same_source(previous, actual) if previous is not None else actual
        self._db.execute(
            "INSERT INTO actuals (job_ref, source, received_at, payload) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (job_ref, source) DO UPDATE SET received_at = excluded.received_at, "
            "payload = excluded.payload",
            (ref, actual.source, _ts(now), merged.model_dump_json()),
        )
        return ActualResult(StoredActual(merged, now), created=old is None,
                            decision=None if waits else self._decision_for(actual), previous=previous)

    def _decision_for(self, actual: ActualIn, decided_by: datetime | None = None) -> StoredDecision | None:
        """The decision ``actual`` belongs to: by its decision id, else the latest of its uid or name (decided at
        or before ``decided_by`` when given)."""
        if actual.decision_id is not None:
            return self._select_decision("decision_id = ?", (actual.decision_id,))
        when = " AND decided_at <= ?" if decided_by is not None else ""
        bound = (_ts(decided_by),) if decided_by is not None else ()
        if actual.uid is not None:
            return self._select_decision("uid = ?" + when, (actual.uid, *bound))
        return self._select_decision("namespace = ? AND kind = ? AND name = ?" + when,
                                     (actual.namespace, actual.kind, actual.name, *bound))

    def _select_decision(self, where: str, args: tuple[Any, ...]) -> StoredDecision | None:
        """The latest readable decision matching ``where`` (an unreadable one is skipped, as :meth:`decisions` and
        the report skip it); the caller holds the lock."""
        # rowid breaks ties of decided_at the way joined_rows does (the later write wins)
        query = f"SELECT {_DECISION_COLUMNS} FROM decisions WHERE {where} ORDER BY decided_at DESC, rowid DESC"
        for found in self._db.execute(query, args):
            stored = self._read_decision(found)
            if stored is not None:
                return stored
        return None

    # --- reads --------------------------------------------------------------------------------------
    @staticmethod
    def _decision_row(row: tuple[Any, ...]) -> StoredDecision:
        _key, _uid, _ns, _kind, _name, hash_, _pool, decided_at, recorded_at, payload = row
        return StoredDecision(DecisionIn.model_validate_json(payload, context=STORED), hash_,
                              _dt(decided_at, "decided_at"), _dt(recorded_at, "recorded_at"))

    def _unreadable(self, table: str, key: str, exc: BaseException, sink: Unreadable | None = None) -> None:
        """Note a record of ``table`` that cannot be read: into ``sink`` when given, else as a logged warning."""
        why = _why(exc)
        if sink is not None:
            sink.setdefault(table, []).append(f"{key}: {why}")
        else:
            log.warning("ledger %s: %s record %s left out, unreadable: %s", self.path, table, key, why,
                        extra={"fields": {"table": table, "record": key, "error": why}})

    def _read_decision(self, row: tuple[Any, ...], sink: Unreadable | None = None) -> StoredDecision | None:
        """A ``decisions`` row (its :data:`_DECISION_COLUMNS`), or None when it cannot be read."""
        try:
            return self._decision_row(row)
        except READ_ERRORS as exc:
            self._unreadable("decisions", str(row[0]), exc, sink)
            return None

    def _actual_row(self, row: tuple[Any, ...], sink: Unreadable | None = None) -> StoredActual | None:
        """An ``actuals`` row (job_ref, source, payload, received_at), or None when it cannot be read."""
        ref, source, payload, received_at = row
        try:
            return StoredActual(ActualIn.model_validate_json(payload, context=STORED), _dt(received_at, "received_at"))
        except READ_ERRORS as exc:
            self._unreadable("actuals", f"{ref} ({source})", exc, sink)
            return None

    def _actual_payload(self, ref: str, source: str, payload: Any) -> ActualIn | None:
        """A stored actual's payload alone, or None (logged) when it cannot be read."""
        try:
            return ActualIn.model_validate_json(payload, context=STORED)
        except READ_ERRORS as exc:
            self._unreadable("actuals", f"{ref} ({source})", exc)
            return None

    def get_decision(self, decision_id: str) -> StoredDecision | None:
        with self._lock:
            return self._select_decision("decision_id = ?", (decision_id,))

    def decisions(self) -> list[StoredDecision]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_DECISION_COLUMNS} FROM decisions ORDER BY decided_at, rowid").fetchall()
        return [d for r in rows if (d := self._read_decision(r)) is not None]

    def prune_unjoined(self, before: datetime) -> PruneResult:
        return self._write(self._prune_unjoined, _ts(before))  # type: ignore[no-any-return]

    def _prune_unjoined(self, cutoff: float) -> PruneResult:
        named = "SELECT 1 FROM actuals WHERE actuals.job_ref = "
        decisions = self._db.execute(
            "DELETE FROM decisions WHERE decided_at < ? "
            f"AND NOT EXISTS ({named}'id:' || decisions.decision_id) "
            f"AND (decisions.uid IS NULL OR NOT EXISTS ({named}'uid:' || decisions.uid)) "
            "AND (decisions.namespace IS NULL OR decisions.kind IS NULL OR decisions.name IS NULL OR NOT EXISTS "
            f"({named}'name:' || decisions.namespace || '/' || decisions.kind || '/' || decisions.name))",
            (cutoff,)).rowcount
        actuals = self._db.execute(
            "DELETE FROM actuals WHERE received_at < ? AND ("
            "(substr(job_ref, 1, 3) = 'id:' AND NOT EXISTS "
            "(SELECT 1 FROM decisions WHERE decisions.decision_id = substr(actuals.job_ref, 4))) OR "
            "(substr(job_ref, 1, 4) = 'uid:' AND NOT EXISTS "
            "(SELECT 1 FROM decisions WHERE decisions.uid = substr(actuals.job_ref, 5))))",
            (cutoff,)).rowcount
        # name-keyed actuals (rare: no id or uid was known) through the name index
        for job_ref, source, payload in self._db.execute(
                "SELECT job_ref, source, payload FROM actuals WHERE received_at < ? AND substr(job_ref, 1, 5) = "
                "'name:'", (cutoff,)).fetchall():
            actual = self._actual_payload(job_ref, source, payload)
            if actual is not None and self._decision_for(actual) is None:  # an unreadable one is kept, not judged
                self._db.execute("DELETE FROM actuals WHERE job_ref = ? AND source = ?", (job_ref, source))
                actuals += 1
        return PruneResult(decisions=decisions, actuals=actuals)

    def rows_awaiting(self, source: str, after: str) -> list[JoinedRow]:
        """Only the decisions of ``after`` actuals that have no ``source`` actual under the same job key are
        joined (an actual with another key may still belong to the row: the final check sees the whole row)."""
        with self._lock:
            payloads = self._db.execute(
                "SELECT job_ref, payload FROM actuals AS a WHERE a.source = ? AND NOT EXISTS "
                "(SELECT 1 FROM actuals AS b WHERE b.job_ref = a.job_ref AND b.source = ?)", (after, source)).fetchall()
            owners = {d.decision_id for ref, p in payloads
                      if (a := self._actual_payload(ref, after, p)) is not None
                      and (d := self._decision_for(a)) is not None}
        rows = [self.joined_row(decision_id) for decision_id in sorted(owners)]
        return sorted((r for r in rows if r is not None and _awaits(r, source, after)),
                      key=lambda r: r.decision.decided_at)

    def joined_row(self, decision_id: str) -> JoinedRow | None:
        """The decision and its actuals by index lookups: an actual keyed by the decision's id always belongs
        to it; one keyed by its uid or name only when it is the latest decision with that uid or name."""
        with self._lock:
            stored = self._select_decision("decision_id = ?", (decision_id,))
            if stored is None:
                return None
            d = stored.decision
            refs = [f"id:{decision_id}"]
            if d.uid and self._latest_is("uid = ?", (d.uid,), decision_id):
                refs.append(f"uid:{d.uid}")
            if d.namespace is not None and d.kind is not None and d.name is not None and self._latest_is(
                    "namespace = ? AND kind = ? AND name = ?", (d.namespace, d.kind, d.name), decision_id):
                refs.append(f"name:{d.namespace}/{d.kind}/{d.name}")
            marks = ",".join("?" * len(refs))
            rows = self._db.execute(f"SELECT job_ref, source, payload, received_at FROM actuals WHERE job_ref IN "
                                    f"({marks}) ORDER BY received_at, rowid", refs).fetchall()
        return JoinedRow(stored, tuple(a for row in rows if (a := self._actual_row(row)) is not None))

    def _latest_is(self, where: str, args: tuple[Any, ...], decision_id: str) -> bool:
        latest = self._select_decision(where, args)
        return latest is not None and latest.decision_id == decision_id

    def actuals(self) -> list[StoredActual]:
        with self._lock:
            rows = self._db.execute(
                "SELECT job_ref, source, payload, received_at FROM actuals ORDER BY received_at, rowid").fetchall()
        return [a for row in rows if (a := self._actual_row(row)) is not None]

    def report_rows(self) -> ReportRows:
        """One read of both tables; a record that does not parse (a broken payload, a decision or actual with a
        field this vramfit does not know, written by a newer one, a damaged timestamp column) is left out and named
        in ``unreadable`` rather than failing the whole report. (The other reads leave it out with a logged
        warning.)"""
        unreadable: Unreadable = {}
        try:
            with self._lock:
                decision_rows = self._db.execute(
                    f"SELECT {_DECISION_COLUMNS} FROM decisions ORDER BY decided_at, rowid").fetchall()
                actual_rows = self._db.execute(
                    "SELECT job_ref, source, payload, received_at FROM actuals ORDER BY received_at, rowid").fetchall()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"cannot read the ledger {self.path}: {exc}") from exc
        decisions = [d for row in decision_rows if (d := self._read_decision(row, unreadable)) is not None]
        actuals = [a for row in actual_rows if (a := self._actual_row(row, unreadable)) is not None]
        rows, pending = join(decisions, actuals)
        return ReportRows(rows, len(pending), unreadable)

    def decisions_named(self, namespace: str, kind: str | None, name: str) -> list[StoredDecision]:
        """Through the name index."""
        with self._lock:
            rows = self._db.execute(f"SELECT {_DECISION_COLUMNS} FROM decisions WHERE namespace = ? AND kind IS ? "
                                    "AND name = ? ORDER BY decided_at, rowid", (namespace, kind, name)).fetchall()
        return [d for r in rows if (d := self._read_decision(r)) is not None]

    def names_extending(self, namespace: str, name: str, limit: int = MAX_EXTENDING_NAMES) -> list[str]:
        """One indexed-prefix query (``substr`` compare: names may hold LIKE's wildcards)."""
        prefix = name + "-"
        try:
            with self._lock:
                rows = self._db.execute(
                    "SELECT DISTINCT name FROM decisions WHERE namespace = ? AND substr(name, 1, ?) = ? "
                    "ORDER BY length(name) DESC, name LIMIT ?", (namespace, len(prefix), prefix, limit)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"cannot read the ledger {self.path}: {exc}") from exc
        return [str(n) for (n,) in rows]

    def placed_pools_and_methods(self, since: datetime, limit: int) -> list[tuple[str | None, str | None]]:
        """One grouped query: no payload is parsed beyond the method and outcome."""
        try:
            with self._lock:
                rows = self._db.execute(
                    "SELECT pool, json_extract(payload, '$.method') AS method, MAX(decided_at) AS latest "
                    "FROM decisions WHERE decided_at >= ? AND json_valid(payload) "
                    "AND COALESCE(json_extract(payload, '$.outcome'), 'placed') = 'placed' "
                    "GROUP BY pool, method ORDER BY latest DESC, pool, method LIMIT ?",
                    (_ts(since), limit)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"cannot read the ledger {self.path}: {exc}") from exc
        return [(pool, method) for pool, method, _latest in rows]

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {table: int(self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
                    for table in ("decisions", "actuals")}

    def ping(self) -> None:
        try:
            with self._lock:
                self._db.execute("SELECT 1 FROM decisions LIMIT 1").fetchall()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"cannot read the ledger {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()


class LedgerPruner(PeriodicCheck):
    """``--prune-unjoined-days N``: every ``interval_seconds`` (an hour), :meth:`Ledger.prune_unjoined` with a
    cut-off N days back, so a ledger that takes every GPU job's decision does not grow without bound from jobs
    that never ran or were never measured."""

    thread_name = "vramfit-ledger-prune"

    def __init__(self, ledger: Ledger, keep_days: float, interval_seconds: float = 3600.0,
                 now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        super().__init__(interval_seconds)
        self.ledger = ledger
        self.keep_days = keep_days
        self.now = now

    def _run(self) -> None:
        try:  # once at start, then every interval
            self.check()
        except Exception:
            log.exception("%s failed", self.thread_name)
        super()._run()

    def check(self) -> PruneResult:
        before = self.now() - timedelta(days=self.keep_days)
        result = self.ledger.prune_unjoined(before)
        if result.decisions or result.actuals:
            log.info("ledger pruned", extra={"fields": {"before": before.isoformat(), "decisions": result.decisions,
                                                         "actuals": result.actuals}})
        return result


def open_ledger(location: str | Path, read_only: bool = False) -> Ledger:
    """Open the ledger at ``location``: a file path (SQLite). Other schemes can be added here. ``read_only``
    reads an existing ledger of this version and never writes (creates, migrates) the file."""
    text = str(location)
    if text.startswith("sqlite:///"):
        text = text[len("sqlite:///"):]
    elif "://" in text:
        raise LedgerError(f"unsupported ledger location {text!r}: give a file path (SQLite)")
    return SqliteLedger(text, read_only=read_only)
