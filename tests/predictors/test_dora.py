"""DoRA (``lora.use_dora``): magnitude vectors, the two rescaled outputs each adapted layer keeps, the weight norm's
temporaries and its time; checked by hand on the tiny model and against PEFT's published MetaMathQA benchmark
(method_comparison/MetaMathQA/results, Llama-3.2-3B, q/v rank 32, batch 4 x 768 tokens, L40S)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from predictors.catalog import resolve_model
from predictors.hardware import lookup_gpu
from predictors.reference import ReferenceRun, parse_runs
from predictors.runtime import predict_runtime
from predictors.spec import TrainingSpec
from predictors.vram import predict_vram
from tests.predictors.test_vram import H, L, run

LORA = {"rank": 8, "target_modules": ["q_proj", "v_proj"], "dropout": 0.0}


def test_dora_adds_magnitudes_and_keeps_both_outputs_by_hand() -> None:
    tokens = 2 * 64
    plain = run(method="lora", precision="bf16-true", micro_batch_size=2, seq_len=64, lora=LORA)
    dora = run(method="lora", precision="bf16-true", micro_batch_size=2, seq_len=64, lora={**LORA, "use_dora": True})
    q_out, v_out = H, 32  # the tiny model's q (64 -> 64) and v (64 -> 32, two kv heads of 16)
    magnitudes = L * (q_out + v_out)
    assert dora.params_trainable == plain.params_trainable + magnitudes
    # the bf16 base output (no dropout: PEFT reuses the base layer's) and the fp32 adapter output, per output feature
    kept = dora.breakdown_bytes["activations"] - plain.breakdown_bytes["activations"]
    assert kept == tokens * L * (q_out + v_out) * 6
    # the weight norm's temporaries of the largest adapted layer (q): in x in identity + 3 x in x out, fp32
    assert dora.breakdown_bytes["dora_workspace"] == (H * H + 3 * H * H) * 4
    with_dropout = run(method="lora", precision="bf16-true", micro_batch_size=2, seq_len=64,
                       lora={**LORA, "dropout": 0.1, "use_dora": True})
    dropout_plain = run(method="lora", precision="bf16-true", micro_batch_size=2, seq_len=64,
                        lora={**LORA, "dropout": 0.1})
    # with dropout PEFT recomputes the base output from the dropped-out fp32 input: 4 + 4 bytes
    assert (with_dropout.breakdown_bytes["activations"] - dropout_plain.breakdown_bytes["activations"]
            == tokens * L * (q_out + v_out) * 8)


def _peft_benchmark(dora: bool) -> TrainingSpec:
    return TrainingSpec.model_validate({
        "model": "llama-3.2-3b", "method": "lora", "precision": "bf16-true", "framework": "transformers",
        "micro_batch_size": 4, "seq_len": 768, "gpu": "L40S",
        "lora": {"rank": 32, "alpha": 64, "target_modules": ["q_proj", "v_proj"], "dropout": 0.0, "use_dora": dora}})


def test_peft_benchmark_trainable_parameters_and_the_dora_increment() -> None:
    """PEFT's results: 9,175,040 trainable parameters (LoRA) and 9,289,728 (DoRA); peak reserved 22.27 GB and
    24.54 GB, 2.27 GB apart."""
    arch = resolve_model(_peft_benchmark(False)).architecture
    gpu = lookup_gpu("L40S")
    lora, dora = (predict_vram(_peft_benchmark(d), arch, gpu) for d in (False, True))
    assert (lora.params_trainable, dora.params_trainable) == (9_175_040, 9_289_728)
    increment = dora.peak_reserved_bytes - lora.peak_reserved_bytes
    assert 0.8 * 2.27e9 < increment < 1.25 * 2.27e9
    for vram, measured in ((lora, 22_273_851_392), (dora, 24_540_872_704)):
        assert abs(vram.peak_reserved_bytes / measured - 1) < 0.10


def test_dora_costs_time_and_the_benchmark_ratio() -> None:
    """PEFT's results: 6,770 tokens/s with LoRA and 5,850 with DoRA (0.864x)."""
    arch = resolve_model(_peft_benchmark(False)).architecture
    gpu = lookup_gpu("L40S")
    lora, dora = (predict_runtime(_peft_benchmark(d), arch, gpu) for d in (False, True))
    ratio = dora.tokens_per_second / lora.tokens_per_second
    assert 0.80 < ratio < 0.95
    assert dora.components_seconds["lora_elementwise"] > lora.components_seconds["lora_elementwise"]


@pytest.mark.parametrize("framework", ["torchtune", "transformers"])
def test_dora_never_needs_less_than_lora(framework: str) -> None:
    fields: dict[str, Any] = {"method": "qlora", "precision": "bf16-true", "micro_batch_size": 2, "seq_len": 128,
                              "framework": framework, "gradient_checkpointing": "full"}
    plain = run(**fields, lora={**LORA, "target_modules": "all-linear"})
    dora = run(**fields, lora={**LORA, "target_modules": "all-linear", "use_dora": True})
    assert dora.peak_vram_bytes > plain.peak_vram_bytes
    assert any(n.startswith("DoRA:") for n in dora.notes)


def test_v1_specs_serialize_without_the_extension() -> None:
    dora = TrainingSpec.model_validate({"model": "llama-3.2-1b", "method": "lora", "lora": {"use_dora": True}})
    assert dora.model_dump()["lora"]["use_dora"] is True
    plain = TrainingSpec.model_validate({"model": "llama-3.2-1b", "method": "lora", "lora": {"rank": 8}})
    assert "use_dora" not in plain.model_dump()["lora"]


def test_dora_dropout_keeps_the_base_weights_cast_to_the_adapter_dtype_by_hand() -> None:
    """With dropout PEFT's DoRA recomputes the base output as F.linear(dropout(x), weight.to(fp32)) and autograd keeps
    that fp32 weight for the input's gradient: every adapted weight of every block without checkpointing, the
    recomputed block's with it; none without dropout, on a 32-true model or in torchtune's DoRALinear."""
    fields: dict[str, Any] = {"method": "lora", "precision": "bf16-true", "micro_batch_size": 2, "seq_len": 64}
    adapted_per_block = H * H + H * 32  # q (64 -> 64) and v (64 -> 32)
    dropout = run(**fields, lora={**LORA, "dropout": 0.1, "use_dora": True})
    assert dropout.breakdown_bytes["dora_weight_copies"] == L * adapted_per_block * 4
    assert any("DoRA with adapter dropout" in n for n in dropout.notes)
    assert run(**fields, lora={**LORA, "use_dora": True}).breakdown_bytes.get("dora_weight_copies", 0) == 0
    ckpt = run(**fields, gradient_checkpointing="full", lora={**LORA, "dropout": 0.1, "use_dora": True})
    assert ckpt.breakdown_bytes["dora_weight_copies"] == adapted_per_block * 4
    amp = run(**{**fields, "precision": "bf16-mixed"}, lora={**LORA, "dropout": 0.1, "use_dora": True})
    assert amp.breakdown_bytes["dora_weight_copies"] == L * adapted_per_block * 2  # autocast's 16-bit cast
    fp32 = run(**{**fields, "precision": "32-true"}, lora={**LORA, "dropout": 0.1, "use_dora": True})
    assert fp32.breakdown_bytes.get("dora_weight_copies", 0) == 0
    tune = run(**fields, framework="torchtune", lora={**LORA, "dropout": 0.1, "use_dora": True})
    assert tune.breakdown_bytes.get("dora_weight_copies", 0) == 0
    # a 4-bit base is dequantized into a fresh tensor every time: 4 bytes cast to the fp32 adapters without
    # autocast, 2 where the input stays 16-bit (autocast, or FSDP's 16-bit adapters), never none
    qlora = {"method": "qlora", "micro_batch_size": 2, "seq_len": 64,
             "lora": {**LORA, "dropout": 0.1, "use_dora": True}}
    assert run(**qlora, precision="bf16-true").breakdown_bytes["dora_weight_copies"] == L * adapted_per_block * 4
    assert run(**qlora, precision="bf16-mixed").breakdown_bytes["dora_weight_copies"] == L * adapted_per_block * 2
    sharded = run(**qlora, precision="bf16-mixed", gpus=2, sharding="fsdp")
    assert sharded.breakdown_bytes["dora_weight_copies"] == L * adapted_per_block * 2
    assert any("PEFT >= 0.14" in n for n in dropout.notes)
    no_dropout = run(**fields, lora={**LORA, "use_dora": True})
    assert any(n.startswith("DoRA:") and "PEFT >= 0.14 assumed" in n for n in no_dropout.notes)
    assert not any("PEFT" in n for n in tune.notes)


def _h100_row(run_id: str) -> ReferenceRun:
    text = (Path(__file__).parents[2] / "predictors" / "data" / "measured" / "H100-80GB.jsonl").read_text("utf-8")
    return next(r for r in parse_runs(text) if r.id == run_id)


# vramfit's H100 rows (open-dora group): Llama-3.2-1B, all-linear rank 16 DoRA, 4 x 1,024 tokens, bf16-true
_DORA_DROPOUT_ROWS = {"CAL-53e6f2ff": "none", "CAL-e29c1026": "full"}


@pytest.mark.parametrize("run_id", sorted(_DORA_DROPOUT_ROWS))
def test_dora_dropout_matches_the_measured_h100_rows(run_id: str) -> None:
    """Measured 34.36 GiB / 7,642 tokens/s (no checkpointing) and 8.65 GiB / 5,145 tokens/s (full): the fp32 base
    recompute makes a step 2.5-2.9x longer than without dropout, and without checkpointing its weight copies are
    3.6 GiB of the peak (the model said 30.6 GiB and 22,765 tokens/s before it counted them)."""
    row = _h100_row(run_id)
    assert row.spec.gradient_checkpointing == _DORA_DROPOUT_ROWS[run_id]
    resolved = resolve_model(row.spec)
    gpu = lookup_gpu(row.gpu)
    vram = predict_vram(row.spec, resolved.architecture, gpu)
    assert row.measured.metric == "allocated"
    assert row.measured.peak_bytes is not None and row.measured.tokens_per_second is not None
    assert abs(vram.peak_allocated_bytes / row.measured.peak_bytes - 1) < 0.03
    runtime = predict_runtime(row.spec, resolved.architecture, gpu)
    assert abs(runtime.tokens_per_second / row.measured.tokens_per_second - 1) < 0.25
    assert runtime.components_seconds["dora_base_recompute"] > runtime.components_seconds["compute"]
    no_dropout = row.spec.model_copy(update={"lora": row.spec.lora.model_copy(update={"dropout": 0.0})}) \
        if row.spec.lora is not None else row.spec
    assert predict_runtime(no_dropout, resolved.architecture, gpu).components_seconds["dora_base_recompute"] == 0


def test_checkpointed_dora_peaks_with_the_logits_not_the_weight_norm() -> None:
    """framework transformers, full checkpointing: the logits phase comes before any block is recomputed, so the
    weight norm's temporaries are not part of that peak (measured: DoRA 8.65 GiB, the same LoRA run 8.64 GiB; the
    model said 9.08 GiB while it added them)."""
    row = _h100_row("CAL-ce885d1a")
    assert row.spec.gradient_checkpointing == "full" and row.spec.lora is not None and row.spec.lora.use_dora
    resolved = resolve_model(row.spec)
    vram = predict_vram(row.spec, resolved.architecture, lookup_gpu(row.gpu))
    assert vram.breakdown_bytes.get("dora_workspace", 0) == 0
    assert row.measured.peak_bytes is not None
    assert abs(vram.peak_allocated_bytes / row.measured.peak_bytes - 1) < 0.02
