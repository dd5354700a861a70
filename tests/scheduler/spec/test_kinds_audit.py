"""How job objects are read into GPU counts, roles and pod templates, checked against each API's semantics
(an audit of the kind parsers; every case here was read wrongly, or crashed, before it was fixed)."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.errors import SpecError
from scheduler.spec.document import NoTrainingJob, ParsedJob
from tests.scheduler.spec.helpers import scan

ANNOTATION = {"vramfit.io/spec": "model: llama-3.2-1b"}


def container(resources: dict[str, Any] | None = None, name: str = "main", **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "example/train:1", **extra}
    if resources is not None:
        out["resources"] = resources
    return out


def gpus(n: int, name: str = "main", **extra: Any) -> dict[str, Any]:
    return container({"limits": {"nvidia.com/gpu": n}}, name, **extra)


def job(pod_spec: dict[str, Any], template_annotations: dict[str, str] | None = None,
        **spec: Any) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": pod_spec}
    if template_annotations:
        template["metadata"] = {"annotations": template_annotations}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "annotations": ANNOTATION},
            "spec": {**spec, "template": template}}


def only(doc: dict[str, Any]) -> ParsedJob | SpecError:
    outcomes = scan(doc)
    assert len(outcomes) == 1
    return outcomes[0]


def parsed(doc: dict[str, Any]) -> ParsedJob:
    outcome = only(doc)
    assert isinstance(outcome, ParsedJob), outcome
    return outcome


# --- devices that are not whole NVIDIA GPUs ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod_spec", "template_annotations", "named"),
    [
        ({"containers": [container({"limits": {"nvidia.com/mig-1g.10gb": 1}})]}, None,
         'limits["nvidia.com/mig-1g.10gb"] = 1'),
        ({"containers": [container({"limits": {"amd.com/gpu": 8}})]}, None, 'limits["amd.com/gpu"] = 8'),
        ({"containers": [container({"limits": {"nvidia.com/gpu.shared": 1}})]}, None, "nvidia.com/gpu.shared"),
        ({"containers": [container()]}, {"gpu-fraction": "0.5"},
         "gpu-fraction=0.5 in spec.template.metadata.annotations"),
        ({"containers": [container({"claims": [{"name": "gpu"}]})],
          "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}, None,
         "spec.template.spec.resourceClaims"),
        ({"containers": [gpus(1)], "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}},
         None, "a MIG slice"),
    ],
    ids=["mig", "amd", "time-sliced", "kai-fraction-on-template", "dra", "mig-single-strategy"],
)
def test_a_job_on_other_devices_is_not_sized_as_whole_gpus(
    pod_spec: dict[str, Any], template_annotations: dict[str, str] | None, named: str
) -> None:
    # before: gpus: auto from the annotation, and the webhook wrote nvidia.com/gpu limits into these pods (or, for
    # MIG single strategy, the slice was sized as a whole GPU)
    outcome = only(job(pod_spec, template_annotations))
    assert isinstance(outcome, NoTrainingJob), outcome
    assert named in str(outcome)
    assert "whole NVIDIA GPUs" in str(outcome)


def test_whole_gpus_beside_a_mig_role_are_counted_and_the_rest_noted() -> None:
    doc = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
           "metadata": {"name": "js", "annotations": ANNOTATION},
           "spec": {"replicatedJobs": [
               {"name": "trainer", "template": {"spec": {"template": {"spec": {"containers": [gpus(8)]}}}}},
               {"name": "eval", "template": {"spec": {"template": {"spec": {"containers": [
                   container({"limits": {"nvidia.com/mig-3g.40gb": 1}})]}}}}},
           ]}}
    job_ = parsed(doc)
    assert job_.spec.gpus == 8
    assert any("nvidia.com/mig-3g.40gb" in a and "not counted" in a for a in job_.assumptions)


def test_ray_num_gpus_on_amd_pods_is_not_read_as_nvidia_gpus() -> None:
    group = {"groupName": "amd", "replicas": 2, "rayStartParams": {"num-gpus": "8"},
             "template": {"spec": {"containers": [container({"limits": {"amd.com/gpu": 8}})]}}}
    doc = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc", "annotations": ANNOTATION},
           "spec": {"headGroupSpec": {"template": {"spec": {"containers": [container()]}}},
                    "workerGroupSpecs": [group]}}
    outcome = only(doc)
    assert isinstance(outcome, NoTrainingJob), outcome
    assert "amd.com/gpu" in str(outcome)


# --- requests and limits, quantities, sidecars ------------------------------------------------------------------


def test_a_gpu_request_that_differs_from_its_limit_is_an_error_naming_the_request() -> None:
    outcome = only(job({"containers": [container({"requests": {"nvidia.com/gpu": 1},
                                                  "limits": {"nvidia.com/gpu": 4}})]}))
    assert isinstance(outcome, SpecError) and not isinstance(outcome, NoTrainingJob)
    text = str(outcome)
    assert 'spec.template.spec.containers[0].resources.requests["nvidia.com/gpu"]' in text
    assert "is 1 but the limit is 4" in text


@pytest.mark.parametrize("value", ["2.0", "2e0", 2.0, "+2"])
def test_decimal_forms_of_a_whole_gpu_quantity_are_read(value: Any) -> None:
    assert parsed(job({"containers": [gpus(value)]})).spec.gpus == 2


@pytest.mark.parametrize("value", ["1.5", "500m", "2Ki", "-1"])
def test_fractional_or_suffixed_gpu_quantities_stay_errors(value: Any) -> None:
    outcome = only(job({"containers": [gpus(value)]}))
    assert isinstance(outcome, SpecError) and "must be a whole number of GPUs" in str(outcome)


def test_native_sidecar_gpus_add_to_the_app_containers() -> None:
    # an init container with restartPolicy: Always runs beside the app containers for the pod's life
    spec = {"containers": [gpus(4)], "initContainers": [gpus(1, "monitor", restartPolicy="Always")]}
    job_ = parsed(job(spec))
    assert (job_.spec.gpus, job_.pod_templates[0].gpus_per_pod) == (5, 5)


def test_a_plain_init_container_runs_beside_the_sidecars_started_before_it() -> None:
    spec = {"containers": [gpus(1)],
            "initContainers": [gpus(2, "proxy", restartPolicy="Always"), gpus(4, "warmup")]}
    assert parsed(job(spec)).pod_templates[0].gpus_per_pod == 6  # warmup 4 + proxy 2 > app 1 + proxy 2


# --- pod counts --------------------------------------------------------------------------------------------------


def test_a_job_runs_no_more_pods_than_its_completions() -> None:
    job_ = parsed(job({"containers": [gpus(1)]}, parallelism=8, completions=2, completionMode="Indexed"))
    assert (job_.spec.gpus, job_.pod_templates[0].replicas) == (2, 2)


def test_a_jobset_job_runs_no_more_pods_than_its_completions() -> None:
    doc = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
           "metadata": {"name": "js", "annotations": ANNOTATION},
           "spec": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": {
               "parallelism": 4, "completions": 1, "template": {"spec": {"containers": [gpus(8)]}}}}}]}}
    assert parsed(doc).spec.gpus == 16


def _raycluster(**group: Any) -> dict[str, Any]:
    worker = {"groupName": "gpu", "template": {"spec": {"containers": [gpus(1)]}}, **group}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc", "annotations": ANNOTATION},
            "spec": {"headGroupSpec": {"template": {"spec": {"containers": [container()]}}},
                     "workerGroupSpecs": [worker]}}


@pytest.mark.parametrize(
    ("group", "pods"),
    [
        ({"replicas": 10, "maxReplicas": 4}, 4),  # KubeRay lowers replicas to maxReplicas
        ({"replicas": 1, "minReplicas": 3, "maxReplicas": 5}, 3),  # and raises them to minReplicas
        ({"replicas": 2, "minReplicas": 2, "numOfHosts": 2}, 4),
    ],
)
def test_ray_worker_pods_follow_kuberay_min_and_max(group: dict[str, Any], pods: int) -> None:
    job_ = parsed(_raycluster(**group))
    assert job_.pod_templates[0].replicas == pods


@pytest.mark.parametrize("group", [{}, {"replicas": 4, "suspend": True}], ids=["no-replicas", "suspended"])
def test_a_ray_worker_group_without_replicas_or_suspended_has_no_pods(group: dict[str, Any]) -> None:
    # the CRD defaults replicas and minReplicas to 0 (before: 1 pod was counted); a suspended group has none
    doc = _raycluster(**group)
    doc["metadata"]["annotations"] = {}
    outcome = only(doc)
    assert isinstance(outcome, NoTrainingJob), outcome
    assert "0 replicas now" in str(outcome)


def test_a_rayjob_with_a_cluster_selector_ignores_its_cluster_spec() -> None:
    doc = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj", "annotations": ANNOTATION},
           "spec": {"entrypoint": "python train.py", "entrypointNumGpus": 2,
                    "clusterSelector": {"ray.io/cluster": "shared"},
                    "rayClusterSpec": _raycluster(replicas=8)["spec"]}}
    job_ = parsed(doc)
    assert job_.spec.gpus == 2 and job_.pod_templates == []
    assert any("clusterSelector" in a for a in job_.assumptions)


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        (job({"containers": [gpus(8)]}, parallelism=2**31), "spec.parallelism"),
        (job({"containers": [gpus(8)]}, parallelism=2**31 - 1), "spec.template.spec"),
    ],
    ids=["past-int32", "int32-but-no-cluster-that-large"],
)
def test_huge_pod_counts_are_errors_with_the_field(doc: dict[str, Any], where: str) -> None:
    outcome = only(doc)
    assert isinstance(outcome, SpecError) and not isinstance(outcome, NoTrainingJob)
    assert f"`{where}`" in str(outcome)


# --- malformed objects -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("affinity", "where"),
    [
        (["x"], "spec.template.spec.affinity"),
        ({"nodeAffinity": ["x"]}, "spec.template.spec.affinity.nodeAffinity"),
        ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}},
         "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"),
    ],
)
def test_a_malformed_affinity_is_an_error_not_a_crash(affinity: Any, where: str) -> None:
    outcome = only(job({"containers": [gpus(1)], "affinity": affinity}))  # before: AttributeError
    assert isinstance(outcome, SpecError)
    assert f"`{where}` must be a mapping" in str(outcome)


@pytest.mark.parametrize("device", ["amd.com/gpu", "nvidia.com/mig-1g.10gb"])
def test_a_trainjob_on_other_devices_is_not_sized_as_whole_gpus(device: str) -> None:
    # a TrainJob's resourcesPerNode escaped the device check: it read as a job with no nvidia.com/gpu
    doc = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "tj", "annotations": {"vramfit.io/spec": "model: llama-3.1-8b\n"}},
           "spec": {"runtimeRef": {"name": "torch-distributed"},
                    "trainer": {"numNodes": 2, "resourcesPerNode": {"limits": {device: 8}}}}}
    result = only(doc)
    assert isinstance(result, NoTrainingJob)
    assert f'spec.trainer.resourcesPerNode.limits["{device}"] = 8' in result.reason
