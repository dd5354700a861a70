"""The table of job-kind parsers. Adding a kind is adding a file and a row here.

Every parser is ``parse(doc, context) -> Workload`` (see :mod:`scheduler.spec.merge`), keyed by
(apiVersion group, kind); the core group is ``""``. A document with no ``kind`` and an ``entrypoint``
is a Ray Jobs submission. Objects that are valid but train nothing by themselves (ConfigMaps, training
runtimes, Services...) are reported as :class:`NoTrainingJob`; an AdmissionReview is unwrapped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from predictors.errors import SpecError
from scheduler.spec import (
    batch_job,
    jobset,
    pod,
    pytorchjob,
    ray_submission,
    raycluster,
    rayjob,
    trainjob,
    volcano,
)
from scheduler.spec.document import NoTrainingJob, ParsedJob, not_a_mapping, parse_document
from scheduler.spec.merge import Context, Workload, build_job

Parser = Callable[[dict[str, Any], Context], Workload]

PARSERS: dict[tuple[str, str], Parser] = {
    ("", "Pod"): pod.parse,
    ("batch", "Job"): batch_job.parse,
    ("jobset.x-k8s.io", "JobSet"): jobset.parse,
    ("kubeflow.org", "PyTorchJob"): pytorchjob.parse,
    ("trainer.kubeflow.org", "TrainJob"): trainjob.parse,
    ("ray.io", "RayJob"): rayjob.parse,
    ("ray.io", "RayCluster"): raycluster.parse,
    ("batch.volcano.sh", "Job"): volcano.parse,
}
RAY_SUBMISSION: Parser = ray_submission.parse

# Valid objects that train nothing themselves, and why (they often sit in the same file as a job).
NOT_TRAINING: dict[str, str] = {
    **dict.fromkeys(
        (
            "ConfigMap",
            "Secret",
            "Service",
            "ServiceAccount",
            "Namespace",
            "PersistentVolumeClaim",
            "PersistentVolume",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
            "PriorityClass",
            "NetworkPolicy",
            "Ingress",
            "StorageClass",
            "ResourceQuota",
            "LimitRange",
            "LocalQueue",
            "ClusterQueue",
            "ResourceFlavor",
            "Queue",
            "PodGroup",
            # objects that travel with GPU jobs: Dynamic Resource Allocation (resource.k8s.io), NVIDIA's
            # ComputeDomain for multi-node NVLink (GB200), Kueue's ProvisioningRequest and its PodTemplate,
            # autoscaling and disruption settings
            "ResourceClaimTemplate",
            "ResourceClaim",
            "DeviceClass",
            "ResourceSlice",
            "ComputeDomain",
            "PodTemplate",
            "ProvisioningRequest",
            "PodDisruptionBudget",
            "HorizontalPodAutoscaler",
            "Workload",
            "Topology",
            "AdmissionCheck",
            "WorkloadPriorityClass",
        ),
        "is not a workload",
    ),
    **dict.fromkeys(
        ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "RayService"),
        "is a long-running service, not a training job",
    ),
    **dict.fromkeys(
        trainjob.RUNTIME_KINDS,
        "is a template that TrainJobs reference; it is read together with a TrainJob that names "
        "it (same file, or vramfit parse --runtime FILE)",
    ),
}


def _group(api_version: Any) -> str:
    text = str(api_version or "")
    return text.split("/", 1)[0] if "/" in text else ""


def _context(source: str, docs: Sequence[Any]) -> Context:
    """ConfigMap data (by key: the file names a container mounts) and training runtimes of the file."""
    ctx = Context(source=source)
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        kind = doc.get("kind")
        name = (
            str((doc.get("metadata") or {}).get("name") or "")
            if isinstance(doc.get("metadata"), dict)
            else ""
        )
        if kind == "ConfigMap" and isinstance(doc.get("data"), dict):
            data = {str(k): str(v) for k, v in doc["data"].items()}
            ctx.files.update(data)
            ctx.configmaps.setdefault(name, {}).update(data)
        elif kind in trainjob.RUNTIME_KINDS and _group(doc.get("apiVersion")) == "trainer.kubeflow.org":
            ctx.runtimes[(str(kind), name)] = doc
    return ctx


def _describe(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return f"{doc.get('kind')} {meta.get('name') or ''}".strip()


def _supported() -> str:
    return (
        ", ".join(f"{group + '/' if group else ''}{kind}" for group, kind in PARSERS)
        + ", Ray Jobs submission"
    )


def find_parser(doc: dict[str, Any], source: str) -> Parser:
    kind = doc.get("kind")
    if kind is None and "entrypoint" in doc:
        return RAY_SUBMISSION
    group = _group(doc.get("apiVersion"))
    parser = PARSERS.get((group, str(kind)))
    if parser is not None:
        return parser
    same_kind = [g for g, k in PARSERS if k == kind]
    if "apiVersion" not in doc and len(same_kind) == 1:  # lenient: a missing apiVersion, one match
        return PARSERS[(same_kind[0], str(kind))]
    hint = (
        f"kind {kind} is read in apiVersion group {' or '.join(repr(g) for g in same_kind)}"
        if same_kind
        else f"supported kinds: {_supported()}; or write a TrainingSpec (with `model:`)"
    )
    api = doc.get("apiVersion")
    shown = (f"{kind!r} ({f'apiVersion {api!r}' if api is not None else 'no apiVersion'})" if kind is not None
             else "none")
    raise SpecError.one(
        "kind",
        f"{'unsupported kind ' + shown if kind is not None else 'is missing'}",
        hint,
        f"{source}: {_describe(doc)}" if kind is not None else source,
    )


def parse_object(doc: Any, source: str, base_dir: Path | None, context: Sequence[Any] = ()) -> ParsedJob:
    """One job object -> ParsedJob; NoTrainingJob for objects that train nothing; SpecError otherwise."""
    if not isinstance(doc, dict):
        raise not_a_mapping(doc, "", source)
    kind = doc.get("kind")
    if (
        isinstance(kind, str)
        and kind in NOT_TRAINING
        and (_group(doc.get("apiVersion")), kind) not in PARSERS
    ):
        raise NoTrainingJob(_describe(doc), NOT_TRAINING[kind], source)
    if kind == "AdmissionReview":
        return _admission_review(doc, source, base_dir)
    parser = find_parser(doc, source)
    workload = parser(doc, _context(source, [doc, *context]))
    _check_unsized_devices(workload)
    _check_job_size(workload)
    return build_job(workload, base_dir)


# More GPUs than any Kubernetes cluster holds: GKE, the largest documented, allows 65,000 nodes (cloud.google.com
# /kubernetes-engine/quotas) and no node has more than 16 GPUs (pods.MAX_GPUS_PER_POD is looser). Past this a
# count is a typo (replicas x parallelism of two int32s reach 4.6e18 pods), not a job to predict or place.
MAX_JOB_GPUS = 65_000 * 16


def _check_job_size(w: Workload) -> None:
    total = sum(r.gpus for r in w.roles if r.gpus_per_pod)
    if total <= MAX_JOB_GPUS:
        return
    role = max((r for r in w.roles if r.gpus_per_pod), key=lambda r: r.gpus)
    raise w.obj.error(
        role.path,
        f"makes {role.replicas:,} pods x {role.gpus_per_pod} GPUs ({total:,} GPUs in the job); no cluster has more "
        f"than {MAX_JOB_GPUS:,} GPUs",
        "check the replicas / parallelism / numOfHosts of the role",
    )


def _check_unsized_devices(w: Workload) -> None:
    """A job whose pods get devices other than whole NVIDIA GPUs (a MIG slice, a KAI share of a GPU, AMD GPUs,
    DRA claims) is not sized: vramfit's catalog and placement deal in whole NVIDIA GPUs, and sizing it as such
    (``gpus: auto`` even writes ``nvidia.com/gpu`` into its pods) would place it wrongly. With whole GPUs in other
    roles, those are sized and the rest is noted."""
    unsized = [item for r in w.roles for item in r.unsized]
    if not unsized:
        return
    if any(r.gpus_per_pod for r in w.roles):
        w.notes.append(f"not counted (not whole NVIDIA GPUs): {'; '.join(unsized)}")
        return
    raise NoTrainingJob(
        w.obj.ref,
        f"asks for GPU devices vramfit does not size: {'; '.join(unsized)}; vramfit sizes and places jobs on whole "
        "NVIDIA GPUs (nvidia.com/gpu)",
        w.obj.source,
    )


def _admission_review(doc: dict[str, Any], source: str, base_dir: Path | None) -> ParsedJob:
    """The object of an AdmissionReview request. Kinds vramfit does not read pass as NoTrainingJob
    (the webhook lets them through), unlike in a file, where an unknown kind is an error."""
    request = doc.get("request")
    obj = request.get("object") if isinstance(request, dict) else None
    label = f"{source}: AdmissionReview"
    if not isinstance(obj, dict):
        raise SpecError.one(
            "request.object", "is missing; an AdmissionReview request carries the object", source=label
        )
    try:
        jobs = parse_document(obj, label, base_dir)
    except NoTrainingJob:
        raise
    except SpecError as exc:
        if exc.problems and exc.problems[0].path == "kind" and len(exc.problems) == 1:
            raise NoTrainingJob(
                f"AdmissionReview request.object {_describe(obj)}",
                f"kind {obj.get('kind')!r} (apiVersion {obj.get('apiVersion') or 'none'!r}) is not a kind "
                "vramfit reads",
                source,
            ) from None
        raise
    return jobs[0]
