"""ZeRO++ hpZ (``secondary_shard_size``): besides the ZeRO-3 shard over every rank, each GPU keeps a second shard of
the 16-bit parameters over a node-sized group, from which backward gathers on the node's links. Memory goes up by
16-bit parameters / group per GPU; backward's gathers leave the network."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.runtime import Interconnect, predict_runtime
from predictors.spec import TrainingSpec, parse_training_spec
from tests.predictors.test_vram import PARAMS, run


def test_the_second_copy_is_the_16_bit_parameters_over_the_group() -> None:
    """bf16-mixed ZeRO-3 over 16 ranks, hpZ groups of 8: 2 bytes x parameters / 8 more per GPU, nothing else moves."""
    plain = run(precision="bf16-mixed", gpus=16, sharding="zero3")
    hpz = run(precision="bf16-mixed", gpus=16, sharding="zero3", secondary_shard_size=8)
    assert plain.breakdown_bytes.get("secondary_weights", 0) == 0
    assert hpz.breakdown_bytes["secondary_weights"] == pytest.approx(PARAMS * 2 / 8, abs=1)
    for name in ("weights", "optimizer_states", "master_weights", "gradients", "activations"):
        assert hpz.breakdown_bytes.get(name) == plain.breakdown_bytes.get(name), name
    assert hpz.peak_allocated_bytes - plain.peak_allocated_bytes == pytest.approx(PARAMS * 2 / 8, abs=2)
    assert any("sharded over 8 ranks for backward's gathers" in n for n in hpz.notes)


def test_dtype_method_and_offload() -> None:
    # fp32 parameters are gathered (and kept) in fp32
    assert run(precision="32-true", gpus=16, sharding="zero3", secondary_shard_size=4).breakdown_bytes[
        "secondary_weights"] == pytest.approx(PARAMS * 4 / 4, abs=1)
    # a LoRA job's frozen bf16 base is partitioned the same way
    assert run(method="lora", precision="bf16-true", gpus=16, sharding="zero3", secondary_shard_size=8
               ).breakdown_bytes["secondary_weights"] == pytest.approx(PARAMS * 2 / 8, abs=1)
    # with parameter offload the secondary shard lives where the parameters do, off the GPU
    assert run(precision="bf16-mixed", gpus=16, sharding="zero3", offload="params+optimizer",
               secondary_shard_size=8).breakdown_bytes.get("secondary_weights", 0) == 0


def test_a_smaller_group_needs_more_memory() -> None:
    sizes = [run(precision="bf16-mixed", gpus=32, sharding="zero3", secondary_shard_size=g).peak_allocated_bytes
             for g in (2, 4, 8, 16, 32)]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[-1] > run(precision="bf16-mixed", gpus=32, sharding="zero3").peak_allocated_bytes


def test_a_group_wider_than_the_job_is_the_whole_job() -> None:
    """gpus auto placed on 4 GPUs with groups of 8: one group of 4 (the copy is a quarter of the parameters)."""
    spec = parse_training_spec({"model": {"name": "tiny", "config": {}}, "gpus": "auto", "sharding": "zero3",
                                "secondary_shard_size": 8})
    assert spec.secondary_shard_size == 8
    four = run(precision="bf16-mixed", gpus=4, sharding="zero3", secondary_shard_size=8)
    assert four.breakdown_bytes["secondary_weights"] == pytest.approx(PARAMS * 2 / 4, abs=1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": 16, "sharding": "zero2", "secondary_shard_size": 8}, "sharding is zero2"),
        ({"gpus": 16, "sharding": "fsdp-grad-op", "secondary_shard_size": 8}, "sharding is fsdp-grad-op"),
        ({"gpus": 16, "secondary_shard_size": 8}, "sharding is unset"),
        ({"gpus": 16, "sharding": "zero3", "secondary_shard_size": 1}, "turns hpZ off"),
        ({"gpus": 12, "sharding": "zero3", "secondary_shard_size": 8}, "must divide the 12 data-parallel ranks"),
        ({"gpus": 32, "sharding": "zero3", "shard_group_size": 8, "secondary_shard_size": 3},
         "must divide the 8 data-parallel ranks that share the states (gpus 32, shard_group_size 8)"),
        ({"gpus": 16, "sharding": "zero3", "secondary_shard_size": 0}, "secondary_shard_size"),
    ],
    ids=["zero2", "grad-op", "unset", "one", "indivisible", "inside-hybrid", "zero"],
)
def test_bad_sizes_are_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_training_spec({"model": "llama-3.1-8b", **fields})
    assert message in str(err.value)


def test_backward_gathers_on_the_node_links() -> None:
    """4 nodes of 8 H100s on a 25 GB/s network: with hpZ groups of 8, backward's all-gathers of the 16-bit
    parameters run over NVLink; the forward's gathers and the reduce-scatter stay on the network."""
    def spec(**kw: Any) -> TrainingSpec:
        return TrainingSpec.model_validate({"model": "llama-3.1-8b", "precision": "bf16-mixed", "gpus": 32,
                                            "sharding": "zero3", "micro_batch_size": 2, "seq_len": 4096, **kw})
    arch = resolve_model(spec()).architecture
    link = Interconnect(gpus_per_node=8, inter_node_bytes_per_second=25e9)
    gpu = lookup_gpu("H100-80GB")
    comm = "data_parallel_communication"
    plain = predict_runtime(spec(), arch, gpu, gpus=32, interconnect=link).components_seconds[comm]
    hpz = predict_runtime(spec(secondary_shard_size=8), arch, gpu, gpus=32, interconnect=link).components_seconds[comm]
    from predictors.runtime import _link_bytes_per_second, efficiency_table
    table = efficiency_table()
    network = _link_bytes_per_second(gpu, 64, link, table)
    node = _link_bytes_per_second(gpu, 8, link, table)
    one_gather = arch.params_total * 2.0  # bf16 parameters
    # the network carries one gather fewer; the node carries it instead, over 8 ranks
    assert plain - hpz == pytest.approx(31 / 32 * one_gather / network - 7 / 8 * one_gather / node, rel=1e-6)
    assert hpz < plain
