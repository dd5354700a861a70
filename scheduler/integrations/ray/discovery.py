"""Node pools from a live Ray cluster: GPU types and free GPUs from its nodes, prices from the pools config.

A node's GPU type is its ``ray.io/accelerator-type`` label, else its ``accelerator_type:<TYPE>`` resource
(Ray sets both on nodes with detected NVIDIA GPUs; clusters with logical GPUs declare them). The type is
mapped onto the catalog (``lookup_gpu``) and then onto the configured pool of that GPU, whose name, price,
node selector, tolerations and links are kept while ``gpus_per_node``, ``nodes`` and ``free_gpus`` come
from the cluster. Nodes of one type with different GPU counts become one pool per count. A GPU type the
config does not price is left out with a warning: prices are never guessed.

:func:`pools_from_nodes` is pure (plain :class:`RayNode` values in, pools out); :func:`read_nodes` is the
only function that talks to the cluster.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from scheduler.integrations.ray.connection import (
    DEFAULT_GCS_PORT,
    DEFAULT_TIMEOUT_SECONDS,
    RayIntegrationError,
    auth_hint,
    bounded,
    check_reachable,
    import_ray,
)
from scheduler.pools import MAX_GPUS_PER_NODE, MAX_NAME_LENGTH, NodePool, PoolsConfig

ACCELERATOR_LABEL = "ray.io/accelerator-type"
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"

# Catalog GPU -> the accelerator type Ray reports for it (ray.util.accelerators; Ray names an NVIDIA GPU by the
# word after "NVIDIA"/"Tesla" in the device name: "NVIDIA A40" -> A40, "NVIDIA A800-SXM4-80GB" -> A800); used when
# the cluster is not asked (``discover=False``) and for a decision made without discovery.
RAY_ACCELERATOR_TYPES: dict[str, str] = {
    "H100-80GB": "H100",
    "H100-PCIe": "H100",
    "H100-96GB": "H100",
    "H200": "H200",
    "B200": "B200",
    "A100-80GB": "A100",
    "A100-80GB-PCIe": "A100",
    "A100-40GB": "A100",
    "L40S": "L40S",
    "L4": "L4",
    "A10G": "A10G",
    "A10": "A10",
    "A40": "A40",
    "L40": "L40",
    "A800-80GB": "A800",
    "H800": "H800",
    "T4": "T4",
    "V100-16GB": "V100",
    "V100-32GB": "V100",
}


def ray_accelerator_type(gpu: str) -> str:
    """The Ray accelerator type of a catalog GPU (``H100-80GB`` -> ``H100``)."""
    name = lookup_gpu(gpu).name
    return RAY_ACCELERATOR_TYPES.get(name, name)


@dataclass(frozen=True)
class RayNode:
    """One alive Ray node as discovery sees it: logical resources (total and available) and labels."""

    node_id: str
    total: Mapping[str, float]
    available: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpus_total(self) -> int:
        return int(math.floor(self.total.get("GPU", 0.0) + 1e-9))

    @property
    def gpus_free(self) -> int:
        return max(0, min(self.gpus_total, int(math.floor(self.available.get("GPU", 0.0) + 1e-9))))

    def accelerator_type(self) -> tuple[str | None, str | None]:
        """(type, problem): the label wins over the resource; a problem explains a missing or unclear type."""
        from_resources = sorted(k.removeprefix(ACCELERATOR_RESOURCE_PREFIX) for k in self.total
                                if k.startswith(ACCELERATOR_RESOURCE_PREFIX))
        label = self.labels.get(ACCELERATOR_LABEL)
        if label:
            if from_resources and label not in from_resources:
                return label, (f"node {self.short_id} has label {ACCELERATOR_LABEL}={label} but resources "
                               f"{', '.join(ACCELERATOR_RESOURCE_PREFIX + t for t in from_resources)}; using the "
                               "label")
            return label, None
        if len(from_resources) == 1:
            return from_resources[0], None
        if from_resources:
            return None, (f"node {self.short_id} declares several GPU types "
                          f"({', '.join(from_resources)}); left out")
        return None, (f"node {self.short_id} has {self.gpus_total} GPUs of unknown type; left out. To fix: start "
                      f"it with --resources '{{\"{ACCELERATOR_RESOURCE_PREFIX}<TYPE>\": 1}}' or label "
                      f"{ACCELERATOR_LABEL}")

    @property
    def short_id(self) -> str:
        return self.node_id[:8]


@dataclass(frozen=True)
class ClusterPools:
    """The pools found in a cluster, how to route a job to each, and what was left out and why."""

    pools: tuple[NodePool, ...]
    accelerator_types: Mapping[str, str]  # pool name -> Ray accelerator type
    node_ids: Mapping[str, tuple[str, ...]]  # pool name -> Ray node ids
    warnings: tuple[str, ...] = ()
    headroom_fraction: float | None = None
    # pools whose nodes are typed only by the ray.io/accelerator-type label: no accelerator_type:<T> resource
    # can pin a driver there, a label selector can
    label_only: frozenset[str] = frozenset()

    def config(self) -> PoolsConfig:
        """The pools as a config for :func:`scheduler.placement.place`; an error when none is usable."""
        if not self.pools:
            why = "".join(f"\n  - {w}" for w in self.warnings)
            raise RayIntegrationError(f"the Ray cluster has no priced GPU pool to place on{why}")
        return PoolsConfig(pools=list(self.pools), headroom_fraction=self.headroom_fraction)

    def accelerator_type(self, pool_name: str) -> str:
        return self.accelerator_types[pool_name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pools": [
                {**p.model_dump(mode="json", exclude_none=True),
                 "ray_accelerator_type": self.accelerator_types.get(p.name),
                 "ray_node_ids": list(self.node_ids.get(p.name, ()))}
                for p in self.pools
            ],
            "warnings": list(self.warnings),
        }


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def shape_pool_name(base: str, ray_type: str, gpus_per_node: int) -> str:
    """The name of the pool of one node shape (type and GPU count) of configured pool ``base``:
    ``{base}-{type}-{n}gpu``. A pool name is a Kubernetes label value (at most 63 characters), so a longer one keeps
    the shape suffix and cuts ``base`` short, marking the cut with 8 hex digits of the full name's SHA-256: the same
    shape always gets the same name, and two shapes never share one."""
    suffix = f"{_slug(ray_type)}-{gpus_per_node}gpu"
    full = f"{base}-{suffix}"
    if len(full) <= MAX_NAME_LENGTH:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    tail = f"-{digest}-{suffix}"
    room = MAX_NAME_LENGTH - len(tail)
    if room < 1:  # a suffix too long to keep: cut the whole name instead
        return f"{full[:MAX_NAME_LENGTH - len(digest) - 1].rstrip('-')}-{digest}"
    return base[:room].rstrip("-") + tail


def _norm(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def _configured_pool(ray_type: str, gpu: str, config: PoolsConfig, warnings: list[str]) -> NodePool | None:
    """The configured pool that prices this GPU type. A bare Ray type (``A100``) also matches a configured
    variant of it (``A100-40GB``), since Ray does not report the memory size."""
    exact = [p for p in config.pools if p.gpu == gpu]
    variants = [p for p in config.pools if p.gpu != gpu and _norm(p.gpu).startswith(_norm(ray_type))]
    candidates = exact or variants
    if not candidates:
        return None
    chosen = min(candidates, key=lambda p: p.price_usd_per_gpu_hour)
    if exact and variants:
        warnings.append(f"Ray accelerator type {ray_type} does not tell {gpu} from "
                        f"{', '.join(sorted({p.gpu for p in variants}))}; assuming {gpu} (pool {chosen.name}). To "
                        f"fix: label those nodes {ACCELERATOR_LABEL}=<catalog name>")
    if not exact:
        warnings.append(f"Ray reports accelerator type {ray_type} (catalog {gpu}); using pool {chosen.name}'s "
                        f"{chosen.gpu}, the configured variant of it")
    if len(candidates) > 1:
        others = ", ".join(p.name for p in candidates if p is not chosen)
        warnings.append(f"pools {chosen.name} and {others} have the same GPU type {chosen.gpu}, which Ray cannot "
                        f"tell apart; using {chosen.name} (the cheapest)")
    return chosen


def pools_from_nodes(nodes: Iterable[RayNode], config: PoolsConfig) -> ClusterPools:
    """Group GPU nodes by type and GPU count, price them from ``config``; pure."""
    warnings: list[str] = []
    groups: dict[tuple[str, int], list[RayNode]] = {}
    for node in nodes:
        if node.gpus_total <= 0:
            continue
        ray_type, problem = node.accelerator_type()
        if problem:
            warnings.append(problem)
        if ray_type is None:
            continue
        groups.setdefault((ray_type, node.gpus_total), []).append(node)

    per_base: dict[str, list[tuple[str, int, list[RayNode]]]] = {}
    bases: dict[str, NodePool] = {}
    unpriced: dict[str, list[str]] = {}
    for (ray_type, per_node), members in sorted(groups.items()):
        if per_node > MAX_GPUS_PER_NODE:  # logical GPUs a node declares; no pool holds such a node
            warnings.append(f"{len(members)} node(s) of type {ray_type} declare {per_node} GPUs each, more than the "
                            f"{MAX_GPUS_PER_NODE} a pool's node may have; left out")
            continue
        try:
            gpu = lookup_gpu(ray_type).name
        except SpecError:
            warnings.append(f"accelerator type {ray_type} on {len(members)} node(s) is not in the GPU catalog "
                            "(`vramfit catalog`); left out")
            continue
        base = _configured_pool(ray_type, gpu, config, warnings)
        if base is None:
            unpriced.setdefault(gpu, []).append(ray_type)
            continue
        bases[base.name] = base
        per_base.setdefault(base.name, []).append((ray_type, per_node, members))
    for gpu, types in unpriced.items():
        warnings.append(f"GPU type {gpu} (Ray accelerator type {', '.join(sorted(set(types)))}) has no price in "
                        f"the pools config; left out. To fix: add a pool with `gpu: {gpu}` and its "
                        "price_usd_per_gpu_hour")

    pools: list[NodePool] = []
    accelerator_types: dict[str, str] = {}
    node_ids: dict[str, tuple[str, ...]] = {}
    label_only: set[str] = set()
    for base_name, shapes in per_base.items():
        base = bases[base_name]
        for ray_type, per_node, members in shapes:
            name = base.name if len(shapes) == 1 else shape_pool_name(base.name, ray_type, per_node)
            data = base.model_dump(exclude_none=True)
            data.update(name=name, gpus_per_node=per_node, nodes=len(members),
                        free_gpus=sum(n.gpus_free for n in members))
            pools.append(NodePool.model_validate(data))
            accelerator_types[name] = ray_type
            node_ids[name] = tuple(n.node_id for n in members)
            if not all(ACCELERATOR_RESOURCE_PREFIX + ray_type in n.total for n in members):
                label_only.add(name)
    for pool in config.pools:
        if pool.name not in bases and not any(pool.gpu == bases[b].gpu for b in bases):
            warnings.append(f"pool {pool.name} ({pool.gpu}) has no nodes in the Ray cluster; not considered")
    return ClusterPools(tuple(pools), accelerator_types, node_ids, tuple(warnings), config.headroom_fraction,
                        frozenset(label_only))


def _nodes_from_status(status: Any) -> list[RayNode]:
    nodes: list[RayNode] = []
    for info in [*status.active_nodes, *status.idle_nodes]:
        usage = info.resource_usage.usage if info.resource_usage is not None else []
        total = {u.resource_name: float(u.total) for u in usage}
        available = {u.resource_name: float(u.total) - float(u.used) for u in usage}
        nodes.append(RayNode(str(info.node_id or ""), total, available, dict(info.labels or {})))
    return nodes


def read_nodes(gcs_address: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> list[RayNode]:
    """The alive nodes of the cluster whose GCS is at ``gcs_address`` (``host:port``), with used and total
    logical resources, as ``ray status`` sees them. Needs no driver connection."""
    import_ray()
    check_reachable(gcs_address, DEFAULT_GCS_PORT, "GCS", min(timeout_seconds, 5.0))
    from ray.autoscaler.v2.sdk import get_cluster_status

    seconds = max(1, int(timeout_seconds))
    try:
        status = bounded(lambda: get_cluster_status(gcs_address, timeout=seconds), timeout_seconds,
                         f"the Ray GCS at {gcs_address}")
    except RayIntegrationError:
        raise
    except Exception as exc:  # ray.exceptions.RpcError and friends: not a stack trace for the user
        raise RayIntegrationError(f"cannot read the nodes of the Ray cluster at {gcs_address}: {exc}"
                                  f"{auth_hint(exc)}") from None
    return _nodes_from_status(status)


def discover_pools(gcs_address: str, config: PoolsConfig,
                   timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> ClusterPools:
    """Pools of the live cluster at ``gcs_address``, priced by ``config``."""
    return pools_from_nodes(read_nodes(gcs_address, timeout_seconds), config)


def configured_pools(config: PoolsConfig) -> ClusterPools:
    """The configured pools as they are, routed by :data:`RAY_ACCELERATOR_TYPES` (no cluster asked)."""
    types = {p.name: ray_accelerator_type(p.gpu) for p in config.pools}
    return ClusterPools(tuple(config.pools), types, {}, (), config.headroom_fraction)

