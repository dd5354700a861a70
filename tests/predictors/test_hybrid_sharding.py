"""Hybrid sharding (``shard_group_size``): the states are split over a group of data-parallel ranks and replicated
across groups, so the memory per GPU is that of a job the size of one group, and the gathers stay in the group."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.runtime import Interconnect, predict_runtime
from predictors.spec import TrainingSpec, parse_training_spec
from predictors.vram import predict_vram
from tests.predictors.test_vram import PARAMS, run


def test_states_are_sharded_over_the_group_only() -> None:
    """bf16-true AdamW on the tiny model: weights 2 and states 4 bytes per parameter, over 4 ranks (not 16)."""
    hybrid = run(precision="bf16-true", gpus=16, sharding="fsdp", shard_group_size=4)
    flat = run(precision="bf16-true", gpus=4, sharding="fsdp")
    assert hybrid.breakdown_bytes["weights"] == pytest.approx(PARAMS * 2 / 4, abs=1)
    assert hybrid.breakdown_bytes["optimizer_states"] == pytest.approx(PARAMS * 4 / 4, abs=1)
    assert hybrid.peak_allocated_bytes == flat.peak_allocated_bytes
    assert any("replicated across 4 groups" in n for n in hybrid.notes)
    # ZeRO-3 (MiCS) and SHARD_GRAD_OP (HYBRID_SHARD_ZERO2) likewise
    for sharding in ("zero3", "fsdp-grad-op"):
        assert run(precision="bf16-true", gpus=16, sharding=sharding, shard_group_size=4).peak_allocated_bytes == \
            run(precision="bf16-true", gpus=4, sharding=sharding).peak_allocated_bytes


def test_the_group_spans_context_parallel_ranks_too() -> None:
    """torchtitan shards over dp_shard x cp: a group of 2 data-parallel ranks with context parallel 2 is 4 ranks."""
    p = run(precision="bf16-true", gpus=16, sharding="fsdp", context_parallel=2, shard_group_size=2)
    assert p.breakdown_bytes["weights"] == pytest.approx(PARAMS * 2 / 4, abs=1)


def test_a_smaller_group_never_needs_less_memory() -> None:
    sizes = [run(precision="bf16-mixed", gpus=32, sharding="fsdp", shard_group_size=g).peak_vram_bytes
             for g in (1, 2, 4, 8, 16, 32)]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[-1] == run(precision="bf16-mixed", gpus=32, sharding="fsdp").peak_vram_bytes


def test_gpus_auto_keeps_the_group_at_most_the_data_parallel_size() -> None:
    spec = parse_training_spec({"model": {"name": "tiny", "config": {}}, "gpus": "auto", "sharding": "fsdp",
                                "shard_group_size": 8})
    assert (spec.shard_group(4), spec.shard_group(8), spec.shard_group(32)) == (4, 8, 8)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": 16, "sharding": "ddp", "shard_group_size": 8}, "sharding is ddp"),
        ({"gpus": 16, "shard_group_size": 8}, "sharding is unset"),
        ({"gpus": 16, "sharding": "zero2", "shard_group_size": 8}, "sharding is zero2"),
        ({"gpus": 16, "sharding": "fsdp", "shard_group_size": 3}, "must divide the 16 data-parallel ranks"),
        ({"gpus": 16, "sharding": "fsdp", "tensor_parallel": 2, "shard_group_size": 16},
         "must divide the 8 data-parallel ranks"),
        ({"gpus": 16, "sharding": "fsdp", "shard_group_size": 0}, "shard_group_size"),
    ],
    ids=["ddp", "unset", "zero2", "indivisible", "tensor-parallel", "zero"],
)
def test_bad_groups_are_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_training_spec({"model": "llama-3.1-8b", **fields})
    assert message in str(err.value)


def test_hybrid_gathers_inside_the_node_and_all_reduces_the_shard_across_nodes() -> None:
    """4 nodes of 8 H100s with a 25 GB/s NIC per GPU: FSDP over all 32 ranks runs its rings at the node's eight NICs
    together (200 GB/s, under NVLink's 450); HSDP with a group of 8 gathers over NVLink and all-reduces each rank's
    1/8 gradient shard across the 4 nodes in a replica group with one member per node, so at one NIC."""
    def spec(**kw: Any) -> TrainingSpec:
        return TrainingSpec.model_validate({"model": "llama-3.1-8b", "precision": "bf16-mixed", "gpus": 32,
                                            "sharding": "fsdp", "micro_batch_size": 2, "seq_len": 4096, **kw})
    arch = resolve_model(spec()).architecture
    link = Interconnect(gpus_per_node=8, inter_node_bytes_per_second=25e9)
    gpu = lookup_gpu("H100-80GB")
    flat = predict_runtime(spec(), arch, gpu, gpus=32, interconnect=link)
    hybrid = predict_runtime(spec(shard_group_size=8), arch, gpu, gpus=32, interconnect=link)
    one_node = predict_runtime(spec(gpus=8), arch, gpu, gpus=8, interconnect=link)
    comm = "data_parallel_communication"
    # flat: the one-node ring's bytes (x 31/32 for 7/8 of the ring) at the pooled NICs instead of NVLink
    assert flat.components_seconds[comm] == pytest.approx(
        one_node.components_seconds[comm] * (31 / 32) / (7 / 8) * 450e9 / (8 * 25e9), rel=1e-9)
    assert hybrid.components_seconds[comm] > one_node.components_seconds[comm]  # + the cross-node all-reduce
    # the all-reduce of a 1/8 shard of the fp32 gradients: 2 x 3/4 x 8.03e9 x 4 / 8 bytes at one NIC per GPU
    gathers = one_node.components_seconds[comm]
    assert hybrid.components_seconds[comm] - gathers == pytest.approx(
        2 * 3 / 4 * arch.params_total * 4 / 8 / _network_bps(gpu, link, stride=8), rel=1e-6)
    # the optimizer updates a shard of 1/8, as on one node
    assert hybrid.components_seconds["optimizer_step"] == pytest.approx(
        one_node.components_seconds["optimizer_step"])


def _network_bps(gpu: Any, link: Interconnect, stride: int = 1) -> float:
    """The collective bandwidth of a group wider than a node whose members are ``stride`` apart."""
    from predictors.runtime import _link_bytes_per_second, efficiency_table
    return _link_bytes_per_second(gpu, 64, link, efficiency_table(), stride=stride)


def test_predict_vram_reads_the_group_from_the_spec_not_the_pool() -> None:
    spec = TrainingSpec.model_validate({"model": "llama-3.1-8b", "gpus": 32, "sharding": "fsdp",
                                        "shard_group_size": 8, "gradient_checkpointing": "full"})
    arch = resolve_model(spec).architecture
    hybrid = predict_vram(spec, arch, lookup_gpu("H100-80GB"))
    eight = predict_vram(spec.model_copy(update={"gpus": 8, "shard_group_size": None}), arch, lookup_gpu("H100-80GB"))
    assert hybrid.peak_vram_bytes == eight.peak_vram_bytes
