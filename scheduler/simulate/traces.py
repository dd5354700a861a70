"""Reading the inputs of a simulation from files: cluster traces, reference runs, spec lists (the only I/O).

Trace formats (``shared/traces/README.md``):

* ``philly``: ``philly_pollux_subset/philly.csv``, ``timestamp,duration,num_gpus,gpu_time,cluster`` with
  ``timestamp`` as ``YYYY-MM-DD HH:MM:SS`` and ``duration`` in seconds (Microsoft Philly, CC BY 4.0, as
  pre-processed by the Pollux authors; cite Jeon et al. ATC'19, Qiao et al. OSDI'21).
* ``pai``: ``alibaba_gpu_v2023/csv/openb_pod_list_default.csv``, ``creation_time``, ``deletion_time`` in
  seconds from the trace start, ``num_gpu`` and ``gpu_milli`` (Alibaba, research/study use; cite Weng et al.
  ATC'23). Pods without a GPU are skipped; a fractional GPU counts as one; a pod never scheduled (deleted
  while Pending) never ran and is skipped; duration = deletion - scheduled (the run, not the original wait).

Every row that cannot be read is an error naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from predictors.errors import SpecError
from predictors.reference import ReferenceRun, parse_runs
from predictors.spec import TrainingSpec, parse_training_spec
from scheduler.placement import resolve_model_cached
from scheduler.simulate.scenario import TraceJobs

TRACE_FILES: dict[str, str] = {
    "philly": "philly_pollux_subset/philly.csv",
    "pai": "alibaba_gpu_v2023/csv/openb_pod_list_default.csv",
}



# A century: later than any trace's arrival (and an integer of 400 digits overflowed float())
_MAX_ARRIVAL_SECONDS = 100 * 365.25 * 86400

def shared_dir() -> Path:
    """The workspace's ``shared/`` folder: ``<repo>/../shared`` for the main checkout, ``<repo>/../../shared``
    for a worktree under ``wt/``. It may not exist outside this workspace (callers say so and how to fix)."""
    repo = Path(__file__).resolve().parents[2]
    for candidate in (repo / ".." / "shared", repo / ".." / ".." / "shared"):
        if candidate.is_dir():
            return candidate
    return repo / ".." / "shared"


def default_traces_dir() -> Path:
    return shared_dir() / "traces"


def default_runs_path() -> Path:
    return shared_dir() / "reference" / "runs-dev.jsonl"


def _open(path: Path, what: str, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError.one(flag, f"cannot read {what} {path}: {exc.strerror or exc}",
                            f"pass {flag} with the right path") from None
    except UnicodeDecodeError as exc:
        raise SpecError.one(flag, f"cannot read {what} {path}: {exc}", f"pass {flag} a UTF-8 text file") from None


def read_trace(name: str, traces_dir: Path | None = None) -> TraceJobs:
    if name not in TRACE_FILES:
        raise SpecError.one("--jobs", f"unknown trace {name!r}", f"use one of {', '.join(TRACE_FILES)}")
    path = (traces_dir or default_traces_dir()) / TRACE_FILES[name]
    text = _open(path, f"the {name} trace", "--traces-dir")
    trace = parse_philly(text, str(path)) if name == "philly" else parse_pai_pods(text, str(path))
    if not trace.gpus.size:
        raise SpecError.one("--jobs", f"the {name} trace {path} holds no GPU jobs",
                            "point --traces-dir at the folder of the public traces", str(path))
    return trace


class _Rows:
    """CSV rows of a trace with their line numbers; every problem names the file, the line and the column."""

    def __init__(self, text: str, source: str, columns: tuple[str, ...]) -> None:
        self.source = source
        self._reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""))
        try:
            header = next(self._reader, None) or []
        except csv.Error as exc:
            raise SpecError.one("line 1", f"is not a CSV header: {exc}", "check the trace file", source) from None
        missing = [c for c in columns if c not in header]
        if missing:
            raise SpecError.one(missing[0], f"column is missing from the header ({','.join(header) or 'empty'})",
                                f"a {source} trace has the columns {','.join(columns)}", source)
        self._header = header
        self.line = 1

    def __iter__(self) -> Iterator[dict[str, str]]:
        while True:
            try:
                fields = next(self._reader)
            except StopIteration:
                return
            except csv.Error as exc:  # a field past the csv module's limit (131,072 characters), a stray NUL
                raise SpecError.one(f"line {self._reader.line_num}", f"is not a CSV row: {exc}",
                                    "repair or drop the row", self.source) from None
            self.line = self._reader.line_num
            if not fields:
                continue
            if len(fields) != len(self._header):
                raise SpecError.one(f"line {self.line}", f"has {len(fields)} fields; the header has "
                                    f"{len(self._header)}", "repair or drop the row", self.source)
            yield dict(zip(self._header, fields, strict=True))

    def fail(self, column: str, message: str) -> SpecError:
        return SpecError.one(f"line {self.line}: {column}", message, source=self.source)

    def seconds(self, row: dict[str, str], column: str) -> float:
        """A finite, non-negative number of seconds."""
        try:
            value = float(row[column])
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise self.fail(column, f"must be a finite number of seconds >= 0; got {row[column]!r}")
        return value

    def count(self, row: dict[str, str], column: str) -> int:
        """A whole number >= 0 ("4" or "4.0")."""
        try:
            value = float(row[column])
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0 and value == int(value)):
            raise self.fail(column, f"must be a whole number >= 0; got {row[column]!r}")
        return int(value)


PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus")
PAI_COLUMNS = ("num_gpu", "creation_time", "deletion_time", "scheduled_time")


def parse_philly(text: str, source: str = "philly.csv") -> TraceJobs:
    """Philly jobs: arrival from ``timestamp``, run time ``duration``; jobs without a GPU are skipped."""
    arrival: list[float] = []
    gpus: list[int] = []
    duration: list[float] = []
    rows = _Rows(text, source, PHILLY_COLUMNS)
    skipped = 0
    for row in rows:
        try:
            ts = datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            raise rows.fail("timestamp", f"must be YYYY-MM-DD HH:MM:SS; got {row['timestamp']!r}") from None
        seconds = rows.seconds(row, "duration")
        n = rows.count(row, "num_gpus")
        if n == 0:
            skipped += 1
            continue
        arrival.append(ts)
        duration.append(seconds)
        gpus.append(n)
    notes = (f"{skipped} job(s) without a GPU skipped",) if skipped else ()
    return TraceJobs("philly", np.array(arrival), np.array(gpus, dtype=np.int64), np.array(duration), notes)


def parse_pai_pods(text: str, source: str = "openb_pod_list_default.csv") -> TraceJobs:
    """PAI pods: arrival at ``creation_time``, run time ``deletion_time - scheduled_time``.

    A pod's lifetime from its creation includes its wait in Alibaba's own queue, which the simulation models
    itself; a pod with no ``scheduled_time`` (deleted while Pending) never ran and is no job. Pods without a
    GPU are skipped; a fractional GPU (``gpu_milli`` < 1000) counts as one."""
    arrival: list[float] = []
    gpus: list[int] = []
    duration: list[float] = []
    rows = _Rows(text, source, PAI_COLUMNS)
    no_gpu = never_ran = 0
    for row in rows:
        n = rows.count(row, "num_gpu")
        if n == 0:
            no_gpu += 1
            continue
        created = rows.seconds(row, "creation_time")
        deleted = rows.seconds(row, "deletion_time")
        if not row["scheduled_time"].strip():
            never_ran += 1
            continue
        scheduled = rows.seconds(row, "scheduled_time")
        if deleted < scheduled:
            raise rows.fail("deletion_time", f"is before `scheduled_time` ({row['deletion_time']} < "
                                             f"{row['scheduled_time']})")
        arrival.append(created)
        gpus.append(n)
        duration.append(deleted - scheduled)
    notes = ([f"{no_gpu} pod(s) without a GPU skipped"] if no_gpu else []) + \
        ([f"{never_ran} pod(s) never scheduled (deleted while Pending) skipped"] if never_ran else [])
    return TraceJobs("pai", np.array(arrival), np.array(gpus, dtype=np.int64), np.array(duration), tuple(notes))


def read_runs(path: Path) -> list[ReferenceRun]:
    return parse_runs(_open(path, "reference runs", "--runs"), str(path))


def read_specs(path: Path) -> tuple[list[TrainingSpec], list[float | None]]:
    """JSONL: each line a TrainingSpec mapping, or ``{"spec": {...}, "arrival_seconds": 12.5}``."""
    specs: list[TrainingSpec] = []
    arrivals: list[float | None] = []
    for lineno, line in enumerate(_open(path, "jobs", "--jobs").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw: Any = json.loads(line)
        except ValueError as exc:  # JSONDecodeError, and an integer of more than 4,300 digits
            raise SpecError.one(f"line {lineno}", f"is not valid JSON: {getattr(exc, 'msg', exc)}",
                                source=str(path)) from None
        except RecursionError:
            raise SpecError.one(f"line {lineno}", "is not valid JSON: nested too deeply", source=str(path)) from None
        arrival = None
        if isinstance(raw, dict) and "spec" in raw:
            unknown = sorted(set(raw) - {"spec", "arrival_seconds"})
            if unknown:
                raise SpecError.one(f"line {lineno}: {unknown[0]}", "is not a known field",
                                    "a line is a TrainingSpec, or {spec: {...}, arrival_seconds: S}", str(path))
            arrival = raw.get("arrival_seconds")
            if arrival is not None and (isinstance(arrival, bool) or not isinstance(arrival, int | float)
                                        or arrival < 0 or arrival > _MAX_ARRIVAL_SECONDS
                                        or not math.isfinite(arrival)):
                raise SpecError.one(f"line {lineno}: arrival_seconds",
                                    f"must be a finite number of seconds from 0 to a century; got "
                                    f"{str(arrival)[:40]!r}", source=str(path))
            raw = raw["spec"]
        spec = parse_training_spec(raw, source=f"{path}:{lineno}", prefix="spec")
        try:
            resolve_model_cached(spec)  # an unknown model named with its line, not later without it
        except SpecError as exc:
            raise SpecError(exc.problems, source=f"{path}:{lineno}") from None
        if not isinstance(spec.gpus, int):
            raise SpecError.one(f"line {lineno}: spec.gpus", "must be a number of GPUs for simulation; got 'auto'",
                                "set gpus to the count the job runs on", str(path))
        specs.append(spec)
        arrivals.append(float(arrival) if arrival is not None else None)
    if not specs:
        raise SpecError.one("--jobs", f"{path} holds no jobs")
    return specs, arrivals
