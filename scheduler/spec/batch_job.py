"""batch/v1 Job: ``spec.parallelism`` pods (default 1) of ``spec.template``, at most ``spec.completions``.

Pointer ``/spec/template/spec``.
"""

from __future__ import annotations

from typing import Any

from scheduler.spec.merge import Context, Workload
from scheduler.spec.pods import ObjectRef, Path, count, get, metadata, read_pod_template


def running_pods(obj: ObjectRef, job_spec: dict[str, Any], path: Path) -> int:
    """Pods a Job runs at once: ``parallelism`` (default 1), never more than ``completions`` when it is set
    (kubernetes.io/docs/concepts/workloads/controllers/job, "Controlling parallelism": with a completion count, the
    pods running in parallel do not exceed the remaining completions; the same for completionMode Indexed)."""
    parallelism = count(obj, job_spec, "parallelism", path, 1)
    if job_spec.get("completions") is None:
        return parallelism
    return min(parallelism, count(obj, job_spec, "completions", path, 1))


def parse(doc: dict[str, Any], ctx: Context) -> Workload:
    obj, annotations = metadata(doc, "Job", ctx.source, ctx.configmaps)
    spec = get(obj, doc, "spec", (), dict, required=True, hint="a Job needs spec.template")
    parallelism = running_pods(obj, spec, ("spec",))
    template = get(
        obj,
        spec,
        "template",
        ("spec",),
        dict,
        required=True,
        hint="give the Job a pod template with its training container",
    )
    role = read_pod_template(obj, template, ("spec", "template"), "job", parallelism)
    return Workload(obj, annotations, [role], files=ctx.files, configmaps=ctx.configmaps)
