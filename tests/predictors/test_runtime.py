"""Runtime model: FLOP accounting, efficiency table, communication, offload, and the predict() wiring."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.catalog import resolve_model
from predictors.hardware import lookup_gpu
from predictors.predict import predict
from predictors.reference import ReferenceRun
from predictors.runtime import Interconnect, efficiency_table, flops_per_token, predict_runtime
from predictors.runtime_eval import evaluate_runtime
from predictors.spec import TrainingSpec


def _spec(**kw: Any) -> TrainingSpec:
    base: dict[str, Any] = {"model": "llama-2-7b", "precision": "bf16-true", "micro_batch_size": 4,
                            "seq_len": 2048, "train_tokens": 1e9}
    base.update(kw)
    return TrainingSpec.model_validate(base)


ARCH = resolve_model(_spec()).architecture


def test_full_training_is_about_six_flops_per_parameter() -> None:
    f = flops_per_token(_spec(seq_len=128), ARCH)
    # 6N + attention; at a short sequence attention is small
    assert f.total == pytest.approx(6 * ARCH.params_total, rel=0.05)
    assert f.backward == pytest.approx(2 * f.forward, rel=1e-9)


def test_lora_skips_weight_gradients_of_frozen_layers() -> None:
    full = flops_per_token(_spec(), ARCH)
    lora = flops_per_token(_spec(method="lora"), ARCH)
    short_full = flops_per_token(_spec(seq_len=16), ARCH)
    short_lora = flops_per_token(_spec(seq_len=16, method="lora"), ARCH)
    assert lora.backward < full.backward
    # without attention, dX only is half of dX + dW (the adapters are tiny)
    assert short_lora.backward == pytest.approx(short_full.backward / 2, rel=0.01)


@pytest.mark.parametrize(("mode", "extra"), [("none", 0.0), ("selective", 0.02), ("full", 0.30)])
def test_recomputation_adds_forward_work(mode: str, extra: float) -> None:
    base = flops_per_token(_spec(), ARCH).total
    with_ac = flops_per_token(_spec(gradient_checkpointing=mode), ARCH).total
    assert with_ac / base - 1 >= extra
    assert with_ac / base - 1 <= 1 / 3 + 1e-9


def test_attention_flops_grow_with_square_of_sequence() -> None:
    short = flops_per_token(_spec(seq_len=2048), ARCH)
    long = flops_per_token(_spec(seq_len=8192), ARCH)
    # per token the attention part grows linearly with seq_len, i.e. per sequence with seq_len^2
    linear = flops_per_token(_spec(seq_len=1), ARCH).total
    assert (long.total - linear) / (short.total - linear) == pytest.approx(4, rel=0.05)


def test_faster_gpu_is_faster_and_runtime_follows_tokens() -> None:
    a100 = predict_runtime(_spec(), ARCH, lookup_gpu("A100-80GB"))
    h100 = predict_runtime(_spec(), ARCH, lookup_gpu("H100-80GB"))
    assert h100.tokens_per_second > 2 * a100.tokens_per_second
    assert a100.runtime_seconds == pytest.approx(1e9 / a100.tokens_per_second)
    assert a100.components_seconds["step"] == pytest.approx(a100.step_time_seconds)


def test_steps_give_runtime_from_step_time() -> None:
    spec = _spec(train_tokens=None, steps=100, grad_accum_steps=4)
    rt = predict_runtime(spec, ARCH, lookup_gpu("A100-80GB"))
    assert rt.tokens_per_step == 4 * 4 * 2048
    assert rt.runtime_seconds == pytest.approx(100 * rt.step_time_seconds)


def test_qlora_pays_dequantization() -> None:
    gpu = lookup_gpu("A100-80GB")
    lora = predict_runtime(_spec(method="lora"), ARCH, gpu)
    qlora = predict_runtime(_spec(method="qlora"), ARCH, gpu)
    assert qlora.components_seconds["dequantization"] > 0
    assert qlora.tokens_per_second < lora.tokens_per_second


def test_tiny_batch_is_memory_bound() -> None:
    rt = predict_runtime(_spec(micro_batch_size=1, seq_len=16), ARCH, lookup_gpu("H100-80GB"))
    assert rt.components_seconds["memory_floor"] > rt.components_seconds["compute"]
    assert any("memory-bandwidth bound" in n for n in rt.notes)


def test_pcie_card_communicates_slower_than_nvlink_and_nodes_slower_still() -> None:
    spec = _spec(gpus=8, sharding="fsdp")
    l40s = predict_runtime(spec, ARCH, lookup_gpu("L40S"), gpus=8)
    h100 = predict_runtime(spec, ARCH, lookup_gpu("H100-80GB"), gpus=8)
    comm = "data_parallel_communication"
    assert l40s.components_seconds[comm] > 5 * h100.components_seconds[comm]
    two_nodes = predict_runtime(spec.with_gpus(16), ARCH, lookup_gpu("H100-80GB"), gpus=16,
                                interconnect=Interconnect(gpus_per_node=8, inter_node_bytes_per_second=12.5e9))
    assert two_nodes.components_seconds[comm] > h100.components_seconds[comm]


def test_offload_adds_transfer_and_cpu_step() -> None:
    gpu = lookup_gpu("RTX-4090")
    plain = predict_runtime(_spec(), ARCH, gpu)
    off = predict_runtime(_spec(offload="optimizer"), ARCH, gpu)
    assert off.components_seconds["cpu_optimizer_step"] > 0
    assert off.components_seconds["offload_transfer"] > 0
    assert off.tokens_per_second < plain.tokens_per_second


def test_efficiency_table_rows_are_sourced() -> None:
    table = efficiency_table()
    families = {row.family for row in table.families}
    assert {"ampere", "hopper", "blackwell", "ada", "volta"} <= families
    assert all(row.sources and all(s.strip() for s in row.sources) for row in table.families)


def test_predict_fills_throughput_only_with_a_gpu() -> None:
    without = predict(_spec())
    assert without.throughput_tokens_per_second is None
    assert "throughput_tokens_per_second" not in without.to_dict()
    withgpu = predict(_spec(), gpu_name="A100-80GB").to_dict()
    assert withgpu["throughput_tokens_per_second"] > 0
    assert withgpu["runtime_seconds"] == pytest.approx(1e9 / withgpu["throughput_tokens_per_second"])


def _run(tps: float, scope: str, gpus: int = 1) -> ReferenceRun:
    spec = _spec(gpus=gpus, gpu="A100-80GB").model_dump(mode="json", by_alias=True, exclude_none=True)
    return ReferenceRun.model_validate({"id": f"T-{tps}", "spec": spec, "gpu": "A100-80GB", "measured": {
        "peak_bytes": 1, "tokens_per_second": tps, "tokens_per_second_scope": scope}})


def test_runtime_eval_scopes_and_implausible_per_gpu_claims() -> None:
    job_tps = predict_runtime(_spec(gpus=2), ARCH, lookup_gpu("A100-80GB"), gpus=2).tokens_per_second
    acc = evaluate_runtime([_run(job_tps / 2, "per_gpu", 2), _run(job_tps, "per_job", 2), _run(1e9, "per_gpu", 2)])
    assert acc.rows[0].ape == pytest.approx(0.0, abs=1e-9)
    assert acc.rows[1].ape == pytest.approx(0.0, abs=1e-9)
    assert acc.rows[2].scope == "per_job" and len(acc.scope_corrected) == 1
    assert acc.summary()["per_gpu"]["runs"] == 1


def test_small_micro_batches_are_host_bound() -> None:
    """Eager PyTorch walks every block in Python: below some tokens per micro-batch the step time stops shrinking
    (measured on an H200: 3.4-5.0 ms per block and step, predictors/data/measured/H200.jsonl)."""
    gpu = lookup_gpu("H100-80GB")
    per_pass = efficiency_table().host_seconds_per_layer_pass
    tiny = predict_runtime(_spec(micro_batch_size=1, seq_len=64), ARCH, gpu)
    assert tiny.step_time_seconds >= ARCH.num_layers * 2 * per_pass  # forward + backward per block
    assert tiny.components_seconds["host_wait"] > 0
    assert any("host bound" in n for n in tiny.notes)
    ckpt = predict_runtime(_spec(micro_batch_size=1, seq_len=64, gradient_checkpointing="full"), ARCH, gpu)
    assert ckpt.step_time_seconds >= ARCH.num_layers * 3 * per_pass  # + the recomputed forward
    big = predict_runtime(_spec(micro_batch_size=8, seq_len=4096), ARCH, gpu)
    assert big.components_seconds["host_wait"] == 0  # the GPU work hides the host


@pytest.mark.parametrize("kw", [
    {},  # one GPU, compute bound
    {"micro_batch_size": 1, "seq_len": 64},  # host bound
    {"method": "qlora", "lora": {"target_modules": "all-linear"}, "gradient_checkpointing": "full"},
    {"gpus": 16, "sharding": "fsdp"},  # communication partly hidden
    {"gpus": 8, "tensor_parallel": 2, "pipeline_parallel": 2, "grad_accum_steps": 4, "sharding": "fsdp"},
    {"gpus": 2, "sharding": "zero3", "offload": "params+optimizer"},
    {"attention": "eager", "method": "lora"},
    {"gpus": 8, "context_parallel": 8, "sharding": "fsdp", "seq_len": 32768},
])
def test_step_breakdown_adds_up_to_the_step(kw: dict[str, Any]) -> None:
    """The parts `vramfit predict` shows add up to the step time; what they hide is listed apart, never added."""
    pred = predict_runtime(_spec(**kw), ARCH, lookup_gpu("H100-80GB"))
    parts, overlapped = pred.step_breakdown()
    assert sum(parts.values()) == pytest.approx(pred.step_time_seconds, rel=1e-12)
    assert all(t > 0 for t in parts.values()) and not set(parts) & set(overlapped)
    c = pred.components_seconds
    assert max(c["compute"], c["memory_floor"]) in parts.values()
    hidden = c["data_parallel_communication"] + c["offload_transfer"] - c["communication_exposed"]
    assert overlapped.get("communication_hidden", 0.0) == pytest.approx(hidden if hidden > 1e-12 else 0.0)


def test_context_parallel_ring_costs_only_what_attention_does_not_hide() -> None:
    """Ring attention: cp - 1 steps per pass, each moving one K and one V block of the local tokens (Llama-2-7B:
    32 kv heads x 128 x 2 bytes per layer and token) under the attention of one block; backward counts twice,
    a recomputed forward once more. On NVLink at 128k tokens the attention hides it; over a 1 GB/s link at 4k it
    does not, and what shows is exactly the transfers' excess."""
    from predictors.runtime import _attention_forward_flops, matmul_efficiency

    gpu = lookup_gpu("H100-80GB")
    t = efficiency_table()
    cp = 8

    def run(seq: int, link: Interconnect | None) -> Any:
        spec = _spec(micro_batch_size=1, seq_len=seq, gpus=cp, context_parallel=cp, sharding="fsdp",
                     gradient_checkpointing="full")
        return spec, predict_runtime(spec, ARCH, gpu, gpus=cp, interconnect=link)

    _, long_nvlink = run(131072, None)
    assert long_nvlink.components_seconds["context_parallel_exposed"] == 0
    assert long_nvlink.components_seconds["context_parallel_hidden"] > 0
    assert "context_parallel_hidden" in long_nvlink.step_breakdown()[1]
    slow = Interconnect(gpus_per_node=1, inter_node_bytes_per_second=1e9)
    spec, short_slow = run(4096, slow)
    local = 4096 / cp
    transfer = 2 * 32 * 128 * local * 2 * 32 / (1e9 * t.collective_bandwidth_utilization)
    attention = (local * _attention_forward_flops(ARCH, 4096) / cp
                 / (gpu.dense_flops("bf16-true") * matmul_efficiency(spec, ARCH, gpu)))
    expected = (cp - 1) * (1 + 2 + 1) * (transfer - attention)
    assert short_slow.components_seconds["context_parallel_exposed"] == pytest.approx(expected)
    assert short_slow.step_breakdown()[0]["context_parallel_exposed"] == pytest.approx(expected)
    assert any("context parallel" in n for n in short_slow.notes)


def test_adapters_and_4bit_layers_raise_the_host_floor() -> None:
    """Each LoRA adapter and each 4-bit base layer adds its Python path to every block and pass: Llama-2-7B has 7
    linears per block; q/v LoRA adds 2 adapters, all-linear QLoRA 7 adapters and 7 4-bit layers (H200 QLoRA rows:
    3.8-6.2 ms per block and pass at 1,024 tokens)."""
    gpu = lookup_gpu("H100-80GB")
    t = efficiency_table()
    short = {"micro_batch_size": 1, "seq_len": 64, "gradient_checkpointing": "full"}
    floor = ARCH.num_layers * 3  # block passes per micro-batch with the recomputed forward
    full = predict_runtime(_spec(**short), ARCH, gpu)
    qv = predict_runtime(_spec(**short, method="lora", lora={"target_modules": ["q_proj", "v_proj"]}), ARCH, gpu)
    qlora = predict_runtime(_spec(**short, method="qlora", lora={"target_modules": "all-linear"}), ARCH, gpu)

    def forward_backward(pred: Any) -> float:  # host bound: the micro-batch's time is the host's
        assert pred.components_seconds["host_wait"] > 0
        return pred.step_time_seconds - pred.components_seconds["optimizer_step"]

    assert forward_backward(full) == pytest.approx(floor * t.host_seconds_per_layer_pass)
    assert forward_backward(qv) == pytest.approx(
        floor * (t.host_seconds_per_layer_pass + 2 * t.host_seconds_per_adapter_pass))
    assert forward_backward(qlora) == pytest.approx(floor * (
        t.host_seconds_per_layer_pass + 7 * (t.host_seconds_per_adapter_pass
                                             + t.host_seconds_per_quantized_linear_pass)))
    assert t.host_seconds_per_adapter_pass > 0 and t.host_seconds_per_quantized_linear_pass > 0


def test_lora_adapters_pay_their_elementwise_passes() -> None:
    """All-linear LoRA at the same FLOPs moves more bytes than q/v only: by the hand count of
    runtime._LORA_*_BYTES over Llama-2-7B's 32 blocks of (in, out) features."""
    gpu = lookup_gpu("H100-80GB")
    qv = predict_runtime(_spec(method="lora", lora={"target_modules": ["q_proj", "v_proj"]}), ARCH, gpu)
    every = predict_runtime(_spec(method="lora", lora={"target_modules": "all-linear"}), ARCH, gpu)
    table = efficiency_table()
    bandwidth = gpu.memory_bandwidth_bytes_per_second * table.memory_bandwidth_utilization
    tokens = 4 * 2048
    # q and v: 4096 -> 4096 each, with dropout: (38 x 4096 + 46 x 4096) bytes per token, block and module
    expected_qv = tokens * 32 * 2 * (38 * 4096 + 46 * 4096) / bandwidth
    assert qv.components_seconds["lora_elementwise"] == pytest.approx(expected_qv, rel=1e-9)
    assert every.components_seconds["lora_elementwise"] > 4 * qv.components_seconds["lora_elementwise"]
    no_dropout = predict_runtime(_spec(method="lora", lora={"target_modules": ["q_proj", "v_proj"], "dropout": 0}),
                                 ARCH, gpu)
    assert no_dropout.components_seconds["lora_elementwise"] == pytest.approx(
        tokens * 32 * 2 * (20 * 4096 + 46 * 4096) / bandwidth, rel=1e-9)
    full = predict_runtime(_spec(), ARCH, gpu)
    assert full.components_seconds["lora_elementwise"] == 0


def test_eager_attention_pays_for_its_scores() -> None:
    gpu = lookup_gpu("H100-80GB")
    sdpa = predict_runtime(_spec(attention="sdpa"), ARCH, gpu)
    eager = predict_runtime(_spec(attention="eager"), ARCH, gpu)
    bandwidth = gpu.memory_bandwidth_bytes_per_second * efficiency_table().memory_bandwidth_utilization
    # 4 x 2048 tokens x 32 heads x 2048 keys x 32 blocks x 40 bytes
    expected = 4 * 2048 * 32 * 2048 * 32 * 40 / bandwidth
    assert eager.components_seconds["eager_attention_scores"] == pytest.approx(expected, rel=1e-9)
    assert sdpa.components_seconds["eager_attention_scores"] == 0
    assert eager.step_time_seconds > sdpa.step_time_seconds


def test_tf32_prices_fp32_matmuls_on_the_tensor_cores_where_the_gpu_has_them() -> None:
    """tf32 moves a 32-true job's matmuls from the CUDA cores' fp32 peak (19.5 TFLOP/s on an A100) to the tensor
    cores' TF32 peak (156), at the 16-bit GEMMs' utilization; a V100 has no TF32 (unchanged), and a bf16 job's
    matmuls are not fp32 (unchanged). Against the bf16 run of the same model, the ratio of the TF32 and bf16
    throughputs is about the ratio of their peaks once the weight traffic and the element-wise passes are counted."""
    a100, v100 = lookup_gpu("A100-80GB"), lookup_gpu("V100-32GB")
    fp32, tf32 = _spec(precision="32-true"), _spec(precision="32-true", tf32=True)
    plain, fast = predict_runtime(fp32, ARCH, a100), predict_runtime(tf32, ARCH, a100)
    assert fast.components_seconds["compute"] < plain.components_seconds["compute"] / 3
    assert plain.tokens_per_second < fast.tokens_per_second < predict_runtime(_spec(), ARCH, a100).tokens_per_second
    assert predict_runtime(tf32, ARCH, v100).tokens_per_second == predict_runtime(fp32, ARCH, v100).tokens_per_second
    bf16 = predict_runtime(_spec(tf32=True), ARCH, a100)
    assert bf16.tokens_per_second == predict_runtime(_spec(), ARCH, a100).tokens_per_second
    assert a100.dense_flops("32-true", tf32=True) == a100.tf32_dense_flops == 156e12
    assert v100.dense_flops("32-true", tf32=True) == v100.fp32_flops
