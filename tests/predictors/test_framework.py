"""`framework: transformers` (a TrainingSpec extension): what the Hugging Face stack does differently from the
framework-neutral model, each on a small case computed by hand, and where the framework is read from a job."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.architecture import architecture_from_config
from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.runtime import efficiency_table, predict_runtime
from predictors.spec import TrainingSpec, parse_training_spec, spec_to_dict
from predictors.vram import VramPrediction, predict_vram
from tests.scheduler.spec.helpers import one_job, pod

LLAMA: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "tie_word_embeddings": False,
}
PHI: dict[str, Any] = {
    "model_type": "phi", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 256, "vocab_size": 1000, "hidden_act": "gelu_new", "partial_rotary_factor": 0.5,
}
TOKENS = 2048  # micro_batch_size 1 x seq_len 2048 (the spec defaults)


def both(config: dict[str, Any], **fields: Any) -> tuple[VramPrediction, VramPrediction]:
    """(framework unset, framework transformers) for the same spec."""
    out = []
    for framework in (None, "transformers"):
        spec = parse_training_spec({"model": {"name": "tiny", "config": config}, "framework": framework, **fields})
        out.append(predict_vram(spec, architecture_from_config(config, "tiny"), lookup_gpu("A100-80GB")))
    return out[0], out[1]


def test_spec_field_names_and_errors() -> None:
    assert parse_training_spec({"model": "gpt2", "framework": "HF"}).framework == "transformers"
    assert parse_training_spec({"model": "gpt2", "framework": "Transformers"}).framework == "transformers"
    unset = parse_training_spec({"model": "gpt2"})
    assert unset.framework is None and "framework" not in spec_to_dict(unset)  # v1 documents serialize as before
    assert spec_to_dict(parse_training_spec({"model": "gpt2", "framework": "hf"}))["framework"] == "transformers"
    with pytest.raises(SpecError) as err:
        parse_training_spec({"model": "gpt2", "framework": "deepspeed-chat", "seq_len": -1})
    text = str(err.value)
    assert "spec.framework" in text and "leave framework out" in text and "spec.seq_len" in text  # all at once


def test_qlora_4bit_layers_keep_no_input_on_transformers() -> None:
    # bitsandbytes >= 0.44 saves (None, B): the q/k/v input (h), the gate/up input (h) and the down input (MLP
    # width), 2 bytes each under bf16 autocast, are no longer kept in each of the 2 blocks
    unset, hf = both(LLAMA, method="qlora")
    assert unset.breakdown_bytes["activations"] - hf.breakdown_bytes["activations"] == TOKENS * 2 * 2 * (64 + 64 + 128)
    assert any("4-bit layers keep no input" in n for n in hf.notes)
    assert not any("framework" in n for n in unset.notes)


def test_int8_layers_keep_their_input_on_every_framework() -> None:
    """bitsandbytes' MatMul8bitLt saves (CAt, subA, A) whenever it needs a gradient, in every release: LLM.int8
    layers keep their 16-bit input on transformers too (it was dropped there as for the 4-bit layers, and the note
    spoke of 4-bit layers)."""
    unset, hf = both(LLAMA, method="qlora", quantization="int8")
    assert hf.breakdown_bytes["activations"] == unset.breakdown_bytes["activations"]
    assert any("8-bit layers keep their 16-bit input" in n for n in hf.notes)
    assert not any("4-bit" in n for n in hf.notes)


def test_phi_gelu_new_keeps_three_intermediates_on_transformers() -> None:
    # NewGELUActivation's tanh output, 0.5 * x and 1 + tanh: 3 x 2 bytes per MLP unit, per token and block
    unset, hf = both(PHI, precision="bf16-true")
    assert hf.breakdown_bytes["activations"] - unset.breakdown_bytes["activations"] == TOKENS * 2 * 3 * 2 * 256
    assert any("gelu_new runs unfused" in n for n in hf.notes)


def test_checkpointed_backward_takes_the_larger_phase_on_transformers() -> None:
    unset, hf = both(LLAMA, method="lora", precision="bf16-true", gradient_checkpointing="full")
    # the logits phase (12 bytes per logit: 10 + the bf16 gradient) is the larger here (vocab 1000 x 12 bytes per
    # token against a recomputed block of a few KiB), so no recomputed block sits on top of it
    assert hf.breakdown_bytes["logits"] == TOKENS * 1000 * 12
    assert unset.breakdown_bytes["logits"] == TOKENS * 1000 * 10
    # what is left is what full checkpointing keeps: each block's bf16 input and the final norm's input and fp32 copy
    assert hf.breakdown_bytes["activations"] == TOKENS * (2 * 2 * 64 + 2 * 64 + 4 * 64)
    assert hf.breakdown_bytes["activations"] < unset.breakdown_bytes["activations"]
    assert any("backward peaks with the logits" in n for n in hf.notes)
    # the allocator keeps the blocks of the phase that is not the peak: it reserves what the sum allocates
    assert hf.peak_allocated_bytes < unset.peak_allocated_bytes < hf.peak_reserved_bytes


def test_classifier_recompute_holds_the_mlp_gradients_on_transformers() -> None:
    # no logits phase: the recomputed block also holds its MLP backward's three width-sized gradients (bf16)
    unset, hf = both(LLAMA, task="seq-classification", method="lora", precision="bf16-true",
                     gradient_checkpointing="full")
    assert hf.breakdown_bytes["activations"] - unset.breakdown_bytes["activations"] == TOKENS * 3 * 2 * 128
    assert "logits" not in hf.breakdown_bytes


def test_transformers_adds_the_eager_elementwise_passes_to_the_step() -> None:
    base = {"model": "llama-2-7b", "method": "lora", "precision": "bf16-true", "micro_batch_size": 4,
            "seq_len": 2048, "train_tokens": 1e9}
    arch = resolve_model(TrainingSpec.model_validate(base)).architecture
    gpu = lookup_gpu("H100-80GB")
    unset = predict_runtime(TrainingSpec.model_validate(base), arch, gpu)
    hf = predict_runtime(TrainingSpec.model_validate({**base, "framework": "transformers"}), arch, gpu)
    t = efficiency_table()
    per_token = t.eager_elementwise_bytes_per_hidden * 4096 + t.eager_elementwise_bytes_per_mlp_width * 11008
    expected = 4 * 2048 * per_token * 3 * 32 / (gpu.memory_bandwidth_bytes_per_second * t.memory_bandwidth_utilization)
    assert hf.components_seconds["eager_elementwise"] == pytest.approx(expected, rel=1e-12)
    assert unset.components_seconds["eager_elementwise"] == 0.0
    assert hf.step_time_seconds - unset.step_time_seconds == pytest.approx(expected, rel=1e-9)
    parts, _ = hf.step_breakdown()
    assert parts["eager_elementwise"] == pytest.approx(expected) and sum(parts.values()) == pytest.approx(
        hf.step_time_seconds)


M = "meta-llama/Llama-3.1-8B"


@pytest.mark.parametrize(("argv", "source"), [
    (["python", "train.py", "--model_name_or_path", M, "--per_device_train_batch_size", "4"],
     "flag --per_device_train_batch_size (transformers' TrainingArguments)"),
    (["llamafactory-cli", "train", "--model_name_or_path", M, "--stage", "sft"],
     "LLaMA-Factory (trains with transformers and PEFT)"),
    (["trl", "sft", "--model_name_or_path", M], "TRL (trains with transformers and PEFT)"),
    (["bash", "-c", f"cat > /tmp/a.yml <<EOF\nbase_model: {M}\nadapter: lora\nEOF\naxolotl train /tmp/a.yml"],
     "axolotl (trains with transformers and PEFT)"),
], ids=["hf-trainer", "llamafactory", "trl", "axolotl"])
def test_hugging_face_trainers_are_read_as_transformers(argv: list[str], source: str) -> None:
    job = one_job(pod(argv))
    assert job.spec.framework == "transformers"
    assert job.provenance["framework"] == source


def test_other_commands_leave_the_framework_unset() -> None:
    argv = ["torchrun", "--nproc_per_node", "8", "train.py", "--model_name_or_path", M, "--batch_size", "4"]
    assert one_job(pod(argv)).spec.framework is None
    tune = one_job(pod(["tune", "run", "lora_finetune_single_device", "--config", "llama3_1/8B_lora_single_device"]))
    assert tune.spec.framework == "torchtune"
    assert tune.provenance["framework"] == "torchtune recipe lora_finetune_single_device"


def test_torchtune_adapters_are_in_the_model_dtype_and_share_their_inputs() -> None:
    lora = {"rank": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                          "down_proj"], "dropout": 0.0}
    fields = {"method": "lora", "precision": "bf16-true", "lora": lora}
    specs = [parse_training_spec({"model": {"name": "tiny", "config": LLAMA}, "framework": f, **fields})
             for f in (None, "torchtune")]
    arch = architecture_from_config(LLAMA, "tiny")
    peft, tune = (predict_vram(s, arch, lookup_gpu("A100-80GB")) for s in specs)
    # adapters: bf16 weights, gradients and AdamW states (2 + 2 + 4 bytes) instead of fp32 (4 + 4 + 8)
    assert tune.breakdown_bytes["lora_adapters"] * 2 == peft.breakdown_bytes["lora_adapters"]
    assert tune.breakdown_bytes["optimizer_states"] * 2 == peft.breakdown_bytes["optimizer_states"]
    # inputs: PEFT keeps a 4-byte copy per adapter of q, k, v, o, gate, up (hidden 64 each; o's input is 4 x 16)
    # and down (128); torchtune keeps the attention input and the MLP input once and the down input once, 2 bytes
    # each (o's input is the attention kernel's output, kept already); both keep each adapter's rank-8 output
    per_token_peft = 4 * (64 * 6 + 128) + 4 * 8 * 7
    per_token_tune = 2 * (64 + 64 + 128) + 2 * 8 * 7
    diff = peft.breakdown_bytes["activations"] - tune.breakdown_bytes["activations"]
    assert diff == 2 * TOKENS * (per_token_peft - per_token_tune)


def test_torchtune_nf4_layers_keep_no_input() -> None:
    unset, _ = both(LLAMA, method="qlora")
    tune = predict_vram(parse_training_spec({"model": {"name": "tiny", "config": LLAMA}, "method": "qlora",
                                             "framework": "torchtune"}),
                        architecture_from_config(LLAMA, "tiny"), lookup_gpu("A100-80GB"))
    assert unset.breakdown_bytes["activations"] > tune.breakdown_bytes["activations"]


def test_a_transformers_native_model_under_deepspeed_upcasts_its_logits() -> None:
    """DeepSpeed's 16-bit engine runs no autocast, so a loss on the 16-bit logits stays 16-bit (2 + 2 bytes per
    logit, what the remote-code Qwen-1 ZeRO rows show). transformers' own models upcast before the loss
    (ForCausalLMLoss: logits.float()), so with framework transformers the loss tensors are the 16-bit case's 2 + 4 + 4;
    a remote-code family with its own loss (Qwen-1) keeps 2 + 2. Giles Thomas's Llama-3-8B ZeRO-2 sweep (external set
    5, X20) was 22.7 % under at the median and missed its OOM rows before."""
    fields = {"precision": "bf16-mixed", "gpus": 2, "sharding": "zero2", "method": "full"}
    neutral, hf = both(LLAMA, **fields)
    elements = TOKENS * LLAMA["vocab_size"]
    assert neutral.breakdown_bytes["logits"] == pytest.approx(elements * (2 + 2))
    assert hf.breakdown_bytes["logits"] == pytest.approx(elements * (2 + 4 + 4))
    qwen = {**LLAMA, "model_type": "qwen", "kv_channels": 16, "no_bias": True, "seq_length": 2048}
    _, remote = both(qwen, **fields)
    assert remote.breakdown_bytes["logits"] == pytest.approx(elements * (2 + 2))
