"""Placement audit: GPU counts for any node size and model parallelism, deadline reasons and checks, capacity text.

Thresholds come from the predictor itself (a headroom that puts the usable memory between two counts' upper
bounds), so the tests pin placement's search and text, not the predictor's figures.
"""

from __future__ import annotations

from itertools import pairwise

import pytest

from predictors.predict import predict
from predictors.spec import TrainingSpec
from scheduler.placement import auto_gpu_counts, candidate_gpu_counts, place
from tests.scheduler.test_placement import _pool, _spec


def _headroom_between(spec: TrainingSpec, gpu: str, fits: int, too_few: int) -> float:
    """A headroom whose usable memory holds the upper bound on ``fits`` GPUs but not on ``too_few``."""
    upper_fits = predict(spec, gpu_name=gpu, gpus=fits).peak_vram_upper_bytes
    upper_short = predict(spec, gpu_name=gpu, gpus=too_few).peak_vram_upper_bytes
    assert upper_fits < upper_short  # sharded: more GPUs, less memory each
    memory = _pool("probe", gpu=gpu).gpu_spec.memory_bytes
    headroom = 1 - (upper_fits + upper_short) / 2 / memory
    assert 0 <= headroom < 1
    return headroom


@pytest.mark.parametrize(("gpus_per_node", "nodes", "expected"), [
    (8, 3, (1, 2, 4, 8, 16, 24)),
    (16, 3, (1, 2, 4, 8, 16, 32, 48)),  # a whole 16-GPU node is a candidate (was: 8, then 32)
    (6, 3, (1, 2, 4, 6, 12, 18)),  # a whole 6-GPU node is a candidate (was: 4, then 12)
    (1, 3, (1, 2, 3)),
])
def test_auto_counts_include_one_whole_node_of_any_size(gpus_per_node: int, nodes: int,
                                                         expected: tuple[int, ...]) -> None:
    spec = _spec(gpus="auto", sharding="fsdp")
    pool = _pool("p", gpus_per_node=gpus_per_node, nodes=nodes)
    assert tuple(candidate_gpu_counts(spec, pool)) == expected


@pytest.mark.parametrize(("gpus_per_node", "fits", "too_few"), [(6, 6, 4), (16, 16, 8)])
def test_auto_places_on_one_whole_node_when_it_fits(gpus_per_node: int, fits: int, too_few: int) -> None:
    """A job that needs a whole 6- (or 16-) GPU node was sent to two nodes at twice the GPUs."""
    spec = _spec(model="llama-3.1-8b", method="full", precision="bf16-mixed", gpus="auto", sharding="fsdp")
    headroom = _headroom_between(spec, "B200", fits, too_few)
    d = place(spec, [_pool("b", gpu="B200", gpus_per_node=gpus_per_node, nodes=4)], headroom_fraction=headroom,
              suggest=False)
    assert d.chosen is not None and (d.chosen.gpus, d.chosen.nodes) == (fits, 1)


@pytest.mark.parametrize(("model_parallel", "gpus_per_node", "nodes", "limit", "expected"), [
    (2, 8, 2, 16, (2, 4, 8, 16)),
    (6, 8, 4, 32, (6, 12, 18, 24)),  # was only 24: four times the GPUs of a job that fits on 6
    (6, 8, 2, 16, (6, 12)),  # was none: "needs auto GPUs" on a 16-GPU pool
    (3, 8, 4, 32, (3, 6, 12, 18, 24)),
    (16, 8, 4, 32, (16, 32)),
    (16, 8, 1, 8, ()),
    (2, 8, 2, 6, (2, 4, 6)),  # a job limit below a node adds its own largest multiple
])
def test_auto_counts_are_multiples_of_the_model_parallel_size(model_parallel: int, gpus_per_node: int,
                                                              nodes: int, limit: int,
                                                              expected: tuple[int, ...]) -> None:
    assert auto_gpu_counts(gpus_per_node, nodes, limit, model_parallel) == expected


def test_auto_with_model_parallelism_fits_the_smallest_multiple() -> None:
    spec = _spec(gpus="auto", sharding="fsdp", tensor_parallel=2, pipeline_parallel=3)
    d = place(spec, [_pool("a", nodes=2)], suggest=False)
    assert d.decision == "placed" and d.chosen is not None and d.chosen.gpus == 6 and d.chosen.nodes == 1


def test_auto_with_model_parallelism_larger_than_the_pool_says_why() -> None:
    spec = _spec(gpus="auto", sharding="fsdp", tensor_parallel=16)
    d = place(spec, [_pool("a", nodes=1)], suggest=False)
    assert d.decision == "unschedulable"
    reason = d.alternatives[0].reason
    assert "multiple of 16 GPUs" in reason and "at most 8 per job" in reason and "auto GPUs" not in reason


def test_deadline_miss_names_the_fastest_count_tried() -> None:
    """The reason said `fits on 1 GPU but may take 19 h > deadline ... even with more GPUs` while 16 GPUs took
    1.2 h: it now names the most GPUs tried, and the option carries their figures."""
    spec = _spec(gpus="auto", sharding="fsdp")
    pool = _pool("a")
    d = place(spec, [pool], objective="cheapest-within-deadline", deadline_seconds=1.0, suggest=False)
    assert d.decision == "unschedulable"
    option = d.alternatives[0]
    one = place(spec.with_gpus(1), [pool], suggest=False).chosen
    assert one is not None and one.runtime_seconds is not None
    assert option.gpus == 16 and option.runtime_seconds is not None and option.runtime_seconds < one.runtime_seconds
    assert option.reason.startswith("fits on 1 GPU but ")
    alternative = d.to_dict()["alternatives"][0]  # machine-readable: fits in memory, rejected for the deadline
    assert alternative["fits"] is True and alternative["meets_deadline"] is False and alternative["rank"] is None
    assert "on 16 GPUs (the most tried here) it still" in option.reason


def test_deadline_miss_on_a_fixed_count_names_only_that_count() -> None:
    d = place(_spec(gpus=2, sharding="fsdp"), [_pool("a")], objective="cheapest-within-deadline",
              deadline_seconds=1.0, suggest=False)
    reason = d.alternatives[0].reason
    assert reason.startswith("fits on 2 GPUs but ") and "most tried" not in reason


def test_deadline_objective_without_a_runtime_says_the_deadline_is_not_checked() -> None:
    """Without train_tokens or steps there is no runtime: the decision claimed `cheapest within the deadline` for
    any deadline (1 s included)."""
    d = place(_spec(train_tokens=None), [_pool("a")], objective="cheapest-within-deadline", deadline_seconds=1.0)
    assert d.decision == "placed"
    assert "within the deadline" not in d.reasons[0] and "deadline is not checked" in d.reasons[0]
    assert any("is not checked" in w and "train_tokens or steps" in w for w in d.warnings)


def test_a_zero_deadline_argument_is_an_error_not_the_specs_deadline() -> None:
    spec = _spec(deadline_seconds=1e9)
    with pytest.raises(ValueError, match="positive, finite"):
        place(spec, [_pool("a")], objective="cheapest-within-deadline", deadline_seconds=0.0)


def test_waiting_reason_names_the_chosen_pools_own_shortfall() -> None:
    """`no fitting pool has 2 free GPUs` was written with the chosen pool's count, whatever the others needed."""
    spec = _spec(model="llama-3.1-8b", method="full", precision="bf16-mixed", gpus="auto", sharding="fsdp")
    d = place(spec, [_pool("a", gpu="B200", free_gpus=1, gpus_per_node=8, nodes=1)],
              headroom_fraction=_headroom_between(spec, "B200", 2, 1), suggest=False)
    assert d.waits_for_capacity and d.chosen is not None and d.chosen.gpus == 2
    assert "(a: 1 free of 2)" in d.reasons[0]


def test_auto_counts_on_a_huge_pool_are_bounded_and_end_on_the_largest() -> None:
    """200,000 nodes gave 200,003 counts, walked one by one: a job that fit nowhere took seconds to refuse. Past 64
    whole nodes the counts now grow by an eighth a step; up to 64 nodes they are as before."""
    counts = auto_gpu_counts(8, 200_000, 1_600_000)
    assert len(counts) < 200
    assert counts[:67] == (1, 2, 4, *(8 * k for k in range(1, 65)))  # one by one up to 64 nodes
    assert counts[-1] == 1_600_000 and list(counts) == sorted(set(counts))
    assert all(b / a <= 1.13 for a, b in pairwise(counts[66:]))  # steps of at most ~1/8
    assert all(c % 8 == 0 for c in counts[3:])
    wide = auto_gpu_counts(8, 200_000, 1_600_000, 24)  # model parallel wider than a node: 3 nodes a step
    assert len(wide) < 200 and wide[:3] == (24, 48, 72) and wide[-1] == 1_599_984
    assert all(c % 24 == 0 for c in wide)
    assert auto_gpu_counts(8, 64, 512) == (1, 2, 4, *(8 * k for k in range(1, 65)))


def test_a_job_that_fits_nowhere_on_a_huge_pool_names_its_largest_count() -> None:
    spec = _spec(model="llama-3.1-70b", method="full", precision="bf16-mixed", gpus="auto", sharding="zero2")
    decision = place(spec, [_pool("huge", gpu="L40S", nodes=200_000)])
    assert decision.decision == "unschedulable"
    assert "on 1600000 GPUs" in decision.alternatives[0].reason


def test_a_pod_larger_than_the_pools_nodes_is_not_placed_there() -> None:
    # An 8-GPU pod (a manifest's fixed shape) on 4-GPU nodes would stay Pending for ever: the cheaper pool, which
    # fits the job as 2 nodes x 4 GPUs, is out when the pods are 8-GPU pods, with the reason.
    spec = _spec(model="llama-3.1-8b", method="full", sharding="fsdp", gpus=8, train_tokens=10**8)
    small_nodes = _pool("quad", price=1.0, gpus_per_node=4, nodes=4)
    big_nodes = _pool("octo", price=2.0, gpus_per_node=8, nodes=2)
    assert place(spec, [small_nodes, big_nodes]).chosen.pool.name == "quad"  # any pod shape: 2 pods x 4
    decision = place(spec, [small_nodes, big_nodes], pod_shapes=((8, 1),))
    assert decision.chosen is not None and decision.chosen.pool.name == "octo"
    quad = next(o for o in decision.alternatives if o.pool.name == "quad")
    assert not quad.fits and quad.reason == "each pod requests up to 8 GPUs; nodes have 4"
    assert place(spec, [small_nodes], pod_shapes=((8, 1),)).decision == "unschedulable"
    assert place(spec, [small_nodes], pod_shapes=((4, 2),)).chosen.nodes == 2


def test_pods_that_fit_a_node_but_do_not_pack_into_the_pool_are_refused() -> None:
    # 4 pods of 3 GPUs on 4-GPU nodes: one pod per node, so 4 nodes; a pool of 3 such nodes leaves one Pending
    spec = _spec(model="llama-3.2-1b", gpus=12)
    three = _pool("l40s-3", gpu="L40S", gpus_per_node=4, nodes=3)
    decision = place(spec, [three], pod_shapes=((3, 4),))
    assert decision.decision == "unschedulable"
    assert decision.alternatives[0].reason == "its 4 pods (3 GPUs each) need 4 nodes of 4 GPUs; pool has 3"
    four = _pool("l40s-4", gpu="L40S", gpus_per_node=4, nodes=4)
    assert place(spec, [four], pod_shapes=((3, 4),)).chosen.nodes == 4  # not 12 / 4 = 3


def test_suggestions_keep_the_manifests_pods_unless_they_change_the_gpu_count() -> None:
    # a 6-GPU pod that fits no pool: every "what would fit" that keeps 6 GPUs must name the 8-GPU-node pool
    spec = _spec(model="llama-3.1-8b", gpus=6, gradient_checkpointing="none", micro_batch_size=16, seq_len=8192)
    quad = _pool("quad", price=1.0, gpus_per_node=4, nodes=8)
    octo = _pool("octo", price=2.0, gpus_per_node=8, nodes=4)
    kept = [s for s in place(spec, [quad, octo], pod_shapes=((6, 1),)).suggestions if "gpus" not in s.spec_update]
    assert kept and all(s.gpus == 6 and s.pool == "octo" for s in kept)
    # without the pod shape (a TrainingSpec), the cheaper pool's two nodes are suggested
    assert {s.pool for s in place(spec, [quad, octo]).suggestions if "gpus" not in s.spec_update} == {"quad"}


def test_bf16_jobs_are_not_placed_on_gpus_without_bf16() -> None:
    # Volta (V100) has no bf16: a bf16 job was "fitting" there, timed at the fp16 tensor peak
    spec = _spec(model="llama-3.2-1b", gpus=1, precision="bf16-mixed")
    v100 = _pool("v100", gpu="V100-32GB", price=0.5)
    a100 = _pool("a100", gpu="A100-80GB", price=2.0)
    decision = place(spec, [v100, a100])
    assert decision.chosen is not None and decision.chosen.pool.name == "a100"
    reason = next(o.reason for o in decision.alternatives if o.pool.name == "v100")
    assert reason == "V100-32GB has no bf16 (its tensor cores take fp16): bf16-mixed cannot run there; use 16-mixed"
    only_v100 = place(spec, [v100])
    assert only_v100.decision == "unschedulable"
    assert any(s.spec_update == {"precision": "16-mixed"} and s.pool == "v100" for s in only_v100.suggestions)
    fp16 = place(spec.model_copy(update={"precision": "16-mixed"}), [v100, a100])
    assert all(o.fits for o in (fp16.chosen, *fp16.alternatives) if o is not None)


def test_a_defaulted_precision_does_not_rule_out_a_v100() -> None:
    # a plain script without --bf16/--fp16 runs in fp32: the spec's default bf16-mixed must not refuse the V100
    from predictors.spec import parse_training_spec

    spec = parse_training_spec({"model": "llama-3.2-1b", "method": "lora", "train_tokens": "50M"})
    decision = place(spec, [_pool("v100", gpu="V100-32GB", price=0.5)])
    assert decision.decision == "placed"
    assert any("precision not stated: assumed bf16-mixed, which V100-32GB cannot run" in w for w in decision.warnings)


def test_the_simulators_policies_keep_a_stated_bf16_job_off_gpus_without_bf16() -> None:
    from scheduler.pools import PoolsConfig
    from scheduler.simulate.jobs import JobTemplate
    from scheduler.simulate.table import build_table

    pools = PoolsConfig(pools=[_pool("v100", gpu="V100-32GB", price=0.5), _pool("a100", gpu="A100-80GB")])
    stated = JobTemplate(_spec(model="llama-3.2-1b", precision="bf16-mixed", gpus=1))
    table = build_table([stated], pools)
    assert table.allowed(0).tolist() == [False, True]
