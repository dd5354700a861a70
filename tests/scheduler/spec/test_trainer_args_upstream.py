"""Trainer settings an upstream-validation round found unread, read as the trainers run them.

LLaMA-Factory (src/llamafactory/model/adapter.py _setup_freeze_tuning, hparams/finetuning_args.py): LLaMA Pro's
spread-out trained blocks, freeze_extra_modules that pull backward down to the embedding, the pre-rename keys
num_layer_trainable / name_module_trainable, the substring match that trains experts of MoE models, and v1 configs
(src/llamafactory/v1). DeepSpeed: ZeRO++ quantized weights (runtime/zero/config.py) and the old "bfloat16" section
(runtime/precision_config.py get_bfloat16_config)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.scheduler.spec.helpers import one_job, pod

M = "meta-llama/Llama-2-7b-hf"
BASE = {"model_name_or_path": M, "stage": "sft", "do_train": True, "finetuning_type": "freeze",
        "template": "llama2", "cutoff_len": 1024, "per_device_train_batch_size": 1, "bf16": True}


def lf_job(config: dict[str, Any], env: dict[str, str] | None = None, gpus: int = 1,
           files: dict[str, str] | None = None, command: str = "train") -> Any:
    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
           "data": {"lf.yaml": yaml.safe_dump(config), **(files or {})}}
    return one_job(cfg, pod(["llamafactory-cli", command, "/cfg/lf.yaml"], env=env, gpus=gpus))


def notes_of(job: Any) -> str:
    return " ".join(job.assumptions)


# --- LLaMA-Factory v0 ------------------------------------------------------------------------------


def test_llama_factory_llama_pro_freeze_reads_the_first_n_blocks() -> None:
    """use_llama_pro trains blocks stride-1, 2*stride-1, ..., L-1 (stride = L // n): read as the first n blocks (the
    same trained count, backward counted through every block: an over-estimate of the activations below block
    stride-1), where before it was the last n (backward stopped far too early: an under-estimate)."""
    job = lf_job({**BASE, "use_llama_pro": True, "freeze_trainable_layers": 8})
    assert (job.spec.method, job.spec.trainable_layers) == ("full", -8)
    assert "use_llama_pro" in job.provenance["trainable_layers"]
    notes = notes_of(job)
    assert "sets use_llama_pro" in notes and "over-estimate of the activations" in notes
    # the old key names the count too
    old = lf_job({**BASE, "use_llama_pro": True, "num_layer_trainable": 4})
    assert old.spec.trainable_layers == -4


def test_llama_factory_llama_pro_lora_is_noted() -> None:
    """LoRA with use_llama_pro puts the adapters on the expanded blocks only (model_utils/misc.py
    find_expanded_modules): read as adapters on every block, noted as an over-estimate."""
    config = {**BASE, "finetuning_type": "lora", "use_llama_pro": True, "freeze_trainable_layers": 8}
    job = lf_job(config)
    assert job.spec.method == "lora"
    assert any("use_llama_pro" in n and "8 expanded blocks" in n and "over-estimate" in n for n in job.assumptions)


def test_llama_factory_freeze_extra_embedding_runs_backward_to_the_bottom() -> None:
    """freeze_extra_modules embed_tokens trains the input embedding: backward runs through every block down to it.
    The last 2 blocks become the first 2 (same count, backward through all blocks); the embedding's own gradients
    and states stay an under-estimate, said so; lm_head's too."""
    job = lf_job({**BASE, "freeze_trainable_layers": 2, "freeze_extra_modules": "embed_tokens,lm_head"})
    assert job.spec.trainable_layers == -2
    assert "freeze_extra_modules embed_tokens" in job.provenance["trainable_layers"]
    notes = notes_of(job)
    assert "the input embedding trains too, so backward runs through every block" in notes
    assert "embedding's own gradients and optimizer states" in notes and "an under-estimate" in notes
    assert "freeze_extra_modules lm_head: the output head trains too" in notes
    # "norm" matches every block's input_layernorm / post_attention_layernorm as a substring: backward to the bottom
    norm = lf_job({**BASE, "freeze_trainable_layers": 3, "freeze_extra_modules": ["norm"]})
    assert norm.spec.trainable_layers == -3
    assert any("freeze_extra_modules norm" in n and "every block's norms" in n for n in norm.assumptions)
    # the head alone changes no backward path
    head = lf_job({**BASE, "freeze_trainable_layers": 2, "freeze_extra_modules": "lm_head"})
    assert head.spec.trainable_layers == 2


def test_llama_factory_old_freeze_keys() -> None:
    """Releases before the rename (src/llmtuner/hparams/finetuning_args.py): num_layer_trainable (default 3) and
    name_module_trainable, read as freeze_trainable_layers / freeze_trainable_modules when those are absent."""
    job = lf_job({**BASE, "num_layer_trainable": 4, "name_module_trainable": "mlp"})
    assert job.spec.trainable_layers == 4
    assert "num_layer_trainable" in job.provenance["trainable_layers"]
    assert any("name_module_trainable mlp" in n and "over-estimate" in n for n in job.assumptions)
    default = lf_job({**BASE, "name_module_trainable": "self_attn"})
    assert default.spec.trainable_layers == 3
    assert "num_layer_trainable default 3" in default.provenance["trainable_layers"]
    new_wins = lf_job({**BASE, "freeze_trainable_layers": -2, "num_layer_trainable": 4})
    assert new_wins.spec.trainable_layers == -2


def test_llama_factory_freeze_on_moe_models_is_noted() -> None:
    """The '.{i}.' substring match of trained block ids also matches expert i of every MoE block (transformers 4.x
    ModuleList experts): more parameters train than counted, an under-estimate, noted when an id is an expert index."""
    qwen_moe = lf_job({**BASE, "model_name_or_path": "Qwen/Qwen3-30B-A3B", "template": "qwen3"})
    notes = notes_of(qwen_moe)
    assert qwen_moe.spec.trainable_layers == 2
    assert "also matches expert 46, 47 of each of its 48 MoE blocks" in notes
    assert "backward, which vramfit stops at the lowest trained block, runs down to the first MoE block" in notes
    assert "an under-estimate" in notes
    # Mixtral's 8 experts: the last 2 of 32 blocks (30, 31) match no expert index; the first 2 do
    last = lf_job({**BASE, "model_name_or_path": "mistralai/Mixtral-8x7B-v0.1", "template": "mistral"})
    assert not any("MoE" in n for n in last.assumptions)
    first = lf_job({**BASE, "model_name_or_path": "mistralai/Mixtral-8x7B-v0.1", "template": "mistral",
                    "freeze_trainable_layers": -2})
    assert any("expert 0, 1 of each of its 32 MoE blocks" in n and "already runs through every block" in n
               for n in first.assumptions)
    # a dense model: nothing to say
    assert not any("MoE" in n for n in lf_job(BASE).assumptions)


# --- LLaMA-Factory v1 ------------------------------------------------------------------------------

V1_LORA = {"model": "Qwen/Qwen3-4B", "model_class": "llm",
           "peft_config": {"name": "lora", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all"},
           "kernel_config": {"name": "auto"}, "dist_config": {"name": "fsdp2", "dcp_path": None},
           "train_dataset": "data/v1_sft_demo.yaml", "output_dir": "./outputs/test_lora", "micro_batch_size": 1,
           "cutoff_len": 2048, "learning_rate": 1.0e-4, "max_steps": 10, "sample_backend": "hf",
           "max_new_tokens": 128}
V1_ENV = {"USE_V1": "1"}


def test_llama_factory_v1_lora_fsdp2() -> None:
    """examples/v1/train_lora/train_lora_sft.yaml: model, peft_config lora r 16, dist_config fsdp2. Before, `model`
    was not read (no model found)."""
    job = lf_job(V1_LORA, env=V1_ENV, gpus=4, command="sft")
    s = job.spec
    assert (s.model, s.method, s.lora.rank, s.lora.alpha, s.sharding) == ("Qwen/Qwen3-4B", "lora", 16, 32, "fsdp")
    assert (s.precision, s.seq_len, s.micro_batch_size, s.steps) == ("bf16-true", 2048, 1, 10)
    assert (s.gradient_checkpointing, s.fused_optimizer, s.framework) == ("full", False, "transformers")
    note = next(n for n in job.assumptions if "v1 keys found" in n)
    assert "not read: kernel_config" in note


def test_llama_factory_v1_full_and_freeze() -> None:
    """No peft_config is full tuning in fp32 weights: bf16-mixed under FSDP2 (MixedPrecisionPolicy), 32-true without
    (v1 runs no autocast); peft_config freeze reads as v0's freeze tuning; defaults cutoff_len 2048, micro-batch 1,
    global_batch_size as gradient accumulation; unread keys are listed."""
    full = {"model": "Qwen/Qwen3-4B", "dist_config": {"name": "fsdp2", "reshard_after_forward": False},
            "global_batch_size": 16, "optim_config": {"name": "muon"}, "batching_strategy": "padding_free"}
    job = lf_job(full, env=V1_ENV, gpus=4, command="sft")
    s = job.spec
    assert (s.method, s.precision, s.sharding, s.seq_len, s.micro_batch_size) == (
        "full", "bf16-mixed", "fsdp-grad-op", 2048, 1)
    assert s.grad_accum_steps == 4  # 16 / (1 x 4 ranks)
    note = next(n for n in job.assumptions if "v1 keys found" in n)
    assert "optim_config (name muon)" in note and "batching_strategy padding_free" in note
    single = lf_job({"model": "Qwen/Qwen3-4B", "cutoff_len": 1024, "train_dataset": "d.yaml"}, env=V1_ENV)
    assert (single.spec.method, single.spec.precision, single.spec.seq_len) == ("full", "32-true", 1024)
    freeze = lf_job({"model": "Qwen/Qwen3-4B", "peft_config": {"name": "freeze", "freeze_trainable_layers": 2,
                                                               "freeze_extra_modules": "embed_tokens"},
                     "dist_config": {"name": "fsdp2"}, "micro_batch_size": 2}, env=V1_ENV, gpus=2, command="sft")
    assert (freeze.spec.method, freeze.spec.trainable_layers, freeze.spec.micro_batch_size) == ("full", -2, 2)
    assert any("freeze_extra_modules embed_tokens" in n for n in freeze.assumptions)


def test_llama_factory_v1_qlora_and_deepspeed() -> None:
    """quant_config bnb quantization_bit 4 with a LoRA peft_config is QLoRA; dist_config deepspeed reads its
    config_file from the manifest like --deepspeed."""
    qlora = lf_job({**V1_LORA, "quant_config": {"name": "bnb", "quantization_bit": 4}}, env=V1_ENV, command="sft")
    assert qlora.spec.method == "qlora"
    ds = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": "auto"}
    config = {"model": "Qwen/Qwen3-0.6B", "model_class": "llm", "kernel_config": {"name": "auto"},
              "dist_config": {"name": "deepspeed", "config_file": "examples/deepspeed/ds_z3_config.json"},
              "train_dataset": "data/v1_sft_demo.yaml", "micro_batch_size": 1, "cutoff_len": 2048}
    job = lf_job(config, env=V1_ENV, gpus=8, files={"ds_z3_config.json": json.dumps(ds)}, command="sft")
    assert (job.spec.method, job.spec.sharding, job.spec.precision) == ("full", "zero3", "bf16-mixed")


# --- DeepSpeed -------------------------------------------------------------------------------------


def ds_job(ds: dict[str, Any], *flags: str) -> Any:
    return one_job(pod(["deepspeed", "train.py", "--model_name_or_path", M, *flags, "--deepspeed", json.dumps(ds)],
                       gpus=8))


def test_deepspeed_zero_quantized_weights_are_noted() -> None:
    """ZeRO++ zero_quantized_nontrainable_weights keeps frozen parameters in int8 (counted at 16 bits: an
    over-estimate); zero_quantized_weights quantizes only the all-gather. Read at ZeRO-3 only, as DeepSpeed does."""
    zero = {"stage": 3, "zero_quantized_nontrainable_weights": True, "zero_quantized_weights": True}
    job = ds_job({"zero_optimization": zero, "bf16": {"enabled": True}}, "--bf16", "--use_peft")
    notes = notes_of(job)
    assert "zero_quantized_nontrainable_weights (ZeRO++)" in notes and "full 16-bit width (an over-estimate" in notes
    assert "zero_quantized_weights (ZeRO++ qwZ)" in notes
    stage2 = ds_job({"zero_optimization": {**zero, "stage": 2}}, "--bf16")
    assert not any("zero_quantized" in n for n in stage2.assumptions)


def test_deepspeed_old_bfloat16_section() -> None:
    """"bfloat16": {"enabled": true}, DeepSpeed's old name of "bf16", is read as "bf16" is, and only when "bf16" is
    absent (get_bfloat16_config)."""
    job = ds_job({"zero_optimization": {"stage": 2}, "bfloat16": {"enabled": True}})
    assert job.spec.precision == "bf16-mixed"
    assert "key bfloat16" in job.provenance["precision"]
    auto = ds_job({"zero_optimization": {"stage": 2}, "bfloat16": {"enabled": "auto"}})
    assert auto.spec.precision == "32-true"  # "auto" with no --bf16: fp32, as for "bf16"
    shadowed = ds_job({"zero_optimization": {"stage": 2}, "bf16": {"enabled": False}, "bfloat16": {"enabled": True}})
    assert "bfloat16" not in shadowed.provenance.get("precision", "")


def test_llama_factory_freeze_checkpoints_only_the_trained_blocks() -> None:
    """LLaMA-Factory's checkpointing function runs a block without trainable parameters unchecked
    (model/model_utils/checkpointing.py get_custom_gradient_checkpointing_func), which it turns on by default:
    freeze tuning and BAdam say checkpoint_trained_blocks_only; with disable_gradient_checkpointing, LoRA or full
    fine-tuning nothing is said."""
    job = lf_job({**BASE, "freeze_trainable_layers": -4})
    assert job.spec.gradient_checkpointing == "full" and job.spec.checkpoint_trained_blocks_only is True
    assert "checkpoints only the blocks with trainable parameters" in job.provenance["checkpoint_trained_blocks_only"]
    badam = lf_job({**BASE, "finetuning_type": "full", "use_badam": True})
    assert badam.spec.trainable_layers == -1 and badam.spec.checkpoint_trained_blocks_only is True
    off = lf_job({**BASE, "freeze_trainable_layers": -4, "disable_gradient_checkpointing": True})
    assert off.spec.gradient_checkpointing == "none" and off.spec.checkpoint_trained_blocks_only is None
    for other in ({**BASE, "finetuning_type": "lora"}, {**BASE, "finetuning_type": "full"}):
        assert lf_job(other).spec.checkpoint_trained_blocks_only is None
