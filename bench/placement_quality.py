"""Placement quality on the dev reference runs that have a measured peak.

For each run (its GPU unpinned, its GPU count kept, 1e8 train tokens when it states none) place it on the
default pools (nodes raised so every job size can be hosted) with the cheapest objective, and compare with
the oracle: the cheapest default pool whose GPU really holds the measured peak (same runtime model).
Prints the violations (measured peak above the chosen GPU's memory; target 0) and the cost ratio to the
oracle (target <= 1.10). Run: ``python bench/placement_quality.py [RUNS.jsonl]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from predictors.predict import predict
from predictors.reference import parse_runs
from scheduler.cost import job_cost_usd
from scheduler.placement import place, resolve_model_cached
from scheduler.pools import NodePool, default_pools

# ../shared beside the checkout
DEFAULT_RUNS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "runs-dev.jsonl"


def _pools_for(gpus: int) -> list[NodePool]:
    return [NodePool.model_validate({**p.model_dump(), "nodes": max(p.nodes, -(-gpus // p.gpus_per_node))})
            for p in default_pools().pools]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("runs", nargs="?", type=Path, default=DEFAULT_RUNS,
                        help="reference runs JSONL (default: the dev runs in ../shared/reference)")
    path = parser.parse_args().runs
    if not path.is_file():
        parser.error(f"{path}: no such file")
    runs = [r for r in parse_runs(path.read_text(encoding="utf-8"), str(path))
            if r.measured.peak_bytes is not None and not r.measured.oom]
    violations: list[str] = []
    ratios: list[float] = []
    no_oracle = unplaced = 0
    for run in runs:
        gpus = run.spec.gpus if isinstance(run.spec.gpus, int) else 1
        measured = run.measured.peak_bytes or 0
        if run.measured.scope == "total_all_gpus":
            measured //= gpus
        update: dict[str, object] = {"gpu": None}
        if run.spec.train_tokens is None and run.spec.steps is None:
            update["train_tokens"] = 1e8
        spec = run.spec.model_copy(update=update)
        pools = _pools_for(gpus)
        model = resolve_model_cached(spec)
        costs = {}
        for pool in pools:
            if pool.gpu_spec.memory_bytes >= measured:
                runtime = predict(spec, pool.gpu, gpus, model=model, interconnect=pool.links).runtime_seconds or 0.0
                costs[pool.name] = job_cost_usd(gpus, runtime, pool.price_usd_per_gpu_hour)
        decision = place(spec, pools, model=model, suggest=False)
        if not costs:
            no_oracle += 1
            continue
        chosen = decision.chosen
        if chosen is None or chosen.cost_usd is None:
            unplaced += 1
            continue
        if measured > chosen.pool.gpu_spec.memory_bytes:
            violations.append(f"{run.id} on {chosen.pool.gpu}")
        ratios.append(chosen.cost_usd / min(costs.values()))
    arr = np.array(ratios)
    print(f"runs with a measured peak: {len(runs)}  placed and compared: {arr.size}  "
          f"unschedulable although some pool holds the measured peak: {unplaced}  no pool holds it: {no_oracle}")
    print(f"violations (measured peak > chosen GPU memory): {len(violations)}   (target 0)"
          + (f"  {', '.join(violations)}" if violations else ""))
    print(f"cost vs oracle: mean {arr.mean():.3f}x  median {np.median(arr):.3f}x  p90 {np.percentile(arr, 90):.3f}x  "
          f"max {arr.max():.3f}x   (target mean <= 1.10x)")


if __name__ == "__main__":
    main()
