"""batch.volcano.sh/v1alpha1 Job: ``spec.tasks[]``, each ``replicas`` (default 1) pods of its template.
Pointer ``/spec/tasks/<i>/template/spec``; tasks without GPUs (an MPI launcher) do not count."""

from __future__ import annotations

from typing import Any

from scheduler.spec.merge import Context, Workload
from scheduler.spec.pods import count, get, metadata, named_roles, read_pod_template


def parse(doc: dict[str, Any], ctx: Context) -> Workload:
    obj, annotations = metadata(doc, "Job.batch.volcano.sh", ctx.source, ctx.configmaps)
    spec = get(obj, doc, "spec", (), dict, required=True, hint="a Volcano Job needs spec.tasks")
    items = named_roles(obj, spec.get("tasks"), ("spec", "tasks"), "tasks", "list the Volcano Job's tasks")
    roles = [
        read_pod_template(
            obj,
            get(obj, item, "template", ("spec", "tasks", i), dict, required=True),
            ("spec", "tasks", i, "template"),
            str(item.get("name") or f"tasks[{i}]"),
            count(obj, item, "replicas", ("spec", "tasks", i), 1),
        )
        for i, item in items
    ]
    return Workload(obj, annotations, roles, files=ctx.files, configmaps=ctx.configmaps)
