"""Placement: for every pool decide fit, GPU count, runtime and cost; rank by an objective; choose.

Pure. A :class:`Decision` is either ``placed`` (a choice with every pool ranked or rejected) or
``unschedulable`` (one reason per pool and what-if suggestions, each re-predicted and re-placed).

Fit: the predicted upper bound ``peak_vram_upper_bytes`` must not exceed the GPU's memory minus the
headroom (equal fits). GPU count: the spec's ``gpus``, or with ``gpus: auto`` the smallest of 1, 2, 4, ...
(up to a node), a whole node and then whole nodes that fits, each a multiple of the model-parallel size
(:func:`auto_gpu_counts`); with ``cheapest-within-deadline`` also meets the deadline. Without ``train_tokens``
or ``steps`` there is no runtime: pools rank by hourly cost, and a deadline is reported as not checked.
Cost: GPUs x hours x price (:mod:`scheduler.cost`). Capacity: a pool whose ``free_gpus`` is below the
count is passed over for the best pool with room, and the decision says so.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from predictors.catalog import ResolvedModel, resolve_model
from predictors.hardware import lookup_gpu
from predictors.predict import Prediction, SpecPredictor, reclaimable_bytes, reliefs_needed
from predictors.runtime import Interconnect
from predictors.spec import PARAM_OFFLOAD_SHARDING, TrainingSpec
from predictors.units import format_bytes
from scheduler.cost import hourly_cost_usd, job_cost_usd
from scheduler.pools import NodePool, PoolsConfig, usable_memory_bytes

Objective = Literal["cheapest", "fastest", "cheapest-within-deadline"]
OBJECTIVES: tuple[str, ...] = ("cheapest", "fastest", "cheapest-within-deadline")
DEFAULT_HEADROOM_FRACTION = 0.05
PINNED_ELSEWHERE = "spec pins gpu"  # the reason of a pool whose GPU is not the one the spec pins
# Sharding modes under which more GPUs do not shrink the per-GPU model states.
_REPLICATED = ("none", "ddp")


@dataclass(frozen=True)
class PoolOption:
    """What one pool would do with the job."""

    pool: NodePool
    fits: bool
    reason: str
    usable_bytes: int
    gpus: int | None = None
    nodes: int | None = None
    peak_vram_bytes: int | None = None
    peak_vram_upper_bytes: int | None = None
    runtime_seconds: float | None = None
    # the runtime residual's calibrated upper bound (None without one); deadlines are checked against it
    runtime_upper_seconds: float | None = None
    throughput_tokens_per_second: float | None = None
    cost_usd: float | None = None
    hourly_cost_usd: float | None = None
    has_room: bool = True
    meets_deadline: bool | None = None
    rank: int | None = None
    # of peak_vram_bytes, the allocator's cache of variable-length blocks (freed before an allocation fails)
    allocator_cache_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool.name,
            "gpu": self.pool.gpu,
            "fits": self.fits,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "predicted_runtime_seconds": self.runtime_seconds,
            "predicted_runtime_upper_seconds": self.runtime_upper_seconds,
            "predicted_cost_usd": self.cost_usd,
            "reason": self.reason,
            "rank": self.rank,
            "peak_vram_upper_bytes": self.peak_vram_upper_bytes,
            "allocator_cache_bytes": self.allocator_cache_bytes,
            "usable_bytes": self.usable_bytes,
            "hourly_cost_usd": self.hourly_cost_usd,
            "free_gpus": self.pool.free_gpus,
            "has_room": self.has_room,
            # None without a deadline (or without a runtime); False: fits in memory but misses the deadline
            "meets_deadline": self.meets_deadline,
        }


@dataclass(frozen=True)
class Suggestion:
    """A change to the spec that makes it fit, with the re-predicted peak and the placement it gets."""

    change: str
    spec_update: dict[str, Any]
    peak_vram_bytes: int
    peak_vram_upper_bytes: int
    pool: str
    gpu: str
    gpus: int
    predicted_runtime_seconds: float | None
    predicted_cost_usd: float | None
    # of peak_vram_bytes, the allocator's cache of variable-length blocks (freed before an allocation fails)
    allocator_cache_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "peak_vram_bytes": self.peak_vram_bytes,
            "allocator_cache_bytes": self.allocator_cache_bytes,
            "pool": self.pool,
            "predicted_cost_usd": self.predicted_cost_usd,
            "peak_vram_upper_bytes": self.peak_vram_upper_bytes,
            "gpu": self.gpu,
            "gpus": self.gpus,
            "predicted_runtime_seconds": self.predicted_runtime_seconds,
            "spec_update": dict(self.spec_update),
        }


@dataclass(frozen=True)
class Decision:
    decision: Literal["placed", "unschedulable"]
    objective: str
    chosen: PoolOption | None
    alternatives: tuple[PoolOption, ...]
    suggestions: tuple[Suggestion, ...] = ()
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION
    waits_for_capacity: bool = False
    chosen_prediction: Prediction | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        c = self.chosen
        return {
            "decision": self.decision,
            "objective": self.objective,
            "pool": c.pool.name if c else None,
            "gpu": c.pool.gpu if c else None,
            "gpus": c.gpus if c else None,
            "nodes": c.nodes if c else None,
            "peak_vram_bytes": c.peak_vram_bytes if c else None,
            "peak_vram_upper_bytes": c.peak_vram_upper_bytes if c else None,
            "predicted_runtime_seconds": c.runtime_seconds if c else None,
            "predicted_runtime_upper_seconds": c.runtime_upper_seconds if c else None,
            "predicted_cost_usd": c.cost_usd if c else None,
            "throughput_tokens_per_second": c.throughput_tokens_per_second if c else None,
            "waits_for_capacity": self.waits_for_capacity,
            "headroom_fraction": self.headroom_fraction,
            "node_selector": dict(c.pool.node_selector) if c else {},
            "tolerations": [t.model_dump(exclude_none=True) for t in c.pool.tolerations] if c else [],
            "alternatives": [o.to_dict() for o in self.alternatives],
            "suggestions": [s.to_dict() for s in self.suggestions],
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
        }


# ---- model resolution is the expensive part of a prediction: cache it per model reference ----------
_MODEL_CACHE: dict[tuple[str, str, str], ResolvedModel] = {}


class ObjectiveError(ValueError):
    """An objective or deadline :func:`place` cannot work with (the caller's arguments, not the spec)."""


def _ref_key(ref: Any) -> str:
    return "" if ref is None else ref if isinstance(ref, str) else ref.model_dump_json()


def resolve_model_cached(spec: TrainingSpec, base_dir: Path | None = None) -> ResolvedModel:
    """:func:`resolve_model`, memoised on everything it reads: the model, the teacher and the critic (a ResolvedModel
    carries their architectures) and the folder relative paths start from."""
    key = (_ref_key(spec.model), _ref_key(spec.teacher_model), _ref_key(spec.critic_model), str(base_dir or ""))
    model = _MODEL_CACHE.get(key)
    if model is None:
        if len(_MODEL_CACHE) > 256:
            _MODEL_CACHE.clear()
        model = _MODEL_CACHE[key] = resolve_model(spec, base_dir)
    return model


def format_duration(seconds: float | None) -> str:
    """A runtime for people: hours from one hour, minutes below that, seconds below a minute (so a short run
    never reads as ``0.0 h``); ``-`` when unknown. The one duration format of placement's reasons and the CLI
    tables."""
    if seconds is None:
        return "-"
    if seconds < 0.05:
        return "< 0.1 s"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        minutes = seconds / 60
        return f"{minutes:.1f} min" if minutes < 10 else f"{minutes:.0f} min"
    return f"{seconds / 3600:,.1f} h"


@lru_cache(maxsize=1024)
def auto_gpu_counts(gpus_per_node: int, nodes: int, max_job_gpus: int, model_parallel: int = 1) -> tuple[int, ...]:
    """The GPU counts ``gpus: auto`` tries on a pool, smallest first.

    Every count is a multiple of the model-parallel size ``m`` (tensor x pipeline x context parallel). When ``m``
    fits in a node: ``m`` x 1, 2, 4, ... inside one node, then the node's share (the largest multiple of ``m`` a
    node holds: the whole node when ``m`` divides it), then 2, 3, ... times that share, up to the pool's nodes
    (``nodes`` in a decision is the fewest nodes that hold the count). When ``m`` is larger
    than a node: whole nodes whose GPU count is a multiple of ``m``. Never above ``max_job_gpus`` (a job limit
    below a node adds its own largest multiple of ``m``).

    Past :data:`LINEAR_MULTIPLES` multiples of the node's share the multiples grow by an eighth each step
    (72, 81, 91, ... then the largest), so a pool of 200,000 nodes gives about a hundred counts, not 200,000:
    a job that fits nowhere is refused in a fraction of a second. Pools of up to 64 nodes are walked node by
    node, as before.
    """
    m = model_parallel
    if m <= gpus_per_node:
        one_node = min(gpus_per_node, max_job_gpus)
        share = one_node - one_node % m
        if share == 0:
            return ()
        counts: list[int] = []
        n = m
        while n < share:
            counts.append(n)
            n *= 2
        counts.append(share)
        if share == gpus_per_node - gpus_per_node % m:  # a whole node's share: more nodes may follow
            counts += [share * k for k in _multiples(2, min(nodes, max_job_gpus // share))]
        return tuple(counts)
    # k whole nodes hold a multiple of m exactly when k is a multiple of m / gcd(m, gpus_per_node)
    unit = gpus_per_node * (m // math.gcd(m, gpus_per_node))
    return tuple(unit * k for k in _multiples(1, min(nodes, max_job_gpus // gpus_per_node) // (unit // gpus_per_node)))


# Multiples of a node's share tried one by one; above this they grow geometrically (see auto_gpu_counts)
LINEAR_MULTIPLES = 64


def _multiples(first: int, last: int) -> list[int]:
    """``first``, ``first + 1``, ... up to :data:`LINEAR_MULTIPLES`, then steps of an eighth, ending on ``last``."""
    out: list[int] = []
    k = first
    while k < last:
        out.append(k)
        k += 1 if k < LINEAR_MULTIPLES else k // 8
    if last >= first:
        out.append(last)
    return out


PodShapes = tuple[tuple[int, int], ...]  # (GPUs per pod, pods) of each GPU role of a manifest


def nodes_for_pods(pod_shapes: PodShapes, gpus_per_node: int) -> int | None:
    """The nodes of ``gpus_per_node`` GPUs that hold the pods (a pod's GPUs come from one node), packed largest
    first into the free room of the nodes already used (first-fit decreasing, by groups of equal room); None when
    a pod is larger than a node."""
    if any(size > gpus_per_node for size, count in pod_shapes if count):
        return None
    room: dict[int, int] = {}  # free GPUs -> nodes with that much free
    nodes = 0
    for size, count in sorted(pod_shapes, reverse=True):
        left = count
        for free in sorted(room, reverse=True):
            if left <= 0 or free < size:
                continue
            per_node = free // size
            fill = min(room[free], -(-left // per_node))
            placed = min(left, fill * per_node)
            room[free] -= fill
            # the last node filled may take fewer pods than it could; all others take per_node
            full_rest = free - per_node * size
            last_rest = free - (placed - (fill - 1) * per_node) * size
            if fill > 1:
                room[full_rest] = room.get(full_rest, 0) + fill - 1
            room[last_rest] = room.get(last_rest, 0) + 1
            left -= placed
        if left > 0:
            per_node = gpus_per_node // size
            new = -(-left // per_node)
            nodes += new
            full_rest = gpus_per_node - per_node * size
            last_rest = gpus_per_node - (left - (new - 1) * per_node) * size
            if new > 1:
                room[full_rest] = room.get(full_rest, 0) + new - 1
            room[last_rest] = room.get(last_rest, 0) + 1
        room = {free: n for free, n in room.items() if n > 0 and free > 0}
    return nodes


def _pods_unpackable(pod_shapes: PodShapes, pool: NodePool) -> str:
    """Why the pool's nodes cannot hold the manifest's pods, or ''."""
    biggest = max(size for size, _ in pod_shapes)
    needed = nodes_for_pods(pod_shapes, pool.gpus_per_node)
    if needed is None:
        return f"each pod requests up to {biggest} GPUs; nodes have {pool.gpus_per_node}"
    if needed > pool.nodes:
        pods = sum(count for _, count in pod_shapes)
        sizes = "/".join(str(size) for size, _ in sorted(set(pod_shapes), reverse=True))
        return (f"its {pods} pods ({sizes} GPUs each) need {needed} nodes of {pool.gpus_per_node} GPUs; pool has "
                f"{pool.nodes}")
    return ""


def pod_shape(gpus: int, gpus_per_node: int, model_parallel: int = 1) -> tuple[int, int]:
    """(pods, GPUs per pod) that run ``gpus`` GPUs on nodes of ``gpus_per_node``, one pod per node: the counts of
    :func:`auto_gpu_counts` give each node the largest multiple of the model-parallel size it holds (tensor 2 x
    pipeline 3 on 8-GPU nodes: 18 GPUs are 3 pods of 6, not 24 GPUs in 3 pods of 8)."""
    if gpus <= gpus_per_node:
        return 1, gpus
    m = model_parallel
    share = gpus_per_node - gpus_per_node % m if m <= gpus_per_node else gpus_per_node
    if share and gpus % share == 0:
        return gpus // share, share
    return -(-gpus // gpus_per_node), gpus_per_node


@dataclass(frozen=True)
class _PoolFacts:
    """What placement asks of a pool in every decision, worked out once per pool object."""

    memory_bytes: int
    links: Interconnect
    max_job_gpus: int
    auto_counts: tuple[int, ...]  # the counts ``gpus: auto`` tries, smallest first, without model parallelism


# by identity: a NodePool is frozen, and an edited copy (model_copy) is another object with its own entry
_POOL_FACTS: dict[int, tuple[NodePool, _PoolFacts]] = {}


def _pool_facts(pool: NodePool) -> _PoolFacts:
    hit = _POOL_FACTS.get(id(pool))
    if hit is not None and hit[0] is pool:
        return hit[1]
    limit = pool.max_job_gpus
    facts = _PoolFacts(pool.gpu_spec.memory_bytes, pool.links, limit,
                       auto_gpu_counts(pool.gpus_per_node, pool.nodes, limit))
    if len(_POOL_FACTS) > 4096:
        _POOL_FACTS.clear()
    _POOL_FACTS[id(pool)] = (pool, facts)
    return facts


def precision_stated(spec: TrainingSpec) -> bool:
    """Whether the job states its precision (a source set it), rather than taking the TrainingSpec default: a
    plain script without --bf16/--fp16 runs in fp32, so a defaulted bf16 must not rule out a V100."""
    return "precision" in spec.model_fields_set


def candidate_gpu_counts(spec: TrainingSpec, pool: NodePool, keep_growing: bool = False) -> list[int]:
    """GPU counts to try on ``pool``, smallest first."""
    facts = _pool_facts(pool)
    if isinstance(spec.gpus, int):
        return [spec.gpus] if spec.gpus <= facts.max_job_gpus else []
    model_parallel = spec.model_parallel()
    counts = list(facts.auto_counts if model_parallel == 1
                  else auto_gpu_counts(pool.gpus_per_node, pool.nodes, facts.max_job_gpus, model_parallel))
    shrinks = (spec.sharding or "ddp") not in _REPLICATED
    if not shrinks and not keep_growing:
        counts = counts[:1]
    if spec.shard_group_size:
        # hybrid sharding: whole groups only once the job is wider than one group
        group = spec.shard_group_size * model_parallel
        counts = [n for n in counts if n <= group or n % group == 0]
    if spec.secondary_shard_size:
        # ZeRO++ hpZ: the secondary groups split the data-parallel ranks evenly (or one group holds them all)
        size = spec.secondary_shard_size
        counts = [n for n in counts if n // model_parallel <= size or (n // model_parallel) % size == 0]
    return counts


# Predictions are pure functions of (spec, GPU type, count, links), so they are memoised across decisions:
# the webhook reviews every object twice (/mutate, then /validate), re-reviews patched objects, and job
# arrays repeat one spec. One SpecPredictor per spec (it memoises that spec's predictions); bounded, least
# recently used spec first out.
_CACHE_SIZE = 1024
_cache: OrderedDict[tuple[str, str], SpecPredictor] = OrderedDict()
_cache_lock = threading.Lock()


def clear_prediction_cache() -> None:
    """Forget memoised predictions (after the residual model or the catalogs change, and in benchmarks)."""
    with _cache_lock:
        _cache.clear()


def spec_predictor(spec: TrainingSpec, model: ResolvedModel) -> SpecPredictor:
    """The memoised :class:`SpecPredictor` of ``spec`` with ``model`` (a new one for a spec not seen lately)."""
    key = (spec.model_dump_json(), model.source)  # once per decision: a spec is a mutable pydantic model
    with _cache_lock:
        predictor = _cache.get(key)
        if predictor is not None:
            _cache.move_to_end(key)
            return predictor
        predictor = _cache[key] = SpecPredictor(spec, model)
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return predictor


def _evaluate_all(spec: TrainingSpec, pools: list[NodePool], headroom: float, deadline_seconds: float | None,
                  predictor: SpecPredictor, pod_shapes: PodShapes | None = None
                  ) -> list[tuple[PoolOption, Prediction | None]]:
    """What every pool does with the job (its option, and the prediction behind a fit).

    Each pool tries its candidate GPU counts smallest first and takes the first whose memory upper bound fits
    (and, with a deadline, whose runtime bound meets it). Two stages, each batched over the pools: the memory of
    the candidates first (per pool, the first count whose analytic floor does not already rule it out; again for
    the pools whose candidate did not fit), then the runtime of the fitting counts only; with a deadline, a pool
    whose fit is too slow moves on to its next fitting count in another round.
    """
    done: dict[int, tuple[PoolOption, Prediction | None]] = {}
    usable: dict[int, int] = {}
    counts: dict[int, list[int]] = {}
    links: dict[int, Interconnect] = {}
    for i, pool in enumerate(pools):
        facts = _pool_facts(pool)
        usable[i] = usable_memory_bytes(facts.memory_bytes, headroom)
        links[i] = facts.links
        if spec.gpu is not None and lookup_gpu(spec.gpu).name != pool.gpu:
            done[i] = PoolOption(pool, False, f"{PINNED_ELSEWHERE} {spec.gpu}; pool has {pool.gpu}", usable[i]), None
            continue
        if not pool.gpu_spec.runs(spec.precision) and precision_stated(spec):
            done[i] = PoolOption(pool, False, f"{pool.gpu} has no bf16 (its tensor cores take fp16): "
                                 f"{spec.precision} cannot run there; use {spec.precision.replace('bf16', '16')}",
                                 usable[i]), None
            continue
        unpackable = _pods_unpackable(pod_shapes, pool) if pod_shapes else ""
        if unpackable:  # a pod's GPUs come from one node: a pod no node can take stays Pending for ever
            done[i] = PoolOption(pool, False, unpackable, usable[i]), None
            continue
        counts[i] = candidate_gpu_counts(spec, pool, keep_growing=deadline_seconds is not None)
        if not counts[i]:
            if isinstance(spec.gpus, int):
                wanted = f"needs {spec.gpus} GPUs"
            else:  # only model parallelism leaves `auto` without a count: no multiple of it fits the pool
                m = spec.model_parallel()
                wanted = (f"needs a multiple of {m} GPUs (tensor x pipeline x context parallel)"
                          + (f" on whole nodes of {pool.gpus_per_node}" if m > pool.gpus_per_node else ""))
            done[i] = PoolOption(pool, False, f"{wanted}; pool allows at most {pool.max_job_gpus} per job",
                                 usable[i]), None
    position = dict.fromkeys(counts, 0)  # the count each pool tries next
    slow: dict[int, tuple[PoolOption, PoolOption]] = {}  # the first and the last fit that missed the deadline
    skipped: dict[int, list[int]] = {}  # counts passed over by the deadline floor, per pool
    pending = list(counts)
    while pending:
        # stage 1: move each pool to its next count whose memory fits (or past its last count). A count whose
        # bound is surely too big (by the analytic floor under it) is skipped without the residual's features;
        # a pool's last count is always predicted in full, for the figures of its no-fit reason.
        while True:
            wanted_memory: list[tuple[str, int]] = []
            for i in pending:
                pool, n_counts = pools[i], counts[i]
                while position[i] < len(n_counts):
                    n = n_counts[position[i]]
                    if i in slow and position[i] + 1 < len(n_counts) and deadline_seconds is not None:
                        # past a fit that missed the deadline: a count whose analytic runtime alone (a floor under
                        # its runtime bound) misses it too is skipped without its memory or its residuals
                        floor = predictor.runtime_floor_seconds(pool.gpu, n, links[i])
                        if floor is not None and floor > deadline_seconds:
                            skipped.setdefault(i, []).append(n)
                            position[i] += 1
                            continue
                    mem = predictor.known_memory(pool.gpu, n)
                    if mem is None:
                        if (position[i] + 1 < len(n_counts)
                                and predictor.required_floor_bytes(pool.gpu, n) > usable[i]):
                            position[i] += 1
                            continue
                        wanted_memory.append((pool.gpu, n))
                        break
                    if mem.required_bytes <= usable[i]:
                        break
                    position[i] += 1
            if not wanted_memory:
                break
            predictor.memory_many(wanted_memory)
        # stage 2: the runtime of each pool's fitting count, all in one batch
        fitting = [i for i in pending if position[i] < len(counts[i])]
        preds = predictor.predict_many([(pools[i].gpu, counts[i][position[i]], links[i]) for i in fitting])
        for i, pred in zip(fitting, preds, strict=True):
            option = _fit_option(pools[i], counts[i][position[i]], pred, usable[i], deadline_seconds,
                                 spec.model_parallel())
            if option.meets_deadline is False:
                # fits but too slow at this count: try more GPUs
                slow[i] = (slow[i][0] if i in slow else option, option)
                position[i] += 1
            else:
                done[i] = option, pred
        for i in pending:
            if i not in done and position[i] >= len(counts[i]):
                if i in slow and skipped.get(i):
                    # the reason names the most GPUs that fit: a skipped count above the last one predicted may be
                    # it (the bound need not grow with the count), as the count-by-count search would have found
                    slow[i] = (slow[i][0], _largest_skipped_fit(pools[i], skipped[i], slow[i][1], usable[i],
                                                                 deadline_seconds, predictor, links[i],
                                                                 spec.model_parallel()))
                done[i] = _no_fit_option(spec, pools[i], counts[i], usable[i], headroom, deadline_seconds,
                                         slow.get(i), predictor), None
        pending = [i for i in pending if i not in done]
    return [done[i] for i in range(len(pools))]


def _largest_skipped_fit(pool: NodePool, skipped: list[int], last: PoolOption, usable: int,
                         deadline_seconds: float | None, predictor: SpecPredictor, link: Interconnect,
                         model_parallel: int) -> PoolOption:
    """The fit of the largest count the deadline floor skipped above ``last`` (the last fit predicted), else
    ``last``: the option the count-by-count search ends a too-slow pool with."""
    for n in sorted((c for c in skipped if c > (last.gpus or 0)), reverse=True):
        if predictor.memory_many([(pool.gpu, n)])[0].required_bytes <= usable:
            pred = predictor.predict_many([(pool.gpu, n, link)])[0]
            return _fit_option(pool, n, pred, usable, deadline_seconds, model_parallel)
    return last


def _fit_option(pool: NodePool, n: int, pred: Prediction, usable: int, deadline_seconds: float | None,
                model_parallel: int = 1) -> PoolOption:
    """The option of a GPU count whose memory fits: runtime, cost, room, and whether it meets the deadline."""
    runtime = pred.runtime_seconds
    cost = job_cost_usd(n, runtime, pool.price_usd_per_gpu_hour) if runtime is not None else None
    # A deadline is a promise, like the memory fit: it is checked against the runtime's upper bound where the
    # runtime residual gives one, else against the point estimate.
    worst = pred.runtime_upper_seconds if pred.runtime_upper_seconds is not None else runtime
    meets = None if deadline_seconds is None or worst is None else worst <= deadline_seconds
    return PoolOption(
        pool, True, "fits", usable, gpus=n, nodes=pod_shape(n, pool.gpus_per_node, model_parallel)[0],
        peak_vram_bytes=pred.vram.peak_vram_bytes,
        peak_vram_upper_bytes=pred.peak_vram_upper_bytes, runtime_seconds=runtime,
        runtime_upper_seconds=pred.runtime_upper_seconds,
        throughput_tokens_per_second=pred.throughput_tokens_per_second, cost_usd=cost,
        hourly_cost_usd=hourly_cost_usd(n, pool.price_usd_per_gpu_hour),
        has_room=pool.free_gpus is None or pool.free_gpus >= n, meets_deadline=meets,
        allocator_cache_bytes=int(reclaimable_bytes(pred.vram)))


def _takes(option: PoolOption) -> str:
    assert option.runtime_seconds is not None
    if option.runtime_upper_seconds is not None:
        return (f"may take {format_duration(option.runtime_upper_seconds)} (upper bound; "
                f"{format_duration(option.runtime_seconds)} expected)")
    return f"takes {format_duration(option.runtime_seconds)}"


def _no_fit_option(spec: TrainingSpec, pool: NodePool, counts: list[int], usable: int, headroom: float,
                   deadline_seconds: float | None, slow: tuple[PoolOption, PoolOption] | None,
                   predictor: SpecPredictor) -> PoolOption:
    """Why no count of ``pool`` works: every count that fits misses the deadline, or no count's memory fits.

    A deadline miss names the first fitting count and, when more GPUs were tried, the fastest (the last) with
    its figures: how close the pool came."""
    if slow is not None:
        assert deadline_seconds is not None
        first, last = slow
        reason = (f"fits on {first.gpus} GPU{'s' if first.gpus != 1 else ''} but {_takes(first)} > deadline "
                  f"{format_duration(deadline_seconds)}")
        if last is not first:
            reason += f"; on {last.gpus} GPUs (the most tried here) it still {_takes(last)}"
        return PoolOption(**{**last.__dict__, "reason": reason})
    n = counts[-1]
    last = predictor.known_memory(pool.gpu, n) or predictor.memory_many([(pool.gpu, n)])[0]
    reason = (f"needs {format_bytes(last.required_bytes)} per GPU (upper bound) on {n} GPU"
              f"{'s' if n > 1 else ''}; {pool.gpu} has {format_bytes(usable)} usable "
              f"({headroom:.0%} headroom)")
    paged = last.vram.breakdown_bytes.get("paged_optimizer_states", 0)
    if paged:
        reason += (f"; paged optimizer states ({format_bytes(paged)}) counted at their expected size, without the "
                   "margin")
    cache = int(reclaimable_bytes(last.vram))  # as required_bytes discounts it (scaled with a point correction)
    if cache:
        reason += (f"; the allocator's fragmentation of variable-length blocks ({format_bytes(cache)}) not counted: "
                   "PyTorch frees that cache before an allocation fails")
    if spec.gpus == "auto" and (spec.sharding or "ddp") in _REPLICATED:
        reason += (f"; sharding {spec.sharding or 'ddp'} replicates the model on every GPU, so more GPUs do not "
                   "reduce per-GPU memory (set sharding: fsdp or zero3)")
    return PoolOption(pool, False, reason, usable, gpus=n, nodes=pool.nodes_for(n),
                      peak_vram_bytes=last.vram.peak_vram_bytes, peak_vram_upper_bytes=last.peak_vram_upper_bytes)


def _rank_key(objective: str, option: PoolOption) -> tuple[float, float]:
    hourly = option.hourly_cost_usd or 0.0
    cost = option.cost_usd if option.cost_usd is not None else hourly
    speed = (option.runtime_seconds if option.runtime_seconds is not None
             else 1.0 / (option.throughput_tokens_per_second or 1e-30))
    if objective == "fastest":
        return (speed, cost)
    return (cost, speed)


def place(
    spec: TrainingSpec,
    pools: PoolsConfig | Sequence[NodePool],
    objective: str = "cheapest",
    deadline_seconds: float | None = None,
    headroom_fraction: float | None = None,
    model: ResolvedModel | None = None,
    base_dir: Path | None = None,
    suggest: bool = True,
    pod_shapes: PodShapes | None = None,
) -> Decision:
    """Place ``spec`` on the best pool for ``objective``, or explain why no pool fits. ``pod_shapes``: (GPUs per
    pod, pods) of a manifest's fixed pods; a pool whose nodes cannot hold them all is out."""
    if objective not in OBJECTIVES:
        raise ObjectiveError(f"objective must be one of {', '.join(OBJECTIVES)}; got {objective!r}")
    pool_list = list(pools.pools if isinstance(pools, PoolsConfig) else pools)
    if headroom_fraction is None:
        file_headroom = pools.headroom_fraction if isinstance(pools, PoolsConfig) else None
        headroom_fraction = DEFAULT_HEADROOM_FRACTION if file_headroom is None else file_headroom
    warnings: list[str] = []
    deadline = None
    if objective == "cheapest-within-deadline":
        deadline = deadline_seconds if deadline_seconds is not None else spec.deadline_seconds
        if deadline is None:
            raise ObjectiveError("objective cheapest-within-deadline needs a deadline "
                             "(spec deadline_seconds or --deadline-hours)")
        if not (math.isfinite(deadline) and deadline > 0):
            raise ObjectiveError(f"the deadline must be a positive, finite number of seconds; got {deadline}")
    resolved = model or resolve_model_cached(spec, base_dir)
    evaluated = _evaluate_all(spec, pool_list, headroom_fraction, deadline, spec_predictor(spec, resolved),
                              pod_shapes)
    if pod_shapes:  # the manifest's pods, packed: the nodes they take (a fitting option's count is the job's)
        evaluated = [(replace(opt, nodes=nodes_for_pods(pod_shapes, opt.pool.gpus_per_node)) if opt.fits else opt,
                      pred) for opt, pred in evaluated]
    options = [opt for opt, _ in evaluated]
    preds = {opt.pool.name: pred for opt, pred in evaluated}
    no_runtime = spec.train_tokens is None and spec.steps is None
    if no_runtime and deadline is not None:
        warnings.append(f"the deadline ({format_duration(deadline)}) is not checked: without train_tokens or steps "
                        "no runtime is predicted; ranked by hourly cost. To fix: add train_tokens or steps to the spec")
    elif no_runtime:
        warnings.append("no train_tokens or steps: runtime and cost unknown; ranked by hourly cost"
                        if objective != "fastest" else "no train_tokens or steps: ranked by throughput")
    if objective != "cheapest-within-deadline" and (deadline_seconds is not None
                                                    or spec.deadline_seconds is not None):
        warnings.append(f"a deadline is set, but placement here uses the objective {objective}, which does not "
                        "enforce it (cheapest-within-deadline does)")
    eligible = [o for o in options if o.fits and o.meets_deadline is not False]
    ranked = sorted(eligible, key=lambda o: _rank_key(objective, o))
    rank_of = {o.pool.name: i + 1 for i, o in enumerate(ranked)}
    with_room = [o for o in ranked if o.has_room]
    reasons: list[str] = []

    if not ranked:
        reasons = [f"{o.pool.name}: {o.reason}" for o in options]
        suggestions = (_suggest(spec, pool_list, objective, deadline, headroom_fraction, resolved, pod_shapes)
                       if suggest else ())
        return Decision("unschedulable", objective, None, tuple(options), suggestions, tuple(reasons),
                        tuple(warnings), headroom_fraction)

    waits = not with_room
    chosen = with_room[0] if with_room else ranked[0]
    if not chosen.pool.gpu_spec.runs(spec.precision):  # only with a defaulted precision: a stated one rules it out
        warnings.append(f"precision not stated: assumed {spec.precision}, which {chosen.pool.gpu} cannot run (no "
                        f"bf16); there the job runs in whatever precision its script uses. State precision (e.g. "
                        f"16-mixed or 32-true) for an exact prediction")
    what = {"cheapest": "cheapest", "fastest": "fastest",
            "cheapest-within-deadline": "cheapest within the deadline"}[objective]
    unchecked = ""
    if objective == "cheapest-within-deadline" and chosen.meets_deadline is None:
        what, unchecked = "cheapest", " (the deadline is not checked: no runtime without train_tokens or steps)"
    if waits:
        reasons.append(f"{chosen.pool.name}: {what} fitting pool; no fitting pool has the free GPUs it needs now "
                       f"({chosen.pool.name}: {chosen.pool.free_gpus} free of {chosen.gpus}), the job waits for "
                       f"capacity there{unchecked}")
    else:
        reasons.append(f"{chosen.pool.name}: {what} fitting pool with room{unchecked}")
    chosen_pred = preds.get(chosen.pool.name)
    paged_needed, cache_needed = (reliefs_needed(chosen.peak_vram_upper_bytes or 0, chosen_pred.vram,
                                                 chosen.usable_bytes) if chosen_pred is not None else (False, False))
    upper_text = f"the upper bound ({format_bytes(chosen.peak_vram_upper_bytes or 0)}) is above the usable " \
                 f"{format_bytes(chosen.usable_bytes)}"
    if paged_needed:
        paged = chosen_pred.vram.breakdown_bytes["paged_optimizer_states"]  # type: ignore[union-attr]
        reasons.append(f"{chosen.pool.name}: {upper_text}, but {format_bytes(paged)} of paged optimizer states page "
                       "to host memory when the GPU is full: the rest's bound and the expected peak with them fit")
    if cache_needed:
        cache = int(reclaimable_bytes(chosen_pred.vram))  # type: ignore[union-attr]
        reasons.append(f"{chosen.pool.name}: {upper_text}, but {format_bytes(cache)} of it is the caching "
                       "allocator's fragmentation of variable-length blocks, which PyTorch frees and retries before "
                       "an allocation fails (slower steps): the rest's bound fits. "
                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids it")
    for better in ranked[: ranked.index(chosen)]:
        warnings.append(f"{better.pool.name} would be {_compare(objective, better, chosen)} but has only "
                        f"{better.pool.free_gpus} free GPUs of the {better.gpus} needed")
    alternatives = []
    for o in options:
        if o.pool.name in rank_of:
            is_chosen = o is chosen
            note = _relief_note(o, preds.get(o.pool.name))
            reason = "chosen" + note if is_chosen else _alt_reason_text(objective, o, chosen) + note
            o = PoolOption(**{**o.__dict__, "rank": rank_of[o.pool.name], "reason": reason})
            if is_chosen:
                chosen = o
        alternatives.append(o)
    alternatives.sort(key=lambda o: (o.rank is None, o.rank or 0))
    return Decision("placed", objective, chosen, tuple(alternatives), (), tuple(reasons), tuple(warnings),
                    headroom_fraction, waits, preds.get(chosen.pool.name))


def _compare(objective: str, a: PoolOption, b: PoolOption) -> str:
    if objective == "fastest" and a.runtime_seconds and b.runtime_seconds:
        return f"faster ({format_duration(a.runtime_seconds)} vs {format_duration(b.runtime_seconds)})"
    if a.cost_usd is not None and b.cost_usd is not None:
        return f"cheaper (${a.cost_usd:,.2f} vs ${b.cost_usd:,.2f})"
    return f"cheaper per hour (${a.hourly_cost_usd:,.2f} vs ${b.hourly_cost_usd:,.2f})"


def _relief_note(o: PoolOption, pred: Prediction | None) -> str:
    """Why a fitting option's upper bound may exceed the usable memory: only paged optimizer states (paged to host
    memory) and the allocator's fragmentation (freed before an allocation fails) can."""
    if (o.peak_vram_upper_bytes or 0) <= o.usable_bytes:
        return ""
    if pred is None:
        return " (paged optimizer states outside the margin)"
    needed = reliefs_needed(o.peak_vram_upper_bytes or 0, pred.vram, o.usable_bytes)
    what = [label for label, need in zip(("paged optimizer states", "the allocator's fragmentation"), needed,
                                         strict=True) if need]
    return f" ({' and '.join(what)} outside the margin)" if what else ""


def _alt_reason_text(objective: str, o: PoolOption, chosen: PoolOption) -> str:
    if not o.has_room:
        return f"fits; only {o.pool.free_gpus} free GPUs of {o.gpus} needed"
    if objective == "fastest" and o.runtime_seconds and chosen.runtime_seconds:
        return f"fits; {o.runtime_seconds / chosen.runtime_seconds:.2f}x the chosen runtime"
    if o.cost_usd and chosen.cost_usd:
        return f"fits; {o.cost_usd / chosen.cost_usd:.2f}x the chosen cost"
    return "fits; ranked lower"


def _variants(spec: TrainingSpec) -> list[tuple[str, dict[str, Any]]]:
    """Single changes that lower per-GPU memory, in the order a user would try them."""
    out: list[tuple[str, dict[str, Any]]] = []
    if spec.precision.startswith("bf16"):  # for pools whose GPUs have no bf16 (V100, T4)
        half = spec.precision.replace("bf16", "16")
        out.append((f"precision: {half}", {"precision": half}))
    if spec.gradient_checkpointing != "full":
        out.append(("gradient_checkpointing: full", {"gradient_checkpointing": "full"}))
    elif (spec.checkpoint_every_n_layers or 1) > 1:
        out.append(("checkpoint every block (checkpoint_every_n_layers: 1)", {"checkpoint_every_n_layers": 1}))
    if spec.micro_batch_size > 1:
        accum = spec.grad_accum_steps * spec.micro_batch_size
        out.append((f"micro_batch_size: 1 with grad_accum_steps: {accum}",
                    {"micro_batch_size": 1, "grad_accum_steps": accum}))
    if spec.shard_group_size:
        out.append(("shard over every data-parallel rank (no shard_group_size)", {"shard_group_size": None}))
    if spec.secondary_shard_size:
        out.append(("no secondary parameter shard (drop secondary_shard_size, ZeRO++ hpZ)",
                    {"secondary_shard_size": None}))
    if spec.sharding not in ("zero3", "fsdp") or spec.gpus != "auto":
        out.append(("sharding: fsdp across {gpus} (gpus: auto)", {"sharding": "fsdp", "gpus": "auto"}))
    if spec.method == "full":
        out.append(("method: lora", {"method": "lora"}))
    if spec.method != "qlora":
        out.append(("method: qlora", {"method": "qlora", "quantization": None}))
    if spec.offload == "none":
        out.append(("offload: optimizer", {"offload": "optimizer"}))
    if spec.offload != "params+optimizer":
        if spec.sharding in PARAM_OFFLOAD_SHARDING:
            out.append(("offload: params+optimizer", {"offload": "params+optimizer"}))
        else:  # parameter offload needs a sharded engine; fsdp, as the sharding variant above
            out.append(("offload: params+optimizer with sharding: fsdp",
                        {"offload": "params+optimizer", "sharding": "fsdp"}))
    return out


def _suggest(spec: TrainingSpec, pools: list[NodePool], objective: str, deadline: float | None,
             headroom: float, model: ResolvedModel, pod_shapes: PodShapes | None = None) -> tuple[Suggestion, ...]:
    """Re-place the spec under each single change (then cumulative ones if none works alone). A change that keeps
    the GPU count keeps the manifest's pods (``pod_shapes``); one that changes it reshapes them."""
    no_bf16 = precision_stated(spec) and any(not p.gpu_spec.runs(spec.precision) for p in pools)
    variants = [v for v in _variants(spec) if "precision" not in v[1] or no_bf16]
    found: list[Suggestion] = []

    def attempt(label: str, update: dict[str, Any]) -> None:
        variant = spec.model_copy(update=update)
        shapes = pod_shapes if variant.gpus == spec.gpus else None
        decision = place(variant, pools, objective, deadline, headroom, model=model, suggest=False,
                         pod_shapes=shapes)
        c = decision.chosen
        if c is None or c.peak_vram_bytes is None or c.peak_vram_upper_bytes is None or c.gpus is None:
            return
        gpus = f"{c.gpus} GPU{'s' if c.gpus != 1 else ''}"
        found.append(Suggestion(label.format(gpus=gpus), update, c.peak_vram_bytes, c.peak_vram_upper_bytes,
                                c.pool.name, c.pool.gpu, c.gpus, c.runtime_seconds, c.cost_usd,
                                c.allocator_cache_bytes))

    for label, update in variants:
        attempt(label, update)
    if not found:
        cumulative: dict[str, Any] = {}
        labels: dict[str, str] = {}  # first field of a change -> its label; a later change of it replaces it
        for label, update in variants:
            cumulative.update(update)
            labels[next(iter(update))] = label
            attempt(" + ".join(labels.values()), dict(cumulative))
            if found:
                break
    found.sort(key=lambda s: (s.predicted_cost_usd is None, s.predicted_cost_usd or 0.0, s.peak_vram_upper_bytes))
    return tuple(found)
