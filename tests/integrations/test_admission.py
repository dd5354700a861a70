"""Admission as a pure function: plain AdmissionReview dicts in, responses out, over every job kind."""

from __future__ import annotations

import ast
import copy
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from scheduler.integrations import admission as admission_module
from scheduler.integrations.admission import AdmissionSettings, MalformedReview, admit, check_review, review
from scheduler.integrations.patches import Patch, escape, resolve
from scheduler.pools import parse_pools
from tests.integrations.manifests import (
    ALIAS_BOMB,
    KINDS,
    SPEC_1B_LORA,
    SPEC_8B_FULL_AUTO,
    SPEC_8B_LORA,
    SPEC_70B_ONE_GPU,
    admission_review,
    apply,
    at,
    batch_job,
    fixtures_dir,
    jobset,
    patch_ops,
    pod,
    pytorchjob,
    raycluster,
    rayjob,
    trainjob,
    volcano_job,
)
from tests.integrations.manifests import (
    pod_spec as plain_pod_spec,
)

NOW = datetime(2025, 1, 1, tzinfo=timezone.utc)
ANNOTATIONS = ("pool", "predicted-peak-vram-bytes", "predicted-peak-vram-upper-bytes", "predicted-runtime-seconds",
               "predicted-cost-usd", "model-version", "decision-id")
# Two pools with distinct labels and tolerations, so every assertion says which pool was chosen.
POOLS = parse_pools({"pools": [
    {"name": "small", "gpu": "L4", "gpus_per_node": 8, "nodes": 2, "price_usd_per_gpu_hour": 0.8,
     "node_selector": {"pool": "small"}, "tolerations": [{"key": "small", "operator": "Exists"}]},
    {"name": "big", "gpu": "H100-80GB", "gpus_per_node": 8, "nodes": 4, "price_usd_per_gpu_hour": 3.0,
     "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "big"},
     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
]})


def run(obj: Any, webhook: str = "mutate", settings: AdmissionSettings | None = None, **request: Any) -> dict:
    return review(admission_review(obj, **request), settings, POOLS, NOW, webhook=webhook)  # type: ignore[arg-type]


def body(response: dict[str, Any]) -> dict[str, Any]:
    assert response["apiVersion"] == "admission.k8s.io/v1" and response["kind"] == "AdmissionReview"
    return response["response"]


@pytest.mark.parametrize("kind", list(KINDS))
def test_mutate_places_every_gpu_template_and_is_idempotent(kind: str) -> None:
    build, gpu_specs, untouched = KINDS[kind]
    obj = build()
    response = run(obj)
    assert body(response)["uid"] == "req-1" and body(response)["allowed"] is True
    patched = apply(obj, patch_ops(response))
    annotations = patched["metadata"]["annotations"]
    pool = annotations["vramfit.io/pool"]
    assert pool in ("small", "big")
    wanted = next(p for p in POOLS.pools if p.name == pool)
    assert {f"vramfit.io/{k}" for k in ANNOTATIONS} <= set(annotations)
    assert annotations["vramfit.io/spec"] == obj["metadata"]["annotations"]["vramfit.io/spec"]  # kept
    assert int(annotations["vramfit.io/predicted-peak-vram-upper-bytes"]) >= int(
        annotations["vramfit.io/predicted-peak-vram-bytes"])
    for ptr in gpu_specs:
        assert at(patched, f"{ptr}/nodeSelector") == wanted.node_selector
        assert at(patched, f"{ptr}/tolerations") == [t.model_dump(exclude_none=True) for t in wanted.tolerations]
        if ptr != "/spec":
            meta = at(patched, ptr.removesuffix("/spec") + "/metadata")
            assert meta["annotations"]["vramfit.io/decision-id"] == annotations["vramfit.io/decision-id"]
    for ptr in untouched:
        assert "nodeSelector" not in at(patched, ptr) and "tolerations" not in at(patched, ptr)
    if kind == "TrainJob":
        (entry,) = patched["spec"]["runtimePatches"]
        assert entry["manager"] == "vramfit.io/admission"
        pod_spec = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
            "template"]["spec"]
        assert pod_spec["nodeSelector"] == wanted.node_selector
    # a second review of the patched object changes nothing and keeps the decision id
    again = run(patched, uid="req-2")
    assert patch_ops(again) == []
    assert body(again)["auditAnnotations"]["decision-id"] == annotations["vramfit.io/decision-id"]


@pytest.mark.parametrize("kind", list(KINDS))
def test_validate_allows_a_fitting_job_without_patching(kind: str) -> None:
    response = body(run(KINDS[kind][0](), webhook="validate"))
    assert response["allowed"] is True and "patch" not in response
    assert response["auditAnnotations"]["decision"] == "placed"


@pytest.mark.parametrize("kind", list(KINDS))
def test_job_that_fits_no_pool_is_denied_with_reasons_per_pool_and_a_fix(kind: str) -> None:
    obj = KINDS[kind][0](spec=SPEC_70B_ONE_GPU)
    response = body(run(obj, webhook="validate"))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert response["status"]["code"] == 403
    assert "fits no node pool" in message
    for pool in POOLS.pools:
        assert f"  - {pool.name}: " in message
    assert "To fix: " in message and "-> fits on " in message
    # /mutate lets it through with only the decision id, so /validate (another request uid) records the
    # same decision; /validate is the one that denies and says why (kubectl shows it once).
    response = run(obj, uid="mutate-uid")
    mutated = body(response)
    assert mutated["allowed"] is True and not mutated.get("warnings")
    ops = patch_ops(response)
    assert {op["path"] for op in ops} <= {"/metadata/annotations", "/metadata/annotations/vramfit.io~1decision-id",
                                          "/metadata/annotations/vramfit.io~1outcome"}
    validated = body(review(admission_review(apply(obj, ops), uid="validate-uid"), None, POOLS, NOW,
                            webhook="validate"))
    assert validated["allowed"] is False
    assert validated["auditAnnotations"]["decision-id"] == mutated["auditAnnotations"]["decision-id"]


@pytest.mark.parametrize(
    ("build", "gpu_spec", "counts"),
    [
        (pod, "/spec", {}),
        (batch_job, "/spec/template/spec", {"/spec/parallelism": lambda n: n}),
        (pytorchjob, "/spec/pytorchReplicaSpecs/Worker/template/spec",
         {"/spec/pytorchReplicaSpecs/Worker/replicas": lambda n: n - 1}),
        (raycluster, "/spec/workerGroupSpecs/0/template/spec",
         {"/spec/workerGroupSpecs/0/replicas": lambda n: n, "/spec/workerGroupSpecs/0/minReplicas": lambda n: n}),
        (volcano_job, "/spec/tasks/1/template/spec", {"/spec/tasks/1/replicas": lambda n: n}),
        (trainjob, "/spec/trainer/resourcesPerNode", {"/spec/trainer/numNodes": lambda n: n}),
    ],
)
def test_gpus_auto_sets_the_gpu_count_to_the_decision(build: Any, gpu_spec: str, counts: dict[str, Any]) -> None:
    obj = build(gpus=None, spec=SPEC_8B_FULL_AUTO)
    result = admit(admission_review(obj), None, POOLS, NOW)
    assert result.record is not None
    total = result.record["gpus"]
    gpus_per_node = next(p.gpus_per_node for p in POOLS.pools if p.name == result.record["pool"])
    per_pod = min(total, gpus_per_node)
    pods = total // per_pod
    patched = apply(obj, patch_ops(result.response))
    limits = gpu_spec + ("/limits" if obj["kind"] == "TrainJob" else "/containers/0/resources/limits")
    assert at(patched, f"{limits}/nvidia.com~1gpu") == str(per_pod)
    for ptr, value in counts.items():
        assert at(patched, ptr) == value(pods)
    assert patch_ops(run(patched, uid="again")) == []


def test_existing_annotations_are_added_to_with_escaped_keys() -> None:
    obj = pod()
    obj["metadata"]["annotations"]["team/owner~x"] = "ml"
    ops = patch_ops(run(obj))
    paths = [op["path"] for op in ops]
    assert "/metadata/annotations/vramfit.io~1pool" in paths
    assert all(op["op"] == "add" for op in ops)
    assert apply(obj, ops)["metadata"]["annotations"]["team/owner~x"] == "ml"


def test_pointer_escaping_follows_rfc_6901() -> None:
    assert escape("a/b~c") == "a~1b~0c"
    patch = Patch({"metadata": {"annotations": {}}})
    patch.annotations("/metadata", {"x.io/a~b": "1"})
    assert patch.ops == [{"op": "add", "path": "/metadata/annotations/x.io~1a~0b", "value": "1"}]
    assert resolve(patch.doc, "/metadata/annotations/x.io~1a~0b") == "1"


def test_missing_parents_are_created_in_one_add() -> None:
    patch = Patch({"spec": {}})
    patch.put("/spec/trainer/resourcesPerNode/limits/nvidia.com~1gpu", "2")
    patch.put("/spec/trainer/numNodes", 4)
    assert patch.ops == [
        {"op": "add", "path": "/spec/trainer", "value": {"resourcesPerNode": {"limits": {"nvidia.com/gpu": "2"}}}},
        {"op": "add", "path": "/spec/trainer/numNodes", "value": 4},
    ]


def test_user_node_selector_entries_and_tolerations_are_kept() -> None:
    obj = batch_job()
    spec = obj["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"team": "nlp"}
    spec["tolerations"] = [{"key": "team", "operator": "Equal", "value": "nlp", "effect": "NoSchedule"}]
    ops = patch_ops(run(obj))
    assert not [op for op in ops if op["op"] != "add"]
    patched = apply(obj, ops)
    selector = patched["spec"]["template"]["spec"]["nodeSelector"]
    assert selector["team"] == "nlp" and "pool" in selector
    tolerations = patched["spec"]["template"]["spec"]["tolerations"]
    assert tolerations[0] == spec["tolerations"][0] and len(tolerations) == 2


def test_pinned_gpu_is_respected_and_a_cheaper_pool_is_warned_about() -> None:
    obj = batch_job(spec=SPEC_1B_LORA)  # fits both pools; the H100 finishes it for less
    obj["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    ops = patch_ops(run(obj))
    patched = apply(obj, ops)
    assert patched["metadata"]["annotations"]["vramfit.io/pool"] == "small"
    assert patched["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert "tolerations" not in patched["spec"]["template"]["spec"]
    warnings = body(run(obj, webhook="validate"))["warnings"]
    assert any("pins L4 (small)" in w and "big (1 x H100-80GB) would fit for less" in w for w in warnings)
    unpinned = body(run(batch_job(spec=SPEC_1B_LORA), webhook="validate"))
    assert unpinned["auditAnnotations"]["pool"] == "big"
    assert not any("would fit for less" in w for w in unpinned.get("warnings", []))


def test_pinned_pool_label_restricts_placement() -> None:
    obj = batch_job()
    obj["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "big"}
    patched = apply(obj, patch_ops(run(obj)))
    assert patched["metadata"]["annotations"]["vramfit.io/pool"] == "big"
    assert patched["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "big"}


def test_kueue_job_gets_the_flavor_label_only() -> None:
    obj = batch_job()
    obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    settings = AdmissionSettings(kueue=True, kueue_flavor_label_key="example.com/flavor")
    patched = apply(obj, patch_ops(run(obj, settings=settings)))
    pool = patched["metadata"]["annotations"]["vramfit.io/pool"]
    assert patched["spec"]["template"]["spec"]["nodeSelector"] == {"example.com/flavor": pool}
    assert "tolerations" not in patched["spec"]["template"]["spec"]
    assert patch_ops(run(patched, settings=settings, uid="again")) == []


def test_kueue_flavor_value_comes_from_the_pool_label_when_it_has_that_key() -> None:
    obj = batch_job()
    obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    settings = AdmissionSettings(kueue=True, kueue_flavor_label_key="pool")
    patched = apply(obj, patch_ops(run(obj, settings=settings)))
    pool = patched["metadata"]["annotations"]["vramfit.io/pool"]
    assert patched["spec"]["template"]["spec"]["nodeSelector"] == {"pool": pool}


def test_kueue_jobs_are_patched_like_any_other_unless_the_integration_is_on() -> None:
    obj = batch_job()
    obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    patched = apply(obj, patch_ops(run(obj)))
    wanted = next(p for p in POOLS.pools if p.name == patched["metadata"]["annotations"]["vramfit.io/pool"])
    assert patched["spec"]["template"]["spec"]["nodeSelector"] == wanted.node_selector
    assert patched["spec"]["template"]["spec"]["tolerations"]


def test_trainjob_pod_template_overrides_setting() -> None:
    obj = trainjob()
    settings = AdmissionSettings(trainjob_patch_field="podTemplateOverrides")
    patched = apply(obj, patch_ops(run(obj, settings=settings)))
    (entry,) = patched["spec"]["podTemplateOverrides"]
    assert entry["targetJobs"] == [{"name": "node"}] and "nodeSelector" in entry["spec"]
    assert "runtimePatches" not in patched["spec"]


def trainer_jobset(trainjob_obj: dict[str, Any]) -> dict[str, Any]:
    """The JobSet the Trainer builds from a TrainJob on a one-role runtime (replicated job ``node``): the
    runtime's pod template with the TrainJob's resources, then its runtimePatches / podTemplateOverrides for
    ``node`` merged in (metadata annotations, nodeSelector, tolerations), owned by the TrainJob."""
    gpus = trainjob_obj["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"]
    pod_template: dict[str, Any] = {"metadata": {}, "spec": plain_pod_spec(int(gpus))}
    overrides = [o for o in trainjob_obj["spec"].get("podTemplateOverrides", [])
                 if {"name": "node"} in o["targetJobs"]]
    for patch_entry in trainjob_obj["spec"].get("runtimePatches", []):
        for job in patch_entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            if job["name"] == "node":
                overrides.append(job["template"]["spec"]["template"])
    for override in overrides:
        for key, value in override.get("metadata", {}).get("annotations", {}).items():
            pod_template["metadata"].setdefault("annotations", {})[key] = value
        pod_template["spec"].update(override.get("spec", {}))
    job = {"name": "node", "replicas": 1, "template": {"spec": {"template": pod_template}}}
    built = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
             "metadata": {"name": "tj", "namespace": "team-a"}, "spec": {"replicatedJobs": [job]}}
    return owned(built, "trainer.kubeflow.org/v1alpha1", "TrainJob")


H100_PIN = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.mark.parametrize("field", ["runtimePatches", "podTemplateOverrides"])
@pytest.mark.parametrize("pinned", [False, True])
def test_the_jobset_of_a_placed_trainjob_is_not_placed_again(field: str, pinned: bool) -> None:
    """The decision id reaches the JobSet the Trainer builds, through either field, also when the TrainJob pins
    its GPU itself (a podTemplateOverrides nodeSelector): vramfit adds only the id then."""
    settings = AdmissionSettings(trainjob_patch_field=field)  # type: ignore[arg-type]
    obj = trainjob()
    if pinned:
        obj["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}], "spec": {"nodeSelector": H100_PIN}}]
    patched = apply(obj, patch_ops(run(obj, settings=settings)))
    decision_id = patched["metadata"]["annotations"]["vramfit.io/decision-id"]
    assert patched["metadata"]["annotations"]["vramfit.io/pool"] == "big"
    built = trainer_jobset(patched)
    template = built["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert template["metadata"]["annotations"]["vramfit.io/decision-id"] == decision_id
    wanted = H100_PIN if pinned else next(p for p in POOLS.pools if p.name == "big").node_selector
    assert template["spec"]["nodeSelector"] == wanted
    for webhook in ("mutate", "validate"):
        response = body(run(built, webhook=webhook, settings=settings))
        assert "patch" not in response, webhook
        assert f"which vramfit placed (decision {decision_id})" in response["auditAnnotations"]["skipped"]
    # A second review of the placed TrainJob changes nothing (the same entries, the same decision id).
    assert patch_ops(run(patched, settings=settings, uid="again")) == []


def test_a_trainer_jobset_the_webhook_cannot_size_is_still_its_placed_parents() -> None:
    """No model in the JobSet (the Trainer copies pod templates, not the vramfit.io/spec annotation): with
    unreadable_job=deny it was denied, so the placed TrainJob never started."""
    settings = AdmissionSettings(unreadable_job="deny")
    obj = trainjob()
    built = trainer_jobset(apply(obj, patch_ops(run(obj, settings=settings))))
    assert "annotations" not in built["metadata"]
    response = body(run(built, webhook="validate", settings=settings))
    assert response["allowed"] is True and "which vramfit placed" in response["auditAnnotations"]["skipped"]
    template = built["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    del template["metadata"]["annotations"]  # a parent vramfit did not place: the same JobSet is denied
    assert body(run(built, webhook="validate", settings=settings))["allowed"] is False


def test_pods_of_a_controller_are_not_placed_twice() -> None:
    obj = pod()
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "ft", "uid": "u",
                                          "controller": True}]
    response = body(run(obj))
    assert response["allowed"] is True and "patch" not in response
    assert "Job ft" in response["auditAnnotations"]["skipped"]
    assert any("Job ft" in w for w in response["warnings"])
    templated = pod()
    templated["metadata"]["annotations"]["vramfit.io/decision-id"] = "abc-123"
    response = body(run(templated))
    assert "patch" not in response and "abc-123" in response["auditAnnotations"]["skipped"]


def owned(obj: dict[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    obj["metadata"]["ownerReferences"] = [{"apiVersion": api_version, "kind": kind, "name": "parent", "uid": "u",
                                           "controller": True}]
    return obj


def with_decision_id(obj: dict[str, Any], decision_id: str = "abc-123") -> dict[str, Any]:
    """``obj`` with the decision id in each GPU pod template's annotations, as its placed parent's patch left it."""
    from scheduler.spec.registry import parse_object

    for t in parse_object(obj, "test", None).pod_templates:
        parent = at(obj, t.pointer.removesuffix("/spec"))
        parent.setdefault("metadata", {}).setdefault("annotations", {})["vramfit.io/decision-id"] = decision_id
    return obj


PARENTS = [
    (batch_job, ("jobset.x-k8s.io/v1alpha2", "JobSet")),
    (jobset, ("trainer.kubeflow.org/v1alpha1", "TrainJob")),
    (raycluster, ("ray.io/v1", "RayJob")),
]


@pytest.mark.parametrize(("child", "parent"), PARENTS)
def test_objects_a_placed_job_creates_are_not_placed_again(child: Any, parent: tuple[str, str]) -> None:
    # Even one that alone would fit no pool: its parent's placement (on the pod templates it copies) stands.
    obj = owned(with_decision_id(child(spec=SPEC_70B_ONE_GPU)), *parent)
    for webhook in ("mutate", "validate"):
        response = body(run(obj, webhook=webhook))
        assert response["allowed"] is True and "patch" not in response
        assert f"created by {parent[1]} parent, which vramfit placed (decision abc-123)" in response[
            "auditAnnotations"]["skipped"]


@pytest.mark.parametrize(("child", "parent"), PARENTS)
def test_an_object_whose_parent_vramfit_did_not_place_is_placed(child: Any, parent: tuple[str, str]) -> None:
    # e.g. the JobSet the Trainer builds from a TrainJob whose GPUs live in a runtime the webhook cannot read
    obj = owned(child(), *parent)
    assert apply(obj, patch_ops(run(obj)))["metadata"]["annotations"]["vramfit.io/pool"]


def test_a_job_a_cronjob_creates_is_placed() -> None:
    obj = owned(batch_job(), "batch/v1", "CronJob")
    assert apply(obj, patch_ops(run(obj)))["metadata"]["annotations"]["vramfit.io/pool"]


@pytest.mark.parametrize("request_fields", [{"operation": "UPDATE"}, {"subResource": "status"}])
def test_updates_and_subresources_are_not_reviewed(request_fields: dict[str, Any]) -> None:
    for spec in (SPEC_8B_LORA, SPEC_70B_ONE_GPU):
        for webhook in ("mutate", "validate"):
            response = body(run(batch_job(spec=spec), webhook=webhook, **request_fields))
            assert response["allowed"] is True and "patch" not in response
            assert "not reviewed" in response["auditAnnotations"]["skipped"]


def test_a_job_with_no_gpu_request_and_no_gpus_in_the_annotation_is_left_alone() -> None:
    obj = volcano_job(gpus=None)  # the annotation names a model but no gpus: no replica count is rewritten
    mutated = body(run(obj))
    assert "patch" not in mutated and "requests no GPU" in mutated["auditAnnotations"]["skipped"]
    warnings = body(run(obj, webhook="validate"))["warnings"]
    assert any("requests no GPU" in w and "Set gpus in vramfit.io/spec" in w for w in warnings)


def test_a_pin_to_a_gpu_no_pool_offers_is_respected_and_only_checked() -> None:
    fits = batch_job(spec=SPEC_1B_LORA)
    fits["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    for webhook in ("mutate", "validate"):
        response = body(run(fits, webhook=webhook))
        assert response["allowed"] is True and "patch" not in response
    warnings = body(run(fits, webhook="validate"))["warnings"]
    assert any("pins A100-80GB, which no node pool offers" in w for w in warnings)
    too_big = batch_job(spec=SPEC_70B_ONE_GPU)
    too_big["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    denied = body(run(too_big, webhook="validate"))
    assert denied["allowed"] is False
    message = denied["status"]["message"]
    assert "pins A100-80GB, which no node pool offers" in message and "To fix: remove the A100-80GB pin" in message
    assert body(run(too_big))["allowed"] is True  # /mutate leaves the denial to /validate


@pytest.mark.parametrize(
    "obj",
    [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {}},
        {"apiVersion": "example.com/v1", "kind": "CustomType", "spec": {"replicas": 1}},
        pod(gpus=None, spec="")  # a CPU pod with an empty annotation
        | {"metadata": {"name": "cpu", "namespace": "x"}},
    ],
    ids=["configmap", "deployment", "unknown-kind", "cpu-pod"],
)
def test_objects_without_gpus_pass_untouched(obj: dict[str, Any]) -> None:
    for webhook in ("mutate", "validate"):
        response = body(run(obj, webhook=webhook))
        assert response["allowed"] is True and "patch" not in response and not response.get("warnings")
        assert "skipped" in response["auditAnnotations"]


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
def test_other_operations_pass(operation: str) -> None:
    response = body(run(pod(), operation=operation))
    assert response["allowed"] is True and "patch" not in response


def test_dry_run_has_no_ledger_record_but_the_same_answer() -> None:
    dry = admit(admission_review(pod(), dry_run=True), None, POOLS, NOW)
    real = admit(admission_review(pod()), None, POOLS, NOW)
    assert dry.record is None and real.record is not None
    assert dry.response == real.response
    assert real.record["decision_id"] == real.response["response"]["auditAnnotations"]["decision-id"]
    assert real.record["decided_at"] == NOW.isoformat()


def test_a_generate_name_job_is_recorded_as_a_generated_name() -> None:
    """Admission sees a generateName object before the API server completes its name: the record says the name is
    that prefix, so the DCGM sweep looks for the server's 5 characters after it."""
    named, generated = pod(), pod()
    generated["metadata"]["generateName"] = generated["metadata"].pop("name") + "-"
    record = admit(admission_review(generated), None, POOLS, NOW).record
    assert record is not None and record["generated_name"] is True and record["name"].endswith("-")
    plain = admit(admission_review(named), None, POOLS, NOW).record
    assert plain is not None and "generated_name" not in plain


def test_decision_id_is_stable_and_uses_the_uid_when_there_is_one() -> None:
    first = body(run(pod(), uid="a"))["auditAnnotations"]["decision-id"]
    assert body(run(pod(), uid="a"))["auditAnnotations"]["decision-id"] == first
    assert body(run(pod(), uid="b"))["auditAnnotations"]["decision-id"] != first  # CREATE: no uid yet
    with_uid = pod()
    with_uid["metadata"]["uid"] = "0b6b0f3a"
    ids = {body(run(with_uid, uid=u))["auditAnnotations"]["decision-id"] for u in ("a", "b")}
    assert len(ids) == 1
    counter = iter(range(100))
    custom = review(admission_review(pod()), None, POOLS, NOW, id_factory=lambda m: f"n{next(counter)}")
    assert body(custom)["auditAnnotations"]["decision-id"].endswith("-n0")


def test_generate_name_objects_get_an_id() -> None:
    obj = pod()
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = "trainer-"
    patched = apply(obj, patch_ops(run(obj)))
    assert patched["metadata"]["annotations"]["vramfit.io/decision-id"]
    assert patch_ops(run(patched, uid="other")) == []


@pytest.mark.parametrize("mode", ["fail_open", "fail_closed"])
def test_internal_error_follows_the_failure_mode(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("predictor exploded")

    monkeypatch.setattr(admission_module, "place", broken)
    response = body(run(pod(), settings=AdmissionSettings(failure_mode=mode)))  # type: ignore[arg-type]
    assert response["uid"] == "req-1" and "patch" not in response
    if mode == "fail_open":
        assert response["allowed"] is True and "predictor exploded" in response["warnings"][0]
    else:
        assert response["allowed"] is False and "predictor exploded" in response["status"]["message"]


@pytest.mark.parametrize("setting", ["allow", "deny"])
def test_unreadable_gpu_job_follows_its_setting(setting: str) -> None:
    obj = pod(spec="method: lora\n")  # a GPU pod, but no model anywhere
    settings = AdmissionSettings(unreadable_job=setting)  # type: ignore[arg-type]
    validated = body(run(obj, webhook="validate", settings=settings))
    assert validated["allowed"] is (setting == "allow")
    text = validated["warnings"][0] if setting == "allow" else validated["status"]["message"]
    assert "no model found" in text
    assert body(run(obj, settings=settings))["allowed"] is True  # mutate never denies


def test_a_spec_annotation_nested_too_deeply_is_named_not_an_internal_error() -> None:
    obj = pod(spec="model: " + "[" * 5000 + "]" * 5000)
    validated = body(run(obj, webhook="validate"))
    text = " ".join(validated.get("warnings", [])) + validated.get("status", {}).get("message", "")
    assert "nested too deeply" in text and "RecursionError" not in text, validated


@pytest.mark.parametrize("setting", ["allow", "deny"])
def test_an_alias_bomb_in_the_spec_annotation_is_refused_not_expanded(setting: str) -> None:
    # Before the alias cap, validating this annotation built a 10**9-node structure and the process was killed.
    settings = AdmissionSettings(unreadable_job=setting)  # type: ignore[arg-type]
    validated = body(run(pod(spec="model: llama-3.1-8b\n" + ALIAS_BOMB), webhook="validate", settings=settings))
    assert validated["allowed"] is (setting == "allow")
    text = validated["warnings"][0] if setting == "allow" else validated["status"]["message"]
    assert "vramfit.io/spec" in text and "aliases expand to more than 100,000 nodes" in text
    assert "patch" not in body(run(pod(spec="model: llama-3.1-8b\n" + ALIAS_BOMB), settings=settings))


def test_an_alias_bomb_in_a_container_env_value_is_skipped_and_the_job_still_placed() -> None:
    obj = pod()
    obj["spec"]["containers"][0]["env"] = [{"name": "TRAIN_CONFIG", "value": ALIAS_BOMB}]
    ops = patch_ops(run(obj))
    assert apply(obj, ops)["spec"]["nodeSelector"]["pool"] in {"small", "big"}


def test_an_alias_bomb_in_a_rayjob_runtime_env_is_named_at_its_field() -> None:
    obj = rayjob(spec="")
    del obj["metadata"]["annotations"]
    obj["spec"]["runtimeEnvYAML"] = "env_vars:\n  MODEL_ID: meta-llama/Llama-3.1-8B\n" + ALIAS_BOMB
    validated = body(run(obj, webhook="validate"))
    text = " ".join(validated.get("warnings", [])) + validated.get("status", {}).get("message", "")
    assert "spec.runtimeEnvYAML" in text and "aliases expand to more than" in text, validated


def test_a_runtime_env_above_the_embedded_text_cap_is_named_at_its_field() -> None:
    obj = rayjob()
    obj["spec"]["runtimeEnvYAML"] = "env_vars:\n" + "".join(f"  V{i}: '{i}'\n" for i in range(8_000))
    validated = body(run(obj, webhook="validate"))
    text = " ".join(validated.get("warnings", [])) + validated.get("status", {}).get("message", "")
    assert "spec.runtimeEnvYAML" in text and "vramfit reads at most 65,536 (64 KiB) here" in text, validated


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ([], "JSON object"),
        ({"kind": "Pod"}, "kind must be AdmissionReview"),
        ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1", "request": {}}, "apiVersion"),
        ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}, "request must be"),
        ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": 3}}, "uid"),
        ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "u", "object": 1}},
         "request.object"),
    ],
)
def test_malformed_reviews_are_named_and_still_answered(bad: Any, problem: str) -> None:
    with pytest.raises(MalformedReview, match=problem):
        check_review(bad)
    response = body(review(bad, None, POOLS, NOW))
    assert response["allowed"] is True and problem.split()[0] in response["warnings"][0]
    closed = body(review(bad, AdmissionSettings(failure_mode="fail_closed"), POOLS, NOW))
    assert closed["allowed"] is False


def test_shared_round_trip_fixture_is_answered() -> None:
    fixture = json.loads((fixtures_dir() / "kubernetes_api__testdata__HEAD__admission.k8s.io.v1.AdmissionReview"
                                           ".json").read_text())
    response = body(review(fixture, None, POOLS, NOW))
    assert response["uid"] == "uidValue" and response["allowed"] is True and "patch" not in response
    fixture["request"]["operation"] = "CREATE"
    response = body(review(fixture, None, POOLS, NOW))
    assert "subresource subResourceValue is not reviewed" in response["auditAnnotations"]["skipped"]
    del fixture["request"]["subResource"]
    response = body(review(fixture, None, POOLS, NOW))
    assert "not a kind vramfit reads" in response["auditAnnotations"]["skipped"]


def test_settings_are_strict() -> None:
    with pytest.raises(ValidationError):
        AdmissionSettings(failure_mode="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        AdmissionSettings(annotation_prefix="Not A Prefix")
    with pytest.raises(ValidationError):
        AdmissionSettings.model_validate({"unknown": 1})
    patched = apply(pod(), patch_ops(run(pod(), settings=AdmissionSettings(annotation_prefix="ml.example.com/"))))
    assert "ml.example.com/pool" in patched["metadata"]["annotations"]


def test_review_does_not_mutate_its_input() -> None:
    obj = pytorchjob()
    before = copy.deepcopy(obj)
    run(obj)
    assert obj == before


def test_integrations_import_no_kubernetes_client() -> None:
    """The webhook works on plain dicts; only the collector's live pod watch imports the client, lazily
    inside the function (the `kube` extra), never at module level."""
    package = Path(admission_module.__file__).parent
    for source in package.glob("*.py"):
        for node in ast.parse(source.read_text()).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "kubernetes" or n.startswith("kubernetes.") for n in names), source


def test_a_spec_the_predictor_refuses_is_an_unreadable_job_not_an_error() -> None:
    obj = batch_job(spec="model: llama-3.1-8b\nmethod: lora\nlora: {target_modules: [foo]}\n")
    assert "patch" not in body(run(obj)) and not body(run(obj)).get("warnings")
    validated = body(run(obj, webhook="validate"))
    assert validated["allowed"] is True and "decision-id" not in validated["auditAnnotations"]
    assert "`lora.target_modules` match no linear layer" in validated["auditAnnotations"]["unreadable"]
    assert any("vramfit cannot size" in w for w in validated["warnings"])
    denying = AdmissionSettings(unreadable_job="deny", failure_mode="fail_closed")
    assert body(run(obj, webhook="validate", settings=denying))["status"]["message"].startswith("vramfit cannot size")


def test_gpus_auto_on_a_gpu_no_pool_offers_is_denied() -> None:
    obj = batch_job(gpus=None, spec="model: llama-3.2-1b\nmethod: lora\ngpus: auto\ngpu: A10G\n")
    assert body(run(obj))["allowed"] is True and "patch" not in body(run(obj))
    denied = body(run(obj, webhook="validate"))
    assert denied["allowed"] is False and "(gpus: auto) on A10G, which no node pool offers" in denied["status"][
        "message"]


def test_a_pod_is_not_placed_on_nodes_smaller_than_it() -> None:
    """An 8-GPU pod on a pool of 4-GPU nodes would stay Pending for ever, however cheap the pool."""
    pools = parse_pools({"pools": [
        {"name": "quad", "gpu": "H100-80GB", "gpus_per_node": 4, "nodes": 4, "price_usd_per_gpu_hour": 0.2,
         "node_selector": {"pool": "quad"}},
        {"name": "octo", "gpu": "H100-80GB", "gpus_per_node": 8, "nodes": 2, "price_usd_per_gpu_hour": 2.0,
         "node_selector": {"pool": "octo"}},
    ]})
    spec = "model: llama-3.1-8b\nmethod: full\nsharding: fsdp\ntrain_tokens: 100M\n"
    eight = batch_job(gpus=8, spec=spec)
    patched = apply(eight, patch_ops(review(admission_review(eight), None, pools, NOW)))
    assert patched["metadata"]["annotations"]["vramfit.io/pool"] == "octo"
    as_two_pods = batch_job(gpus=4, spec=spec)  # the same 8 GPUs as 2 pods x 4: 2 quad nodes are cheapest
    as_two_pods["spec"]["parallelism"] = as_two_pods["spec"]["completions"] = 2
    patched = apply(as_two_pods, patch_ops(review(admission_review(as_two_pods), None, pools, NOW)))
    assert patched["metadata"]["annotations"]["vramfit.io/pool"] == "quad"
    four = batch_job(gpus=4, spec=spec)  # a 4-GPU pod fits either: the cheaper pool
    patched = apply(four, patch_ops(review(admission_review(four), None, pools, NOW)))
    assert patched["metadata"]["annotations"]["vramfit.io/pool"] == "quad"


@pytest.mark.parametrize("kind", ["Job", "TrainJob"])
def test_gpus_auto_with_model_parallelism_writes_the_decisions_count(kind: str) -> None:
    """tensor 2 x pipeline 3 on 8-GPU nodes: placement takes 18 GPUs (3 nodes x 6, whole model-parallel groups per
    node); the webhook wrote 3 pods x 8 = 24 (not a multiple of 6) before."""
    pools = parse_pools({"pools": [{"name": "h100", "gpu": "H100-80GB", "gpus_per_node": 8, "nodes": 4,
                                    "price_usd_per_gpu_hour": 3.0, "node_selector": {"pool": "h100"}}]})
    spec = ("model: qwen2.5-32b\nmethod: full\ngpus: auto\ntensor_parallel: 2\npipeline_parallel: 3\n"
            "sharding: zero1\ngradient_checkpointing: full\n")
    obj = batch_job(gpus=None, spec=spec) if kind == "Job" else trainjob(gpus=None, spec=spec)
    response = review(admission_review(obj), None, pools, NOW)
    patched = apply(obj, patch_ops(response))
    assert body(response)["auditAnnotations"]["pool"] == "h100"
    if kind == "Job":
        pods = patched["spec"]["parallelism"]
        per_pod = int(patched["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    else:
        pods = patched["spec"]["trainer"]["numNodes"]
        per_pod = int(patched["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"])
    assert (pods, per_pod) == (3, 6)
    assert per_pod % 6 == 0 and pods * per_pod == 18


def test_a_trainjob_whose_gpus_live_in_its_runtime_is_told_it_was_not_placed() -> None:
    obj = trainjob(gpus=None)
    del obj["metadata"]["annotations"]
    mutate, validate = body(run(obj)), body(run(obj, webhook="validate"))
    assert mutate["allowed"] and "patch" not in mutate and not mutate.get("warnings")
    assert validate["allowed"] and "patch" not in validate
    assert any("GPUs are set in its runtime" in w and "vramfit.io/spec" in w for w in validate["warnings"])


def test_the_decision_record_carries_every_predicted_level() -> None:
    """An allocated or reserved actual is compared with its own predicted level in `vramfit report`: the record
    holds all three levels (it held only the device peak and its bound)."""
    from scheduler.integrations.records import DecisionIn

    admission = admit(admission_review(batch_job()), None, POOLS, NOW)
    assert admission.record is not None
    record = DecisionIn.model_validate(admission.record)
    assert record.peak_allocated_bytes and record.peak_reserved_bytes and record.peak_vram_bytes
    assert record.peak_allocated_bytes <= record.peak_reserved_bytes <= record.peak_vram_bytes
    assert record.params_total and record.model


@pytest.mark.parametrize("field", ["model", "teacher_model", "critic_model"])
def test_a_config_path_in_a_cluster_object_is_not_read(field: str, tmp_path: Path) -> None:
    """Whoever can create a Pod must not make the webhook read files on its host (/dev/zero never ends) nor learn from
    its errors which exist: a config_path is an unreadable job, named, and no file is opened."""
    secret = tmp_path / "config.json"
    secret.write_text("{not json")
    other = f"\n{field}: {{config_path: {secret}}}" if field != "model" else ""
    model = "llama-3.2-1b" if field != "model" else f"{{config_path: {secret}}}"
    obj = batch_job(spec=f"model: {model}\nmethod: lora{other}\n")
    validated = body(run(obj, webhook="validate"))
    assert validated["allowed"] is True and "decision-id" not in validated["auditAnnotations"]
    unreadable = validated["auditAnnotations"]["unreadable"]
    assert f"`spec.{field}.config_path` names a file on the webhook's host" in unreadable
    assert "not json" not in unreadable and "JSON" not in unreadable  # the file was not opened
    denying = AdmissionSettings(unreadable_job="deny", failure_mode="fail_closed")
    assert body(run(obj, webhook="validate", settings=denying))["allowed"] is False


def test_a_decision_out_of_the_ledgers_bounds_is_kept_without_those_fields(caplog: pytest.LogCaptureFixture) -> None:
    """A runtime of more than 1000 years (1e15 tokens of a 405B model on one slow card) or a name longer than
    Kubernetes allows failed the whole record, with a traceback; now those optional fields are left empty."""
    from scheduler.cli.serve import valid_decision

    admission = admit(admission_review(batch_job()), None, POOLS, NOW)
    assert admission.record is not None
    record = {**admission.record, "predicted_runtime_seconds": 3.5e295, "name": "x" * 300}
    with caplog.at_level("WARNING", logger="vramfit.serve"):
        decision = valid_decision(record)
    assert decision is not None and decision.decision_id == admission.record["decision_id"]
    assert decision.predicted_runtime_seconds is None and decision.name is None
    assert decision.peak_vram_bytes == admission.record["peak_vram_bytes"]
    assert "recorded without those fields" in caplog.text and "Traceback" not in caplog.text
    assert valid_decision({"decision_id": ""}) is None  # nothing usable left: not recorded, no exception


@pytest.mark.parametrize("metadata", [[], [{"name": "x"}], "trainer"])
def test_metadata_that_is_not_a_mapping_is_skipped_not_an_internal_error(metadata: object) -> None:
    obj = pod()
    obj["metadata"] = metadata
    obj["spec"]["containers"][0]["args"] = ["--model_name_or_path", "meta-llama/Llama-3.2-1B", "--use_peft"]
    for webhook in ("mutate", "validate"):
        answer = body(run(obj, webhook=webhook))
        assert answer["allowed"] is True and "patch" not in answer
        assert not any("failed" in w for w in answer.get("warnings", []))
