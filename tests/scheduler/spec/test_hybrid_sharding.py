"""Hybrid sharding (HSDP): the shard group each trainer states, read as ``shard_group_size`` once the pods give the
GPU count. Before it was read, every one of these jobs was predicted as if its states were sharded over all of
its GPUs: for Llama-3.1-8B on 4 nodes x 8 GPUs that is 21.8 GiB per GPU instead of 32.8."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.scheduler.spec.helpers import one_job, pod

M = "meta-llama/Llama-3.1-8B"
HF = ["torchrun", "train.py", "--model_name_or_path", M, "--bf16", "--per_device_train_batch_size", "1"]


def pytorchjob(argv: list[str], workers: int, gpus: int, files: dict[str, str] | None = None) -> list[Any]:
    """A Kubeflow PyTorchJob: a master and ``workers`` workers, ``gpus`` GPUs each (one pod per node)."""
    container = {"name": "pytorch", "image": "example/train:1", "command": argv,
                 "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    template = {"spec": {"containers": [container]}}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "hsdp"},
           "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template},
                                            "Worker": {"replicas": workers, "template": template}}}}
    if not files:
        return [job]
    return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": files}, job]


def _notes(job: Any) -> str:
    return "\n".join(job.assumptions)


def test_fsdp_hybrid_shard_is_sharded_within_a_node() -> None:
    """FSDP1's HYBRID_SHARD shards over the GPUs a process sees on its node and replicates across nodes."""
    job = one_job(*pytorchjob([*HF, "--fsdp", "hybrid_shard auto_wrap"], workers=3, gpus=8))
    assert (job.spec.gpus, job.spec.sharding, job.spec.shard_group_size) == (32, "fsdp", 8)
    assert "HYBRID_SHARD shards within a node (8 GPUs per pod)" in job.provenance["shard_group_size"]
    assert "replicated across 4 groups" in _notes(job)
    zero2 = one_job(*pytorchjob([*HF, "--fsdp", "hybrid_shard_zero2"], workers=1, gpus=4))
    assert (zero2.spec.sharding, zero2.spec.shard_group_size) == ("fsdp-grad-op", 4)


def test_hybrid_shard_on_one_node_is_plain_sharding() -> None:
    job = one_job(pod([*HF, "--fsdp", "hybrid_shard auto_wrap"], gpus=8))
    assert (job.spec.sharding, job.spec.shard_group_size) == ("fsdp", None)
    assert "one group of all 8 data-parallel ranks" in _notes(job)


def test_accelerate_parallelism_config_replicate_and_shard_sizes() -> None:
    argv = ["accelerate", "launch", "--parallelism_config_dp_replicate_size", "2",
            "--parallelism_config_dp_shard_size", "8", "train.py", "--model_name_or_path", M, "--bf16"]
    job = one_job(*pytorchjob(argv, workers=1, gpus=8))
    assert (job.spec.sharding, job.spec.shard_group_size) == ("fsdp", 8)
    replicate_only = ["accelerate", "launch", "--use_fsdp", "--parallelism_config_dp_replicate_size", "4",
                      "train.py", "--model_name_or_path", M, "--bf16"]
    job = one_job(*pytorchjob(replicate_only, workers=3, gpus=8))
    assert job.spec.shard_group_size == 8  # 32 data-parallel ranks / 4 replicas
    assert job.provenance["shard_group_size"].startswith("32 data-parallel ranks / flag --parallelism_config_dp_"
                                                         "replicate_size 4")


def test_axolotl_dp_replicate_and_shard_sizes() -> None:
    """axolotl's examples/distributed-parallel/llama-3_1-8b-hsdp-tp.yaml sets dp_shard_size and dp_replicate_size
    beside tensor_parallel_size under FSDP2."""
    config = {"base_model": "NousResearch/Meta-Llama-3.1-8B", "sequence_len": 2048, "micro_batch_size": 1,
              "gradient_accumulation_steps": 1, "bf16": True, "dp_shard_size": 2, "dp_replicate_size": 2,
              "tensor_parallel_size": 2, "fsdp_version": 2,
              "fsdp_config": {"offload_params": False, "state_dict_type": "FULL_STATE_DICT",
                              "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "reshard_after_forward": True}}
    job = one_job(*pytorchjob(["axolotl", "train", "/cfg/hsdp.yaml"], workers=0, gpus=8,
                              files={"hsdp.yaml": yaml.safe_dump(config)}))
    assert (job.spec.gpus, job.spec.tensor_parallel, job.spec.sharding, job.spec.shard_group_size) == (
        8, 2, "fsdp", 2)


def test_torchtitan_replicate_degree() -> None:
    toml = """[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 1
seq_len = 8192
[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = -1
"""
    job = one_job(*pytorchjob(["torchrun", "-m", "torchtitan.train", "--job.config_file", "/cfg/llama3_8b.toml"],
                              workers=1, gpus=8, files={"llama3_8b.toml": toml}))
    assert (job.spec.sharding, job.spec.shard_group_size) == ("fsdp", 8)
    stated = toml.replace("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 4")
    job = one_job(*pytorchjob(["torchrun", "-m", "torchtitan.train", "--job.config_file", "/cfg/llama3_8b.toml"],
                              workers=1, gpus=8, files={"llama3_8b.toml": stated}))
    assert job.spec.shard_group_size == 4


def test_deepspeed_mics_and_hpz() -> None:
    ds = {"zero_optimization": {"stage": 3, "mics_shard_size": 8, "mics_hierarchical_params_gather": True},
          "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1}
    job = one_job(*pytorchjob(["deepspeed", "train.py", "--model_name_or_path", M, "--deepspeed", json.dumps(ds)],
                              workers=1, gpus=8))
    assert (job.spec.sharding, job.spec.shard_group_size) == ("zero3", 8)
    assert "mics_shard_size 8 (MiCS)" in job.provenance["shard_group_size"]
    hpz = {**ds, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}
    job = one_job(*pytorchjob(["deepspeed", "train.py", "--model_name_or_path", M, "--deepspeed", json.dumps(hpz)],
                              workers=1, gpus=8))
    assert job.spec.shard_group_size is None
    assert "zero_hpz_partition_size 8 (ZeRO++ hpZ)" in _notes(job)


@pytest.mark.parametrize(
    ("argv", "workers", "gpus", "why"),
    [
        # a replica count that does not divide the data-parallel ranks
        (["accelerate", "launch", "--use_fsdp", "--parallelism_config_dp_replicate_size", "3", "train.py",
          "--model_name_or_path", M], 1, 8, "does not divide the 16 data-parallel ranks"),
        # hybrid sharding of a job that does not shard
        (["accelerate", "launch", "--parallelism_config_dp_replicate_size", "2", "--parallelism_config_dp_shard_"
          "size", "1", "train.py", "--model_name_or_path", M], 1, 8, "and sharding is not set"),
    ],
    ids=["indivisible", "not-sharded"],
)
def test_unusable_hybrid_settings_are_noted_not_errors(argv: list[str], workers: int, gpus: int, why: str) -> None:
    job = one_job(*pytorchjob(argv, workers=workers, gpus=gpus))
    assert job.spec.shard_group_size is None
    assert why in _notes(job)


def test_the_annotation_wins() -> None:
    spec = {"shard_group_size": 16}
    docs = pytorchjob([*HF, "--fsdp", "hybrid_shard auto_wrap"], workers=3, gpus=8)
    docs[0]["metadata"]["annotations"] = {"vramfit.io/spec": json.dumps(spec)}
    job = one_job(*docs)
    assert job.spec.shard_group_size == 16
