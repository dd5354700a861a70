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
        parse_training_spec({"model": "gpt2", "framework": "torchtune", "seq_len": -1})
    text = str(err.value)
    assert "spec.framework" in text and "leave framework out" in text and "spec.seq_len" in text  # all at once


def test_qlora_4bit_layers_keep_no_input_on_transformers() -> None:
    # bitsandbytes >= 0.44 saves (None, B): the q/k/v input (h), the gate/up input (h) and the down input (MLP
    # width), 2 bytes each under bf16 autocast, are no longer kept in each of the 2 blocks
    unset, hf = both(LLAMA, method="qlora")
    assert unset.breakdown_bytes["activations"] - hf.breakdown_bytes["activations"] == TOKENS * 2 * 2 * (64 + 64 + 128)
    assert any("4-bit layers keep no input" in n for n in hf.notes)
    assert not any("framework" in n for n in unset.notes)


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


@pytest.mark.parametrize("argv", [
    ["tune", "run", "lora_finetune_single_device", "--config", "llama3_1/8B_lora_single_device"],
    ["torchrun", "--nproc_per_node", "8", "train.py", "--model_name_or_path", M, "--batch_size", "4"],
], ids=["torchtune", "plain-torchrun"])
def test_other_commands_leave_the_framework_unset(argv: list[str]) -> None:
    assert one_job(pod(argv)).spec.framework is None
