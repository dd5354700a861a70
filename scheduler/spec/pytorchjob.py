"""kubeflow.org/v1 PyTorchJob (Training Operator v1): every replica type (Master, Worker) trains.

Pointer ``/spec/pytorchReplicaSpecs/<Role>/template/spec``. With an ``elasticPolicy`` the job may
grow to ``maxReplicas`` workers; the prediction is per GPU, so the listed ``replicas`` are used.
"""

from __future__ import annotations

from typing import Any

from scheduler.spec.merge import Context, Workload
from scheduler.spec.pods import Role, count, get, metadata, read_pod_template


def parse(doc: dict[str, Any], ctx: Context) -> Workload:
    obj, annotations = metadata(doc, "PyTorchJob", ctx.source, ctx.configmaps)
    spec = get(obj, doc, "spec", (), dict, required=True, hint="a PyTorchJob needs spec.pytorchReplicaSpecs")
    replica_specs = get(
        obj,
        spec,
        "pytorchReplicaSpecs",
        ("spec",),
        dict,
        required=True,
        hint="give Master and/or Worker replica specs",
    )
    roles: list[Role] = []
    for name, item in replica_specs.items():
        path = ("spec", "pytorchReplicaSpecs", str(name))
        if not isinstance(item, dict):
            raise obj.error(path, f"must be a replica spec (replicas, template); got {type(item).__name__}")
        template = get(obj, item, "template", path, dict, required=True)
        roles.append(
            read_pod_template(
                obj, template, (*path, "template"), str(name), count(obj, item, "replicas", path, 1)
            )
        )
    notes = []
    elastic = get(obj, spec, "elasticPolicy", ("spec",), dict, {})
    if elastic.get("maxReplicas") is not None:
        notes.append(
            f"elasticPolicy lets the job grow to {elastic['maxReplicas']} workers; the listed "
            "replicas are counted"
        )
    return Workload(obj, annotations, roles, notes=notes, files=ctx.files, configmaps=ctx.configmaps)
