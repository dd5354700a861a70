"""A Ray Jobs submission: the JSON body of ``POST /api/jobs/`` (no ``kind``; recognised by ``entrypoint``).

Fields read: ``entrypoint`` (the trainer command line), ``runtime_env.env_vars``, ``metadata`` (where
the ``vramfit.io/spec`` key plays the annotation's part), ``entrypoint_num_gpus`` and
``entrypoint_resources`` (an ``accelerator_type:<TYPE>`` key pins the GPU type), ``submission_id``.
A submission says nothing of the cluster's pods, so the GPU count is ``entrypoint_num_gpus`` rounded
up, or ``auto`` (placement chooses) when it is absent and a trainer command line is recognised.
"""

from __future__ import annotations

import math
from typing import Any

from scheduler.spec.merge import Context, Workload
from scheduler.spec.pods import ObjectRef, Path, get
from scheduler.spec.raycluster import accelerator_pin, logical_gpus
from scheduler.spec.trainer_args import Setting


def entrypoint_workload(
    obj: ObjectRef,
    annotations: dict[str, str],
    entrypoint: str,
    where: str,
    env: dict[str, str],
    env_where: str,
    num_gpus: float,
    resources: Any,
    resources_path: Path,
    ctx: Context,
) -> Workload:
    """A Ray job whose pods are not in the object: GPUs from the entrypoint's own request."""
    w = Workload(
        obj,
        annotations,
        [],
        entrypoint=(("sh", "-c", entrypoint), where),
        extra_env=env,
        extra_env_where=env_where,
        files=ctx.files, configmaps=ctx.configmaps,
    )
    w.gpus = math.ceil(num_gpus) if num_gpus else "auto"
    w.gpus_source = f"entrypoint GPUs {num_gpus:g}" if num_gpus else "not given"
    w.no_gpu_reason = "no GPUs requested for the entrypoint and no trainer command line recognised"
    pin = accelerator_pin(obj, resources, resources_path)
    if pin is not None and pin.gpu:
        w.base["gpu"] = Setting(
            pin.gpu, f"Ray resource accelerator_type:{pin.value}", ".".join(str(p) for p in resources_path)
        )
    return w


def _check_submission_fields(obj: ObjectRef, doc: dict[str, Any]) -> None:
    """The fields vramfit passes on to Ray's submit_job, typed as Ray takes them (a wrong type was a traceback
    from the Ray client after the placement was made)."""
    if "submission_id" in doc and doc["submission_id"] is not None and not isinstance(doc["submission_id"], str):
        raise obj.error("submission_id", f"must be a string; got {doc['submission_id']!r}",
                        'quote it in YAML, e.g. submission_id: "12345"')
    for key in ("entrypoint_num_cpus", "entrypoint_memory"):
        value = doc.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value < 0):
            raise obj.error(key, f"must be a finite number, 0 or more; got {value!r}")
    resources = doc.get("entrypoint_resources")
    if isinstance(resources, dict):
        for key, value in resources.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise obj.error(("entrypoint_resources", str(key)),
                                f"must be a finite number, 0 or more; got {value!r}")


def parse(doc: dict[str, Any], ctx: Context) -> Workload:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    name = str(doc.get("submission_id") or doc.get("job_id") or meta.get("job_name") or "")
    obj = ObjectRef("RayJobSubmission", name, "", ctx.source)
    entrypoint = get(obj, doc, "entrypoint", (), str, required=True, hint="the command Ray runs")
    if not entrypoint.strip():
        raise obj.error("entrypoint", "is empty", "give the command Ray runs")
    runtime_env = get(obj, doc, "runtime_env", (), dict, {})
    env = get(obj, runtime_env, "env_vars", ("runtime_env",), dict, {})
    annotations = {str(k): str(v) for k, v in get(obj, doc, "metadata", (), dict, {}).items()}
    num_gpus = logical_gpus(obj, doc.get("entrypoint_num_gpus") or 0, ("entrypoint_num_gpus",))
    _check_submission_fields(obj, doc)
    w = entrypoint_workload(
        obj,
        annotations,
        entrypoint,
        "entrypoint",
        {str(k): str(v) for k, v in env.items()},
        "runtime_env.env_vars",
        num_gpus,
        doc.get("entrypoint_resources"),
        ("entrypoint_resources",),
        ctx,
    )
    w.annotation_path = ("metadata",)
    return w
