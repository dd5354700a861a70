"""Every manifest in examples/jobs parses into the TrainingSpec its comments promise."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.spec.document import read_jobs
from tests.scheduler.spec.helpers import EXAMPLES

# file -> (kind, spec fields, pod template pointers, pinned GPU)
EXPECTED: dict[str, tuple[str, dict[str, Any], list[str], str | None]] = {
    "hf-trainer-deepspeed-job.yaml": (
        "Job",
        {
            "model": "meta-llama/Llama-3.1-8B",
            "gpus": 8,
            "micro_batch_size": 2,
            "seq_len": 4096,
            "sharding": "zero3",
            "offload": "optimizer",
            "precision": "bf16-mixed",
            "gpu": "H100-80GB",
            "grad_accum_steps": 8,
            "zero_reduce_bucket_elements": "auto",
        },
        ["/spec/template/spec"],
        "H100-80GB",
    ),
    "trl-qlora-pytorchjob.yaml": (
        "PyTorchJob",
        {
            "model": "mistralai/Mistral-7B-v0.1",
            "gpus": 8,
            "method": "qlora",
            "quantization": "nf4-dq",
            "optimizer": "paged-adamw-8bit",
            "attention": "flash",
            "steps": 2000,
        },
        ["/spec/pytorchReplicaSpecs/Master/template/spec", "/spec/pytorchReplicaSpecs/Worker/template/spec"],
        None,
    ),
    "accelerate-fsdp-jobset.yaml": (
        "JobSet",
        {
            "model": "meta-llama/Llama-2-13b-hf",
            "gpus": 16,
            "sharding": "fsdp",
            "seq_len": 4096,
            "gradient_checkpointing": "full",
            "gpu": "A100-80GB",
        },
        ["/spec/replicatedJobs/0/template/spec/template/spec"],
        "A100-80GB",
    ),
    "deepspeed-launcher-volcano.yaml": (
        "Job.batch.volcano.sh",
        {"model": "Qwen/Qwen-7B", "gpus": 16, "sharding": "zero2", "precision": "16-mixed"},
        ["/spec/tasks/1/template/spec"],
        None,
    ),
    "torchtune-trainjob.yaml": (
        "TrainJob",
        {"model": "llama-3.2-3b", "gpus": 4, "method": "lora", "micro_batch_size": 8, "sharding": "fsdp"},
        ["/spec/trainer"],
        None,
    ),
    "axolotl-rayjob.yaml": (
        "RayJob",
        {
            "model": "meta-llama/Meta-Llama-3-8B",
            "gpus": 2,
            "method": "qlora",
            "seq_len": 4096,
            "attention": "flash",
            "gpu": "A10G",
        },
        ["/spec/rayClusterSpec/workerGroupSpecs/0/template/spec"],
        "A10G",
    ),
    "llamafactory-pod.yaml": (
        "Pod",
        {"model": "meta-llama/Llama-3.2-3B", "gpus": 1, "method": "lora", "seq_len": 4096},
        ["/spec"],
        None,
    ),
    "ray-submission.json": (
        "RayJobSubmission",
        {
            "model": "google/gemma-2-9b",
            "gpus": 4,
            "method": "lora",
            "seq_len": 8192,
            "attention": "flash",
            "gpu": "A100-80GB",
        },
        [],
        None,
    ),
    "annotated-pod.yaml": (
        "Pod",
        {"model": "llama-2-7b", "gpus": 2, "method": "lora", "seq_len": 4096, "micro_batch_size": 4},
        ["/spec"],
        None,
    ),
}


def test_every_example_is_listed() -> None:
    assert {p.name for p in EXAMPLES.iterdir()} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example(name: str) -> None:
    jobs = read_jobs(EXAMPLES / name)
    assert len(jobs) == 1
    job = jobs[0]
    kind, fields, pointers, pinned = EXPECTED[name]
    assert job.kind == kind
    data = job.spec.model_dump()
    assert {k: data[k] for k in fields} == fields
    assert [t.pointer for t in job.pod_templates] == pointers
    assert job.pinned_gpu == pinned
    assert set(fields) <= set(job.provenance)  # every field the example sets says where it came from
