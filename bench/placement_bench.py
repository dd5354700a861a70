"""Placement speed: decisions per second for 8 pools on one core, and p99 latency per decision.

Run: ``python bench/placement_bench.py [--decisions N]``. Two figures:

* cold: every decision places a spec the process has not seen before (a grid of distinct specs varying the
  model, method, micro-batch, sequence length, GPU count and sharding, each placed once after the
  prediction cache is emptied), so no memoised prediction flatters it. Only the per-model caches (the
  resolved architecture, the catalog), filled once for each model, are warm, as in a long-running webhook.
* warm: a few realistic specs placed over and over (repeated specs hit the prediction cache, as the
  webhook's /mutate + /validate pair and job arrays do).

Fits and no-fits (without suggestions), fixed and auto GPU counts, LoRA/QLoRA/full. Targets: >= 2,000
decisions/s and p99 <= 2 ms, cold.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import time
from typing import Any

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

MODELS = ("llama-3.2-1b", "qwen2.5-1.5b", "gemma-2-2b", "phi-2", "llama-2-7b", "mistral-7b-v0.1",
          "llama-3.1-8b", "qwen2.5-14b", "gemma-2-27b", "llama-3.1-70b")
METHODS = ("full", "lora", "qlora")
MICRO_BATCHES = (1, 2, 4, 8)
SEQ_LENS = (512, 1024, 2048, 4096)
GPU_SETTINGS: tuple[dict[str, Any], ...] = (
    {"gpus": 1},
    {"gpus": 2, "sharding": "ddp"},
    {"gpus": 4, "sharding": "zero3"},
    {"gpus": "auto", "sharding": "fsdp"},
    {"gpus": "auto", "sharding": "ddp"},
)
CHECKPOINTING = ("none", "full")


def distinct_specs(n: int, seed: int = 0) -> list[TrainingSpec]:
    """Up to ``n`` distinct specs from the grid above, in a shuffled (reproducible) order."""
    grid = list(itertools.product(MODELS, METHODS, MICRO_BATCHES, SEQ_LENS, GPU_SETTINGS, CHECKPOINTING))
    random.Random(seed).shuffle(grid)
    specs = []
    for i, (model, method, micro, seq, gpus, ckpt) in enumerate(grid[:n]):
        work = {"train_tokens": 5e8} if i % 2 else {"steps": 2000}
        specs.append(TrainingSpec.model_validate({
            "model": model, "method": method, "micro_batch_size": micro, "seq_len": seq,
            "gradient_checkpointing": ckpt, "precision": "bf16-mixed", **gpus, **work}))
    return specs


def eight_pools() -> PoolsConfig:
    """The 4 default pools plus a spot-priced twin of each with little free capacity: 8 pools."""
    base = list(default_pools().pools)
    twins = [NodePool.model_validate({**p.model_dump(), "name": f"{p.name}-spot", "free_gpus": 2,
                                      "price_usd_per_gpu_hour": round(p.price_usd_per_gpu_hour * 0.6, 3)})
             for p in base]
    return PoolsConfig(pools=base + twins)


def run(specs: list[TrainingSpec], pools: PoolsConfig, decisions: int) -> tuple[float, np.ndarray]:
    """Place ``specs`` in turn ``decisions`` times: decisions per second and each decision's latency."""
    latencies = np.empty(decisions)
    start = time.perf_counter()
    for i in range(decisions):
        t0 = time.perf_counter()
        place(specs[i % len(specs)], pools, suggest=False)
        latencies[i] = time.perf_counter() - t0
    return decisions / (time.perf_counter() - start), latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=4000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    pools = eight_pools()
    cold_specs = distinct_specs(args.decisions)
    warm_specs = [TrainingSpec.model_validate(s) for s in SPECS]
    for model in MODELS:  # fill the per-model caches once, as a long-running webhook has
        place(TrainingSpec.model_validate({"model": model, "method": "lora"}), pools, suggest=False)
    for spec in warm_specs:
        place(spec, pools, suggest=False)
    clear_prediction_cache()
    print(f"pools: {len(pools.pools)}  decisions: {args.decisions}  (one core)")
    runs = {"cold": (cold_specs, len(cold_specs)), "warm": (warm_specs, args.decisions)}
    for mode, (specs, decisions) in runs.items():
        rate, latencies = run(specs, pools, decisions)
        distinct = len({s.model_dump_json() for s in specs})
        print(f"{mode}: {distinct} distinct specs  decisions/s: {rate:,.0f}   (target >= 2,000)   "
              f"p50 {np.percentile(latencies, 50) * 1e3:.3f} ms   p99 {np.percentile(latencies, 99) * 1e3:.3f} ms"
              "   (target p99 <= 2 ms)")


if __name__ == "__main__":
    main()
