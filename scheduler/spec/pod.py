"""core/v1 Pod: one pod, its containers' ``nvidia.com/gpu`` requests; pointer ``/spec``."""

from __future__ import annotations

from typing import Any

from scheduler.spec.merge import Context, Workload
from scheduler.spec.pods import metadata, read_pod_spec


def parse(doc: dict[str, Any], ctx: Context) -> Workload:
    obj, annotations = metadata(doc, "Pod", ctx.source, ctx.configmaps)
    role = read_pod_spec(obj, doc.get("spec"), ("spec",), "pod", 1, what="Pod", annotations=annotations,
                         annotations_path=("metadata", "annotations"))
    return Workload(obj, annotations, [role], files=ctx.files, configmaps=ctx.configmaps)
