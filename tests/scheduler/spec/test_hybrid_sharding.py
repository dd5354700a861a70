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
    """accelerate exports --parallelism_config_* only with --use_parallelism_config (commands/launch.py), or from
    a config file's parallelism_config section, or the env its launcher sets; dp_shard_size defaults to 1, so a
    replicate size alone is a layout accelerate refuses (parallelism_config.py)."""
    launch = ["accelerate", "launch", "--use_fsdp", "--fsdp_version", "2", "--use_parallelism_config"]
    script = ["train.py", "--model_name_or_path", M, "--bf16"]
    hsdp = ["--parallelism_config_dp_replicate_size", "2", "--parallelism_config_dp_shard_size", "8"]
    job = one_job(*pytorchjob([*launch, *hsdp, *script], workers=1, gpus=8))
    assert (job.spec.sharding, job.spec.shard_group_size) == ("fsdp", 8)
    # the same flags without --use_parallelism_config: accelerate never sees them, plain FSDP over every rank
    job = one_job(*pytorchjob(["accelerate", "launch", "--use_fsdp", *hsdp, *script], workers=1, gpus=8))
    assert (job.spec.sharding, job.spec.shard_group_size) == ("fsdp", None)
    assert "only with --use_parallelism_config" in _notes(job)
    # the env its launcher sets (a manifest may set it directly)
    env_job = pytorchjob(["accelerate", "launch", "--use_fsdp", *script], workers=1, gpus=8)
    env_job[0]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "ACCELERATE_USE_PARALLELISM_CONFIG", "value": "true"},
        {"name": "PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "value": "2"},
        {"name": "PARALLELISM_CONFIG_DP_SHARD_SIZE", "value": "8"}]
    assert one_job(*env_job).spec.shard_group_size == 8
    # a replicate size alone: dp_shard_size 1, refused by accelerate; noted, not read as hybrid
    job = one_job(*pytorchjob([*launch, "--parallelism_config_dp_replicate_size", "4", *script], workers=3, gpus=8))
    assert job.spec.shard_group_size is None
    assert "dp_shard_size defaults to 1" in _notes(job)


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
    # upstream examples/distributed-parallel/qwen3-8b-fsdp-tp-cp.yaml names dp_shard_size 2 with tensor and context
    # parallel 2 and no replicate size: axolotl replicates over the remaining ranks, so on 2 nodes a group of 2
    # (4 data-parallel ranks), on one node the one group of 2
    ndp = {**config, "context_parallel_size": 2}
    del ndp["dp_replicate_size"]
    two_nodes = one_job(*pytorchjob(["axolotl", "train", "/cfg/ndp.yaml"], workers=1, gpus=8,
                                    files={"ndp.yaml": yaml.safe_dump(ndp)}))
    assert (two_nodes.spec.context_parallel, two_nodes.spec.shard_group_size) == (2, 2)
    one_node = one_job(*pytorchjob(["axolotl", "train", "/cfg/ndp.yaml"], workers=0, gpus=8,
                                   files={"ndp.yaml": yaml.safe_dump(ndp)}))
    assert one_node.spec.shard_group_size is None


def torchtitan_job(parallelism: str, workers: int, gpus: int) -> Any:
    """A torchtitan Llama 3 8B job whose TOML config (carried by a ConfigMap) has this [parallelism] section."""
    toml = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n'
            f"[parallelism]\n{parallelism}")
    return one_job(*pytorchjob(["torchrun", "-m", "torchtitan.train", "--job.config_file", "/cfg/llama3_8b.toml"],
                               workers=workers, gpus=gpus, files={"llama3_8b.toml": toml}))


def test_torchtitan_replicate_degree() -> None:
    job = torchtitan_job("data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = -1\n", 1, 8)
    assert (job.spec.sharding, job.spec.shard_group_size) == ("fsdp", 8)
    job = torchtitan_job("data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n", 1, 8)
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
    assert (job.spec.shard_group_size, job.spec.secondary_shard_size) == (None, 8)
    assert "zero_hpz_partition_size 8 (ZeRO++ hpZ)" in job.provenance["secondary_shard_size"]
    # ZeRO-2 has no parameter shards to copy: the key is not read
    hpz2 = {**ds, "zero_optimization": {"stage": 2, "zero_hpz_partition_size": 8}}
    job = one_job(*pytorchjob(["deepspeed", "train.py", "--model_name_or_path", M, "--deepspeed", json.dumps(hpz2)],
                              workers=1, gpus=8))
    assert job.spec.secondary_shard_size is None


def test_hpz_waits_for_the_final_stage() -> None:
    """A ZeRO-3 config's hpZ under an annotation that says ZeRO-2 is noted, not an error about secondary_shard_size
    (which the job never wrote); a config whose "auto" stage accelerate fills with 3 keeps it."""
    ds = {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}, "bf16": {"enabled": True},
          "train_micro_batch_size_per_gpu": 1}
    docs = pytorchjob(["deepspeed", "train.py", "--model_name_or_path", M, "--deepspeed", json.dumps(ds)],
                      workers=1, gpus=8)
    docs[-1]["metadata"]["annotations"] = {"vramfit.io/spec": "sharding: zero2"}
    job = one_job(*docs)
    assert (job.spec.sharding, job.spec.secondary_shard_size) == ("zero2", None)
    assert any("zero_hpz_partition_size 8 (ZeRO++ hpZ) not read: the job runs zero2" in n for n in job.assumptions)
    auto = {**ds, "zero_optimization": {"stage": "auto", "zero_hpz_partition_size": 8}}
    job = one_job(*pytorchjob(["accelerate", "launch", "--use_deepspeed", "--zero_stage", "3", "train.py",
                               "--model_name_or_path", M, "--deepspeed", json.dumps(auto)], workers=1, gpus=8))
    assert (job.spec.sharding, job.spec.secondary_shard_size) == ("zero3", 8)


@pytest.mark.parametrize(
    ("argv", "workers", "gpus", "why"),
    [
        # a shard group that does not divide the data-parallel ranks
        (["accelerate", "launch", "--use_fsdp", "--fsdp_version", "2", "--use_parallelism_config",
          "--parallelism_config_dp_replicate_size", "2", "--parallelism_config_dp_shard_size", "6", "train.py",
          "--model_name_or_path", M], 1, 8, "does not divide the 16 data-parallel ranks"),
        # hybrid sharding of a job that does not shard (axolotl's dp sizes without FSDP)
        (["axolotl", "train", "/cfg/plain.yaml"], 1, 8, "and sharding is not set"),
    ],
    ids=["indivisible", "not-sharded"],
)
def test_unusable_hybrid_settings_are_noted_not_errors(argv: list[str], workers: int, gpus: int, why: str) -> None:
    plain = {"base_model": M, "sequence_len": 2048, "micro_batch_size": 1, "dp_shard_size": 4, "dp_replicate_size": 4}
    job = one_job(*pytorchjob(argv, workers=workers, gpus=gpus, files={"plain.yaml": yaml.safe_dump(plain)}))
    assert job.spec.shard_group_size is None
    assert why in _notes(job)


def test_the_annotation_wins() -> None:
    spec = {"shard_group_size": 16}
    docs = pytorchjob([*HF, "--fsdp", "hybrid_shard auto_wrap"], workers=3, gpus=8)
    docs[0]["metadata"]["annotations"] = {"vramfit.io/spec": json.dumps(spec)}
    job = one_job(*docs)
    assert job.spec.shard_group_size == 16


def test_torchtitan_shards_over_context_parallel_without_dp_shard() -> None:
    """torchtitan's integration test "HSDP+CP (without dp_shard)": dp_shard 1, dp_replicate 2, cp 2 on 4 GPUs. FSDP
    runs over the cp ranks (parallelize.py applies it when dp_shard or cp is enabled), replicated twice."""
    job = torchtitan_job("data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 1\n"
                         "context_parallel_degree = 2\n", 1, 2)
    assert (job.spec.sharding, job.spec.context_parallel, job.spec.shard_group_size) == ("fsdp", 2, 1)
    assert "over the context-parallel ranks" in job.provenance["sharding"]


def test_accelerate_fsdp2_ignores_the_fsdp1_strategy() -> None:
    """accelerate reads fsdp_sharding_strategy for FSDP1 only (utils/dataclasses.py); with fsdp_version 2 a
    HYBRID_SHARD there is not hybrid sharding."""
    config = ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_sharding_strategy: HYBRID_SHARD\n"
              "mixed_precision: bf16\n")
    argv = ["accelerate", "launch", "--config_file", "/cfg/accel.yaml", "train.py", "--model_name_or_path", M]
    job = one_job(*pytorchjob(argv, workers=1, gpus=8, files={"accel.yaml": config}))
    assert (job.spec.sharding, job.spec.shard_group_size) == ("fsdp", None)
    assert "reads sharding_strategy for FSDP1 only" in _notes(job)
    fsdp1 = one_job(*pytorchjob(argv, workers=1, gpus=8,
                                files={"accel.yaml": config.replace("fsdp_version: 2", "fsdp_version: 1")}))
    assert fsdp1.spec.shard_group_size == 8


def test_torchtitan_older_training_keys() -> None:
    """torchtitan before its [parallelism] section: --training.data_parallel_replicate_degree /
    _shard_degree / tensor_parallel_degree and --experimental.context_parallel_degree (its integration tests and
    many launch scripts still pass them)."""
    toml = '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nbatch_size = 1\nseq_len = 8192\n'
    argv = ["torchrun", "-m", "torchtitan.train", "--job.config_file", "/cfg/t.toml",
            "--training.data_parallel_replicate_degree", "2", "--training.data_parallel_shard_degree", "-1",
            "--training.tensor_parallel_degree", "2", "--experimental.context_parallel_degree", "2"]
    job = one_job(*pytorchjob(argv, workers=1, gpus=8, files={"t.toml": toml}))
    s = job.spec
    assert (s.sharding, s.tensor_parallel, s.context_parallel, s.shard_group_size) == ("fsdp", 2, 2, 2)
