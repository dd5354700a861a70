"""Plain-dict manifests of every job kind the webhook reviews, and AdmissionReview helpers."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

REPO = Path(__file__).resolve().parents[2]


def fixtures_dir() -> Path:
    """The shared fixtures: beside the checkout, or beside the worktrees folder; skip when absent."""
    for base in (REPO.parent, REPO.parent.parent):
        if (base / "shared" / "fixtures").is_dir():
            return base / "shared" / "fixtures"
    pytest.skip("shared/fixtures not found beside the checkout")

SPEC_1B_LORA = "model: llama-3.2-1b\nmethod: lora\nprecision: bf16-true\ntrain_tokens: 50M\n"
SPEC_8B_LORA = "model: llama-3.1-8b\nmethod: lora\nprecision: bf16-true\nseq_len: 2048\ntrain_tokens: 50M\n"
SPEC_70B_ONE_GPU = "model: llama-3.1-70b\nmethod: full\nmicro_batch_size: 4\nseq_len: 4096\ngpus: 1\n"
SPEC_8B_FULL_AUTO = "model: llama-3.1-8b\nmethod: full\nsharding: fsdp\ntrain_tokens: 100M\ngpus: auto\n"
# A "billion laughs" YAML: nine anchors of ten aliases each, 10**9 nodes in 531 bytes of text.
ALIAS_BOMB = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'lol'] * 10)}]\n" for i in range(9))


def meta(name: str, spec: str = SPEC_8B_LORA, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": "team-a", "annotations": {"vramfit.io/spec": spec}, **extra}


def container(name: str = "train", gpus: int | None = 1) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "ghcr.io/example/train:1", "command": ["python", "train.py"]}
    if gpus is not None:
        c["resources"] = {"limits": {"nvidia.com/gpu": gpus, "memory": "64Gi"}}
    return c


def pod_spec(gpus: int | None = 1, **extra: Any) -> dict[str, Any]:
    return {"restartPolicy": "Never", "containers": [container(gpus=gpus)], **extra}


def pod(gpus: int | None = 1, spec: str = SPEC_8B_LORA, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta("trainer", spec), "spec": pod_spec(gpus, **extra)}


def batch_job(gpus: int | None = 1, spec: str = SPEC_8B_LORA) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta("ft", spec),
            "spec": {"backoffLimit": 0, "template": {"spec": pod_spec(gpus)}}}


def jobset(gpus: int | None = 1, spec: str = SPEC_8B_LORA) -> dict[str, Any]:
    job = {"replicas": 2, "name": "trainer", "template": {"spec": {"parallelism": 1, "completions": 1,
                                                                    "template": {"spec": pod_spec(gpus)}}}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta("js", spec),
            "spec": {"replicatedJobs": [job]}}


def pytorchjob(gpus: int | None = 1, spec: str = SPEC_8B_LORA) -> dict[str, Any]:
    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": pod_spec(gpus)}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta("pt", spec),
            "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(1)}}}


def trainjob(gpus: int | None = 1, spec: str = SPEC_8B_LORA) -> dict[str, Any]:
    trainer: dict[str, Any] = {"numNodes": 1}
    if gpus is not None:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": meta("tj", spec),
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer}}


def _ray_cluster(gpus: int | None) -> dict[str, Any]:
    head = {"rayStartParams": {}, "template": {"spec": {"containers": [container("ray-head", None)]}}}
    worker = {"groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 1, "rayStartParams": {},
              "template": {"spec": {"containers": [container("ray-worker", gpus)]}}}
    return {"headGroupSpec": head, "workerGroupSpecs": [worker]}


def raycluster(gpus: int | None = 1, spec: str = SPEC_8B_LORA) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": meta("rc", spec),
            "spec": _ray_cluster(gpus)}


def rayjob(gpus: int | None = 1, spec: str = SPEC_8B_LORA) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta("rj", spec),
            "spec": {"entrypoint": "python train.py", "rayClusterSpec": _ray_cluster(gpus)}}


def volcano_job(gpus: int | None = 1, spec: str = SPEC_8B_LORA) -> dict[str, Any]:
    launcher = {"name": "launcher", "replicas": 1, "template": {"spec": pod_spec(None)}}
    worker = {"name": "worker", "replicas": 2, "template": {"spec": pod_spec(gpus)}}
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": meta("vc", spec),
            "spec": {"minAvailable": 3, "schedulerName": "volcano", "tasks": [launcher, worker]}}


# kind -> (builder, pointers of the GPU pod specs, pointers of pod specs that must stay untouched)
KINDS: dict[str, tuple[Any, list[str], list[str]]] = {
    "Pod": (pod, ["/spec"], []),
    "Job": (batch_job, ["/spec/template/spec"], []),
    "JobSet": (jobset, ["/spec/replicatedJobs/0/template/spec/template/spec"], []),
    "PyTorchJob": (pytorchjob, ["/spec/pytorchReplicaSpecs/Master/template/spec",
                                "/spec/pytorchReplicaSpecs/Worker/template/spec"], []),
    "TrainJob": (trainjob, [], []),
    "RayCluster": (raycluster, ["/spec/workerGroupSpecs/0/template/spec"], ["/spec/headGroupSpec/template/spec"]),
    "RayJob": (rayjob, ["/spec/rayClusterSpec/workerGroupSpecs/0/template/spec"],
               ["/spec/rayClusterSpec/headGroupSpec/template/spec"]),
    "VolcanoJob": (volcano_job, ["/spec/tasks/1/template/spec"], ["/spec/tasks/0/template/spec"]),
}


def admission_review(obj: Any, uid: str = "req-1", operation: str = "CREATE", dry_run: bool = False,
                     **request: Any) -> dict[str, Any]:
    """An AdmissionReview v1 request as the API server sends it."""
    fields = obj if isinstance(obj, dict) else {}
    kind, api = str(fields.get("kind") or ""), str(fields.get("apiVersion") or "v1")
    group, _, version = api.rpartition("/")
    meta = fields.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    namespace = namespace if isinstance(namespace, str) and namespace else "default"
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": dry_run,
            **request,
        },
    }


def patch_ops(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The decoded JSON Patch of an AdmissionReview response (empty when there is none)."""
    body = response["response"]
    if "patch" not in body:
        return []
    assert body["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(body["patch"]))


def apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    return jsonpatch.apply_patch(copy.deepcopy(obj), ops)


def at(doc: Any, pointer: str) -> Any:
    """The value at a JSON pointer (raises when missing)."""
    return jsonpatch.JsonPointer(pointer).resolve(doc)
