"""Trainer command lines and configs read with each tool's own semantics (found by the trainer-args audit).

Each case is a Pod running a real-world command line; the test checks the TrainingSpec field the trainer would
actually run with, and the note that says what was inferred.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.scheduler.spec.helpers import one_job, pod

M = "meta-llama/Llama-3.1-8B"
HF = ["python", "train.py", "--model_name_or_path", M]
DS_AUTO = '{"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}'


def _notes(job: Any) -> str:
    return "\n".join(job.assumptions)


# --- DeepSpeed "auto" ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "precision", "source"),
    [
        ([], "32-true", "DeepSpeed config (inline) key bf16 + DeepSpeed config (inline) key fp16"),
        (["--bf16"], "bf16-mixed", "flag --bf16"),
        (["--fp16"], "16-mixed", "flag --fp16"),
    ],
    ids=["no-flag-fp32", "bf16-flag", "fp16-flag"],
)
def test_deepspeed_auto_precision_is_the_trainers_flag(flags: list[str], precision: str, source: str) -> None:
    job = one_job(pod([*HF, *flags, "--deepspeed", DS_AUTO]))
    assert job.spec.precision == precision
    assert job.provenance["precision"] == source
    assert ('enabled "auto"' in _notes(job)) is (not flags)


def test_deepspeed_auto_precision_yields_to_accelerate_env() -> None:
    job = one_job(pod([*HF, "--deepspeed", DS_AUTO], {"ACCELERATE_MIXED_PRECISION": "bf16"}))
    assert job.spec.precision == "bf16-mixed"


# --- PEFT / TRL ------------------------------------------------------------------------------------


def test_use_peft_false_trains_in_full_whatever_the_lora_flags() -> None:
    job = one_job(pod(["trl", "sft", "--model_name_or_path", M, "--use_peft", "false", "--lora_r", "16"]))
    assert job.spec.method == "full"
    assert job.provenance["method"] == "flag --use_peft"
    assert "flag --lora_r ignored: flag --use_peft is false" in _notes(job)


def test_list_valued_lora_flags_take_every_value() -> None:
    job = one_job(pod(["trl", "sft", "--model_name_or_path", M, "--use_peft", "--lora_target_modules", "q_proj",
                       "k_proj", "v_proj", "--lora_modules_to_save", "embed_tokens", "lm_head", "--bf16"]))
    lora = job.spec.resolved_lora
    assert lora is not None
    assert lora.target_modules == ["q_proj", "k_proj", "v_proj"]
    assert lora.modules_to_save == ["embed_tokens", "lm_head"]
    assert job.spec.precision == "bf16-mixed"  # the flag after the list is still read


@pytest.mark.parametrize("dora", [True, False])
def test_dora_is_read_as_lora_use_dora(dora: bool) -> None:
    flags = ["--use_dora"] if dora else []
    job = one_job(pod(["trl", "sft", "--model_name_or_path", M, "--use_peft", "--lora_r", "16", *flags]))
    assert job.spec.method == "lora"
    assert job.spec.resolved_lora is not None and job.spec.resolved_lora.use_dora is dora
    if dora:
        assert job.provenance["lora.use_dora"] == "flag --use_dora"


def test_tf32_flag_sets_the_spec_tf32() -> None:
    """HF --tf32 (torch.backends.cuda.matmul.allow_tf32) becomes the spec's tf32, which prices a 32-true job's
    matmuls at the tensor cores' TF32 rate; before, it was only noted as an over-estimate of the runtime."""
    job = one_job(pod([*HF, "--tf32", "true"]))
    assert job.spec.tf32 is True and job.provenance["tf32"] == "flag --tf32"
    assert one_job(pod([*HF, "--tf32", "false"])).spec.tf32 is False


# --- optimizers ------------------------------------------------------------------------------------




@pytest.mark.parametrize(
    ("optim", "fragment"),
    [
        ("apollo_adamw", "states on a low-rank projection"),  # read as GaLore's: test_galore_parse.py
        ("lion_8bit", "8-bit states"),
        ("rmsprop", "one state per parameter"),
    ],
)
def test_optimizer_read_as_another_is_noted(optim: str, fragment: str) -> None:
    job = one_job(pod([*HF, "--optim", optim]))
    assert fragment in _notes(job)


def test_a_three_state_optimizer_is_an_error_naming_the_flag() -> None:
    from tests.scheduler.spec.helpers import scan

    outcome = scan(pod([*HF, "--optim", "grokadamw"]))[0]
    assert "flag --optim" in str(outcome) and "grokadamw" in str(outcome)


# --- FSDP ------------------------------------------------------------------------------------------


def test_no_shard_with_offload_reads_as_fsdp_offload() -> None:
    job = one_job(pod([*HF, "--fsdp", "no_shard offload"], gpus=2))
    assert (job.spec.sharding, job.spec.offload) == ("fsdp", "params+optimizer")
    assert "NO_SHARD with parameter offload" in _notes(job)


def test_no_shard_without_offload_is_ddp() -> None:
    job = one_job(pod([*HF, "--fsdp", "no_shard"], gpus=2))
    assert (job.spec.sharding, job.spec.offload) == ("ddp", "none")


def test_unknown_fsdp_strategy_is_noted_not_silently_defaulted() -> None:
    job = one_job(pod(["accelerate", "launch", "--use_fsdp", "--fsdp_sharding_strategy", "FULLSHARD", "train.py",
                       "--model_name_or_path", M], gpus=2))
    assert job.spec.sharding == "fsdp"
    assert "'fullshard' is not one of" in _notes(job)


def test_hybrid_shard_on_one_node_shards_over_the_node() -> None:
    job = one_job(pod([*HF, "--fsdp", "hybrid_shard auto_wrap"], gpus=8))
    assert (job.spec.sharding, job.spec.shard_group_size) == ("fsdp", None)
    assert "HYBRID_SHARD" in _notes(job)


@pytest.mark.parametrize(
    ("argv", "env", "sharding"),
    [
        (["accelerate", "launch", "--use_fsdp", "--fsdp_version", "2", "--fsdp_reshard_after_forward", "false",
          "train.py", "--model_name_or_path", M], {}, "fsdp-grad-op"),
        (["accelerate", "launch", "train.py", "--model_name_or_path", M],
         {"ACCELERATE_USE_FSDP": "true", "FSDP_RESHARD_AFTER_FORWARD": "false"}, "fsdp-grad-op"),
        (["accelerate", "launch", "train.py", "--model_name_or_path", M],
         {"ACCELERATE_USE_FSDP": "true", "FSDP_RESHARD_AFTER_FORWARD": "true"}, "fsdp"),
    ],
    ids=["flag", "env-false", "env-true"],
)
def test_fsdp2_reshard_after_forward(argv: list[str], env: dict[str, str], sharding: str) -> None:
    assert one_job(pod(argv, env, gpus=4)).spec.sharding == sharding


# --- accelerate config files -----------------------------------------------------------------------

ACCEL_FSDP = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_offload_params: true
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_activation_checkpointing: true
mixed_precision: fp16
num_machines: 1
num_processes: 4
"""
ACCEL_DS = """distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: 3
  offload_optimizer_device: cpu
  offload_param_device: none
mixed_precision: bf16
fsdp_config:
  fsdp_sharding_strategy: FULL_SHARD
"""


def _heredoc(config: str, launch: str) -> list[str]:
    return ["bash", "-c", f"cat > /etc/accel.yaml <<EOF\n{config}EOF\n{launch}"]


def test_accelerate_config_file_fsdp() -> None:
    job = one_job(pod(_heredoc(ACCEL_FSDP, f"accelerate launch --config_file /etc/accel.yaml train.py "
                                           f"--model_name_or_path {M}"), gpus=4))
    spec = job.spec
    assert (spec.sharding, spec.offload, spec.precision, spec.gradient_checkpointing) == (
        "fsdp-grad-op", "params+optimizer", "16-mixed", "full")
    assert job.provenance["sharding"] == "accelerate config /etc/accel.yaml key fsdp_config.fsdp_sharding_strategy"
    assert "processes" not in _notes(job)  # 4 processes on 4 GPUs


def test_accelerate_config_file_deepspeed_reads_only_its_own_section() -> None:
    job = one_job(pod(_heredoc(ACCEL_DS, f"accelerate launch --config_file=/etc/accel.yaml train.py "
                                         f"--model_name_or_path {M}"), gpus=4))
    assert (job.spec.sharding, job.spec.offload, job.spec.precision) == ("zero3", "optimizer", "bf16-mixed")


def test_accelerate_flags_override_the_config_file() -> None:
    job = one_job(pod(_heredoc(ACCEL_FSDP, f"accelerate launch --config_file /etc/accel.yaml --mixed_precision bf16 "
                                           f"--fsdp_sharding_strategy FULL_SHARD train.py --model_name_or_path {M}"),
                      gpus=4))
    assert (job.spec.sharding, job.spec.precision) == ("fsdp", "bf16-mixed")


ACCEL_ND = """distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
mixed_precision: bf16
num_processes: 8
parallelism_config:
  parallelism_config_dp_shard_size: 2
  parallelism_config_tp_size: 2
  parallelism_config_cp_size: 2
"""


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["accelerate", "launch", "--use_fsdp", "--fsdp_version", "2", "--use_parallelism_config",
          "--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2",
          "--parallelism_config_cp_size", "2", "train.py", "--model_name_or_path", M],
         {}, ("fsdp", 2, 2, "flag --parallelism_config_cp_size")),
        # without --use_parallelism_config accelerate launch does not export them (utils/launch.py)
        (["accelerate", "launch", "--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2",
          "--parallelism_config_cp_size", "2", "train.py", "--model_name_or_path", M],
         {}, ("ddp", 1, 1, "")),
        (_heredoc(ACCEL_ND, f"accelerate launch --config_file /etc/accel.yaml train.py --model_name_or_path {M}"),
         {}, ("fsdp", 2, 2, "accelerate config /etc/accel.yaml key parallelism_config.parallelism_config_cp_size")),
        (["accelerate", "launch", "train.py", "--model_name_or_path", M],
         {"ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "4",
          "PARALLELISM_CONFIG_SP_SIZE": "2"}, ("fsdp", 1, 2, "env PARALLELISM_CONFIG_SP_SIZE")),
    ],
    ids=["launch-flags", "launch-flags-unused", "config-file", "env-ulysses"],
)
def test_accelerate_nd_parallelism(argv: list[str], env: dict[str, str], expected: tuple[str, int, int, str]) -> None:
    """accelerate's ParallelismConfig (dp_shard / tp / cp / sp sizes) from launcher flags, the config file's
    parallelism_config section and the PARALLELISM_CONFIG_* env its launcher sets; DeepSpeed Ulysses sequence
    parallelism (sp) is read as context parallelism."""
    job = one_job(pod(argv, env, gpus=8))
    sharding, tp, cp, cp_source = expected
    assert (job.spec.resolved_sharding(), job.spec.tensor_parallel, job.spec.context_parallel) == (sharding, tp, cp)
    if cp_source:
        assert job.provenance["context_parallel"].startswith(cp_source), job.provenance
    else:
        assert "only with --use_parallelism_config" in "\n".join(job.assumptions)

# --- processes per pod vs GPUs per pod ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("launcher", "gpus", "fragment"),
    [
        (["torchrun", "--nproc_per_node", "4"], 8, "starts 4 processes per pod but each pod requests 8 GPUs"),
        (["torchrun", "--nproc-per-node=2", "--nnodes=1:4"], 8, "starts 2 processes per pod"),
        (["python", "-m", "torch.distributed.run", "--nproc_per_node", "4"], 8, "4 per pod stay idle"),
        (["deepspeed", "--num_gpus", "2"], 4, "starts 2 processes per pod"),
        (["accelerate", "launch", "--num_processes", "16", "--num_machines", "2"], 4,
         "starts 8 processes per pod but each pod requests 4 GPUs: processes would share"),
        (["torchrun", "--nnodes", "2", "--nproc_per_node", "8"], 8, "names 2 nodes but the job has 1 training pod"),
    ],
)
def test_launcher_processes_that_differ_from_the_pods_gpus_are_noted(
    launcher: list[str], gpus: int, fragment: str
) -> None:
    job = one_job(pod([*launcher, "train.py", "--model_name_or_path", M], gpus=gpus))
    assert job.spec.gpus == gpus  # what the pods request stays the count
    assert fragment in _notes(job)


@pytest.mark.parametrize(
    "launcher",
    [["torchrun", "--nproc_per_node", "8"], ["torchrun", "--nproc_per_node", "gpu"], ["accelerate", "launch"]],
)
def test_launcher_matching_or_silent_gives_no_note(launcher: list[str]) -> None:
    job = one_job(pod([*launcher, "train.py", "--model_name_or_path", M], gpus=8))
    assert "per pod" not in _notes(job) and "node" not in _notes(job)


# --- axolotl and LLaMA-Factory defaults -----------------------------------------------------------


def test_axolotl_lora_keys_without_adapter_train_in_full() -> None:
    config = f"base_model: {M}\nadapter:\nlora_r: 32\nlora_alpha: 16\nsequence_len: 4096\n"
    job = one_job(pod(["accelerate", "launch", "-m", "axolotl.cli.train", "/c.yml"], {"CFG": config}))
    assert job.spec.method == "full"
    assert "sets no adapter: full fine-tuning (lora_alpha, lora_r unused)" in _notes(job)


@pytest.mark.parametrize(
    "argv",
    [
        ["llamafactory-cli", "train", "--model_name_or_path", M, "--stage", "sft", "--cutoff_len", "1024"],
        ["bash", "-c", f"cat > /tmp/x.yaml <<EOF\nmodel_name_or_path: {M}\nstage: sft\ncutoff_len: 1024\nEOF\n"
                       "llamafactory-cli train /tmp/x.yaml"],
    ],
    ids=["flags", "config"],
)
def test_llamafactory_without_finetuning_type_is_lora(argv: list[str]) -> None:
    job = one_job(pod(argv))
    assert job.spec.method == "lora"
    assert "LLaMA-Factory's default lora" in _notes(job)


# --- TRL defaults (second pass) ---------------------------------------------------------------------

TRL_SFT = ["trl", "sft", "--model_name_or_path", M]


@pytest.mark.parametrize(
    ("argv", "seq_len", "source"),
    [
        (TRL_SFT, 1024, "TRL SFTConfig default max_length 1024"),
        ([*TRL_SFT, "--max_length", "4096"], 4096, "flag --max_length"),
    ],
    ids=["default", "given"],
)
def test_trl_sft_length_defaults_to_sftconfigs(argv: list[str], seq_len: int, source: str) -> None:
    job = one_job(pod(argv))
    assert (job.spec.seq_len, job.provenance["seq_len"]) == (seq_len, source)


def test_trl_sft_takes_its_config_defaults_where_the_command_sets_none() -> None:
    # SFTConfig: gradient checkpointing on, bf16 unless fp16; TrainingArguments: 8 sequences per device
    job = one_job(pod(TRL_SFT))
    assert (job.spec.micro_batch_size, job.spec.gradient_checkpointing, job.spec.precision) == (8, "full",
                                                                                               "bf16-mixed")
    assert job.provenance["micro_batch_size"] == "TRL SFTConfig default per_device_train_batch_size 8"
    given = one_job(pod([*TRL_SFT, "--per_device_train_batch_size", "2", "--gradient_checkpointing", "false",
                         "--fp16"]))
    assert (given.spec.micro_batch_size, given.spec.gradient_checkpointing, given.spec.precision) == (2, "none",
                                                                                                     "16-mixed")
    assert "trl sft defaults" in _notes(job) and "bf16" in _notes(job)


def test_a_script_taking_use_peft_is_not_given_trls_defaults() -> None:
    job = one_job(pod([*HF, "--use_peft", "--load_in_4bit"]))
    assert job.spec.quantization != "nf4" or "TRL" not in job.provenance.get("quantization", "")
    assert not any("TRL" in v for v in job.provenance.values())


def test_a_script_that_is_not_trl_sft_keeps_the_spec_default_length() -> None:
    job = one_job(pod(HF))
    assert job.spec.seq_len == 2048 and "seq_len" not in job.provenance


@pytest.mark.parametrize(
    ("extra", "quantization"),
    [([], "nf4"), (["--use_bnb_nested_quant"], "nf4-dq"), (["--bnb_4bit_quant_type", "fp4"], "fp4")],
    ids=["trl-default", "nested", "fp4"],
)
def test_trl_4bit_loading_is_nf4_without_double_quant_by_default(extra: list[str], quantization: str) -> None:
    job = one_job(pod([*TRL_SFT, "--use_peft", "--load_in_4bit", *extra]))
    assert (job.spec.method, job.spec.quantization) == ("qlora", quantization)


# --- axolotl bf16 loads the model in bf16 ------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra_config", "extra_flags", "precision"),
    [
        ("", [], "bf16-true"),
        ("deepspeed: deepspeed_configs/zero2.json\n", [], "bf16-mixed"),
        ("", ["--deepspeed", "deepspeed_configs/zero2.json"], "bf16-mixed"),
    ],
    ids=["plain", "deepspeed-key", "deepspeed-flag"],
)
def test_axolotl_bf16_is_bf16_true_unless_deepspeed_or_fsdp(
    extra_config: str, extra_flags: list[str], precision: str
) -> None:
    config = f"base_model: {M}\nadapter: lora\nbf16: true\n{extra_config}"
    script = f"cat > /c.yml <<EOF\n{config}EOF\naxolotl train /c.yml {' '.join(extra_flags)}"
    job = one_job(pod(["bash", "-c", script]))
    assert job.spec.precision == precision
    assert ("axolotl loads the model in bf16" in _notes(job)) == (precision == "bf16-true")


# --- --fsdp_config as a JSON string or a file ---------------------------------------------------------

FSDP_JSON = '{"fsdp_activation_checkpointing": true, "reshard_after_forward": false}'


@pytest.mark.parametrize(
    "argv",
    [
        [*HF, "--fsdp", "full_shard", "--fsdp_config", FSDP_JSON],
        ["bash", "-c", f"cat > /etc/fsdp.json <<EOF\n{FSDP_JSON}\nEOF\n"
                       f"python train.py --model_name_or_path {M} --fsdp full_shard --fsdp_config /etc/fsdp.json"],
    ],
    ids=["json-string", "file"],
)
def test_fsdp_config_string_or_file_is_read(argv: list[str]) -> None:
    job = one_job(pod(argv, gpus=4))
    assert (job.spec.sharding, job.spec.gradient_checkpointing) == ("fsdp-grad-op", "full")


def test_fsdp_config_file_not_in_the_manifest_is_noted() -> None:
    job = one_job(pod([*HF, "--fsdp", "full_shard", "--fsdp_config", "/cfg/fsdp.json"], gpus=4))
    assert job.spec.sharding == "fsdp"
    assert "FSDP config /cfg/fsdp.json (flag --fsdp_config) is not in the manifest" in _notes(job)


# --- --optim_args momentum --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "optimizer"),
    [
        (["--optim_args", "momentum=0.9"], "sgd-momentum"),
        (["--optim_args", "nesterov=True, momentum=0.95"], "sgd-momentum"),
        (["--optim_args", "momentum=0"], "sgd"),
        ([], "sgd"),
    ],
    ids=["momentum", "spaces", "zero", "none"],
)
def test_sgd_with_momentum_in_optim_args_keeps_a_state(extra: list[str], optimizer: str) -> None:
    job = one_job(pod([*HF, "--optim", "sgd", *extra]))
    assert job.spec.optimizer == optimizer


# --- PET_NPROC_PER_NODE ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("launcher", "env", "noted"),
    [
        (["torchrun"], {"PET_NPROC_PER_NODE": "4"}, True),
        (["python", "-m", "torch.distributed.run"], {"PET_NPROC_PER_NODE": "2", "PET_NNODES": "1"}, True),
        (["torchrun", "--nproc_per_node", "8"], {"PET_NPROC_PER_NODE": "4"}, False),  # the flag wins
        (["torchrun"], {"PET_NPROC_PER_NODE": "8"}, False),
        (["python"], {"PET_NPROC_PER_NODE": "4"}, False),  # not torchrun: the variable is not read
    ],
    ids=["torchrun", "module", "flag-wins", "matching", "not-torchrun"],
)
def test_pet_nproc_per_node_feeds_the_process_count_note(
    launcher: list[str], env: dict[str, str], noted: bool
) -> None:
    job = one_job(pod([*launcher, "train.py", "--model_name_or_path", M], env, gpus=8))
    assert ("env PET_NPROC_PER_NODE" in _notes(job) and "per pod stay idle" in _notes(job)) == noted


@pytest.mark.parametrize(
    ("extra", "precision"),
    [
        ("finetuning_type: lora\nbf16: true\n", "bf16-true"),  # base loaded in bf16, adapters upcast to fp32
        ("bf16: true\n", "bf16-true"),  # lora is LLaMA-Factory's default
        ("finetuning_type: full\nbf16: true\n", "bf16-mixed"),  # what it trains is upcast: fp32 masters
        ("finetuning_type: lora\nbf16: true\ndeepspeed: ds_z3.json\n", "bf16-mixed"),
    ],
    ids=["lora", "default-lora", "full", "deepspeed"],
)
def test_llamafactory_lora_loads_the_base_in_its_compute_dtype(extra: str, precision: str) -> None:
    script = (f"cat > /tmp/x.yaml <<EOF\nmodel_name_or_path: {M}\nstage: sft\ncutoff_len: 1024\n{extra}EOF\n"
              "llamafactory-cli train /tmp/x.yaml")
    assert one_job(pod(["bash", "-c", script])).spec.precision == precision


def test_trl_sft_defaults_leave_the_deepspeed_configs_batch_and_precision() -> None:
    ds = '{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": true}}'
    job = one_job(pod([*TRL_SFT, "--deepspeed", ds]))
    assert (job.spec.micro_batch_size, job.spec.precision) == (2, "16-mixed")
    assert job.spec.seq_len == 1024 and job.spec.gradient_checkpointing == "full"


def test_a_bracketed_module_list_as_python_fire_takes_it() -> None:
    """alpaca-lora's README runs finetune.py (python-fire) with --lora_target_modules '[q_proj,v_proj]': fire reads a
    list. It was read as the modules '[q_proj' and 'v_proj]', and predict refused the job as matching no layer."""
    job = one_job(pod(["python", "finetune.py", "--base_model", M, "--lora_r", "8",
                       "--lora_target_modules", "[q_proj,v_proj]"]))
    assert job.spec.lora is not None and job.spec.lora.target_modules == ["q_proj", "v_proj"]
    from predictors.spec import TrainingSpec

    for written in ("['q_proj', 'v_proj']", '["q_proj","v_proj"]', ["[q_proj", "v_proj]"]):
        spec = TrainingSpec.model_validate({"model": "llama-2-7b", "method": "lora",
                                            "lora": {"target_modules": written}})
        assert spec.lora is not None and spec.lora.target_modules == ["q_proj", "v_proj"], written


def test_deepspeeds_own_switch_is_not_read_as_a_config_file() -> None:
    """DeepSpeed-Chat and OpenRLHF take DeepSpeed's store_true --deepspeed switch and build the config from
    --zero_stage. It was read as a config file named "true", with a note to set the stage the job already gave."""
    base = ["deepspeed", "main.py", "--model_name_or_path", M, "--per_device_train_batch_size", "4"]
    staged = one_job(pod([*base, "--zero_stage", "3", "--deepspeed", "--output_dir", "/out"], gpus=8))
    assert staged.spec.sharding == "zero3"
    assert "DeepSpeed config true" not in _notes(staged) and "without a config file" not in _notes(staged)
    bare = one_job(pod([*base, "--deepspeed"], gpus=8))
    assert "DeepSpeed switched on without a config file" in _notes(bare)
    assert "DeepSpeed config true" not in _notes(bare)
