"""``vramfit evaluate --runs FILE.jsonl``: the accuracy benchmark against measured reference runs."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from predictors.errors import SpecError
from predictors.evaluation import Evaluation, evaluate, select_runs
from predictors.reference import ReferenceRun, parse_runs_with_problems, with_extra_levels
from predictors.residual_serving import DEFAULT_RUNTIME_UPPER_MARGIN
from predictors.runtime_eval import RuntimeAccuracy, evaluate_runtime
from scheduler.cli.jsonout import json_text


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("evaluate", help="compare predictions with measured reference runs (accuracy benchmark)")
    p.add_argument("--runs", action="append", required=True, help="reference runs JSONL (repeatable)")
    p.add_argument("--quality", default="high,medium", help="qualities to include (default: high,medium)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--rows", action="store_true",
                   help="also list every run with its error (JSON: `rows` and `runtime_rows`)")
    p.add_argument("--all-levels", action="store_true",
                   help="also compare the extra levels a run measured (vramfit calibrate rows: reserved and NVML "
                        "beside allocated); peak VRAM figures only, each level its own row under 'by metric'")
    p.add_argument("--strict", action="store_true",
                   help="fail on any invalid line (default: evaluate the valid runs and list the invalid lines)")
    p.add_argument("--cv", choices=("none", "source"), default="none",
                   help="residual column: the shipped model (none, in-sample on its own training runs) or "
                        "leave-one-source-out refits (source)")
    p.set_defaults(func=run)


def load_runs_lenient(paths: list[str], strict: bool = False) -> tuple[list[ReferenceRun], list[str]]:
    """The valid runs of the files and, for every invalid line, ``"FILE: line N: what is wrong"``. The lines are
    an input error instead when ``strict``, or when no line of the files is a valid run."""
    runs: list[ReferenceRun] = []
    invalid: list[str] = []
    errors: list[SpecError] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError.one("--runs", f"cannot read {path}: {exc}") from None
        valid, problems = parse_runs_with_problems(text)
        runs += valid
        if problems:
            error = SpecError(problems, source=path)
            errors.append(error)
            invalid += [f"{path}: {p.render()}" for p in problems]
    if errors and (strict or not runs):
        raise errors[0] if len(errors) == 1 else SpecError([p for e in errors for p in e.problems],
                                                           source=", ".join(paths))
    if not runs:
        raise SpecError.one("--runs", f"no reference runs in {', '.join(paths)}",
                            "give a JSONL file with one reference run per line")
    return runs, invalid


def run(args: argparse.Namespace) -> int:
    qualities = {q.strip() for q in args.quality.split(",") if q.strip()}
    unknown = qualities - {"high", "medium", "low"}
    if unknown:
        raise SpecError.one("--quality", f"unknown quality {sorted(unknown)}", "use high, medium and/or low")
    if not qualities:
        raise SpecError.one("--quality", f"selects no quality; got {args.quality!r}", "use high, medium and/or low")
    runs, invalid = load_runs_lenient(args.runs, strict=args.strict)
    if invalid:
        print(f"vramfit evaluate: warning: {len(invalid)} problem{'s' if len(invalid) != 1 else ''} in lines not "
              "evaluated (--strict makes them an error):", file=sys.stderr)
        for line in invalid:
            print(f"  - {line}", file=sys.stderr)
    if not any(r.quality in qualities for r in runs):
        found = ", ".join(sorted({r.quality for r in runs}))
        raise SpecError.one("--quality", f"none of the {len(runs)} runs has quality {', '.join(sorted(qualities))} "
                            f"(they have {found})", f"use --quality {found}")
    selected = select_runs(runs, qualities)
    ev = evaluate(with_extra_levels(selected) if args.all_levels else selected)
    runtime = evaluate_runtime(r for r in runs if r.quality in qualities)
    side = residual_side_by_side(runs, qualities, args.cv)
    runtime_side = runtime_residual_side_by_side(runs, qualities, args.cv)
    if args.format == "json":
        out = {**ev.to_dict(), "runtime": runtime.summary(), "residual": side, "runtime_residual": runtime_side,
               "invalid_lines": invalid}
        if args.rows:
            out["rows"] = [{"id": r.run.id, "source": r.run.source, "method": r.run.spec.method,
                            "metric": r.run.measured.metric, "level": r.level, "predicted_bytes": r.predicted_bytes,
                            "measured_bytes": r.measured_bytes, "error": r.error} for r in ev.results]
            out["runtime_rows"] = [{"id": r.run_id, "gpu": r.gpu, "scope": r.scope,
                                    "predicted_tokens_per_second": r.predicted_tokens_per_second,
                                    "measured_tokens_per_second": r.measured_tokens_per_second,
                                    "error": r.error}
                                   for r in runtime.rows]
        print(json_text(out))
    else:
        print(render(ev, rows=args.rows))
        print(render_side_by_side(side))
        print(render_runtime(runtime, rows=args.rows))
        print(render_side_by_side(runtime_side, RUNTIME_SIDE_TITLE, RUNTIME_BOUND_NOTE))
        if invalid:
            print(f"Not evaluated: {len(invalid)} problem{'s' if len(invalid) != 1 else ''} in invalid lines "
                  "(listed on stderr)")
    return 0


def render_runtime(acc: RuntimeAccuracy, rows: bool = False) -> str:
    """Throughput accuracy (tokens/s) on the runs that report one (``rows``: and every run's error)."""
    if not acc.rows:
        return "Throughput: no runs with tokens_per_second"
    out = ["Throughput (tokens/s): absolute percentage error",
           f"  {'':22s} {'n':>4s} {'median':>8s} {'p90':>8s}"]
    for name, scope in (("all", None), ("per_gpu", "per_gpu"), ("per_job", "per_job")):
        n = len([r for r in acc.rows if scope is None or r.scope == scope])
        if n:
            out.append(f"  {name:22s} {n:>4d} {_pct(acc.median_ape(scope) or math.nan):>8s} "
                       f"{_pct(acc.p90_ape(scope) or math.nan):>8s}")
    if acc.scope_corrected:
        out.append(f"  compared per job (per-GPU figure above the GPU's peak): {len(acc.scope_corrected)} runs")
    if rows:
        out.append("rows (error = predicted/measured tokens/s - 1):")
        for r in sorted(acc.rows, key=lambda r: r.error):
            out.append(f"  {r.run_id:10s} {r.gpu:12s} {r.scope:8s} {r.error * 100:7.1f}%  "
                       f"pred {r.predicted_tokens_per_second:12,.0f}  measured {r.measured_tokens_per_second:12,.0f}")
    return "\n".join(out)


def residual_side_by_side(runs, qualities: set[str], cv: str) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """Analytic vs analytic+residual figures (APE, upper-bound coverage and slack), overall and by source."""
    from predictors.residual_build import VRAM

    return VRAM.side_by_side(runs, qualities, cv)


def runtime_residual_side_by_side(runs, qualities: set[str], cv: str) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """Analytic vs analytic+runtime-residual throughput APE and runtime upper-bound coverage and slack."""
    from predictors.residual_build import RUNTIME

    return RUNTIME.side_by_side(runs, qualities, cv)


def _side_line(name: str, block: dict) -> str:  # type: ignore[type-arg]
    a, r = block["analytic"], block["residual"]
    return (f"  {name:8s} {int(a['n']):>4d} {_pct(a['median_ape']):>8s} {_pct(r['median_ape']):>8s} "
            f"{_pct(a['p90_ape']):>8s} {_pct(r['p90_ape']):>8s} {_pct(a['coverage']):>8s} {_pct(r['coverage']):>8s} "
            f"{_pct(a['median_slack']):>8s} {_pct(r['median_slack']):>8s}")


VRAM_SIDE_TITLE = "Analytic vs analytic+residual"
VRAM_BOUND_NOTE = "(upper bound: analytic x 1.15 vs the residual's conformal bound; slack = upper/measured - 1)"
RUNTIME_SIDE_TITLE = "Throughput (tokens/s), analytic vs analytic+runtime residual"
RUNTIME_BOUND_NOTE = (f"(runtime upper bound: analytic x {1 + DEFAULT_RUNTIME_UPPER_MARGIN:g} vs the runtime "
                      "residual's conformal bound; slack = upper/measured runtime - 1)")


def render_side_by_side(side: dict, title: str = VRAM_SIDE_TITLE, note: str = VRAM_BOUND_NOTE) -> str:  # type: ignore[type-arg]
    out = [f"{title}: {side['mode']}"]
    if not side["overall"]:
        return out[0]
    out.append(f"  {note}")
    out.append(f"  {'':8s} {'n':>4s} {'med A':>8s} {'med R':>8s} {'p90 A':>8s} {'p90 R':>8s} {'cov A':>8s} "
               f"{'cov R':>8s} {'slack A':>8s} {'slack R':>8s}")
    out.append(_side_line("all", side["overall"]))
    out += [_side_line(src, block) for src, block in side["by_source"].items()]
    return "\n".join(out)


def _pct(x: float) -> str:
    return "   n/a" if math.isnan(x) else f"{x * 100:5.1f}%"


def _line(name: str, s: dict[str, float]) -> str:
    return (f"  {name:22s} {int(s['n']):>4d} {_pct(s['median_ape']):>8s} {_pct(s['p90_ape']):>8s} "
            f"{_pct(s['max_ape']):>8s} {_pct(s['bias']):>8s} {_pct(s['under_fraction']):>8s}")


def render(ev: Evaluation, rows: bool = False) -> str:
    head = f"  {'':22s} {'n':>4s} {'median':>8s} {'p90':>8s} {'max':>8s} {'bias':>8s} {'under':>8s}"
    out = ["Peak VRAM: absolute percentage error (per-GPU runs)", head, _line("all", ev.summary())]
    for title, key in (("source", lambda r: r.run.source), ("method", lambda r: r.run.spec.method),
                       ("metric", lambda r: r.run.measured.metric)):
        out.append(f" by {title}")
        out += [_line(name, s) for name, s in ev.by(key).items()]
    out.append(f"OOM runs predicted above the GPU's memory: {ev.oom_right}/{ev.oom_total}"
               + (f" (missed: {', '.join(ev.oom_wrong)})" if ev.oom_wrong else ""))
    if ev.skipped:
        out.append(f"skipped {len(ev.skipped)} runs: " + "; ".join(f"{i}: {why}" for i, why in ev.skipped[:5]))
    if rows:
        out.append("rows (error = predicted/measured - 1):")
        for r in sorted(ev.results, key=lambda r: r.error or 0.0):
            measured_gib = (r.measured_bytes or 0) / 2**30
            out.append(f"  {r.run.id:10s} {r.run.measured.metric:9s} {r.level:22s} {(r.error or 0) * 100:7.1f}%  "
                       f"pred {r.predicted_bytes / 2**30:7.2f} GiB  measured {measured_gib:7.2f} GiB")
    return "\n".join(out)
