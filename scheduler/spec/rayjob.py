"""ray.io/v1 RayJob (KubeRay): the cluster of ``spec.rayClusterSpec`` plus the job's entrypoint.

The trainer command line is ``spec.entrypoint``; env vars from ``runtimeEnvYAML``'s ``env_vars``.
``entrypointNumGpus`` is what the driver itself asks for; it sizes the job only when the RayJob runs
on an existing cluster (``clusterSelector``, no ``rayClusterSpec``). Pointers are those of the
RayCluster under ``/spec/rayClusterSpec``.
"""

from __future__ import annotations

from typing import Any

from scheduler.spec.merge import Context, Workload
from scheduler.spec.pods import ObjectRef, get, metadata
from scheduler.spec.ray_submission import entrypoint_workload
from scheduler.spec.raycluster import logical_gpus, read_cluster_spec
from scheduler.spec.yamltext import YAML_ERRORS, safe_load, too_long, yaml_error_text


def parse(doc: dict[str, Any], ctx: Context) -> Workload:
    obj, annotations = metadata(doc, "RayJob", ctx.source, ctx.configmaps)
    spec = get(obj, doc, "spec", (), dict, required=True, hint="a RayJob needs spec.entrypoint")
    entrypoint = get(obj, spec, "entrypoint", ("spec",), str, "")
    num_gpus = logical_gpus(obj, spec.get("entrypointNumGpus", 0), ("spec", "entrypointNumGpus"))
    w = entrypoint_workload(
        obj,
        annotations,
        entrypoint,
        "spec.entrypoint",
        _runtime_env_vars(obj, spec),
        "spec.runtimeEnvYAML.env_vars",
        num_gpus,
        spec.get("entrypointResources"),
        ("spec", "entrypointResources"),
        ctx,
    )
    cluster = spec.get("rayClusterSpec")
    selector = get(obj, spec, "clusterSelector", ("spec",), dict, {})
    if selector and cluster is not None:
        # KubeRay's RayJob controller looks at clusterSelector first and then runs on that existing cluster
        # (its `ray.io/cluster` entry); the rayClusterSpec makes no pods (ray-operator/controllers/ray/
        # rayjob_controller.go, initRayJobStatusIfNeed)
        w.notes.append("spec.clusterSelector names an existing cluster, so spec.rayClusterSpec is not used")
        return w
    if cluster is None:  # runs on an existing cluster (clusterSelector): only the entrypoint's GPUs are known
        return w
    w.gpus, w.gpus_source = None, ""
    w.roles, w.no_gpu_reason = read_cluster_spec(obj, cluster, ("spec", "rayClusterSpec"))
    if num_gpus and not any(r.gpus_per_pod for r in w.roles):
        w.no_gpu_reason = (
            f"entrypointNumGpus is {num_gpus:g} but no group of spec.rayClusterSpec provides GPUs"
        )
    if any(r.pin for r in w.roles):
        w.base.pop("gpu", None)  # the pods' own node selection wins over the entrypoint's resource
    return w


def _runtime_env_vars(obj: ObjectRef, spec: dict[str, Any]) -> dict[str, str]:
    text = get(obj, spec, "runtimeEnvYAML", ("spec",), str, "")
    if not text:
        return {}
    if (long := too_long(text)) is not None:
        raise obj.error(("spec", "runtimeEnvYAML"), long, "keep the runtime env small; ship large files in the image")
    try:
        runtime_env = safe_load(text)
    except YAML_ERRORS as exc:
        raise obj.error(("spec", "runtimeEnvYAML"), yaml_error_text(exc)) from None
    env = runtime_env.get("env_vars") if isinstance(runtime_env, dict) else None
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
