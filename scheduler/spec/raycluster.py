"""ray.io/v1 RayCluster (KubeRay): the head group and every worker group.

GPUs per pod, first found: the container's ``nvidia.com/gpu`` limit, ``rayStartParams.num-gpus``, the
group's ``resources.GPU``. Worker pods = ``replicas`` kept within ``minReplicas``..``maxReplicas`` (absent:
``minReplicas``, default 0) x ``numOfHosts``; a ``suspend``ed group has none.
Pointers ``/spec/headGroupSpec/template/spec`` and ``/spec/workerGroupSpecs/<i>/template/spec``.
A GPU pin may also come from the group's Ray label ``ray.io/accelerator-type``.
Also used by RayJob (``spec.rayClusterSpec``) and by Ray Jobs submissions (the accelerator pin).
"""

from __future__ import annotations

import json
import math
from typing import Any

from predictors.units import QuantityError, parse_float_count
from scheduler.spec.merge import Context, Workload
from scheduler.spec.pods import (
    GpuPin,
    ObjectRef,
    Path,
    Role,
    count,
    get,
    map_gpu_label,
    metadata,
    named_roles,
    read_pod_template,
)

ACCELERATOR_LABEL = "ray.io/accelerator-type"


def logical_gpus(obj: ObjectRef, value: Any, path: Path) -> float:
    """A Ray GPU amount (``"2"``, ``0.5``); fractions are allowed for Ray resources."""
    try:
        amount = parse_float_count(value, "GPU")
    except QuantityError:
        raise obj.error(path, f"must be a number of GPUs; got {value!r}") from None
    if amount < 0:
        raise obj.error(path, f"must not be negative; got {value!r}")
    return amount


def _group(obj: ObjectRef, group: dict[str, Any], path: Path, name: str, replicas: int) -> Role:
    template = get(obj, group, "template", path, dict, required=True, hint="give the group a pod template")
    role = read_pod_template(obj, template, (*path, "template"), name, replicas)
    params = get(obj, group, "rayStartParams", path, dict, {})
    resources = get(obj, group, "resources", path, dict, {})
    if role.unsized:  # MIG slices, AMD GPUs...: Ray's logical GPUs are those, not whole NVIDIA GPUs
        pass
    elif role.gpus_per_pod == 0 and params.get("num-gpus") is not None:
        role.gpus_per_pod = math.ceil(
            logical_gpus(obj, params["num-gpus"], (*path, "rayStartParams", "num-gpus"))
        )
        role.gpu_source = "rayStartParams num-gpus"
    elif role.gpus_per_pod == 0 and resources.get("GPU") is not None:
        role.gpus_per_pod = math.ceil(logical_gpus(obj, resources["GPU"], (*path, "resources", "GPU")))
        role.gpu_source = "group resources GPU"
    labels = get(obj, group, "labels", path, dict, {})
    if role.pin is None and labels.get(ACCELERATOR_LABEL):
        value = str(labels[ACCELERATOR_LABEL])
        role.pin = GpuPin(
            ACCELERATOR_LABEL,
            value,
            (*path, "labels", ACCELERATOR_LABEL),
            map_gpu_label(ACCELERATOR_LABEL, value),
        )
    return role


def _worker_pods(obj: ObjectRef, group: dict[str, Any], path: Path) -> int:
    """Pods of a worker group as KubeRay makes them (GetWorkerGroupDesiredReplicas, ray-operator/controllers/ray/
    utils/util.go): none when suspended; else ``replicas`` raised to ``minReplicas`` and lowered to
    ``maxReplicas`` (the CRD defaults: replicas 0, minReplicas 0, maxReplicas 2**31-1), times ``numOfHosts``."""
    if get(obj, group, "suspend", path, bool, False):
        return 0
    low = count(obj, group, "minReplicas", path, 0)
    high = count(obj, group, "maxReplicas", path, 2**31 - 1)
    replicas = count(obj, group, "replicas", path, 0)
    wanted = high if low > high else min(max(replicas, low), high)  # KubeRay uses maxReplicas when min > max
    return wanted * count(obj, group, "numOfHosts", path, 1)


def read_cluster_spec(obj: ObjectRef, spec: Any, path: Path) -> tuple[list[Role], str]:
    """Roles of a RayCluster spec, and a reason when GPU groups exist but have no pods now."""
    if not isinstance(spec, dict):
        raise obj.error(path, "must be a RayCluster spec (headGroupSpec, workerGroupSpecs)")
    head = get(obj, spec, "headGroupSpec", path, dict, required=True, hint="a Ray cluster needs a head group")
    roles = [_group(obj, head, (*path, "headGroupSpec"), "head", 1)]
    scaled_to_zero: list[str] = []
    for i, group in named_roles(
        obj, spec.get("workerGroupSpecs"), (*path, "workerGroupSpecs"), "worker groups"
    ):
        gpath = (*path, "workerGroupSpecs", i)
        replicas = _worker_pods(obj, group, gpath)
        name = str(group.get("groupName") or f"workerGroupSpecs[{i}]")
        role = _group(obj, group, gpath, name, replicas)
        if role.gpus_per_pod and not role.replicas:
            scaled_to_zero.append(f"{name} (0 replicas now, up to {group.get('maxReplicas', '?')})")
        roles.append(role)
    reason = ""
    if scaled_to_zero:
        reason = (
            f"its GPU worker groups have no pods until Ray scales them up: {', '.join(scaled_to_zero)}; "
            "set gpus in the vramfit.io/spec annotation to size the job"
        )
    return roles, reason


def accelerator_pin(obj: ObjectRef, resources: Any, path: Path) -> GpuPin | None:
    """A GPU type asked through Ray's ``accelerator_type:<TYPE>`` custom resource (a dict, or its JSON)."""
    if isinstance(resources, str):
        try:
            resources = json.loads(resources)
        except (ValueError, RecursionError):
            raise obj.error(path, "must be a JSON object of Ray resources") from None
    if not isinstance(resources, dict):
        return None
    for key in resources:
        if str(key).startswith("accelerator_type:"):
            value = str(key).split(":", 1)[1]
            return GpuPin(
                ACCELERATOR_LABEL, value, (*path, str(key)), map_gpu_label(ACCELERATOR_LABEL, value)
            )
    return None


def parse(doc: dict[str, Any], ctx: Context) -> Workload:
    obj, annotations = metadata(doc, "RayCluster", ctx.source, ctx.configmaps)
    spec = get(obj, doc, "spec", (), dict, required=True, hint="a RayCluster needs spec.headGroupSpec")
    roles, reason = read_cluster_spec(obj, spec, ("spec",))
    return Workload(obj, annotations, roles, no_gpu_reason=reason, files=ctx.files, configmaps=ctx.configmaps)
