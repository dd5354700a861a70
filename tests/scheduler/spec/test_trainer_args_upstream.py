"""Trainer settings an upstream-validation round found unread, read as the trainers run them.

LLaMA-Factory (src/llamafactory/model/adapter.py _setup_freeze_tuning, hparams/finetuning_args.py): LLaMA Pro's
spread-out trained blocks, freeze_extra_modules that pull backward down to the embedding, the pre-rename keys
num_layer_trainable / name_module_trainable, the substring match that trains experts of MoE models, and v1 configs
(src/llamafactory/v1: read only under LLaMA-Factory's launcher or USE_V1; DeepSpeed "auto" precision, reward models,
optim_config, bnb defaults, DPO's reference, sequence parallelism's flash attention, FSDPTurbo). DeepSpeed: ZeRO++
quantized weights (runtime/zero/config.py) and the old "bfloat16" section (runtime/precision_config.py
get_bfloat16_config)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from predictors.errors import SpecError
from scheduler.spec.document import NoTrainingJob, ParsedJob
from scheduler.spec.trainer_args import llamafactory_v1_launch, split_script
from scheduler.spec.yamltext import TextBudget
from tests.scheduler.spec.helpers import one_job, pod, scan

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
    assert "batching_strategy padding_free" in note
    assert s.optimizer == "adamw" and s.fused_optimizer is False  # Muon read as AdamW (noted), foreach
    assert any("optim_config.name muon" in n and "over-estimate" in n for n in job.assumptions)
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


# upstream examples/deepspeed/ds_z3_config.json: bf16 and fp16 "auto", filled by the trainer
DS_Z3_AUTO = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
              "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                       "hysteresis": 2, "min_loss_scale": 1},
              "bf16": {"enabled": "auto"},
              "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True,
                                    "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                    "stage3_gather_16bit_weights_on_model_save": True}}
V1_DS = {"model": "Qwen/Qwen3-0.6B", "model_class": "llm", "kernel_config": {"name": "auto"},
         "dist_config": {"name": "deepspeed", "config_file": "examples/deepspeed/ds_z3_config.json"},
         "train_dataset": "data/v1_sft_demo.yaml", "micro_batch_size": 1, "cutoff_len": 2048}


def v1_unread(job: Any) -> str:
    """What the v1 note lists as not read ("" when nothing)."""
    note = next(n for n in job.assumptions if "v1 keys found" in n)
    return note.split("not read:", 1)[1] if "not read:" in note else ""


def v1_ds_job(ds: dict[str, Any], config: dict[str, Any] | None = None) -> Any:
    return lf_job(config or V1_DS, env=V1_ENV, gpus=8, files={"ds_z3_config.json": json.dumps(ds)}, command="sft")


def test_llama_factory_v1_deepspeed_auto_precision_is_bf16() -> None:
    """v1 fills DeepSpeed's "auto" precision itself (plugins/model_plugins/deepspeed_utils.py
    infer_deepspeed_mixed_precision): bf16 and fp16 both "auto" or absent is bf16, bf16 false or fp16 false (bf16
    auto) fp32, fp16 true refused. Before, "auto" read as the HF Trainer's (no --bf16: 32-true, a large
    over-estimate); the example's train_full_deepspeed.yaml with ds_z3_config.json."""
    job = v1_ds_job(DS_Z3_AUTO)
    assert (job.spec.method, job.spec.sharding, job.spec.precision) == ("full", "zero3", "bf16-mixed")
    assert "infer_deepspeed_mixed_precision" in job.provenance["precision"]
    lora = v1_ds_job(DS_Z3_AUTO, {**V1_DS, "peft_config": {"name": "lora", "r": 16}})
    assert (lora.spec.method, lora.spec.precision) == ("lora", "bf16-mixed")
    bare = {k: v for k, v in DS_Z3_AUTO.items() if k not in ("bf16", "fp16")}
    assert v1_ds_job(bare).spec.precision == "bf16-mixed"  # absent counts as "auto"
    assert v1_ds_job({**bare, "bf16": {}}).spec.precision == "bf16-mixed"  # no "enabled": "auto"
    assert v1_ds_job({**DS_Z3_AUTO, "bf16": {"enabled": False}}).spec.precision == "32-true"
    assert v1_ds_job({**bare, "fp16": {"enabled": False}}).spec.precision == "32-true"
    assert v1_ds_job({**bare, "bfloat16": {"enabled": False}}).spec.precision == "bf16-mixed"  # v1 writes bf16
    fp16 = v1_ds_job({**DS_Z3_AUTO, "fp16": {"enabled": True}})
    assert fp16.spec.precision == "16-mixed"
    assert any("enables fp16" in n and "does not start" in n for n in fp16.assumptions)
    # the HF Trainer's reading of "auto" is unchanged elsewhere
    assert ds_job(DS_Z3_AUTO).spec.precision == "32-true"


def swift_job(argv: list[str], env: dict[str, str] | None = None) -> list[Any]:
    """ms-swift's Megatron YAML (examples/megatron: ``megatron sft --config``): model, micro_batch_size, no v1 key
    but it reads like one (model + micro/global batch)."""
    config = {"model": "Qwen/Qwen2.5-7B-Instruct", "train_type": "lora", "micro_batch_size": 2,
              "global_batch_size": 16, "max_length": 8192, "lora_rank": 8, "lora_alpha": 32, "bf16": True,
              "dataset": "AI-ModelScope/alpaca-gpt4-data-en"}
    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
           "data": {"cfg.yaml": yaml.safe_dump(config)}}
    return scan(cfg, pod(argv, env=env, gpus=8))


def test_llama_factory_v1_needs_llama_factory_to_run_it() -> None:
    """A v1-looking config is read as v1's only under LLaMA-Factory's launcher or USE_V1: ms-swift's `megatron sft
    --config` YAML (model, micro_batch_size, global_batch_size) was read as a v1 config (full, 32-true, seq 2048)
    where before the v1 reader it was, honestly, no model found; it is that again."""
    outcomes = swift_job(["megatron", "sft", "--config", "/cfg/cfg.yaml"])
    assert not any(isinstance(o, ParsedJob) for o in outcomes)
    errors = [o for o in outcomes if isinstance(o, SpecError) and not isinstance(o, NoTrainingJob)]
    assert len(errors) == 1 and "no model found" in str(errors[0])
    assert llamafactory_v1_launch(["megatron", "sft", "--config", "c.yaml"], {}) is None
    # LLaMA-Factory's launchers, with the v1 trainer they run
    for tokens, env, how, command in (
        (["llamafactory-cli", "sft", "c.yaml"], V1_ENV, "USE_V1=1 llamafactory-cli sft", "sft"),
        (["lmf", "dpo", "c.yaml"], V1_ENV, "USE_V1=1 lmf dpo", "dpo"),
        (["env", "USE_V1=1", "llamafactory-cli", "train", "c.yaml"], {}, "USE_V1=1 llamafactory-cli train", "sft"),
        (["python", "-m", "llamafactory.cli", "rm", "c.yaml"], V1_ENV, "USE_V1=1 python -m llamafactory.cli rm", "rm"),
        (["torchrun", "--nproc_per_node", "8", "src/llamafactory/v1/launcher.py", "dpo", "c.yaml"], {},
         "src/llamafactory/v1/launcher.py dpo", "dpo"),
        (["torchrun", "src/llamafactory/v1/launcher.py", "c.yaml"], {}, "src/llamafactory/v1/launcher.py", "sft"),
        (["python", "-m", "llamafactory.v1.trainers.rm_trainer", "c.yaml"], {},
         "python -m llamafactory.v1.trainers.rm_trainer", "rm"),
        (["bash", "train.sh"], V1_ENV, "USE_V1=1", "sft"),
    ):
        launch = llamafactory_v1_launch(tokens, env)
        assert launch is not None and (launch.how, launch.command) == (how, command), tokens
    cli = llamafactory_v1_launch(["llamafactory-cli", "sft", "c.yaml"], {})
    assert cli is not None and cli.v0_cli  # the v0 launcher without USE_V1: read as v1, noted
    job = lf_job(V1_LORA, command="sft")
    assert job.spec.method == "lora" and any("without USE_V1=1" in n for n in job.assumptions)
    assert lf_job(V1_LORA, env=V1_ENV, command="sft").spec.method == "lora"
    # USE_V1 alone (a wrapper script) is enough
    wrapped = swift_job(["megatron", "sft", "--config", "/cfg/cfg.yaml"], env=V1_ENV)
    assert any(isinstance(o, ParsedJob) for o in wrapped)


def test_llama_factory_v1_reward_model_is_token_classification() -> None:
    """model_class cls (examples/v1 train_full_rm.yaml, train_lora_rm.yaml) and `llamafactory-cli rm` train a reward
    model, a per-token score head: task token-classification (no vocab-sized logits), with the head v1 keeps noted;
    before, it was causal-lm with model_class listed as not read (the logits over-counted)."""
    rm = {"model": "Qwen/Qwen3-0.6B", "model_class": "cls", "kernel_config": {"name": "auto"},
          "dist_config": {"name": "fsdp2"}, "train_dataset": "data/v1_dpo_demo.yaml", "micro_batch_size": 1,
          "cutoff_len": 2048}
    job = lf_job(rm, env=V1_ENV, gpus=4, command="rm")
    assert (job.spec.task, job.spec.method, job.spec.precision) == ("token-classification", "full", "bf16-mixed")
    assert "model_class" in job.provenance["task"]
    assert "model_class" not in v1_unread(job)
    assert any("reward model" in n and "under-estimate" in n for n in job.assumptions)
    lora = lf_job({**rm, "peft_config": {"name": "lora", "r": 16}}, env=V1_ENV, gpus=4, command="rm")
    assert (lora.spec.task, lora.spec.method) == ("token-classification", "lora")
    # `rm` loads model_class cls whatever the config says (v1/trainers/rm_trainer.py run_rm)
    by_command = lf_job({**rm, "model_class": "llm"}, env=V1_ENV, gpus=4, command="rm")
    assert by_command.spec.task == "token-classification"
    assert lf_job({**rm, "model_class": "llm"}, env=V1_ENV, gpus=4, command="sft").spec.task == "causal-lm"


def test_llama_factory_v1_optimizer_is_not_transformers_fused_default() -> None:
    """v1 builds torch.optim.AdamW itself: foreach unless optim_config sets fused: true (plugins/trainer_plugins/
    optimizer.py build_adamw); Muon is read as AdamW (noted), foreach. Before, any optim_config left the optimizer
    unset and merge applied transformers' default adamw_torch_fused."""
    base = {"model": "Qwen/Qwen3-0.6B", "dist_config": {"name": "fsdp2"}, "train_dataset": "d.yaml"}
    for optim, fused in (({"name": "adamw"}, False), ({"name": "adamw", "fused": True}, True),
                         ({"name": "adamw", "foreach": True, "weight_decay": 0.1}, False), ({"name": "muon"}, False),
                         (None, False)):
        config = {**base, "optim_config": optim} if optim is not None else base
        job = lf_job(config, env=V1_ENV, gpus=4, command="sft")
        assert (job.spec.optimizer, job.spec.fused_optimizer) == ("adamw", fused), optim
        assert "adamw_torch_fused" not in job.provenance["fused_optimizer"]
        assert not any("adamw_torch_fused" in n for n in job.assumptions)
        assert "optim_config" not in v1_unread(job), optim


def test_llama_factory_v1_bnb_without_bits_is_4bit() -> None:
    """quant_config bnb without quantization_bit loads 4-bit (plugins/model_plugins/quantization.py: "default to
    4-bit"), with its quantization_type and double_quantization; auto without bits quantizes nothing. Before, bnb
    without bits read as plain LoRA, its keys listed as not read."""
    def quant(config: dict[str, Any]) -> Any:
        return lf_job({**V1_LORA, "quant_config": config}, env=V1_ENV, command="sft")

    job = quant({"name": "bnb"})
    assert (job.spec.method, job.spec.resolved_quantization) == ("qlora", "nf4-dq")
    assert "default 4-bit" in job.provenance["method"]
    fp4 = quant({"name": "bnb", "quantization_type": "fp4", "double_quantization": False})
    assert (fp4.spec.method, fp4.spec.quantization) == ("qlora", "fp4")
    plain = quant({"name": "bnb", "double_quantization": False})
    assert plain.spec.quantization == "nf4"
    assert "quant_config" not in v1_unread(plain)
    assert quant({"name": "bnb", "quantization_bit": 8}).spec.quantization == "int8"
    auto = quant({"name": "auto"})
    assert auto.spec.method == "lora" and any("applies no quantization" in n for n in auto.assumptions)
    assert quant({"name": "auto", "quantization_bit": 4}).spec.method == "qlora"


def test_llama_factory_v1_dpo_keeps_a_reference_for_full_tuning() -> None:
    """`llamafactory-cli dpo` (v1/trainers/dpo_trainer.py): pref_loss sigmoid (the default) deep-copies the model as
    a frozen reference for full (and freeze) tuning, LoRA disables its adapter instead; orpo and simpo use none; the
    pair is one concatenated sample of cutoff_len tokens, so the micro-batch is not doubled. Before, v1 dpo read as
    SFT."""
    full = {"model": "Qwen/Qwen3-0.6B", "dist_config": {"name": "fsdp2"}, "train_dataset": "data/v1_dpo_demo.yaml",
            "micro_batch_size": 2, "cutoff_len": 2048}
    job = lf_job(full, env=V1_ENV, gpus=4, command="dpo")
    assert (job.spec.reference_model, job.spec.micro_batch_size, job.spec.seq_len) == (True, 2, 2048)
    assert "pref_loss sigmoid default" in job.provenance["reference_model"]
    assert any("not doubled" in n for n in job.assumptions)
    freeze = lf_job({**full, "peft_config": {"name": "freeze", "freeze_trainable_layers": 2}}, env=V1_ENV, gpus=4,
                    command="dpo")
    assert freeze.spec.reference_model is True
    for loss in ("orpo", "simpo"):
        assert lf_job({**full, "pref_loss": loss}, env=V1_ENV, gpus=4, command="dpo").spec.reference_model is None
    lora = lf_job({**V1_LORA, "train_dataset": "data/v1_dpo_demo.yaml"}, env=V1_ENV, gpus=4, command="dpo")
    assert (lora.spec.method, lora.spec.reference_model, lora.spec.micro_batch_size) == ("lora", None, 1)
    assert lf_job(full, env=V1_ENV, gpus=4, command="sft").spec.reference_model is None


def test_llama_factory_v1_sequence_parallelism_runs_flash_attention() -> None:
    """cp_size > 1 runs on flash_attention_2 only (core/base_trainer.py): attention flash whatever flash_attn says
    (noted when it says another). Before, sdpa unless flash_attn named flash_attention_2."""
    base = {"model": "Qwen/Qwen3-0.6B", "dist_config": {"name": "fsdp2", "cp_size": 2}, "train_dataset": "d.yaml"}
    job = lf_job(base, env=V1_ENV, gpus=4, command="sft")
    assert (job.spec.attention, job.spec.context_parallel) == ("flash", 2)
    assert "dist_config.cp_size" in job.provenance["attention"]
    top = lf_job({**base, "dist_config": {"name": "fsdp2"}, "cp_size": 2, "flash_attn": "sdpa"}, env=V1_ENV, gpus=4,
                 command="sft")
    assert top.spec.attention == "flash"
    assert any("flash_attention_2 only" in n for n in top.assumptions)
    assert lf_job({**base, "dist_config": {"name": "fsdp2"}}, env=V1_ENV, gpus=4, command="sft").spec.attention == \
        "sdpa"


def test_llama_factory_v1_lora_fsdp2_without_bf16_computes_in_fp32() -> None:
    """LoRA with bf16 false under FSDP2: MixedPrecisionPolicy(param_dtype=float32) (plugins/trainer_plugins/
    distributed/fsdp2.py get_mp_policy) gathers and computes in fp32: 32-true, its over-count of the bf16 base noted.
    Before, bf16-true (half the activations: an under-estimate). Without FSDP2 the bf16 base computes in bf16."""
    job = lf_job({**V1_LORA, "bf16": False}, env=V1_ENV, gpus=4, command="sft")
    assert (job.spec.method, job.spec.precision) == ("lora", "32-true")
    assert any("computes in fp32" in n and "over-estimate" in n for n in job.assumptions)
    assert lf_job(V1_LORA, env=V1_ENV, gpus=4, command="sft").spec.precision == "bf16-true"
    single = {k: v for k, v in V1_LORA.items() if k != "dist_config"}
    assert lf_job({**single, "bf16": False}, env=V1_ENV, command="sft").spec.precision == "bf16-true"


def test_llama_factory_v1_fsdpturbo_is_fsdp2_and_mtp_is_noted() -> None:
    """dist_config fsdpturbo / mindspeed_fsdp2 are FSDP2 engines with expert parallelism (distributed/fsdpturbo.py
    FSDPTurboFSDP2Engine subclasses FSDP2Engine): read as FSDP2 (bf16-mixed for full tuning), not DDP in fp32 (a huge
    over-estimate); mtp_config's extra layers and logits are noted as an under-estimate."""
    turbo = {"model": "Qwen/Qwen3-30B-A3B", "model_class": "llm", "kernel_config": {"name": "auto"},
             "dist_config": {"name": "fsdpturbo", "cp_size": 1, "ep_size": 16, "ep_dispatcher": "eager",
                             "param_dtype": "bf16", "reduce_dtype": "fp32",
                             "ep_modules": ["model.layers.{*}.mlp.experts"],
                             "ep_fsdp_modules": ["model.layers.{*}.mlp"]},
             "init_config": {"name": "init_on_meta"}, "train_dataset": "d.yaml", "micro_batch_size": 1,
             "cutoff_len": 256, "bf16": True, "max_steps": 5}
    job = lf_job(turbo, env=V1_ENV, gpus=16, command="sft")
    assert (job.spec.method, job.spec.sharding, job.spec.precision) == ("full", "fsdp", "bf16-mixed")
    assert "dist_config" not in v1_unread(job)
    assert any("fsdpturbo: read as FSDP2" in n and "ep_size 16" in n for n in job.assumptions)
    mind = lf_job({**turbo, "dist_config": {"name": "mindspeed_fsdp2", "reshard_after_forward": False}}, env=V1_ENV,
                  gpus=16, command="sft")
    assert (mind.spec.sharding, mind.spec.precision) == ("fsdp-grad-op", "bf16-mixed")
    mtp = lf_job({"model": "Qwen/Qwen3-0.6B", "mtp_config": {"name": "mtp", "num_layers": 1, "loss_scale": 0.3},
                  "dist_config": {"name": "fsdp2"}, "train_dataset": "d.yaml"}, env=V1_ENV, gpus=2, command="sft")
    assert any("mtp_config (1 multi-token-prediction layer)" in n and "under-estimate" in n
               for n in mtp.assumptions)


# --- DeepSpeed -------------------------------------------------------------------------------------


def ds_job(ds: dict[str, Any], *flags: str) -> Any:
    return one_job(pod(["deepspeed", "train.py", "--model_name_or_path", M, *flags, "--deepspeed", json.dumps(ds)],
                       gpus=8))


def test_deepspeed_stage_0_runs_a_16bit_model_with_fp32_masters() -> None:
    """ZeRO stage 0 is still DeepSpeed's engine: its FP16 / BF16 optimizer keeps fp32 masters of a 16-bit model, with
    no autocast (engine.py _configure_optimizer), where a spec with sharding ddp reads as autocast over an fp32 model
    (DeepSpeed-Chat's OPT-350m DPO at stage 0, external set 12: 57 % over, 25 % with it)."""
    stage0 = ds_job({"fp16": {"enabled": True}, "zero_optimization": {"stage": 0}}, "--fp16")
    assert (stage0.spec.sharding, stage0.spec.precision, stage0.spec.master_weights) == ("ddp", "16-mixed", True)
    # bf16 at stage 0 is its BF16_Optimizer: the fp32 masters partitioned as at ZeRO-1, the gradients in fp32
    bf16 = ds_job({"bf16": {"enabled": True}, "zero_optimization": {"stage": 0}}, "--bf16").spec
    assert (bf16.sharding, bf16.fp32_gradients, bf16.master_weights) == ("zero1", True, None)
    assert "ZeRO stage 0" in stage0.provenance["master_weights"]
    assert ds_job({"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}, "--fp16").spec.master_weights is None
    # DeepSpeed-Chat's --zero_stage 0 with its own --deepspeed switch
    chat = one_job(pod(["deepspeed", "main.py", "--model_name_or_path", M, "--zero_stage", "0", "--deepspeed"],
                       gpus=8))
    assert (chat.spec.sharding, chat.spec.master_weights) == ("ddp", True)
    # fp32 training has no masters to keep
    fp32 = one_job(pod(["deepspeed", "main.py", "--model_name_or_path", M, "--zero_stage", "0", "--deepspeed"],
                       gpus=8, annotations={"vramfit.io/spec": "precision: 32-true"}))
    assert (fp32.spec.precision, fp32.spec.master_weights) == ("32-true", None)


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


# --- fuzz round 21: values that crashed the readers --------------------------------------------------

HUGE = 10**400  # an int float() cannot hold (OverflowError), as YAML reads a 401-digit number


def lf_errors(config: dict[str, Any], env: dict[str, str] | None = None, command: str = "train",
              files: dict[str, str] | None = None) -> list[SpecError]:
    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
           "data": {"lf.yaml": yaml.safe_dump(config), **(files or {})}}
    outcomes = scan(cfg, pod(["llamafactory-cli", command, "/cfg/lf.yaml"], env=env))
    return [o for o in outcomes if isinstance(o, SpecError) and not isinstance(o, NoTrainingJob)]


def test_llama_factory_freeze_huge_layer_counts_do_not_crash() -> None:
    """freeze_trainable_layers / num_layer_trainable past float's range raised OverflowError in _whole (v0 keys and
    v1 peft_config); LLaMA-Factory takes any int there (range(max(0, L - n), L): every block), read as given."""
    for key in ("freeze_trainable_layers", "num_layer_trainable"):
        for value in (HUGE, -HUGE, str(HUGE)):
            job = lf_job({**BASE, key: value})
            assert abs(job.spec.trainable_layers or 0) >= 10**300, (key, value)
    pro = lf_job({**BASE, "freeze_trainable_layers": HUGE, "use_llama_pro": True})
    assert pro.spec.trainable_layers == -HUGE
    v1 = lf_job({**V1_LORA, "peft_config": {"name": "freeze", "freeze_trainable_layers": HUGE}}, env=V1_ENV,
                command="sft")
    assert v1.spec.trainable_layers == HUGE


def test_huge_max_steps_is_an_input_error_not_a_crash() -> None:
    """max_steps past float's range raised OverflowError in _positive (v1 reader and the v0 key table): now the
    spec's own bound on steps rejects it, naming the key, as other out-of-range values are; a huge negative one is
    "not set", as -1 is."""
    for config, env, command in (({**V1_LORA, "max_steps": HUGE}, V1_ENV, "sft"),
                                 ({**BASE, "max_steps": HUGE}, None, "train")):
        errors = lf_errors(config, env, command)
        assert len(errors) == 1 and "key max_steps" in str(errors[0]), errors
    assert lf_job({**BASE, "max_steps": -HUGE}).spec.steps != -HUGE
    assert lf_job({**V1_LORA, "max_steps": -HUGE}, env=V1_ENV, command="sft").spec.method == "lora"


def test_launch_counts_take_ascii_digits_only() -> None:
    """launch_count used str.isdigit, which accepts '²' (int() rejects it: ValueError) and strings past int()'s
    4300-digit limit: such a count is read as not given, as "abc" is (v1 cp_size, dist_config.cp_size,
    mp_replicate_size, ep_size, mtp_config.num_layers; torchrun --nproc_per_node; GaLore's optim_args rank)."""
    from scheduler.spec.trainer_args import launch_count

    assert [launch_count(v) for v in ("8", "1:4", "²", "1" * 5000, "٣", "abc", "0", 8)] == \
        [8, 4, None, None, None, None, None, 8]
    for bad in ("²", "1" * 5000):
        for extra in ({"cp_size": bad}, {"mp_replicate_size": bad}, {"mtp_config": {"name": "mtp", "num_layers": bad}},
                      {"dist_config": {"name": "fsdp2", "cp_size": bad}},
                      {"dist_config": {"name": "fsdpturbo", "ep_size": bad}}):
            job = lf_job({**V1_LORA, **extra}, env=V1_ENV, command="sft")
            assert job.spec.method == "lora" and job.spec.context_parallel in (None, 1), extra
    torchrun = one_job(pod(["torchrun", "--nproc_per_node", "²", "train.py", "--model_name_or_path", M]))
    assert torchrun.spec.model == M
    galore = one_job(pod(["python", "train.py", "--model_name_or_path", M, "--optim", "galore_adamw",
                          "--optim_args", "rank=²"]))
    assert galore.spec.galore_rank == 128


def test_torchtitan_degrees_take_ascii_digits_only() -> None:
    """torchtitan's context_parallel_degree and selective_ac_option went through str.isdigit + int() as well; they
    are read with launch_count, the launchers' reader of a count."""
    from scheduler.spec.trainer_args import launch_count

    assert [launch_count(v) for v in ("2", "²", "1" * 5000, "x")] == [2, None, None, None]


def test_deepspeed_offload_section_that_is_not_a_mapping_is_an_input_error() -> None:
    """zero_optimization.offload_optimizer / offload_param written as "cpu" raised AttributeError: DeepSpeed takes
    only a mapping there (runtime/zero/config.py: Optional[DeepSpeedZeroOffloadOptimizerConfig], a pydantic model
    that rejects a string), so it is an input error naming the key and the object."""
    for key in ("offload_optimizer", "offload_param"):
        for value in ("cpu", 3, ["cpu"]):
            outcomes = scan(pod(["deepspeed", "train.py", "--model_name_or_path", M, "--deepspeed",
                                 json.dumps({"zero_optimization": {"stage": 3, key: value}})], gpus=8))
            errors = [o for o in outcomes if isinstance(o, SpecError)]
            assert len(errors) == 1 and not isinstance(errors[0], NoTrainingJob), outcomes
            text = str(errors[0])
            assert f"zero_optimization.{key} must be a mapping" in text and "Pod trainer" in text, text
            assert "spec.containers[0]" in text
    ok = ds_job({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": None}})
    assert ok.spec.offload == "optimizer"


def test_llama_factory_non_training_subcommands_are_no_training_job() -> None:
    """`llamafactory-cli chat|export|env|version|help|api|eval|webchat|<unknown> cfg.yaml` was predicted as sft
    training (v1: _V1_COMMANDS.get(sub, "sft"); v0 read the config the same way): nothing trains, so it is no training
    job, the reason naming the sub-command. (Until session 31 it was an error, "no model found": a file with a
    training Job and its LoRA merge Job, `llamafactory-cli export`, failed as a whole.)"""
    for env, config in ((V1_ENV, V1_LORA), (None, {**BASE, "finetuning_type": "lora"})):
        for sub in ("chat", "export", "env", "version", "help", "api", "eval", "webchat", "bogus"):
            assert lf_errors(config, env, sub) == [], sub
            cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
                   "data": {"lf.yaml": yaml.safe_dump(config)}}
            idle = [o for o in scan(cfg, pod(["llamafactory-cli", sub, "/cfg/lf.yaml"], env=env))
                    if isinstance(o, NoTrainingJob) and "Pod trainer" in str(o)]
            assert len(idle) == 1 and f"llamafactory-cli {sub} does not train" in str(idle[0]), (sub, idle)
    assert lf_job(V1_LORA, env=V1_ENV, command="sft").spec.method == "lora"  # training sub-commands unchanged
    assert lf_job({**BASE, "finetuning_type": "lora"}).spec.method == "lora"


def test_llama_factory_v1_freeze_reads_v1_keys_only() -> None:
    """v1's FreezeConfig has freeze_trainable_layers, freeze_trainable_modules, freeze_extra_modules (and
    cast_trainable_params_to_fp32): v0's use_llama_pro and pre-rename keys in a v1 peft_config are listed as not
    read and change nothing (they read as the first 4 blocks / 5 blocks / the old default 3 before)."""
    base = {"model": "Qwen/Qwen3-4B", "cutoff_len": 2048}
    pro = lf_job({**base, "peft_config": {"name": "freeze", "use_llama_pro": True, "freeze_trainable_layers": 4}},
                 env=V1_ENV, command="sft")
    assert pro.spec.trainable_layers == 4
    assert "peft_config.use_llama_pro" in notes_of(pro)
    old = lf_job({**base, "peft_config": {"name": "freeze", "num_layer_trainable": 5}}, env=V1_ENV, command="sft")
    assert old.spec.trainable_layers == 2
    named = lf_job({**base, "peft_config": {"name": "freeze", "name_module_trainable": "mlp"}}, env=V1_ENV,
                   command="sft")
    assert named.spec.trainable_layers == 2


def test_llama_factory_command_overrides_reach_its_defaults_and_freeze_reading() -> None:
    """llamafactory-cli train CONFIG key=value: LLaMA-Factory merges the overrides over the file before reading it
    (hparams/parser.py _read_args), so freeze tuning, finetuning_type and the checkpointing default see them (before,
    only keys read directly, such as cutoff_len, did: freeze_trainable_layers=-16 stayed 2, finetuning_type=full on
    a LoRA config kept LoRA's 16-bit base load)."""
    def job(config: dict[str, Any], *overrides: str) -> Any:
        cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
               "data": {"lf.yaml": yaml.safe_dump(config)}}
        return one_job(cfg, pod(["llamafactory-cli", "train", "/cfg/lf.yaml", *overrides]))

    freeze = job(BASE, "freeze_trainable_layers=-16", "cutoff_len=4096")
    assert (freeze.spec.trainable_layers, freeze.spec.seq_len) == (-16, 4096)
    off = job(BASE, "disable_gradient_checkpointing=true")
    assert off.spec.gradient_checkpointing == "none"
    full = job({**BASE, "finetuning_type": "lora"}, "finetuning_type=full")
    assert (full.spec.method, full.spec.precision) == ("full", "bf16-mixed")


def test_llama_factory_non_training_subcommand_ignores_a_config_inline_in_env() -> None:
    """A pod that runs `llamafactory-cli chat` with its config written inline in an env var (echoed to a file by the
    entrypoint) was read as an sft job from that env var; the sub-command trains nothing, so nothing is read from
    the config, and the pod ends as one that runs no trainer does."""
    config = yaml.safe_dump({**BASE, "finetuning_type": "lora"})
    for sub in ("chat", "export", "webchat"):
        outcomes = scan(pod(["llamafactory-cli", sub, "/tmp/lf.yaml"], env={"LF_CONFIG": config}))
        assert not any(isinstance(o, ParsedJob) for o in outcomes), (sub, outcomes)
        idle = [o for o in outcomes if isinstance(o, NoTrainingJob)]
        assert len(idle) == 1 and f"llamafactory-cli {sub} does not train" in str(idle[0]), outcomes
    job = one_job(pod(["llamafactory-cli", "train", "/tmp/lf.yaml"], env={"LF_CONFIG": config}))
    assert job.spec.method == "lora"  # a training sub-command still reads the inline config


# --- LLaMA-Factory's shipped DeepSpeed configs ---------------------------------------------------------------------


def lf_ds(name: str, files: dict[str, str] | None = None, **extra: Any) -> Any:
    return lf_job({**BASE, "finetuning_type": "full", "deepspeed": f"examples/deepspeed/{name}", **extra}, gpus=8,
                  files=files)


def test_llama_factory_names_its_own_deepspeed_config_read_as_it_ships() -> None:
    """A LLaMA-Factory job that names examples/deepspeed/ds_z3_config.json without carrying it gets that file's
    contents (reduce_bucket_size "auto": hidden_size^2, 0.03 GiB at hidden 4096, not DeepSpeed's 0.93 GiB default),
    not the file name's stage alone."""
    from predictors.catalog import resolve_model
    from predictors.vram import predict_vram

    job = lf_ds("ds_z3_config.json")
    assert (job.spec.sharding, job.spec.offload, job.spec.zero_reduce_bucket_elements) == ("zero3", "none", "auto")
    assert job.spec.precision == "bf16-mixed"  # bf16 "auto", filled by the config's bf16: true
    assert "as LLaMA-Factory ships it" in notes_of(job)
    comm = predict_vram(job.spec, resolve_model(job.spec).architecture).breakdown_bytes["communication_buffers"]
    assert comm == 4096 * 4096 * 2
    offload = lf_ds("ds_z2_offload_config.json")
    assert (offload.spec.sharding, offload.spec.offload) == ("zero2", "optimizer")
    assert (offload.spec.zero_reduce_bucket_elements, offload.spec.zero_overlap_comm) == (500_000_000, False)
    both = lf_ds("ds_z3_offload_config.json")
    assert (both.spec.sharding, both.spec.offload) == ("zero3", "params+optimizer")
    # stage 0 under bf16 is DeepSpeed's BF16_Optimizer: fp32 masters partitioned as ZeRO-1, fp32 gradients
    z0 = lf_ds("ds_z0_config.json").spec
    assert (z0.precision, z0.sharding, z0.fp32_gradients) == ("bf16-mixed", "zero1", True)


def test_a_carried_file_and_other_trainers_are_read_as_before() -> None:
    # the manifest's own file of that name wins over the shipped one
    own = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 2e8}, "bf16": {"enabled": True}}
    carried = lf_ds("ds_z3_config.json", files={"ds_z3_config.json": json.dumps(own)})
    assert carried.spec.zero_reduce_bucket_elements == 200_000_000
    assert "as LLaMA-Factory ships it" not in notes_of(carried)
    # another trainer naming a file of that name: the stage from the name only, DeepSpeed's default bucket
    other = one_job(pod(["deepspeed", "train.py", "--model_name_or_path", M, "--bf16", "--deepspeed",
                         "examples/deepspeed/ds_z3_config.json"], gpus=8))
    assert (other.spec.sharding, other.spec.zero_reduce_bucket_elements) == ("zero3", None)
    assert "ZeRO stage 3 read from its file name" in notes_of(other)
    # an unknown file name in a LLaMA-Factory job: the name's stage, as before
    unknown = lf_ds("my_z3.json")
    assert (unknown.spec.sharding, unknown.spec.zero_reduce_bucket_elements) == ("zero3", None)


def test_llama_factory_v1_naming_its_shipped_config_infers_bf16() -> None:
    """v1's dist_config naming examples/deepspeed/ds_z3_config.json without the file: v1 fills the file's "auto"
    precision with bf16 (infer_deepspeed_mixed_precision), as when the manifest carries it."""
    job = lf_job(V1_DS, env=V1_ENV, gpus=8, command="sft")
    assert (job.spec.sharding, job.spec.precision, job.spec.zero_reduce_bucket_elements) == (
        "zero3", "bf16-mixed", "auto")


def axolotl_ds(path: str, as_flag: bool = False) -> Any:
    config = f"base_model: {M}\nbf16: true\n" + ("" if as_flag else f"deepspeed: {path}\n")
    script = f"cat > /c.yml <<EOF\n{config}EOF\naxolotl train /c.yml" + (f" --deepspeed {path}" if as_flag else "")
    return one_job(pod(["bash", "-c", script], gpus=8))


def test_axolotl_names_its_own_deepspeed_configs_read_as_they_ship() -> None:
    """axolotl's deepspeed_configs/zero2.json offloads the optimizer to the CPU, which its name does not say: read as
    it ships, a ZeRO-2 job without its optimizer states on the GPUs (before: states, master weights and the step's
    fp32 gradients all counted there). Its zero3 files fill the bucket with "auto". From the YAML key or the flag."""
    from predictors.catalog import resolve_model
    from predictors.vram import predict_vram

    for as_flag in (False, True):
        zero2 = axolotl_ds("deepspeed_configs/zero2.json", as_flag)
        assert (zero2.spec.sharding, zero2.spec.offload, zero2.spec.zero_overlap_comm) == ("zero2", "optimizer", True)
        assert "read as axolotl ships it" in notes_of(zero2)
    states = predict_vram(zero2.spec, resolve_model(zero2.spec).architecture).breakdown_bytes
    assert "optimizer_states" not in states and "master_weights" not in states
    zero3 = axolotl_ds("/workspace/axolotl/deepspeed_configs/zero3_bf16.json", as_flag=True)
    assert (zero3.spec.sharding, zero3.spec.precision, zero3.spec.zero_reduce_bucket_elements) == (
        "zero3", "bf16-mixed", "auto")
    assert axolotl_ds("deepspeed_configs/zero3_bf16_cpuoffload_all.json").spec.offload == "params+optimizer"
    params_only = axolotl_ds("deepspeed_configs/zero3_bf16_cpuoffload_params.json")
    assert params_only.spec.offload == "none"  # offload_param alone keeps the optimizer on the GPUs (noted)
    assert axolotl_ds("deepspeed_configs/zero1.json").spec.sharding == "zero1"


def test_shipped_configs_whose_names_hide_what_they_offload() -> None:
    """LLaMA-Factory's ds_z3_partial_offload_config.json offloads the optimizer only (its name reads as full
    offload); axolotl's zero2_torch_compile.json offloads the optimizer like zero2.json; zero3_cpuoffload.json
    offloads both and keeps no gathered parameters for reuse. Before, each was read from its name."""
    partial = lf_ds("ds_z3_partial_offload_config.json")
    assert (partial.spec.sharding, partial.spec.offload) == ("zero3", "optimizer")
    assert (partial.spec.zero3_max_live_parameters, partial.spec.zero3_max_reuse_distance) == (10**9, 10**9)
    assert "as LLaMA-Factory ships it" in notes_of(partial)
    compiled = axolotl_ds("deepspeed_configs/zero2_torch_compile.json")
    assert (compiled.spec.sharding, compiled.spec.offload) == ("zero2", "optimizer")
    assert axolotl_ds("deepspeed_configs/zero1_torch_compile.json").spec.sharding == "zero1"
    offload = axolotl_ds("deepspeed_configs/zero3_cpuoffload.json")
    assert (offload.spec.offload, offload.spec.zero3_max_reuse_distance) == ("params+optimizer", 0)


def test_common_names_outside_the_trainers_folder_keep_the_name_reading() -> None:
    """zero2.json is a common name: outside axolotl's deepspeed_configs folder, or in another trainer's job, it gives
    the stage only, as before."""
    mine = axolotl_ds("my/zero2.json")
    assert (mine.spec.sharding, mine.spec.offload) == ("zero2", "none")
    assert "ZeRO stage 2 read from its file name" in notes_of(mine)
    hf = one_job(pod(["deepspeed", "train.py", "--model_name_or_path", M, "--bf16", "--deepspeed",
                      "deepspeed_configs/zero2.json"], gpus=8))
    assert (hf.spec.sharding, hf.spec.offload) == ("zero2", "none")


def test_zero3_live_and_reuse_limits_are_read_with_either_name() -> None:
    """stage3_max_live_parameters / stage3_max_reuse_distance (or the names without "stage3_", which DeepSpeed also
    takes) become the spec's zero3 limits at ZeRO-3, with their source; at another final stage they are noted."""
    both = ds_job({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 0, "max_reuse_distance": "1e8"}},
                  "--bf16")
    assert (both.spec.zero3_max_live_parameters, both.spec.zero3_max_reuse_distance) == (0, 100_000_000)
    assert "stage3_max_live_parameters" in both.provenance["zero3_max_live_parameters"]
    assert "max_reuse_distance" in both.provenance["zero3_max_reuse_distance"]
    # the stage filled by --zero_stage 2: nothing is gathered, the limits are noted and left out
    staged = one_job(pod(["deepspeed", "train.py", "--model_name_or_path", M, "--bf16", "--zero_stage", "2",
                          "--deepspeed", json.dumps({"zero_optimization": {"stage": "auto",
                                                                           "stage3_max_live_parameters": 0}})],
                         gpus=8))
    assert (staged.spec.sharding, staged.spec.zero3_max_live_parameters) == ("zero2", None)
    assert "stage3_max_live_parameters not read" in notes_of(staged)
    # axolotl's zero3 configs keep nothing for reuse
    axolotl = axolotl_ds("deepspeed_configs/zero3_bf16.json")
    assert (axolotl.spec.zero3_max_live_parameters, axolotl.spec.zero3_max_reuse_distance) == (0, 0)


def test_a_zero3_limit_deepspeed_could_not_use_is_an_error_naming_the_key() -> None:
    for bad in ("auto", -1, 1.5, "1e16", True):
        config = json.dumps({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": bad}})
        [outcome] = scan(pod(["deepspeed", "train.py", "--model_name_or_path", M, "--bf16", "--deepspeed", config],
                             gpus=8))
        assert isinstance(outcome, SpecError), bad
        assert "zero_optimization.stage3_max_live_parameters must be a whole number" in str(outcome)


def test_axolotl_module_launches_name_its_shipped_configs_too() -> None:
    """``accelerate launch -m axolotl.cli.train CONFIG --deepspeed deepspeed_configs/zero2.json`` (and ``python -m``):
    the command's trainer label is accelerate or python, but the config read is axolotl's, so the flag's file is
    axolotl's shipped one (review, 2026-11-27: these forms kept the name-only reading, optimizer states on the GPUs)."""
    for launch in ("accelerate launch -m axolotl.cli.train", "python -m axolotl.cli.train"):
        config = f"base_model: {M}\nbf16: true\n"
        script = f"cat > /c.yml <<EOF\n{config}EOF\n{launch} /c.yml --deepspeed deepspeed_configs/zero2.json"
        job = one_job(pod(["bash", "-c", script], gpus=8))
        assert (job.spec.sharding, job.spec.offload, job.spec.zero_overlap_comm) == ("zero2", "optimizer", True), launch


def test_a_config_inlined_in_an_env_var_reads_the_deepspeed_file_the_manifest_carries() -> None:
    """A LLaMA-Factory config written in an env var that names examples/deepspeed/ds_z3_config.json, with a ConfigMap
    carrying a file of that name: the carried file is read, as for a config carried as a file (review, 2026-11-27:
    the shipped contents were read, with a false "not in the manifest" note)."""
    lf = {**BASE, "finetuning_type": "full", "deepspeed": "examples/deepspeed/ds_z3_config.json"}
    own = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 2e8, "stage3_max_live_parameters": 1e8},
           "bf16": {"enabled": True}}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
          "data": {"ds_z3_config.json": json.dumps(own)}}
    job = one_job(cm, pod(["bash", "-c", 'echo "$LF_CONFIG" > /tmp/lf.yaml && llamafactory-cli train /tmp/lf.yaml'],
                          env={"LF_CONFIG": yaml.safe_dump(lf)}, gpus=8))
    assert (job.spec.zero_reduce_bucket_elements, job.spec.zero3_max_live_parameters) == (200_000_000, 100_000_000)
    assert "not in the manifest" not in notes_of(job)


def test_llama_factory_src_train_py_is_llama_factory() -> None:
    """LLaMA-Factory's src/train.py (run_exp) under torchrun with its own --finetuning_type: read as LLaMA-Factory, so
    its shipped examples/deepspeed config is recognised and its defaults apply; a src/train.py without LLaMA-Factory's
    flags stays a plain script."""
    lf = one_job(pod(["torchrun", "--nproc_per_node", "8", "src/train.py", "--stage", "sft", "--do_train",
                      "--model_name_or_path", M, "--finetuning_type", "full", "--template", "llama2", "--bf16",
                      "--deepspeed", "examples/deepspeed/ds_z3_config.json"], gpus=8))
    assert (lf.spec.sharding, lf.spec.zero_reduce_bucket_elements, lf.spec.framework) == ("zero3", "auto",
                                                                                          "transformers")
    assert "LLaMA-Factory" in lf.provenance["gradient_checkpointing"]
    plain = one_job(pod(["torchrun", "--nproc_per_node", "8", "src/train.py", "--model_name_or_path", M, "--bf16",
                         "--deepspeed", "examples/deepspeed/ds_z3_config.json"], gpus=8))
    assert (plain.spec.sharding, plain.spec.zero_reduce_bucket_elements) == ("zero3", None)


def test_llama_factory_without_a_batch_runs_transformers_default_of_eight() -> None:
    """LLaMA-Factory's TrainingArguments are transformers' Seq2SeqTrainingArguments: a config or flags without
    per_device_train_batch_size train 8 sequences per GPU, not the TrainingSpec's default 1 (an 8x under-estimate of
    the activations before)."""
    config = {k: v for k, v in BASE.items() if k != "per_device_train_batch_size"}
    job = lf_job({**config, "finetuning_type": "lora"})
    assert job.spec.micro_batch_size == 8
    assert "per_device_train_batch_size default 8" in job.provenance["micro_batch_size"]
    assert lf_job({**config, "finetuning_type": "lora", "per_device_train_batch_size": 2}).spec.micro_batch_size == 2
    flags = one_job(pod(["llamafactory-cli", "train", "--stage", "sft", "--do_train", "--model_name_or_path", M,
                         "--finetuning_type", "lora", "--template", "llama2", "--bf16"]))
    assert flags.spec.micro_batch_size == 8


def test_a_bf16_loaded_model_under_deepspeed_with_bf16_on_keeps_fp32_masters() -> None:
    """alignment-handbook's and TRL's full-training recipes load the model with torch_dtype bfloat16 and train with
    bf16 under DeepSpeed: ZeRO keeps fp32 master weights and optimizer states whatever the loaded dtype, so the job
    is bf16-mixed (it was read as bf16-true, its masters uncounted: 7 GiB per GPU under for Mistral-7B on 8 GPUs).
    Without DeepSpeed, or without bf16 on, the loaded dtype still decides."""
    zero3 = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}
    job = ds_job(zero3, "--torch_dtype", "bfloat16", "--bf16")
    assert (job.spec.precision, job.spec.sharding) == ("bf16-mixed", "zero3")
    assert "ZeRO keeps fp32 master weights" in notes_of(job)
    assert ds_job(zero3, "--torch_dtype", "float16", "--fp16").spec.precision == "16-mixed"
    plain = one_job(pod(["torchrun", "train.py", "--model_name_or_path", M, "--torch_dtype", "bfloat16", "--bf16"]))
    assert plain.spec.precision == "bf16-true"
    assert ds_job({"zero_optimization": {"stage": 2}}, "--torch_dtype", "bfloat16").spec.precision == "bf16-true"


# NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh (f7ec7ea), the flags vramfit reads
MEGATRON = ["torchrun", "--nproc_per_node", "8", "pretrain_gpt.py", "--use-mcore-models", "--num-layers", "32",
            "--hidden-size", "4096", "--ffn-hidden-size", "14336", "--num-attention-heads", "32",
            "--group-query-attention", "--num-query-groups", "8", "--kv-channels", "128", "--seq-length", "8192",
            "--max-position-embeddings", "8192", "--swiglu", "--normalization", "RMSNorm",
            "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--micro-batch-size", "1",
            "--global-batch-size", "128", "--bf16", "--use-distributed-optimizer", "--fp8-format", "hybrid",
            "--tensor-model-parallel-size", "1", "--vocab-size", "128256"]


def test_megatron_lm_flags_and_its_architecture_flags_are_read() -> None:
    """Megatron-LM's --seq-length (read as the default 2048 before: activations 4x under), --use-distributed-optimizer
    (DDP before: the fp32 states unsharded, 142 GiB over), --global-batch-size and the recompute flags; with no model
    named, its architecture flags as an inline Llama-style config (Llama 3 8B's exact 8,030,261,248 parameters)."""
    from predictors.catalog import resolve_model

    job = one_job(pod(MEGATRON, gpus=8))
    s = job.spec
    assert (s.seq_len, s.sharding, s.precision, s.grad_accum_steps, s.gradient_checkpointing) == (
        8192, "zero1", "bf16-mixed", 16, "none")
    assert resolve_model(s).architecture.params_total == 8_030_261_248
    assert "FP8" in notes_of(job)
    full = one_job(pod([*MEGATRON, "--recompute-granularity", "full", "--recompute-method", "uniform",
                        "--recompute-num-layers", "1"], gpus=8))
    assert full.spec.gradient_checkpointing == "full"
    block = one_job(pod([*MEGATRON, "--recompute-granularity", "full", "--recompute-method", "block"], gpus=8))
    assert block.spec.gradient_checkpointing == "none" and "recomputes only" in notes_of(block)
    selective = one_job(pod([*MEGATRON, "--recompute-granularity", "selective"], gpus=8))
    assert selective.spec.gradient_checkpointing == "selective"
    # Megatron's GPT (no SwiGLU: GeLU MLP of 4 x hidden, LayerNorm, learned positions) as a GPT-2 layout, the
    # vocabulary padded to a multiple of 128 as Megatron pads it: GPT-2 medium's shape, 354,871,296 parameters
    gpt = one_job(pod(["torchrun", "pretrain_gpt.py", "--num-layers", "24", "--hidden-size", "1024",
                       "--num-attention-heads", "16", "--vocab-size", "50257", "--seq-length", "1024"]))
    assert resolve_model(gpt.spec).architecture.params_total == 354_871_296
    # the vocabulary from the tokenizer: GPT-2's BPE files (--vocab-file / --merge-file), Llama2Tokenizer
    bpe = one_job(pod(["torchrun", "pretrain_gpt.py", "--num-layers", "24", "--hidden-size", "1024",
                       "--num-attention-heads", "16", "--vocab-file", "v.json", "--merge-file", "m.txt"]))
    assert resolve_model(bpe.spec).architecture.vocab_size == 50304
    # a tokenizer of unknown size: refused, saying what is missing
    outcomes = scan(pod(["torchrun", "pretrain_gpt.py", "--num-layers", "24", "--hidden-size", "1024",
                         "--num-attention-heads", "16", "--tokenizer-type", "GPTSentencePieceTokenizer",
                         "--tokenizer-model", "./tokenizer.model"]))
    assert any("but not its vocabulary" in str(o) for o in outcomes)


def test_megatron_lm_keeps_fp32_gradients_under_bf16_and_steps_a_fused_adam() -> None:
    """Megatron-LM's --bf16 turns accumulate_allreduce_grads_in_fp32 on (arguments.py), so its DDP keeps an fp32
    main_grad buffer: 4 bytes per parameter where vramfit counted a 16-bit model's 2 (Llama 3 8B on 8 GPUs,
    TP 1: +7.5 GiB). Its Adam is Transformer Engine's or apex's fused kernel: no foreach step temporaries."""
    job = one_job(pod(MEGATRON, gpus=8))
    assert (job.spec.fp32_gradients, job.spec.fused_optimizer, job.spec.framework) == (True, True, "megatron")
    assert "accumulate_allreduce_grads_in_fp32" in job.provenance["fp32_gradients"]
    assert one_job(pod([*MEGATRON, "--grad-reduce-in-bf16"], gpus=8)).spec.fp32_gradients is False
    # TP 1: sequence parallelism has nothing to split; TP 2 keeps the norms' inputs whole unless --sequence-parallel
    assert job.spec.sequence_parallel is None
    tp2 = [t if t != "1" or MEGATRON[i - 1] != "--tensor-model-parallel-size" else "2" for i, t in enumerate(MEGATRON)]
    assert one_job(pod(tp2, gpus=8)).spec.sequence_parallel is False
    assert one_job(pod([*tp2, "--sequence-parallel"], gpus=8)).spec.sequence_parallel is True
    fp16 = [t for t in MEGATRON if t != "--bf16"] + ["--fp16"]
    assert one_job(pod(fp16, gpus=8)).spec.fp32_gradients is None
    assert one_job(pod([*fp16, "--accumulate-allreduce-grads-in-fp32"], gpus=8)).spec.fp32_gradients is True


# NVIDIA/Megatron-LM examples build their command from bash arrays (examples/llama/train_llama3_8b_h100_fp8.sh), in
# part: a multi-line array with comments, an array appended to another, a quoted element of two words
MEGATRON_ARRAYS = """
GPUS_PER_NODE=8
SEQ_LENGTH=8192
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
)
MODEL_ARGS=(
    --num-layers 32  # the layers
    --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --group-query-attention --num-query-groups 8 --kv-channels 128
    --seq-length $SEQ_LENGTH
    # --recompute-granularity full
    --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear
)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 128 --bf16)
DDP_ARGS=(--use-distributed-optimizer --overlap-grad-reduce)
TRAINING_ARGS+=("${DDP_ARGS[@]}")
DATA_ARGS=("--vocab-size 128256" "--tokenizer-type NullTokenizer")
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]} "${TRAINING_ARGS[@]}" ${DATA_ARGS[@]} \
    --recompute-activations --attention-backend ${ATTN:-unfused}
"""


def test_megatron_example_scripts_built_from_bash_arrays_are_read() -> None:
    """Every Megatron-LM example passes its flags as ``${MODEL_ARGS[@]}``: the arrays were not expanded, each body was
    read as one-flag pseudo-commands and the job was refused (Llama 3 8B FP8 example; with the model annotated 159.2
    GiB for about 103, at 2,048 tokens under DDP). Also read: --recompute-activations (selective, Megatron's
    shorthand) and --attention-backend (unfused: the softmax kept)."""
    from predictors.catalog import resolve_model

    s = one_job(pod(["bash", "-c", MEGATRON_ARRAYS], gpus=8)).spec
    assert (s.seq_len, s.sharding, s.grad_accum_steps, s.fp32_gradients, s.framework) == (
        8192, "zero1", 16, True, "megatron")
    assert resolve_model(s).architecture.params_total == 8_030_261_248
    assert (s.gradient_checkpointing, s.attention) == ("selective", "eager")
    flash = one_job(pod(["bash", "-c", MEGATRON_ARRAYS], env={"ATTN": "flash"}, gpus=8)).spec
    assert flash.attention == "flash"


def test_megatron_flags_read_beyond_pretrain_scripts_and_old_spellings() -> None:
    """Megatron's argument parser behind other entry points (Megatron-DeepSpeed's finetune_llama.py), its older
    --checkpoint-activations (every layer), the global batch over a pipeline (num_microbatches = global / (micro x
    data parallel)), and ${10}-style arguments (Pai-Megatron-Patch scripts take 25)."""
    args = ["torchrun", "finetune_llama.py", "--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads",
            "32", "--ffn-hidden-size", "11008", "--swiglu", "--normalization", "rmsnorm", "--vocab-size", "32000",
            "--micro-batch-size", "16", "--global-batch-size", "256", "--seq-length", "512",
            "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--checkpoint-activations"]
    s = one_job(pod(args, gpus=8)).spec
    assert (s.framework, s.seq_len, s.grad_accum_steps, s.gradient_checkpointing, s.sequence_parallel) == (
        "megatron", 512, 8, "full", False)
    script = "TP=${10}\nPP=${11:-1}\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP " \
             "--pipeline-model-parallel-size $PP --num-layers 2 --hidden-size 64 --num-attention-heads 4 " \
             "--vocab-size 1000 --swiglu --normalization RMSNorm --micro-batch-size 1"
    bound = one_job(pod(["bash", "-c", script, "_", *["a", "b", "c", "d", "e", "f", "g", "h", "i", "2"]], gpus=8)).spec
    assert (bound.tensor_parallel, bound.pipeline_parallel) == (2, 1)
    # Megatron-DeepSpeed at ZeRO 1-3: DeepSpeed's optimizer keeps the 16-bit gradients (its model never reaches
    # Megatron's DDP); at stage 0 with bf16 its BF16_Optimizer accumulates them in fp32
    mds = [*args, "--bf16", "--deepspeed", "--deepspeed_config", "ds.json"]
    assert one_job(pod([*mds, "--zero-stage", "1"], gpus=8)).spec.fp32_gradients is False
    assert one_job(pod([*mds, "--zero-stage", "0"], gpus=8)).spec.fp32_gradients is True
    # --swiglu without --ffn-hidden-size: Megatron's int(4h x 2/3 / 64) x 64, not 4h
    from predictors.catalog import resolve_model

    no_ffn = [t for i, t in enumerate(args) if t != "--ffn-hidden-size" and args[i - 1] != "--ffn-hidden-size"]
    # int(16384 x 2/3 / 64) x 64
    assert resolve_model(one_job(pod(no_ffn, gpus=8)).spec).architecture.intermediate_size == 10880


def test_megatron_dropout_flags_reach_the_model_config() -> None:
    """Megatron trains with --attention-dropout and --hidden-dropout 0.1 unless told otherwise (arguments.py): its
    local attention keeps the dropout mask and the dropped probabilities of the scores, 2 + 1 + 2 bytes each where
    the fused softmax alone keeps 2. Before, a SwiGLU model read from Megatron's flags had none (a llama config's
    default), and Megatron-LM issue 525's 36-layer GPT on a V100-32GB, out of memory in its first forward pass with
    28.8 GiB allocated, was expected to fit at 28.1 GiB; it is now 38.0 GiB."""
    from predictors.catalog import resolve_model

    args = ["torchrun", "pretrain_gpt.py", "--num-layers", "36", "--hidden-size", "1280", "--num-attention-heads",
            "20", "--ffn-hidden-size", "3392", "--swiglu", "--seq-length", "1024", "--max-position-embeddings", "1024",
            "--micro-batch-size", "4", "--global-batch-size", "16", "--fp16", "--vocab-size", "50257",
            "--transformer-impl", "local"]
    arch = resolve_model(one_job(pod(args, gpus=1)).spec).architecture
    assert (arch.attention_dropout, arch.hidden_dropout) == (0.1, 0.1)
    off = [*args, "--attention-dropout", "0.0", "--hidden-dropout", "0"]
    arch_off = resolve_model(one_job(pod(off, gpus=1)).spec).architecture
    assert (arch_off.attention_dropout, arch_off.hidden_dropout) == (0.0, 0.0)
    gpt = [t for t in args if t != "--swiglu"]
    gpt_arch = resolve_model(one_job(pod([*gpt, "--attention-dropout", "0.05"], gpus=1)).spec).architecture
    assert (gpt_arch.model_type, gpt_arch.attention_dropout, gpt_arch.hidden_dropout) == ("gpt2", 0.05, 0.1)


def test_kubeflow_sdk_trainer_json_arguments_are_read() -> None:
    """Kubeflow's TrainingClient.train() runs kubeflow/trainer/hf_llm_training.py with the model as --model_uri
    hf://..., TrainingArguments and LoraConfig as JSON (every model is wrapped in LoRA). Before, none of it was
    read: an 8B LoRA job (r 16, batch 4, checkpointing, bf16) was a full fine-tune at batch 1 (159.6 GiB)."""
    training = {"output_dir": "/out", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 8,
                "gradient_checkpointing": True, "bf16": True, "fp16": False, "optim": "paged_adamw_32bit",
                "fsdp": [], "fsdp_config": {"min_num_params": 0}}
    lora = {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "lora_dropout": 0.1,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    args = ["--model_uri", "hf://meta-llama/Llama-3.1-8B-Instruct", "--transformer_type", "AutoModelForCausalLM",
            "--model_dir", "/workspace/model", "--lora_config", json.dumps(lora), "--training_parameters",
            json.dumps(training)]
    job = one_job(pod(args))
    s = job.spec
    assert (s.method, s.micro_batch_size, s.grad_accum_steps, s.gradient_checkpointing, s.precision) == (
        "lora", 4, 8, "full", "bf16-mixed")
    assert s.sharding in (None, "none")  # "fsdp": [] is TrainingArguments.to_dict() of a job without FSDP
    assert s.lora is not None and (s.lora.rank, s.lora.alpha, s.lora.target_modules) == (
        16, 32, ["q_proj", "k_proj", "v_proj", "o_proj"])
    from predictors.catalog import resolve_model

    assert resolve_model(s).architecture.num_layers == 32
    assert "tokenized without truncation" in notes_of(job)
    # Katib's form: the JSON kept in its shell quotes, a classifier, bf16 and fp16 off (fp32)
    katib = ["--model_uri", "hf://google-bert/bert-base-uncased", "--transformer_type",
             "AutoModelForSequenceClassification", "--lora_config", "'" + json.dumps({"r": 8}) + "'",
             "--training_parameters", "'" + json.dumps({**training, "bf16": False}) + "'"]
    classifier = one_job(pod(katib)).spec
    assert (classifier.task, classifier.method, classifier.precision) == ("seq-classification", "lora", "32-true")


def test_rays_llm_fine_tuning_template_flags_and_defaults() -> None:
    """Ray's finetune_hf_llm.py (its docs' DeepSpeed template): -bs/--batch-size-per-device (default 16), --ctx-len
    (default 512), checkpointing unless --no-grad-ckpt, --mx (default bf16) over a model loaded in bf16 with
    FlashAttention-2. Before: batch 1, 2048 tokens, no checkpointing, fp32 (43.3 GiB for the 13B job, 10.3 now)."""
    ds = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto"}
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ds"},
                 "data": {"zero_3.json": json.dumps(ds)}}
    base = ["python", "finetune_hf_llm.py", "--model_name", M, "--ds-config", "./deepspeed_configs/zero_3.json",
            "--output_dir", "/o"]
    job = one_job(configmap, pod([*base, "-bs", "8", "-nd", "16"], gpus=8))
    s = job.spec
    assert (s.micro_batch_size, s.seq_len, s.gradient_checkpointing, s.precision, s.attention, s.sharding) == (
        8, 512, "full", "bf16-mixed", "flash", "zero3")
    plain = one_job(configmap, pod([*base, "--ctx-len", "1024", "--no-grad-ckpt", "--mx", "fp16", "--lora"],
                                   gpus=8)).spec
    assert (plain.micro_batch_size, plain.seq_len, plain.gradient_checkpointing, plain.method) == (
        16, 1024, "none", "lora")


def test_openrlhf_trainers_flags_defaults_and_dpo_reference_model() -> None:
    """OpenRLHF's train_sft / train_dpo (deepspeed --module openrlhf.cli.train_dpo): --pretrain, per-GPU
    --micro_train_batch_size (default 8), --max_len (DPO 512, SFT 2048), ZeRO-2 by default; DPO forwards the chosen
    and rejected sequences together beside a reference model of its own. Before: no model, batch 1, 2048 tokens and
    no reference model (its Llama 3 8B DPO example 12.5 GiB under)."""
    dpo = ["deepspeed", "--module", "openrlhf.cli.train_dpo", "--pretrain", M, "--micro_train_batch_size", "1",
           "--train_batch_size", "128", "--max_len", "8192", "--zero_stage", "3", "--bf16", "--flash_attn",
           "--gradient_checkpointing"]
    s = one_job(pod(dpo, gpus=8)).spec
    assert (s.micro_batch_size, s.seq_len, s.sharding, s.reference_model, s.precision, s.grad_accum_steps) == (
        2, 8192, "zero3", True, "bf16-mixed", 16)
    sft = one_job(pod(["deepspeed", "--module", "openrlhf.cli.train_sft", "--pretrain", M, "--lora_rank", "64",
                       "--adam_offload"], gpus=8)).spec
    assert (sft.micro_batch_size, sft.seq_len, sft.sharding, sft.method, sft.offload) == (
        8, 2048, "zero2", "lora", "optimizer")
    assert sft.lora is not None and sft.lora.target_modules == "all-linear" and sft.lora.dropout == 0
    offloaded = one_job(pod([*dpo, "--ref_offload"], gpus=8)).spec
    assert offloaded.reference_model is False


def test_axolotl_torchao_base_quantization_is_qlora() -> None:
    """axolotl's examples/llama-3/qlora-torchao.yaml: adapter lora with model_quantization_config {backend: torchao,
    weight_dtype: int4} is QLoRA on a 4-bit base (its own comment); it was plain LoRA with a bf16 base (33.6 GiB
    against 24.0)."""
    def job(weight_dtype: str) -> Any:
        config = (f"base_model: {M}\nbf16: true\nadapter: lora\nlora_r: 32\n"
                  f"model_quantization_config:\n  backend: torchao\n  weight_dtype: {weight_dtype}\n")
        return one_job(pod(["bash", "-c", f"cat > /c.yml <<EOF\n{config}EOF\naxolotl train /c.yml"])).spec

    four = job("int4")
    assert four.method == "qlora" and four.resolved_quantization in ("nf4", "nf4-dq")
    assert job("int8").quantization == "int8"


def test_openrlhf_reward_model_and_kto_forward_two_sequences_per_sample() -> None:
    """OpenRLHF's train_rm defaults to micro-batch 1 at 512 tokens (not SFT's 8 at 2048) and forwards a chosen and a
    rejected sequence per sample through a value head; train_kto adds a mismatched sample per sample for the KL term,
    with gradients kept: both twice the micro-batch. A malformed Kubeflow --training_parameters still gives the
    model."""
    base = ["deepspeed", "--module"]
    rm = one_job(pod([*base, "openrlhf.cli.train_rm", "--pretrain", M, "--train_batch_size", "128"], gpus=8)).spec
    assert (rm.micro_batch_size, rm.seq_len, rm.task, rm.grad_accum_steps) == (2, 512, "seq-classification", 16)
    kto = one_job(pod([*base, "openrlhf.cli.train_kto", "--pretrain", M, "--micro_train_batch_size", "2"],
                      gpus=8)).spec
    assert (kto.micro_batch_size, kto.reference_model) == (4, True)
    bad = one_job(pod(["--model_uri", "hf://meta-llama/Llama-2-7b-hf", "--training_parameters", '{"bf16": true,']))
    assert bad.spec.method == "lora" and "is not a JSON object of TrainingArguments" in notes_of(bad)


def test_trl_kto_reward_orpo_and_llama_factory_reward_models() -> None:
    """trl kto: KTOConfig's defaults (1024 tokens, checkpointing, bf16, batch 8) and a frozen reference model (it was
    read without one: 15.7 GiB where the job needs 26.7). trl reward / reward_modeling.py: a sequence classifier
    scoring a chosen and a rejected sequence in one micro-batch. ORPO/CPO scripts: the paired forward. LLaMA-Factory
    stage rm: its pairwise collator's 2 x n sequences (read as n: 4.3 GiB under)."""
    kto = one_job(pod(["trl", "kto", "--model_name_or_path", M, "--dataset_name", "trl-lib/kto-mix-14k"])).spec
    assert (kto.micro_batch_size, kto.seq_len, kto.gradient_checkpointing, kto.reference_model, kto.precision) == (
        8, 1024, "full", True, "bf16-mixed")
    reward = one_job(pod(["trl", "reward", "--model_name_or_path", M, "--per_device_train_batch_size", "4"])).spec
    assert (reward.task, reward.micro_batch_size, reward.seq_len, reward.reference_model) == (
        "seq-classification", 8, 1024, None)
    orpo = one_job(pod(["python", "examples/scripts/orpo.py", "--model_name_or_path", M,
                        "--per_device_train_batch_size", "4", "--max_length", "512"])).spec
    assert orpo.micro_batch_size == 8 and orpo.reference_model is None
    config = f"model_name_or_path: {M}\nstage: rm\nfinetuning_type: lora\nper_device_train_batch_size: 1\n"
    rm = one_job(pod(["bash", "-c", f"cat > /c.yaml <<EOF\n{config}EOF\nllamafactory-cli train /c.yaml"])).spec
    assert rm.micro_batch_size == 2


def test_ms_swift_sft_flags_and_defaults() -> None:
    """ms-swift's `swift sft`: --model (its --model_name is a display name; it was taken as the model and the job
    refused), --train_type (default lora) with --quant_bits 4 as QLoRA, --target_modules (default all-linear),
    checkpointing on by default, the model in --torch_dtype (default the checkpoint's, bf16) with the Trainer's bf16 to
    match. Its bnb.sh example (10 GB by its comment) read 30.3 GiB with the model annotated; now 10.7."""
    qlora = ["swift", "sft", "--model", "Qwen/Qwen2.5-7B-Instruct", "--train_type", "lora", "--quant_method", "bnb",
             "--quant_bits", "4", "--bnb_4bit_quant_type", "nf4", "--bnb_4bit_use_double_quant", "true",
             "--torch_dtype", "bfloat16", "--per_device_train_batch_size", "1", "--lora_rank", "8", "--lora_alpha",
             "32", "--target_modules", "all-linear", "--model_name", "swift-robot", "--max_length", "2048"]
    s = one_job(pod(qlora)).spec
    assert (s.model, s.method, s.resolved_quantization, s.precision, s.gradient_checkpointing) == (
        "Qwen/Qwen2.5-7B-Instruct", "qlora", "nf4-dq", "bf16-true", "full")
    assert s.lora is not None and s.lora.target_modules == "all-linear"
    default = one_job(pod(["swift", "sft", "--model", M, "--dataset", "x", "--deepspeed", "zero3"], gpus=8)).spec
    assert (default.method, default.sharding, default.precision) == ("lora", "zero3", "bf16-mixed")
    assert default.lora is not None and (default.lora.rank, default.lora.alpha) == (8, 32)


def test_review_fixes_for_trl_example_scripts_and_ms_swift_2x() -> None:
    """TRL's ORPO/CPO scripts keep TrainingArguments' batch 8 (pairs: 16 sequences; they had lost it when the scripts
    were first read as ORPO); the older examples/scripts/reward_modeling.py has no checkpointing or bf16 default (fp32
    without --bf16); ms-swift 2.x's --model_id_or_path, --batch_size, --lora_target_modules and --max_length -1;
    --train_type full with --quant_bits (which ms-swift refuses) is noted, not read as QLoRA."""
    orpo = one_job(pod(["python", "examples/scripts/orpo.py", "--model_name_or_path", M, "--do_train"])).spec
    assert (orpo.micro_batch_size, orpo.seq_len) == (16, 1024)
    old_reward = one_job(pod(["python", "examples/scripts/reward_modeling.py", "--model_name_or_path", M])).spec
    assert (old_reward.gradient_checkpointing, old_reward.precision, old_reward.micro_batch_size) == (
        "none", "32-true", 16)
    two = one_job(pod(["swift", "sft", "--model_type", "qwen2_5-7b-instruct", "--model_id_or_path",
                       "Qwen/Qwen2.5-7B-Instruct", "--sft_type", "lora", "--batch_size", "4",
                       "--lora_target_modules", "q_proj", "v_proj", "--max_length", "-1"]))
    assert (two.spec.micro_batch_size, two.spec.model) == (4, "Qwen/Qwen2.5-7B-Instruct")
    assert two.spec.lora is not None and two.spec.lora.target_modules == ["q_proj", "v_proj"]
    assert "no length limit" in notes_of(two)
    full = one_job(pod(["swift", "sft", "--model", M, "--train_type", "full", "--quant_bits", "4"]))
    assert full.spec.method == "full" and "refuses to train quantized weights" in notes_of(full)


def test_a_reference_model_loaded_beside_an_adapter_is_a_copy() -> None:
    """TRL's kto script and OpenRLHF's DPO load a reference model of their own even with a LoRA adapter: reference_model
    copy, which counts the base once more (PEFT's disabled-adapter reference holds none)."""
    kto = one_job(pod(["trl", "kto", "--model_name_or_path", M, "--use_peft", "--lora_r", "16"])).spec
    assert (kto.method, kto.reference_model) == ("lora", "copy")
    dpo = one_job(pod(["deepspeed", "--module", "openrlhf.cli.train_dpo", "--pretrain", M, "--lora_rank", "16"],
                      gpus=8)).spec
    assert (dpo.method, dpo.reference_model) == ("lora", "copy")
    trl_dpo = one_job(pod(["trl", "dpo", "--model_name_or_path", M, "--use_peft"])).spec
    assert trl_dpo.reference_model in (None, False)  # DPOTrainer with PEFT: the disabled adapter, no copy


def test_third_review_reward_models_task_scripts_optimizers_ppo_and_quantized_names() -> None:
    """axolotl reward_model: a one-label sequence classifier scoring pairs; transformers' run_glue / run_ner / run_mlm
    train their task's head; LLaMA-Factory's use_adam_mini / use_muon are noted (read as AdamW, not the Trainer's fused
    default); stage ppo trains on prompt + max_new_tokens (noted: the rollout is not counted); a GPTQ checkpoint's
    error names the quantization to annotate."""
    config = f"base_model: {M}\nreward_model: true\nmicro_batch_size: 2\nsequence_len: 1024\n"
    rm = one_job(pod(["bash", "-c", f"cat > /c.yml <<EOF\n{config}EOF\naxolotl train /c.yml"])).spec
    assert (rm.task, rm.micro_batch_size) == ("seq-classification", 4)
    for script, task in (("run_glue.py", "seq-classification"), ("run_ner.py", "token-classification"),
                         ("run_mlm.py", "masked-lm")):
        job = one_job(pod(["python", script, "--model_name_or_path", "bert-base-uncased", "--do_train"]))
        assert job.spec.task == task, script
    for key in ("use_adam_mini", "use_muon"):
        lf = f"model_name_or_path: {M}\nstage: sft\nfinetuning_type: full\n{key}: true\n"
        job = one_job(pod(["bash", "-c", f"cat > /c.yaml <<EOF\n{lf}EOF\nllamafactory-cli train /c.yaml"]))
        assert job.spec.optimizer == "adamw" and job.spec.fused_optimizer is not True and key in notes_of(job)
    ppo = f"model_name_or_path: {M}\nstage: ppo\nfinetuning_type: lora\ncutoff_len: 1024\nmax_new_tokens: 512\n"
    job = one_job(pod(["bash", "-c", f"cat > /c.yaml <<EOF\n{ppo}EOF\nllamafactory-cli train /c.yaml"]))
    assert job.spec.seq_len == 1536 and "rollout" in notes_of(job)
    outcomes = scan(pod(["python", "train.py", "--model_name_or_path", "org/Llama-3.1-8B-Instruct-GPTQ-INT4"]))
    assert any("quantization: gptq-int4" in str(o) for o in outcomes)


def test_open_instruct_deepspeed_chat_step2_and_trl_use_liger() -> None:
    """open-instruct's dpo_tune_cache.py forwards chosen and rejected together with its reference log-probs cached
    (read as one sequence before: 10.1 GiB where Tulu 3's 8B DPO needs 14.1); its reward_modeling.py is a one-label
    classifier over concatenated pairs at --max_token_length (26.0 -> 29.4 GiB, off the A100-40GB it was listed on);
    DeepSpeed-Chat's step 2 is a reward model and --offload puts parameters and optimizer on the CPU; TRL's older
    use_liger is the fused linear cross-entropy (open-r1's 32K-token recipe read 439 GiB, 58.2 now)."""
    dpo = one_job(pod(["accelerate", "launch", "open_instruct/dpo_tune_cache.py", "--model_name_or_path", M,
                       "--per_device_train_batch_size", "1", "--max_seq_length", "2048"])).spec
    assert (dpo.micro_batch_size, dpo.reference_model) == (2, False)
    rm = one_job(pod(["accelerate", "launch", "open_instruct/reward_modeling.py", "--model_name_or_path", M,
                      "--per_device_train_batch_size", "4", "--max_token_length", "4096"])).spec
    assert (rm.task, rm.micro_batch_size, rm.seq_len, rm.fused_optimizer) == ("seq-classification", 8, 4096, False)
    chat = ["deepspeed", "main.py", "--model_name_or_path", M, "--per_device_train_batch_size", "8",
            "--num_padding_at_beginning", "0", "--zero_stage", "3", "--deepspeed", "--offload"]
    step2 = one_job(pod(chat, gpus=8)).spec
    assert (step2.task, step2.micro_batch_size, step2.offload) == ("seq-classification", 16, "params+optimizer")
    liger = one_job(pod(["python", "train.py", "--model_name_or_path", M, "--use_liger", "true"])).spec
    assert liger.cross_entropy == "fused-linear"


def test_fms_fsdp_flags_and_defaults_are_read() -> None:
    """foundation-model-stack/fms-fsdp scripts/7b.sh: its --model_variant, --batch_size and --sharding_strategy and
    its config defaults (seq_length 4096, hsdp: FSDP within a node) were not read: refused, or with the model
    annotated 18.6 GiB for about 66 (fms_fsdp/config/training.py @ 6a9c379)."""
    from predictors.catalog import resolve_model

    args = ["torchrun", "--nnodes=4", "--nproc_per_node=8", "main_training.py", "--model_variant=7b",
            "--use_dummy_dataset=False", "--fsdp_activation_checkpointing=False", "--selective_checkpointing=1",
            "--sharding_strategy=hsdp", "--batch_size=2"]
    from tests.scheduler.spec.test_hybrid_sharding import pytorchjob

    s = one_job(*pytorchjob(args, workers=3, gpus=8)).spec  # 4 nodes of 8: HSDP shards within a node
    assert (s.model, s.micro_batch_size, s.seq_len, s.sharding, s.shard_group_size, s.precision) == (
        "llama-2-7b", 2, 4096, "fsdp", 8, "bf16-mixed")
    assert resolve_model(s).architecture.num_layers == 32
    ac = one_job(pod([*args[:6], "--fsdp_activation_checkpointing=True", "--selective_checkpointing=0.5",
                      "--sharding_strategy=fsdp", "--model_variant=llama3_8b"], gpus=8)).spec
    assert (ac.model, ac.gradient_checkpointing, ac.checkpoint_every_n_layers, ac.shard_group_size) == (
        "llama-3-8b", "full", 2, None)


def test_post_training_jobs_as_their_frameworks_run_them() -> None:
    """A review of 17 upstream post-training jobs (TRL, OpenRLHF, verl, LLaMA-Factory; session 30) found these read
    wrong. Each assertion failed before: TRL's ModelConfig LoRA defaults (16 / 32 / 0.05, not the spec's 8 / 16);
    TRL's example scripts under other names (gspo.py parses GRPOConfig: checkpointing on); a Hub kernel attention
    (refused outright); OpenRLHF's --backend fsdp2 (read as ZeRO-2) and --ds_tensor_parallel_size (ignored, and the
    accumulation halved); verl's fsdp_size (HSDP groups, read as one group over every GPU)."""
    peft = one_job(pod(["trl", "sft", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--dataset_name", "d",
                        "--use_peft", "--output_dir", "o"], gpus=1)).spec
    assert peft.lora is not None and (peft.lora.rank, peft.lora.alpha, peft.lora.dropout) == (16, 32, 0.05)
    gspo = one_job(pod(["accelerate", "launch", "examples/scripts/gspo.py", "--model_name_or_path", "Qwen/Qwen3-8B",
                        "--num_generations", "8", "--max_completion_length", "1024"], gpus=8)).spec
    assert gspo.gradient_checkpointing == "full"
    hub = one_job(pod(["accelerate", "launch", "examples/scripts/sft_gpt_oss.py", "--model_name_or_path",
                       "Qwen/Qwen3-8B", "--attn_implementation", "kernels-community/vllm-flash-attn3"], gpus=8)).spec
    assert hub.attention == "flash"
    assert one_job(pod(["python", "t.py", "--model_name_or_path", "Qwen/Qwen3-8B", "--attn_implementation",
                        "flex_attention"], gpus=1)).spec.attention == "flash"
    fsdp2 = one_job(pod(["torchrun", "--nproc_per_node=8", "-m", "openrlhf.cli.train_sft", "--backend", "fsdp2",
                         "--pretrain", "meta-llama/Meta-Llama-3-8B", "--max_len", "512", "--micro_train_batch_size",
                         "2"], gpus=8)).spec
    assert fsdp2.sharding == "fsdp"
    autotp = one_job(pod(["deepspeed", "--module", "openrlhf.cli.train_sft", "--pretrain", "meta-llama/Meta-Llama-3-8B",
                          "--max_len", "2048", "--micro_train_batch_size", "4", "--train_batch_size", "256",
                          "--zero_stage", "2", "--bf16", "--ds_tensor_parallel_size", "2"], gpus=8)).spec
    assert (autotp.tensor_parallel, autotp.sequence_parallel, autotp.grad_accum_steps) == (2, False, 16)
    verl = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo",
                        "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
                        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                        "actor_rollout_ref.actor.fsdp_config.fsdp_size=4", "trainer.n_gpus_per_node=8"], gpus=8)).spec
    assert (verl.sharding, verl.shard_group_size) == ("fsdp", 4)


def test_deepspeed_autotp_config_and_other_adapters() -> None:
    """A DeepSpeed config's ``tensor_parallel.autotp_size`` (LLaMA-Factory's ds_z2_autotp_config.json) splits the
    linears over that many GPUs; LLaMA-Factory's ``finetuning_type: oft`` (and PEFT's other adapters) freeze the base
    and are predicted as LoRA with a note: before, AutoTP was ignored and OFT read as a full fine-tune."""
    ds = json.dumps({"zero_optimization": {"stage": 2}, "tensor_parallel": {"autotp_size": 2},
                     "train_micro_batch_size_per_gpu": "auto"})
    job = one_job(pod(["llamafactory-cli", "train", "--model_name_or_path", "meta-llama/Meta-Llama-3-8B-Instruct",
                       "--stage", "sft", "--do_train", "--finetuning_type", "full", "--cutoff_len", "2048",
                       "--per_device_train_batch_size", "1", "--bf16", "--deepspeed", ds], gpus=8))
    assert (job.spec.sharding, job.spec.tensor_parallel, job.spec.sequence_parallel) == ("zero2", 2, False)
    oft = one_job(pod(["llamafactory-cli", "train", "--model_name_or_path", "meta-llama/Meta-Llama-3-8B-Instruct",
                       "--stage", "sft", "--do_train", "--finetuning_type", "oft", "--cutoff_len", "2048",
                       "--per_device_train_batch_size", "1", "--bf16"], gpus=1))
    assert oft.spec.method == "lora" and oft.spec.lora is not None and oft.spec.lora.target_modules == "all-linear"
    assert any("oft: an adapter the TrainingSpec cannot express" in a for a in oft.assumptions)


def test_verl_sft_trainer_is_read() -> None:
    """verl's SFT trainer (``-m verl.trainer.fsdp_sft_trainer``, Hydra overrides over sft_trainer.yaml): refused
    before ("no model found") whatever its overrides said; a checkpoint directory laid out as the Hub names it
    ($HOME/models/Qwen/Qwen2.5-7B-Instruct) is read as that catalog model, with a note."""
    job = one_job(pod(["torchrun", "--nnodes=1", "--nproc_per_node=8", "-m", "verl.trainer.fsdp_sft_trainer",
                       "data.max_length=16384", "data.train_batch_size=128", "data.micro_batch_size_per_gpu=16",
                       "model.partial_pretrain=/home/u/models/Qwen/Qwen2.5-7B-Instruct",
                       "ulysses_sequence_parallel_size=4", "use_remove_padding=true", "model.lora_rank=32"], gpus=8))
    s = job.spec
    assert (s.model, s.micro_batch_size, s.seq_len, s.sharding, s.context_parallel, s.grad_accum_steps) == (
        "Qwen/Qwen2.5-7B-Instruct", 16, 16384, "fsdp", 4, 4)
    assert (s.method, s.lora.rank, s.lora.alpha, s.lora.target_modules, s.gradient_checkpointing) == (
        "lora", 32, 16, "all-linear", "none")
    assert any("is a local path: read as the catalog model" in a for a in job.assumptions)
    defaults = one_job(pod(["torchrun", "-m", "verl.trainer.fsdp_sft_trainer",
                            "model.partial_pretrain=Qwen/Qwen2.5-0.5B-Instruct"], gpus=4)).spec
    assert (defaults.micro_batch_size, defaults.seq_len, defaults.grad_accum_steps) == (4, 1024, 16)
    # a local path whose last components name nothing in the catalog stays refused
    refused = scan(pod(["torchrun", "-m", "verl.trainer.fsdp_sft_trainer", "model.partial_pretrain=/ckpt/my-sft-run"],
                       gpus=4))
    assert any(isinstance(o, SpecError) and "which is a local path" in str(o) for o in refused)


def test_nemo2_recipes_are_read() -> None:
    """``nemo llm finetune|pretrain --factory NAME``: NeMo 2 builds the recipe in Python; vramfit reads its table of
    the recipes (scheduler/data/nemo2_recipes.yaml) and the command's overrides. Every such job was refused before
    ("no model found")."""
    lora = one_job(pod(["nemo", "llm", "finetune", "--factory", "llama3_8b", "trainer.devices=8",
                        "data.seq_length=4096", "-y"], gpus=8))
    s = lora.spec
    assert (s.model, s.method, s.framework, s.seq_len, s.micro_batch_size, s.grad_accum_steps) == (
        "meta-llama/Meta-Llama-3-8B", "lora", "megatron", 4096, 1, 16)
    assert s.lora is not None and (s.lora.rank, s.lora.alpha, len(s.lora.target_modules)) == (8, 16, 7)
    # the Llama LoRA recipes turn the distributed optimizer off: plain data parallel
    assert (s.sharding in (None, "ddp"), s.attention, s.fp32_gradients) == (True, "flash", True)
    full = one_job(pod(["nemo", "llm", "finetune", "--factory", "llama31_8b(peft_scheme='none', seq_length=8192)"],
                       gpus=8)).spec
    assert (full.method, full.tensor_parallel, full.sharding, full.seq_len, full.grad_accum_steps) == (
        "full", 2, "zero1", 8192, 32)
    packed = one_job(pod(["nemo", "llm", "finetune", "-f", "llama32_1b(packed_sequence=True)"], gpus=8)).spec
    assert (packed.seq_len, packed.grad_accum_steps) == (4096, 1)
    pretrain = one_job(pod(["nemo", "llm", "pretrain", "--factory", "qwen25_7b",
                            "trainer.strategy.tensor_model_parallel_size=4", "data.micro_batch_size=1"], gpus=8)).spec
    assert (pretrain.model, pretrain.method, pretrain.tensor_parallel, pretrain.seq_len, pretrain.micro_batch_size) == (
        "Qwen/Qwen2.5-7B", "full", 4, 4096, 1)
    dropped = one_job(pod(["nemo", "llm", "finetune", "-f", "mistral_7b", "peft=none"], gpus=8))
    assert dropped.spec.method == "full" and dropped.spec.tensor_parallel == 1
    assert any("peft=none: the adapter is dropped after the recipe" in a for a in dropped.assumptions)
    unknown = scan(pod(["nemo", "llm", "finetune", "--factory", "nemotron4_15b"], gpus=8))
    assert not any(isinstance(o, ParsedJob) for o in unknown)  # no model: refused, the note says why


def test_more_shipped_torchtune_configs_are_read() -> None:
    """torchtune's shipped configs beyond the first 38 (qwen3, qwen2_5, gemma, gemma2, phi3, phi4, llama2, llama3,
    llama3_3, mistral, code_llama2; session 30): read from the table, not by name only. Before, `tune run
    lora_finetune_distributed --config qwen3/8B_lora` was batch 1 without accumulation, LoRA on q and v only and the
    full loss (22.6 GiB where its own settings give 41.7); Phi-3 mini, Phi-4 and Code Llama 7B configs were refused
    (no catalog name for their models)."""
    qwen = one_job(pod(["tune", "run", "--nproc_per_node", "4", "lora_finetune_distributed", "--config",
                        "qwen3/8B_lora"], gpus=4)).spec
    assert (qwen.model, qwen.micro_batch_size, qwen.grad_accum_steps, qwen.cross_entropy) == ("qwen3-8b", 2, 8,
                                                                                               "chunked")
    assert qwen.lora is not None
    assert {"output_proj", "gate_proj", "up_proj", "down_proj"} <= set(qwen.lora.target_modules)
    gemma = one_job(pod(["tune", "run", "--nproc_per_node", "4", "lora_finetune_distributed", "--config",
                         "gemma2/27B_lora"], gpus=4)).spec
    assert (gemma.model, gemma.micro_batch_size, gemma.lora.rank, gemma.gradient_checkpointing) == (
        "gemma-2-27b", 4, 64, "full")
    for config, model in (("phi3/mini_lora_single_device", "phi-3-mini-4k-instruct"),
                          ("phi4/14B_lora_single_device", "phi-4"),
                          ("code_llama2/7B_lora_single_device", "codellama-7b")):
        assert one_job(pod(["tune", "run", "lora_finetune_single_device", "--config", config], gpus=1)).spec.model \
            == model


def test_awsome_distributed_training_fsdp_is_read() -> None:
    """aws-samples/awsome-distributed-training's FSDP train.py builds its model from flags (--model_type,
    --hidden_width, --num_layers, --num_heads, --num_key_value_heads, --intermediate_size, --vocab_size): every one
    of its PyTorchJobs was refused ("no model found"). Its data loader packs 4,096-token chunks whatever
    --max_context_width says (the positions only); checkpointing is on by default, --offload_activations moves the
    checkpoints to CPU memory."""
    args = ["torchrun", "--nproc_per_node=8", "--nnodes=2", "/fsdp/train.py", "--max_context_width=8192",
            "--num_key_value_heads=8", "--intermediate_size=14336", "--hidden_width=4096", "--num_layers=32",
            "--num_heads=32", "--model_type=llama_v3", "--tokenizer=hf-internal-testing/llama-tokenizer",
            "--train_batch_size=1", "--sharding_strategy=full", "--offload_activations=1"]
    job = one_job(pod(args, gpus=8))
    s = job.spec
    config = s.model.config if not isinstance(s.model, str) else {}
    assert (config["hidden_size"], config["num_key_value_heads"], config["intermediate_size"],
            config["vocab_size"], config["max_position_embeddings"]) == (4096, 8, 14336, 50432, 8192)
    assert (s.micro_batch_size, s.seq_len, s.sharding, s.gradient_checkpointing, s.activation_offloading,
            s.precision, s.grad_accum_steps) == (1, 4096, "fsdp", "full", True, "bf16-mixed", 1)
    assert any("the vocabulary is --vocab_size's" in a for a in job.assumptions)
    hybrid = one_job(pod([*args[:4], "--model_type=gpt_neox", "--hidden_width=2048", "--num_layers=24",
                          "--num_heads=16", "--sharding_strategy=hybrid", "--activation_checkpointing=0"], gpus=8)).spec
    # HYBRID_SHARD shards within a node: on one 8-GPU pod that is every GPU, as full sharding
    assert (hybrid.sharding, hybrid.gradient_checkpointing, hybrid.model.config["model_type"]) == (
        "fsdp", "none", "gpt_neox")


def test_ray_template_deepspeed_config_and_workers_without_the_files() -> None:
    """Ray's LLM template without its config files in the manifest (they live in its working_dir): --ds-config (and
    its default ./deepspeed_configs/zero_3_llama_2_7b.json when not given) is DeepSpeed ZeRO-3, the 13B/70B configs as
    the template ships them (CPU offload); -nd / --num-devices is the Ray Train worker count. Before, an uncarried
    --ds-config was dropped without a note (plain data parallel), and -nd was ignored: a submission with no GPU
    count was predicted for one GPU, a 16-GPU cluster running 8 workers for 16."""
    base = ["python", "finetune_hf_llm.py", "--model_name", M, "-bs", "8"]
    default = one_job(pod([*base, "-nd", "8"], gpus=16))
    assert (default.spec.sharding, default.spec.training_gpus, default.spec.gpus) == ("zero3", 8, 16)
    shipped = one_job(pod([*base, "--ds-config", "./deepspeed_configs/zero_3_llama_2_13b.json"], gpus=8)).spec
    assert (shipped.sharding, shipped.offload) == ("zero3", "params+optimizer")
    submission = one_job({"entrypoint": "python finetune_hf_llm.py -bs 8 -nd 16 --model_name " + M})
    assert submission.spec.gpus == 16


def test_an_assignment_ended_by_a_semicolon() -> None:
    """`SIZE=13b;` on a line of its own assigns 13b: the `;` ends the command. It was kept in the value, and the
    model read as meta-llama/Llama-2-13b;-hf (refused)."""
    script = 'SIZE=13b;\npython finetune_hf_llm.py -bs 16 --model_name "meta-llama/Llama-2-${SIZE}-hf"'
    assert one_job(pod(["bash", "-c", script], gpus=8)).spec.model == "meta-llama/Llama-2-13b-hf"


def test_a_scripts_own_batch_and_length_flags_are_named_when_unread() -> None:
    """`python train.py --batch_size 4 --seq_length 1024` (Ray Train's DeepSpeed example and many team scripts):
    flags whose meaning only the script knows are not read, but said so, where the assumption used to claim that
    the job does not say."""
    job = one_job(pod(["python", "train.py", "--model_name", M, "--batch_size", "4", "--seq_length", "1024"], gpus=1))
    assert job.spec.micro_batch_size == 1
    assert any("flag --batch_size 4 not read as micro_batch_size" in a for a in job.assumptions)
    assert any("flag --seq_length 1024 not read as seq_len" in a for a in job.assumptions)


def test_unreadable_nemo2_and_verl_sft_values_are_said() -> None:
    """A NeMo 2 override or factory argument, or a verl SFT override, that is not a positive whole number is ignored
    with a note naming it (they were ignored silently: the recipe's or the default value stood in unsaid)."""
    nemo = one_job(pod(["nemo", "llm", "finetune", "--factory", "llama3_8b(seq_length=x)", "data.micro_batch_size=-2"],
                       gpus=8))
    assert nemo.spec.seq_len == 2048 and nemo.spec.micro_batch_size == 1
    assert any("factory argument seq_length=x is not a positive whole number" in a for a in nemo.assumptions)
    assert any("override data.micro_batch_size=-2 is not a positive whole number" in a for a in nemo.assumptions)
    verl = one_job(pod(["torchrun", "-m", "verl.trainer.fsdp_sft_trainer", "model.partial_pretrain=" + M,
                        "data.max_length=abc", "model.lora_rank=-3"], gpus=8))
    assert verl.spec.method == "full"
    assert any("data.max_length=abc: not a positive whole number" in a for a in verl.assumptions)
    assert any("model.lora_rank=-3: not a positive whole number" in a for a in verl.assumptions)


_LLMFORGE = """model_id: meta-llama/Meta-Llama-3-8B-Instruct
train_path: s3://air-example-data/gsm8k/train.jsonl
context_length: 512
num_devices: 4
train_batch_size_per_device: 2
gradient_accumulation_steps: 2
padding: "longest"
deepspeed:
  config_path: deepspeed_configs/zero_2.json
worker_resources:
  anyscale/accelerator_shape:4xA10G: 0.001
liger_kernel:
  enabled: True
  kwargs: {rms_norm: True, cross_entropy: True, fused_linear_cross_entropy: False}
lora_config:
  r: 8
  lora_alpha: 16
  target_modules: [q_proj, v_proj, k_proj, o_proj, gate_proj, up_proj, down_proj]
"""


def _llmforge_job(config: str, gpus: int = 4) -> ParsedJob:
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"job.yaml": config}}
    return one_job(configmap, pod(["llmforge", "anyscale", "finetune", "/cfg/job.yaml"], gpus=gpus))


def test_anyscale_llmforge_config() -> None:
    """Anyscale's LLMForge (`llmforge anyscale finetune CONFIG`, the fine-tune-llm_v2 template): model_id,
    train_batch_size_per_device, context_length, gradient_accumulation_steps, lora_config, the DeepSpeed config it
    names (the template's shipped zero_2.json / zero_3_hpz.json when not carried), activation checkpointing on unless
    no_gradient_checkpoint, FlashAttention-2 by default, the workers' accelerator, num_devices as the Ray Train
    workers. Every such job was refused before (no model found)."""
    job = _llmforge_job(_LLMFORGE)
    s = job.spec
    assert (s.model, s.method, s.micro_batch_size, s.seq_len, s.grad_accum_steps) == (
        "meta-llama/Meta-Llama-3-8B-Instruct", "lora", 2, 512, 2)
    assert (s.gradient_checkpointing, s.attention, s.sharding, s.precision, s.gpu) == (
        "full", "flash", "zero2", "bf16-mixed", "A10G")
    assert s.lora is not None and s.lora.rank == 8 and s.cross_entropy is None  # Liger's loss, not the fused one
    assert "LLMForge config /cfg/job.yaml key train_batch_size_per_device" in job.provenance["micro_batch_size"]
    full = _llmforge_job(_LLMFORGE.replace("meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-70B")
                         .replace("zero_2.json", "zero_3_hpz.json").replace("num_devices: 4", "num_devices: 16")
                         .split("lora_config:")[0] + "no_gradient_checkpoint: true\n", gpus=16).spec
    assert (full.method, full.sharding, full.secondary_shard_size, full.gradient_checkpointing, full.gpus) == (
        "full", "zero3", 8, "none", 16)
    fused = _llmforge_job(_LLMFORGE.replace("cross_entropy: True, fused_linear_cross_entropy: False", "rope: True"))
    assert fused.spec.cross_entropy == "fused-linear"  # Liger's default when the plain loss is not asked for
    silent = _llmforge_job("model_id: meta-llama/Meta-Llama-3-8B-Instruct\ntrain_path: s3://x/train.jsonl\n"
                           "num_devices: 8\n", gpus=8)
    assert any("no train_batch_size_per_device" in a for a in silent.assumptions)
    assert any("no context_length" in a for a in silent.assumptions)


def test_llmforge_preference_tuning_keeps_the_reference_off_the_training_gpus() -> None:
    """LLMForge's DPO (task: preference_tuning): chosen and rejected forwarded together; the reference model's
    log-probabilities come from separate Ray Data workers, so no reference model on the training GPUs."""
    config = _LLMFORGE.split("lora_config:")[0] + "task: preference_tuning\npreference_tuning_config: {beta: 0.01}\n"
    s = _llmforge_job(config).spec
    assert (s.micro_batch_size, s.reference_model, s.method) == (4, False, "full")


_RAY_TRAIN_SCRIPT = '''import argparse
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

def main(args):
    ds_config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": args.zero_stage, "overlap_comm": True},
    }
    trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=4, use_gpu=True),
                           train_loop_config={"ds_config": ds_config})
    trainer.fit()

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name", type=str, default="Qwen/Qwen2.5-7B")
    parser.add_argument("--batch_size", type=int, default=2)
    parser.add_argument("--seq_length", type=int, default=512)
    parser.add_argument("--zero_stage", type=int, default=3)
    main(parser.parse_args())
'''


def _ray_job(entrypoint: str, script: str, workers: int = 8) -> ParsedJob:
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "code"}, "data": {"train.py": script}}
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rt"}, "spec": {
        "entrypoint": entrypoint,
        "rayClusterSpec": {
            "headGroupSpec": {"rayStartParams": {},
                              "template": {"spec": {"containers": [{"name": "head", "image": "i"}]}}},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers, "rayStartParams": {}, "template": {"spec": {
                "containers": [{"name": "w", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}]}}}
    return one_job(configmap, rayjob)


def test_a_carried_ray_train_script_is_read_for_its_defaults_deepspeed_dict_and_workers() -> None:
    """A Ray Train entry point the manifest carries (`python train.py`): its argparse defaults stand in for flags the
    command does not pass, its DeepSpeed dict (args.NAME resolved) sets the micro-batch and the stage, and
    ScalingConfig(num_workers=4, use_gpu=True) the GPUs that train. It was refused (no model found), though every
    fact is in the script; the script is parsed, never run."""
    job = _ray_job("python /home/ray/app/train.py", _RAY_TRAIN_SCRIPT)
    s = job.spec
    assert (s.model, s.micro_batch_size, s.sharding, s.precision, s.training_gpus, s.gpus) == (
        "Qwen/Qwen2.5-7B", 2, "zero3", "bf16-mixed", 4, 8)
    assert job.provenance["model"] == "train.py default --model_name"
    assert any("train.py default --seq_length 512 not read as seq_len" in a for a in job.assumptions)
    flags = _ray_job("python /home/ray/app/train.py --batch_size 8 --zero_stage 2 --model_name " + M,
                     _RAY_TRAIN_SCRIPT).spec
    assert (flags.model, flags.micro_batch_size, flags.sharding) == (M, 8, "zero2")  # the command's flags win
    literal = _ray_job("python /home/ray/app/train.py", 'from transformers import AutoModelForCausalLM\n'
                       f'model = AutoModelForCausalLM.from_pretrained("{M}")\n')
    assert literal.spec.model == M and literal.provenance["model"] == "train.py from_pretrained"
    with_error = scan({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "code"},
                       "data": {"train.py": "def broken(:\n"}},
                      {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{
                          "name": "m", "image": "i", "command": ["python", "train.py"],
                          "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})
    assert not any(isinstance(o, ParsedJob) for o in with_error)  # no model anywhere: a clear refusal, no crash


def test_llamafactory_on_ray_trains_on_ray_num_workers() -> None:
    """USE_RAY=1 llamafactory-cli train: LLaMA-Factory runs Ray Train with ray_num_workers workers (default 1), one
    GPU each. On an 8-GPU cluster with ray_num_workers 4 it was predicted for 8 GPUs, without a note."""
    config = f"model_name_or_path: {M}\nstage: sft\nfinetuning_type: lora\nray_num_workers: 4\n"
    script = f"cat > /c.yaml <<EOF\n{config}EOF\nUSE_RAY=1 llamafactory-cli train /c.yaml"
    s = one_job(pod(["bash", "-c", script], gpus=8)).spec
    assert (s.gpus, s.training_gpus) == (8, 4)
    plain = one_job(pod(["bash", "-c", script.replace("USE_RAY=1 ", "")], gpus=8)).spec
    assert plain.training_gpus is None


def test_bash_parameter_expansions_with_patterns() -> None:
    """`${VAR##*/}`, `${VAR%/*}`, `${VAR/from/to}`, `${#VAR}`, `${VAR,,}`, `${VAR:0:5}`: bash's parameter expansions
    with literal operands are evaluated (scripts name the model from a path: `NAME=${MODEL_PATH##*/}`); they stayed
    as written, and a model built from one was refused."""
    script = ('MODEL_PATH=/mnt/models/meta-llama/Llama-2-7b-hf\nORG_MODEL=${MODEL_PATH#/mnt/models/}\n'
              'ROOT=${MODEL_PATH%/*}\nNAME=${MODEL_PATH##*/}\nSHORT=${NAME:0:7}\nLOWER=${NAME,,}\n'
              'python train.py --model_name_or_path "$ORG_MODEL" --output_dir "${ROOT}/${SHORT}-${LOWER/-hf/}-${#NAME}"'
              ' --per_device_train_batch_size 2')
    job = one_job(pod(["bash", "-c", script], gpus=1))
    assert job.spec.model == M
    expanded = split_script(["bash", "-c", script], {}, TextBudget(), "w", {}).commands[-1]
    assert expanded[expanded.index("--output_dir") + 1] == "/mnt/models/meta-llama/Llama-2-llama-2-7b-13"
    unset = split_script(["bash", "-c", "python t.py --a ${NOPE##*/} --b ${X/*/y}"], {"X": "v"}, TextBudget(), "w",
                         {}).commands[-1]
    assert unset[3:] == ["${NOPE##*/}", "--b", "${X/*/y}"]  # unset, or a glob replacement: left as written


def test_skyrl_grpo_overrides_and_defaults() -> None:
    """SkyRL (`python -m skyrl_train.entrypoints.main_base key=value ...`, its ppo_base_config.yaml defaults): the
    policy model, prompt + generated length, the per-GPU micro-batch, FSDP2 with checkpointing and flash attention,
    policy_num_nodes x policy_num_gpus_per_node as the training GPUs, LoRA when lora.rank > 0; the KL reference in
    host memory unless its cpu_offload is off. Every SkyRL job was refused before (no model found)."""
    base = ["uv", "run", "--isolated", "--extra", "vllm", "--", "python", "-m", "skyrl_train.entrypoints.main_base",
            "trainer.policy.model.path=Qwen/Qwen2.5-1.5B-Instruct", "trainer.micro_train_batch_size_per_gpu=4",
            "trainer.max_prompt_length=512", "generator.sampling_params.max_generate_length=1024",
            "trainer.placement.policy_num_gpus_per_node=4"]
    job = one_job(pod(base, gpus=8))
    s = job.spec
    assert (s.model, s.micro_batch_size, s.seq_len, s.sharding, s.gradient_checkpointing, s.attention) == (
        "Qwen/Qwen2.5-1.5B-Instruct", 4, 1536, "fsdp", "full", "flash")
    assert (s.training_gpus, s.reference_model, s.precision, s.method) == (4, None, "bf16-mixed", "full")
    assert any("reference model's parameters live in host memory" in a for a in job.assumptions)
    lora = one_job(pod([*base, "trainer.policy.model.lora.rank=32", "trainer.policy.model.lora.alpha=64",
                        "trainer.ref.fsdp_config.cpu_offload=false", "trainer.policy.fsdp_config.cpu_offload=true"],
                       gpus=4)).spec
    assert (lora.method, lora.reference_model, lora.offload) == ("lora", True, "params+optimizer")
    assert lora.lora is not None and (lora.lora.rank, lora.lora.alpha, lora.lora.target_modules) == (
        32, 64, "all-linear")


def test_sequence_parallel_sizes_are_context_parallel() -> None:
    """ms-swift's --sequence_parallel_size (Ulysses or ring attention) and OpenRLHF's --ring_attn_size split each
    sequence over that many GPUs. ms-swift's 256K-token LoRA example on 4 GPUs was predicted with whole sequences per
    GPU (176.6 GiB; 47.3 now against the 42 GiB its header states)."""
    swift = ["swift", "sft", "--model", "Qwen/Qwen2.5-7B-Instruct", "--train_type", "lora", "--max_length", "256000",
             "--packing", "true", "--use_liger_kernel", "true", "--deepspeed", "zero3_offload",
             "--attn_impl", "flash_attn", "--sequence_parallel_size", "4"]
    assert one_job(pod(swift, gpus=4)).spec.context_parallel == 4
    openrlhf = ["deepspeed", "--module", "openrlhf.cli.train_sft", "--pretrain", M, "--max_len", "32768",
                "--zero_stage", "3", "--bf16", "--flash_attn", "--ring_attn_size", "2"]
    assert one_job(pod(openrlhf, gpus=8)).spec.context_parallel == 2


# --- a review of 15 community jobs (session 31): scripts copied from Alpaca, Qwen, LongLoRA, alpaca-lora, ... -------


def test_scripts_own_lora_switches_with_their_defaults() -> None:
    """`--use_lora True` (Qwen's finetune.py: r 64 / alpha 16 / dropout 0.05 on the seven projections; open-instruct's:
    r 64 / alpha 16 / dropout 0.1) and LongLoRA's `--low_rank_training True` (r 8 / alpha 16 / dropout 0 on q, k, v,
    o, the embeddings trained, checkpointing in the script) were never read: full fine-tunes, "the job does not say"
    (147.9 GiB for Qwen2-7B on 4 GPUs, 36.2 GiB now; LongLoRA 259 -> 47.4 GiB)."""
    qwen = one_job(pod(["torchrun", "--nproc_per_node", "4", "finetune.py", "--model_name_or_path", "Qwen/Qwen2-7B",
                        "--bf16", "True", "--per_device_train_batch_size", "2", "--model_max_length", "512",
                        "--use_lora", "True", "--gradient_checkpointing"], gpus=4)).spec
    assert qwen.method == "lora" and qwen.lora is not None
    assert (qwen.lora.rank, qwen.lora.alpha, qwen.lora.dropout, len(qwen.lora.target_modules)) == (64, 16, 0.05, 7)
    qlora = one_job(pod(["python", "finetune.py", "--model_name_or_path", "Qwen/Qwen2-7B", "--model_max_length", "512",
                         "--use_lora", "True", "--q_lora", "True"])).spec
    assert qlora.method == "qlora"
    instruct = one_job(pod(["accelerate", "launch", "open_instruct/finetune.py", "--model_name_or_path", M,
                            "--use_lora", "--max_seq_length", "4096"], gpus=8)).spec
    assert instruct.lora is not None and (instruct.lora.rank, instruct.lora.dropout) == (64, 0.1)
    longlora = one_job(pod(["torchrun", "--nproc_per_node=8", "supervised-fine-tune.py", "--model_name_or_path", M,
                            "--bf16", "True", "--model_max_length", "16384", "--low_rank_training", "True",
                            "--per_device_train_batch_size", "1"], gpus=8)).spec
    assert longlora.lora is not None and (longlora.lora.rank, longlora.lora.alpha, longlora.lora.dropout) == (8, 16, 0)
    assert (longlora.lora.modules_to_save, longlora.gradient_checkpointing) == (["embed_tokens"], "full")
    other = one_job(pod(["python", "train_sft.py", "--model_name_or_path", M, "--use_lora", "true"]))
    assert other.spec.method == "lora"
    assert any("--use_lora" in a and "rank and targets unknown" in a for a in other.assumptions)
    off = one_job(pod(["python", "finetune.py", "--model_name_or_path", M, "--model_max_length", "512",
                       "--use_lora", "False"])).spec
    assert off.method == "full"


def test_alpaca_lora_finetune_hard_coded_settings() -> None:
    """tloen/alpaca-lora's finetune.py (forked widely): LoRA over an 8-bit base, checkpointing through PEFT's
    prepare_model_for_int8_training, fp16, accumulation batch_size (128) / micro_batch_size. It was LoRA over a bf16
    base without checkpointing: 92.2 GiB, "does not fit an A100-80GB", for a job that runs in 17.5."""
    job = one_job(pod(["python", "finetune.py", "--base_model=" + M, "--data_path=data.json", "--cutoff_len=512",
                       "--lora_target_modules=[q_proj,k_proj,v_proj,o_proj]", "--lora_r=16",
                       "--micro_batch_size=16"]))
    s = job.spec
    assert (s.method, s.quantization, s.precision, s.gradient_checkpointing) == ("qlora", "int8", "16-mixed", "full")
    assert (s.micro_batch_size, s.seq_len, s.grad_accum_steps) == (16, 512, 8)
    assert s.lora is not None and (s.lora.rank, len(s.lora.target_modules)) == (16, 4)


def test_lora_targets_from_trainable_and_target_modules_keys() -> None:
    """Chinese-LLaMA-Alpaca's `--trainable q_proj,...` and a trainer YAML's PEFT key `target_modules:` name the LoRA
    targets; both fell back to [q_proj, v_proj], "the job does not say"."""
    cla = one_job(pod(["torchrun", "run_clm_sft_with_peft.py", "--model_name_or_path", M, "--lora_rank", "64",
                       "--trainable", "q_proj,v_proj,k_proj,o_proj,gate_proj,down_proj,up_proj"])).spec
    assert cla.lora is not None and len(cla.lora.target_modules) == 7
    config = (f"model_name_or_path: {M}\nlora_r: 16\nlora_alpha: 32\ntarget_modules: all-linear\nbf16: true\n"
              "per_device_train_batch_size: 2\nmax_seq_length: 8192\n")
    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"sft.yaml": config}}
    yaml_job = one_job(cfg, pod(["accelerate", "launch", "run_sft.py", "--config", "/cfg/sft.yaml"], gpus=4)).spec
    assert yaml_job.lora is not None and yaml_job.lora.target_modules == "all-linear"


def test_alpaca_lineage_scripts_run_the_foreach_adamw() -> None:
    """Stanford Alpaca's train.py subclasses TrainingArguments with `optim: str = field(default="adamw_torch")` and
    `model_max_length`; FastChat, LLaVA, LongLoRA and Qwen's finetune.py keep both: with --model_max_length and no
    --optim the foreach AdamW runs, not the Trainer's fused default (FastChat's 13B FSDP recipe: 28.2 GiB as read
    before, 35.0 GiB as run)."""
    base = ["torchrun", "--nproc_per_node=8", "fastchat/train/train_mem.py", "--model_name_or_path", M, "--bf16",
            "True", "--per_device_train_batch_size", "1", "--fsdp", "full_shard auto_wrap", "--gradient_checkpointing",
            "True"]
    assert one_job(pod([*base, "--model_max_length", "2048"], gpus=8)).spec.fused_optimizer is False
    assert one_job(pod([*base, "--model_max_length", "2048", "--optim", "adamw_torch_fused"],
                       gpus=8)).spec.fused_optimizer is True
    assert one_job(pod([*base, "--max_seq_length", "2048"], gpus=8)).spec.fused_optimizer is True


def test_no_offload_config_names_and_srun_scripts() -> None:
    """`ds_zero2_no_offload.json` (Chinese-LLaMA-Alpaca's name, copied by many forks) is ZeRO-2 without offload (it
    was read as CPU offload: 30 % under for a full fine-tune); `srun scripts/train.sh` runs the carried script as
    `bash scripts/train.sh` does (it was not followed: "no model found")."""
    ds = one_job(pod(["torchrun", "train.py", "--model_name_or_path", M, "--deepspeed", "ds_zero2_no_offload.json",
                      "--bf16"], gpus=8)).spec
    assert (ds.sharding, ds.offload) == ("zero2", "none")
    script = ("#!/bin/bash\ntorchrun --nproc_per_node=8 train.py --model_name_or_path " + M +
              " --bf16 True --per_device_train_batch_size 4 --model_max_length 2048 --fsdp 'full_shard auto_wrap'\n")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "scripts"}, "data": {"train.sh": script}}
    job = pod(["bash", "-c", "export MASTER_PORT=20001\nsrun -N 2 --ntasks-per-node=1 scripts/train.sh\n"], gpus=8)
    s = one_job(cm, job).spec
    assert (s.model, s.micro_batch_size, s.seq_len, s.sharding) == (M, 4, 2048, "fsdp")


def test_envfrom_configmap_variables_expand_in_args() -> None:
    """Kubernetes expands `$(VAR)` in command and args from the whole environment, envFrom ConfigMaps included (a
    team's LLaMA-Factory template passes every argument so); only `env:` was read, and the job was refused with
    `$(BASE_MODEL)` as its model, the annotation unable to rescue its unexpanded numbers."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "llm-config"},
          "data": {"BASE_MODEL": M, "LORA_RANK": "8", "BATCH_SIZE": "2", "CUTOFF_LEN": "2048"}}
    job = pod(["llamafactory-cli", "train", "--stage", "sft", "--model_name_or_path", "$(BASE_MODEL)",
               "--finetuning_type", "lora", "--lora_rank", "$(LORA_RANK)", "--per_device_train_batch_size",
               "$(BATCH_SIZE)", "--cutoff_len", "$(CUTOFF_LEN)", "--fp16"])
    job["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "llm-config"}}]
    s = one_job(cm, job).spec
    assert (s.model, s.micro_batch_size, s.seq_len) == (M, 2, 2048) and s.lora is not None and s.lora.rank == 8
    keyed = pod(["python", "train.py", "--model_name_or_path", "$(MODEL)", "--per_device_train_batch_size", "4"])
    keyed["spec"]["containers"][0]["env"] = [{"name": "MODEL", "valueFrom": {"configMapKeyRef": {
        "name": "llm-config", "key": "BASE_MODEL"}}}]
    assert one_job(cm, keyed).spec.model == M


def test_an_argument_loop_that_never_runs_sets_nothing() -> None:
    """Qwen's finetune.sh parses `-m MODEL --deepspeed CONFIG` in a `while [[ "$1" != "" ]]; do case $1 in ...`
    loop; run without arguments the loop never runs, but its `MODEL=$1` arms were applied line by line (the model
    read as '$1' and the DeepSpeed config lost). Helper scripts after the training command (alpaca-lora's
    export_checkpoint.py) no longer replace the training command's settings."""
    script = (f'MODEL="{M}"\nDS_CONFIG_PATH="ds_config_zero3.json"\nwhile [[ "$1" != "" ]]; do\n    case $1 in\n'
              '        -m | --model )\n            shift\n            MODEL=$1\n            ;;\n'
              '        --deepspeed )\n            shift\n            DS_CONFIG_PATH=$1\n            ;;\n    esac\n'
              '    shift\ndone\ntorchrun --nproc_per_node 4 finetune.py --model_name_or_path $MODEL --bf16 True '
              '--per_device_train_batch_size 2 --model_max_length 512 --deepspeed ${DS_CONFIG_PATH}\n')
    s = one_job(pod(["bash", "-c", script], gpus=4)).spec
    assert (s.model, s.sharding) == (M, "zero3")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s"}, "data": {"finetune.sh": script}}
    assert one_job(cm, pod(["bash", "/work/finetune.sh"], gpus=4)).spec.model == M
    export = ("python finetune.py --base_model=" + M + " --cutoff_len=512 --micro_batch_size=16\n"
              "python export_checkpoint.py --base_model=" + M + " --lora_target_modules='[q_proj,v_proj]'\n")
    assert one_job(pod(["bash", "-c", export])).spec.quantization == "int8"


_UNSLOTH_NOTEBOOK = '''from unsloth import FastLanguageModel, is_bfloat16_supported
from trl import SFTTrainer
from transformers import TrainingArguments
max_seq_length = 2048
model, tokenizer = FastLanguageModel.from_pretrained(
    model_name = "unsloth/Meta-Llama-3.1-8B-bnb-4bit", max_seq_length = max_seq_length, dtype = None)
model = FastLanguageModel.get_peft_model(model, r = 32, lora_alpha = 16, random_state = 3407)
trainer = SFTTrainer(model = model, tokenizer = tokenizer, train_dataset = dataset, dataset_text_field = "text",
    max_seq_length = max_seq_length, packing = False,
    args = TrainingArguments(per_device_train_batch_size = 2, gradient_accumulation_steps = 4, max_steps = 60,
        fp16 = not is_bfloat16_supported(), bf16 = is_bfloat16_supported(), optim = "adamw_8bit", output_dir = "o"))
trainer.train()
'''

_TEAM_SCRIPT = '''import argparse, torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, TrainingArguments, Trainer
from peft import LoraConfig, get_peft_model
MODEL = "mistralai/Mistral-7B-v0.1"
p = argparse.ArgumentParser()
p.add_argument("--use_lora", action="store_true")
p.add_argument("--rank", type=int, default=32)
p.add_argument("--batch", type=int, default=4)
args = p.parse_args()
model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
model.gradient_checkpointing_enable()
if args.use_lora:
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=False)
    model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=64, target_modules=["q_proj", "v_proj"]))
targs = TrainingArguments(output_dir="/out", per_device_train_batch_size=args.batch, bf16=True, optim="adamw_torch")
Trainer(model=model, args=targs).train()
'''


def _script_pod(script: str, argv: list[str]) -> ParsedJob:
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "code"}, "data": {"train.py": script}}
    return one_job(configmap, pod(argv))


def test_a_carried_scripts_training_calls_are_read() -> None:
    """Unsloth's notebooks exported as scripts and team scripts keep every setting in calls: FastLanguageModel's
    from_pretrained (4-bit by default) and get_peft_model (its defaults: the seven projections, Unsloth's offloaded
    checkpointing), TrainingArguments(...), SFTTrainer(max_seq_length=...), LoraConfig(...), BitsAndBytesConfig(...),
    gradient_checkpointing_enable(). They were read as nothing: the notebook was refused (its model a bnb-4bit
    re-upload) and the team script was a full fine-tune at batch 1."""
    s = _script_pod(_UNSLOTH_NOTEBOOK, ["python", "train.py"]).spec
    assert (s.model, s.method, s.micro_batch_size, s.grad_accum_steps, s.optimizer, s.precision) == (
        "unsloth/Meta-Llama-3.1-8B", "qlora", 2, 4, "adamw-8bit", "bf16-mixed")
    assert s.lora is not None and (s.lora.rank, s.lora.alpha, s.lora.dropout, len(s.lora.target_modules)) == (
        32, 16, 0.0, 7)
    assert (s.seq_len, s.sequence_lengths, s.gradient_checkpointing, s.activation_offloading) == (
        2048, "variable", "full", True)
    plain = _script_pod(_TEAM_SCRIPT, ["python", "train.py"])
    assert (plain.spec.method, plain.spec.micro_batch_size, plain.spec.gradient_checkpointing) == ("full", 4, "full")
    assert plain.provenance["gradient_checkpointing"] == "train.py model.gradient_checkpointing_enable()"
    lora = _script_pod(_TEAM_SCRIPT, ["python", "train.py", "--use_lora", "--batch", "8"])  # the `if` now runs
    assert (lora.spec.method, lora.spec.quantization, lora.spec.micro_batch_size) == ("qlora", "nf4", 8)
    assert lora.spec.lora is not None and (lora.spec.lora.rank, lora.spec.lora.target_modules) == (32, ["q_proj",
                                                                                                       "v_proj"])
    assert lora.provenance["micro_batch_size"] == "train.py TrainingArguments(per_device_train_batch_size=args.batch)"


@pytest.mark.parametrize("argv", [
    ["bash", "-c", "pip install unsloth\npython - <<'PY'\n" + _UNSLOTH_NOTEBOOK + "PY\n"],
    ["python3", "-c", _UNSLOTH_NOTEBOOK],
])
def test_python_code_given_inline_is_read_as_a_script(argv: list[str]) -> None:
    """``python - <<'PY'`` (the code on standard input) and ``python -c CODE``: notebooks pasted into a Job. The code
    was not read, and the job was refused for naming no model."""
    job = one_job(pod(argv))
    assert (job.spec.model, job.spec.method, job.spec.micro_batch_size) == ("unsloth/Meta-Llama-3.1-8B", "qlora", 2)
    assert job.provenance["micro_batch_size"] == "inline-python.py TrainingArguments(per_device_train_batch_size=2)"


_FIREFLY_QLORA = {  # Firefly's train_args/sft/qlora/qwen2.5-7b-sft-qlora.json (no train_mode: its default qlora)
    "output_dir": "output/firefly-qwen2.5-7b-sft-qlora", "model_name_or_path": "Qwen/Qwen2.5-7B-Instruct",
    "train_file": "./data/dummy_data.jsonl", "template_name": "qwen", "num_train_epochs": 1,
    "per_device_train_batch_size": 1, "gradient_accumulation_steps": 16, "learning_rate": 2e-4,
    "max_seq_length": 1024, "lora_rank": 64, "lora_alpha": 16, "lora_dropout": 0.05, "use_unsloth": False,
    "gradient_checkpointing": True, "optim": "paged_adamw_32bit", "seed": 42, "fp16": True}


@pytest.mark.parametrize(("mode", "method"), [(None, "qlora"), ("lora", "lora"), ("full", "full")])
def test_firefly_train_mode(mode: str | None, method: str) -> None:
    """Firefly's ``train.py --train_args_file CONFIG.json``: ``train_mode`` (default qlora, which its shipped qlora
    configs leave out), adapters on every linear but the head, the model loaded in the compute dtype. Read before as
    LoRA of rank 64 on q and v over a 16-bit base, whatever train_mode said."""
    config = {**_FIREFLY_QLORA, **({"train_mode": mode} if mode else {})}
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "args"},
                 "data": {"qwen2.5-7b-sft-qlora.json": json.dumps(config)}}
    job = one_job(configmap, pod(["torchrun", "--nproc_per_node", "1", "train.py", "--train_args_file",
                                  "train_args/sft/qlora/qwen2.5-7b-sft-qlora.json"]))
    s = job.spec
    assert (s.method, s.precision, s.seq_len, s.micro_batch_size) == (method, "16-true", 1024, 1)
    if method != "full":
        assert s.lora is not None and (s.lora.rank, s.lora.target_modules) == (64, "all-linear")
    assert s.resolved_quantization == ("nf4-dq" if method == "qlora" else None)


_GLM_LORA = {  # THUDM/GLM-4 finetune_demo/configs/lora.yaml (comments left out)
    "data_config": {"train_file": "train.jsonl", "val_file": "dev.jsonl", "test_file": "dev.jsonl", "num_proc": 1},
    "max_input_length": 512, "max_output_length": 512,
    "training_args": {"output_dir": "./output", "max_steps": 3000, "learning_rate": 5e-4,
                      "per_device_train_batch_size": 1, "remove_unused_columns": False, "predict_with_generate": True,
                      "generation_config": {"max_new_tokens": 512}},
    "peft_config": {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 32, "lora_dropout": 0.1,
                    "target_modules": ["query_key_value"]}}


@pytest.mark.parametrize(("script", "model", "precision"), [
    ("finetune_hf.py", "THUDM/chatglm3-6b", "32-true"),  # ChatGLM3: from_pretrained without torch_dtype
    ("finetune.py", "THUDM/glm-4-9b-chat", "bf16-true"),  # GLM-4: torch_dtype=torch.bfloat16
])
def test_glm_finetune_demo(script: str, model: str, precision: str) -> None:
    """ChatGLM3 / GLM-4 ``finetune_demo``: ``python finetune_hf.py DATA_DIR MODEL_DIR configs/lora.yaml``, the model a
    positional, the settings in the YAML's training_args and peft_config sections. Refused before (no model)."""
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "configs"},
                 "data": {"lora.yaml": yaml.safe_dump(_GLM_LORA)}}
    job = one_job(configmap, pod(["python", script, "data/AdvertiseGen_fix", model, "configs/lora.yaml"]))
    s = job.spec
    assert (s.model, s.method, s.precision, s.micro_batch_size) == (model, "lora", precision, 1)
    assert (s.seq_len, s.sequence_lengths, s.gradient_checkpointing) == (1025, "variable", "full")
    assert s.lora is not None and (s.lora.rank, s.lora.alpha, s.lora.target_modules) == (8, 32, ["query_key_value"])
    full = one_job(pod(["python", script, "data/AdvertiseGen_fix", model, "configs/sft.yaml"]))  # not carried
    assert full.spec.method == "full" and any("is not in the manifest" in a for a in full.assumptions)


_XTUNER_CONFIG = '''import torch
from bitsandbytes.optim import PagedAdamW32bit
from mmengine.optim import AmpOptimWrapper
from peft import LoraConfig
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from xtuner.model import SupervisedFinetune
pretrained_model_name_or_path = 'mistralai/Mistral-7B-v0.1'
max_length = 4096
pack_to_max_length = True
batch_size = 2  # per_device
accumulative_counts = 8
optim_type = PagedAdamW32bit
model = dict(
    type=SupervisedFinetune,
    llm=dict(type=AutoModelForCausalLM.from_pretrained, pretrained_model_name_or_path=pretrained_model_name_or_path,
             torch_dtype=torch.float16,
             quantization_config=dict(type=BitsAndBytesConfig, load_in_4bit=True, bnb_4bit_use_double_quant=False,
                                      bnb_4bit_quant_type='nf4')),
    lora=dict(type=LoraConfig, r=32, lora_alpha=16, lora_dropout=0.1, bias='none', task_type='CAUSAL_LM'))
optim_wrapper = dict(type=AmpOptimWrapper, optimizer=dict(type=optim_type, lr=2e-4), accumulative_counts=8,
                     loss_scale='dynamic', dtype='float16')
'''


def test_xtuner_configs_carried_and_built_in() -> None:
    """``xtuner train CONFIG``: a carried mmengine-style config (its module-level settings, the dict(type=...) calls
    it describes) and a built-in config by name (llama2_7b_qlora_alpaca_e3: the templates' settings). Both were
    refused for naming no model."""
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
                 "data": {"mistral_qlora.py": _XTUNER_CONFIG}}
    carried = one_job(configmap, pod(["xtuner", "train", "/cfg/mistral_qlora.py", "--deepspeed", "deepspeed_zero2"],
                                     gpus=4)).spec
    assert (carried.model, carried.method, carried.quantization, carried.sharding) == (
        "mistralai/Mistral-7B-v0.1", "qlora", "nf4", "zero2")
    assert (carried.micro_batch_size, carried.grad_accum_steps, carried.seq_len, carried.sequence_lengths) == (
        2, 8, 4096, "fixed")
    assert carried.lora is not None and (carried.lora.rank, carried.lora.target_modules) == (32, "all-linear")
    built_in = one_job(pod(["bash", "-c", "NPROC_PER_NODE=8 xtuner train llama2_7b_qlora_alpaca_e3"], gpus=8))
    s = built_in.spec
    assert (s.model, s.method, s.resolved_quantization, s.micro_batch_size, s.grad_accum_steps) == (
        "llama-2-7b", "qlora", "nf4-dq", 1, 16)
    assert s.lora is not None and (s.lora.rank, s.lora.alpha) == (64, 16)
    assert any("xtuner's built-in config, read by its name" in a for a in built_in.assumptions)


def test_a_scripts_argparse_positionals_take_the_commands_words() -> None:
    """``python train.py meta-llama/Llama-3.1-8B DATA`` with ``parser.add_argument("model_name")``: the Hub id is the
    model the script loads (``from_pretrained(args.model_name)``); it was refused for naming no model."""
    script = ('import argparse\nfrom transformers import AutoModelForCausalLM, TrainingArguments\n'
              'p = argparse.ArgumentParser()\np.add_argument("model_name")\np.add_argument("data_path")\n'
              'p.add_argument("--batch", type=int, default=4)\nargs = p.parse_args()\n'
              'model = AutoModelForCausalLM.from_pretrained(args.model_name)\n'
              'TrainingArguments(output_dir="o", per_device_train_batch_size=args.batch, bf16=True)\n')
    job = _script_pod(script, ["python", "train.py", "meta-llama/Llama-3.1-8B", "/data/x.jsonl", "--batch", "2"])
    assert (job.spec.model, job.spec.micro_batch_size) == ("meta-llama/Llama-3.1-8B", 2)
    assert job.provenance["model"] == "train.py positional model_name (meta-llama/Llama-3.1-8B)"


def test_a_script_building_a_trl_rl_trainer_is_read_as_that_command() -> None:
    """Ray Train's GRPO example builds ``GRPOTrainer(model="Qwen/...", args=GRPOConfig(...))`` in code: the model the
    trainer loads by name, GRPO's defaults (checkpointing on, bf16, prompt + completion) and the colocated vLLM share.
    It was refused for naming no model."""
    script = ('from trl import GRPOConfig, GRPOTrainer\n'
              'training_args = GRPOConfig(per_device_train_batch_size=4, use_vllm=True, vllm_mode="colocate", '
              'vllm_gpu_memory_utilization=0.3)\n'
              'trainer = GRPOTrainer(model="Qwen/Qwen2.5-0.5B", args=training_args, reward_funcs=[])\n'
              'trainer.train()\n')
    s = _script_pod(script, ["python", "/s/train.py"]).spec
    assert (s.model, s.micro_batch_size, s.gradient_checkpointing, s.precision) == (
        "Qwen/Qwen2.5-0.5B", 4, "full", "bf16-mixed")
    assert (s.logits_tokens, s.colocated_engine_memory_fraction) == (256, 0.3)


def test_a_scripts_loraconfig_takes_peft_defaults_for_what_it_leaves_out() -> None:
    """``LoraConfig(r=16, target_modules=[...])`` without lora_alpha / lora_dropout: PEFT's 8 and 0.0."""
    script = ('from peft import LoraConfig\nfrom transformers import AutoModelForCausalLM, TrainingArguments\n'
              'model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")\n'
              'config = LoraConfig(r=16, target_modules=["q_proj", "v_proj"])\n'
              'TrainingArguments(output_dir="o", per_device_train_batch_size=2, bf16=True)\n')
    s = _script_pod(script, ["python", "train.py"]).spec
    assert s.lora is not None and (s.lora.rank, s.lora.alpha, s.lora.dropout) == (16, 8, 0.0)


def test_constants_assigned_in_functions_and_boolean_constants_resolve() -> None:
    """PEFT's examples assign ``model_name_or_path = "bigscience/bloomz-7b1"`` inside ``main()``; a notebook exported
    as a script passes ``load_in_4bit=use_4bit`` with ``use_4bit = True`` at the top. Refused before / a 16-bit base."""
    local = _script_pod('from transformers import AutoModelForCausalLM\ndef main():\n'
                        '    model_name_or_path = "bigscience/bloomz-7b1"\n'
                        '    model = AutoModelForCausalLM.from_pretrained(model_name_or_path)\n',
                        ["python", "train.py"])
    assert local.spec.model == "bigscience/bloomz-7b1"
    switch = _script_pod('from transformers import AutoModelForCausalLM, BitsAndBytesConfig\nuse_4bit = True\n'
                         'bnb = BitsAndBytesConfig(load_in_4bit=use_4bit, bnb_4bit_quant_type="nf4")\n'
                         'model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", '
                         'quantization_config=bnb)\n', ["python", "train.py"])
    assert (switch.spec.method, switch.spec.quantization) == ("qlora", "nf4")


def test_a_config_naming_its_model_by_the_scripts_own_key() -> None:
    """philschmid's run_fsdp_qlora.py reads ``--config llama_3_70b_fsdp_qlora.yaml`` whose model key is its
    ScriptArguments' ``model_id``: the file was ignored and the job refused."""
    config = ('model_id: "meta-llama/Meta-Llama-3-70b"\nmax_seq_len: 3072\nper_device_train_batch_size: 16\n'
              'bf16: true\ngradient_checkpointing: true\nfsdp: "full_shard auto_wrap"\n')
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
                 "data": {"llama_3_70b_fsdp_qlora.yaml": config}}
    job = one_job(configmap, pod(["bash", "-c", "torchrun --nproc_per_node=4 ./scripts/run_fsdp_qlora.py --config "
                                  "llama_3_70b_fsdp_qlora.yaml"], gpus=4))
    assert (job.spec.model, job.spec.micro_batch_size, job.spec.seq_len, job.spec.sharding) == (
        "meta-llama/Meta-Llama-3-70b", 16, 3072, "fsdp")


_OUMI_QLORA = '''model:
  model_name: "meta-llama/Llama-3.1-8B-Instruct"
  model_max_length: 8192
  torch_dtype_str: "bfloat16"
training:
  trainer_type: "TRL_SFT"
  use_peft: True
  per_device_train_batch_size: 2
  gradient_accumulation_steps: 32
  enable_gradient_checkpointing: True
peft:
  q_lora: True
  bnb_4bit_quant_type: "nf4"
  lora_r: 8
  lora_alpha: 16
  lora_target_modules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
fsdp:
  enable_fsdp: True
  sharding_strategy: "HYBRID_SHARD"
'''


def test_oumi_train_config() -> None:
    """Oumi's ``oumi train -c configs/recipes/llama3_1/sft/8b_qlora/train.yaml`` (its sections model, training, peft,
    fsdp; Oumi's defaults: no autocast, no nested quantization, dropout 0): refused before for naming no model."""
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
                 "data": {"train.yaml": _OUMI_QLORA}}
    job = one_job(configmap, pod(["oumi", "train", "-c", "/c/train.yaml", "--training.per_device_train_batch_size",
                                  "4"], gpus=4))
    s = job.spec
    assert (s.model, s.method, s.quantization, s.precision, s.seq_len) == (
        "meta-llama/Llama-3.1-8B-Instruct", "qlora", "nf4", "bf16-true", 8192)
    assert (s.micro_batch_size, s.grad_accum_steps, s.gradient_checkpointing, s.sharding) == (4, 32, "full", "fsdp")
    assert s.lora is not None and (s.lora.rank, s.lora.alpha, s.lora.dropout) == (8, 16, 0.0)


def test_a_scripts_auto_class_dataclass_booleans_and_sfttrainer_length() -> None:
    """accelerate's nlp_example loads AutoModelForSequenceClassification (read as a causal LM before); SkyPilot's Gemma
    lora.py subclasses TrainingArguments with ``fp16: bool = field(default=True)`` (fp16 was missed); an SFTTrainer
    given no length truncates at 1024 tokens (read as the spec's 2,048)."""
    for auto, task in (("AutoModelForSequenceClassification", "seq-classification"),
                       ("AutoModelForTokenClassification", "token-classification")):
        lines = [f"from transformers import {auto}", f'model = {auto}.from_pretrained("bert-base-cased")']
        assert _script_pod("\n".join(lines), ["python", "train.py"]).spec.task == task
    gemma = _script_pod('from dataclasses import dataclass, field\nimport transformers\nfrom trl import SFTTrainer\n'
                        '@dataclass\nclass TrainingArguments(transformers.TrainingArguments):\n'
                        '    per_device_train_batch_size: int = field(default=1)\n'
                        '    fp16: bool = field(default=True)\n'
                        'model = transformers.AutoModelForCausalLM.from_pretrained("google/gemma-7b")\n'
                        'trainer = SFTTrainer(model=model, train_dataset=None)\n', ["python", "train.py"])
    assert (gemma.spec.precision, gemma.spec.micro_batch_size, gemma.spec.seq_len) == ("16-mixed", 1, 1024)


def test_alignment_handbook_dpo_recipe() -> None:
    """The alignment-handbook's ``scripts/run_dpo.py RECIPE.yaml`` trains DPO through TRL's DPOTrainer (chosen and
    rejected forwarded together): it was read as SFT at the recipe's batch."""
    recipe = ("model_name_or_path: mistralai/Mistral-7B-v0.1\nuse_peft: true\nload_in_4bit: true\nbeta: 0.01\n"
              "max_length: 1024\nmax_prompt_length: 512\nper_device_train_batch_size: 4\n"
              "gradient_checkpointing: true\nbf16: true\n")
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                 "data": {"config_qlora.yaml": recipe}}
    job = one_job(configmap, pod(["accelerate", "launch", "scripts/run_dpo.py", "/c/config_qlora.yaml"]))
    assert (job.spec.method, job.spec.micro_batch_size, job.spec.quantization) == ("qlora", 8, "nf4")
    assert "DPOTrainer" in job.provenance["micro_batch_size"]


def test_ludwig_llm_config() -> None:
    """Ludwig's llama2_7b_4bit example (``ludwig train --config``): quantization.bits 4 (NF4, double quantization,
    the model in fp16), LoRA r 8 / alpha 2r / dropout 0.05, trainer.batch_size 2 x 8. It was read as an axolotl config
    (a 16-bit base at batch 1: 50.4 GiB, where the example runs on a T4)."""
    config = ("model_type: llm\nbase_model: meta-llama/Llama-2-7b-hf\nquantization:\n  bits: 4\nadapter:\n"
              "  type: lora\ntrainer:\n  type: finetune\n  batch_size: 2\n  gradient_accumulation_steps: 8\n")
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"cfg.yaml": config}}
    s = one_job(configmap, pod(["ludwig", "train", "--config", "/c/cfg.yaml", "--dataset", "ludwig://alpaca"])).spec
    assert (s.method, s.resolved_quantization, s.precision, s.micro_batch_size, s.grad_accum_steps) == (
        "qlora", "nf4-dq", "16-true", 2, 8)
    assert s.lora is not None and (s.lora.rank, s.lora.alpha, s.lora.dropout) == (8, 16, 0.05)


def test_a_reload_after_training_does_not_set_the_training_dtype() -> None:
    """mlabonne's Llama-2 Colab notebook reloads the base in fp16 after training to merge the adapter: that second
    from_pretrained set the training precision (16-true) before; the first load is the one that trains."""
    lines = ["import torch", "from transformers import AutoModelForCausalLM, BitsAndBytesConfig",
             'bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")',
             'model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", quantization_config=bnb)',
             "# ... training ...",
             'base = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", torch_dtype=torch.float16)']
    job = _script_pod("\n".join(lines), ["python", "train.py"])
    assert job.spec.method == "qlora" and job.spec.precision != "16-true"
    assert "torch_dtype" not in job.provenance.get("precision", "")


def test_mistral_finetune_config() -> None:
    """mistral-finetune's ``torchrun -m train example/7B.yaml``: LoRA rank 64 on every linear, 32,768 packed tokens,
    checkpointing and FSDP always, bf16 weights. The config was not read (a local model folder is still refused)."""
    config = 'model_id_or_path: "mistralai/Mistral-7B-v0.3"\nlora:\n  rank: 64\nseq_len: 32768\nbatch_size: 1\n'
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"7B.yaml": config}}
    s = one_job(configmap, pod(["torchrun", "--nproc-per-node", "8", "-m", "train", "/c/7B.yaml"], gpus=8)).spec
    assert (s.method, s.precision, s.seq_len, s.sequence_lengths, s.sharding, s.gradient_checkpointing) == (
        "lora", "bf16-true", 32768, "fixed", "fsdp", "full")
    assert s.lora is not None and (s.lora.rank, s.lora.target_modules) == (64, "all-linear")


def test_a_tokenize_functions_own_cut_is_the_length() -> None:
    """self-llm's Qwen LoRA script truncates in its process_func (``input_ids[:MAX_LENGTH]``, ``MAX_LENGTH = 384``):
    it was read at the spec's 2,048 tokens (46.1 GiB for 15.9)."""
    lines = ["from transformers import AutoModelForCausalLM, TrainingArguments", "def process_func(example):",
             "    MAX_LENGTH = 384", '    input_ids = example["input_ids"]', "    if len(input_ids) > MAX_LENGTH:",
             "        input_ids = input_ids[:MAX_LENGTH]", '    return {"input_ids": input_ids}',
             'args = TrainingArguments(output_dir="o", per_device_train_batch_size=8, gradient_checkpointing=True)',
             'model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B-Instruct")']
    job = _script_pod("\n".join(lines), ["python", "train.py"])
    assert job.spec.seq_len == 384
    assert job.provenance["seq_len"].startswith("train.py [:MAX_LENGTH] with MAX_LENGTH = 384")


def test_a_plain_loops_dataloader_batch_from_a_config_dict() -> None:
    """accelerate's nlp_example: ``batch_size = int(config["batch_size"])`` with ``config = {..., "batch_size": 16}``
    and ``DataLoader(..., batch_size=batch_size)``: read as batch 1 before."""
    lines = ["from torch.utils.data import DataLoader", "from transformers import AutoModelForSequenceClassification",
             "def training_function(config):", '    batch_size = int(config["batch_size"])',
             "    train_dataloader = DataLoader([], shuffle=True, batch_size=batch_size)",
             "    eval_dataloader = DataLoader([], batch_size=32)",
             '    model = AutoModelForSequenceClassification.from_pretrained("bert-base-cased")',
             'if __name__ == "__main__":', '    config = {"lr": 2e-5, "num_epochs": 3, "seed": 42, "batch_size": 16}',
             "    training_function(config)"]
    job = _script_pod("\n".join(lines), ["python", "train.py"])
    assert (job.spec.task, job.spec.micro_batch_size) == ("seq-classification", 16)


@pytest.mark.parametrize(("call", "checkpointing"), [
    ("prepare_model_for_kbit_training(model)", "full"),
    ("prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)", "none"),
])
def test_peft_kbit_preparation_in_a_script(call: str, checkpointing: str) -> None:
    """A QLoRA script that calls PEFT's prepare_model_for_kbit_training: the non-quantized parameters in fp32
    (``kbit_prepared``) and checkpointing on unless it passes use_gradient_checkpointing=False (LMFlow's QLoRA path,
    most hand-written QLoRA scripts). Neither was read."""
    lines = ["from transformers import AutoModelForCausalLM, BitsAndBytesConfig, TrainingArguments",
             "from peft import prepare_model_for_kbit_training, LoraConfig, get_peft_model",
             'bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")',
             'model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", quantization_config=bnb)',
             f"model = {call}", "model = get_peft_model(model, LoraConfig(r=16))",
             'TrainingArguments(output_dir="o", per_device_train_batch_size=4, fp16=True)']
    s = _script_pod("\n".join(lines), ["python", "train.py"]).spec
    assert (s.method, s.kbit_prepared, s.gradient_checkpointing) == ("qlora", True, checkpointing)
