"""Per-template, per-pool predictions, computed once so that the event loop only looks numbers up.

For every template and pool: the analytic device peak and its upper bound (``predict``), the predicted
seconds per training token (runtime is linear in tokens), and vramfit's ranking of the pools from the real
:func:`scheduler.placement.place` (cheapest fitting pool first, capacity ignored: the engine checks free
GPUs at event time), and the pools a job's ``gpu`` pin allows (every policy keeps to them). A few hundred
templates x 4 pools take about a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from predictors.hardware import lookup_gpu
from predictors.predict import predict
from scheduler.placement import DEFAULT_HEADROOM_FRACTION, place, precision_stated, resolve_model_cached
from scheduler.pools import NodePool, PoolsConfig
from scheduler.simulate.jobs import JobTemplate

_SHARDED = ("fsdp", "zero3")


@dataclass(frozen=True)
class TemplateTable:
    """Predictions as arrays: index ``[t]`` per template, ``[p]`` per pool, ``[t, p]`` per both."""

    pools: tuple[NodePool, ...]
    headroom_fraction: float
    memory_bytes: np.ndarray  # [p] the GPU's total memory
    usable_bytes: np.ndarray  # [p] memory minus the headroom
    price_usd_per_gpu_hour: np.ndarray  # [p]
    total_gpus: np.ndarray  # [p]
    max_job_gpus: np.ndarray  # [p] largest job the pool accepts
    gpus: np.ndarray  # [t]
    params_total: np.ndarray  # [t]
    method: tuple[str, ...]  # [t]
    sharded: np.ndarray  # [t] bool: fsdp/zero3 divide the model states over the GPUs
    peak_vram_bytes: np.ndarray  # [t, p] analytic device peak (what nvidia-smi would show)
    peak_vram_upper_bytes: np.ndarray  # [t, p] the bound placement uses
    seconds_per_token: np.ndarray  # [t, p] predicted
    vramfit_ranking: tuple[tuple[int, ...], ...]  # [t] pools place() ranks as fitting, best first
    pinned_to: np.ndarray | None = None  # [t, p] bool: pools the job may run on (its ``gpu`` pin); None: all

    def allowed(self, t: int) -> np.ndarray:
        """[p] pools template ``t`` may run on: its GPU pin binds every policy, not only vramfit's place()."""
        if self.pinned_to is None:
            return np.ones(self.n_pools, dtype=bool)
        return self.pinned_to[t]

    @property
    def n_templates(self) -> int:
        return len(self.gpus)

    @property
    def n_pools(self) -> int:
        return len(self.pools)

    def pool_index(self, name: str) -> int:
        return next(i for i, p in enumerate(self.pools) if p.name == name)

    def predicted_cost_rank(self, t: int, candidates: Sequence[int]) -> list[int]:
        """``candidates`` sorted by predicted cost of template ``t`` (GPU-hours x price), cheapest first."""
        cost = self.seconds_per_token[t] * self.price_usd_per_gpu_hour
        return sorted(candidates, key=lambda p: (cost[p], p))


def build_table(templates: Sequence[JobTemplate], pools: PoolsConfig) -> TemplateTable:
    pool_list = tuple(pools.pools)
    headroom = pools.headroom_fraction if pools.headroom_fraction is not None else DEFAULT_HEADROOM_FRACTION
    n_t, n_p = len(templates), len(pool_list)
    peak = np.zeros((n_t, n_p))
    upper = np.zeros((n_t, n_p))
    spt = np.zeros((n_t, n_p))
    params = np.zeros(n_t)
    ranking: list[tuple[int, ...]] = []
    pinned = np.ones((n_t, n_p), dtype=bool)
    index = {p.name: i for i, p in enumerate(pool_list)}
    for t, template in enumerate(templates):
        spec = template.spec
        model = resolve_model_cached(spec)
        if spec.gpu is not None:  # the same test as place()'s
            pin = lookup_gpu(spec.gpu).name
            pinned[t] = [pool.gpu == pin for pool in pool_list]
        if precision_stated(spec):  # a stated bf16 cannot run on a GPU without it (V100, T4), for any policy
            pinned[t] &= [pool.gpu_spec.runs(spec.precision) for pool in pool_list]
        for p, pool in enumerate(pool_list):
            pred = predict(spec, gpu_name=pool.gpu, gpus=template.gpus, model=model, interconnect=pool.links)
            peak[t, p] = pred.vram.peak_vram_bytes
            upper[t, p] = pred.peak_vram_upper_bytes
            tps = pred.throughput_tokens_per_second or 0.0
            spt[t, p] = 1.0 / tps if tps > 0 else np.inf
            params[t] = pred.vram.params_total
        decision = place(spec, pool_list, headroom_fraction=headroom, model=model, suggest=False)
        ranking.append(tuple(index[o.pool.name] for o in decision.alternatives if o.rank is not None))
    return TemplateTable(
        pools=pool_list, headroom_fraction=headroom,
        memory_bytes=np.array([p.gpu_spec.memory_bytes for p in pool_list], dtype=float),
        usable_bytes=np.array([p.usable_bytes(headroom) for p in pool_list], dtype=float),
        price_usd_per_gpu_hour=np.array([p.price_usd_per_gpu_hour for p in pool_list]),
        total_gpus=np.array([p.total_gpus for p in pool_list], dtype=np.int64),
        max_job_gpus=np.array([p.max_job_gpus for p in pool_list], dtype=np.int64),
        gpus=np.array([t.gpus for t in templates], dtype=np.int64), params_total=params,
        method=tuple(t.spec.method for t in templates),
        sharded=np.array([(t.spec.sharding or "") in _SHARDED for t in templates]),
        peak_vram_bytes=peak, peak_vram_upper_bytes=upper, seconds_per_token=spt,
        vramfit_ranking=tuple(ranking), pinned_to=pinned,
    )
