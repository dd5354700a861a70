"""``vramfit place SPEC [--pools POOLS.yaml] [--objective ...] [--format table|json]``."""

from __future__ import annotations

import argparse
import math

from predictors.errors import SpecError
from predictors.units import format_bytes
from scheduler.cli.jsonout import json_text
from scheduler.placement import (
    DEFAULT_HEADROOM_FRACTION,
    OBJECTIVES,
    PINNED_ELSEWHERE,
    Decision,
    ObjectiveError,
    format_duration,
    place,
)
from scheduler.pools import default_pools, load_pools
from scheduler.spec import read_jobs
from scheduler.spec.document import ParsedJob, answer_each

POOLS_HELP = """pools file (YAML): `pools:` a list of {name, gpu, gpus_per_node, nodes, price_usd_per_gpu_hour,
free_gpus?, node_selector?, tolerations?, interconnect? {intra_node_bytes_per_second, inter_node_bytes_per_second},
max_gpus_per_job?, price_source?}, optional `headroom_fraction`. Default: the embedded L40S, A100-80GB, H100-80GB
and B200 pools."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("place", help="choose the cheapest (or fastest) node pool that fits a training job",
                       description=POOLS_HELP)
    p.add_argument("spec", help="TrainingSpec YAML/JSON file or job manifest (- reads standard input)")
    p.add_argument("--pools", help="node pools YAML (default: the embedded pools)")
    p.add_argument("--objective", choices=OBJECTIVES,
                   help="default: cheapest, or cheapest-within-deadline with --deadline-hours. Pools are "
                   "compared at the smallest GPU count that fits; a deadline grows the count")
    p.add_argument("--deadline-hours", type=float, help="deadline for cheapest-within-deadline (else the spec's); "
                   "without --objective it selects that objective")
    p.add_argument("--headroom", type=float, help=f"fraction of GPU memory kept free (default "
                   f"{DEFAULT_HEADROOM_FRACTION}, or the pools file's headroom_fraction)")
    p.add_argument("--runtime", action="append", default=[], metavar="FILE",
                   help="a file with the (Cluster)TrainingRuntime a TrainJob references (repeatable)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=run)


def deadline_seconds(hours: float | None) -> float | None:
    """``--deadline-hours`` in seconds (``None`` when not given); a deadline that is not a positive, finite
    number of hours is an input error, not a job that can never be placed."""
    if hours is None:
        return None
    if not (math.isfinite(hours) and hours > 0):
        raise SpecError.one("--deadline-hours", f"must be a positive number of hours; got {hours}",
                            "pass e.g. --deadline-hours 12")
    if hours > MAX_DEADLINE_HOURS:  # 1e308 hours overflowed to an infinite deadline, blamed on --objective
        raise SpecError.one("--deadline-hours", f"must be at most {MAX_DEADLINE_HOURS:,} hours (a century); got "
                            f"{hours:g}", "pass e.g. --deadline-hours 12")
    return hours * 3600


MAX_DEADLINE_HOURS = 876_600


def run(args: argparse.Namespace) -> int:
    pools = load_pools(args.pools) if args.pools else default_pools()
    jobs = read_jobs(args.spec, args.runtime)
    deadline = deadline_seconds(args.deadline_hours)
    if args.headroom is not None and not 0 <= args.headroom < 1:
        raise SpecError.one("--headroom", f"must be a fraction in [0, 1); got {args.headroom}")

    objective = args.objective or ("cheapest-within-deadline" if deadline is not None else "cheapest")

    def decide(job: ParsedJob) -> Decision:
        try:
            return place(job.spec, pools, objective, deadline, args.headroom, base_dir=job.base_dir,
                         pod_shapes=job.pod_shapes)
        except ObjectiveError as exc:
            raise SpecError.one("--objective", str(exc), "add `deadline_seconds` to the spec or pass "
                                "--deadline-hours") from None

    decisions = answer_each(jobs, args.spec if args.spec != "-" else "<stdin>", decide)
    if args.format == "json":
        out = [d.to_dict() for d in decisions]
        for job, entry, d in zip(jobs, out, decisions, strict=True):
            if len(out) > 1 or job.kind != "TrainingSpec":  # which job each decision is for, named as predict names it
                entry["job"] = job.label
            pred = d.chosen_prediction
            if pred is not None:  # the chosen pool's prediction, explained as `vramfit predict --format json` does
                entry["prediction"] = {**pred.to_dict(), **pred.level_explanation(), **pred.runtime_explanation()}
        print(json_text(out[0] if len(out) == 1 else out))
    else:
        for job, d in zip(jobs, decisions, strict=True):
            if len(jobs) > 1:
                print(f"# {job.label}")
            print(render_table(d))
    # 1 when a job fits no pool (as `vramfit ray submit`), so `vramfit place job.yaml && kubectl apply ...` stops
    return 1 if any(d.decision != "placed" for d in decisions) else 0


def _money(value: float | None) -> str:
    return f"${value:,.2f}" if value is not None else "-"


def _no_fix_hint(d: Decision) -> str:
    pinned_out = [o for o in d.alternatives if o.reason.startswith(PINNED_ELSEWHERE)]
    if pinned_out and len(pinned_out) == len(d.alternatives):
        return ("no pool offers the GPU the spec pins (its `gpu`); remove the pin so every pool is tried, or add a "
                "pool of that GPU to the pools file")
    if pinned_out:
        return "no single change found that fits the pinned GPU; remove the spec's `gpu` so the other pools are tried"
    return "no single change found that fits; consider a larger GPU pool"


def render_table(d: Decision) -> str:
    lines: list[str] = []
    c = d.chosen
    if c is not None:
        nodes = f"{c.nodes} node{'s' if c.nodes != 1 else ''}"
        runtime_upper = f" (upper {format_duration(c.runtime_upper_seconds)})" if c.runtime_upper_seconds else ""
        cost = (f"{format_duration(c.runtime_seconds)}{runtime_upper}, {_money(c.cost_usd)}" if c.runtime_seconds
                else "runtime and cost unknown (no train_tokens or steps)")
        lines.append(f"placed on {c.pool.name} ({c.gpus} x {c.pool.gpu}, {nodes}): "
                     f"peak {format_bytes(c.peak_vram_bytes or 0)} (upper {format_bytes(c.peak_vram_upper_bytes or 0)})"
                     f" per GPU, {cost}  [objective: {d.objective}]")
        if d.waits_for_capacity:
            lines.append(f"waits for capacity: {c.pool.name} has {c.pool.free_gpus} free GPUs now, the job needs "
                         f"{c.gpus}")
    else:
        lines.append(f"unschedulable  [objective: {d.objective}]")
    lines.append(f"{'rank':>4s}  {'pool':14s} {'gpu':10s} {'fits':4s} {'gpus':>4s} {'upper/GPU':>11s} "
                 f"{'usable':>10s} {'runtime':>9s} {'cost':>11s}  reason")
    for o in d.alternatives:
        upper = format_bytes(o.peak_vram_upper_bytes) if o.peak_vram_upper_bytes else "-"
        lines.append(f"{o.rank or '-':>4}  {o.pool.name:14s} {o.pool.gpu:10s} {'yes' if o.fits else 'no':4s} "
                     f"{o.gpus or '-':>4} {upper:>11s} {format_bytes(o.usable_bytes):>10s} "
                     f"{format_duration(o.runtime_seconds):>9s} {_money(o.cost_usd):>11s}  {o.reason}")
    if d.suggestions:
        lines.append("what would fit (each re-predicted and re-placed):")
        for s in d.suggestions:
            cost = (f", {format_duration(s.predicted_runtime_seconds)}, {_money(s.predicted_cost_usd)}"
                    if s.predicted_runtime_seconds else "")  # without train_tokens or steps (warned below)
            cache = (f" ({format_bytes(s.peak_vram_bytes - s.allocator_cache_bytes)} without the allocator's cache)"
                     if s.allocator_cache_bytes else "")
            lines.append(f"  - {s.change}: peak {format_bytes(s.peak_vram_bytes)} per GPU{cache} -> {s.pool} "
                         f"({s.gpus} x {s.gpu}){cost}")
    elif d.decision == "unschedulable":
        lines.append(_no_fix_hint(d))
    lines += [f"warning: {w}" for w in d.warnings]
    return "\n".join(lines)
