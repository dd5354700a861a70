"""jobset.x-k8s.io JobSet: every replicated Job counts ``replicas`` (default 1) x its ``parallelism``
(default 1, at most its ``completions``) pods. Pointer ``/spec/replicatedJobs/<i>/template/spec/template/spec``."""

from __future__ import annotations

from typing import Any

from scheduler.spec.batch_job import running_pods
from scheduler.spec.merge import Context, Workload
from scheduler.spec.pods import Role, count, get, metadata, named_roles, read_pod_template


def parse(doc: dict[str, Any], ctx: Context) -> Workload:
    obj, annotations = metadata(doc, "JobSet", ctx.source, ctx.configmaps)
    spec = get(obj, doc, "spec", (), dict, required=True, hint="a JobSet needs spec.replicatedJobs")
    items = named_roles(
        obj,
        spec.get("replicatedJobs"),
        ("spec", "replicatedJobs"),
        "replicated Jobs",
        "list the JobSet's Jobs",
    )
    roles: list[Role] = []
    for i, item in items:
        path = ("spec", "replicatedJobs", i)
        job = get(obj, item, "template", path, dict, required=True)
        job_spec = get(obj, job, "spec", (*path, "template"), dict, required=True)
        pods = count(obj, item, "replicas", path, 1) * running_pods(obj, job_spec, (*path, "template", "spec"))
        template = get(obj, job_spec, "template", (*path, "template", "spec"), dict, required=True)
        roles.append(
            read_pod_template(
                obj,
                template,
                (*path, "template", "spec", "template"),
                str(item.get("name") or f"replicatedJobs[{i}]"),
                pods,
            )
        )
    return Workload(obj, annotations, roles, files=ctx.files, configmaps=ctx.configmaps)
