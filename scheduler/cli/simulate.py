"""``vramfit simulate --pools POOLS.yaml --jobs JOBS --policy P [--policy P2 ...] [--out DIR]``.

A what-if simulation of a multi-tenant cluster (docs/simulate.md): the same jobs under several placement
policies; per policy cost, GPU-hours, OOM failures and wasted GPU-hours, queue wait, completion time and
utilisation per pool; a JSON summary, a table and PNG plots.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from predictors.errors import SpecError
from scheduler.cli import check_output_folder
from scheduler.cli.jsonout import json_text
from scheduler.pools import default_pools, load_pools
from scheduler.simulate.engine import simulate
from scheduler.simulate.policies import POLICY_NAMES, make_policy
from scheduler.simulate.report import compare, render_table, summarize
from scheduler.simulate.scenario import (
    DEFAULT_LOAD,
    DEFAULT_REFERENCE_SHARE,
    DEFAULT_TEMPLATES,
    Scenario,
    ScenarioError,
    build_from_specs,
    build_from_trace,
    build_generated,
    reference_templates,
)
from scheduler.simulate.traces import TRACE_FILES, default_runs_path, read_runs, read_specs, read_trace
from scheduler.simulate.truth import measure_errors

JOBS_HELP = ("job source: generate:N (the default mix, N jobs), philly[:N] or pai[:N] (arrivals, GPU counts and "
             "durations from the trace), or a JSONL file of TrainingSpecs (one per line, or "
             "{spec: {...}, arrival_seconds: S})")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("simulate", help="what-if simulation of a cluster: cost, OOMs and waits per policy",
                       description=(__doc__ or "").split("\n\n", 1)[-1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pools", help="node pools YAML (default: the embedded pools)")
    p.add_argument("--jobs", default="generate:10000", help=JOBS_HELP + " (default generate:10000)")
    p.add_argument("--policy", action="append", choices=POLICY_NAMES,
                   help="policy to simulate (repeatable; default: all)")
    p.add_argument("--out", help="folder for summary.json, table.txt and the PNG plots")
    p.add_argument("--seed", type=int, default=0, help="seed of the mix, the truth and the OOM times (default 0)")
    p.add_argument("--load", type=float, default=DEFAULT_LOAD,
                   help=f"offered load for Poisson arrivals, GPU-time asked / GPU-time available "
                        f"(default {DEFAULT_LOAD})")
    p.add_argument("--templates", type=int, default=DEFAULT_TEMPLATES,
                   help=f"generated templates in the mix (default {DEFAULT_TEMPLATES})")
    p.add_argument("--reference-share", type=float, default=DEFAULT_REFERENCE_SHARE,
                   help="share of generated jobs that are measured reference runs "
                        f"(default {DEFAULT_REFERENCE_SHARE})")
    p.add_argument("--runs", help="reference runs JSONL for the truth model (default ../shared/reference/"
                                  "runs-dev.jsonl)")
    p.add_argument("--traces-dir", help="folder of the public traces (default ../shared/traces)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _count(text: str, what: str) -> int:
    try:
        n = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        n = 0
    if n <= 0:
        raise SpecError.one("--jobs", f"{what} needs a positive job count; got {text!r}", "e.g. generate:10000")
    return n


def build_scenario(args: argparse.Namespace) -> tuple[Scenario, dict[str, Any]]:
    pools = load_pools(args.pools) if args.pools else default_pools()
    runs_path = Path(args.runs) if args.runs else default_runs_path()
    if not runs_path.is_file():
        raise SpecError.one("--runs", f"reference runs not found at {runs_path}",
                            "pass --runs PATH (the truth model measures the analytic error on them)")
    runs = read_runs(runs_path)
    errors = measure_errors(runs)
    source, _, count = args.jobs.partition(":")
    if not 0 <= args.reference_share <= 1:
        raise SpecError.one("--reference-share", f"must be in [0, 1]; got {args.reference_share}")
    if not (math.isfinite(args.load) and args.load > 0):
        raise SpecError.one("--load", f"must be a positive, finite number; got {args.load}")
    if args.templates <= 0:
        raise SpecError.one("--templates", f"must be a positive number of job templates; got {args.templates}")
    try:
        if source == "generate":
            scenario = build_generated(_count(count, "generate"), pools, errors, args.seed, args.load,
                                       args.templates, reference_templates(runs, errors), args.reference_share)
        elif source in TRACE_FILES:
            traces_dir = Path(args.traces_dir) if args.traces_dir else None
            trace = read_trace(source, traces_dir)
            scenario = build_from_trace(trace, _count(count, source) if count else None, pools, errors, args.seed)
        else:
            specs, arrivals = read_specs(Path(args.jobs))
            scenario = build_from_specs(specs, arrivals, pools, errors, args.seed, args.load)
    except ScenarioError as exc:
        raise SpecError.one("--jobs", str(exc), "simulate jobs that fit the pools of --pools") from None
    meta = {"jobs": args.jobs, "n_jobs": scenario.mix.n_jobs, "seed": args.seed, "runs": str(runs_path),
            "pools": [{"name": p.name, "gpu": p.gpu, "gpus": p.total_gpus, "price_usd_per_gpu_hour":
                       p.price_usd_per_gpu_hour} for p in scenario.table.pools],
            "notes": list(scenario.notes), "error_model": errors.summary()}
    return scenario, meta


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="job", file=sys.stderr, desc="simulating")


def run(args: argparse.Namespace) -> int:
    if args.seed < 0:
        raise SpecError.one("--seed", f"must be a non-negative integer; got {args.seed}")
    if args.out:
        check_output_folder(Path(args.out), "--out")  # before the simulation, not after it
    started = time.perf_counter()
    scenario, meta = build_scenario(args)
    built = time.perf_counter()
    policies = args.policy or list(POLICY_NAMES)
    bar = _progress_bar(scenario.mix.n_jobs * len(policies), not args.no_progress and sys.stderr.isatty())
    results, summaries, seconds = [], [], {}
    for name in dict.fromkeys(policies):
        if bar is not None:
            bar.set_postfix_str(name)
        t0 = time.perf_counter()
        policy = make_policy(name, scenario.table, scenario.truth)
        result = simulate(scenario.mix, scenario.table, scenario.truth, policy, seed=args.seed,
                          progress=bar.update if bar is not None else None)
        seconds[name] = time.perf_counter() - t0
        results.append(result)
        summaries.append(summarize(result))
    if bar is not None:
        bar.close()
    out = {"scenario": meta, "policies": summaries, "vramfit_cost_vs": compare(summaries),
           "timing_seconds": {"scenario": built - started, "simulate": seconds}}
    table = render_table(summaries)
    if args.out:
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").write_text(json_text(out) + "\n", encoding="utf-8")
        (out_dir / "table.txt").write_text(table + "\n", encoding="utf-8")
        if not args.no_plots:
            from scheduler.simulate.plots import write_plots

            out["plots"] = [str(p) for p in write_plots(results, summaries, out_dir)]
    if args.format == "json":
        print(json_text(out))
    else:
        for note in meta["notes"]:
            print(f"# {note}")
        print(table)
        if args.out:
            print(f"# wrote {Path(args.out) / 'summary.json'}" + ("" if args.no_plots else " and PNG plots"))
    return 0
