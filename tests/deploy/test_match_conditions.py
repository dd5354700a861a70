"""The webhooks' CEL matchConditions, evaluated on sample requests.

Uses cel-python, a CEL implementation other than the API server's cel-go; these expressions use
only core CEL (field access, has(), `in` on a map and a list, exists()). cel-python is in the dev extra;
skipped where it is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import load_documents

celpy = pytest.importorskip("celpy", reason="cel-python not installed (pip install cel-python)")

WEBHOOKS = Path(__file__).resolve().parents[2] / "deploy" / "60-webhooks.yaml"


def pod_spec(limits: dict[str, str] | None) -> dict[str, Any]:
    sidecar: dict[str, Any] = {"name": "log-shipper"}
    trainer: dict[str, Any] = {"name": "trainer", "resources": {"limits": limits} if limits is not None else {}}
    return {"containers": [sidecar, trainer]}


GPU = {"nvidia.com/gpu": "8", "cpu": "32"}
CPU = {"cpu": "2", "memory": "4Gi"}

ANNOTATED = {"annotations": {"vramfit.io/spec": "model: llama-3.1-8b\ngpus: auto"}}


def owned_by(kind: str) -> dict[str, Any]:
    return {"ownerReferences": [{"apiVersion": "x/v1", "kind": kind, "name": "p", "uid": "u", "controller": True}]}


def job(limits: dict[str, str] | None, decision_id: str | None = None) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": pod_spec(limits)}
    if decision_id:
        template["metadata"] = {"annotations": {"vramfit.io/decision-id": decision_id}}
    return {"template": template}


CASES = [
    # (group, resource, object, sent to the webhook?)
    ("", "pods", {"metadata": {}, "spec": pod_spec(GPU)}, True),
    ("", "pods", {"metadata": {}, "spec": pod_spec(CPU)}, False),
    ("", "pods", {"metadata": {}, "spec": pod_spec(None)}, False),
    ("", "pods", {"metadata": ANNOTATED, "spec": pod_spec(None)}, True),  # gpus: auto in the annotation only
    ("", "pods", {"metadata": owned_by("ReplicaSet"), "spec": pod_spec(GPU)}, False),  # any controller's pod
    ("batch", "jobs", {"metadata": {}, "spec": job(GPU)}, True),
    ("batch", "jobs", {"metadata": {}, "spec": job(CPU)}, False),
    ("batch", "jobs", {"metadata": ANNOTATED, "spec": job(CPU)}, True),
    ("batch", "jobs", {"metadata": owned_by("JobSet"), "spec": job(GPU, "abc-123")}, False),  # placed with its JobSet
    ("batch", "jobs", {"metadata": owned_by("JobSet"), "spec": job(GPU)}, True),  # its JobSet was not placed
    ("batch", "jobs", {"metadata": owned_by("CronJob"), "spec": job(GPU, "abc-123")}, True),  # not a JobSet's
    ("batch.volcano.sh", "jobs", {"metadata": {}, "spec": {"tasks": [{"template": {"spec": pod_spec(CPU)}}]}},
     True),
    ("ray.io", "rayjobs", {"metadata": {}, "spec": {"rayClusterSpec": {}}}, True),
    ("ray.io", "rayclusters", {"metadata": owned_by("RayJob"), "spec": {}}, True),  # the webhook looks inside
    ("jobset.x-k8s.io", "jobsets", {"metadata": owned_by("TrainJob"), "spec": {}}, True),
    ("kubeflow.org", "pytorchjobs", {"metadata": {}, "spec": {"pytorchReplicaSpecs": {}}}, True),
]


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
@pytest.mark.parametrize(("group", "resource", "obj", "sent"), CASES)
def test_match_conditions(kind: str, group: str, resource: str, obj: dict[str, Any], sent: bool) -> None:
    config = next(d for d in load_documents(WEBHOOKS.read_text()) if d["kind"] == kind)
    environment = celpy.Environment()
    activation = {
        "request": celpy.json_to_cel({"resource": {"group": group, "version": "v1", "resource": resource}}),
        "object": celpy.json_to_cel(obj),
    }
    results = [
        bool(environment.program(environment.compile(c["expression"])).evaluate(activation))
        for c in config["webhooks"][0]["matchConditions"]
    ]
    assert all(results) is sent

