"""Placement speed: decisions per second for 8 pools on one core, and p99 latency per decision.

Run: ``python bench/placement_bench.py [--decisions N]``. Prints three figures: *distinct* (every decision a
spec the process has never seen: model, batch, sequence, method, GPUs and sharding vary), *cold* (five specs,
prediction cache emptied before every decision) and *warm* (repeated specs hit the cache). Realistic specs:
fixed and auto GPU counts, LoRA/QLoRA/full, fits and no-fits, without suggestions. Targets: >= 2,000
decisions/s and p99 <= 2 ms.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from predictors.spec import TrainingSpec
from scheduler.placement import clear_prediction_cache, place
from scheduler.pools import NodePool, PoolsConfig, default_pools

SPECS = [
    {"model": "llama-2-7b", "method": "lora", "micro_batch_size": 4, "seq_len": 2048, "train_tokens": 5e8},
    {"model": "llama-3.1-8b", "method": "full", "precision": "bf16-mixed", "gradient_checkpointing": "full",
     "gpus": "auto", "sharding": "fsdp", "train_tokens": 2e9},
    {"model": "qwen2.5-14b", "method": "qlora", "micro_batch_size": 2, "seq_len": 4096, "train_tokens": 1e8},
    {"model": "mistral-7b-v0.1", "method": "full", "precision": "bf16-true", "gpus": 4, "sharding": "zero3",
     "steps": 1000, "grad_accum_steps": 8},
    {"model": "llama-3.2-1b", "method": "full", "micro_batch_size": 8, "seq_len": 1024, "train_tokens": 1e9},
]


def eight_pools() -> PoolsConfig:
    """The 4 default pools plus a spot-priced twin of each with little free capacity: 8 pools."""
    base = list(default_pools().pools)
    twins = [NodePool.model_validate({**p.model_dump(), "name": f"{p.name}-spot", "free_gpus": 2,
                                      "price_usd_per_gpu_hour": round(p.price_usd_per_gpu_hour * 0.6, 3)})
             for p in base]
    return PoolsConfig(pools=base + twins)


def distinct_specs(n: int) -> list[TrainingSpec]:
    """``n`` different specs (a grid walked in a fixed shuffled order), each to be placed once."""
    models = ["llama-2-7b", "llama-3.1-8b", "qwen2.5-14b", "mistral-7b-v0.1", "llama-3.2-1b", "gemma-2-9b",
              "phi-3-mini-4k-instruct", "llama-3.1-70b"]
    layouts = [{"gpus": 1}, {"gpus": "auto", "sharding": "fsdp"}, {"gpus": 4, "sharding": "zero3"},
               {"gpus": 2, "sharding": "ddp"}]
    grid = [{"model": m, "method": method, "micro_batch_size": b, "seq_len": s, "train_tokens": 1e8,
             "precision": p, "gradient_checkpointing": gc, **layout}
            for m in models for method in ("full", "lora", "qlora") for b in (1, 2, 4, 8)
            for s in (512, 1024, 2048, 4096, 8192) for p in ("bf16-true", "bf16-mixed") for gc in ("none", "full")
            for layout in layouts]
    if n > len(grid):
        raise SystemExit(f"--decisions {n}: at most {len(grid)} distinct specs")
    order = np.random.default_rng(0).permutation(len(grid))
    return [TrainingSpec.model_validate(grid[i]) for i in order[:n]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=4000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    pools = eight_pools()
    specs = [TrainingSpec.model_validate(s) for s in SPECS]
    for spec in specs:  # warm the model and catalog caches, as a long-running webhook would be
        place(spec, pools, suggest=False)
    distinct = distinct_specs(args.decisions)
    print(f"pools: {len(pools.pools)}  specs: {len(specs)} (+{len(distinct)} distinct)  decisions: {args.decisions}"
          "  (one core)")
    for mode in ("distinct", "cold", "warm"):
        # cold: the prediction cache is emptied before every decision (every spec is new to the process);
        # warm: repeated specs hit the cache, as the webhook's /mutate + /validate pair and job arrays do
        latencies = np.empty(args.decisions)
        start = time.perf_counter()
        for i in range(args.decisions):
            if mode == "cold":
                clear_prediction_cache()
            spec = distinct[i] if mode == "distinct" else specs[i % len(specs)]
            t0 = time.perf_counter()
            place(spec, pools, suggest=False)
            latencies[i] = time.perf_counter() - t0
        total = time.perf_counter() - start
        print(f"{mode}: decisions/s: {args.decisions / total:,.0f}   (target >= 2,000)   "
              f"p50 {np.percentile(latencies, 50) * 1e3:.3f} ms   p99 {np.percentile(latencies, 99) * 1e3:.3f} ms"
              "   (target p99 <= 2 ms)")

if __name__ == "__main__":
    main()
