"""Reading the inputs of a simulation from files: cluster traces, reference runs, spec lists (the only I/O).

Trace formats (``shared/traces/README.md``):

* ``philly``: ``philly_pollux_subset/philly.csv``, ``timestamp,duration,num_gpus,gpu_time,cluster`` with
  ``timestamp`` as ``YYYY-MM-DD HH:MM:SS`` and ``duration`` in seconds (Microsoft Philly, CC BY 4.0, as
  pre-processed by the Pollux authors; cite Jeon et al. ATC'19, Qiao et al. OSDI'21).
* ``pai``: ``alibaba_gpu_v2023/csv/openb_pod_list_default.csv``, ``creation_time``, ``deletion_time`` in
  seconds from the trace start, ``num_gpu`` and ``gpu_milli`` (Alibaba, research/study use; cite Weng et al.
  ATC'23). Pods without a GPU are skipped; a fractional GPU counts as one; duration = deletion - creation.
"""

from __future__ import annotations

import csv
import json
import math
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
    return parse_philly(text) if name == "philly" else parse_pai_pods(text)


def parse_philly(text: str) -> TraceJobs:
    arrival: list[float] = []
    gpus: list[int] = []
    duration: list[float] = []
    for row in csv.DictReader(text.splitlines()):
        try:
            ts = datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
            arrival.append(ts)
            duration.append(float(row["duration"]))
            gpus.append(max(int(float(row["num_gpus"])), 1))
        except (KeyError, ValueError) as exc:
            raise SpecError.one("philly.csv", f"bad row {row!r}: {exc}") from None
    return TraceJobs("philly", np.array(arrival), np.array(gpus, dtype=np.int64), np.array(duration))


def parse_pai_pods(text: str) -> TraceJobs:
    arrival: list[float] = []
    gpus: list[int] = []
    duration: list[float] = []
    for row in csv.DictReader(text.splitlines()):
        try:
            n = int(row["num_gpu"])
            if n <= 0:
                continue
            created = float(row["creation_time"])
            deleted = float(row["deletion_time"])
        except (KeyError, ValueError) as exc:
            raise SpecError.one("openb_pod_list", f"bad row {row!r}: {exc}") from None
        arrival.append(created)
        gpus.append(n)
        duration.append(deleted - created)
    return TraceJobs("pai", np.array(arrival), np.array(gpus, dtype=np.int64), np.array(duration))


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
                                        or not math.isfinite(arrival) or arrival < 0):
                raise SpecError.one(f"line {lineno}: arrival_seconds",
                                    f"must be a finite number of seconds >= 0; got {arrival!r}", source=str(path))
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
