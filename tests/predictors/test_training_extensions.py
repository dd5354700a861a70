"""TrainingSpec extensions for memory-saving training switches: optimizer_in_backward, activation_offloading,
torch_compile and cross_entropy. Each effect on a small case computed by hand, the input errors, and where the
switches are read from a job (torchtune overrides, Hugging Face / axolotl / LLaMA-Factory settings)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from predictors.architecture import architecture_from_config
from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.runtime import predict_runtime
from predictors.spec import TrainingSpec, parse_training_spec, spec_to_dict
from predictors.vram import VramPrediction, predict_vram
from scheduler.spec.document import ParsedJob
from tests.scheduler.spec.helpers import one_job, pod, scan

LLAMA: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "tie_word_embeddings": False,
}
TOKENS = 2048  # micro_batch_size 1 x seq_len 2048 (the spec defaults)


def vram(config: dict[str, Any] = LLAMA, **fields: Any) -> VramPrediction:
    spec = parse_training_spec({"model": {"name": "tiny", "config": config}, **fields})
    return predict_vram(spec, architecture_from_config(config, "tiny"), lookup_gpu("A100-80GB"))


# ---- the spec --------------------------------------------------------------------------------------------------


def test_fields_aliases_and_v1_serialization() -> None:
    spec = parse_training_spec({"model": "gpt2", "optimizer_in_backward": "yes", "activation_offloading": "on",
                                "torch_compile": "true", "cross_entropy": "Liger"})
    assert (spec.optimizer_in_backward, spec.activation_offloading, spec.torch_compile) == (True, True, True)
    assert spec.cross_entropy == "fused-linear"
    assert parse_training_spec({"model": "gpt2", "cross_entropy": "cce"}).cross_entropy == "fused-linear"
    assert parse_training_spec({"model": "gpt2", "cross_entropy": "standard"}).cross_entropy == "full"
    dumped = spec_to_dict(spec)
    assert dumped["cross_entropy"] == "fused-linear" and dumped["torch_compile"] is True
    plain = spec_to_dict(parse_training_spec({"model": "gpt2"}))
    for name in ("optimizer_in_backward", "activation_offloading", "torch_compile", "cross_entropy"):
        assert name not in plain  # a v1 spec serializes as before


@pytest.mark.parametrize(("fields", "parts"), [
    ({"optimizer_in_backward": True, "grad_accum_steps": 4}, ["grad_accum_steps 4", "grad_accum_steps: 1"]),
    ({"optimizer_in_backward": True, "pipeline_parallel": 2, "gpus": 2}, ["pipeline_parallel"]),
    ({"optimizer_in_backward": True, "sharding": "zero2", "gpus": 2}, ["DeepSpeed (zero2)"]),
    ({"cross_entropy": "chunked", "task": "seq-classification"}, ["classifier head", "drop cross_entropy"]),
    ({"cross_entropy": "sampled"}, ["spec.cross_entropy", "full, chunked, fused-linear"]),
    ({"torch_compile": "maybe"}, ["spec.torch_compile"]),
    ({"checkpoint_every_n_layers": 2, "gradient_checkpointing": "selective"},
     ["checkpoint_every_n_layers applies to full gradient checkpointing", "gradient_checkpointing is selective"]),
    ({"checkpoint_every_n_layers": 0, "gradient_checkpointing": "full"}, ["spec.checkpoint_every_n_layers"]),
], ids=["accumulation", "pipeline", "deepspeed", "classifier", "unknown-loss", "not-a-bool", "every-n-selective",
        "every-n-zero"])
def test_inconsistent_switches_are_input_errors(fields: dict[str, Any], parts: list[str]) -> None:
    with pytest.raises(SpecError) as err:
        parse_training_spec({"model": "gpt2", **fields})
    text = str(err.value)
    assert all(p in text for p in parts), text


# ---- memory ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("precision", "grad_bytes", "state_bytes"), [("bf16-true", 2, 2), ("bf16-mixed", 4, 4)])
def test_optimizer_in_backward_holds_one_gradient_and_has_no_step_peak(precision: str, grad_bytes: int,
                                                                      state_bytes: int) -> None:
    base = vram(precision=precision)
    fused = vram(precision=precision, optimizer_in_backward=True)
    largest = 1000 * 64  # the untied head / embedding: vocab x hidden, larger than any block matrix
    assert fused.peak_phase == "backward"
    assert fused.breakdown_bytes["gradients"] == largest * grad_bytes
    # one parameter's foreach-free AdamW temporary, in the state dtype
    assert fused.breakdown_bytes["optimizer_step_workspace"] == largest * state_bytes
    # this tiny model peaks at the start of backward either way, where the head's gradient already exists: the
    # update of that one parameter is all that is added
    assert base.peak_phase == "backward" and base.breakdown_bytes["gradients"] == largest * grad_bytes
    assert fused.peak_allocated_bytes - base.peak_allocated_bytes == largest * state_bytes
    assert any("optimizer_in_backward" in n for n in fused.notes)


def test_optimizer_in_backward_with_a_tied_head_steps_a_block_matrix_at_the_peak() -> None:
    """A tied head's gradient completes only when backward reaches the embedding, after the activations are freed: the
    step temporaries at the peak are a block matrix's. vramfit's H100 rows (tied Llama-3.2-1B and Qwen2.5-1.5B, full
    bf16-true AdamW, 4 x 2,048 tokens): 19.34 / 23.35 GiB with and without optimizer_in_backward alike."""
    tied = {**LLAMA, "tie_word_embeddings": True}
    base = vram(tied, precision="bf16-true")
    fused = vram(tied, precision="bf16-true", optimizer_in_backward=True)
    assert fused.breakdown_bytes["gradients"] == 1000 * 64 * 2  # the tied head's gradient, from backward's start
    assert fused.breakdown_bytes["optimizer_step_workspace"] == 64 * 128 * 2  # gate/up, the largest block matrix
    assert fused.peak_allocated_bytes - base.peak_allocated_bytes == 64 * 128 * 2


def test_optimizer_in_backward_on_a_large_model_drops_the_whole_gradient() -> None:
    spec = {"model": "llama-3.1-8b", "precision": "bf16-true", "optimizer": "adamw", "micro_batch_size": 1,
            "seq_len": 512, "gradient_checkpointing": "full"}
    base = predict_vram(TrainingSpec.model_validate(spec), resolve_model(TrainingSpec.model_validate(spec))
                        .architecture, lookup_gpu("H100-80GB"))
    arch = resolve_model(TrainingSpec.model_validate(spec)).architecture
    fused = predict_vram(TrainingSpec.model_validate({**spec, "optimizer_in_backward": True}), arch,
                         lookup_gpu("H100-80GB"))
    assert base.peak_phase == "optimizer_step" and fused.peak_phase == "backward"
    # the step peak held all 8.0 B bf16 gradients and a state-sized foreach buffer; in backward only the embedding's
    saved = base.peak_allocated_bytes - fused.peak_allocated_bytes
    assert 2 * 2 * 8.03e9 * 0.85 < saved < 2 * 2 * 8.03e9


def test_fused_adamw_has_no_step_temporary() -> None:
    spec = {"model": "llama-3.2-1b", "precision": "bf16-true", "micro_batch_size": 1, "seq_len": 512,
            "gradient_checkpointing": "full"}
    arch = resolve_model(TrainingSpec.model_validate(spec)).architecture
    foreach = predict_vram(TrainingSpec.model_validate(spec), arch, lookup_gpu("H100-80GB"))
    fused = predict_vram(TrainingSpec.model_validate({**spec, "fused_optimizer": True}), arch, lookup_gpu("H100-80GB"))
    assert foreach.peak_phase == fused.peak_phase == "optimizer_step"
    # foreach AdamW: one bf16 buffer the size of the parameters (exp_avg_sq's square root)
    assert foreach.breakdown_bytes["optimizer_step_workspace"] == 2 * foreach.params_trainable
    assert "optimizer_step_workspace" not in fused.breakdown_bytes
    assert foreach.peak_allocated_bytes - fused.peak_allocated_bytes == 2 * foreach.params_trainable
    in_backward = vram(precision="bf16-true", optimizer_in_backward=True, fused_optimizer=True)
    assert "optimizer_step_workspace" not in in_backward.breakdown_bytes
    with pytest.raises(SpecError, match="fused_optimizer applies to adamw, sgd, sgd-momentum"):
        parse_training_spec({"model": "gpt2", "optimizer": "adafactor", "fused_optimizer": True})


def test_activation_offloading_keeps_two_blocks_of_checkpointed_inputs() -> None:
    deep = {**LLAMA, "num_hidden_layers": 8}
    base = vram(deep, precision="bf16-true", gradient_checkpointing="full")
    off = vram(deep, precision="bf16-true", gradient_checkpointing="full", activation_offloading=True)
    # each block's input, 2 bytes x hidden 64 per token: 8 blocks kept on the GPU, then 2
    assert base.breakdown_bytes["activations"] - off.breakdown_bytes["activations"] == 6 * 2 * 64 * TOKENS
    assert any("activation_offloading" in n for n in off.notes)
    # with two blocks there is nothing to take off
    two = vram(precision="bf16-true", gradient_checkpointing="full", activation_offloading=True)
    assert two.breakdown_bytes["activations"] == vram(precision="bf16-true", gradient_checkpointing="full"
                                                      ).breakdown_bytes["activations"]


def test_activation_offloading_without_checkpointing_keeps_two_whole_blocks() -> None:
    deep = {**LLAMA, "num_hidden_layers": 8}
    base = vram(deep, precision="bf16-true")
    off = vram(deep, precision="bf16-true", activation_offloading=True)
    final_norm = (2 * 64 + 4 * 64) * TOKENS  # the final norm's input and fp32 copy stay
    blocks = base.breakdown_bytes["activations"] - final_norm
    assert off.breakdown_bytes["activations"] - final_norm == blocks * 2 // 8


def test_checkpointing_every_nth_block_mixes_checkpointed_and_whole_blocks() -> None:
    """Activations are linear in the number c of checkpointed blocks: c block inputs plus L - c whole blocks (plus the
    final norm and the recomputed block, the same for every c). At c = L (n = 1) they are full checkpointing's, and
    the line extended to c = 0 is no checkpointing's plus the recomputed block. Autocast's 16-bit weight copies are
    kept by the L - c unchecked blocks and the one being recomputed."""
    deep = {**LLAMA, "num_hidden_layers": 8}

    def acts(**fields: Any) -> int:
        return vram(deep, precision="bf16-true", **fields).breakdown_bytes["activations"]

    full, none = acts(gradient_checkpointing="full"), acts()
    by_count = {8 // n if 8 % n == 0 else -(-8 // n): acts(gradient_checkpointing="full", checkpoint_every_n_layers=n)
                for n in (1, 2, 3, 8)}  # n = 3: blocks 0, 3 and 6
    assert sorted(by_count) == [1, 3, 4, 8] and by_count[8] == full
    slope = (by_count[8] - by_count[4]) / 4  # per checkpointed block: its input minus a whole block (negative)
    for count, value in by_count.items():
        assert value == pytest.approx(by_count[8] - slope * (8 - count), abs=2)
    recomputed_block = by_count[8] - 8 * slope - none
    assert 0 < recomputed_block < (none - full)  # one block's worth, less than what checkpointing saves
    mixed = vram(deep, precision="bf16-mixed", gradient_checkpointing="full", checkpoint_every_n_layers=2)
    every = vram(deep, precision="bf16-mixed", gradient_checkpointing="full")
    # 4 of 8 blocks unchecked + 1 recomputed = 5 blocks of copies against 1
    body_copies = every.breakdown_bytes["autocast_weight_copies"]
    head = 1000 * 64 * 2
    assert mixed.breakdown_bytes["autocast_weight_copies"] - head == 5 * (body_copies - head)
    assert any("4 of 8 blocks checkpointed" in n for n in mixed.notes)


def test_offloading_with_every_nth_block_moves_only_the_checkpointed_inputs() -> None:
    """transformers' offload wraps the checkpoint call in save_on_cpu: the unchecked blocks keep their activations on
    the GPU, the checkpointed blocks' inputs go to host memory (2 blocks' worth stay)."""
    deep = {**LLAMA, "num_hidden_layers": 8}
    kept = vram(deep, precision="bf16-true", gradient_checkpointing="full", checkpoint_every_n_layers=2)
    off = vram(deep, precision="bf16-true", gradient_checkpointing="full", checkpoint_every_n_layers=2,
               activation_offloading=True)
    # 4 checkpointed inputs (2 bytes x hidden 64 per token) on the GPU, then 2
    assert kept.breakdown_bytes["activations"] - off.breakdown_bytes["activations"] == 2 * 2 * 64 * TOKENS


def test_every_nth_block_recomputes_that_share_of_the_forward() -> None:
    config = {**LLAMA, "num_hidden_layers": 8}
    arch = architecture_from_config(config, "tiny")
    gpu = lookup_gpu("H100-80GB")

    def run(**fields: Any) -> Any:
        spec = parse_training_spec({"model": {"name": "tiny", "config": config}, "train_tokens": 1e9, **fields})
        return predict_runtime(spec, arch, gpu)

    from predictors.runtime import flops_per_token, recomputed_fraction
    spec = parse_training_spec({"model": {"name": "tiny", "config": config}, "gradient_checkpointing": "full",
                                "checkpoint_every_n_layers": 3})
    assert recomputed_fraction(spec, arch) == 3 / 8  # blocks 0, 3, 6
    full = flops_per_token(parse_training_spec({"model": {"name": "tiny", "config": config},
                                                "gradient_checkpointing": "full"}), arch)
    assert flops_per_token(spec, arch).recompute == pytest.approx(full.recompute * 3 / 8)
    none, every, all_blocks = (run().step_time_seconds,
                               run(gradient_checkpointing="full", checkpoint_every_n_layers=3).step_time_seconds,
                               run(gradient_checkpointing="full").step_time_seconds)
    assert none < every < all_blocks


def test_torch_compile_keeps_the_inputs_of_the_fused_norm_and_gated_activation() -> None:
    eager = vram(precision="bf16-true")
    compiled = vram(precision="bf16-true", torch_compile=True)
    # per block and token: two norms keep their 2-byte input (128) instead of the fp32 copy and the normalised
    # output (4 x 64 + 2 x 64 = 384): 2 x 256; the SiLU-and-multiply keeps gate and up, not its output: 2 x 128
    per_block = 2 * 256 + 2 * 128
    final_norm = 4 * 64  # the final norm keeps its input, not its fp32 copy
    assert eager.breakdown_bytes["activations"] - compiled.breakdown_bytes["activations"] == (
        2 * per_block + final_norm) * TOKENS
    assert any("torch_compile" in n for n in compiled.notes)


def test_cross_entropy_variants_hold_less_of_the_logits() -> None:
    logits = 1000 * TOKENS
    assert vram(precision="bf16-true").breakdown_bytes["logits"] == logits * (2 + 4 + 4)
    chunked = vram(precision="bf16-true", cross_entropy="chunked")
    assert chunked.breakdown_bytes["logits"] == logits * (2 + 4 + 4 / 8)  # eager: every chunk's fp32 log-probs
    compiled = vram(precision="bf16-true", cross_entropy="chunked", torch_compile=True)
    assert compiled.breakdown_bytes["logits"] == logits * (2 + 8 / 8)
    # fp32 training: no upcast to save, so chunking changes nothing
    assert vram(precision="32-true", cross_entropy="chunked").breakdown_bytes["logits"] == logits * (4 + 4)
    # Liger's chunk: ceil(1000 / 64) = 16 chunks' worth of tokens, 2048 / 16 = 128 rows of logits (a power of two)
    fused = vram(precision="bf16-true", cross_entropy="fused-linear")
    inc = math.ceil(1000 / 64)
    rows = 2 ** math.ceil(math.log2(math.ceil(TOKENS / inc)))
    assert rows == 128
    assert fused.breakdown_bytes["logits"] == TOKENS * 64 * 2 + rows * 1000 * 2
    assert any("fused-linear" in n for n in fused.notes)
    assert vram(precision="bf16-true", cross_entropy="full").breakdown_bytes == vram(
        precision="bf16-true").breakdown_bytes


def test_a_compiled_whole_batch_loss_keeps_the_logits_and_their_gradient() -> None:
    """torch_compile with the whole-batch loss (torchtitan compiles cross_entropy(pred.float(), ...)): one fused
    reduction keeps the 16-bit logits, backward writes their 16-bit gradient: 2 + 2 bytes per logit. torchtune's
    decoder upcasts its output before the compiled loss, so its fp32 logits stay (2 + 4 + 4)."""
    logits = 1000 * TOKENS
    assert vram(precision="bf16-true", torch_compile=True).breakdown_bytes["logits"] == logits * (2 + 2)
    assert vram(precision="bf16-true", torch_compile=True, framework="torchtune").breakdown_bytes[
        "logits"] == logits * (2 + 4 + 4)
    assert vram(precision="32-true", torch_compile=True).breakdown_bytes["logits"] == logits * (4 + 4)


def test_a_16bit_loss_keeps_its_logits_and_log_softmax_in_16_bits() -> None:
    """cross_entropy 16-bit: F.cross_entropy of a bf16 model's logits without autocast keeps the logits and the
    log-softmax in bf16 (2 + 2 bytes per logit, against 2 + 4 + 4 with the fp32 upcast); under autocast (AMP) or
    in fp32 training there is no 16-bit loss to say, and the spec is refused with the reason."""
    logits = 1000 * TOKENS
    assert vram(precision="bf16-true", cross_entropy="16-bit").breakdown_bytes["logits"] == logits * (2 + 2)
    assert vram(precision="bf16-true", cross_entropy="bf16").breakdown_bytes["logits"] == logits * (2 + 2)  # alias
    # DeepSpeed's bf16 engine runs no autocast: allowed under *-mixed there
    assert vram(precision="bf16-mixed", sharding="zero2", gpus=2, cross_entropy="16-bit").breakdown_bytes[
        "logits"] == logits * (2 + 2)
    for precision, why in (("bf16-mixed", "under autocast"), ("32-true", "computes them in fp32")):
        with pytest.raises(SpecError, match=why):
            parse_training_spec({"model": {"name": "tiny-llama", "config": LLAMA}, "precision": precision,
                                 "cross_entropy": "16-bit"})


def test_megatrons_loss_holds_the_16bit_logits_and_one_fp32_tensor() -> None:
    """Megatron's vocab_parallel_cross_entropy turns its fp32 copy of the logits into the softmax, and then into the
    gradient, in place: 2 + 4 bytes per logit where transformers' loss holds 2 + 4 + 4."""
    logits = 1000 * TOKENS
    megatron = vram(precision="bf16-mixed", framework="megatron", sharding="zero1", gpus=2)
    assert megatron.breakdown_bytes["logits"] == logits * (2 + 4)
    assert vram(precision="bf16-mixed", framework="megatron", sharding="zero1", gpus=2,
                cross_entropy="fused-linear").breakdown_bytes["logits"] < logits * (2 + 4)


def test_transformers_checkpointed_logits_phase_uses_the_chunked_gradient() -> None:
    fields = {"precision": "bf16-true", "gradient_checkpointing": "full", "framework": "transformers",
              "micro_batch_size": 8}
    full = vram(**fields)
    fused = vram(**fields, cross_entropy="fused-linear")
    assert fused.peak_allocated_bytes < full.peak_allocated_bytes


def test_torch_compile_drops_the_eager_elementwise_time() -> None:
    base = {"model": "llama-2-7b", "method": "lora", "precision": "bf16-true", "micro_batch_size": 4,
            "seq_len": 2048, "train_tokens": 1e9, "framework": "transformers"}
    arch = resolve_model(TrainingSpec.model_validate(base)).architecture
    gpu = lookup_gpu("H100-80GB")
    eager = predict_runtime(TrainingSpec.model_validate(base), arch, gpu)
    compiled = predict_runtime(TrainingSpec.model_validate({**base, "torch_compile": True}), arch, gpu)
    assert eager.components_seconds["eager_elementwise"] > 0
    assert compiled.components_seconds["eager_elementwise"] == 0.0


# ---- reading the switches from jobs ------------------------------------------------------------------------------


def test_torchtune_overrides_set_the_switches_with_provenance() -> None:
    job = one_job(pod(["tune", "run", "full_finetune_single_device", "--config", "llama3_2/3B_full_single_device",
                       "compile=True", "optimizer_in_bwd=True", "enable_activation_offloading=True",
                       "loss=torchtune.modules.loss.CEWithChunkedOutputLoss"]))
    spec = job.spec
    assert (spec.torch_compile, spec.optimizer_in_backward, spec.activation_offloading) == (True, True, True)
    assert spec.cross_entropy == "chunked"
    assert job.provenance["optimizer_in_backward"] == "torchtune override optimizer_in_bwd=True"
    assert job.provenance["cross_entropy"] == "torchtune override loss=torchtune.modules.loss.CEWithChunkedOutputLoss"
    off = one_job(pod(["tune", "run", "full_finetune_single_device", "--config", "llama3_2/3B_full_single_device",
                       "compile=False", "loss._component_=torch.nn.CrossEntropyLoss"])).spec
    assert off.torch_compile is False and off.cross_entropy == "full"


def test_lomo_with_accumulation_keeps_the_gradients() -> None:
    job = one_job(pod(["python", "train.py", "--model_name_or_path", M, "--optim", "lomo",
                       "--gradient_accumulation_steps", "4"]))
    assert job.spec.optimizer == "sgd" and job.spec.optimizer_in_backward is None and job.spec.grad_accum_steps == 4


def test_torchtune_optimizer_in_backward_with_accumulation_is_refused() -> None:
    outcomes = scan(pod(["tune", "run", "full_finetune_single_device", "--config", "llama3_2/3B_full_single_device",
                         "optimizer_in_bwd=True", "gradient_accumulation_steps=8"]))
    assert not any(isinstance(o, ParsedJob) for o in outcomes)
    assert "grad_accum_steps 8" in str(outcomes[0])


M = "meta-llama/Llama-3.1-8B"


@pytest.mark.parametrize(("argv", "expected"), [
    (["python", "train.py", "--model_name_or_path", M, "--use_liger_kernel", "--torch_compile"],
     {"cross_entropy": "fused-linear", "torch_compile": True}),
    (["llamafactory-cli", "train", "--model_name_or_path", M, "--enable_liger_kernel", "true"],
     {"cross_entropy": "fused-linear"}),
    (["bash", "-c", f"cat > /tmp/a.yml <<EOF\nbase_model: {M}\nactivation_offloading: legacy\n"
                    "cut_cross_entropy: true\nEOF\naxolotl train /tmp/a.yml"],
     {"activation_offloading": True, "cross_entropy": "fused-linear"}),
    (["python", "train.py", "--model_name_or_path", M, "--optim", "adalomo"],
     {"optimizer_in_backward": True, "optimizer": "adafactor"}),
    (["python", "train.py", "--model_name_or_path", M, "--optim", "adamw_torch_fused"],
     {"optimizer": "adamw", "fused_optimizer": True}),
    (["tune", "run", "full_finetune_single_device", "--config", "./my_full.yaml", "optimizer.fused=True",
      "model._component_=torchtune.models.llama3_2.llama3_2_1b"], {"fused_optimizer": True}),
    (["accelerate", "launch", "train.py", "--model_name_or_path", M, "--activation_checkpointing",
      "--activation_checkpointing_kwargs", '{"every_n_layers": 2, "offload": true, "use_reentrant": false}'],
     {"gradient_checkpointing": "full", "checkpoint_every_n_layers": 2, "activation_offloading": True}),
    (["bash", "-c", f"cat > /tmp/a.yml <<EOF\nbase_model: {M}\ngradient_checkpointing: true\n"
                    "gradient_checkpointing_kwargs:\n  use_reentrant: false\n  every_n_layers: 4\nEOF\n"
                    "axolotl train /tmp/a.yml"],
     {"checkpoint_every_n_layers": 4}),
], ids=["hf-trainer", "llamafactory", "axolotl", "adalomo", "adamw-fused", "torchtune-fused", "hf-every-n-offload",
        "axolotl-every-n"])
def test_trainer_settings_set_the_switches(argv: list[str], expected: dict[str, Any]) -> None:
    job = one_job(pod(argv))
    for name, value in expected.items():
        assert getattr(job.spec, name) == value, name
        assert name in job.provenance


def test_lora_names_that_match_nothing_are_noted_and_torchtune_output_proj_is_o_proj() -> None:
    noted = vram(method="lora", lora={"target_modules": ["q_proj", "v_proj", "wrong_proj"]})
    assert any("wrong_proj match no linear layer" in n for n in noted.notes)
    with_o = vram(method="lora", lora={"target_modules": ["q_proj", "output_proj"]})
    assert with_o.breakdown_bytes["lora_adapters"] == vram(method="lora", lora={"target_modules": [
        "q_proj", "o_proj"]}).breakdown_bytes["lora_adapters"]
    assert not any("match no linear layer" in n for n in with_o.notes)


# ---- torchtune's shipped configs (scheduler/data/torchtune_configs.yaml) ----------------------------------------


def test_every_shipped_torchtune_config_reads_to_a_valid_job() -> None:
    from scheduler.spec.trainer_args import _torchtune_configs

    configs = _torchtune_configs()
    assert len(configs) >= 18
    for name, settings in configs.items():
        single = name.endswith(("_single_device", "_low_memory"))
        recipe = ("lora_finetune" if "lora" in name else "full_finetune") + ("_single_device" if single
                                                                              else "_distributed")
        job = one_job(pod(["tune", "run", recipe, "--config", name], gpus=1 if single else 8))
        assert job.spec.micro_batch_size == settings["batch_size"], name
        assert job.spec.grad_accum_steps == settings["gradient_accumulation_steps"], name
        assert (job.spec.gradient_checkpointing == "full") == settings["enable_activation_checkpointing"], name
        assert job.provenance["micro_batch_size"].endswith(f"(shipped, pytorch/torchtune@{settings['commit'][:9]})")
        resolve_model(job.spec)  # the model component names a catalog model


def test_torchtune_single_device_full_fine_tuning_reads_its_memory_savers() -> None:
    job = one_job(pod(["tune", "run", "full_finetune_single_device", "--config", "llama3_1/8B_full_single_device"],
                      gpus=1))
    spec = job.spec
    assert (spec.model_name, spec.method, spec.precision) == ("llama-3.1-8b", "full", "bf16-true")
    assert spec.optimizer == "paged-adamw-8bit" and spec.optimizer_in_backward is True
    assert spec.cross_entropy == "chunked" and spec.gradient_checkpointing == "full"
    arch = resolve_model(spec).architecture
    with_config = predict_vram(spec, arch, lookup_gpu("RTX-4090"))
    without = predict_vram(TrainingSpec.model_validate({**spec_to_dict(spec), "optimizer_in_backward": None,
                                                        "cross_entropy": None, "optimizer": "adamw"}),
                           arch, lookup_gpu("RTX-4090"))
    # torchtune's README: 18.9 GiB on an RTX 4090 at batch 2 x 2048 packed (with compile, which the config leaves off)
    assert 18 * 2**30 < with_config.peak_reserved_bytes < 23 * 2**30
    assert without.peak_reserved_bytes > 2.5 * with_config.peak_reserved_bytes


def test_torchtune_lora_targets_compose_attention_mlp_and_output() -> None:
    job = one_job(pod(["tune", "run", "lora_finetune_single_device", "--config", "llama3_2/3B_lora_single_device",
                       "model.apply_lora_to_output=True", "model.lora_rank=16"]))
    lora = job.spec.resolved_lora
    assert lora is not None and lora.rank == 16 and lora.alpha == 128
    assert lora.target_modules == ["q_proj", "v_proj", "output_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    assert "model.apply_lora_to_output=True" in job.provenance["lora.target_modules"]


def test_an_unknown_torchtune_config_keeps_the_defaults_and_says_so() -> None:
    job = one_job(pod(["tune", "run", "full_finetune_single_device", "--config", "./mine.yaml",
                       "model._component_=torchtune.models.llama3_2.llama3_2_1b"]))
    assert job.spec.micro_batch_size == 1 and job.spec.optimizer_in_backward is None
    assert any("is not read" in note for note in job.assumptions)


def test_checkpointing_kwargs_without_checkpointing_are_ignored_with_a_note() -> None:
    """transformers reads activation_checkpointing_kwargs only when checkpointing is on: a job that passes them
    without it is not an error, and the kwargs that do not parse as a JSON object are ignored like unknown flags."""
    job = one_job(pod(["python", "train.py", "--model_name_or_path", M, "--gradient_checkpointing_kwargs",
                       '{"every_n_layers": 2}']))
    assert job.spec.checkpoint_every_n_layers is None and job.spec.gradient_checkpointing == "none"
    assert any("checkpoint_every_n_layers from flag --gradient_checkpointing_kwargs every_n_layers ignored" in a
               for a in job.assumptions), job.assumptions
    plain = one_job(pod(["python", "train.py", "--model_name_or_path", M, "--gradient_checkpointing",
                         "--gradient_checkpointing_kwargs", "{not json"]))
    assert plain.spec.gradient_checkpointing == "full" and plain.spec.checkpoint_every_n_layers is None
    bad = scan(pod(["python", "train.py", "--model_name_or_path", M, "--gradient_checkpointing",
                    "--activation_checkpointing_kwargs", '{"every_n_layers": 0}']))
    assert not any(isinstance(o, ParsedJob) for o in bad)
    assert "checkpoint_every_n_layers" in str(bad[0])


def test_hf_trainer_without_optim_gets_transformers_default_fused_adamw() -> None:
    """TrainingArguments' default optim is adamw_torch_fused with torch >= 2.8: a Hugging Face job that names no
    optimizer is predicted with the fused AdamW (no step temporary), said in a note; one that names adamw_torch (the
    foreach implementation) or another optimizer is not, nor is a job vramfit does not know as transformers."""
    default = one_job(pod(["accelerate", "launch", "train.py", "--model_name_or_path", M, "--bf16",
                           "--per_device_train_batch_size", "2"]))
    assert default.spec.framework == "transformers" and default.spec.fused_optimizer is True
    assert "adamw_torch_fused" in default.provenance["fused_optimizer"]
    assert any("--optim adamw_torch" in a for a in default.assumptions), default.assumptions
    foreach = one_job(pod(["accelerate", "launch", "train.py", "--model_name_or_path", M, "--bf16",
                           "--per_device_train_batch_size", "2", "--optim", "adamw_torch"]))
    assert foreach.spec.fused_optimizer is None and foreach.spec.optimizer == "adamw"
    eight_bit = one_job(pod(["python", "train.py", "--model_name_or_path", M, "--per_device_train_batch_size", "2",
                             "--optim", "paged_adamw_8bit"]))
    assert eight_bit.spec.fused_optimizer is None
    tune = one_job(pod(["tune", "run", "full_finetune_single_device", "--config", "llama3_2/1B_full_single_device"]))
    assert tune.spec.framework == "torchtune" and tune.spec.fused_optimizer is None  # its config's optimizer rules


def test_activation_offloading_transfers_are_priced_and_hidden_under_compute_when_small() -> None:
    """The offloaded activations cross PCIe twice per micro-batch (down in the forward, back in backward). With
    checkpointing (block inputs only: torchtune's Llama-3.2-3B ablation, S02, lost 0.1 % of its tokens/s) the copies
    hide under compute; without it every saved activation crosses, more than compute can hide."""
    from predictors.vram import offloaded_activation_bytes

    resolved = resolve_model(parse_training_spec({"model": "llama-3.2-3b"}))
    gpu = lookup_gpu("A100-80GB")

    def run(**fields: Any) -> Any:
        spec = parse_training_spec({"model": "llama-3.2-3b", "method": "full", "precision": "bf16-true",
                                    "micro_batch_size": 2, "seq_len": 4096, "train_tokens": 1e8, **fields})
        return spec, predict_runtime(spec, resolved.architecture, gpu)

    spec, checkpointed = run(gradient_checkpointing="full", activation_offloading=True)
    moved = offloaded_activation_bytes(spec, resolved.architecture, 1)
    # 28 checkpointed block inputs (bf16, hidden 3072) per token, 2 of them left on the GPU; 2 x 4096 tokens
    assert moved == (28 - 2) * 2 * 3072 * 8192
    assert checkpointed.components_seconds["activation_offload_transfer"] == pytest.approx(
        2 * moved / (gpu.pcie_bytes_per_second * 0.8), rel=0.25)
    _, plain = run(gradient_checkpointing="full")
    assert checkpointed.step_time_seconds == pytest.approx(plain.step_time_seconds, rel=1e-9)  # hidden
    _, everything = run(activation_offloading=True)
    _, eager = run()
    assert everything.components_seconds["communication_exposed"] > 0
    assert everything.step_time_seconds > eager.step_time_seconds
    assert offloaded_activation_bytes(spec.model_copy(update={"activation_offloading": None}),
                                      resolved.architecture, 1) == 0.0


def test_auto_find_batch_size_is_noted() -> None:
    job = one_job(pod(["python", "train.py", "--model_name_or_path", M, "--per_device_train_batch_size", "16",
                       "--auto_find_batch_size"]))
    assert job.spec.micro_batch_size == 16
    assert any("auto_find_batch_size (flag --auto_find_batch_size)" in a for a in job.assumptions), job.assumptions


def test_reference_model_holds_a_frozen_copy_and_runs_a_forward() -> None:
    """DPO/KTO without an adapter: a frozen reference copy of the weights (in the trained model's weight dtype, sharded
    as ZeRO-3/FSDP shard the model) and one more forward per micro-batch; with an adapter no copy."""
    plain = vram(precision="bf16-true")
    ref = vram(precision="bf16-true", reference_model=True)
    params = plain.params_total
    assert ref.breakdown_bytes["reference_weights"] == 2 * params
    assert ref.peak_allocated_bytes - plain.peak_allocated_bytes == 2 * params
    mixed = vram(precision="bf16-mixed", reference_model=True)
    assert mixed.breakdown_bytes["reference_weights"] == 4 * params  # the fp32 model AMP trains, copied
    sharded = vram(precision="bf16-true", reference_model=True, gpus=4, sharding="zero3")
    assert sharded.breakdown_bytes["reference_weights"] == round(2 * params / 4)
    lora = vram(method="lora", reference_model=True)
    assert "reference_weights" not in lora.breakdown_bytes
    assert any("adapter disabled" in n for n in lora.notes)
    from predictors.runtime import flops_per_token

    spec = TrainingSpec.model_validate({"model": "llama-3.2-1b", "precision": "bf16-true", "micro_batch_size": 4,
                                        "seq_len": 2048})
    arch = resolve_model(spec).architecture
    gpu = lookup_gpu("A100-80GB")
    base = predict_runtime(spec, arch, gpu)
    with_ref = predict_runtime(spec.model_copy(update={"reference_model": True}), arch, gpu)
    flops_per_second = gpu.dense_flops("bf16-true") * with_ref.matmul_efficiency
    expected = 4 * 2048 * flops_per_token(spec, arch).forward / flops_per_second
    assert math.isclose(with_ref.components_seconds["reference_forward"], expected, rel_tol=1e-12)
    assert base.components_seconds["reference_forward"] == 0.0
    assert math.isclose(with_ref.step_time_seconds - base.step_time_seconds, expected, rel_tol=1e-9)


def test_reference_model_copy_holds_the_base_again_with_an_adapter() -> None:
    """reference_model: copy, a trainer that loads a reference model of its own even with a LoRA adapter (TRL's kto
    script, OpenRLHF's reference Actor): the base once more in the compute dtype, and its forward. true with an
    adapter stays the base with the adapter disabled (no copy)."""
    base_params = vram(precision="bf16-true").params_total
    lora = vram(method="lora", precision="bf16-true", reference_model=True)
    copy = vram(method="lora", precision="bf16-true", reference_model="copy")
    assert "reference_weights" not in lora.breakdown_bytes
    assert copy.breakdown_bytes["reference_weights"] == 2 * base_params
    assert copy.peak_allocated_bytes - lora.peak_allocated_bytes == 2 * base_params
    qlora = vram(method="qlora", precision="bf16-true", reference_model="copy")
    assert qlora.breakdown_bytes["reference_weights"] == 2 * base_params  # 16-bit, not the 4-bit base's bytes
    spec = TrainingSpec.model_validate({"model": "llama-3.2-1b", "method": "lora", "micro_batch_size": 4,
                                        "seq_len": 2048})
    arch = resolve_model(spec).architecture
    gpu = lookup_gpu("A100-80GB")
    assert predict_runtime(spec.model_copy(update={"reference_model": "copy"}), arch, gpu).components_seconds[
        "reference_forward"] > 0
