"""Every upstream manifest in the shared fixtures: what it parses to, and with the annotation added."""

from __future__ import annotations

import json

import pytest
import yaml

from predictors.errors import SpecError
from scheduler.spec.document import NoTrainingJob, ParsedJob, scan_jobs_text
from tests.scheduler.spec.helpers import FIXTURES

pytestmark = pytest.mark.skipif(
    FIXTURES is None, reason="shared fixtures folder (../shared/fixtures) not found"
)

NEEDS_MODEL = "needs-model"
DEEPSPEED_DEMO = (
    "kubeflow_training-operator__release-1.9__examples__pytorch__deepspeed-demo__pytorch_deepspeed_demo.yaml"
)
NO_TRAINING = "no-training"

# fixture -> per document: (outcome, object, detail). A GPU job whose command names no model is an
# error that asks for the annotation; `detail` is then its GPU summary.
EXPECTED: dict[str, list[tuple[str, str, str]]] = {
    "NVIDIA_k8s-device-plugin__testdata__job-1.yaml": [(NEEDS_MODEL, "Job j-e2e-1", "1 GPU: job 1x1")],
    "kai-scheduler_KAI-Scheduler__docs__gpu-sharing__gpu-memory.yaml": [
        (NO_TRAINING, "Pod gpu-sharing", "gpu-memory=2000")
    ],
    "kai-scheduler_KAI-Scheduler__docs__quickstart__pods__gpu-pod.yaml": [
        (NEEDS_MODEL, "Pod gpu-pod", "1 GPU: pod 1x1")
    ],
    "kubeflow_trainer__examples__flux__lammps-train-gpus.yaml": [
        (NEEDS_MODEL, "TrainJob lammps-flux", "2 GPUs: node 2x1")
    ],
    "kubeflow_trainer__examples__yaml__02-runtime-patches.yaml": [
        (
            NO_TRAINING,
            "TrainJob runtime-patches-example",
            "runtime ClusterTrainingRuntime 'torch-distributed'",
        )
    ],
    "kubeflow_trainer__manifests__base__runtimes__torchtune__llama3_2__llama3_2_1B.yaml": [
        (NO_TRAINING, "ClusterTrainingRuntime torchtune-llama3.2-1b", "template that TrainJobs reference")
    ],
    DEEPSPEED_DEMO: [(NEEDS_MODEL, "PyTorchJob pytorch-deepspeed-demo", "2 GPUs: Master 1x1, Worker 1x1")],
    "kubeflow_training-operator__release-1.9__examples__pytorch__elastic__imagenet__imagenet.yaml": [
        (NO_TRAINING, "PyTorchJob elastic-example-imagenet", "no container requests nvidia.com/gpu")
    ],
    "kubernetes-sigs_jobset__site__static__examples__pytorch__resnet-cifar10__resnet.yaml": [
        (NO_TRAINING, "JobSet pytorch", "workers (4 pods)")
    ],
    "kubernetes-sigs_jobset__site__static__examples__simple__exclusive-placement.yaml": [
        (NO_TRAINING, "JobSet exclusive-placement", "workers (9 pods)")
    ],
    "kubernetes_api__testdata__HEAD__admission.k8s.io.v1.AdmissionReview.json": [
        (NO_TRAINING, "AdmissionReview request.object CustomType", "'CustomType'")
    ],
    "ray-project_kuberay__ray-operator__config__samples__ray-cluster-label-selector.yaml": [
        (NO_TRAINING, "RayCluster ray-label-cluster", "accelerator-group (0 replicas now, up to 10)"),
        (NO_TRAINING, "ConfigMap ray-example", "not a workload"),
    ],
    "ray-project_kuberay__ray-operator__config__samples__ray-cluster.verl.yaml": [
        (NEEDS_MODEL, "RayCluster verl-cluster", "4 GPUs: head 1x4")
    ],
    "ray-project_kuberay__ray-operator__config__samples__ray-job.batch-inference.yaml": [
        (NEEDS_MODEL, "RayJob rayjob-sample", "4 GPUs: head 1x4"),
        (NO_TRAINING, "ConfigMap ray-job-code-sample", "not a workload"),
    ],
    "ray-project_kuberay__ray-operator__config__samples__ray-job.resources.yaml": [
        (NEEDS_MODEL, "RayJob rayjob-sample", "2 GPUs: head 1x2"),
        (NO_TRAINING, "ConfigMap ray-job-code-sample", "not a workload"),
    ],
    "volcano-sh_volcano__example__MindSpore-example__mindspore_gpu__mindspore-gpu.yaml": [
        (NEEDS_MODEL, "Job.batch.volcano.sh mindspore-gpu", "2 GPUs: mpiworker 2x1")
    ],
    "volcano-sh_volcano__example__job.yaml": [
        (NO_TRAINING, "Job.batch.volcano.sh test-job", "default-nginx (6 pods)")
    ],
}

# With `vramfit.io/spec: "model: llama-3.2-1b"` added: gpus, pod template pointers, pinned GPU.
ANNOTATED: dict[str, tuple[int, list[str], str | None]] = {
    "NVIDIA_k8s-device-plugin__testdata__job-1.yaml": (1, ["/spec/template/spec"], None),
    "kai-scheduler_KAI-Scheduler__docs__quickstart__pods__gpu-pod.yaml": (1, ["/spec"], None),
    "kubeflow_trainer__examples__flux__lammps-train-gpus.yaml": (2, ["/spec/trainer"], None),
    DEEPSPEED_DEMO: (
        2,
        ["/spec/pytorchReplicaSpecs/Master/template/spec", "/spec/pytorchReplicaSpecs/Worker/template/spec"],
        None,
    ),
    "ray-project_kuberay__ray-operator__config__samples__ray-cluster.verl.yaml": (
        4,
        ["/spec/headGroupSpec/template/spec"],
        None,
    ),
    "ray-project_kuberay__ray-operator__config__samples__ray-job.batch-inference.yaml": (
        4,
        ["/spec/rayClusterSpec/headGroupSpec/template/spec"],
        "T4",
    ),
    "ray-project_kuberay__ray-operator__config__samples__ray-job.resources.yaml": (
        2,
        ["/spec/rayClusterSpec/headGroupSpec/template/spec"],
        None,
    ),
    "volcano-sh_volcano__example__MindSpore-example__mindspore_gpu__mindspore-gpu.yaml": (
        2,
        ["/spec/tasks/1/template/spec"],
        None,
    ),
}


def _text(name: str) -> str:
    assert FIXTURES is not None
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_every_fixture_has_an_expectation() -> None:
    assert FIXTURES is not None
    present = {p.name for p in FIXTURES.iterdir() if p.suffix in (".yaml", ".json")}
    assert present == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_outcomes(name: str) -> None:
    outcomes = scan_jobs_text(_text(name), name)
    assert len(outcomes) == len(EXPECTED[name])
    for outcome, (kind, ref, detail) in zip(outcomes, EXPECTED[name], strict=True):
        assert not isinstance(outcome, ParsedJob)
        message = str(outcome)
        assert ref in message
        assert detail in message
        if kind == NO_TRAINING:
            assert isinstance(outcome, NoTrainingJob)
            assert message.startswith("no training job found")
        else:
            assert isinstance(outcome, SpecError) and not isinstance(outcome, NoTrainingJob)
            assert "vramfit.io/spec" in message and "metadata.annotations" in message


def _annotate(doc: dict, text: str) -> dict:
    doc.setdefault("metadata", {}).setdefault("annotations", {})["vramfit.io/spec"] = text
    return doc


@pytest.mark.parametrize("name", sorted(ANNOTATED))
def test_fixture_with_annotation_parses(name: str) -> None:
    docs = list(yaml.safe_load_all(_text(name)))
    docs = [d for d in docs if d is not None]
    _annotate(docs[0], "model: llama-3.2-1b\nmicro_batch_size: 2")
    outcomes = scan_jobs_text(yaml.safe_dump_all(docs), name)
    job = outcomes[0]
    assert isinstance(job, ParsedJob), job
    gpus, pointers, pinned = ANNOTATED[name]
    assert job.spec.gpus == gpus
    assert [t.pointer for t in job.pod_templates] == pointers
    assert sum(t.replicas * t.gpus_per_pod for t in job.pod_templates) == gpus
    assert job.pinned_gpu == pinned
    assert job.spec.model == "llama-3.2-1b"
    assert job.provenance["model"] == "annotation vramfit.io/spec"
    assert job.provenance["micro_batch_size"] == "annotation vramfit.io/spec"
    assert any(a.startswith("seq_len = 2048") for a in job.assumptions)


def test_torchtune_runtime_fixture_gives_gpus_and_model_to_a_trainjob() -> None:
    runtime = yaml.safe_load(
        _text("kubeflow_trainer__manifests__base__runtimes__torchtune__llama3_2__llama3_2_1B.yaml")
    )
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tune-1b"},
        "spec": {"runtimeRef": {"name": "torchtune-llama3.2-1b"}},
    }
    outcomes = scan_jobs_text(yaml.safe_dump_all([trainjob, runtime]), "tj.yaml")
    job = outcomes[0]
    assert isinstance(job, ParsedJob), job
    assert isinstance(outcomes[1], NoTrainingJob)
    assert job.spec.gpus == 2  # nvidia.com/gpu: 2 lives only in the runtime
    assert job.spec.model == "llama-3.2-1b"  # torchtune config llama3_2/1B_full wins over the initializer
    assert job.provenance["model"].startswith("torchtune config llama3_2/1B_full")
    assert (job.spec.method, job.spec.sharding) == ("full", "fsdp")
    # the config as torchtune ships it (scheduler/data/torchtune_configs.yaml): batch 4, no checkpointing, fused
    # AdamW, the chunked loss; before, the TrainingSpec's defaults (batch 1, a plain AdamW and loss)
    assert (job.spec.micro_batch_size, job.spec.gradient_checkpointing, job.spec.fused_optimizer,
            job.spec.cross_entropy) == (4, "none", True, "chunked")


def test_admission_review_fixture_with_a_gpu_job_inside() -> None:
    review = json.loads(_text("kubernetes_api__testdata__HEAD__admission.k8s.io.v1.AdmissionReview.json"))
    review["request"]["object"] = yaml.safe_load(_text("NVIDIA_k8s-device-plugin__testdata__job-1.yaml"))
    _annotate(review["request"]["object"], "model: gpt2")
    job = scan_jobs_text(json.dumps(review), "review.json")[0]
    assert isinstance(job, ParsedJob), job
    assert (job.ref, job.spec.gpus, job.pod_templates[0].pointer) == ("Job j-e2e-1", 1, "/spec/template/spec")
