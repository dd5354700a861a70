"""Placement: fit edges, GPU counts, capacity, objectives, unschedulable with suggestions."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.predict import predict
from predictors.spec import TrainingSpec
from scheduler.cost import job_cost_usd
from scheduler.placement import _MODEL_CACHE, _variants, candidate_gpu_counts, place
from scheduler.pools import NodePool, PoolsConfig, default_pools


def _spec(**kw: Any) -> TrainingSpec:
    base: dict[str, Any] = {"model": "llama-2-7b", "method": "lora", "precision": "bf16-true",
                            "micro_batch_size": 2, "seq_len": 2048, "gradient_checkpointing": "full",
                            "train_tokens": 2e8}
    base.update(kw)
    return TrainingSpec.model_validate(base)


def _pool(name: str, gpu: str = "A100-80GB", price: float = 2.0, **kw: Any) -> NodePool:
    return NodePool.model_validate({"name": name, "gpu": gpu, "gpus_per_node": 8, "nodes": 2,
                                    "price_usd_per_gpu_hour": price, **kw})


def test_fit_is_inclusive_exactly_at_the_headroom() -> None:
    spec = _spec()
    pool = _pool("a")
    upper = predict(spec, gpu_name="A100-80GB", gpus=1).peak_vram_upper_bytes
    memory = pool.gpu_spec.memory_bytes
    at_edge = 1 - upper / memory  # usable bytes == upper (up to int rounding)
    assert pool.usable_bytes(at_edge) in (upper, upper - 1)
    exact = at_edge - 0.5 / memory  # a hair less headroom: usable rounds to exactly upper
    assert pool.usable_bytes(exact) == upper
    assert place(spec, [pool], headroom_fraction=exact).decision == "placed"
    just_over = at_edge + 2 / memory
    assert pool.usable_bytes(just_over) < upper
    d = place(spec, [pool], headroom_fraction=just_over, suggest=False)
    assert d.decision == "unschedulable" and "usable" in d.reasons[0]


def test_cost_is_gpus_times_hours_times_price() -> None:
    d = place(_spec(), [_pool("a", price=3.0)])
    c = d.chosen
    assert c is not None and c.runtime_seconds is not None
    assert c.cost_usd == pytest.approx(job_cost_usd(1, c.runtime_seconds, 3.0))
    assert c.cost_usd == pytest.approx(c.runtime_seconds / 3600 * 3.0)


def test_auto_picks_the_smallest_count_that_fits_with_sharding() -> None:
    spec = _spec(model="llama-3.1-8b", method="full", precision="bf16-mixed", gpus="auto", sharding="fsdp")
    d = place(spec, [_pool("h", gpu="H100-80GB")])
    assert d.decision == "placed" and d.chosen is not None and d.chosen.gpus is not None
    gpus = d.chosen.gpus
    assert gpus > 1
    smaller = gpus // 2
    assert predict(spec, gpu_name="H100-80GB", gpus=smaller).peak_vram_upper_bytes > d.chosen.usable_bytes


def test_auto_counts_are_powers_of_two_then_whole_nodes() -> None:
    spec = _spec(gpus="auto", sharding="fsdp")
    assert candidate_gpu_counts(spec, _pool("p", nodes=3)) == [1, 2, 4, 8, 16, 24]
    assert candidate_gpu_counts(spec, _pool("p", nodes=3, max_gpus_per_job=16)) == [1, 2, 4, 8, 16]
    assert candidate_gpu_counts(_spec(gpus="auto", sharding="fsdp", tensor_parallel=2), _pool("p")) == [2, 4, 8, 16]
    # replicated (DDP) specs cannot shrink per-GPU memory by adding GPUs: only the smallest count
    assert candidate_gpu_counts(_spec(gpus="auto"), _pool("p")) == [1]


def test_replicated_auto_spec_says_more_gpus_do_not_help() -> None:
    spec = _spec(model="llama-3.1-70b", method="full", gpus="auto")
    d = place(spec, [_pool("a")], suggest=False)
    assert d.decision == "unschedulable"
    assert "more GPUs do not reduce per-GPU memory" in d.alternatives[0].reason


def test_job_spans_whole_nodes() -> None:
    spec = _spec(model="llama-3.1-70b", method="full", precision="bf16-mixed", gpus="auto", sharding="fsdp",
                 micro_batch_size=1)
    d = place(spec, [_pool("h", gpu="H100-80GB", nodes=16)])
    assert d.chosen is not None and d.chosen.gpus is not None and d.chosen.nodes is not None
    assert d.chosen.gpus % 8 == 0 and d.chosen.nodes == d.chosen.gpus // 8


def test_capacity_skips_full_cheaper_pool_and_says_so() -> None:
    cheap_full = _pool("cheap", price=1.0, free_gpus=0)
    dear = _pool("dear", price=5.0)
    d = place(_spec(), [cheap_full, dear])
    assert d.chosen is not None and d.chosen.pool.name == "dear"
    assert any("cheap would be cheaper" in w for w in d.warnings)
    alt = {o.pool.name: o for o in d.alternatives}
    assert alt["cheap"].fits and not alt["cheap"].has_room and "free GPUs" in alt["cheap"].reason


def test_no_pool_with_room_waits_on_the_best_one() -> None:
    d = place(_spec(), [_pool("a", free_gpus=0), _pool("b", price=3.0, free_gpus=0)])
    assert d.decision == "placed" and d.waits_for_capacity and d.chosen is not None
    assert d.chosen.pool.name == "a" and "waits for capacity" in d.reasons[0]


def test_objectives_rank_differently() -> None:
    pools = [_pool("slow-cheap", gpu="A100-80GB", price=0.5), _pool("fast-dear", gpu="H100-80GB", price=20.0)]
    cheapest = place(_spec(), pools)
    fastest = place(_spec(), pools, objective="fastest")
    assert cheapest.chosen is not None and cheapest.chosen.pool.name == "slow-cheap"
    assert fastest.chosen is not None and fastest.chosen.pool.name == "fast-dear"
    assert [o.rank for o in fastest.alternatives] == [1, 2]


def test_cheapest_within_deadline() -> None:
    pools = [_pool("slow-cheap", gpu="A100-80GB", price=0.5), _pool("fast-dear", gpu="H100-80GB", price=20.0)]
    a100 = place(_spec(), [pools[0]]).chosen
    h100 = place(_spec(), [pools[1]]).chosen
    assert a100 and h100 and a100.runtime_seconds and h100.runtime_seconds
    between = (a100.runtime_seconds + h100.runtime_seconds) / 2
    d = place(_spec(), pools, objective="cheapest-within-deadline", deadline_seconds=between)
    assert d.chosen is not None and d.chosen.pool.name == "fast-dear"
    loose = place(_spec(deadline_seconds=a100.runtime_seconds * 2), pools, objective="cheapest-within-deadline")
    assert loose.chosen is not None and loose.chosen.pool.name == "slow-cheap"
    impossible = place(_spec(), pools, objective="cheapest-within-deadline", deadline_seconds=1.0, suggest=False)
    assert impossible.decision == "unschedulable" and all("deadline" in r for r in impossible.reasons)
    with pytest.raises(ValueError, match="needs a deadline"):
        place(_spec(), pools, objective="cheapest-within-deadline")


def test_deadline_is_checked_against_the_runtime_upper_bound() -> None:
    """A deadline is a promise like the memory fit: a job whose expected runtime meets it but whose calibrated
    upper bound does not is not placed on that pool, and the reason shows both figures."""
    pool = _pool("a")
    chosen = place(_spec(), [pool]).chosen
    assert chosen is not None and chosen.runtime_seconds and chosen.runtime_upper_seconds
    assert chosen.runtime_upper_seconds > chosen.runtime_seconds
    between = (chosen.runtime_seconds + chosen.runtime_upper_seconds) / 2
    tight = place(_spec(), [pool], objective="cheapest-within-deadline", deadline_seconds=between, suggest=False)
    assert tight.decision == "unschedulable"
    assert "upper bound" in tight.reasons[0] and "expected" in tight.reasons[0]
    ok = place(_spec(), [pool], objective="cheapest-within-deadline",
               deadline_seconds=chosen.runtime_upper_seconds * 1.001, suggest=False)
    assert ok.decision == "placed" and ok.chosen is not None and ok.chosen.meets_deadline is True
    assert ok.to_dict()["predicted_runtime_upper_seconds"] == pytest.approx(chosen.runtime_upper_seconds)


def test_deadline_with_auto_adds_gpus_until_fast_enough() -> None:
    spec = _spec(gpus="auto", sharding="fsdp")
    one = place(spec, [_pool("a")]).chosen
    assert one is not None and one.gpus == 1 and one.runtime_seconds
    d = place(spec, [_pool("a")], objective="cheapest-within-deadline", deadline_seconds=one.runtime_seconds / 3)
    assert d.chosen is not None and d.chosen.gpus is not None and d.chosen.gpus >= 4


def test_pinned_gpu_restricts_pools_and_selectors_are_carried() -> None:
    pools = [_pool("a"), _pool("h", gpu="H100-80GB", price=0.1, node_selector={"gpu": "h100"},
                                tolerations=[{"key": "gpu", "operator": "Exists"}])]
    pinned = place(_spec(gpu="A100-80GB"), pools)
    assert pinned.chosen is not None and pinned.chosen.pool.name == "a"
    assert "pins gpu" in {o.pool.name: o for o in pinned.alternatives}["h"].reason
    free = place(_spec(), pools).to_dict()
    assert free["pool"] == "h" and free["node_selector"] == {"gpu": "h100"}
    assert free["tolerations"] == [{"key": "gpu", "operator": "Exists"}]


def test_unschedulable_has_one_reason_per_pool_and_repredicted_suggestions() -> None:
    spec = _spec(model="llama-3.2-3b", method="full", precision="bf16-true", gradient_checkpointing="none",
                 micro_batch_size=8, seq_len=4096, gpus=1)
    pools = PoolsConfig(pools=[p for p in default_pools().pools if p.gpu != "B200"])
    d = place(spec, pools)
    out = d.to_dict()
    assert out["decision"] == "unschedulable" and out["pool"] is None
    assert len(out["reasons"]) == len(pools.pools) and all(not a["fits"] for a in out["alternatives"])
    assert out["suggestions"]
    assert any("micro_batch_size: 1" in s["change"] for s in out["suggestions"])
    for s in d.suggestions:
        variant = spec.model_copy(update=s.spec_update)
        if variant.gpus == "auto":
            variant = variant.with_gpus(s.gpus)
        again = predict(variant, gpu_name=s.gpu, gpus=s.gpus)
        assert again.vram.peak_vram_bytes == s.peak_vram_bytes
        assert s.peak_vram_upper_bytes <= next(p for p in pools.pools if p.name == s.pool).usable_bytes(0.05)
        assert s.predicted_cost_usd is not None and s.predicted_cost_usd > 0


def test_json_contract_keys() -> None:
    out = place(_spec(), default_pools()).to_dict()
    assert {"decision", "pool", "gpu", "gpus", "nodes", "peak_vram_bytes", "peak_vram_upper_bytes",
            "predicted_runtime_seconds", "predicted_cost_usd", "alternatives", "suggestions", "reasons",
            "warnings", "node_selector", "tolerations"} <= set(out)
    for alt in out["alternatives"]:
        assert {"pool", "gpu", "fits", "gpus", "predicted_runtime_seconds", "predicted_cost_usd", "reason"} <= set(alt)


def test_without_tokens_ranks_by_hourly_cost_and_warns() -> None:
    d = place(_spec(train_tokens=None), [_pool("a", price=1.0), _pool("b", price=2.0)])
    assert d.chosen is not None and d.chosen.pool.name == "a" and d.chosen.cost_usd is None
    assert any("hourly cost" in w for w in d.warnings)


def test_what_if_changes_cover_the_usual_levers() -> None:
    spec = _spec(method="full", gradient_checkpointing="none", micro_batch_size=4)
    labels = " | ".join(label for label, _ in _variants(spec))
    for lever in ("gradient_checkpointing: full", "micro_batch_size: 1 with grad_accum_steps: 4", "sharding: fsdp",
                  "method: lora", "method: qlora", "offload: optimizer", "offload: params+optimizer"):
        assert lever in labels


def test_when_no_single_change_fits_a_combination_is_suggested() -> None:
    spec = _spec(model="llama-3.1-70b", method="full", precision="bf16-mixed", gradient_checkpointing="none",
                 micro_batch_size=4, seq_len=4096, gpus=1)
    d = place(spec, default_pools())
    assert d.decision == "unschedulable" and d.suggestions
    assert " + " in d.suggestions[0].change and "{gpus}" not in d.suggestions[0].change


def test_predictions_are_memoised_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import predictors.predict as predict_module
    import scheduler.placement as placement

    calls: list[int | None] = []  # GPU counts whose memory was predicted
    real = predict_module.predict_vram_without_gpu

    def counting(spec: TrainingSpec, arch: object, gpus: int | None, *args: object) -> object:
        calls.append(gpus)
        return real(spec, arch, gpus, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(predict_module, "predict_vram_without_gpu", counting)
    monkeypatch.setattr(placement, "_CACHE_SIZE", 2)
    placement.clear_prediction_cache()
    pools = [_pool("a"), _pool("b", price=3.0)]  # same GPU type: one prediction serves both
    first = place(_spec(), pools)
    assert len(calls) == 1
    again = place(_spec(), pools)
    assert len(calls) == 1 and again.to_dict() == first.to_dict()
    place(_spec(micro_batch_size=3), pools)
    place(_spec(micro_batch_size=4), pools)
    assert len(placement._cache) == 2  # bounded: the oldest spec went
    place(_spec(), pools)
    assert len(calls) == 4


def test_a_memory_only_prediction_gets_its_runtime_when_a_roomier_pool_asks() -> None:
    import scheduler.placement as placement

    placement.clear_prediction_cache()
    spec = _spec(model="llama-3.1-8b", method="lora", precision="bf16-true", seq_len=2048)
    tight = place(spec, [_pool("a", gpu="L40S")], headroom_fraction=0.9, suggest=False)
    assert tight.decision == "unschedulable"
    roomy = place(spec, [_pool("a", gpu="L40S")], headroom_fraction=0.0, suggest=False)
    out = roomy.to_dict()
    assert out["decision"] == "placed" and out["predicted_runtime_seconds"] and out["predicted_cost_usd"]


def test_pool_facts_follow_an_edited_copy_of_a_pool() -> None:
    """Placement works a pool's facts (memory, links, GPU counts) out once per pool object: an edited copy is
    another object and gets its own."""
    spec = _spec(gpus="auto", sharding="fsdp")
    pool = _pool("p", nodes=3)
    assert candidate_gpu_counts(spec, pool) == [1, 2, 4, 8, 16, 24]
    smaller = pool.model_copy(update={"nodes": 1})
    assert candidate_gpu_counts(spec, smaller) == [1, 2, 4, 8]
    assert candidate_gpu_counts(spec, pool) == [1, 2, 4, 8, 16, 24]


def test_paged_optimizer_states_need_no_margin_only_their_expected_size() -> None:
    """bitsandbytes' paged states page to host memory when the GPU is full: the rest of the bound and the expected
    peak must fit, not the whole bound (torchtune's 8B full fine-tuning on one 24-48 GB card)."""
    from predictors.predict import required_bytes

    spec = _spec(model="llama-3.1-8b", method="full", optimizer="paged-adamw-8bit", optimizer_in_backward=True,
                 cross_entropy="chunked", torch_compile=True)
    pred = predict(spec, gpu_name="L40S", gpus=1)
    paged = pred.vram.breakdown_bytes["paged_optimizer_states"]
    device, upper = pred.vram.peak_vram_bytes, pred.peak_vram_upper_bytes
    needed = required_bytes(upper, pred.vram)
    assert needed == max(int(upper * (1 - paged / device)), device) and needed < upper
    pool = _pool("l40s", gpu="L40S", price=1.0)
    usable = pool.usable_bytes(0.05)
    assert needed <= usable < upper  # fits only because the paged states need no margin
    d = place(spec, [pool], headroom_fraction=0.05)
    assert d.decision == "placed" and any("page to host memory" in r for r in d.reasons)
    # the chosen row says why its bound is above the usable memory, as the other rows do
    assert d.chosen is not None and d.chosen.reason == "chosen (paged optimizer states outside the margin)"
    # the same spec with 8-bit states the allocator holds does not fit: they get the margin
    unpaged = _spec(model="llama-3.1-8b", method="full", optimizer="adamw-8bit", optimizer_in_backward=True,
                    cross_entropy="chunked", torch_compile=True)
    no = place(unpaged, [pool], headroom_fraction=0.05, suggest=False)
    assert no.decision == "unschedulable" and "paged" not in no.reasons[0]
    # and a card too small for the expected peak with the states resident is not chosen (paging would be expected)
    small = _pool("l4", gpu="L4", price=0.5)
    assert place(spec, [small], headroom_fraction=0.05, suggest=False).decision == "unschedulable"


def test_hybrid_sharding_tries_whole_groups_and_the_memory_stops_shrinking() -> None:
    """Past one shard group, more GPUs add replicas, not memory: the counts tried are those up to a group, then
    whole groups; a job too large for one group fits nowhere, and a suggestion drops the group."""
    pool = _pool("p", gpus_per_node=6, nodes=4)  # nodes of 6: 6 and 18 GPUs are not whole groups of 4
    spec = _spec(gpus="auto", sharding="fsdp", shard_group_size=4)
    assert candidate_gpu_counts(spec, pool) == [1, 2, 4, 12, 24]
    big = _spec(model="llama-3.1-8b", method="full", precision="bf16-mixed", gpus="auto", sharding="fsdp",
                shard_group_size=2)
    pools = [_pool("h", gpu="H100-80GB", nodes=4)]
    d = place(big, pools)
    assert d.decision == "unschedulable"
    assert "on 32 GPUs" in d.reasons[0]
    assert "shard over every data-parallel rank (no shard_group_size)" in [s.change for s in d.suggestions]
    assert place(big.model_copy(update={"shard_group_size": None}), pools).decision == "placed"


def test_secondary_shard_counts_and_suggestion() -> None:
    """ZeRO++ hpZ groups of 4 split the data-parallel ranks evenly, or one group holds them all; a job that the
    second copy pushes past every pool gets the suggestion to drop it."""
    pool = _pool("p", gpus_per_node=6, nodes=4)
    spec = _spec(gpus="auto", sharding="zero3", secondary_shard_size=4)
    assert candidate_gpu_counts(_spec(gpus="auto", sharding="zero3"), pool) == [1, 2, 4, 6, 12, 18, 24]
    assert candidate_gpu_counts(spec, pool) == [1, 2, 4, 12, 24]  # 6 and 18 ranks are not whole groups of 4
    big = _spec(model="llama-3.1-70b", method="full", precision="bf16-mixed", gradient_checkpointing="full",
                gpus=32, sharding="zero3", secondary_shard_size=8)
    pools = [_pool("h", gpu="H100-80GB", nodes=4)]
    d = place(big, pools)
    assert d.decision == "unschedulable"
    assert "no secondary parameter shard (drop secondary_shard_size, ZeRO++ hpZ)" in [s.change for s in d.suggestions]
    assert place(big.model_copy(update={"secondary_shard_size": None}), pools).decision == "placed"


def test_the_model_cache_tells_a_teacher_job_from_the_same_student_without_one() -> None:
    """resolve_model_cached keyed on the model alone handed a teacher-less ResolvedModel to a distillation spec
    (ValueError) and a teacher's architecture to a plain one (53.6 instead of 31.9 GiB), whichever came first."""
    from scheduler.placement import clear_prediction_cache, resolve_model_cached

    plain = _spec(model="llama-3.1-8b", method="full", gpus=8, sharding="fsdp")
    distil = plain.model_copy(update={"teacher_model": "llama-3.1-70b"})
    pools = [_pool("h", gpu="H100-80GB", nodes=2)]
    alone = {}
    for spec in (plain, distil):
        _MODEL_CACHE.clear()
        clear_prediction_cache()
        alone[spec.teacher_model] = place(spec, pools, suggest=False).chosen
    for order in ((plain, distil), (distil, plain)):
        _MODEL_CACHE.clear()
        clear_prediction_cache()
        for spec in order:
            chosen = place(spec, pools, suggest=False).chosen
            assert chosen is not None and alone[spec.teacher_model] is not None
            assert chosen.peak_vram_bytes == alone[spec.teacher_model].peak_vram_bytes
    assert resolve_model_cached(distil).teacher is not None and resolve_model_cached(plain).teacher is None
