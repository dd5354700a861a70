"""Placement policies: for a template (and the pools it already ran out of memory on) an ordered list of pools.

Every policy keeps to the pools a job can run on: enough GPUs per job, and its ``gpu`` pin if it has one.
The engine starts the job on the first listed pool with enough free GPUs and no one queued; otherwise it
queues the job on the first pool (``wait_on_all``: on every listed pool, first to free wins). An empty
list after an OOM means the policy gives up and the job fails for good.

* ``vramfit``: the pools :func:`~scheduler.placement.place` ranks as fitting by the upper bound (cheapest
  predicted cost first), spilling to the next when the first is full. When no pool holds the bound it
  takes the largest GPU (what a user does after a rejection). After an OOM on pool f: pools with more memory
  than f that hold the peak with the safety margin doubled per failure (15 % -> 30 % -> 60 %), cheapest
  first; if none, the next bigger GPU type.
* ``bytes-per-param``: the rule the seed articles teach, 16 bytes/param full, 2 LoRA, 0.5 QLoRA (divided by
  the GPUs under FSDP/ZeRO-3), on the smallest GPU that holds it; OOM: next bigger GPU type.
* ``biggest``: always the GPU type with the most memory; OOM: nothing bigger, the job fails.
* ``kueue``: Kueue's flavor fungibility: flavors (pools) in the file's order, the first with free quota;
  memory-blind. OOM: the flavors with a bigger GPU, in the same order.
* ``oracle``: knows the true peak: the pools whose GPU holds it, cheapest predicted cost first; never OOMs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from predictors.predict import DEFAULT_UPPER_MARGIN
from scheduler.simulate.table import TemplateTable
from scheduler.simulate.truth import Truth

BYTES_PER_PARAM = {"full": 16.0, "lora": 2.0, "qlora": 0.5}
POLICY_NAMES: tuple[str, ...] = ("vramfit", "bytes-per-param", "biggest", "kueue", "oracle")

Pools = tuple[int, ...]


class Policy:
    """Base: caches the pool list per (template, pools failed on)."""

    name = "policy"
    wait_on_all = False

    def __init__(self, table: TemplateTable) -> None:
        self.table = table
        self._cache: dict[tuple[int, Pools], Pools] = {}
        # GPU types by memory, smallest first; ties (same memory) cheapest first
        self._by_memory = sorted(range(table.n_pools),
                                 key=lambda p: (table.memory_bytes[p], table.price_usd_per_gpu_hour[p], p))

    def candidates(self, t: int, failed: Pools = ()) -> Pools:
        key = (t, failed)
        out = self._cache.get(key)
        if out is None:
            hosts = (self.table.max_job_gpus >= self.table.gpus[t]) & self.table.allowed(t)
            raw = self.first(t) if not failed else self.retry(t, failed)
            out = self._cache[key] = tuple(p for p in raw if hosts[p])
        return out

    def first(self, t: int) -> Pools:
        raise NotImplementedError

    def retry(self, t: int, failed: Pools) -> Pools:
        """Default retry rule: the next bigger GPU type (cheapest pool of that memory size)."""
        return self._next_bigger(t, failed[-1])

    # -- helpers -------------------------------------------------------------------------------------------
    def _hosting(self, t: int, pools: list[int]) -> list[int]:
        allowed = self.table.allowed(t)
        return [p for p in pools if self.table.max_job_gpus[p] >= self.table.gpus[t] and allowed[p]]

    def _bigger(self, t: int, failed_pool: int) -> list[int]:
        memory = self.table.memory_bytes
        return self._hosting(t, [p for p in self._by_memory if memory[p] > memory[failed_pool]])

    def _next_bigger(self, t: int, failed_pool: int) -> Pools:
        bigger = self._bigger(t, failed_pool)
        return (bigger[0],) if bigger else ()

    def _largest(self, t: int) -> Pools:
        hosting = self._hosting(t, self._by_memory)
        if not hosting:
            return ()
        top = self.table.memory_bytes[hosting[-1]]
        return (min((p for p in hosting if self.table.memory_bytes[p] == top),
                    key=lambda p: self.table.price_usd_per_gpu_hour[p]),)


class VramfitPolicy(Policy):
    name = "vramfit"

    def __init__(self, table: TemplateTable, margin_fraction: float = DEFAULT_UPPER_MARGIN) -> None:
        super().__init__(table)
        self.margin_fraction = margin_fraction

    def first(self, t: int) -> Pools:
        return self.table.vramfit_ranking[t] or self._largest(t)

    def retry(self, t: int, failed: Pools) -> Pools:
        margin = self.margin_fraction * 2 ** len(failed)
        bigger = self._bigger(t, failed[-1])
        peak = self.table.peak_vram_bytes[t]
        fits = [p for p in bigger if peak[p] * (1 + margin) <= self.table.usable_bytes[p]]
        if fits:
            return tuple(self.table.predicted_cost_rank(t, fits))
        return self._next_bigger(t, failed[-1])


class BytesPerParamPolicy(Policy):
    name = "bytes-per-param"

    def estimate_bytes(self, t: int) -> float:
        table = self.table
        share = table.gpus[t] if table.sharded[t] else 1
        return float(table.params_total[t] * BYTES_PER_PARAM[table.method[t]] / share)

    def first(self, t: int) -> Pools:
        need = self.estimate_bytes(t)
        holding = [p for p in self._hosting(t, self._by_memory) if self.table.memory_bytes[p] >= need]
        return (holding[0],) if holding else self._largest(t)


class BiggestPolicy(Policy):
    name = "biggest"

    def first(self, t: int) -> Pools:
        return self._largest(t)


class KueuePolicy(Policy):
    name = "kueue"
    wait_on_all = True

    def first(self, t: int) -> Pools:
        return tuple(range(self.table.n_pools))

    def retry(self, t: int, failed: Pools) -> Pools:
        memory = self.table.memory_bytes
        return tuple(p for p in range(self.table.n_pools) if memory[p] > memory[failed[-1]])


class OraclePolicy(Policy):
    name = "oracle"

    def __init__(self, table: TemplateTable, truth: Truth) -> None:
        super().__init__(table)
        self._holds = ~truth.oom(table)

    def first(self, t: int) -> Pools:
        return tuple(self.table.predicted_cost_rank(t, [p for p in range(self.table.n_pools) if self._holds[t, p]]))

    def retry(self, t: int, failed: Pools) -> Pools:
        return ()


def make_policy(name: str, table: TemplateTable, truth: Truth) -> Policy:
    makers: dict[str, Callable[[], Policy]] = {
        "vramfit": lambda: VramfitPolicy(table),
        "bytes-per-param": lambda: BytesPerParamPolicy(table),
        "biggest": lambda: BiggestPolicy(table),
        "kueue": lambda: KueuePolicy(table),
        "oracle": lambda: OraclePolicy(table, truth),
    }
    if name not in makers:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    return makers[name]()


def first_choices(policy: Policy, n_templates: int) -> np.ndarray:
    """[t] the pool each template would go to with the cluster empty (-1: none)."""
    return np.array([(policy.candidates(t) or (-1,))[0] for t in range(n_templates)], dtype=np.int64)
