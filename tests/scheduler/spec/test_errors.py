"""Bad input: a clear SpecError naming the object and the field, never a stack trace."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.errors import SpecError
from scheduler.spec.document import NoTrainingJob, read_jobs_text
from tests.scheduler.spec.helpers import dump, pod

ARGS = ["python", "t.py", "--model_name_or_path", "gpt2"]
JOB_NO_CONTAINERS = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "empty"},
    "spec": {"template": {"spec": {"containers": []}}},
}

CASES: list[tuple[str, str, list[str]]] = [
    # (id, file text, fragments the message must contain)
    ("broken-yaml", "kind: Pod\nmetadata: {name: x\n", ["is not valid YAML at line", "f.yaml"]),
    (
        "unknown-kind",
        dump({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
        ["Widget w", "`kind`", "unsupported kind 'Widget'", "supported kinds"],
    ),
    (
        "kind-in-wrong-group",
        dump({"apiVersion": "v1", "kind": "Job", "metadata": {"name": "j"}}),
        ["Job j", "`kind`", "apiVersion group 'batch' or 'batch.volcano.sh'"],
    ),
    (
        "job-without-containers",
        dump(JOB_NO_CONTAINERS),
        ["Job empty", "`spec.template.spec.containers`", "is missing or empty"],
    ),
    (
        "job-without-template",
        dump({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "t"}, "spec": {}}),
        ["Job t", "`spec.template`", "is missing"],
    ),
    (
        "annotation-not-yaml",
        dump(pod(ARGS, annotations={"vramfit.io/spec": "model: [gpt2"})),
        ["Pod trainer", '`metadata.annotations["vramfit.io/spec"]`', "is not valid YAML"],
    ),
    (
        "annotation-not-mapping",
        dump(pod(ARGS, annotations={"vramfit.io/spec": "gpt2"})),
        ["Pod trainer", '`metadata.annotations["vramfit.io/spec"]`', "must be a YAML mapping"],
    ),
    (
        "annotation-unknown-fields",
        dump(pod(ARGS, annotations={"vramfit.io/spec": "batch: 4\nmodle: gpt2"})),
        [
            "Pod trainer",
            "2 problems",
            '`metadata.annotations["vramfit.io/spec"].batch`',
            '`metadata.annotations["vramfit.io/spec"].modle`',
            "is not a known TrainingSpec field",
        ],
    ),
    (
        "annotation-bad-value",
        dump(pod(ARGS, annotations={"vramfit.io/spec": "seq_len: -3"})),
        [
            "Pod trainer",
            '`metadata.annotations["vramfit.io/spec"].seq_len`',
            "annotation vramfit.io/spec: seq_len",
        ],
    ),
    (
        "flag-bad-value",
        dump(pod([*ARGS, "--per_device_train_batch_size", "many"])),
        ["Pod trainer", "`spec.containers[0]`", "flag --per_device_train_batch_size: micro_batch_size"],
    ),
    (
        "gpu-not-a-number",
        dump(pod(ARGS, gpus="half")),  # type: ignore[arg-type]
        ["Pod trainer", '`spec.containers[0].resources.limits["nvidia.com/gpu"]`', "whole number of GPUs"],
    ),
    (
        "gpu-milli-quantity",  # read as 500 million GPUs before: in a Kubernetes quantity `m` is milli
        dump(pod(ARGS, gpus="500m")),  # type: ignore[arg-type]
        ["Pod trainer", '`spec.containers[0].resources.limits["nvidia.com/gpu"]`', "got '500m'", "half a GPU"],
    ),
    (
        "gpu-negative",  # read as "no GPU request" before
        dump(pod(ARGS, gpus=-1)),
        ["Pod trainer", "whole number of GPUs, 0 or more; got -1"],
    ),
    (
        "gpu-more-than-a-node",
        dump(pod(ARGS, gpus="100000000000")),  # type: ignore[arg-type]
        ["Pod trainer", "asks for 100,000,000,000 GPUs in one pod; no node has more than 64"],
    ),
    (
        "no-model",
        dump(pod(["python", "t.py"])),
        ["Pod trainer", "`metadata.annotations`", "no model found", 'vramfit.io/spec: "model: '],
    ),
    (
        "unknown-model",
        dump(pod(["python", "t.py", "--model_name_or_path", "acme/UltraLM-13B"])),
        [
            "Pod trainer",
            "`spec.containers[0]`",
            "'acme/UltraLM-13B', which is not in the model catalog",
            "vramfit.io/spec",
        ],
    ),
    (
        "local-model-path",
        dump(pod(["python", "t.py", "--model_name_or_path", "/models/llama"])),
        ["'/models/llama', which is a local path", "vramfit.io/spec"],
    ),
    (
        "containers-not-a-list",
        dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": "main"}}),
        ["Pod p", "`spec.containers`", "is missing or empty"],
    ),
    (
        "pytorchjob-without-replica-specs",
        dump({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"}, "spec": {}}),
        ["PyTorchJob pt", "`spec.pytorchReplicaSpecs`", "is missing"],
    ),
    (
        "rayjob-bad-runtime-env",
        dump(
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayJob",
                "metadata": {"name": "r"},
                "spec": {"entrypoint": "python t.py", "runtimeEnvYAML": "env_vars: [a"},
            }
        ),
        ["RayJob r", "`spec.runtimeEnvYAML`", "is not valid YAML"],
    ),
    (
        "ray-submission-empty-entrypoint",
        '{"entrypoint": "  "}',
        ["RayJobSubmission", "`entrypoint`", "is empty"],
    ),
    ("not-a-mapping", "- a\n- b\n", ["must be a mapping"]),
    (
        "two-bad-documents",
        dump(JOB_NO_CONTAINERS, pod(["python", "t.py"])),
        ["2 problems", "(in Job empty)", "(in Pod trainer)"],
    ),
]


@pytest.mark.parametrize(("text", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_names_object_and_field(text: str, fragments: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        read_jobs_text(text, "f.yaml")
    assert not isinstance(info.value, NoTrainingJob)
    message = str(info.value)
    assert "Traceback" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_unknown_kind_inside_admission_review_is_no_training_job() -> None:
    review: dict[str, Any] = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"object": {"apiVersion": "apps/v1", "kind": "Widget"}},
    }
    with pytest.raises(NoTrainingJob, match="kind 'Widget'"):
        read_jobs_text(dump(review), "r.json")


def test_a_document_that_is_not_a_mapping_is_named_by_its_index() -> None:
    text = "model: llama-2-7b\n---\n- 1\n- 2\n"
    with pytest.raises(SpecError) as info:
        read_jobs_text(text, "multi.yaml")
    assert [p.path for p in info.value.problems] == ["[1]"]
    assert "`[1]` must be a mapping (a TrainingSpec or a job manifest); got list" in str(info.value)
