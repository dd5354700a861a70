"""The parent of a calibration sweep: one worker process per config, rows appended as they complete.

Each config runs in its own ``python -m scheduler.calibrate.worker`` process (its own session, so a
timeout kills the whole process group) so that an OOM, a crash or a hang spoils only its own row. Rows
are appended and flushed one at a time: a sweep killed half-way keeps what it measured, and ``resume``
skips the configs already in the file. Every row is a reference run (``predictors.reference.ReferenceRun``,
schema in ``shared/reference/README.md``) with an ``environment`` (versions, GPU, driver) and a
``calibration`` object (config id, sweep, group, outcome, reason). Outcomes: ``ok`` (measured), ``oom``
(CUDA out of memory: ``measured.oom``), ``skipped`` (cannot be measured here, e.g. qlora on CPU), ``crash``
and ``timeout`` (no measurement). Only ``ok``/``oom`` rows taken on CUDA carry memory and are ``high``
quality; CPU rows carry throughput only and are ``low``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import scheduler
from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.reference import ReferenceRun
from scheduler.calibrate.sweep import SweepConfig
from scheduler.calibrate.worker import INSTALL_HINT, PREIMPORT_ENV, RESULT_PREFIX

SOURCE_ID = "vramfit_calibrate"
MEASURED_OUTCOMES = ("ok", "oom")
STDERR_TAIL_CHARS = 2000


class CalibrateError(RuntimeError):
    """The sweep cannot run at all (missing packages, unusable output file)."""


@dataclass(frozen=True)
class RunnerOptions:
    """How the worker processes are run."""

    warmup_steps: int = 2
    measured_steps: int = 3
    timeout_seconds: float = 900.0
    device: str = "auto"  # auto | cuda | cpu
    python_executable: str = sys.executable
    scratch_dir: str | None = None  # where qlora writes its temporary checkpoint


@dataclass
class WorkerOutcome:
    """What one worker process produced."""

    result: dict[str, Any]
    wall_seconds: float
    stderr_tail: str = ""


@dataclass
class SweepSummary:
    """Counts by outcome, and the rows written by this invocation."""

    outcomes: dict[str, int] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped_existing: int = 0


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(scheduler.__file__).resolve().parents[1])  # the worker imports this same checkout
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded; fail fast if something tries
    return env


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def parse_worker_output(stdout: str) -> dict[str, Any] | None:
    """The worker's result: the last stdout line with the result prefix (None when there is none)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                parsed = json.loads(line[len(RESULT_PREFIX):])
            except json.JSONDecodeError:
                return None
            return parsed if isinstance(parsed, dict) else None
    return None


def start_worker(options: RunnerOptions, preimport: bool = False) -> subprocess.Popen[str]:
    """Start a worker process that waits for its job on stdin (``preimport``: imports torch and transformers
    first)."""
    env = _worker_env()
    if preimport:
        env[PREIMPORT_ENV] = "1"
    return subprocess.Popen(
        [options.python_executable, "-m", "scheduler.calibrate.worker"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, start_new_session=True,
    )


def run_worker(job: dict[str, Any], options: RunnerOptions, timeout_seconds: float,
               proc: subprocess.Popen[str] | None = None) -> WorkerOutcome:
    """Run one worker process with a wall-clock budget; crashes and timeouts become results.

    ``proc``: a worker started earlier (:func:`start_worker`) that is still waiting for its job; the budget
    counts from when the job is sent.
    """
    started = time.monotonic()
    if proc is None:
        proc = start_worker(options)
    try:
        stdout, stderr = proc.communicate(json.dumps(job), timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        stdout, stderr = proc.communicate()
        finished = parse_worker_output(stdout)
        if finished is not None:  # it measured and reported, then hung on its way out (CUDA teardown, threads)
            notes = [*finished.get("notes", []), f"The worker did not exit after its result; killed at the budget "
                     f"of {timeout_seconds:g} s."]
            return WorkerOutcome({**finished, "notes": notes}, time.monotonic() - started,
                                 stderr[-STDERR_TAIL_CHARS:])
        return WorkerOutcome({"outcome": "timeout", "reason": f"exceeded the budget of {timeout_seconds:g} s"},
                             time.monotonic() - started, stderr[-STDERR_TAIL_CHARS:])
    except BaseException:  # Ctrl-C: take the child down with us
        _kill_group(proc)
        raise
    wall_seconds = time.monotonic() - started
    tail = stderr[-STDERR_TAIL_CHARS:]
    result = parse_worker_output(stdout)
    if result is None:
        code = proc.returncode
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        hint = " (SIGKILL: host out of memory?)" if code == -signal.SIGKILL else ""
        last = tail.strip().splitlines()[-1:] or [""]
        result = {"outcome": "crash", "reason": f"worker {how}{hint} without a result: {last[0][:300]}"}
    return WorkerOutcome(result, wall_seconds, tail)


def gpu_label(environment: dict[str, Any]) -> str:
    """The GPU's catalog name, or ``unknown`` (CPU, or a GPU the catalog does not have)."""
    name = environment.get("gpu_name")
    if environment.get("device") != "cuda" or not name:
        return "unknown"
    try:
        return lookup_gpu(str(name)).name
    except SpecError:
        return "unknown"


def row_id(config_id: str, environment: dict[str, Any]) -> str:
    """``CAL-<sha8>`` of the config and the device it ran on (the same config on two GPUs: two ids)."""
    device = environment.get("gpu_name") or environment.get("device") or "unknown"
    digest = hashlib.sha256(f"{config_id}|{device}".encode()).hexdigest()[:8]
    return f"CAL-{digest}"


def _notes(config: SweepConfig, result: dict[str, Any], environment: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {environment.get(k)}" for k in ("torch", "transformers", "peft", "bitsandbytes")
                         if environment.get(k))
    parts = [f"vramfit calibrate: random-weight {config.spec.task} model from its config, synthetic tokens, "
             f"{result.get('warmup_steps', '?')} warm-up + {result.get('measured_steps', '?')} measured steps "
             f"({versions})."]
    if environment.get("device") != "cuda":
        parts.append("CPU run: throughput only, no GPU memory measured; not for memory or GPU runtime fitting.")
    if result.get("outcome") not in MEASURED_OUTCOMES:
        parts.append(f"No measurement: {result.get('outcome')}: {result.get('reason')}.")
    parts += [str(n) for n in result.get("notes", [])]
    return " ".join(parts)


def build_row(config: SweepConfig, outcome: WorkerOutcome, environment: dict[str, Any],
              sweep_name: str) -> dict[str, Any]:
    """A reference-run row (validated) from a worker's result."""
    result = outcome.result
    kind = str(result.get("outcome", "crash"))
    env = {**environment, **(result.get("environment") or {})}
    on_gpu = env.get("device") == "cuda"
    gpu = gpu_label(env)
    spec = dict(config.spec_dict)
    # the worker trains with transformers, PEFT and bitsandbytes: the row says so, and is predicted under that
    # framework's assumptions (the config id stays that of the sweep's spec, so --resume matches older rows)
    spec["framework"] = "transformers"
    if gpu != "unknown":
        spec["gpu"] = gpu
    else:  # a GPU pinned by the sweep is not the device this row ran on
        spec.pop("gpu", None)
    measured_ok = kind == "ok"
    tokens_per_second = result.get("tokens_per_second") if measured_ok else None
    measured = {
        "peak_bytes": result.get("peak_allocated_bytes") if measured_ok and on_gpu else None,
        "metric": "allocated",
        "scope": "per_gpu",
        "oom": kind == "oom",
        "unit_uncertain": False,
        "tokens_per_second": tokens_per_second,
        "tokens_per_second_scope": "per_gpu" if tokens_per_second else None,
        "peak_reserved_bytes": result.get("peak_reserved_bytes") if measured_ok and on_gpu else None,
        "peak_nvml_bytes": result.get("peak_nvml_bytes") if measured_ok and on_gpu else None,
        "nvml_baseline_bytes": result.get("nvml_baseline_bytes"),
        "peak_allocated_before_oom_bytes": result.get("peak_allocated_before_oom_bytes"),
        "peak_reserved_before_oom_bytes": result.get("peak_reserved_before_oom_bytes"),
        "device": env.get("device"),
        "params_total": result.get("params_total"),
        "params_trainable": result.get("params_trainable"),
        "warmup_steps": result.get("warmup_steps"),
        "measured_steps": result.get("measured_steps"),
        "step_seconds": result.get("step_seconds"),
    }
    row: dict[str, Any] = {
        "id": row_id(config.config_id, env),
        "source_id": SOURCE_ID,
        "quality": "high" if on_gpu and kind in MEASURED_OUTCOMES else "low",
        "spec": spec,
        "gpu": gpu,
        "measured": measured,
        "unknowns": [],
        "notes": _notes(config, result, env),
        "environment": env,
        "calibration": {
            "config_id": config.config_id,
            "sweep": sweep_name,
            "group": config.group,
            "outcome": kind,
            "reason": result.get("reason"),
            "wall_seconds": round(outcome.wall_seconds, 3),
            "stderr_tail": outcome.stderr_tail if kind in ("crash", "timeout") else None,
        },
    }
    ReferenceRun.model_validate(row)
    return row


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CalibrateError(f"cannot read --out {path}: {exc.strerror or exc}") from None


def existing_rows(path: Path) -> list[dict[str, Any]]:
    """The readable rows of an output file (a line cut off by a kill is not one: its config runs again)."""
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    for line in _read_text(path).splitlines():
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(raw, dict):
            rows.append(raw)
    return rows


def existing_config_ids(path: Path) -> set[str]:
    """Config ids of the rows already in an output file (for resume); unreadable lines are ignored."""
    ids: set[str] = set()
    for raw in existing_rows(path):
        config_id = (raw.get("calibration") or {}).get("config_id")
        if isinstance(config_id, str):
            ids.add(config_id)
    return ids


def device_label(environment: dict[str, Any]) -> str:
    """The device a row was measured on: the GPU's name, else the device type (``cpu``)."""
    return str(environment.get("gpu_name") or environment.get("device") or "unknown")


def other_devices(path: Path, environment: dict[str, Any]) -> dict[str, int]:
    """Devices other than this one that rows of ``path`` were measured on, with their row counts."""
    here = device_label(environment)
    counts: dict[str, int] = {}
    for raw in existing_rows(path):
        env = raw.get("environment")
        if isinstance(env, dict) and (label := device_label(env)) != here:
            counts[label] = counts.get(label, 0) + 1
    return counts


def repair_cut_off_line(path: Path) -> str | None:
    """Make the file end with a line end before rows are appended to it; returns what was done (None: nothing).

    A last line without its line end was cut off while it was written (a kill, a full disk): appending to it
    would glue the next row onto it and lose both. It is removed (its config runs again), or, if it is a
    complete row that only lacks the line end, the line end is added.
    """
    try:
        data = path.read_bytes() if path.exists() else b""
    except OSError as exc:
        raise CalibrateError(f"cannot read --out {path}: {exc.strerror or exc}") from None
    if not data or data.endswith(b"\n"):
        return None
    keep = data.rfind(b"\n") + 1
    try:
        complete = isinstance(json.loads(data[keep:]), dict)
    except (ValueError, RecursionError):
        complete = False
    try:
        if complete:
            with path.open("ab") as handle:
                handle.write(b"\n")
            return f"added the missing line end after the last row of {path}"
        with path.open("r+b") as handle:
            handle.truncate(keep)
    except OSError as exc:
        raise CalibrateError(f"cannot repair --out {path}: {exc.strerror or exc}") from None
    return f"removed a cut-off last line of {len(data) - keep} bytes from {path} (its config runs again)"


def check_output(path: Path) -> None:
    """Fail before anything runs when rows could not be written to ``path`` (creates it, empty, if missing)."""
    if path.exists() and not path.is_file():
        raise CalibrateError(f"--out {path} is not a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise CalibrateError(f"cannot write --out {path}: {exc.strerror or exc}") from None


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line and make it durable before the next config starts."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row, separators=(",", ":")) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def missing_packages() -> list[str]:
    """The calibration packages that are not installed (checked without importing them)."""
    return [name for name in ("torch", "transformers", "peft") if importlib.util.find_spec(name) is None]


def drop_failed_rows(path: Path) -> int:
    """Remove the crash/timeout rows of an output file (atomically) so that resume runs them again, and a last line
    cut off by a killed run. Any other line that does not parse is kept as it is (a measured row with a hand-edit
    typo was deleted as a "crash row"): reading the file then names it."""
    if not path.exists():
        return 0
    kept: list[str] = []
    dropped = 0
    text = _read_text(path)
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            outcome = (json.loads(line).get("calibration") or {}).get("outcome")
        except (ValueError, RecursionError, AttributeError):
            # a last line without its newline is a write the run was killed in: run that config again
            outcome = "cut off" if number == len(lines) and not text.endswith("\n") else "unreadable"
        if outcome in ("crash", "timeout", "cut off"):
            dropped += 1
        else:
            kept.append(line + "\n")
    if dropped:
        scratch = path.with_name(path.name + ".tmp")
        scratch.write_text("".join(kept), encoding="utf-8")
        os.replace(scratch, path)
    return dropped


def probe_environment(options: RunnerOptions) -> dict[str, Any]:
    """Start one worker to check the packages and read the device facts used for every row.

    A broken setup (no CUDA with --device cuda, a missing package) fails here, before it can fill the
    output file with crash rows that resume would then skip.
    """
    missing = missing_packages()
    if missing:
        raise CalibrateError(f"calibration needs {', '.join(missing)}: {INSTALL_HINT}")
    outcome = run_worker({"mode": "probe", "device": options.device}, options, options.timeout_seconds)
    if outcome.result.get("outcome") != "ok":
        raise CalibrateError(f"cannot start a calibration worker: {outcome.result.get('reason')}")
    return dict(outcome.result.get("environment") or {})


def run_sweep(configs: list[SweepConfig], out_path: Path, sweep_name: str, options: RunnerOptions,
              resume: bool = False, retry_failed: bool = False,
              log: Callable[[str], None] = print) -> SweepSummary:
    """Run every config not yet in ``out_path`` and append its row there.

    ``resume`` continues a file (otherwise a non-empty file is an error); ``retry_failed`` (implies resume)
    first removes its crash/timeout rows so that those configs run again.
    """
    summary = SweepSummary()
    if out_path.exists() and not out_path.is_file():
        raise CalibrateError(f"--out {out_path} is not a file")
    if out_path.exists() and out_path.stat().st_size > 0 and not (resume or retry_failed):
        raise CalibrateError(f"{out_path} already has rows: pass --resume to continue it, or choose another --out")
    if retry_failed:
        dropped = drop_failed_rows(out_path)
        if dropped:
            log(f"retry: removed {dropped} crash/timeout rows from {out_path}")
        resume = True
    if resume:
        repaired = repair_cut_off_line(out_path)
        if repaired:
            log(f"resume: {repaired}")
    done = existing_config_ids(out_path) if resume else set()
    pending = [c for c in configs if c.config_id not in done]
    summary.skipped_existing = len(configs) - len(pending)
    if summary.skipped_existing:
        log(f"resume: {summary.skipped_existing} configs already in {out_path}")
    if not pending:
        return summary
    created = not out_path.exists()
    check_output(out_path)
    try:
        environment = probe_environment(options)
    except BaseException:
        if created and out_path.exists() and out_path.stat().st_size == 0:
            out_path.unlink()  # no worker could start (torch missing, say): leave no empty file behind
        raise
    if resume:
        others = other_devices(out_path, environment)
        if others:
            found = ", ".join(f"{n} on {label}" for label, n in sorted(others.items()))
            raise CalibrateError(f"{out_path} has rows measured on another device ({found}); this worker runs on "
                                 f"{device_label(environment)}: resume a file of this device, or choose another "
                                 "--out (one file per GPU type)")
    log(f"device: {environment.get('gpu_name') or environment.get('device')}; torch {environment.get('torch')}, "
        f"transformers {environment.get('transformers')}, peft {environment.get('peft')}")
    # On a GPU host with cores to spare, one spare worker imports torch and transformers while the current
    # config runs (it touches no GPU until it has its job): 3-5 s saved per config. Not on CPU runs, where its
    # imports would compete with the throughput being measured. The spare is killed when the sweep ends.
    prestart = environment.get("device") == "cuda" and (os.cpu_count() or 1) >= 4
    spare: subprocess.Popen[str] | None = start_worker(options, preimport=True) if prestart else None
    try:
        for number, config in enumerate(pending, start=1):
            proc, spare = spare, (start_worker(options, preimport=True) if prestart and number < len(pending)
                                  else None)
            _run_config(number, len(pending), config, proc, out_path, sweep_name, environment, options, summary,
                        log)
    finally:
        if spare is not None:
            _kill_group(spare)
            spare.communicate()
    return summary


def _run_config(number: int, total: int, config: SweepConfig, proc: subprocess.Popen[str] | None, out_path: Path,
                sweep_name: str, environment: dict[str, Any], options: RunnerOptions, summary: SweepSummary,
                log: Callable[[str], None]) -> None:
    """Run config ``number`` of ``total`` in ``proc`` and append its row."""
    timeout_seconds = config.timeout_seconds or options.timeout_seconds
    job = {"mode": "run", "config_id": config.config_id, "spec": config.spec_dict, "device": options.device,
           "warmup_steps": options.warmup_steps, "measured_steps": options.measured_steps,
           "time_budget_seconds": timeout_seconds, "scratch_dir": options.scratch_dir}
    outcome = run_worker(job, options, timeout_seconds, proc)
    row = build_row(config, outcome, environment, sweep_name)
    try:
        append_row(out_path, row)
    except OSError as exc:
        raise CalibrateError(f"cannot append the row of {config.config_id} to {out_path}: "
                             f"{exc.strerror or exc}; the rows before it are kept (--resume continues)") from None
    summary.rows.append(row)
    kind = row["calibration"]["outcome"]
    summary.outcomes[kind] = summary.outcomes.get(kind, 0) + 1
    log(f"[{number}/{total}] {config.config_id} {_describe(row)} ({outcome.wall_seconds:.0f} s) "
        f"{config.summary}")


def _describe(row: dict[str, Any]) -> str:
    measured = row["measured"]
    kind = row["calibration"]["outcome"]
    parts = [kind]
    if measured.get("peak_bytes"):
        parts.append(f"{measured['peak_bytes'] / 2**30:.2f} GiB allocated")
    if measured.get("tokens_per_second"):
        parts.append(f"{measured['tokens_per_second']:.0f} tok/s")
    if kind not in MEASURED_OUTCOMES and row["calibration"].get("reason"):
        parts.append(str(row["calibration"]["reason"])[:120])
    return ", ".join(parts)
