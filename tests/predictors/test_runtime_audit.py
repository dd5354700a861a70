"""Physics of the analytic runtime model on paths the reference runs do not reach (see notes/audit-runtime-physics).

Each test pins one accounting rule with a hand count on a small config or a ratio that follows from the rule.
"""

from __future__ import annotations

from typing import Any

import pytest

from predictors.catalog import resolve_model
from predictors.hardware import lookup_gpu
from predictors.runtime import Interconnect, RuntimePrediction, flops_per_token, predict_runtime
from predictors.spec import TrainingSpec

TINY_MOE = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 100, "num_local_experts": 8,
            "num_experts_per_tok": 2}
TINY_T5 = {"model_type": "t5", "d_model": 64, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
           "d_kv": 16, "d_ff": 128, "vocab_size": 100, "feed_forward_proj": "relu"}


def _spec(**kw: Any) -> TrainingSpec:
    base: dict[str, Any] = {"model": "llama-3.1-8b", "precision": "bf16-true", "micro_batch_size": 2,
                            "seq_len": 2048, "train_tokens": 1e9}
    base.update(kw)
    return TrainingSpec.model_validate(base)


def _run(spec: TrainingSpec, gpu: str = "H100-80GB", link: Interconnect | None = None) -> RuntimePrediction:
    model = resolve_model(spec)
    return predict_runtime(spec, model.architecture, lookup_gpu(gpu), interconnect=link,
                           params_override=model.params_override)


def test_moe_expert_adapters_only_see_the_tokens_routed_to_them() -> None:
    lora = _spec(model={"config": TINY_MOE}, method="lora", seq_len=16,
                 lora={"rank": 4, "target_modules": "all-linear"})
    arch = resolve_model(lora).architecture
    adapter = flops_per_token(lora, arch).forward - flops_per_token(_spec(model={"config": TINY_MOE}, seq_len=16),
                                                                    arch).forward
    r, h, inter, layers = 4, 64, 128, 2
    attention = 4 * 2 * r * (h + h) * layers  # q, k, v, o: every token
    experts = 3 * 2 * r * (h + inter) * layers * 8 * 2 / 8  # gate, up, down of 8 experts: top-2 of 8 per token
    assert adapter == pytest.approx(attention + experts, rel=1e-12)


def test_real_moe_all_linear_lora_costs_less_than_its_dense_sibling() -> None:
    # Qwen3-30B-A3B routes each token through 3.3 B parameters: with adapters on every linear it must not cost
    # more than a quarter of dense Qwen3-32B's FLOPs (before: each token paid for all 128 experts' adapters)
    moe = _spec(model="qwen3-30b-a3b", method="lora", lora={"rank": 64, "target_modules": "all-linear"})
    dense = _spec(model="qwen3-32b", method="lora", lora={"rank": 64, "target_modules": "all-linear"})
    moe_flops = flops_per_token(moe, resolve_model(moe).architecture)
    dense_flops = flops_per_token(dense, resolve_model(dense).architecture)
    assert moe_flops.total < 0.25 * dense_flops.total


def test_encoder_decoder_decoder_runs_on_decoder_tokens_with_cross_attention() -> None:
    spec = _spec(model={"config": TINY_T5}, precision="bf16-true", seq_len=512)  # decoder: 128 tokens
    arch = resolve_model(spec).architecture
    # per encoder token; ratio 128 / 512 = 0.25 decoder tokens; blocks: 2 encoder, 2 decoder (self + cross)
    block = 2 * 64 * 64  # one 64x64 projection
    q_or_o = block * (2 + 2 * 0.25 + 2 * 0.25)  # encoder self, decoder self, cross (decoder side)
    k_or_v = block * (2 + 2 * 0.25 + 2 * 1.0)  # cross-attention k/v project every encoder token
    mlp = 2 * (2 * 64 * 128) * (2 + 2 * 0.25)
    head = 2 * 64 * 100 * 0.25
    scores = 2 * (64 + 64) * (2 * 512 + 2 * 0.25 * (128 + 512))  # enc self; dec self (128 keys) + cross (512)
    assert flops_per_token(spec, arch).forward == pytest.approx(2 * q_or_o + 2 * k_or_v + mlp + head + scores,
                                                                rel=1e-12)


def test_encoder_decoder_short_inputs_count_cross_attention() -> None:
    spec = _spec(model={"config": TINY_T5}, precision="bf16-true", seq_len=64)  # decoder as long as the input
    arch = resolve_model(spec).architecture
    projections = 4 * (2 * 64 * 64) * 6 + 2 * (2 * 64 * 128) * 4 + 2 * 64 * 100
    scores = 2 * (64 + 64) * 64 * 6  # 2 encoder self + 2 decoder self + 2 cross-attention blocks
    assert flops_per_token(spec, arch).forward == pytest.approx(projections + scores, rel=1e-12)


def test_encoder_decoder_tensor_parallel_all_reduces_follow_the_decoder_length() -> None:
    # encoder blocks: 2 all-reduces per token and pass; decoder blocks: 3 (self, cross, MLP) per decoder token
    long = _run(_spec(model={"config": TINY_T5}, seq_len=512, gpus=2, tensor_parallel=2))
    short = _run(_spec(model={"config": TINY_T5}, seq_len=128, gpus=2, tensor_parallel=2))
    per_token_long = long.components_seconds["tensor_parallel_communication"] / (2 * 512)
    per_token_short = short.components_seconds["tensor_parallel_communication"] / (2 * 128)
    assert per_token_long / per_token_short == pytest.approx((2 * 2 + 3 * 2 * 0.25) / (2 * 2 + 3 * 2), rel=1e-9)


def test_masked_lm_encoder_counts_its_vocabulary_head() -> None:
    mlm = _spec(model="bert-base-uncased", task="masked-lm", seq_len=512)
    cls = _spec(model="bert-base-uncased", task="seq-classification", seq_len=512)
    arch = resolve_model(mlm).architecture
    extra = flops_per_token(mlm, arch).forward - flops_per_token(cls, arch.for_task(cls.task)).forward
    assert extra == pytest.approx(2 * 768 * 30522, rel=1e-9)


def test_32bit_training_moves_32bit_weights_and_activations() -> None:
    fp32 = _run(_spec(precision="32-true", gpus=8, sharding="zero3"))
    bf16 = _run(_spec(precision="bf16-true", gpus=8, sharding="zero3"))
    # all-gather forward + backward and reduce-scatter of gradients, all in the weights' dtype
    assert (fp32.components_seconds["data_parallel_communication"]
            / bf16.components_seconds["data_parallel_communication"]) == pytest.approx(2.0, rel=1e-9)
    fp32_tp = _run(_spec(precision="32-true", gpus=8, tensor_parallel=8))
    bf16_tp = _run(_spec(precision="bf16-true", gpus=8, tensor_parallel=8))
    assert (fp32_tp.components_seconds["tensor_parallel_communication"]
            / bf16_tp.components_seconds["tensor_parallel_communication"]) == pytest.approx(2.0, rel=1e-9)


def test_tensor_parallel_group_wider_than_a_node_uses_the_network() -> None:
    spec = _spec(model="llama-3.1-70b", gpus=16, tensor_parallel=16, seq_len=4096)
    two_nodes = _run(spec, link=Interconnect(gpus_per_node=8))
    one_node = _run(spec, link=Interconnect(gpus_per_node=16))
    ratio = (two_nodes.components_seconds["tensor_parallel_communication"]
             / one_node.components_seconds["tensor_parallel_communication"])
    # NVLink vs the node's eight 400 Gb/s NICs: NCCL's rings (one per NIC) leave the node through all of them
    assert ratio == pytest.approx(450e9 / (8 * 50e9), rel=1e-9)


def test_a_ring_across_nodes_runs_at_the_nics_of_its_members_in_a_node() -> None:
    """NCCL runs a ring per NIC, each carrying its share of the data and leaving the node through its own NIC: a
    data-parallel group with all 8 GPUs of each node moves data at 8 NICs (400 GB/s, under NVLink's 450), one with
    one member per node (tensor parallel 8 inside the node) at one NIC; ring attention's K/V sends cross the node
    boundary over one GPU's NIC whatever the layout. Was one NIC for every collective: llm-foundry's MPT-13b on 64
    H100s (4,800 tokens/s per GPU, 4,792 on 8) was predicted at 1,446 (-70 %), now within its 8-GPU error."""
    flat = _spec(model="llama-3.1-70b", gpus=16, sharding="fsdp", seq_len=4096)
    across = _run(flat, link=Interconnect(gpus_per_node=8)).components_seconds["data_parallel_communication"]
    inside = _run(flat, link=Interconnect(gpus_per_node=16)).components_seconds["data_parallel_communication"]
    assert across / inside == pytest.approx(450e9 / 400e9, rel=1e-9)
    # tp 8 fills each node: every data-parallel group has one member per node, so one NIC each
    tp8 = _spec(model="llama-3.1-70b", gpus=16, tensor_parallel=8, sharding="fsdp", seq_len=4096)
    tp_across = _run(tp8, link=Interconnect(gpus_per_node=8)).components_seconds["data_parallel_communication"]
    tp_inside = _run(tp8, link=Interconnect(gpus_per_node=16)).components_seconds["data_parallel_communication"]
    assert tp_across / tp_inside == pytest.approx(450e9 / 50e9, rel=1e-9)
    # a pool's own per-GPU NIC figure scales the same way: 25 GB/s (HDR) x 8 = 200 GB/s under NVLink
    hdr = _run(flat, link=Interconnect(gpus_per_node=8, inter_node_bytes_per_second=25e9))
    assert hdr.components_seconds["data_parallel_communication"] / inside == pytest.approx(450e9 / 200e9, rel=1e-9)


def test_data_parallel_group_inside_a_node_when_pipeline_stages_span_nodes() -> None:
    # 16 GPUs, 2 pipeline stages of 8: each data-parallel group of 8 lives on one node
    spec = _spec(model="llama-3.1-70b", gpus=16, pipeline_parallel=2, sharding="fsdp", seq_len=4096)
    two_nodes = _run(spec, link=Interconnect(gpus_per_node=8))
    one_node = _run(spec, link=Interconnect(gpus_per_node=16))
    assert two_nodes.components_seconds["data_parallel_communication"] == pytest.approx(
        one_node.components_seconds["data_parallel_communication"], rel=1e-12)
    # without pipeline stages the group of 16 crosses the nodes
    flat = _spec(model="llama-3.1-70b", gpus=16, sharding="fsdp", seq_len=4096)
    assert (_run(flat, link=Interconnect(gpus_per_node=8)).components_seconds["data_parallel_communication"]
            > _run(flat, link=Interconnect(gpus_per_node=16)).components_seconds["data_parallel_communication"])


def test_fsdp_qlora_gathers_the_packed_4bit_codes() -> None:
    spec = _spec(model="llama-3.1-70b", method="qlora", gpus=8, sharding="fsdp")
    arch = resolve_model(spec).architecture
    rt = _run(spec, gpu="L40S")
    quantized = arch.quantizable_params()
    gathered = quantized * 0.5 + (arch.params_total - quantized) * 2.0
    adapters = sum(8 * (g.in_features + g.out_features) * g.count for g in arch.lora_groups(["q_proj", "v_proj"]))
    expected = 7 / 8 * (2 * gathered + adapters * 2.0)  # bf16-true: 16-bit adapter gradients
    link = 32e9 * 0.75  # L40S: PCIe only
    assert rt.components_seconds["data_parallel_communication"] == pytest.approx(expected / link, rel=1e-9)


def test_int8_dequantization_reads_one_byte_codes() -> None:
    int8 = _run(_spec(method="qlora", quantization="int8"), gpu="A100-80GB")
    nf4 = _run(_spec(method="qlora", quantization="nf4"), gpu="A100-80GB")
    # read the codes, write and read the 16-bit copy
    assert (int8.components_seconds["dequantization"] / nf4.components_seconds["dequantization"]
            == pytest.approx((1.0 + 4.0) / (0.5 + 4.0), rel=1e-12))


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_frozen_weights_are_read_without_a_weight_gradient_pass(checkpointing: str) -> None:
    # the memory floor reads each weight per pass: forward, dX, dW (+ the recompute); a LoRA base has no dW pass
    full = _run(_spec(model="llama-3.1-8b", method="full", micro_batch_size=1, seq_len=16,
                      gradient_checkpointing=checkpointing))
    lora = _run(_spec(model="llama-3.1-8b", method="lora", micro_batch_size=1, seq_len=16,
                      gradient_checkpointing=checkpointing))
    extra = 1 if checkpointing == "full" else 0
    ratio = lora.components_seconds["memory_floor"] / full.components_seconds["memory_floor"]
    assert ratio == pytest.approx((2 + extra) / (3 + extra), rel=1e-9)


def test_fp32_runs_at_the_cuda_core_peak_not_tf32() -> None:
    # PyTorch leaves TF32 matmuls off by default (allow_tf32 = False since 1.12): an fp32 job on an H100 gets the
    # 67 TFLOP/s of the CUDA cores, not the 494 TFLOP/s of TF32 tensor cores (it was predicted 7x too fast)
    fp32 = _run(_spec(model="llama-3.2-1b", method="full", precision="32-true", micro_batch_size=8, seq_len=2048))
    bf16 = _run(_spec(model="llama-3.2-1b", method="full", precision="bf16-true", micro_batch_size=8, seq_len=2048))
    assert fp32.components_seconds["compute"] > 5 * bf16.components_seconds["compute"]


def test_a_partly_filled_node_sets_the_pace_of_a_ring_across_nodes() -> None:
    """9 GPUs on nodes of 8: the ninth sits alone on its node, and every ring's traffic into and out of that node goes
    through its one NIC; 12 GPUs leave 4 on the second node (4 NICs). Pooling counted a full node's 8 NICs for both."""
    from predictors.runtime import _link_bytes_per_second, efficiency_table

    table = efficiency_table()
    gpu = lookup_gpu("H100-80GB")
    link = Interconnect(gpus_per_node=8)
    util = table.collective_bandwidth_utilization
    assert _link_bytes_per_second(gpu, 9, link, table) == pytest.approx(50e9 * util)
    assert _link_bytes_per_second(gpu, 12, link, table) == pytest.approx(200e9 * util)
    assert _link_bytes_per_second(gpu, 16, link, table) == pytest.approx(400e9 * util)
    nine = _run(_spec(gpus=9, sharding="fsdp"), link=link).components_seconds["data_parallel_communication"]
    sixteen = _run(_spec(gpus=16, sharding="fsdp"), link=link).components_seconds["data_parallel_communication"]
    assert nine > sixteen  # the lone GPU's NIC, not a node's eight
