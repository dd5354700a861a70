"""One row per trainer-argument style: a Pod running that command line, and the fields read from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.spec.trainer_args import (
    _load_mapping,
    deepspeed_stage_from_name,
    optimizer_name,
    read_command,
    split_script,
)
from scheduler.spec.yamltext import MAX_EMBEDDED_CHARS, MAX_JOB_EMBEDDED_CHARS, TextBudget
from tests.scheduler.spec.helpers import one_job, pod, scan

M = "meta-llama/Llama-3.1-8B"
AXOLOTL = """base_model: mistralai/Mistral-7B-v0.1
adapter: lora
lora_r: 8
sequence_len: 1024
micro_batch_size: 3
optimizer: adamw_bnb_8bit
fp16: true
"""
LLAMAFACTORY = """model_name_or_path: google/gemma-2b
finetuning_type: lora
quantization_bit: 4
cutoff_len: 512
per_device_train_batch_size: 8
pure_bf16: true
"""

STYLES: list[tuple[str, list[str], dict[str, str], dict[str, Any], dict[str, str]]] = [
    # (id, command, env, expected spec fields, expected provenance for some fields)
    (
        "hf-trainer",
        [
            "python",
            "run_clm.py",
            "--model_name_or_path",
            M,
            "--per_device_train_batch_size",
            "4",
            "--max_seq_length",
            "1024",
            "--gradient_checkpointing",
            "True",
            "--fp16",
            "--optim",
            "adafactor",
        ],
        {},
        {
            "model": M,
            "micro_batch_size": 4,
            "seq_len": 1024,
            "gradient_checkpointing": "full",
            "precision": "16-mixed",
            "optimizer": "adafactor",
        },
        {"seq_len": "flag --max_seq_length", "precision": "flag --fp16"},
    ),
    (
        "hf-trainer-equals",
        [
            "python",
            "train.py",
            f"--model_name_or_path={M}",
            "--model_max_length=8192",
            "--bf16=true",
            "--torch_dtype=bfloat16",
            "--gradient_checkpointing=false",
        ],
        {},
        {"seq_len": 8192, "precision": "bf16-true", "gradient_checkpointing": "none"},
        {"precision": "flag --torch_dtype"},
    ),
    (
        "trl-qlora",
        [
            "trl",
            "sft",
            "--model_name_or_path",
            M,
            "--use_peft",
            "--lora_r",
            "32",
            "--lora_alpha",
            "64",
            "--load_in_4bit",
            "--bnb_4bit_quant_type",
            "fp4",
            "--max_length",
            "2048",
        ],
        {},
        {"method": "qlora", "quantization": "fp4", "seq_len": 2048},
        {"method": "flag --use_peft + flag --load_in_4bit", "lora.rank": "flag --lora_r"},
    ),
    (
        "accelerate-deepspeed",
        [
            "accelerate",
            "launch",
            "--use_deepspeed",
            "--zero_stage",
            "3",
            "--offload_param_device",
            "cpu",
            "--offload_optimizer_device",
            "cpu",
            "--mixed_precision",
            "bf16",
            "train.py",
            "--model_name_or_path",
            M,
        ],
        {},
        {"sharding": "zero3", "offload": "params+optimizer", "precision": "bf16-mixed"},
        {"sharding": "flag --zero_stage", "offload": "flag --offload_param_device"},
    ),
    (
        "accelerate-fsdp",
        [
            "accelerate",
            "launch",
            "--use_fsdp",
            "--fsdp_sharding_strategy",
            "SHARD_GRAD_OP",
            "train.py",
            "--model_name_or_path",
            M,
        ],
        {},
        {"sharding": "fsdp-grad-op"},
        {"sharding": "flag --fsdp_sharding_strategy"},
    ),
    (
        "hf-fsdp-flag",
        [
            "torchrun",
            "--nproc_per_node",
            "8",
            "train.py",
            "--model_name_or_path",
            M,
            "--fsdp",
            "full_shard auto_wrap offload",
        ],
        {},
        {"sharding": "fsdp", "offload": "params+optimizer"},
        {"sharding": "flag --fsdp"},
    ),
    (
        "deepspeed-launcher-file-name",
        [
            "deepspeed",
            "--num_gpus",
            "8",
            "train.py",
            "--model_name_or_path",
            M,
            "--deepspeed",
            "configs/ds_z2_offload_config.json",
        ],
        {},
        {"sharding": "zero2", "offload": "optimizer"},
        {"sharding": "flag --deepspeed"},
    ),
    (
        "deepspeed-inline-json",
        [
            "python",
            "train.py",
            "--model_name_or_path",
            M,
            "--deepspeed",
            '{"zero_optimization": {"stage": 1}, "bf16": {"enabled": true}}',
        ],
        {},
        {"sharding": "zero1", "precision": "bf16-mixed"},
        {"sharding": "DeepSpeed config (inline) key zero_optimization"},
    ),
    (
        "torchtune",
        [
            "tune",
            "run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            "2",
            "lora_finetune_distributed",
            "--config",
            "llama3_1/8B_lora",
            "batch_size=2",
            "tokenizer.max_seq_len=4096",
            "model.lora_rank=32",
            "optimizer._component_=bitsandbytes.optim.PagedAdamW8bit",
            "fsdp_cpu_offload=True",
        ],
        {},
        {
            "model": "llama-3.1-8b",
            "method": "lora",
            "micro_batch_size": 2,
            "seq_len": 4096,
            "sharding": "fsdp",
            "optimizer": "paged-adamw-8bit",
            "offload": "params+optimizer",
            "precision": "bf16-true",
        },
        {"model": "torchtune config llama3_1/8B_lora (shipped, pytorch/torchtune@0031bfb08)",
         "lora.rank": "torchtune override model.lora_rank=32"},
    ),
    (
        "torchtune-qlora-component",
        [
            "tune",
            "run",
            "lora_finetune_single_device",
            "--config",
            "llama2/7B_qlora_single_device",
            "model._component_=torchtune.models.llama2.qlora_llama2_7b",
            "dtype=fp32",
        ],
        {},
        {"model": "llama-2-7b", "method": "qlora", "precision": "32-true"},
        {"model": "torchtune override model._component_"},
    ),
    (
        "axolotl-inline-env",
        ["bash", "-c", 'echo "$CFG" > /c.yml && accelerate launch -m axolotl.cli.train /c.yml'],
        {"CFG": AXOLOTL},
        {
            "model": "mistralai/Mistral-7B-v0.1",
            "method": "lora",
            "seq_len": 1024,
            "micro_batch_size": 3,
            "optimizer": "adamw-8bit",
            "precision": "16-mixed",
        },
        {"model": "axolotl config in env CFG key base_model"},
    ),
    (
        "llamafactory-inline-env",
        ["llamafactory-cli", "train", "/cfg/sft.yaml", "cutoff_len=1024"],
        {"LF_CONFIG": LLAMAFACTORY},
        {
            "model": "google/gemma-2b",
            "method": "qlora",
            "seq_len": 1024,
            "micro_batch_size": 8,
            "precision": "bf16-true",
        },
        {
            "seq_len": "override cutoff_len=1024",
            "model": "LLaMA-Factory config in env LF_CONFIG key model_name_or_path",
        },
    ),
    (
        "llamafactory-heredoc",
        ["bash", "-c", f"cat > /tmp/x.yaml <<EOF\n{LLAMAFACTORY}EOF\nllamafactory-cli train /tmp/x.yaml"],
        {},
        {"model": "google/gemma-2b", "method": "qlora", "seq_len": 512},
        {"seq_len": "LLaMA-Factory config /tmp/x.yaml key cutoff_len"},
    ),
    (
        "shell-script-vars",
        [
            "/bin/bash",
            "-lc",
            "set -e\nexport MODEL=mistralai/Mistral-7B-v0.1  # base\n"
            "BS=${BATCH:-6}\ntorchrun --nproc_per_node 1 train.py \\\n  --model_name_or_path $MODEL "
            "\\\n  --per_device_train_batch_size ${BS}",
        ],
        {},
        {"model": "mistralai/Mistral-7B-v0.1", "micro_batch_size": 6},
        {"model": "flag --model_name_or_path"},
    ),
    (
        "peft-modules-to-save",
        ["python", "train.py", "--model_name_or_path", "Qwen/Qwen-1_8B", "--use_peft", "--lora_r", "64",
         "--modules_to_save", "wte,lm_head"],
        {},
        {"method": "lora", "lora": {"rank": 64, "alpha": 16.0, "target_modules": ["q_proj", "v_proj"],
                                    "dropout": 0.05, "modules_to_save": ["embed_tokens", "lm_head"]}},
        {"lora.modules_to_save": "flag --modules_to_save"},
    ),
    (
        "k8s-var-expansion",
        ["python", "train.py", "--model_name_or_path", "$(MODEL)", "--lora_r", "4"],
        {"MODEL": "gpt2"},
        {"model": "gpt2", "method": "lora"},
        {"lora.rank": "flag --lora_r"},
    ),
]


@pytest.mark.parametrize(
    ("argv", "env", "fields", "sources"), [s[1:] for s in STYLES], ids=[s[0] for s in STYLES]
)
def test_trainer_argument_style(
    argv: list[str], env: dict[str, str], fields: dict[str, Any], sources: dict[str, str]
) -> None:
    job = one_job(pod(argv, env))
    data = job.spec.model_dump()
    for name, value in fields.items():
        assert data[name] == value, name
    for name, source in sources.items():
        assert job.provenance[name] == source


ENV_STYLES: list[tuple[dict[str, str], dict[str, Any]]] = [
    ({"ACCELERATE_MIXED_PRECISION": "fp16"}, {"precision": "16-mixed"}),
    (
        {
            "ACCELERATE_USE_DEEPSPEED": "true",
            "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
            "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
        },
        {"sharding": "zero3", "offload": "optimizer"},
    ),
    (
        {"ACCELERATE_USE_FSDP": "true", "FSDP_SHARDING_STRATEGY": "1", "FSDP_OFFLOAD_PARAMS": "true"},
        {"sharding": "fsdp", "offload": "params+optimizer"},
    ),
    (
        {"FSDP_ACTIVATION_CHECKPOINTING": "true", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"},
        {"gradient_checkpointing": "full", "grad_accum_steps": 4},
    ),
    ({"MODEL_ID": "meta-llama/Llama-3.2-1B"}, {"model": "meta-llama/Llama-3.2-1B"}),
]


@pytest.mark.parametrize(("env", "fields"), ENV_STYLES, ids=[next(iter(e)) for e, _ in ENV_STYLES])
def test_environment_variables(env: dict[str, str], fields: dict[str, Any]) -> None:
    argv = ["accelerate", "launch", "train.py"] + (
        [] if "MODEL_ID" in env else ["--model_name_or_path", "gpt2"]
    )
    job = one_job(pod(argv, env))
    data = job.spec.model_dump()
    for name, value in fields.items():
        assert data[name] == value
        assert job.provenance[name].startswith("env ")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("adamw_torch", "adamw"),
        ("adamw_torch_fused", "adamw"),
        ("adamw_bnb_8bit", "adamw-8bit"),
        ("paged_adamw_8bit", "paged-adamw-8bit"),
        ("paged_lion_8bit", "lion"),
        ("adafactor", "adafactor"),
        ("torch.optim.AdamW", "adamw"),
        ("torchao.optim.AdamW4bit", "adamw-4bit"),
        ("sgd", "sgd"),
        ("muon", "muon"),
        # by the number of states they keep (the trainer-args audit)
        ("rmsprop", "sgd-momentum"),  # torch RMSprop: square_avg
        ("rmsprop_bnb_32bit", "sgd-momentum"),
        ("adagrad", "sgd-momentum"),  # torch Adagrad: sum
        ("torch.optim.RMSprop", "sgd-momentum"),
        ("schedule_free_sgd", "sgd-momentum"),  # keeps z: was read as stateless sgd
        ("schedule_free_adamw", "adamw"),
        ("lomo", "sgd"),
        ("adalomo", "adafactor"),
        ("grokadamw", "grokadamw"),  # three states: left for validation to name, was read as adamw
        ("ademamix", "ademamix"),
        ("paged_adamw_32bit", "adamw"),
        ("lion_32bit", "lion"),
        ("galore_adamw_8bit", "adamw-8bit"),
    ],
)
def test_optimizer_names(name: str, expected: str) -> None:
    assert optimizer_name(name) == expected


@pytest.mark.parametrize(
    ("name", "stage", "offload"),
    [
        ("ds_z3_config.json", 3, False),
        ("ds_z3_offload_config.json", 3, True),
        ("zero_stage2.json", 2, False),
        ("deepspeed_zero1.json", 1, False),
        ("ds_config.json", None, False),
    ],
)
def test_deepspeed_stage_from_file_name(name: str, stage: int | None, offload: bool) -> None:
    assert deepspeed_stage_from_name(name) == (stage, offload)


def test_shell_script_split_into_commands_keeps_quoted_newlines() -> None:
    script = split_script(["bash", "-c", "pip install x && python -c 'a = 1\nprint(a)' ; echo done # c"], {})
    assert script.commands == [["pip", "install", "x"], ["python", "-c", "a = 1\nprint(a)"], ["echo", "done"]]


def test_a_default_may_name_another_variable_which_is_expanded() -> None:
    script = split_script(["bash", "-c", "export B=8\ntrain --bs ${BS:-$B} --lr ${LR:-1e-4} --x ${X:-${Y:-y}}"], {})
    # Bash expands a default word; a nested ``${`` is expanded inside, then outside (verl's CI scripts:
    # LORA_ALPHA=${LORA_ALPHA:-${LORA_RANK}}), two levels deep
    assert script.commands == [["train", "--bs", "8", "--lr", "1e-4", "--x", "y"]]


def test_unclosed_expansions_and_blank_lines_are_left_as_text() -> None:
    # Both once cost quadratic time (an unclosed ``${a:-`` scanned to the end of the script from every ``$``;
    # ``^\s*`` in the export scan ran over every following blank line from every line): 172 s for 420 KiB.
    script = split_script(["bash", "-c", "${a:-" * 5_000 + "\n" * 30_000 + "export M=x\ntrain $M"], {})
    assert script.commands[-1] == ["train", "x"] and script.commands[0][0].startswith("${a:-${a:-")


def test_a_shell_script_above_the_cap_is_noted_not_read() -> None:
    argv = ["bash", "-c", "train --model_name_or_path gpt2 " + "x" * MAX_EMBEDDED_CHARS]
    script = split_script(argv, {})
    assert script.commands == [] and "at most 65,536 (64 KiB)" in script.notes[0] and "not read" in script.notes[0]
    reading, _ = read_command(argv, {}, "spec.containers[0]")
    assert reading.notes == [f"spec.containers[0]: {script.notes[0]}"]


def test_a_config_file_named_by_many_commands_is_parsed_once() -> None:
    # Uncached, 800 commands naming one 13 KiB heredoc config took 159 s in one review (bench/hostile_reviews.py).
    config = "model_name_or_path: Qwen/Qwen2.5-0.5B\nfinetuning_type: lora\nx: [" + "1," * 5_000 + "1]\n"
    script = "cat > /tmp/c.yaml <<EOF\n" + config + "EOF\n" + "llamafactory-cli train /tmp/c.yaml\n" * 300
    before = _load_mapping.cache_info()
    reading, _ = read_command(["bash", "-c", script], {}, "spec.containers[0]")
    after = _load_mapping.cache_info()
    assert reading.settings["model"].value == "Qwen/Qwen2.5-0.5B"
    assert after.misses - before.misses <= 1 and after.hits - before.hits >= 299


def test_variable_expansion_draws_on_the_jobs_text_budget() -> None:
    # Each export repeats the one before ten times: 10**9 characters from 403 bytes without the bound (at five
    # levels, 1,000,000 characters took 15 s to split). What expansion adds comes out of the job's budget.
    lines = ["export L0=xxxxxxxxxx", *(f"export L{i}=" + f"$L{i - 1}" * 10 for i in range(1, 10)), "train --x $L9"]
    text = "\n".join(lines)
    script = split_script(["bash", "-c", text], {})
    assert sum(len(v) for v in script.env.values()) <= MAX_JOB_EMBEDDED_CHARS
    assert script.env["L3"] == "x" * 10_000 and script.commands[-1][:2] == ["train", "--x"]
    budget = TextBudget()
    wide = split_script(["bash", "-c", "train " + "$A " * 10_000], {"A": "y" * 60_000}, budget)
    # 131,072 less the 30,006 of the script leaves room for one 60,000-character value; the rest stay as written
    assert [len(w) for w in wide.commands[0][1:4]] == [60_000, 2, 2] and budget.left == 131_072 - 30_006 - 59_998


# A torchtune config as a user mounts it (shapes of pytorch/torchtune recipes/configs/llama3_1/8B_qlora_single_device
# .yaml: the keys vramfit reads, nested as the file nests them)
TUNE_QLORA_CONFIG = """
model:
  _component_: torchtune.models.llama3_1.qlora_llama3_1_8b
  lora_attn_modules: ['q_proj', 'v_proj', 'k_proj', 'output_proj']
  apply_lora_to_mlp: True
  apply_lora_to_output: False
  lora_rank: 8
  lora_alpha: 16
  lora_dropout: 0.0
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  max_seq_len: 4096
batch_size: 2
optimizer:
  _component_: torch.optim.AdamW
  fused: True
loss:
  _component_: torchtune.modules.loss.LinearCrossEntropyLoss
gradient_accumulation_steps: 16
dtype: bf16
enable_activation_checkpointing: True
enable_activation_offloading: False
compile: False
"""


def _tune_job(config_text: str | None, *overrides: str) -> list[Any]:
    from tests.scheduler.spec.helpers import scan

    job = pod(["tune", "run", "lora_finetune_single_device", "--config", "/cfg/8B_qlora_single_device.yaml",
               *overrides])
    docs: list[Any] = [job]
    if config_text is not None:
        docs.insert(0, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tune-config"},
                        "data": {"8B_qlora_single_device.yaml": config_text}})
    return scan(*docs)


def test_a_torchtune_config_the_manifest_carries_is_read_and_overrides_win() -> None:
    from scheduler.spec.document import ParsedJob

    outcomes = _tune_job(TUNE_QLORA_CONFIG, "batch_size=4")
    job = next(o for o in outcomes if isinstance(o, ParsedJob))
    s = job.spec
    assert (s.model, s.method, s.micro_batch_size, s.grad_accum_steps, s.seq_len) == (
        "llama-3.1-8b", "qlora", 4, 16, 4096)
    assert s.lora is not None and (s.lora.rank, s.lora.alpha, s.lora.dropout) == (8, 16, 0.0)
    assert s.lora.target_modules == ["q_proj", "v_proj", "k_proj", "output_proj", "gate_proj", "up_proj",
                                     "down_proj"]
    assert (s.precision, s.gradient_checkpointing, s.cross_entropy, s.fused_optimizer) == (
        "bf16-true", "full", "chunked", True)
    assert job.provenance["micro_batch_size"] == "torchtune override batch_size=4"
    assert job.provenance["grad_accum_steps"] == (
        "torchtune config /cfg/8B_qlora_single_device.yaml key gradient_accumulation_steps")
    assert not any("is not read" in a for a in job.assumptions), job.assumptions


def test_a_mounted_torchtune_config_the_manifest_lacks_names_no_model_from_its_path() -> None:
    """``/cfg/8B_qlora_single_device.yaml`` is not a shipped config: its directory names no model family (it used
    to be read as a model 'cfg-8b', which the catalog then refused)."""
    from predictors.errors import SpecError

    outcomes = _tune_job(None)
    assert isinstance(outcomes[0], SpecError)
    message = str(outcomes[0])
    assert "no model found" in message and "cfg-8b" not in message


def _config_job(config: dict[str, Any], command: list[str], name: str = "config.yaml", gpus: int = 1) -> Any:
    import yaml

    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
           "data": {name: yaml.safe_dump(config)}}
    return one_job(cfg, pod([*command, f"/cfg/{name}"], gpus=gpus))


LF_LORA = {"model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct", "stage": "sft", "do_train": True,
           "finetuning_type": "lora", "dataset": "alpaca_en_demo", "template": "llama3", "cutoff_len": 2048,
           "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "bf16": True}


def test_llamafactory_checkpoints_by_default_and_its_lora_defaults_apply() -> None:
    """LLaMA-Factory checkpoints every layer unless disable_gradient_checkpointing (hparams/model_args.py default
    False) and its LoRA defaults are rank 8, alpha 2 x rank, dropout 0, every linear layer (finetuning_args.py):
    the upstream examples/train_lora/llama3_lora_sft.yaml was read without checkpointing, 42.1 instead of
    19.9 GiB."""
    job = _config_job(LF_LORA, ["llamafactory-cli", "train"])
    s = job.spec
    assert s.gradient_checkpointing == "full" and not s.activation_offloading
    assert "disable_gradient_checkpointing" in job.provenance["gradient_checkpointing"]
    assert s.lora is not None and (s.lora.rank, s.lora.alpha, s.lora.dropout, s.lora.target_modules) == (
        8, 16, 0.0, "all-linear")
    ranked = _config_job({**LF_LORA, "lora_rank": 32, "lora_dropout": 0.1}, ["llamafactory-cli", "train"]).spec
    assert ranked.lora is not None and (ranked.lora.rank, ranked.lora.alpha, ranked.lora.dropout) == (32, 64, 0.1)
    off = _config_job({**LF_LORA, "disable_gradient_checkpointing": True}, ["llamafactory-cli", "train"]).spec
    assert off.gradient_checkpointing == "none"
    unsloth = _config_job({**LF_LORA, "use_unsloth_gc": True}, ["llamafactory-cli", "train"]).spec
    assert unsloth.gradient_checkpointing == "full" and unsloth.activation_offloading


AX_QLORA = {"base_model": "Qwen/Qwen3-8B", "load_in_4bit": True, "adapter": "qlora", "lora_r": 16,
            "lora_alpha": 32, "lora_target_modules": ["q_proj", "v_proj"], "sequence_len": 2048,
            "micro_batch_size": 1, "gradient_accumulation_steps": 2, "bf16": True}


def test_axolotl_defaults_offloaded_checkpointing_and_the_cut_cross_entropy_plugin() -> None:
    """axolotl's schema: lora_dropout 0.0 with an adapter, gradient_checkpointing offload/unsloth (checkpointing
    with the checkpointed inputs in host memory), CutCrossEntropyPlugin on by default. Its upstream
    examples/qwen3/32b-qlora.yaml used to fail on 'offload'."""
    plain = _config_job(AX_QLORA, ["axolotl", "train"]).spec
    assert plain.lora is not None and plain.lora.dropout == 0.0
    assert plain.gradient_checkpointing == "none" and plain.cross_entropy is None
    job = _config_job({**AX_QLORA, "gradient_checkpointing": "offload",
                       "plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]},
                      ["axolotl", "train"])
    s = job.spec
    assert (s.gradient_checkpointing, s.activation_offloading, s.cross_entropy) == ("full", True, "fused-linear")
    assert "CutCrossEntropyPlugin" in job.provenance["cross_entropy"]
    off = _config_job({**AX_QLORA, "cut_cross_entropy": False,
                       "plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]},
                      ["axolotl", "train"]).spec
    assert off.cross_entropy is None


def test_deepspeed_parameter_offload_alone_keeps_the_optimizer_states_on_the_gpus() -> None:
    """ZeRO-3 offload_param without offload_optimizer (axolotl's deepspeed_configs/zero3_bf16_cpuoffload_params.json,
    accelerate --offload_param_device alone) leaves the optimizer states on the GPUs: read as no offload, noted.
    It used to be read as params+optimizer, which took the states off the GPU in the prediction."""
    ds = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True}},
          "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": "auto"}
    job = one_job(pod(["deepspeed", "train.py", "--model_name_or_path", M, "--deepspeed", json.dumps(ds)], gpus=8))
    assert (job.spec.sharding, job.spec.offload) == ("zero3", "none")
    assert any("offload_param without offload_optimizer" in a for a in job.assumptions), job.assumptions
    flags = one_job(pod(["accelerate", "launch", "--use_deepspeed", "--zero_stage", "3", "--offload_param_device",
                         "cpu", "train.py", "--model_name_or_path", M], gpus=8))
    assert flags.spec.offload == "none"
    both = {**ds, "zero_optimization": {**ds["zero_optimization"], "offload_optimizer": {"device": "cpu"}}}
    job = one_job(pod(["deepspeed", "train.py", "--model_name_or_path", M, "--deepspeed", json.dumps(both)], gpus=8))
    assert job.spec.offload == "params+optimizer"


def test_axolotl_partial_training_is_noted_and_hybrid_sharding_needs_sharding() -> None:
    """Partial training is not expressible in a TrainingSpec: the assumptions say which way the prediction errs
    (upstream examples/mistral/bigstral-ds-zero3.yaml). Hybrid sharding without FSDP has nothing to split (the
    sharded case: test_hybrid_sharding.py)."""
    partial = _config_job({**AX_QLORA, "adapter": None, "load_in_4bit": False,
                           "unfrozen_parameters": ["^lm_head.weight$", "model.layers.4[4-9]+.block_sparse_moe.gate"]},
                          ["axolotl", "train"])
    assert partial.spec.method == "full"
    assert any("unfrozen_parameters" in a and "over-estimate" in a for a in partial.assumptions), partial.assumptions
    hybrid = _config_job({**AX_QLORA, "dp_replicate_size": 2, "dp_shard_size": 4}, ["axolotl", "train"])
    assert hybrid.spec.shard_group_size is None
    assert any("dp_replicate_size 2" in a and "not read" in a for a in hybrid.assumptions), hybrid.assumptions


def test_trl_scripts_run_directly_and_the_cli_accelerate_configs() -> None:
    """trl/cli.py runs trl/scripts/<command>.py with the same argv, so the script run directly gets SFTConfig's
    defaults too; `--accelerate_config zero2` names TRL's shipped DeepSpeed ZeRO-2 config; `trl dpo` gets
    DPOConfig's max_length 1024 and TrainingArguments' batch 8."""
    script = one_job(pod(["accelerate", "launch", "trl/scripts/sft.py", "--model_name_or_path", "Qwen/Qwen2.5-0.5B",
                          "--dataset_name", "trl-lib/Capybara"], gpus=8))
    assert (script.spec.seq_len, script.spec.micro_batch_size, script.spec.gradient_checkpointing) == (
        1024, 8, "full")
    for name, sharding in (("zero2", "zero2"), ("zero3", "zero3"), ("fsdp2", "fsdp")):
        job = one_job(pod(["trl", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--dataset_name", "x",
                           "--accelerate_config", name], gpus=8))
        assert job.spec.sharding == sharding, name
        assert job.provenance["sharding"].startswith(f"flag --accelerate_config {name}")
    dpo = one_job(pod(["trl", "dpo", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--dataset_name", "x"]))
    # TrainingArguments' 8 per device, each a chosen and a rejected sequence in one forward
    assert (dpo.spec.seq_len, dpo.spec.micro_batch_size, dpo.spec.reference_model) == (1024, 16, True)
    assert dpo.provenance["reference_model"].startswith("TRL DPOTrainer")
    peft = one_job(pod(["trl", "dpo", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--dataset_name", "x",
                        "--use_peft", "--lora_r", "16"]))
    assert peft.spec.method == "lora" and not peft.spec.reference_model  # the base with the adapter disabled


def test_peft_sft_example_flags() -> None:
    """PEFT's examples/sft scripts: --use_peft_lora, --use_4bit_quantization with --use_nested_quant (nf4 with double
    quantization), --use_flash_attn."""
    job = one_job(pod(["accelerate", "launch", "train.py", "--model_name_or_path", "meta-llama/Llama-2-7b-hf",
                       "--use_peft_lora", "True", "--lora_r", "8", "--use_4bit_quantization", "True",
                       "--use_nested_quant", "True", "--bnb_4bit_quant_type", "nf4", "--use_flash_attn", "True",
                       "--per_device_train_batch_size", "2", "--bf16", "True"]))
    s = job.spec
    assert (s.method, s.quantization, s.attention) == ("qlora", "nf4-dq", "flash")
    assert not any("without --use_peft" in a for a in job.assumptions), job.assumptions


def test_trainer_argument_env_vars() -> None:
    """Kubeflow Trainer's GRPO trainer reads PER_DEVICE_TRAIN_BATCH_SIZE and GRADIENT_ACCUMULATION_STEPS."""
    job = one_job(pod(["python", "train.py", "--model_name_or_path", "Qwen/Qwen2.5-0.5B"],
                      env={"PER_DEVICE_TRAIN_BATCH_SIZE": "2", "GRADIENT_ACCUMULATION_STEPS": "4"}))
    assert (job.spec.micro_batch_size, job.spec.grad_accum_steps) == (2, 4)


def test_preference_training_forwards_pairs_and_keeps_a_reference() -> None:
    """DPO-style trainers forward a chosen and a rejected sequence per sample together (TRL concatenated_forward, which
    axolotl's and LLaMA-Factory's DPO trainers use), so a micro-batch holds twice the per-device batch; DPO/IPO
    without an adapter keep a frozen reference model, ORPO/SimPO none."""
    lora = _config_job({**AX_QLORA, "rl": "dpo"}, ["axolotl", "train"])
    assert (lora.spec.micro_batch_size, lora.spec.reference_model) == (2, None)
    assert "a chosen and a rejected sequence" in lora.provenance["micro_batch_size"]
    full = _config_job({"base_model": "Qwen/Qwen2.5-0.5B", "rl": "dpo", "micro_batch_size": 4, "sequence_len": 1024,
                        "bf16": True}, ["axolotl", "train"])
    assert (full.spec.method, full.spec.micro_batch_size, full.spec.reference_model) == ("full", 8, True)
    lf = _config_job({**LF_LORA, "stage": "dpo", "finetuning_type": "full", "per_device_train_batch_size": 2},
                     ["llamafactory-cli", "train"])
    assert (lf.spec.micro_batch_size, lf.spec.reference_model) == (4, True)
    orpo = _config_job({**LF_LORA, "stage": "dpo", "pref_loss": "orpo", "finetuning_type": "full"},
                       ["llamafactory-cli", "train"])
    assert (orpo.spec.micro_batch_size, orpo.spec.reference_model) == (2, None)
    sft = _config_job({**LF_LORA, "finetuning_type": "full"}, ["llamafactory-cli", "train"])
    assert (sft.spec.micro_batch_size, sft.spec.reference_model) == (1, None)
    kto = _config_job({**LF_LORA, "stage": "kto", "finetuning_type": "full"}, ["llamafactory-cli", "train"])
    assert (kto.spec.micro_batch_size, kto.spec.reference_model) == (1, True)  # single completions, a reference
    ax_kto = _config_job({**AX_QLORA, "rl": "kto"}, ["axolotl", "train"])
    assert (ax_kto.spec.micro_batch_size, ax_kto.spec.reference_model) == (1, None)  # an adapter: no copy


def test_axolotl_sequence_parallel_degree_and_torchtune_odds() -> None:
    """axolotl's deprecated sequence_parallel_degree is its context_parallel_size; torchtune's LoRA builders default
    lora_dropout to 0.0; a Kubeflow runtime's single `--config NAME` token is read as torchtune splits it; a
    distillation teacher is read."""
    alst = _config_job({"base_model": "meta-llama/Llama-3.1-8B", "sequence_parallel_degree": 8,
                        "sequence_len": 65536, "micro_batch_size": 1}, ["axolotl", "train"], gpus=8)
    assert alst.spec.context_parallel == 8
    tt = one_job(pod(["tune", "run", "lora_finetune_single_device", "--config llama3_1/8B_lora_single_device",
                      "model._component_=torchtune.models.llama3_1.lora_llama3_1_8b"]))
    assert tt.provenance["micro_batch_size"].startswith("torchtune config llama3_1/8B_lora_single_device")
    no_dropout = TUNE_QLORA_CONFIG.replace("  lora_dropout: 0.0\n", "")
    from scheduler.spec.document import ParsedJob

    job = next(o for o in _tune_job(no_dropout) if isinstance(o, ParsedJob))
    assert job.spec.lora is not None and job.spec.lora.dropout == 0.0
    assert job.provenance["lora.dropout"] == "torchtune LoRA builders' default lora_dropout 0.0"
    kd = next(o for o in _tune_job(TUNE_QLORA_CONFIG + "teacher_model:\n  _component_: "
                                   "torchtune.models.llama3_1.llama3_1_8b\n") if isinstance(o, ParsedJob))
    assert kd.spec.teacher_model == "llama-3.1-8b"  # read, not just noted (test_distillation_parse.py)


def test_torchtune_dpo_recipes_and_llamafactory_galore() -> None:
    job = one_job(pod(["tune", "run", "lora_dpo_single_device", "--config", "llama3_1/8B_lora_dpo_single_device",
                       "batch_size=4", "model._component_=torchtune.models.llama3_1.lora_llama3_1_8b"]))
    assert job.spec.micro_batch_size == 8 and not job.spec.reference_model
    full = one_job(pod(["tune", "run", "full_dpo_distributed", "--config", "llama3_1/8B_full_dpo", "batch_size=2",
                        "model._component_=torchtune.models.llama3_1.llama3_1_8b"], gpus=8))
    assert (full.spec.micro_batch_size, full.spec.reference_model) == (4, True)
    galore = _config_job({**LF_LORA, "finetuning_type": "full", "use_galore": True, "galore_rank": 128},
                         ["llamafactory-cli", "train"])
    assert galore.spec.galore_rank == 128  # read as GaLore's projected states (test_galore_parse.py)


def test_dora_switch_in_each_trainer() -> None:
    """DoRA's switch as axolotl (peft_use_dora), LLaMA-Factory (use_dora) and torchtune (the LoRA builders'
    use_dora) name it."""
    axolotl = _config_job({**AX_QLORA, "peft_use_dora": True}, ["axolotl", "train"]).spec
    assert axolotl.lora is not None and axolotl.lora.use_dora
    factory = _config_job({**LF_LORA, "use_dora": True}, ["llamafactory-cli", "train"]).spec
    assert factory.lora is not None and factory.lora.use_dora
    tune = one_job(pod(["tune", "run", "lora_finetune_single_device", "--config", "llama3_1/8B_lora_single_device",
                        "model.use_dora=True"]))
    assert tune.spec.lora is not None and tune.spec.lora.use_dora
    assert tune.provenance["lora.use_dora"] == "torchtune override model.use_dora=True"
    full = _config_job({**LF_LORA, "finetuning_type": "full", "use_dora": True}, ["llamafactory-cli", "train"])
    assert full.spec.lora is None  # a full fine-tune has no adapter to decompose


def test_torchtune_dora_configs_and_quantize_base() -> None:
    """torchtune's llama3/8B_dora_single_device and 8B_qdora_single_device (pytorch/torchtune@2bd6906) and the
    builders' quantize_base (QLoRA / QDoRA: NF4 bases), as a config key or an override."""
    dora = one_job(pod(["tune", "run", "lora_finetune_single_device", "--config", "llama3/8B_dora_single_device"]))
    assert (dora.spec.method, dora.spec.micro_batch_size, dora.spec.gradient_checkpointing) == ("lora", 2, "full")
    assert dora.spec.lora is not None and dora.spec.lora.use_dora
    qdora = one_job(pod(["tune", "run", "lora_finetune_single_device", "--config", "llama3/8B_qdora_single_device"]))
    assert qdora.spec.method == "qlora" and qdora.spec.lora is not None and qdora.spec.lora.use_dora
    override = one_job(pod(["tune", "run", "lora_finetune_single_device", "--config",
                            "llama3_1/8B_lora_single_device", "model.quantize_base=True"]))
    assert override.spec.method == "qlora"
    assert "quantize_base" in override.provenance["method"]


def test_llamafactory_train_bash_flags_get_its_defaults() -> None:
    """LLaMA-Factory's older launcher, src/train_bash.py, behind accelerate: its arguments as flags get the defaults
    a config file gets (checkpointing, LoRA dropout 0)."""
    job = one_job(pod(["accelerate", "launch", "--config_file", "single_config.yaml", "../../src/train_bash.py",
                       "--stage", "sft", "--do_train", "--model_name_or_path", "meta-llama/Llama-2-7b-hf",
                       "--template", "default", "--finetuning_type", "lora", "--lora_target", "q_proj,v_proj",
                       "--use_dora", "True", "--per_device_train_batch_size", "2", "--fp16"]))
    s = job.spec
    assert (s.method, s.gradient_checkpointing) == ("lora", "full")
    assert s.lora is not None and (s.lora.dropout, s.lora.use_dora) == (0.0, True)


@pytest.mark.parametrize(("argv", "env", "lengths", "expandable", "source"), [
    (["--packing", "False"], {}, "variable", None, "flag --packing (no packing: each batch padded to its longest"),
    (["--packing"], {}, "fixed", None, "flag --packing (samples packed up to the length)"),
    (["--sample_packing", "false", "--pad_to_sequence_len", "true"], {}, "fixed", None,
     "flag --pad_to_sequence_len (every batch padded to the length)"),
    ([], {}, None, None, None),  # nothing says: the TrainingSpec default (fixed), no setting
    (["--packing", "false"], {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"},
     "variable", True, None),
    ([], {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}, None, False, None),
    ([], {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}, None, None, None),
    ([], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:"}, None, None, None),  # no value: not set
    # any packing switch on packs, whatever the order (LLaMA-Factory turns packing on with neat_packing)
    (["--neat_packing", "true", "--packing", "false"], {}, "fixed", None, "flag --neat_packing"),
    (["--packing", "false", "--neat_packing", "true"], {}, "fixed", None, "flag --neat_packing"),
    (["--sample_packing", "true", "--packing", "false"], {}, "fixed", None, "flag --sample_packing"),
])
def test_packing_and_the_allocator_setting(argv: list[str], env: dict[str, str], lengths: str | None,
                                           expandable: bool | None, source: str | None) -> None:
    job = one_job(pod(["python", "sft.py", "--model_name_or_path", "gpt2", *argv], env))
    assert job.spec.sequence_lengths == lengths
    assert job.spec.expandable_segments is expandable
    if source is not None:
        assert job.provenance["sequence_lengths"].startswith(source)


@pytest.mark.parametrize("flag", ["--packing=maybe", "--pad_to_sequence_len=maybe"])
def test_a_packing_flag_that_is_not_a_boolean_is_refused_by_name(flag: str) -> None:
    from predictors.errors import SpecError
    from tests.scheduler.spec.helpers import scan

    outs = scan(pod(["python", "sft.py", "--model_name_or_path", "gpt2", flag], {}))
    assert len(outs) == 1 and isinstance(outs[0], SpecError)
    assert f"flag {flag.split('=')[0]}" in str(outs[0]) and "'maybe'" in str(outs[0])


@pytest.mark.parametrize(("overrides", "env", "lengths", "expandable"), [
    ([], {}, None, True),  # importing torchtune turns expandable segments on
    (["dataset.packed=False"], {}, "variable", True),
    (["dataset.packed=True"], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, "fixed", False),
])
def test_torchtune_turns_expandable_segments_on_unless_told_not_to(
        overrides: list[str], env: dict[str, str], lengths: str | None, expandable: bool) -> None:
    argv = ["tune", "run", "lora_finetune_single_device", "--config", "llama3_1/8B_qlora_single_device", *overrides]
    job = one_job(pod(argv, env))
    assert job.spec.sequence_lengths == lengths
    assert job.spec.expandable_segments is expandable
    if expandable:
        assert job.provenance["expandable_segments"].startswith("torchtune (importing it sets")


@pytest.mark.parametrize(("command", "env", "expandable"), [
    # torchtune reads PYTORCH_CUDA_ALLOC_CONF only: with PYTORCH_ALLOC_CONF alone it still turns them on
    (["tune", "run", "lora_finetune_single_device", "--config", "llama3_1/8B_lora_single_device"],
     {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}, True),
    # a same-line export in the script replaces the container's value
    (["bash", "-c", "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False; tune run lora_finetune_single_device "
      "--config llama3_1/8B_lora_single_device"], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, False),
])
def test_torchtune_and_the_scripts_allocator_setting(command: list[str], env: dict[str, str],
                                                     expandable: bool) -> None:
    assert one_job(pod(command, env)).spec.expandable_segments is expandable


def test_a_torchtune_packed_value_that_is_no_boolean_is_refused_not_a_crash() -> None:
    """``dataset: {packed: []}`` in a carried config (a list: it crashed the lookup) and an override."""
    from predictors.errors import SpecError

    for outcomes in (_tune_job(TUNE_QLORA_CONFIG + "dataset:\n  packed: []\n"),
                     _tune_job(TUNE_QLORA_CONFIG, "dataset.packed=maybe")):
        errors = [o for o in outcomes if isinstance(o, SpecError) and "is not a workload" not in str(o)]
        assert len(errors) == 1 and "dataset.packed" in str(errors[0]), outcomes


def test_trl_grpo_trains_on_prompt_and_completion_with_its_defaults() -> None:
    """``trl grpo``: the policy's forward and backward run over prompt + completion (max_prompt_length +
    max_completion_length), beta > 0 keeps a frozen reference model, and GRPOConfig's defaults (checkpointing on, bf16,
    the per-device batch of 8 completions) apply. Read before as an SFT job at the spec's default 2,048 tokens with
    no reference model."""
    base = ["trl", "grpo", "--model_name_or_path", "Qwen/Qwen2.5-7B-Instruct", "--dataset_name", "trl-lib/tldr"]
    job = one_job(pod([*base, "--max_prompt_length", "512", "--max_completion_length", "1024", "--beta", "0.04",
                       "--use_vllm", "--vllm_mode", "colocate"], gpus=8))
    s = job.spec
    assert (s.seq_len, s.reference_model, s.micro_batch_size) == (1536, True, 8)
    assert (s.gradient_checkpointing, s.precision) == ("full", "bf16-mixed")
    assert "GRPO trains on prompt and completion" in job.provenance["seq_len"]
    # vLLM colocated in the training processes keeps GRPOConfig's default 0.3 of every GPU's memory
    assert s.colocated_engine_memory_fraction == 0.3
    assert "vllm_gpu_memory_utilization 0.3" in job.provenance["colocated_engine_memory_fraction"]
    colocate = [*base, "--use_vllm", "true", "--vllm_mode", "colocate"]
    half = one_job(pod([*colocate, "--vllm_gpu_memory_utilization", "0.5"], gpus=8)).spec
    asleep = one_job(pod([*colocate, "--vllm_enable_sleep_mode", "true"], gpus=8))
    assert (half.colocated_engine_memory_fraction, asleep.spec.colocated_engine_memory_fraction) == (0.5, None)
    assert any("sleep mode" in a for a in asleep.assumptions)
    server = one_job(pod([*base, "--use_vllm", "true"], gpus=8))
    assert server.spec.colocated_engine_memory_fraction is None
    assert any("server mode" in a for a in server.assumptions)
    # no prompt length, no completion length, no beta: GRPOConfig's 256-token completions after a 512-token prompt
    # assumed, and no reference model (beta's default 0.0), each said
    plain = one_job(pod(base, gpus=8))
    assert (plain.spec.seq_len, plain.spec.reference_model) == (768, None)
    assert any("prompts' length is not stated" in a for a in plain.assumptions), plain.assumptions
    assert any("beta not set" in a for a in plain.assumptions)
    zero = one_job(pod([*base, "--beta", "0", "--max_completion_length", "2048", "--max_prompt_length", "256"]))
    assert (zero.spec.seq_len, zero.spec.reference_model) == (2304, None)


def test_open_r1_grpo_recipe_with_an_accelerate_config_baked_into_the_image() -> None:
    """open-r1's GRPO recipe (src/open_r1/grpo.py --config recipe.yaml) under ``accelerate launch --config_file
    recipes/accelerate_configs/zero2.yaml``, a file the image carries: ZeRO-2 read from the config's name (with fp32
    masters for the bf16-loaded model), and the recipe's lengths. Read before as plain data parallel at 2,048 tokens."""
    recipe = {"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "torch_dtype": "bfloat16", "bf16": True,
              "use_vllm": True, "gradient_checkpointing": True, "max_prompt_length": 512,
              "max_completion_length": 1024, "num_generations": 16, "per_device_train_batch_size": 16}
    launch = ["accelerate", "launch", "--config_file", "recipes/accelerate_configs/zero2.yaml", "src/open_r1/grpo.py",
              "--config"]
    job = _config_job(recipe, launch, gpus=8)
    s = job.spec
    assert (s.sharding, s.precision, s.seq_len, s.micro_batch_size) == ("zero2", "bf16-mixed", 1536, 16)
    assert any("zero2.yaml is not in the manifest" in a for a in job.assumptions), job.assumptions
    assert any("server mode" in a for a in job.assumptions)
    fsdp = _config_job(recipe, [*launch[:3], "configs/fsdp.yaml", *launch[4:]], gpus=8)
    assert fsdp.spec.sharding == "fsdp"
    other = _config_job(recipe, [*launch[:3], "configs/cluster.yaml", *launch[4:]], gpus=8)
    assert other.spec.sharding is None  # the multi-GPU default, data parallel
    assert any("does not say the distributed type" in a for a in other.assumptions), other.assumptions


def test_ms_swift_rlhf_reads_its_algorithm_and_vllm_defaults() -> None:
    """``swift rlhf`` (ms-swift's RLHF entry point): the model, tuner and dtype as ``swift sft`` reads them; rlhf_type
    dpo (the default) forwards pairs and, in full training, keeps a reference model; simpo/orpo/cpo keep none; GRPO
    as TRL's GRPOTrainer, with ms-swift's vLLM defaults (colocate unless a server is named, 0.9 of each GPU,
    sleep_level 0). Not read at all before: the job had no model."""
    base = ["swift", "rlhf", "--model", "Qwen/Qwen2.5-7B-Instruct", "--train_type", "full", "--torch_dtype",
            "bfloat16", "--per_device_train_batch_size", "2", "--max_length", "2048"]
    dpo = one_job(pod(base)).spec
    assert (dpo.micro_batch_size, dpo.reference_model, dpo.seq_len) == (4, True, 2048)
    simpo = one_job(pod([*base, "--rlhf_type", "simpo"])).spec
    assert (simpo.micro_batch_size, simpo.reference_model) == (4, None)
    lora = one_job(pod([*base[:5], "lora", *base[6:], "--rlhf_type", "kto"])).spec
    assert (lora.method, lora.micro_batch_size, lora.reference_model) == ("lora", 2, None)
    grpo = [*base[:-2], "--rlhf_type", "grpo", "--max_completion_length", "2048", "--num_generations", "8",
            "--use_vllm", "true", "--beta", "0.04"]
    colocated = one_job(pod(grpo, gpus=8)).spec
    assert (colocated.seq_len, colocated.reference_model, colocated.colocated_engine_memory_fraction) == (
        2560, True, 0.9)
    asleep = one_job(pod([*grpo, "--sleep_level", "1", "--vllm_gpu_memory_utilization", "0.5"], gpus=8)).spec
    assert asleep.colocated_engine_memory_fraction is None
    server = one_job(pod([*grpo, "--vllm_server_host", "10.0.0.2"], gpus=8)).spec
    assert server.colocated_engine_memory_fraction is None
    ppo = one_job(pod([*base, "--rlhf_type", "ppo"]))
    assert any("does not model beyond the trained policy" in a for a in ppo.assumptions)


def test_ms_swift_grpo_reads_its_own_defaults() -> None:
    """ms-swift's GRPO is not TRL's: --max_length caps the prompt (its maintainers: "max_length refers to the length
    of the query (prompt) part"), max_completion_length defaults to 512 and beta to 0.04 (a reference model in full
    training); --tensor_parallel_size is the vLLM engine's older name; 3.2's --vllm_device puts vLLM on its own GPU;
    4.x names the tuner --tuner_type; --sequence_parallel_size is Ulysses sequence parallelism. Its qlora.sh example
    (2,048-token prompts, 8,192-token completions) read as 2,048 tokens: 20.9 instead of 88.7 GiB."""
    grpo = ["swift", "rlhf", "--rlhf_type", "grpo", "--model", "Qwen/Qwen2.5-7B-Instruct", "--tuner_type", "full",
            "--torch_dtype", "bfloat16", "--per_device_train_batch_size", "2", "--max_length", "2048", "--use_vllm",
            "true"]
    job = one_job(pod([*grpo, "--max_completion_length", "8192", "--tensor_parallel_size", "4",
                       "--sequence_parallel_size", "2"], gpus=8))
    s = job.spec
    assert (s.method, s.seq_len, s.reference_model, s.tensor_parallel, s.context_parallel) == (
        "full", 10240, True, 1, 2)
    assert s.colocated_engine_memory_fraction == 0.9
    defaults = one_job(pod(grpo, gpus=8)).spec
    assert defaults.seq_len == 2048 + 512
    separate = one_job(pod([*grpo, "--vllm_device", "auto", "--vllm_gpu_memory_utilization", "0.7"], gpus=8)).spec
    assert separate.colocated_engine_memory_fraction is None
    gkd = one_job(pod(["swift", "rlhf", "--rlhf_type", "gkd", "--model", "Qwen/Qwen2.5-7B-Instruct",
                       "--teacher_model", "Qwen/Qwen2.5-14B-Instruct", "--train_type", "full"]))
    assert gkd.spec.teacher_model == "Qwen/Qwen2.5-14B-Instruct"
    assert not any("not in the prediction" in a for a in gkd.assumptions)


def test_trl_qlora_leaves_kbit_preparation_to_the_spec() -> None:
    """Whether a TRL job's 4-bit model went through PEFT's prepare_model_for_kbit_training depends on the TRL release
    (0.9-0.2x prepared an unsharded one and cast embeddings and head back to bf16 under bf16; today's SFTTrainer does
    not prepare it): the parser leaves kbit_prepared unset, and a spec or the vramfit.io/spec annotation says it."""
    cmd = ["trl", "sft", "--model_name_or_path", "mistralai/Mistral-7B-v0.1", "--load_in_4bit", "--torch_dtype",
           "bfloat16", "--use_peft", "--per_device_train_batch_size", "4", "--max_length", "4096"]
    job = one_job(pod(cmd))
    assert (job.spec.method, job.spec.kbit_prepared) == ("qlora", None)
    stated = one_job(pod(cmd, annotations={"vramfit.io/spec": "kbit_prepared: true"}))
    assert stated.spec.kbit_prepared is True
    as_lora = one_job(pod(cmd, annotations={"vramfit.io/spec": "method: lora"}))  # no conflict with the annotation
    assert (as_lora.spec.method, as_lora.spec.kbit_prepared) == ("lora", None)


def test_a_teacher_model_flag_is_the_distillation_teacher() -> None:
    """DistillKit-style scripts name the teacher --teacher_model (aws-samples' distil_logits_cli.py loads it in bf16
    and runs it every step): dropped before, 12.3 instead of 21.9 GiB for its Qwen2.5-3B teacher."""
    job = one_job(pod(["accelerate", "launch", "--mixed_precision=bf16", "distil_logits_cli.py",
                       "--student_model=Qwen/Qwen2-1.5B", "--model_name_or_path", "Qwen/Qwen2-1.5B",
                       "--teacher_model=Qwen/Qwen2.5-3B"]))
    assert job.spec.teacher_model == "Qwen/Qwen2.5-3B"
    assert job.provenance["teacher_model"] == "flag --teacher_model"


def test_llama_cookbook_defaults_apply_where_its_command_sets_none() -> None:
    """Meta's llama-cookbook finetuning.py packs every sample to context_length 4096, trains 4 per device and, under
    --enable_fsdp, checkpoints every block (configs/training.py, fsdp.py): nebius's 2 x 8-GPU Llama-3-8B job read
    as 2,048 tokens without checkpointing, 142.8 GiB fitting no GPU, where it needs 66 GiB."""
    base = ["torchrun", "--nnodes=2", "--nproc_per_node=8", "getting-started/finetuning/finetuning.py",
            "--model_name", "meta-llama/Meta-Llama-3-8B"]
    job = one_job(pod([*base, "--enable_fsdp", "--fsdp_config.pure_bf16", "--batch_size_training=8"], gpus=8))
    s = job.spec
    assert (s.seq_len, s.micro_batch_size, s.gradient_checkpointing, s.sharding) == (4096, 8, "full", "fsdp")
    assert "context_length 4096" in job.provenance["seq_len"]
    off = one_job(pod([*base, "--enable_fsdp", "--fsdp_config.fsdp_activation_checkpointing", "False"], gpus=8)).spec
    assert (off.gradient_checkpointing, off.micro_batch_size) == ("none", 4)
    lora = one_job(pod([*base, "--use_peft", "--peft_method", "lora", "--batching_strategy", "padding"])).spec
    assert lora.method == "lora" and lora.lora is not None
    assert (lora.lora.rank, lora.lora.alpha, lora.lora.target_modules) == (8, 32, ["q_proj", "v_proj"])
    assert (lora.sequence_lengths, lora.gradient_checkpointing) == ("variable", "none")
    ranked = one_job(pod([*base, "--use_peft", "--lora_config.r", "64", "--lora_config.lora_alpha", "128"])).spec
    assert ranked.lora is not None and (ranked.lora.rank, ranked.lora.alpha) == (64, 128)


def _scripts(data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "scripts"}, "data": data}


ENTRYPOINT = """#!/bin/bash
set -euo pipefail
MODEL_NAME=Qwen/Qwen2.5-7B
exec torchrun --nproc_per_node 2 train.py --model_name_or_path $MODEL_NAME \\
  --per_device_train_batch_size 2 --max_seq_length 4096 --gradient_checkpointing true --bf16 true
"""


@pytest.mark.parametrize("command", [["bash", "-xc", "/workspace/script.sh"], ["bash", "/workspace/script.sh"],
                                     ["/workspace/script.sh"], ["sh", "-c", "source /workspace/script.sh"],
                                     ["bash", "-eo", "pipefail", "/workspace/script.sh"],
                                     ["/usr/bin/env", "bash", "/workspace/script.sh"],
                                     ["bash", "-c", "timeout 72h nohup bash /workspace/script.sh"],
                                     ["bash", "-c", "exec env NCCL_DEBUG=INFO /workspace/script.sh"],
                                     ["bash", "--rcfile", "/etc/profile", "/workspace/script.sh"]])
def test_an_entrypoint_script_carried_in_a_configmap_is_read(command: list[str]) -> None:
    """Platform teams template a job as an entrypoint script in a ConfigMap the pod mounts; the script was never
    opened, and the container's MODEL_NAME (which the script overrides) named a model the job does not train."""
    job = one_job(_scripts({"script.sh": ENTRYPOINT}),
                  pod(command, env={"MODEL_NAME": "meta-llama/Llama-3.1-8B-Instruct"}, gpus=2))
    s = job.spec
    assert (s.model, s.micro_batch_size, s.seq_len, s.gradient_checkpointing) == ("Qwen/Qwen2.5-7B", 2, 4096, "full")
    assert any("/workspace/script.sh, carried by the manifest" in a for a in job.assumptions), job.assumptions


def test_a_script_the_manifest_does_not_carry_is_named() -> None:
    outcomes = scan(pod(["bash", "/opt/train.sh"]))
    assert "the command runs /opt/train.sh, which the manifest does not carry" in str(outcomes[0])


def test_a_script_that_runs_itself_is_followed_a_few_levels() -> None:
    job = one_job(_scripts({"loop.sh": "#!/bin/sh\n/opt/loop.sh\n" + ENTRYPOINT.split("\n", 1)[1]}),
                  pod(["/opt/loop.sh"], gpus=2))
    assert job.spec.model == "Qwen/Qwen2.5-7B"


def test_a_script_that_fans_out_is_read_within_the_job_budget() -> None:
    """A carried script that runs itself thousands of times is expanded only while the job's text budget lasts, with
    one note, not once per line per level (4 levels of 20,000 lines would be 1.6e17 commands)."""
    job = one_job(_scripts({"fan.sh": "#!/bin/sh\n" + "/opt/fan.sh\n" * 20_000}),
                  pod(["/opt/fan.sh"], annotations={"vramfit.io/spec": "model: gpt2"}))
    notes = [a for a in job.assumptions if "/opt/fan.sh" in a]
    assert len(notes) <= 3 and any("more often or more deeply" in a for a in notes), notes


def test_a_server_started_in_the_background_is_not_the_trainer() -> None:
    """TRL's one-node GRPO example starts vLLM in the background and then trains: shlex read `&` at the end of the
    line as `&;`, which separated nothing, so the trainer's command was swallowed and the server's
    --tensor-parallel-size became training tensor parallelism (75.5 instead of 156.6 GiB)."""
    script = ("CUDA_VISIBLE_DEVICES=0,1,2,3 trl vllm-serve --model Qwen/Qwen2.5-7B --tensor-parallel-size 2 "
              "--data-parallel-size 2 &\n"
              "CUDA_VISIBLE_DEVICES=4,5,6,7 trl grpo --model_name_or_path Qwen/Qwen2.5-7B --use_vllm "
              "--vllm_mode server\n")
    job = one_job(pod(["bash", "-c", script], gpus=8))
    assert (job.spec.tensor_parallel, job.spec.micro_batch_size, job.spec.gradient_checkpointing) == (1, 8, "full")
    assert any("trl vllm-serve serves generation beside the training" in a for a in job.assumptions)
    tokens = split_script(["bash", "-c", "a &\nb && c ;& d"], {}).commands
    assert tokens == [["a"], ["b"], ["c"], ["d"]]


def test_a_teacher_vramfit_cannot_size_is_dropped_with_a_note() -> None:
    """An API teacher (--teacher_model gpt-4o-mini) refused the whole job at prediction time; a command's teacher that
    names no model vramfit knows is dropped with a note, one the annotation names stays for it to fix."""
    job = one_job(pod(["python", "distil.py", "--model_name_or_path", "Qwen/Qwen2.5-1.5B",
                       "--teacher_model", "gpt-4o-mini"]))
    assert job.spec.teacher_model is None
    assert any("'gpt-4o-mini'" in a and "not in the prediction" in a for a in job.assumptions), job.assumptions
    stated = one_job(pod(["python", "t.py", "--model_name_or_path", "gpt2"],
                         annotations={"vramfit.io/spec": "teacher_model: gpt-4o-mini"}))
    assert stated.spec.teacher_model == "gpt-4o-mini"


def test_what_a_sourced_script_exports_is_the_commands_environment_after_it() -> None:
    """``source env.sh && torchrun ... $SEQ``: the shell runs env.sh's exports before expanding what follows, so its
    SEQ wins over the container's; the outer command was expanded before env.sh was read."""
    env_sh = "#!/bin/bash\nexport MODEL_NAME=Qwen/Qwen2.5-7B\nexport SEQ=4096\n"
    command = ["bash", "-c", "source /workspace/env.sh && torchrun --nproc_per_node 2 train.py --model_name_or_path "
               "$MODEL_NAME --max_seq_length $SEQ --per_device_train_batch_size 2"]
    job = one_job(_scripts({"env.sh": env_sh}), pod(command, env={"SEQ": "1024", "MODEL_NAME": "gpt2"}, gpus=2))
    assert (job.spec.model, job.spec.seq_len) == ("Qwen/Qwen2.5-7B", 4096)
    venv = one_job(pod(["bash", "-c", "source /opt/venv/bin/activate && torchrun train.py --model_name_or_path gpt2"]))
    assert not any("does not carry" in a for a in venv.assumptions)  # a virtualenv's activate is no training script


def test_trl_rloo_is_read_as_the_online_trainer_it_is() -> None:
    """``trl rloo`` (RLOOConfig: GRPO's shape, beta 0.05 by default, so a reference model) was not recognised: batch 1,
    2,048 tokens, no checkpointing, no reference (9.8 instead of 16.4 GiB for TRL's CLI example)."""
    job = one_job(pod(["trl", "rloo", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--dataset_name",
                       "HuggingFaceH4/Polaris-Dataset-53K", "--reward_funcs", "accuracy_reward"], gpus=4))
    s = job.spec
    assert (s.micro_batch_size, s.seq_len, s.gradient_checkpointing, s.reference_model) == (8, 768, "full", True)
    assert "RLOOConfig default beta" in job.provenance["reference_model"]


def test_trl_defaults_fill_a_deepspeed_configs_auto() -> None:
    """TRL's own DeepSpeed configs say "auto" for the batch and the precision: the Trainer fills them from its
    arguments, TRL's per-device 8 and bf16. They read as batch 1 and, with the config carried, fp32 (5.4 / 7.1 instead
    of 15.4 GiB for TRL's CLI GRPO example). A config that states them still wins."""
    auto = '{"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto"}'
    cmd = ["trl", "grpo", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--dataset_name", "trl-lib/DeepMath-103K"]
    job = one_job(pod([*cmd, "--deepspeed", auto], gpus=4))
    assert (job.spec.micro_batch_size, job.spec.precision, job.spec.sharding) == (8, "bf16-mixed", "zero2")
    named = one_job(pod([*cmd, "--deepspeed", "examples/deepspeed_configs/zero2.json"], gpus=4))
    assert (named.spec.micro_batch_size, named.spec.precision) == (8, "bf16-mixed")


def test_axolotls_nested_trl_section_is_read() -> None:
    """axolotl's GRPO settings sit under trl: (beta, use_vllm, max_completion_length ...): trl.beta 0.001 was
    reported as "beta not set", and the reference model the KL term needs was missed."""
    config = {"base_model": "Qwen/Qwen2.5-7B-Instruct", "rl": "grpo", "sequence_len": 1024, "micro_batch_size": 4,
              "bf16": True, "gradient_checkpointing": True,
              "trl": {"beta": 0.001, "use_vllm": True, "num_generations": 16, "max_completion_length": 512}}
    job = _config_job(config, ["axolotl", "train"], gpus=8)
    assert job.spec.reference_model is True and "trl.beta" in job.provenance["reference_model"]
    assert any("vLLM in server mode" in a for a in job.assumptions), job.assumptions


def test_a_command_kept_in_a_variable_by_read_heredoc_is_read() -> None:
    """OpenRLHF's example scripts keep the training command in a variable (read -r -d '' training_commands <<EOF ...
    EOF) and run `deepspeed --module $training_commands`: the variable was never set, so no model was found."""
    script = ("set -x\nread -r -d '' training_commands <<EOF\nopenrlhf.cli.train_dpo \\\n   --save_path ./ckpt \\\n"
              "   --micro_train_batch_size 1 \\\n   --pretrain meta-llama/Meta-Llama-3-8B \\\n   --max_len 8192 \\\n"
              "   --zero_stage 3 \\\n   --gradient_checkpointing\nEOF\n\n"
              'if [[ ${1} != "slurm" ]]; then\n    deepspeed --module $training_commands\nfi\n')
    job = one_job(pod(["bash", "-c", script], gpus=8))
    s = job.spec
    assert (s.model, s.seq_len, s.sharding, s.micro_batch_size, s.gradient_checkpointing) == (
        "meta-llama/Meta-Llama-3-8B", 8192, "zero3", 2, "full")


def test_verl_main_ppo_reads_its_hydra_overrides() -> None:
    """verl's ``python -m verl.trainer.main_ppo key=value ...`` was refused with the generic no-model error, and with
    the model annotated every stated override read as "the job does not say" (180.9 instead of 141.0 GiB)."""
    overrides = ["algorithm.adv_estimator=grpo", "data.max_prompt_length=512", "data.max_response_length=1024",
                 "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40", "actor_rollout_ref.actor.use_kl_loss=True",
                 "actor_rollout_ref.model.enable_gradient_checkpointing=True",
                 "actor_rollout_ref.rollout.gpu_memory_utilization=0.6"]
    job = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", *overrides], gpus=8))
    s = job.spec
    assert (s.model, s.seq_len, s.micro_batch_size, s.gradient_checkpointing, s.sharding) == (
        "Qwen/Qwen2-7B-Instruct", 1536, 40, "full", "fsdp")
    assert s.colocated_engine_memory_fraction is None  # the engine sleeps in training
    # verl keeps every FSDP role but the actor under CPUOffload (fsdp_workers.py): the reference is not on the GPUs
    assert s.reference_model is None and any("reference model's parameters live in host memory" in a
                                             for a in job.assumptions)
    offloaded = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", *overrides,
                             "actor_rollout_ref.ref.fsdp_config.param_offload=True",
                             "actor_rollout_ref.rollout.free_cache_engine=False",
                             "actor_rollout_ref.model.lora_rank=64"],
                            gpus=8)).spec
    assert (offloaded.reference_model, offloaded.colocated_engine_memory_fraction, offloaded.method) == (
        None, 0.6, "lora")


_VERL_PPO = ["algorithm.adv_estimator=gae", "data.max_prompt_length=512", "data.max_response_length=512",
             "actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
             "critic.model.path=deepseek-ai/deepseek-llm-7b-chat", "critic.ppo_micro_batch_size_per_gpu=32",
             "trainer.n_gpus_per_node=8", "trainer.nnodes=1"]


def test_verl_ppo_trains_a_critic_beside_the_actor() -> None:
    """verl's PPO (adv_estimator gae, its default) trains a critic in the actor's resource pool; it was only noted
    ("not in the prediction"), so examples/ppo_trainer/run_deepseek7b_llm.sh read 9.1 GiB per GPU short, and the
    actor's checkpointing (verl's default enable_gradient_checkpointing True) read as off when unstated."""
    job = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", *_VERL_PPO], gpus=8))
    s = job.spec
    assert (s.critic_model, s.critic_micro_batch_size, s.critic_gradient_checkpointing) == (
        "deepseek-ai/deepseek-llm-7b-chat", 32, "full")
    assert (s.micro_batch_size, s.gradient_checkpointing) == (16, "full")
    assert "default" in job.provenance["gradient_checkpointing"]
    no_ckpt = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", *_VERL_PPO,
                           "critic.model.enable_gradient_checkpointing=False"], gpus=8)).spec
    assert no_ckpt.critic_gradient_checkpointing == "none"
    grpo = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", *_VERL_PPO, "algorithm.adv_estimator=grpo"],
                       gpus=8)).spec
    assert grpo.critic_model is None  # GRPO has no critic (critic.enable unset)
    # an offloaded critic comes back for its own update (update_critic loads it first), with the actor resident
    offloaded = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", *_VERL_PPO,
                             "critic.model.fsdp_config.param_offload=True",
                             "critic.model.fsdp_config.optimizer_offload=True"], gpus=8))
    assert (offloaded.spec.critic_model, offloaded.spec.idle_offload) == ("deepseek-ai/deepseek-llm-7b-chat", "critic")
    # so is an offloaded actor, which was read as CPU offload (its weights and optimizer never on the GPU)
    actor = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", *_VERL_PPO,
                         "actor_rollout_ref.actor.fsdp_config.param_offload=True",
                         "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True"], gpus=8)).spec
    assert (actor.offload, actor.idle_offload) == ("none", "policy")


def test_verl_reads_global_and_dynamic_micro_batches() -> None:
    """verl's deprecated global ppo_micro_batch_size is divided over the GPUs (fsdp_workers.py); use_dynamic_bsz
    packs micro-batches to ppo_max_token_len_per_gpu tokens (16,384 for the actor and 32,768 for the critic by
    default): both read as the TrainingSpec's default micro-batch of 1 before."""
    base = [t for t in _VERL_PPO if "micro_batch_size_per_gpu" not in t]
    legacy = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", *base,
                          "actor_rollout_ref.actor.ppo_micro_batch_size=64", "critic.ppo_micro_batch_size=128"],
                         gpus=8)).spec
    assert (legacy.micro_batch_size, legacy.critic_micro_batch_size) == (8, 16)
    dynamic = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", *base,
                           "actor_rollout_ref.actor.use_dynamic_bsz=True"], gpus=8)).spec
    assert (dynamic.micro_batch_size, dynamic.critic_micro_batch_size) == (16384 // 1024, 32768 // 1024)


def test_verl_critic_from_a_local_checkpoint_is_predicted_as_the_actor() -> None:
    """A critic at a path vramfit cannot size (a local checkpoint of a reward model) refused the whole job; it is
    predicted as the policy's model, with a note."""
    tokens = [t if not t.startswith("critic.model.path=") else "critic.model.path=/ckpt/rm-step-800"
              for t in _VERL_PPO]
    job = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", *tokens], gpus=8))
    assert job.spec.critic_model == job.spec.model
    assert any("'/ckpt/rm-step-800'" in a and "predicted as the policy's model" in a for a in job.assumptions)


def test_openrlhf_ppo_critic_shares_the_actors_gpus_only_when_all_models_colocate() -> None:
    """OpenRLHF's PPO critic starts from --critic_pretrain, else the first --reward_pretrain; it trains on the actor's
    GPUs with --colocate_all_models, its states there while the actor trains unless --deepspeed_enable_sleep."""
    args = ["python3", "-m", "openrlhf.cli.train_ppo_ray", "--pretrain", "OpenRLHF/Llama-3-8b-sft-mixture",
            "--reward_pretrain", "OpenRLHF/Llama-3-8b-rm-mixture", "--micro_train_batch_size", "8",
            "--zero_stage", "3", "--gradient_checkpointing", "--bf16"]
    separate = one_job(pod(args, gpus=8))
    assert separate.spec.critic_model is None
    assert any("critic trains on GPUs of its own" in a for a in separate.assumptions)
    colocated = one_job(pod([*args, "--colocate_all_models"], gpus=8)).spec
    assert colocated.critic_model == "OpenRLHF/Llama-3-8b-rm-mixture"
    # asleep, each engine's states leave the GPUs while the other trains, and come back for its own fit
    asleep = one_job(pod([*args, "--colocate_all_models", "--deepspeed_enable_sleep"], gpus=8)).spec
    assert (asleep.critic_model, asleep.idle_offload) == ("OpenRLHF/Llama-3-8b-rm-mixture", "both")
    grpo = one_job(pod([*args, "--colocate_all_models", "--advantage_estimator", "group_norm"], gpus=8)).spec
    assert grpo.critic_model is None


def test_openrlhf_train_ppo_ray_reads_the_actor() -> None:
    """OpenRLHF's one RL entry point (PPO, GRPO, REINFORCE++) was refused with the generic no-model error; with the
    model named, its --micro_train_batch_size 8 read as 1 (23.5 instead of 36.2 GiB)."""
    job = one_job(pod(["python3", "-m", "openrlhf.cli.train_ppo_ray", "--pretrain", "meta-llama/Meta-Llama-3-8B",
                       "--micro_train_batch_size", "8", "--prompt_max_len", "1024", "--generate_max_len", "1024",
                       "--zero_stage", "3", "--gradient_checkpointing", "--colocate_all_models",
                       "--vllm_gpu_memory_utilization", "0.5", "--vllm_enable_sleep"], gpus=8))
    s = job.spec
    assert (s.model, s.micro_batch_size, s.seq_len, s.sharding, s.reference_model) == (
        "meta-llama/Meta-Llama-3-8B", 8, 2048, "zero3", True)
    assert s.colocated_engine_memory_fraction is None  # the engines sleep while the actor trains
    assert any("the reward model" in a for a in job.assumptions)


def test_grpo_scores_the_completion_only() -> None:
    """TRL's GRPOTrainer asks the model for the completion's logits only (logits_to_keep): the vocabulary-sized
    tensors were priced over prompt + completion (open-r1's 7B recipe: 62.7 of 98.2 GiB in logits)."""
    from predictors.predict import predict

    job = one_job(pod(["trl", "grpo", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--max_prompt_length", "1024",
                       "--max_completion_length", "8192", "--per_device_train_batch_size", "4",
                       "--deepspeed", "zero3.json"], gpus=8))
    assert (job.spec.seq_len, job.spec.logits_tokens) == (9216, 8192)
    every = job.spec.model_copy(update={"logits_tokens": None})
    saved = predict(every, "H100-80GB").vram.peak_vram_bytes - predict(job.spec, "H100-80GB").vram.peak_vram_bytes
    assert saved > 0.5 * 2**30  # the 1,024 prompt positions' logits, and what the loss holds of them


def test_grpo_lengths_given_as_env_vars() -> None:
    """Kubeflow Trainer's GRPO trainer reads MAX_PROMPT_LENGTH / MAX_COMPLETION_LENGTH from the env: a TrainJob's
    1,024 + 2,048 read as the spec's default 2,048 tokens."""
    job = one_job(pod(["torchrun", "train.py"], env={"MODEL_NAME": "Qwen/Qwen2.5-7B-Instruct",
                                                     "MAX_PROMPT_LENGTH": "1024", "MAX_COMPLETION_LENGTH": "2048",
                                                     "PER_DEVICE_TRAIN_BATCH_SIZE": "8"}, gpus=8))
    assert (job.spec.seq_len, job.spec.logits_tokens, job.spec.micro_batch_size) == (3072, 2048, 8)


def test_review_findings_on_scripts_and_rl_readings() -> None:
    """A later review's findings: a DPO job with --max_prompt_length and --max_completion_length is no GRPO (its logits
    were halved); a sourced file's own heredoc config is cut out (source ds.sh lost its ZeRO-3); a read -r -d '' body
    expands its $VARS; $((1024 * 8)) is a number, not two subshells; OpenRLHF's reference model is on the actor's GPUs
    only when colocated; nice -n 10 / timeout -k 30 72h run the script after their option values."""
    dpo = one_job(pod(["trl", "dpo", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--max_prompt_length", "512",
                       "--max_completion_length", "512", "--max_length", "1024"]))
    assert dpo.spec.logits_tokens is None and not any("GRPO" in a for a in dpo.assumptions)
    ds_sh = ("cat > /tmp/ds.json <<EOF\n{\"zero_optimization\": {\"stage\": 3}}\nEOF\n"
             "export MODEL=Qwen/Qwen2.5-7B\n")
    sourced = one_job(_scripts({"ds.sh": ds_sh}), pod(["bash", "-c", "source /workspace/ds.sh && deepspeed train.py "
                                                       "--model_name_or_path $MODEL --deepspeed /tmp/ds.json"]))
    assert (sourced.spec.model, sourced.spec.sharding) == ("Qwen/Qwen2.5-7B", "zero3")
    read = ("MODEL=meta-llama/Meta-Llama-3-8B\nread -r -d '' cmd <<EOF\nopenrlhf.cli.train_sft --pretrain $MODEL "
            "--max_len 2048\nEOF\ndeepspeed --module $cmd\n")
    assert one_job(pod(["bash", "-c", read])).spec.model == "meta-llama/Meta-Llama-3-8B"
    verl = one_job(pod(["bash", "-c", "python3 -m verl.trainer.main_ppo data.max_response_length=$((1024 * 8)) "
                                      "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct"], gpus=8))
    assert (verl.spec.model, verl.spec.seq_len) == ("Qwen/Qwen2-7B-Instruct", 512 + 8192)
    ppo = ["python3", "-m", "openrlhf.cli.train_ppo_ray", "--pretrain", "meta-llama/Meta-Llama-3-8B"]
    assert one_job(pod(ppo, gpus=8)).spec.reference_model is None
    assert one_job(pod([*ppo, "--colocate_actor_ref"], gpus=8)).spec.reference_model is True
    for wrapper in (["nice", "-n", "10"], ["timeout", "-k", "30", "72h"], ["numactl", "-N", "0"]):
        job = one_job(_scripts({"script.sh": ENTRYPOINT}),
                      pod([*wrapper, "bash", "/workspace/script.sh"], env={"MODEL_NAME": "gpt2"}, gpus=2))
        assert job.spec.model == "Qwen/Qwen2.5-7B", wrapper


def test_openrlhf_ppo_reads_its_batch_default_dynamic_batches_and_adam_offload() -> None:
    """OpenRLHF's train_ppo_ray: --micro_train_batch_size defaults to 4 (read as 1), --use_dynamic_batch packs
    --train_max_tokens_per_gpu tokens per micro-batch (not read: 27.0 GiB against 37.8), and --adam_offload puts
    DeepSpeed's Adam on the CPU (ignored: its flagship script read 98 GiB, fitting no H100, for 38)."""
    base = ["python3", "-m", "openrlhf.cli.train_ppo_ray", "--pretrain", "OpenRLHF/Llama-3-8b-sft-mixture",
            "--zero_stage", "3", "--bf16", "--advantage_estimator", "group_norm"]
    assert one_job(pod(base, gpus=8)).spec.micro_batch_size == 4
    dynamic = one_job(pod([*base, "--use_dynamic_batch", "--train_max_tokens_per_gpu", "16384"], gpus=8)).spec
    assert dynamic.micro_batch_size == 8  # 16,384 tokens of 1,024 + 1,024-token sequences
    offloaded = one_job(pod([*base, "--micro_train_batch_size", "8", "--adam_offload"], gpus=8)).spec
    assert (offloaded.micro_batch_size, offloaded.offload) == (8, "optimizer")


def test_openrlhf_ppo_shards_the_actor_over_its_own_world() -> None:
    """OpenRLHF places its actor on --actor_num_nodes x --actor_num_gpus_per_node GPUs (RayActorGroup, defaults 1 x 8)
    and the vLLM engines, reference, reward and critic models not colocated with it on GPUs of their own. Its
    train_ppo_llama_ray.sh in one 8-GPU pod trains the actor on 2: ZeRO-3 was divided over all 8 (weights 1.87 GiB
    per GPU for 7.48, the peak 11.8 GiB under once --adam_offload was read)."""
    args = ["python3", "-m", "openrlhf.cli.train_ppo_ray", "--pretrain", "OpenRLHF/Llama-3-8b-sft-mixture",
            "--zero_stage", "3", "--bf16", "--advantage_estimator", "group_norm", "--actor_num_nodes", "1",
            "--actor_num_gpus_per_node", "2", "--vllm_num_engines", "2", "--vllm_tensor_parallel_size", "2"]
    job = one_job(pod(args, gpus=8))
    assert (job.spec.gpus, job.spec.training_gpus, job.spec.data_parallel()) == (8, 2, 2)
    assert "--actor_num_gpus_per_node" in job.provenance["training_gpus"]
    # the default world (1 x 8) is the whole of an 8-GPU pod: nothing to say
    assert one_job(pod(args[:-8], gpus=8)).spec.training_gpus is None
    # a world larger than the job's GPUs is read as all of them, and said
    small = one_job(pod(args[:-8], gpus=4))
    assert small.spec.training_gpus is None
    assert any("more than the job's 4" in a for a in small.assumptions)


def test_verl_recipes_megatron_and_ulysses() -> None:
    """verl's recipe entry points (DAPO) take main_ppo's config but were not read (DDP, batch 1, no checkpointing:
    182 GiB for ~15); `--config-name ppo_megatron_trainer` was read as FSDP with checkpointing; Ulysses sequence
    parallelism was not read, and a deprecated global micro-batch was divided over every GPU instead of world / sp."""
    overrides = ["data.max_prompt_length=2048", "data.max_response_length=2048",
                 "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "actor_rollout_ref.actor.ppo_micro_batch_size=128",
                 "algorithm.adv_estimator=grpo", "trainer.n_gpus_per_node=8",
                 "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"]
    dapo = one_job(pod(["python3", "-m", "recipe.dapo.main_dapo", *overrides], gpus=8)).spec
    assert (dapo.sharding, dapo.gradient_checkpointing, dapo.seq_len, dapo.context_parallel,
            dapo.micro_batch_size) == ("fsdp", "full", 4096, 2, 32)  # 128 over 8 / 2 data-parallel ranks
    megatron = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", "--config-name=ppo_megatron_trainer",
                            *overrides[:4], "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                            "critic.model.path=Qwen/Qwen2.5-7B"], gpus=8))
    m = megatron.spec
    assert (m.sharding, m.tensor_parallel, m.gradient_checkpointing, m.critic_model) == (
        "zero1", 2, "none", "Qwen/Qwen2.5-7B")
    assert any("distributed optimizer read as ZeRO-1" in a for a in megatron.assumptions)
    # megatron_utils.py: DDP grad_reduce_in_fp32=True unless override_ddp_config says otherwise; a fused Adam
    assert (m.fp32_gradients, m.fused_optimizer, m.framework) == (True, True, "megatron")
    bf16_grads = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", "--config-name=ppo_megatron_trainer",
                              *overrides[:4], "actor_rollout_ref.actor.megatron.override_ddp_config."
                                              "grad_reduce_in_fp32=False"], gpus=8)).spec
    assert bf16_grads.fp32_gradients is False
    assert dapo.fp32_gradients is None  # FSDP


def test_verl_dynamic_batches_round_up_to_the_token_budget() -> None:
    """verl packs up to ppo_max_token_len_per_gpu real tokens per micro-batch (seqlen_balancing.py): 24,000 tokens
    of 8,192-token sequences is up to 3 sequences' worth, read as 2 before."""
    s = one_job(pod(["python3", "-m", "verl.trainer.main_ppo", "data.max_prompt_length=4096",
                     "data.max_response_length=4096", "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
                     "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_dynamic_bsz=True",
                     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000"], gpus=8)).spec
    assert s.micro_batch_size == 3


def test_a_command_of_thousands_of_words_is_read_as_far_as_a_real_one_goes() -> None:
    """An 8 MiB Pod of one flag repeated 800,000 times took 30 s to review (a dozen readers scanned every word):
    past the API server's longest webhook timeout. The first MAX_COMMAND_WORDS words are read, with a note; what a
    real command says in them is read as before."""
    from scheduler.spec.trainer_args import MAX_COMMAND_WORDS

    argv = ["torchrun", "train.py", "--model_name_or_path", "meta-llama/Llama-3.1-8B",
            "--per_device_train_batch_size", "4", *["--lr=1"] * (MAX_COMMAND_WORDS * 3)]
    job = one_job(pod(argv, gpus=1))
    assert (job.spec.model, job.spec.micro_batch_size) == ("meta-llama/Llama-3.1-8B", 4)
    assert any(f"its first {MAX_COMMAND_WORDS:,} are read" in a for a in job.assumptions)


def test_the_commands_of_the_first_containers_are_read() -> None:
    """Thousands of containers without trainer settings were each read in turn (2,850 of them: 15.8 s); the first
    MAX_COMMANDS_READ are, with a note when none of them names the trainer's settings."""
    from scheduler.spec.merge import MAX_COMMANDS_READ

    sidecars = [{"name": f"s{i}", "image": "busybox", "command": ["sleep", "inf"]}
                for i in range(MAX_COMMANDS_READ + 5)]
    manifest = pod(["sleep", "inf"], gpus=1,
                   annotations={"vramfit.io/spec": "model: llama-3.2-1b"})
    manifest["spec"]["containers"] += sidecars
    job = one_job(manifest)
    assert job.spec.model == "llama-3.2-1b"
    assert any(f"the first {MAX_COMMANDS_READ} containers were read" in a for a in job.assumptions)


def test_a_carried_script_reads_the_arguments_it_is_run_with() -> None:
    """Every verl example ends in `$@` so that overrides appended to the command win; a ConfigMap script run as
    `bash run.sh key=value ...` read its own values only (25.6 GiB under for larger micro-batches). `bash -c SCRIPT
    arg0 args` binds the same way, and verl's `$((...))` through variables is evaluated."""
    script = ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo "
              "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct "
              "data.max_prompt_length=$((P * 2)) actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 $@\n")
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "scripts"},
              "data": {"run.sh": "P=$((256 + 256))\n" + script}}
    job = pod(["bash", "/scripts/run.sh", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32"], gpus=8,
              volumes=[{"name": "scripts", "configMap": {"name": "scripts"}}])
    job["spec"]["containers"][0]["volumeMounts"] = [{"name": "scripts", "mountPath": "/scripts"}]
    s = one_job(config, job).spec
    assert (s.micro_batch_size, s.seq_len) == (32, 1024 + 512)
    inline = one_job(pod(["bash", "-c", "P=512\n" + script, "run",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"], gpus=8)).spec
    assert inline.micro_batch_size == 8


def test_shell_details_as_bash_reads_them() -> None:
    """From the session's diff review, each against bash itself: `bash -c SCRIPT $0 args` passes flags among the
    arguments (they were dropped); `${1:-default}` takes the argument or the default; `${A:-${B}}` with A set and B
    unset is A; bash's division and remainder truncate toward zero."""
    from scheduler.spec.trainer_args import TextBudget, _arithmetic, _expand, basename, bind_positional

    argv = ["bash", "-c", 'exec torchrun --nproc_per_node 1 train.py "$@"', "_", "--model_name_or_path",
            "meta-llama/Llama-3.1-8B", "--per_device_train_batch_size", "16"]
    assert one_job(pod(argv)).spec.micro_batch_size == 16
    assert bind_positional("M=${1:-llama-3.2-1b}", ["qwen2.5-7b"]) == "M=qwen2.5-7b"
    assert bind_positional("M=${1:-llama-3.2-1b}", []) == "M=llama-3.2-1b"
    assert _expand("A=${LORA_ALPHA:-${LORA_RANK}}", {"LORA_ALPHA": "32"}, TextBudget()) == "A=32"
    assert _expand("A=${LORA_ALPHA:-${LORA_RANK}}", {"LORA_RANK": "8"}, TextBudget()) == "A=8"
    assert _arithmetic("$((-7 / 2)) $((-7 % 2)) $((0 - 9 / 4)) $((7 / 2))") == "-3 -1 -2 3"
    assert _arithmetic("$((__import__))") == "ARITHMETIC"  # a name with no number behind it is not evaluated
    # a long word is not kept by the memoised file name (a webhook would hold every distinct one it was shown)
    from scheduler.spec.trainer_args import _short_basename

    before = _short_basename.cache_info().currsize
    assert basename("/x/" + "y" * 100_000) == "y" * 100_000
    assert _short_basename.cache_info().currsize == before


def test_verl_dynamic_batches_with_ulysses_pack_the_budget_on_every_gpu() -> None:
    """verl packs ppo_max_token_len_per_gpu x sp tokens per micro-batch and Ulysses splits them over the sp ranks:
    each GPU holds the budget (it was read as budget / sp)."""
    s = one_job(pod(["python3", "-m", "recipe.dapo.src.main_dapo", "data.max_prompt_length=2048",
                     "data.max_response_length=20480", "algorithm.adv_estimator=grpo",
                     "actor_rollout_ref.model.path=Qwen/Qwen2.5-32B", "actor_rollout_ref.actor.use_dynamic_bsz=True",
                     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=22528",
                     "actor_rollout_ref.actor.ulysses_sequence_parallel_size=8", "trainer.n_gpus_per_node=8"],
                    gpus=8)).spec
    assert s.micro_batch_size * s.seq_len // s.context_parallel == 22528


def test_diff_review_findings_on_hydra_agents_and_budgets() -> None:
    """Hydra's --config-name names a config (it was taken for transformers' --config_name, a model file, and the
    carried NeMo config went unread); OpenRLHF's --agent_func_path starts the critic from the actor as
    --remote_rm_url does; a bash -c script over the budget is refused before its arguments are bound (binding first
    took 3.9-6.2 s on an 8 MiB Pod)."""
    from scheduler.spec.trainer_args import _config_paths, split_script

    assert _config_paths(["python", "x.py", "--config-name=ft.yaml", "--config_name", "bert/config.json"]) == [
        "ft.yaml"]
    agent = one_job(pod(["python3", "-m", "openrlhf.cli.train_ppo_ray", "--pretrain",
                         "OpenRLHF/Llama-3-8b-sft-mixture", "--agent_func_path", "agent.py",
                         "--colocate_all_models"], gpus=8)).spec
    assert agent.critic_model == "OpenRLHF/Llama-3-8b-sft-mixture"
    refused = split_script(["bash", "-c", "$@" * 400_000, "_", "a", "b"], {})
    assert refused.commands == [] and "not read" in refused.notes[0]


# Pai-Megatron-Patch's run_mcore_qwen.sh, in part: the model's shape by branch, options by string tests, the command
# assigned over several lines and run with eval
PAI_SCRIPT = """
ENV=$1
MODEL_SIZE=$2
DO=${14}
AC=${17}
if [ $MODEL_SIZE = 0.5B ]; then
    NUM_LAYERS=24
    HIDDEN_SIZE=896
elif [ $MODEL_SIZE = 72B ]; then
    NUM_LAYERS=80
    HIDDEN_SIZE=8192
fi
if [ $DO = true ]; then
    do_options=" --use-distributed-optimizer"
else
    do_options=""
fi
if [ $AC = full ]; then
    ac_options=" --recompute-granularity full --recompute-method uniform"
elif [ $AC = sel ]; then
    ac_options=" --recompute-activations"
else
    ac_options=""
fi
if [ "$UNKNOWN_VAR" = "x" ]; then
    extra_options=" --micro-batch-size 4"
fi
run_cmd="torchrun --nproc_per_node 8 pretrain_qwen.py
 --num-layers ${NUM_LAYERS} --hidden-size ${HIDDEN_SIZE} --num-attention-heads 14 --vocab-size 151936
 --swiglu --normalization RMSNorm --seq-length 128 --micro-batch-size 1 ${do_options} ${ac_options} ${extra_options}
 --train-iters 0"
eval ${run_cmd}
"""


def test_script_branches_that_do_not_run_are_not_read() -> None:
    """Assignments in if/elif/else branches whose string tests are false were applied, the last one winning:
    Pai-Megatron-Patch's 0.5B job read as its 72B branch (80 layers), recomputation on where the branch is off. A
    condition on a variable the script does not set keeps its branch, as before. Also: an unquoted YAML `true` in
    the container's args is the word `true` (Python's `True` failed `[ $DO = true ]`), a command assigned over several
    lines and run with `eval` is one command, and a --train-iters of 0 (the script's own arithmetic) is noted, not
    refused."""
    from predictors.catalog import resolve_model

    args = ["dsw", "0.5B", *["1"] * 11, "x", "x", "x", "false", "x"]
    job = one_job(pod(["bash", "-c", PAI_SCRIPT, "_", *args[:13], True, *args[14:]], gpus=8))  # type: ignore[list-item]
    s = job.spec
    assert resolve_model(s).architecture.num_layers == 24
    assert (s.sharding, s.gradient_checkpointing, s.micro_batch_size, s.steps) == ("zero1", "none", 4, None)
    assert any("train_iters" in a and "not a step count" in a for a in job.assumptions)
    sel = ["dsw", "72B", *["1"] * 11, "false", "x", "x", "sel"]
    s72 = one_job(pod(["bash", "-c", PAI_SCRIPT, "_", *sel], gpus=8)).spec
    assert resolve_model(s72).architecture.num_layers == 80
    assert (s72.resolved_sharding(), s72.gradient_checkpointing) == ("ddp", "selective")


def test_command_substitutions_and_files_named_by_variables() -> None:
    """A command substitution is one word whatever it runs: fms-fsdp's ``--master_addr=`scontrol show hostnames
    $SLURM_JOB_NODELIST | head -n 1``` was cut at its ``|`` (and ``$(...)`` at its parentheses), and the trainer's
    command lost its flags. A heredoc written to ``> $config_json`` is the file the variable names (bigscience's
    Megatron-DeepSpeed scripts), not a file literally called ``$config_json``."""
    for sub in ("`scontrol show hostnames $NODES | head -n 1`", "$(scontrol show hostnames | head -n 1)"):
        commands = split_script(["bash", "-c", f"torchrun --master_addr={sub} --master_port=1 main.py --a=1"],
                                {}).commands
        assert commands == [["torchrun", "--master_addr=_", "--master_port=1", "main.py", "--a=1"]]
    assert split_script(["bash", "-c", "train.py --n $((2 * 4)) --q '$(x)'"], {}).commands == [
        ["train.py", "--n", "8", "--q", "$(x)"]]
    script = ("config_json=./ds_config.${SLURM_JOBID:-7}.json\ncat <<EOT > $config_json\n"
              '{"zero_optimization": {"stage": 2}}\nEOT\ndeepspeed train.py --deepspeed $config_json '
              "--model_name_or_path Qwen/Qwen2.5-7B")
    split = split_script(["bash", "-c", script], {"SLURM_JOBID": "1000"})
    assert list(split.files) == ["ds_config.1000.json"]
    assert one_job(pod(["bash", "-c", script], gpus=8)).spec.sharding == "zero2"


BRANCH_SCRIPTS = Path(__file__).parent / "data" / "branches"


@pytest.mark.parametrize(("script", "args", "expected"), [
    # `fi  # comment` closes the if (the rest of the script was dropped: the job refused)
    ("ficomment.sh", [], {"micro_batch_size": 2, "gradient_checkpointing": "full"}),
    # `else  # comment` is the else that runs
    ("elsecomment.sh", [], {"micro_batch_size": 2, "gradient_checkpointing": "full", "method": "full"}),
    # `[[ $MODEL == *8B* ]]` is a pattern (compared as a string, BS stayed 8)
    ("glob.sh", [], {"micro_batch_size": 1, "gradient_checkpointing": "full"}),
    # MODEL_SIZE reassigned in a `case` arm: the branches are not decided on its first value (70B read as 8B)
    ("stale.sh", ["--size", "70B"], {"micro_batch_size": 1}),
    # `[ -n $EMPTY ]` is `[ -n ]`, a test of the string "-n": true, the branch runs
    ("n_unquoted.sh", [], {"gradient_checkpointing": "full"}),
    # "${ARGS[@]}" keeps the element "full_shard offload auto_wrap" one word (its offload was lost)
    ("arr_quote.sh", [], {"offload": "params+optimizer", "micro_batch_size": 1}),
])
def test_script_reading_follows_bash_where_it_decides(script: str, args: list[str], expected: dict[str, Any]) -> None:
    """The diff review's cases of the branch pruner and arrays (session 29): each is read as bash runs it, or left
    undecided (its branches kept) where vramfit cannot tell."""
    text = (BRANCH_SCRIPTS / script).read_text()
    spec = one_job(pod(["bash", "-c", text, "_", *args], gpus=8)).spec
    assert {key: getattr(spec, key) for key in expected} == expected
    if script == "stale.sh":  # both branches kept: the last one's model, as before the pruner
        assert spec.model == "meta-llama/Llama-3.1-70B"


@pytest.mark.parametrize("argv", [
    ["srun", "--ntasks-per-node=1", "tune", "run", "full_finetune_distributed", "--config", "llama3_1/8B_full"],
    ["nohup", "tune", "run", "full_finetune_distributed", "--config", "llama3_1/8B_full"],
    ["bash", "-c", "exec tune run full_finetune_distributed --config llama3_1/8B_full batch_size=4"],
])
def test_tune_run_behind_a_wrapper_is_read_as_torchtune(argv: list[str]) -> None:
    """``srun tune run`` (torchtune's full_finetune_multinode.slurm), ``nohup``/``exec tune run``: the wrapper hid the
    torchtune command and the job was refused for naming no model."""
    job = one_job(pod(argv, gpus=8))
    assert (job.spec.model, job.spec.method, job.spec.framework) == ("llama-3.1-8b", "full", "torchtune")
    assert job.spec.micro_batch_size == (4 if "batch_size=4" in argv[-1] else 2)


def test_torchtune_device_mesh_dims() -> None:
    """full_finetune_distributed's ParallelDims: ``tensor_parallel_dim`` (llama3_3/70B_full_multinode ships 8-way TP;
    its plan splits the linears only), ``context_parallel_dim``, ``data_parallel_replicate_dim`` (HSDP). Not read
    before: the 70B multinode job was pure FSDP over 16 GPUs."""
    base = ["tune", "run", "--nnodes", "2", "--nproc_per_node", "8", "full_finetune_distributed", "--config"]
    shipped = one_job(pod([*base, "llama3_3/70B_full_multinode"], gpus=8)).spec
    assert (shipped.tensor_parallel, shipped.sequence_parallel) == (8, False)
    mesh = one_job(pod([*base, "llama3_1/8B_full", "tensor_parallel_dim=2", "context_parallel_dim=2",
                        "data_parallel_replicate_dim=2"], gpus=8)).spec
    assert (mesh.tensor_parallel, mesh.context_parallel) == (2, 2)
    assert mesh.shard_group_size == 1  # 8 ranks / (tp 2 x cp 2 x 2 replicas): each replica one rank


def test_deepspeed_chat_lora_and_precision() -> None:
    """DeepSpeed-Chat step 1 (run_llama2_7b_lora.sh): ``--lora_dim 128 --lora_module_name layers.`` is LoRA of rank 128
    on every linear in the blocks, the embeddings and head still trained unless ``--only_optimize_lora``; its
    ``--dtype`` (default fp16) is DeepSpeed's mixed precision. Read before as a bf16 full fine-tune."""
    step1 = ("cd /DeepSpeedExamples/applications/DeepSpeed-Chat/training/step1_supervised_finetuning && "
             "deepspeed --num_gpus=1 main.py --model_name_or_path meta-llama/Llama-2-7b-hf "
             "--per_device_train_batch_size 4 --max_seq_len 512 --gradient_checkpointing --zero_stage 3 --deepspeed "
             "--lora_dim 128 --lora_module_name layers. --output_dir /out")
    s = one_job(pod(["bash", "-c", step1])).spec
    assert (s.method, s.precision, s.sharding) == ("lora", "16-mixed", "zero3")
    assert s.lora is not None and (s.lora.rank, s.lora.target_modules, s.lora.dropout) == (128, "all-linear", 0.0)
    assert s.lora.modules_to_save == ["embed_tokens", "lm_head"]
    only = one_job(pod(["bash", "-c", step1 + " --only_optimize_lora --dtype bf16"])).spec
    assert only.lora is not None and only.lora.modules_to_save == [] and only.precision == "bf16-mixed"
    full = one_job(pod(["bash", "-c", step1.replace("--lora_dim 128", "--lora_dim 0")])).spec
    assert (full.method, full.precision) == ("full", "16-mixed")


@pytest.mark.parametrize(("ds_optimizer", "expected"), [
    ('"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, ', "adamw"),
    ('"optimizer": {"type": "Lion", "params": {"lr": "auto"}}, ', "lion"),
    ("", "adamw-8bit"),  # no optimizer section: the trainer's own --optim runs
])
def test_a_deepspeed_configs_optimizer_section_replaces_the_trainers(ds_optimizer: str, expected: str) -> None:
    """With an ``optimizer`` section DeepSpeed builds that optimizer and the HF Trainer creates none of its own (a
    DummyOptim): ``--optim adamw_bnb_8bit`` beside it was read as 8-bit states where fp32 AdamW ran."""
    script = ("cat > /tmp/ds.json <<'EOF'\n{" + ds_optimizer + '"zero_optimization": {"stage": 2}, '
              '"bf16": {"enabled": "auto"}}\nEOF\n'
              "torchrun --nproc_per_node 4 train.py --model_name_or_path meta-llama/Llama-3.1-8B "
              "--optim adamw_bnb_8bit --bf16 --deepspeed /tmp/ds.json --per_device_train_batch_size 2")
    job = one_job(pod(["bash", "-c", script], gpus=4))
    assert (job.spec.optimizer, job.spec.sharding) == (expected, "zero2")
    if ds_optimizer:
        assert "optimizer.type" in job.provenance["optimizer"]
        assert any("runs instead of adamw-8bit" in note for note in job.assumptions)


@pytest.mark.parametrize(("model_type", "model"), [
    ("qwen2_5-7b-instruct", "qwen2.5-7b"), ("llama3_1-8b-instruct", "llama-3.1-8b"), ("llama2-13b-chat", "llama-2-13b"),
    ("gemma2-9b-it", "gemma-2-9b"), ("mistral-7b-v2", "mistral-7b-v0.2"), ("chatglm3-6b", "chatglm3-6b"),
])
def test_ms_swift_2_model_type_names_the_model(model_type: str, model: str) -> None:
    """ms-swift 2.x jobs name their model by ``--model_type`` alone (its MODEL_MAPPING holds the checkpoint): they
    were refused for naming no model."""
    from predictors.catalog import lookup_model

    argv = ["swift", "sft", "--model_type", model_type, "--sft_type", "lora", "--dataset", "alpaca-en",
            "--batch_size", "2"]
    job = one_job(pod(argv))
    assert lookup_model(job.spec.model).name == model and job.spec.micro_batch_size == 2
    assert "ms-swift 2.x model type" in job.provenance["model"]


def test_arithmetic_over_a_run_time_value_leaves_the_flag_unknown() -> None:
    """Qwen2.5-Coder's sft script: ``GRAD_ACCU=$((1024 / $GPUS_PER_NODE / 4))`` over ``$(python -c ...)``. The flag got
    the placeholder word and the whole job was refused, an annotation could not rescue it; now the flag is unknown,
    said so."""
    script = ('GPUS_PER_NODE=$(python -c "import torch; print(torch.cuda.device_count());")\n'
              "GRAD_ACCU=$((1024 / $GPUS_PER_NODE / 4))\n"
              "torchrun --nproc_per_node $GPUS_PER_NODE train.py --model_name_or_path Qwen/Qwen2.5-7B "
              "--per_device_train_batch_size 4 --gradient_accumulation_steps ${GRAD_ACCU} --bf16 True\n")
    job = one_job(pod(["bash", "-c", script], gpus=8))
    assert (job.spec.model, job.spec.micro_batch_size, job.spec.grad_accum_steps) == ("Qwen/Qwen2.5-7B", 4, 1)
    assert any("--gradient_accumulation_steps is computed when the job runs" in a for a in job.assumptions)


def test_a_modelscope_download_folder_names_its_model() -> None:
    """ModelScope's snapshot_download writes '.' as '___': /models/Qwen/Qwen2___5-7B-Instruct/ was an unknown local
    path."""
    job = one_job(pod(["torchrun", "--nproc_per_node", "8", "train.py", "--model_name_or_path",
                       "/models/Qwen/Qwen2___5-7B-Instruct/", "--per_device_train_batch_size", "4"], gpus=8))
    assert job.spec.model == "Qwen/Qwen2.5-7B-Instruct"


def test_artidoro_qlora_script_defaults() -> None:
    """artidoro/qlora's Guanaco script (qlora.py --bits 4 --double_quant --lora_modules all --source_max_len 16
    --target_max_len 512): a NF4 double-quantized base with adapters on every linear, 16 + 512 tokens padded to the
    longest. Read before as LoRA on q/v over a bf16-mixed base at 2,048 tokens (29.2 GiB for 7.8)."""
    argv = ["python", "qlora.py", "--model_name_or_path", "meta-llama/Llama-2-7b-hf", "--bits", "4", "--quant_type",
            "nf4", "--double_quant", "--lora_modules", "all", "--lora_r", "64", "--lora_dropout", "0.1",
            "--source_max_len", "16", "--target_max_len", "512", "--per_device_train_batch_size", "4", "--bf16"]
    s = one_job(pod(argv)).spec
    assert (s.method, s.resolved_quantization, s.seq_len, s.sequence_lengths, s.micro_batch_size) == (
        "qlora", "nf4-dq", 528, "variable", 4)
    assert s.lora is not None and (s.lora.rank, s.lora.target_modules, s.lora.dropout) == (64, "all-linear", 0.1)
    assert s.gradient_checkpointing == "full"


@pytest.mark.parametrize(("argv", "quantization"), [
    (["python", "finetune.py", "--use_qlora", "1", "--lora_r", "8"], "nf4-dq"),  # LMFlow
    (["python", "finetune_clm_lora.py", "--load_in_bits", "4", "--lora_r", "8"], "nf4-dq"),  # Llama-Chinese
    (["deepspeed", "fastchat/train/train_lora.py", "--q_lora", "True", "--deepspeed",
      "playground/deepspeed_config_s2.json"], "nf4-dq"),  # FastChat: ZeRO-2 by its config's name too
    (["accelerate", "launch", "scripts/sft.py", "--use_peft", "--load_in_4bit"], "nf4"),  # the handbook
])
def test_scripts_own_quantization_switches(argv: list[str], quantization: str) -> None:
    """``--use_qlora 1`` (LMFlow), ``--load_in_bits 4`` (Llama-Chinese), ``--q_lora True`` (FastChat) quantize the base
    to 4 bits; they were LoRA or full fine-tunes over a 16-bit base (2-4x over). TRL's --load_in_4bit takes its
    ModelConfig's use_bnb_nested_quant False (NF4 without double quantization)."""
    job = one_job(pod([argv[0], *argv[1:], "--model_name_or_path", "meta-llama/Llama-2-7b-hf"]))
    assert (job.spec.method, job.spec.resolved_quantization) == ("qlora", quantization)
    if "deepspeed_config_s2.json" in argv[-1]:
        assert job.spec.sharding == "zero2"


@pytest.mark.parametrize(("extra", "precision"), [
    ([], "32-true"), (["--bf16", "False"], "32-true"), (["--bf16", "False", "--fp16", "False"], "32-true"),
    (["--bf16", "True"], "bf16-mixed"), (["--bf16", "False", "--fp16", "True"], "16-mixed"),
])
def test_hf_trainer_half_precision_switched_off_is_fp32(extra: list[str], precision: str) -> None:
    """An HF Trainer script told ``--bf16 False`` trains in fp32, as one told nothing does; it read as the spec's
    default bf16-mixed."""
    argv = ["torchrun", "train.py", "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--do_train",
            "--per_device_train_batch_size", "1", *extra]
    assert one_job(pod(argv)).spec.precision == precision
