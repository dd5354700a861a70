"""Summaries of simulation results: per-policy figures, comparisons, utilisation over time, a text table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from scheduler.simulate.engine import DONE, FAILED, REJECTED, SECONDS_PER_HOUR, SimResult


def _quantile(values: np.ndarray, q: float) -> float | None:
    return float(np.quantile(values, q)) if values.size else None


def span_seconds(result: SimResult) -> float:
    """From the first arrival to the last event (the makespan)."""
    if not result.arrival_seconds.size:
        return 0.0
    last = np.nanmax(result.finish_seconds) if np.any(~np.isnan(result.finish_seconds)) else 0.0
    return float(max(last - result.arrival_seconds.min(), 0.0))


def busy_integral(result: SimResult, times_seconds: np.ndarray) -> np.ndarray:
    """[p, len(times)] GPU-seconds held on each pool from the start up to each time (OOM attempts included)."""
    out = np.zeros((len(result.pools), len(times_seconds)))
    for p in range(len(result.pools)):
        sel = result.timeline_pool == p
        t = result.timeline_seconds[sel]
        if t.size < 2:
            continue
        level = np.cumsum(result.timeline_delta_gpus[sel]).astype(float)
        # the integral of the busy-GPU step function at each event, linear in between
        integral = np.concatenate(([0.0], np.cumsum(level[:-1] * np.diff(t))))
        out[p] = np.interp(times_seconds, t, integral, left=0.0, right=integral[-1])
    return out


def busy_gpu_seconds(result: SimResult, start_seconds: float, end_seconds: float) -> np.ndarray:
    """[p] GPU-seconds held on each pool between two times."""
    at = busy_integral(result, np.array([start_seconds, end_seconds]))
    return at[:, 1] - at[:, 0]


def summarize(result: SimResult) -> dict[str, Any]:
    """The figures the issue asks for, for one policy."""
    done = result.status == DONE
    span = span_seconds(result)
    # utilisation over the arrival window (the steady state), not the drain of the last long jobs; a batch
    # submitted at one instant has no such window: then over the makespan
    first, last = (float(result.arrival_seconds.min()), float(result.arrival_seconds.max())) \
        if result.arrival_seconds.size else (0.0, 0.0)
    if last <= first:
        last = first + span
    window = last - first
    busy = busy_gpu_seconds(result, first, last)
    turnaround = (result.finish_seconds - result.arrival_seconds)[done]
    waits = result.wait_seconds[done]
    util = {name: (float(busy[p] / (result.total_gpus[p] * window)) if window > 0 else 0.0)
            for p, name in enumerate(result.pools)}
    return {
        "policy": result.policy,
        "jobs": int(result.status.size),
        "completed": int(done.sum()),
        "failed_after_oom": int((result.status == FAILED).sum()),
        "rejected": int((result.status == REJECTED).sum()),
        "cost_usd": float(result.cost_usd.sum()),
        "gpu_hours": float(result.gpu_seconds.sum() / SECONDS_PER_HOUR),
        "oom_failures": int(result.oom_count.sum()),
        "jobs_with_oom": int((result.oom_count > 0).sum()),
        "wasted_gpu_hours": float(result.wasted_gpu_seconds.sum() / SECONDS_PER_HOUR),
        "wasted_cost_usd": float(result.wasted_cost_usd.sum()),
        "wait_seconds": {"median": _quantile(waits, 0.5), "p95": _quantile(waits, 0.95),
                         "mean": float(waits.mean()) if waits.size else None},
        "turnaround_seconds": {"median": _quantile(turnaround, 0.5), "p95": _quantile(turnaround, 0.95)},
        "makespan_seconds": span,
        "utilisation_by_pool": util,  # busy GPU fraction between the first and the last arrival
        "utilisation_window_seconds": window,  # that window (the makespan when all jobs arrive at once)
        "jobs_by_pool": {name: int(((result.pool == p) & done).sum()) for p, name in enumerate(result.pools)},
    }


def compare(summaries: Sequence[dict[str, Any]], reference: str = "vramfit") -> dict[str, Any]:
    """Cost of ``reference`` against every other policy: ratio and saving."""
    by_name = {s["policy"]: s for s in summaries}
    if reference not in by_name:
        return {}
    ref = by_name[reference]["cost_usd"]
    out: dict[str, Any] = {}
    for name, s in by_name.items():
        if name == reference or s["cost_usd"] <= 0:
            continue
        out[name] = {"cost_ratio": ref / s["cost_usd"], "saving_usd": s["cost_usd"] - ref,
                     "saving_fraction": 1.0 - ref / s["cost_usd"]}
    return out


def utilisation_over_time(result: SimResult, bins: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Bin edges in seconds and [p, bins] the mean fraction of each pool's GPUs held in each bin."""
    start = float(result.arrival_seconds.min()) if result.arrival_seconds.size else 0.0
    end = start + max(span_seconds(result), 1.0)
    edges = np.linspace(start, end, bins + 1)
    out = np.diff(busy_integral(result, edges), axis=1) / (np.diff(edges)[None, :] * result.total_gpus[:, None])
    return edges, out


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:,.2f} h"


def render_table(summaries: Sequence[dict[str, Any]]) -> str:
    """One line per policy, then vramfit's cost against each of the others."""
    head = (f"{'policy':16s} {'cost':>14s} {'GPU-h':>11s} {'OOMs':>6s} {'wasted GPU-h':>13s} {'failed':>6s} "
            f"{'wait p50':>10s} {'wait p95':>10s} {'JCT p50':>10s} {'makespan':>11s}  utilisation by pool")
    lines = [head]
    for s in summaries:
        util = " ".join(f"{k} {v:.0%}" for k, v in s["utilisation_by_pool"].items())
        lines.append(
            f"{s['policy']:16s} {'$' + format(s['cost_usd'], ',.0f'):>14s} {s['gpu_hours']:>11,.0f} "
            f"{s['oom_failures']:>6d} {s['wasted_gpu_hours']:>13,.1f} {s['failed_after_oom'] + s['rejected']:>6d} "
            f"{_hours(s['wait_seconds']['median']):>10s} {_hours(s['wait_seconds']['p95']):>10s} "
            f"{_hours(s['turnaround_seconds']['median']):>10s} {_hours(s['makespan_seconds']):>11s}  {util}")
    rel = compare(summaries)
    if rel:
        lines.append("vramfit cost vs " + ", ".join(f"{k}: {v['cost_ratio']:.3f}x ({v['saving_fraction']:+.1%} saved)"
                                                   for k, v in rel.items()))
    return "\n".join(lines)
