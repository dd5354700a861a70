"""Variable-length micro-batches: the caching allocator's fragmentation (sequence_lengths, mean_seq_len,
expandable_segments), tied to vramfit's H100 measurements (bench/data/variable_lengths-H100.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from predictors import vram as vram_module
from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.predict import predict, required_bytes
from predictors.spec import TrainingSpec, parse_training_spec
from predictors.vram import _VARIABLE_LENGTH_LOGIT_COPIES, predict_vram
from scheduler.cli.predict import fit_verdict
from scheduler.placement import place
from scheduler.pools import NodePool

BENCH_ROWS = Path(__file__).resolve().parents[2] / "bench" / "data" / "variable_lengths-H100.jsonl"
GIB = 2**30


def _spec(**kw: Any) -> TrainingSpec:
    base: dict[str, Any] = {"model": "qwen2.5-1.5b", "method": "lora", "precision": "bf16-true", "seq_len": 2048,
                            "gradient_checkpointing": "full", "framework": "transformers",
                            "lora": {"rank": 8, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj"]}}
    return parse_training_spec({**base, **kw})


def _vram(spec: TrainingSpec, gpu: str = "H100-80GB"):  # type: ignore[no-untyped-def]
    return predict_vram(spec, resolve_model(spec).architecture, lookup_gpu(gpu))


def test_fragmentation_is_fifteen_fp32_copies_of_a_mean_length_micro_batchs_logits() -> None:
    fixed = _vram(_spec())
    varying = _vram(_spec(sequence_lengths="variable", mean_seq_len=1000, micro_batch_size=2))
    fixed2 = _vram(_spec(micro_batch_size=2))
    vocab = resolve_model(fixed_spec := _spec()).architecture.vocab_size
    assert fixed_spec.sequence_lengths is None
    expected = _VARIABLE_LENGTH_LOGIT_COPIES * 4 * 2 * 1000 * vocab
    assert varying.breakdown_bytes["allocator_fragmentation"] == pytest.approx(expected, abs=1)
    # reserved and device grow by it; the tensors (allocated) do not, as measured (within 20 MiB)
    assert varying.peak_allocated_bytes == fixed2.peak_allocated_bytes
    assert varying.peak_reserved_bytes - fixed2.peak_reserved_bytes == pytest.approx(expected, abs=2)
    assert varying.peak_vram_bytes == sum(varying.breakdown_bytes.values())
    assert "allocator_fragmentation" not in fixed.breakdown_bytes
    assert any("expandable_segments:True" in n for n in varying.notes)
    # unset mean: half of seq_len
    half = _vram(_spec(sequence_lengths="variable"))
    assert half.breakdown_bytes["allocator_fragmentation"] == pytest.approx(
        _VARIABLE_LENGTH_LOGIT_COPIES * 4 * 1024 * vocab, abs=1)


def test_no_fragmentation_with_expandable_segments_or_without_a_vocabulary_sized_loss() -> None:
    plain = _vram(_spec())
    expandable = _vram(_spec(sequence_lengths="variable", expandable_segments=True))
    assert "allocator_fragmentation" not in expandable.breakdown_bytes
    assert expandable.peak_reserved_bytes == plain.peak_reserved_bytes
    assert any("no fragmentation" in n for n in expandable.notes)
    fused = _vram(_spec(sequence_lengths="variable", cross_entropy="fused-linear"))
    assert "allocator_fragmentation" not in fused.breakdown_bytes
    classify = _vram(_spec(sequence_lengths="variable", task="seq-classification"))
    assert "allocator_fragmentation" not in classify.breakdown_bytes
    chunked = _vram(_spec(sequence_lengths="variable", cross_entropy="chunked"))
    full = _vram(_spec(sequence_lengths="variable"))
    assert chunked.breakdown_bytes["allocator_fragmentation"] == pytest.approx(
        full.breakdown_bytes["allocator_fragmentation"] / 8, abs=1)


@pytest.mark.parametrize(("fields", "message"), [
    ({"mean_seq_len": 512}, "sequence_lengths is unset (fixed)"),
    ({"sequence_lengths": "variable", "mean_seq_len": 4096}, "mean_seq_len (4096) is more than seq_len (2048)"),
    ({"sequence_lengths": "ragged"}, "sequence_lengths"),
    ({"expandable_segments": "maybe"}, "expandable_segments"),
])
def test_bad_fields_name_what_is_wrong(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        _spec(**fields)
    assert message in str(info.value)


def _bench_spec(row: dict[str, Any]) -> TrainingSpec:
    fields: dict[str, Any] = {**row["spec"], "framework": "transformers", "gpu": "H100-80GB"}
    if row["mode"] != "fixed":
        fields.update(sequence_lengths="variable", mean_seq_len=round(row["mean_length"]))
    if row["mode"] == "variable-expandable":
        fields["expandable_segments"] = True
    return parse_training_spec(fields)


def test_the_measured_h100_rows_are_predicted() -> None:
    """The bench's seven runs (three configs, three ways): allocated within 2 %, reserved within 20 % (the 1.5B run
    at 2,048 tokens kept growing to 480 micro-batches: 20.5 copies, not the 15 of the median), and the
    excess over fixed lengths is the fragmentation term's within 40 %."""
    rows = [json.loads(line) for line in BENCH_ROWS.read_text().splitlines() if line.strip()]
    assert len(rows) == 7 and all(r["num_alloc_retries"] == 0 for r in rows)
    fixed = {(r["model"], r["max_length"]): r for r in rows if r["mode"] == "fixed"}
    for row in rows:
        vram = _vram(_bench_spec(row))
        assert vram.peak_allocated_bytes == pytest.approx(row["peak_allocated_bytes"], rel=0.02)
        assert vram.peak_reserved_bytes == pytest.approx(row["peak_reserved_bytes"], rel=0.20)
        if row["mode"] == "variable":
            base = fixed[(row["model"], row["max_length"])]
            measured = row["peak_reserved_bytes"] - base["peak_reserved_bytes"]
            assert measured > 4 * GIB  # the effect the term stands for is there
            assert vram.breakdown_bytes["allocator_fragmentation"] == pytest.approx(measured, rel=0.40)
        if row["mode"] == "variable-expandable":  # expandable segments: within 2 % of fixed lengths, measured
            base = fixed[(row["model"], row["max_length"])]
            assert row["peak_reserved_bytes"] == pytest.approx(base["peak_reserved_bytes"], rel=0.02)


def test_fragmentation_never_decides_the_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch frees cached blocks and retries before an allocation fails, so a GPU with room for everything but
    the fragmentation still runs the job (ms-swift's batch-8 run reserved 76.1 GiB of an A100 80GB)."""
    spec = _spec(model="qwen2.5-7b", micro_batch_size=8, sequence_lengths="variable", mean_seq_len=1134)
    pred = predict(spec, gpu_name="A100-80GB", gpus=1)
    cache = pred.vram.breakdown_bytes["allocator_fragmentation"]
    device, upper = pred.vram.peak_vram_bytes, pred.peak_vram_upper_bytes
    needed = required_bytes(upper, pred.vram)
    assert needed == max(int(upper * (1 - cache / device)), device - cache) and needed < upper
    # on the A100 the cache fills the device and no more: 29 of the 77 GiB it holds with room, beside the rest's 50
    roomy = predict(spec, gpu_name="H200", gpus=1).vram
    assert device == lookup_gpu("A100-80GB").memory_bytes
    assert pred.vram.peak_reserved_bytes == device - pred.vram.breakdown_bytes["cuda_context"]
    assert 25 * GIB < cache < roomy.breakdown_bytes["allocator_fragmentation"] - 40 * GIB
    assert any("only up to the device's memory: 77.09 -> 29.15 GiB" in n for n in pred.vram.notes)
    # what the job needs is the same as with the whole cache counted: the bound's share without it
    monkeypatch.setattr(vram_module, "_cache_beyond_device", lambda cache, peak, gpu: 0)
    whole = predict(spec, gpu_name="A100-80GB", gpus=1)
    assert whole.vram.breakdown_bytes["allocator_fragmentation"] > 70 * GIB
    assert needed == pytest.approx(required_bytes(whole.peak_vram_upper_bytes, whole.vram), rel=1e-6)
    monkeypatch.undo()
    # the same job without the term needs what the rest needs, give or take the margin's rounding
    fixed = predict(_spec(model="qwen2.5-7b", micro_batch_size=8), gpu_name="A100-80GB", gpus=1)
    assert needed >= fixed.vram.peak_vram_bytes - GIB
    # placement: an H200 pool fits it; on an A100 80GB only the fragmentation is above the usable memory
    verdict = fit_verdict(pred)
    assert "does not fit" not in verdict and "expected peak" in verdict and "without the allocator" in verdict


def test_placement_says_why_a_bound_above_the_usable_memory_fits() -> None:
    spec = _spec(model="qwen2.5-7b", micro_batch_size=2, sequence_lengths="variable", mean_seq_len=1134,
                 train_tokens=2e8)
    pool = NodePool.model_validate({"name": "l40s", "gpu": "L40S", "gpus_per_node": 8, "nodes": 1,
                                    "price_usd_per_gpu_hour": 1.0})
    usable = pool.usable_bytes(0.05)
    pred = predict(spec, gpu_name="L40S", gpus=1)
    assert required_bytes(pred.peak_vram_upper_bytes, pred.vram) <= usable < pred.peak_vram_upper_bytes
    d = place(spec, [pool], headroom_fraction=0.05)
    assert d.decision == "placed" and d.chosen is not None
    assert d.chosen.reason == "chosen (the allocator's fragmentation outside the margin)"
    assert any("expandable_segments:True" in r for r in d.reasons)
    # with expandable segments the bound itself fits: no such reason
    calm = place(spec.model_copy(update={"expandable_segments": True}), [pool], headroom_fraction=0.05)
    assert calm.decision == "placed" and not any("fragmentation" in r for r in calm.reasons)


def test_a_pipeline_stage_is_not_chosen_for_its_cache() -> None:
    """The last stage holds the logits and so the fragmentation; the more loaded stage is the one whose peak without
    that cache is higher, so a variable-length job needs what the fixed-length one does (review, 2026-11-27: the
    last stage won on its cache alone and the first stage's need was dropped)."""
    base = {"model": "qwen2.5-1.5b", "method": "lora", "precision": "bf16-true", "seq_len": 8192, "gpus": 4,
            "pipeline_parallel": 4}
    fixed = predict(parse_training_spec(base), gpu_name="A100-40GB", gpus=4)
    varying = predict(parse_training_spec({**base, "sequence_lengths": "variable"}), gpu_name="A100-40GB", gpus=4)
    assert any("the first stage" in n for n in varying.vram.notes)
    assert required_bytes(varying.peak_vram_upper_bytes, varying.vram) == required_bytes(
        fixed.peak_vram_upper_bytes, fixed.vram)
    assert "may not fit" in fit_verdict(varying)


def test_a_site_offset_scales_the_cache_it_subtracts() -> None:
    """With a site offset the residual scales the whole device peak, the cache too: the relief is the scaled cache,
    so a variable-length job never needs less than the fixed-length one (it needed 24.4 GiB against 45.1)."""
    from predictors.predict import SpecPredictor, _residual_model
    from predictors.residual_serving import margin_group

    model = _residual_model().model  # type: ignore[union-attr]
    base = {"model": "qwen2.5-1.5b", "method": "lora", "precision": "bf16-true", "seq_len": 4096,
            "micro_batch_size": 4, "gradient_checkpointing": "full"}
    saved = dict(getattr(model, "site_offsets_", {}) or {})
    try:
        needs = []
        for extra in ({}, {"sequence_lengths": "variable"}):
            spec = parse_training_spec({**base, **extra})
            model.site_offsets_ = {margin_group(spec): -0.2}
            needs.append(SpecPredictor(spec, resolve_model(spec)).memory_many([("H100-80GB", 1)])[0].required_bytes)
    finally:
        model.site_offsets_ = saved
    assert needs[1] == pytest.approx(needs[0], rel=1e-6)


def test_paged_states_and_fragmentation_are_each_named_only_when_needed() -> None:
    spec = parse_training_spec({"model": "qwen2.5-1.5b", "method": "full", "optimizer": "paged-adamw-8bit",
                                "precision": "bf16-true", "seq_len": 4096, "micro_batch_size": 4,
                                "gradient_checkpointing": "full", "sequence_lengths": "variable",
                                "train_tokens": 1e7})
    # on an A100 40GB the expected peak without the cache is above the card: no "fits with paging" verdict
    small = predict(spec, gpu_name="A100-40GB", gpus=1)
    assert "paged optimizer states" not in fit_verdict(small) and "fit" in fit_verdict(small)
    # on an H200 only the fragmentation is needed (nothing pages): the reasons say that and nothing else
    pool = NodePool.model_validate({"name": "h200", "gpu": "H200", "gpus_per_node": 8, "nodes": 1,
                                    "price_usd_per_gpu_hour": 3.0})
    d = place(spec, [pool], headroom_fraction=0.05)
    assert d.decision == "placed" and d.chosen is not None
    assert d.chosen.reason == "chosen (the allocator's fragmentation outside the margin)"
    assert not any("page to host memory" in r for r in d.reasons)
    assert any("fragmentation of variable-length blocks" in r for r in d.reasons)


def test_a_bound_that_either_relief_alone_fits_still_says_why() -> None:
    """Paged states and fragmentation each enough on their own: the reason names the fragmentation (no paging is
    expected then), not nothing (review, 2026-11-27)."""
    spec = parse_training_spec({"model": "qwen2.5-1.5b", "method": "full", "optimizer": "paged-adamw-8bit",
                                "precision": "bf16-true", "seq_len": 4096, "gradient_checkpointing": "full",
                                "sequence_lengths": "variable", "train_tokens": 1e7})
    pool = NodePool.model_validate({"name": "l40s", "gpu": "L40S", "gpus_per_node": 8, "nodes": 1,
                                    "price_usd_per_gpu_hour": 1.0})
    d = place(spec, [pool], headroom_fraction=0.05)
    assert d.decision == "placed" and d.chosen is not None
    assert (d.chosen.peak_vram_upper_bytes or 0) > d.chosen.usable_bytes
    assert d.chosen.reason == "chosen (the allocator's fragmentation outside the margin)"
    assert any("fragmentation of variable-length blocks" in r for r in d.reasons)


def _bench_module():  # type: ignore[no-untyped-def]
    import importlib.util

    path = BENCH_ROWS.parents[1] / "variable_lengths.py"
    spec = importlib.util.spec_from_file_location("variable_lengths_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_draws_the_stated_length_distribution() -> None:
    """bench/variable_lengths.py's samples: the ms-swift dataset's gamma (mean 3,234, sd 2,548) with samples above
    max_length dropped and none below its stated minimum; the same seed, the same samples (each mode of a config is
    fed the same micro-batches). The mean below 2,048 of that distribution is 1,134 tokens (the X06 rows'
    mean_seq_len)."""
    bench = _bench_module()
    lengths = bench.sample_lengths(2048, 4000)
    assert lengths == bench.sample_lengths(2048, 4000)
    assert min(lengths) >= bench.SAMPLE_MIN_TOKENS and max(lengths) <= 2048
    assert sum(lengths) / len(lengths) == pytest.approx(1134, rel=0.03)
    assert bench.sample_lengths(2048, 480)[:128] == lengths[:128]  # the first micro-batches do not depend on the count


@pytest.mark.parametrize(("text", "message"), [
    ("qwen2.5-7b:2048:128:fixed,variable", None),
    ("qwen2.5-7b:2048:128", "expected MODEL:MAX_LENGTH:MICRO_BATCHES:MODE"),
    ("qwen2.5-7b:2k:128:fixed", "expected MODEL:MAX_LENGTH:MICRO_BATCHES:MODE"),
    ("qwen2.5-7b:2048:128:packed", "unknown mode 'packed'"),
])
def test_the_bench_config_option_says_what_is_wrong(text: str, message: str | None,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    bench = _bench_module()
    parser = argparse.ArgumentParser(prog="variable_lengths.py")
    if message is None:
        assert bench._parse_config(parser, text) == ("qwen2.5-7b", 2048, 128, ("fixed", "variable"))
        return
    with pytest.raises(SystemExit):
        bench._parse_config(parser, text)
    assert message in capsys.readouterr().err


def test_the_cache_fills_each_device_and_no_more() -> None:
    """Per GPU: the breakdown still sums to the device peak, placement's shortcut (device_peak_on_gpu) agrees, the
    device peak stays within the card's memory unless the rest alone is above it, and more tokens never predict
    less on the same card."""
    from predictors.vram import device_peak_on_gpu, on_gpu, predict_vram_without_gpu

    for name in ("L4", "A100-40GB", "A100-80GB", "H100-80GB", "H200"):
        gpu = lookup_gpu(name)
        before = 0
        for batch in (1, 2, 4, 8, 16):
            spec = _spec(model="qwen2.5-7b", micro_batch_size=batch, sequence_lengths="variable", mean_seq_len=1134)
            base = predict_vram_without_gpu(spec, resolve_model(spec).architecture, 1)
            vram = on_gpu(base, gpu)
            cache = vram.breakdown_bytes["allocator_fragmentation"]
            assert sum(vram.breakdown_bytes.values()) == vram.peak_vram_bytes == device_peak_on_gpu(base, gpu)
            assert vram.peak_reserved_bytes >= vram.peak_allocated_bytes and cache >= 0
            rest = vram.peak_vram_bytes - cache
            assert vram.peak_vram_bytes == (rest if rest >= gpu.memory_bytes else min(
                rest + base.breakdown_bytes["allocator_fragmentation"], gpu.memory_bytes)), (name, batch)
            assert vram.peak_vram_bytes >= before, (name, batch)
            before = vram.peak_vram_bytes


def test_the_verdict_says_when_the_cache_fills_the_card() -> None:
    """Qwen2.5-1.5B LoRA, 8 unpacked sequences: its bound without the cache fits an A100 80GB, and the cache fills
    the rest of the card (cut to it); the verdict says so rather than nothing, and says nothing of it with room."""
    spec = _spec(model="qwen2.5-1.5b", micro_batch_size=8, sequence_lengths="variable", mean_seq_len=1134)
    on_a100 = predict(spec, gpu_name="A100-80GB", gpus=1)
    assert on_a100.vram.peak_vram_bytes == lookup_gpu("A100-80GB").memory_bytes
    verdict = fit_verdict(on_a100)
    assert verdict.startswith("fits on A100-80GB, with the allocator's cache of variable-length blocks filling")
    assert fit_verdict(predict(spec, gpu_name="H200", gpus=1)) == ""


def test_placement_reasons_state_the_fragmentation_that_required_bytes_discounts() -> None:
    """With a site offset the fragmentation discounted from the bound is the scaled one (reclaimable_bytes); the
    reasons, placed and no-fit alike, name that figure rather than the breakdown's analytic one."""
    from predictors.predict import SpecPredictor, _residual_model, reclaimable_bytes
    from predictors.residual_serving import margin_group
    from predictors.units import format_bytes
    from scheduler.placement import clear_prediction_cache

    spec = parse_training_spec({"model": "qwen2.5-1.5b", "method": "full", "optimizer": "paged-adamw-8bit",
                                "precision": "bf16-true", "seq_len": 4096, "micro_batch_size": 4,
                                "gradient_checkpointing": "full", "sequence_lengths": "variable",
                                "train_tokens": 1e7})
    model = _residual_model().model  # type: ignore[union-attr]
    saved = dict(getattr(model, "site_offsets_", {}) or {})
    try:
        model.site_offsets_ = {margin_group(spec): 0.2}  # a site whose jobs use more
        clear_prediction_cache()  # placement memoises predictions per spec: none from before the offset
        for gpu, headroom, placed in (("H200", 0.05, True), ("A100-40GB", 0.05, False)):
            vram = SpecPredictor(spec, resolve_model(spec)).memory_many([(gpu, 1)])[0].vram
            raw = vram.breakdown_bytes["allocator_fragmentation"]
            scaled = int(reclaimable_bytes(vram))
            assert format_bytes(scaled) != format_bytes(raw)  # the offset moved it enough to tell
            pool = NodePool.model_validate({"name": "p", "gpu": gpu, "gpus_per_node": 1, "nodes": 1,
                                            "price_usd_per_gpu_hour": 1.0})
            d = place(spec, [pool], headroom_fraction=headroom)
            assert (d.decision == "placed") == placed
            texts = d.reasons if placed else [o.reason for o in d.alternatives]
            said = [t for t in texts if "fragmentation of variable-length blocks" in t]
            assert said and all(f"({format_bytes(scaled)})" in t or f"{format_bytes(scaled)} of it" in t
                                for t in said), said
    finally:
        model.site_offsets_ = saved
        clear_prediction_cache()  # nor any made with it after
