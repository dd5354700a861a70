"""The analytic VRAM model, component by component, on a tiny model whose numbers are easy to check."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.architecture import architecture_from_config
from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.spec import parse_training_spec
from predictors.vram import MIB, VramPrediction, predict_vram

TINY: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "tie_word_embeddings": False,
}
ARCH = architecture_from_config(TINY, "tiny")
H, L, INTER, V = 64, 2, 128, 1000
# q 64x64, k 64x32, v 64x32, o 64x64, gate/up 64x128, down 128x64, 2 RMSNorms per layer
PER_LAYER = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 2 * 64 * 128 + 128 * 64 + 2 * 64
PARAMS = V * H + L * PER_LAYER + H + V * H  # embedding, layers, final norm, untied head


def run(gpu: str | None = "A100-80GB", **fields: Any) -> VramPrediction:
    spec = parse_training_spec({"model": {"name": "tiny", "config": TINY}, **fields})
    return predict_vram(spec, ARCH, lookup_gpu(gpu) if gpu else None)


def test_param_count_by_hand() -> None:
    assert ARCH.params_total == PARAMS == 202_048


def test_levels_are_ordered_and_breakdown_sums() -> None:
    for fields in ({}, {"method": "lora"}, {"method": "qlora"}, {"gpus": 4, "sharding": "fsdp"},
                   {"optimizer": "paged-adamw-8bit"}):
        p = run(**fields)
        assert p.peak_allocated_bytes <= p.peak_reserved_bytes <= p.peak_vram_bytes
        assert sum(p.breakdown_bytes.values()) == p.peak_vram_bytes


def test_full_bf16_true_model_states() -> None:
    p = run(precision="bf16-true", optimizer="adamw")
    assert p.breakdown_bytes["weights"] == PARAMS * 2
    assert p.breakdown_bytes["optimizer_states"] == PARAMS * 2 * 2  # exp_avg + exp_avg_sq in bf16


def test_full_amp_keeps_fp32_model_grads_and_states() -> None:
    p = run(precision="bf16-mixed", seq_len=8, optimizer="adamw")
    assert p.breakdown_bytes["weights"] == PARAMS * 4
    assert p.breakdown_bytes["optimizer_states"] == PARAMS * 8
    assert p.peak_phase == "optimizer_step"  # tiny activations: the step's gradients + workspace win
    assert p.breakdown_bytes["gradients"] == PARAMS * 4
    assert p.breakdown_bytes["optimizer_step_workspace"] == PARAMS * 4


def test_fp32_gradients_hold_4_bytes_per_trained_parameter() -> None:
    """Megatron's fp32 main_grad buffer (fp32_gradients): a 16-bit model with fp32 masters (ZeRO-1: the distributed
    optimizer) holds its gradients in fp32, whole on every rank; it is also what the data-parallel reduction runs on,
    so DDP adds no bucket; LoRA adapters keep the dtype they are held in."""
    zero1 = dict(precision="bf16-mixed", seq_len=8, optimizer="adamw", gpus=2, sharding="zero1")
    plain, fp32 = run(**zero1), run(**zero1, fp32_gradients=True)
    assert plain.breakdown_bytes["gradients"] == PARAMS * 2
    assert fp32.breakdown_bytes["gradients"] == PARAMS * 4
    assert fp32.breakdown_bytes["weights"] == plain.breakdown_bytes["weights"] == PARAMS * 2
    assert any("fp32_gradients" in n for n in fp32.notes)
    # allocated whole before the first forward: the backward peak holds all of it, and accumulation adds in place
    long = run(**{**zero1, "seq_len": 512, "grad_accum_steps": 4}, fp32_gradients=True)
    assert long.peak_phase == "backward" and long.breakdown_bytes["gradients"] == PARAMS * 4
    ddp = dict(precision="bf16-mixed", seq_len=8, optimizer="adamw", gpus=2, sharding="ddp")
    assert run(**ddp).breakdown_bytes["gradients"] == run(**ddp, fp32_gradients=True).breakdown_bytes["gradients"]
    assert run(**ddp).breakdown_bytes["communication_buffers"] == PARAMS * 4
    assert "communication_buffers" not in run(**ddp, fp32_gradients=True).breakdown_bytes
    tune = dict(method="lora", precision="bf16-true", seq_len=8, framework="torchtune")
    assert run(**tune, fp32_gradients=True).breakdown_bytes["lora_adapters"] == run(**tune).breakdown_bytes[
        "lora_adapters"]


def test_megatron_trains_a_16bit_model_with_fp32_main_parameters() -> None:
    """framework megatron: *-mixed is Megatron's Float16Module, a 16-bit model whose optimizer keeps fp32 main
    parameters, not autocast over an fp32 model (Megatron-LM's GPT-345M fp16 DP-4 log, external set 11: 13.5 GiB
    predicted as AMP for 8.5 measured). Its gradient buffer is what data parallelism reduces (no DDP bucket), fp32
    under bf16 unless fp32_gradients says otherwise, and its Adam is fused."""
    fields = dict(seq_len=8, optimizer="adamw", gpus=2, sharding="ddp", framework="megatron")
    fp16 = run(precision="16-mixed", **fields)
    b = fp16.breakdown_bytes
    assert (b["weights"], b["master_weights"], b["gradients"]) == (PARAMS * 2, PARAMS * 4, PARAMS * 2)
    assert "communication_buffers" not in b and "autocast_weight_copies" not in b
    assert "optimizer_step_workspace" not in b  # fused Adam
    assert run(precision="bf16-mixed", **fields).breakdown_bytes["gradients"] == PARAMS * 4  # fp32 under bf16
    assert run(precision="bf16-mixed", fp32_gradients=False, **fields).breakdown_bytes["gradients"] == PARAMS * 2
    # the same job as torch AMP: an fp32 model, fp32 gradients, a DDP bucket and autocast's 16-bit copies
    amp = run(precision="16-mixed", **{**fields, "framework": None}).breakdown_bytes
    assert (amp["weights"], amp["gradients"], amp["communication_buffers"]) == (PARAMS * 4, PARAMS * 4, PARAMS * 4)
    assert fp16.peak_allocated_bytes < run(precision="16-mixed", **{**fields, "framework": None}).peak_allocated_bytes


def test_master_weights_keep_a_16bit_model_without_autocast() -> None:
    """master_weights (DeepSpeed's engine at ZeRO stage 0): *-mixed without sharding as a 16-bit model whose optimizer
    keeps fp32 masters, not autocast over an fp32 model; refused where the precision or FSDP's policy decides it."""
    fields = dict(precision="16-mixed", seq_len=8, optimizer="adamw", gpus=2, sharding="ddp")
    b = run(**fields, master_weights=True).breakdown_bytes
    assert (b["weights"], b["master_weights"], b["gradients"]) == (PARAMS * 2, PARAMS * 4, PARAMS * 2)
    assert "autocast_weight_copies" not in b
    assert "communication_buffers" not in b  # DeepSpeed's engine reduces its own buffers: no DDP bucket copy
    amp = run(**fields).breakdown_bytes
    assert (amp["weights"], amp["gradients"]) == (PARAMS * 4, PARAMS * 4) and "master_weights" not in amp
    # a 16-bit loss needs no autocast to say so: allowed with master_weights (and under Megatron)
    run(**fields, master_weights=True, cross_entropy="16-bit")
    run(**{**fields, "framework": "megatron"}, cross_entropy="16-bit")
    with pytest.raises(SpecError, match="always keeps a 16-bit model"):
        parse_training_spec({"model": {"name": "tiny", "config": TINY}, **{**fields, "sharding": "zero2"},
                             "master_weights": False})
    for bad, why in (({"precision": "bf16-true"}, "precision is bf16-true"),
                     ({"sharding": "fsdp"}, "sharding fsdp")):
        with pytest.raises(SpecError, match=why):
            parse_training_spec({"model": {"name": "tiny", "config": TINY}, **{**fields, **bad},
                                 "master_weights": True})


def test_megatrons_fused_kernels_keep_their_inputs_only() -> None:
    """framework megatron: the fused bias-GeLU keeps its input only (transformers' gelu_new chain keeps three more
    MLP-width tensors) and the fused LayerNorm its 16-bit input (where vramfit counts an fp32 copy and the 16-bit
    output: 4 + 2 bytes); on a GPT-2-shaped model, eager attention (its softmax is in the compute dtype either way).
    FusedScaleMaskSoftmax keeps the probabilities in the compute dtype, where transformers' Llama upcasts them to
    fp32 and keeps the fp32 result and its 16-bit cast (4 + 2 bytes per score)."""
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 512, "vocab_size": 1000,
            "activation_function": "gelu_new", "tie_word_embeddings": True}
    arch = architecture_from_config(gpt2, "tiny-gpt2")

    def acts(**fields: Any) -> int:
        spec = parse_training_spec({"model": {"name": "tiny-gpt2", "config": gpt2}, "precision": "bf16-true",
                                    "attention": "eager", "seq_len": 256, **fields})
        return predict_vram(spec, arch, lookup_gpu("A100-80GB")).breakdown_bytes["activations"]

    s, width, h = 256, 4 * 64, 64
    assert acts() - acts(framework="megatron") == 2 * (s * width * 3 * 2 + s * 2 * h * (4 + 2 - 2))
    llama = dict(precision="bf16-true", attention="eager", seq_len=256, sharding="zero1", gpus=2)
    scores = L * 4 * 256 * 256  # layers x heads x s^2
    norms = L * 256 * 2 * H * (4 + 2 - 2)
    assert run(**llama).breakdown_bytes["activations"] - run(**llama, framework="megatron").breakdown_bytes[
        "activations"] == scores * (4 + 2 - 2) + norms


def test_without_sequence_parallelism_tensor_parallel_ranks_keep_the_norm_inputs_whole() -> None:
    """sequence_parallel false (Megatron without --sequence-parallel): each of the TP ranks keeps what lies outside
    the parallel regions whole: under Megatron's fused norms a block's two norm inputs and the two first linears'
    input, 4 x 2 bytes per hidden unit and token (Korthikanti et al.'s 10sbh less the dropout masks the tiny model
    has none of), where sequence parallelism (the default) splits them too."""
    fields = dict(precision="bf16-mixed", seq_len=512, gpus=2, tensor_parallel=2, sharding="zero1",
                  framework="megatron")
    split = run(**fields).breakdown_bytes["activations"]
    whole = run(**fields, sequence_parallel=False).breakdown_bytes["activations"]
    assert whole - split == pytest.approx(4 * 2 * H * 512 * L / 2, rel=1e-9)
    assert run(**fields, sequence_parallel=True).breakdown_bytes["activations"] == split
    # under full recompute each rank keeps every block's input whole too
    full = {**fields, "gradient_checkpointing": "full"}
    assert run(**full, sequence_parallel=False).breakdown_bytes["activations"] > run(**full).breakdown_bytes[
        "activations"]


def test_amp_keeps_16bit_copies_of_linear_weights_until_backward() -> None:
    linear_per_layer = PER_LAYER - 2 * H  # every weight of a layer but its two norms
    head = V * H
    p = run(method="lora", precision="bf16-mixed", seq_len=512)
    assert p.peak_phase == "backward"
    assert p.breakdown_bytes["autocast_weight_copies"] == (L * linear_per_layer + head) * 2
    # checkpointed blocks recompute one block at a time; the head stays outside the blocks
    p = run(method="lora", precision="bf16-mixed", seq_len=512, gradient_checkpointing="full")
    assert p.breakdown_bytes["autocast_weight_copies"] == (linear_per_layer + head) * 2
    # 4-bit layers keep no dequantized copy, only the 16-bit cast of the (unquantized) head
    p = run(method="qlora", precision="bf16-mixed", seq_len=512)
    assert p.breakdown_bytes["autocast_weight_copies"] == head * 2
    # no autocast: a 16-bit model, or FSDP / DeepSpeed casting the model themselves
    for fields in ({"precision": "bf16-true"}, {"gpus": 2, "sharding": "fsdp"}, {"gpus": 2, "sharding": "zero2"}):
        p = run(method="lora", seq_len=512, **{"precision": "bf16-mixed", **fields})
        assert "autocast_weight_copies" not in p.breakdown_bytes


def test_deepspeed_mixed_keeps_16bit_model_and_fp32_master() -> None:
    p = run(precision="bf16-mixed", gpus=4, sharding="zero2", seq_len=8)
    assert p.breakdown_bytes["weights"] == PARAMS * 2
    assert p.breakdown_bytes["master_weights"] == PARAMS * 4 // 4
    assert p.breakdown_bytes["optimizer_states"] == PARAMS * 8 // 4


@pytest.mark.parametrize(("sharding", "weights_div", "states_div"),
                         [("ddp", 1, 1), ("zero1", 1, 4), ("zero3", 4, 4), ("fsdp", 4, 4)])
def test_sharding_divides_what_it_shards(sharding: str, weights_div: int, states_div: int) -> None:
    p = run(precision="bf16-true", gpus=4, sharding=sharding)
    assert p.breakdown_bytes["weights"] == pytest.approx(PARAMS * 2 / weights_div, abs=1)
    assert p.breakdown_bytes["optimizer_states"] == pytest.approx(PARAMS * 4 / states_div, abs=1)
    assert "nccl_buffers" in p.breakdown_bytes


def test_lora_trains_only_adapters() -> None:
    p = run(method="lora", precision="bf16-true", lora={"rank": 8, "target_modules": ["q_proj", "v_proj"]})
    lora_params = L * (8 * (64 + 64) + 8 * (64 + 32))
    assert p.params_trainable == lora_params
    assert p.breakdown_bytes["weights"] == PARAMS * 2
    # the frozen base stays bf16; PEFT keeps the adapters, their gradients and Adam's two states in fp32
    assert p.breakdown_bytes["lora_adapters"] == lora_params * 4
    assert p.breakdown_bytes["gradients"] == lora_params * 4
    assert p.breakdown_bytes["optimizer_states"] == lora_params * 2 * 4


def test_modules_to_save_trains_full_copies_of_embedding_and_head() -> None:
    """PEFT modules_to_save: a trainable copy (vocab x hidden) of each module beside the frozen original, with
    its gradients and Adam's two states, all in the base's dtype (bf16 here)."""
    lora = {"rank": 8, "target_modules": ["q_proj", "v_proj"]}
    plain = run(method="lora", precision="bf16-true", lora=lora)
    saved = run(method="lora", precision="bf16-true", lora={**lora, "modules_to_save": ["embed_tokens", "lm_head"]})
    copies = 2 * V * H
    assert saved.params_trainable == plain.params_trainable + copies
    assert saved.breakdown_bytes["saved_modules"] == copies * (2 + 2 + 2 * 2)
    assert saved.breakdown_bytes["weights"] == plain.breakdown_bytes["weights"]  # the originals stay frozen
    assert any("modules_to_save embed_tokens, lm_head" in n for n in saved.notes)
    # ZeRO-2 over 4 GPUs shards the copies' optimizer states (not the copies or their gradients)
    z2 = run(method="lora", precision="bf16-true", gpus=4, sharding="zero2",
             lora={**lora, "modules_to_save": ["lm_head"]})
    assert z2.breakdown_bytes["saved_modules"] == V * H * (2 + 2 + 2 * 2 / 4)
    # the same module named twice, or by another family's name, is one copy
    alias = run(method="lora", precision="bf16-true", lora={**lora, "modules_to_save": ["output", "lm_head"]})
    assert alias.breakdown_bytes["saved_modules"] == V * H * 8


def test_qlora_quantizes_linear_weights_but_not_head_or_embeddings() -> None:
    quantizable = L * (PER_LAYER - 2 * 64)
    rest = PARAMS - quantizable
    nf4 = run(method="qlora", quantization="nf4", precision="bf16-true")
    assert nf4.breakdown_bytes["weights"] == pytest.approx(quantizable * (0.5 + 4 / 64) + rest * 2, abs=1)
    dq = run(method="qlora", quantization="nf4-dq", precision="bf16-true")
    assert dq.breakdown_bytes["weights"] < nf4.breakdown_bytes["weights"]
    # *-mixed: PEFT upcasts the non-quantized parameters to fp32
    mixed = run(method="qlora", quantization="nf4", precision="bf16-mixed")
    assert mixed.breakdown_bytes["weights"] == pytest.approx(quantizable * (0.5 + 4 / 64) + rest * 4, abs=1)


def test_logits_are_vocab_sized_with_fp32_upcast() -> None:
    p = run(precision="bf16-true", micro_batch_size=2, seq_len=256)
    assert p.peak_phase == "backward"
    assert p.breakdown_bytes["logits"] == 2 * 256 * V * (2 + 4 + 4)
    p32 = run(precision="32-true", micro_batch_size=2, seq_len=256)
    assert p32.breakdown_bytes["logits"] == 2 * 256 * V * (4 + 4)  # no upcast needed
    cls = run(task="seq-classification", micro_batch_size=2, seq_len=256)
    assert "logits" not in cls.breakdown_bytes


def test_activations_scale_and_checkpointing_saves() -> None:
    base = run(precision="bf16-true", seq_len=512).breakdown_bytes["activations"]
    double = run(precision="bf16-true", seq_len=512, micro_batch_size=2).breakdown_bytes["activations"]
    assert double == pytest.approx(2 * base, rel=1e-6)
    deep = dict(TINY, num_hidden_layers=16)
    arch = architecture_from_config(deep, "deep")

    def act(ckpt: str) -> int:
        spec = parse_training_spec({"model": {"config": deep}, "precision": "bf16-true", "seq_len": 512,
                                    "gradient_checkpointing": ckpt})
        return predict_vram(spec, arch).breakdown_bytes["activations"]

    assert act("full") < act("selective") < act("none")
    # with two layers, recomputing one of them saves less than selective recomputation
    assert run(precision="bf16-true", seq_len=512, gradient_checkpointing="full").breakdown_bytes[
        "activations"] < base


def test_activations_by_hand_for_full_bf16_sdpa() -> None:
    tokens = 4 * 128
    norm = 4 * H + 2 * H  # fp32 input copy + bf16 normalised output (weight trains)
    # input, q + k/v repeated to the 4 query heads (sdpa path of GQA), output, lse
    attn = norm + 2 * H + 2 * (4 + 2 * 4) * 16 + 2 * 4 * 16 + 4 * 4
    mlp = norm + 2 * H + 3 * 2 * INTER + 2 * INTER  # input, gate/act/up, down input
    expected = (L * (attn + mlp) + 2 * H + 4 * H) * tokens
    p = run(precision="bf16-true", micro_batch_size=4, seq_len=128)
    assert p.breakdown_bytes["activations"] == expected
    # flash-attn keeps k and v at their 2 kv heads
    flash = run(precision="bf16-true", micro_batch_size=4, seq_len=128, attention="flash")
    assert flash.breakdown_bytes["activations"] == expected - L * 2 * 2 * (4 - 2) * 16 * tokens


def test_eager_attention_grows_with_seq_len_squared() -> None:
    sdpa = [run(precision="bf16-true", seq_len=s).breakdown_bytes["activations"] for s in (1024, 2048)]
    eager = [run(precision="bf16-true", seq_len=s, attention="eager").breakdown_bytes["activations"]
             for s in (1024, 2048)]
    assert sdpa[1] == pytest.approx(2 * sdpa[0], rel=1e-6)
    # what eager adds over sdpa (the materialised probabilities) grows with seq_len squared
    assert eager[1] - sdpa[1] > 3.5 * (eager[0] - sdpa[0])


def test_dropout_the_config_states_is_counted() -> None:
    """A config's dropout probabilities decide what eager attention and the blocks keep for backward: the scores'
    dropout mask and dropped probabilities (attention dropout), a 1-byte mask per residual-dropout output (hidden
    dropout). Without them a family's usual default holds (GPT-2, BERT, T5: 0.1; modern decoders none): before, a
    Llama-type config that said attention_dropout 0.1 was priced without it, and DistilBERT (dropout 0.1 in its
    config) with none."""
    base = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
            "intermediate_size": 1376, "vocab_size": 32000}

    def acts(config: dict[str, Any], attention: str = "eager") -> int:
        spec = parse_training_spec({"model": {"name": "tiny", "config": config}, "precision": "bf16-true",
                                    "seq_len": 1024, "attention": attention})
        return predict_vram(spec, architecture_from_config(config), None).breakdown_bytes["activations"]

    none = acts(base)
    assert acts({**base, "attention_dropout": 0.0}) == none  # stated 0: as the family default
    attention = acts({**base, "attention_dropout": 0.1})
    hidden = acts({**base, "hidden_dropout": 0.1})
    # eager scores: the fp32 softmax output and its 16-bit cast (6 bytes), with dropout + mask + dropped (4+1+2)
    tokens, layers, heads = 1024, 4, 8  # micro batch 1
    assert attention - none == tokens * layers * heads * 1024 * (7 - 6)
    assert hidden - none == tokens * layers * 2 * 512  # two 1-byte masks of the hidden width per block
    # fused attention keeps no scores: only the hidden dropout shows
    assert acts({**base, "attention_dropout": 0.1}, "sdpa") == acts(base, "sdpa")
    # each family's own names: GPT-2's attn_pdrop / resid_pdrop, BERT's *_dropout_prob, OPT's dropout
    gpt2 = architecture_from_config({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
                                     "vocab_size": 100, "attn_pdrop": 0.0, "resid_pdrop": 0.2})
    assert (gpt2.attention_dropout, gpt2.hidden_dropout) == (0.0, 0.2)
    assert architecture_from_config({**base, "model_type": "opt", "dropout": 0.1}).hidden_dropout == 0.1
    assert architecture_from_config(base).attention_dropout is None
    with pytest.raises(SpecError, match="attention_dropout"):
        architecture_from_config({**base, "attention_dropout": 1.5})


def test_offload_and_paged_states() -> None:
    off = run(precision="bf16-true", offload="optimizer")
    assert "optimizer_states" not in off.breakdown_bytes
    paged = run(precision="bf16-true", optimizer="paged-adamw-8bit")
    assert "optimizer_states" not in paged.breakdown_bytes
    assert paged.breakdown_bytes["paged_optimizer_states"] > 0  # outside the allocator, on the device
    # offloaded, paged states live on the host like any others: the same device peak as 8-bit states offloaded
    paged_off = run(precision="bf16-true", optimizer="paged-adamw-8bit", offload="optimizer")
    assert "paged_optimizer_states" not in paged_off.breakdown_bytes
    assert paged_off.peak_vram_bytes == run(precision="bf16-true", optimizer="adamw-8bit",
                                            offload="optimizer").peak_vram_bytes


def test_tensor_and_pipeline_parallel_split_weights() -> None:
    one = run(precision="bf16-true", gpus=1)
    tp = run(precision="bf16-true", gpus=2, tensor_parallel=2, sharding="none")
    assert tp.breakdown_bytes["weights"] < 0.6 * one.breakdown_bytes["weights"]


def test_pipeline_first_stage_holds_pp_micro_batches_but_one_recompute_buffer() -> None:
    deep = dict(TINY, num_hidden_layers=8, vocab_size=8)  # tiny vocabulary: the first stage is the peak
    arch = architecture_from_config(deep, "deep")

    def act(pp: int, ckpt: str) -> int:
        spec = parse_training_spec({"model": {"config": deep}, "precision": "bf16-true", "seq_len": 4096,
                                    "gpus": pp, "pipeline_parallel": pp, "sharding": "none",
                                    "gradient_checkpointing": ckpt})
        return predict_vram(spec, arch).breakdown_bytes["activations"]

    tokens = 4096
    final_norm = (2 * H + 4 * H) * tokens
    # no recomputation: a stage of 4 layers holding 2 micro-batches = the whole 8-layer model's worth
    assert act(2, "none") == act(1, "none") - final_norm
    # full recomputation: 2 micro-batches x 4 kept block inputs, plus ONE block being recomputed
    kept = 2 * H * tokens
    recompute = act(1, "full") - 8 * kept - final_norm
    assert act(2, "full") == 2 * 4 * kept + recompute


def test_pipeline_peak_is_the_larger_end_not_both() -> None:
    big_vocab = dict(TINY, num_hidden_layers=4, vocab_size=200_000)
    arch = architecture_from_config(big_vocab, "bigvocab")
    spec = parse_training_spec({"model": {"config": big_vocab}, "precision": "bf16-true", "seq_len": 128,
                                "gpus": 2, "pipeline_parallel": 2, "sharding": "none"})
    p = predict_vram(spec, arch)
    # the last stage (head + logits + one micro-batch) is the larger end here: its logits are counted,
    # the first stage's two micro-batches are not added on top
    assert p.breakdown_bytes["logits"] > 0
    one_stage = parse_training_spec({"model": {"config": big_vocab}, "precision": "bf16-true", "seq_len": 128})
    assert p.breakdown_bytes["activations"] < predict_vram(one_stage, arch).breakdown_bytes["activations"]


def test_pipeline_with_fsdp_accumulates_unsharded_gradients() -> None:
    deep = dict(TINY, num_hidden_layers=8)
    arch = architecture_from_config(deep, "deep")
    base = {"model": {"config": deep}, "precision": "bf16-mixed", "seq_len": 128, "gpus": 8, "sharding": "fsdp"}
    no_pp = predict_vram(parse_training_spec(base), arch)
    pp = predict_vram(parse_training_spec({**base, "pipeline_parallel": 2}), arch)
    assert no_pp.peak_phase == "backward"  # only the head's sharded gradient is counted before the step
    # micro-batches run without gradient sync: the stage's fp32 gradients are all there, unsharded
    assert pp.breakdown_bytes["gradients"] - no_pp.breakdown_bytes["gradients"] >= 4 * 0.4 * arch.params_total


def test_gradient_accumulation_keeps_full_gradients_through_backward() -> None:
    one = run(precision="bf16-true", seq_len=4096)
    accum = run(precision="bf16-true", seq_len=4096, grad_accum_steps=8)
    assert one.peak_phase == accum.peak_phase == "backward"
    head_grad = one.breakdown_bytes["gradients"]  # the head's gradient exists before the body's
    assert accum.breakdown_bytes["gradients"] == head_grad + 2 * PARAMS  # + all bf16 gradients
    lora = run(precision="bf16-true", seq_len=4096, method="lora")
    assert run(precision="bf16-true", seq_len=4096, method="lora", grad_accum_steps=8) == lora


def test_cuda_context_depends_on_gpu_family() -> None:
    context = {gpu: run(gpu=gpu).breakdown_bytes["cuda_context"] for gpu in ("V100-16GB", "A100-80GB", "H100-80GB")}
    assert context["V100-16GB"] > context["A100-80GB"] > 300 * MIB
    # Hopper: measured by vramfit calibrate (torch 2.11, CUDA 13): NVML used - torch reserved, 1,382 MiB on the H200
    # and 1,247 MiB on the H100 80GB for the same configs; other Hopper cards on the line through the two
    assert context["H100-80GB"] == 1247 * MIB
    h200, h100_96 = (run(gpu=gpu).breakdown_bytes["cuda_context"] for gpu in ("H200", "H100-96GB"))
    assert h200 == 1382 * MIB and context["H100-80GB"] < h100_96 < h200


def test_a_sequence_beyond_the_position_table_is_noted() -> None:
    arch = architecture_from_config({**TINY, "max_position_embeddings": 512}, "tiny")
    spec = parse_training_spec({"model": {"name": "tiny", "config": TINY}, "seq_len": 1024})
    assert any("beyond the model's max_position_embeddings 512" in n for n in predict_vram(spec, arch, None).notes)
    within = parse_training_spec({"model": {"name": "tiny", "config": TINY}, "seq_len": 512})
    assert not any("max_position_embeddings" in n for n in predict_vram(within, arch, None).notes)


def test_moe_counts_active_experts() -> None:
    moe = dict(TINY, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
    arch = architecture_from_config(moe, "tiny-moe")
    assert arch.params_active_per_token < arch.params_total
    spec = parse_training_spec({"model": {"config": moe}, "precision": "bf16-true"})
    assert predict_vram(spec, arch).breakdown_bytes["weights"] == arch.params_total * 2


@pytest.mark.parametrize("gpu", [None, "T4", "A100-80GB", "H100-80GB", "B200"])
def test_device_peak_on_gpu_is_the_device_level_of_on_gpu(gpu: str | None) -> None:
    from predictors.catalog import resolve_model
    from predictors.vram import device_peak_on_gpu, on_gpu, predict_vram_without_gpu

    spec = parse_training_spec({"model": "llama-3.1-8b", "method": "full", "gpus": 4, "sharding": "fsdp"})
    model = resolve_model(spec)
    base = predict_vram_without_gpu(spec, model.architecture, 4)
    gpu_spec = lookup_gpu(gpu) if gpu else None
    assert device_peak_on_gpu(base, gpu_spec) == on_gpu(base, gpu_spec).peak_vram_bytes
    # and on a prediction that already has a context (placed twice)
    placed = on_gpu(base, lookup_gpu("T4"))
    assert device_peak_on_gpu(placed, gpu_spec) == on_gpu(placed, gpu_spec).peak_vram_bytes


def test_with_breakdown_keeps_every_other_field() -> None:
    """on_gpu and the residual copy a VramPrediction field by field (cheaper than dataclasses.replace): a field
    added later must be added to with_breakdown too."""
    import dataclasses

    from predictors.vram import with_breakdown

    assert [f.name for f in dataclasses.fields(VramPrediction)] == [
        "peak_allocated_bytes", "peak_reserved_bytes", "peak_vram_bytes", "breakdown_bytes", "peak_phase",
        "params_total", "params_trainable", "gpus", "notes"]
    vram = VramPrediction(1, 2, 3, {"weights": 3}, "backward", 10, 5, 2, ("a note",))
    new = {"weights": 3, "x": 0}
    assert with_breakdown(vram, new) == dataclasses.replace(vram, breakdown_bytes=new)
    assert with_breakdown(vram, new, 7) == dataclasses.replace(vram, breakdown_bytes=new, peak_vram_bytes=7)


@pytest.mark.parametrize(("precision", "bytes_per_element"), [("bf16-true", 16), ("bf16-mixed", 12)])
def test_adafactor_steps_one_parameter_at_a_time(precision: str, bytes_per_element: int) -> None:
    # transformers' Adafactor: fp32 copies of a 16-bit parameter and its gradient, the squared and the scaled
    # update, for the largest parameter only (the 1000 x 64 embedding / head), not a buffer for every parameter
    p = run(precision=precision, optimizer="adafactor", seq_len=16)
    assert p.peak_phase == "optimizer_step"
    assert p.breakdown_bytes["optimizer_step_workspace"] == V * H * bytes_per_element


def test_extra_norms_keep_their_fp32_inputs() -> None:
    """Gemma 2's post-attention and post-feedforward norms (four per block) and Qwen3's per-head q/k norms keep the
    fp32 copy of their input, as the two norms of a Llama block do (LoRA: frozen norm weights, nothing more)."""
    def activations(model_type: str, **extra: Any) -> int:
        config = {**TINY, "model_type": model_type, **extra}
        spec = parse_training_spec({"model": {"name": "t", "config": config}, "method": "lora",
                                    "precision": "bf16-true"})
        vram = predict_vram(spec, architecture_from_config(config, "t"), lookup_gpu("A100-80GB"))
        return vram.breakdown_bytes["activations"]

    llama = activations("llama")
    tokens = 2048
    # two more norms per block, 4 bytes per hidden unit each, in each of the 2 blocks
    assert activations("gemma2", head_dim=16) - llama == tokens * L * 2 * 4 * H
    # q (4 heads) and k (2 kv heads) of head_dim 16, 4 bytes each
    assert activations("qwen3", head_dim=16) - llama == tokens * L * 4 * (4 + 2) * 16


def test_kbit_prepared_qlora_runs_its_stream_in_fp32() -> None:
    """PEFT's prepare_model_for_kbit_training leaves a QLoRA model's non-quantized parameters in fp32, so its norms
    put the residual stream in fp32 even over a bf16 base (the v1 reading of a bf16 model with autocast): the
    prediction is the *-mixed one. IBM's fms-acceleration A100 run of this spec (TRL 0.11 SFTTrainer) peaked at
    19.15 GiB allocated; the 16-bit reading gave 14.5."""
    from predictors.spec import TrainingSpec

    base = {"model": "mistral-7b-v0.1", "method": "qlora", "quantization": "nf4-dq", "micro_batch_size": 4,
            "seq_len": 4096, "gradient_checkpointing": "full", "attention": "flash", "framework": "transformers",
            "lora": {"rank": 16, "alpha": 16, "dropout": 0.1, "target_modules": ["q_proj", "k_proj", "v_proj",
                                                                                 "o_proj"]}}
    from predictors.catalog import resolve_model

    arch = resolve_model(TrainingSpec.model_validate(base)).architecture
    plain = predict_vram(TrainingSpec.model_validate({**base, "precision": "bf16-true"}), arch)
    prepared = predict_vram(TrainingSpec.model_validate({**base, "precision": "bf16-true", "kbit_prepared": True}),
                            arch)
    mixed = predict_vram(TrainingSpec.model_validate({**base, "precision": "bf16-mixed"}), arch)
    assert prepared.peak_allocated_bytes == mixed.peak_allocated_bytes
    assert 19.0 < prepared.peak_allocated_bytes / 2**30 < 19.6 and plain.peak_allocated_bytes / 2**30 < 15
    unprepared = predict_vram(TrainingSpec.model_validate({**base, "precision": "bf16-mixed", "kbit_prepared": False}),
                              arch)
    assert unprepared.peak_allocated_bytes == plain.peak_allocated_bytes
    with pytest.raises(ValueError, match="kbit_prepared applies to qlora"):
        TrainingSpec.model_validate({"model": "mistral-7b-v0.1", "method": "lora", "kbit_prepared": True})


def test_a_regex_target_is_the_roles_it_matches() -> None:
    """A string target_modules is a regular expression to PEFT (fullmatch on each module's path), the form axolotl's
    multimodal docs use; it was taken for one literal name and the job refused ("match no linear layer")."""
    from predictors.catalog import resolve_model
    from predictors.spec import TrainingSpec

    arch = resolve_model(TrainingSpec.model_validate({"model": "llama-3.1-8b"})).architecture
    pattern = r"model.language_model.layers.[\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj"
    assert arch.lora_roles([pattern]) == arch.lora_roles("all-linear")
    assert arch.lora_roles([r".*\.(q_proj|v_proj)"]) == {"q_proj", "v_proj"}
    assert arch.lora_roles(["(unbalanced"]) == set()  # not an expression: a literal name, matching nothing
    # a quantified group, more than two unbounded quantifiers or a huge repeat count are never run (Python's re
    # backtracks, and a spec comes from any user): they match nothing, and the spec is refused as not matching
    for hostile in (r"(.*)*q_proj", r"(?:(?:.)+)+!", r"(([\w.]+))+!", ".*.*.*.*.*!", r".*q_proj{99999999999}"):
        assert arch.lora_roles([hostile]) == set(), hostile
    # roles only where they live: an MLP pattern adapts the MLP, not the attention or the head
    assert arch.lora_roles([r".*\.mlp\..*"]) == {"gate_proj", "up_proj", "down_proj"}
    # a pattern restricted to some layers adapts those layers only (PEFT fullmatches each layer's path)
    ten_to_29 = {g.role: g.count for g in arch.lora_groups([r"model\.layers\.(1[0-9]|2[0-9])\.self_attn\.(q|v)_proj"])}
    assert ten_to_29 == {"q_proj": 20, "v_proj": 20}
    # its commas are no list separators
    spec = TrainingSpec.model_validate({"model": "llama-3.1-8b", "method": "lora", "lora": {
        "target_modules": r"model\.layers\.\d{1,2}\.self_attn\.(q|v)_proj"}})
    assert spec.lora is not None and len(spec.lora.target_modules) == 1
    assert arch.lora_roles(spec.lora.target_modules) == {"q_proj", "v_proj"}
