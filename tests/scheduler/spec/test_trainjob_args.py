"""A TrainJob's trainer command and args over its runtime's container, as Kubernetes overrides a container."""

from __future__ import annotations

from pathlib import Path

from scheduler.spec import read_jobs_text

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "jobs" / "torchtune-trainjob.yaml"


def test_args_alone_keep_the_runtime_command() -> None:
    text = EXAMPLE.read_text().replace("    numNodes: 1\n", "    numNodes: 1\n    args: [batch_size=2]\n", 1)
    job = read_jobs_text(text, "trainjob.yaml")[0]
    # `tune run ... lora_finetune_distributed --config llama3_2/3B_lora` is still read, with the TrainJob's override
    assert (job.spec.method, job.spec.sharding, job.spec.micro_batch_size) == ("lora", "fsdp", 2)
    assert job.provenance["micro_batch_size"].startswith("torchtune override batch_size")


def test_a_command_replaces_the_runtime_command() -> None:
    text = EXAMPLE.read_text().replace(
        "    numNodes: 1\n",
        "    numNodes: 1\n    command: [python, train.py, --model_name_or_path, meta-llama/Llama-3.1-8B]\n", 1)
    job = read_jobs_text(text, "trainjob.yaml")[0]
    assert job.provenance["model"] == "flag --model_name_or_path"
