"""Training settings read from a trainer's command line and from inline trainer configs.

Styles read (all through one table of keys, :data:`KEYS`, except torchtune's own):
- Hugging Face Trainer / TRL / accelerate / torchrun / deepspeed launchers: ``--flag value``,
  ``--flag=value`` and bare boolean flags (``--bf16``), e.g. ``--per_device_train_batch_size 4``;
- LLaMA-Factory: the same HF-style keys plus ``finetuning_type``, ``cutoff_len``, ``lora_rank``,
  ``quantization_bit``, as flags, as ``key=value`` after ``llamafactory-cli train CONFIG``, or as YAML;
- axolotl YAML keys (``base_model``, ``micro_batch_size``, ``sequence_len``, ``adapter``, ...);
- DeepSpeed JSON configs (``zero_optimization.stage``, offload devices) given inline, from a file
  the manifest carries (heredoc, ConfigMap) or, failing that, guessed from the file name;
- torchtune ``tune run [launcher flags] RECIPE --config CONFIG key=value ...``.

Readers return :class:`Setting` values keyed by TrainingSpec field (``lora.rank`` for nested ones),
each with the source it came from, plus notes for what was guessed.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import json
import math
import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import PurePosixPath
from typing import Any

from predictors.errors import SpecError
from predictors.spec import FUSABLE_OPTIMIZERS, MAX_ZERO3_ELEMENTS, MAX_ZERO_BUCKET_ELEMENTS
from scheduler.spec.yamltext import YAML_ERRORS, TextBudget, safe_load, substitute_within


def basename(token: str) -> str:
    """``PurePosixPath(token).name``, memoised for short words: every detector asks it of every word of a command, and
    a hostile command repeats one word hundreds of thousands of times (bench/hostile_reviews.py "many flags"). Long
    words are not kept: a long-running webhook would hold every distinct one it was shown."""
    return _short_basename(token) if len(token) <= _MEMOISED_WORD_CHARS else PurePosixPath(token).name


_MEMOISED_WORD_CHARS = 256


@functools.lru_cache(maxsize=1 << 14)
def _short_basename(token: str) -> str:
    return PurePosixPath(token).name


@dataclass(frozen=True)
class Setting:
    """One TrainingSpec field value and where it was read: ``source`` says how (``flag --bf16``),
    ``where`` is the field path in the object (``spec.template.spec.containers[0]``)."""

    value: Any
    source: str
    where: str


Settings = dict[str, Setting]


@dataclass
class Reading:
    """What one source yielded: settings, notes (guesses, unreadable files) and the trainer seen."""

    settings: Settings = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    trainer: str = ""
    launch: Launch | None = None  # processes the launcher starts, when its flags say
    # a model the job names that vramfit cannot resolve: what the error says when no model is found
    unresolved_model: str = ""
    # the command runs a trainer's tool that does not train (``llamafactory-cli chat``): no config in view is read
    not_training: bool = False


@dataclass(frozen=True)
class Launch:
    """The processes a launcher starts: per node (a pod) and the node count, as far as its flags say.
    torchrun ``--nproc_per_node`` x ``--nnodes`` (``--nnodes 1:4`` elastic: the maximum); DeepSpeed's launcher
    ``--num_gpus`` x ``--num_nodes``; accelerate ``--num_processes`` is the total over ``--num_machines``."""

    per_node: int | None
    nodes: int | None
    source: str


# --- value converters --------------------------------------------------------------------------

_TRUE = {"true", "1", "yes", "y", "on", "auto"}
_FALSE = {"false", "0", "no", "n", "off", "none", ""}


def to_bool(value: Any) -> Any:
    """``True``/``"true"``/``"1"`` -> True, ``"false"``/``"0"`` -> False; anything else unchanged."""
    if isinstance(value, bool) or value is None:
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return value


# Hugging Face ``--optim`` names (transformers ``training_args.OptimizerNames``) and the other trainers' names
# whose optimizer states the TrainingSpec values do not spell out, by the number of state buffers they keep:
# - one buffer per parameter, as SGD with momentum: torch.optim.RMSprop (``square_avg``), torch.optim.Adagrad
#   (``sum``), schedule-free SGD (``z``; facebookresearch/schedule_free);
# - none: LOMO fuses the update into the backward pass (Lv et al. 2023, arXiv:2306.09782);
# - a factored second moment, as Adafactor: AdaLomo (Lv et al. 2023, arXiv:2310.10195).
_ONE_STATE_OPTIMIZERS = ("rmsprop", "adagrad", "schedule_free_sgd")


def optimizer_name(value: Any) -> Any:
    """A trainer's optimizer name (``adamw_torch``, ``paged_adamw_8bit``, ``torch.optim.AdamW``,
    ``bitsandbytes.optim.PagedAdamW8bit``) as a TrainingSpec optimizer; unknown names unchanged, so that
    validation names the flag (AdEMAMix and GrokAdamW keep three states, more than any TrainingSpec optimizer)."""
    text = str(value).strip().lower().replace("-", "_")
    if "ademamix" in text or "grokadam" in text:
        return value
    last = text.rsplit(".", 1)[-1]  # ``torch.optim.RMSprop``
    if last.startswith(_ONE_STATE_OPTIMIZERS):
        return "sgd-momentum"
    if last == "lomo":
        return "sgd"
    if "adalomo" in text or "adafactor" in text:
        return "adafactor"
    if "lion" in text:
        return "lion"
    if "adam" in text:
        if "8bit" in text:
            return "paged-adamw-8bit" if "paged" in text else "adamw-8bit"
        return "adamw-4bit" if "4bit" in text else "adamw"
    if text.endswith("sgd"):
        return "sgd"
    return value


def galore_targets(value: Any) -> list[str] | str | None:
    """GaLore's target modules (HF optim_target_modules: names or regexes matched against module names, or
    "all-linear"; LLaMA-Factory galore_target: "all" or names) as TrainingSpec role names: "attn"/"attention" the
    attention projections, "mlp"/"ffn" the MLP's; None when nothing reads as a role (every block linear is assumed)."""
    if isinstance(value, str) and value.strip().lower().replace("_", "-") in ("all-linear", "all"):
        return "all-linear"
    items = [str(v) for v in value] if isinstance(value, list) else [p for p in str(value).split(",")]
    roles: list[str] = []
    for item in items:
        word = re.sub(r"[^a-z0-9_]+", " ", item.lower()).strip()
        parts = word.split()
        if any(p in ("attn", "self_attn", "attention") for p in parts):
            found = ["q_proj", "k_proj", "v_proj", "o_proj"]
        elif any(p in ("mlp", "ffn", "feed_forward") for p in parts):
            found = ["gate_proj", "up_proj", "down_proj"]
        else:
            found = [p for p in parts if p.endswith("_proj") or p in ("c_attn", "c_proj", "c_fc", "query_key_value")]
        roles += [r for r in found if r not in roles]
    return roles or None


def optimizer_note(value: Any, source: str) -> str | None:
    """What reading the optimizer name ``value`` as a TrainingSpec optimizer leaves out, or None."""
    text = str(value).strip().lower().replace("-", "_")
    mapped = optimizer_name(value)
    if mapped == value:
        return None
    if text.startswith("apollo"):
        # APOLLO (transformers' apollo_adamw, _setup_low_rank_optimizer as GaLore's) keeps AdamW's moments on a
        # rank-r projection of each targeted matrix, projected at random (no SVD, the projector regenerated from a seed)
        return (f"optimizer {value} ({source}) keeps AdamW's states on a low-rank projection; read as GaLore's "
                "projected states at its rank (the projector and GaLore's SVD workspace, which APOLLO's random "
                "projection does not keep, are a small over-estimate)")
    if "lion" in text and "8bit" in text:
        return f"optimizer {value} ({source}) keeps 8-bit states; read as lion with 32-bit states (an over-estimate)"
    if "lomo" in text:
        return (f"optimizer {value} ({source}) fuses the update into the backward pass; read as {mapped} with "
                "optimizer_in_backward")
    if mapped == "sgd-momentum":
        return f"optimizer {value} ({source}) keeps one state per parameter; read as sgd-momentum"
    return None


def attention_name(value: Any) -> Any:
    """A trainer's attention implementation as the TrainingSpec's. Fused kernels that keep no score matrix and take
    the key/value heads as they are read as ``flash``: flash-attn 2/3, transformers' FlexAttention
    (``flex_attention``: ``enable_gqa``) and the Hub's attention kernels (``kernels-community/vllm-flash-attn3``,
    ``kernels-community/flash-attn``: any ``org/name`` value transformers loads as a kernel)."""
    text = str(value).strip().lower()
    if text in ("true", "fa2", "fa3", "flash") or text.startswith(("flash", "flex")) or "flash" in text \
            or "/" in text:
        return "flash"
    if text in ("sdpa", "sdp"):
        return "sdpa"
    if text in ("eager", "disabled", "false"):
        return "eager"
    return None if text == "auto" else value


# --- the key table ------------------------------------------------------------------------------
# Key (flag or YAML key, dashes read as underscores) -> (canonical key, converter). Canonical keys
# are TrainingSpec fields, ``lora.*``, or ``_name`` facts that :func:`resolve` turns into fields.

Convert = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _positive(value: Any) -> Any:
    """Counts that trainers set to -1/0 for "not set" (``max_steps -1``) are dropped."""
    if isinstance(value, int) and not isinstance(value, bool):
        # compared as an int: float() of an int over ~309 digits raises OverflowError
        return None if value <= 0 else value
    try:
        return None if float(value) <= 0 else value
    except (TypeError, ValueError, OverflowError):
        return value


def _json_mapping(value: Any) -> Any:
    """A mapping as given (YAML) or written as a JSON object (a command-line flag); ``None`` for anything else."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str) and value.lstrip().startswith("{"):
        return _load_mapping(value)
    return None


def _checkpointing(value: Any) -> Any:
    """axolotl's ``gradient_checkpointing`` also takes ``offload`` and ``unsloth``: checkpointing whose kept inputs go
    to host memory (its config schema: ``Literal["unsloth", "offload"] | bool``; the offload itself is read by
    :func:`trainer_config_defaults`)."""
    if str(value).strip().lower() in ("offload", "unsloth"):
        return True
    return to_bool(value)


def _offloading(value: Any) -> Any:
    """axolotl's ``activation_offloading`` also takes ``legacy`` and ``disk`` (offloaded either way)."""
    if str(value).strip().lower() in ("legacy", "disk"):
        return True
    return to_bool(value)


# The source of the expandable_segments that importing torchtune sets: it happens after the environment is read, so
# the merge lets it stand over the environment's allocator variables (merge._command_and_env)
TORCHTUNE_ALLOCATOR_SOURCE = ("torchtune (importing it sets expandable_segments:True unless PYTORCH_CUDA_ALLOC_CONF "
                              "has expandable_segments:False)")


def _expandable_segments(value: Any) -> Any:
    """``expandable_segments`` of a ``PYTORCH_CUDA_ALLOC_CONF`` value (``key:value`` pairs, comma-separated); None
    when the value does not set it."""
    for part in str(value).split(","):
        key, _, setting = part.partition(":")
        if key.strip().lower() == "expandable_segments":
            return to_bool(setting.strip()) if setting.strip() else None
    return None


KEYS: dict[str, tuple[str, Convert]] = {
    **dict.fromkeys(
        ("model_name_or_path", "base_model", "model_name", "model_id", "pretrained_model_name_or_path"),
        ("model", _same),
    ),
    **dict.fromkeys(
        (
            "per_device_train_batch_size",
            "micro_batch_size",
            "train_micro_batch_size_per_gpu",
            "per_gpu_train_batch_size",
        ),
        ("micro_batch_size", _same),
    ),
    **dict.fromkeys(
        (
            "max_seq_length",
            # transformers' seq2seq scripts: the encoder's input (the spec's seq_len for encoder-decoder models)
            "max_source_length",
            "max_sequence_length",
            "model_max_length",
            "max_length",
            "cutoff_len",
            "sequence_len",
            "max_seq_len",
            "block_size",
        ),
        ("seq_len", _same),
    ),
    **dict.fromkeys(
        ("gradient_checkpointing", "activation_checkpointing", "fsdp_activation_checkpointing"),
        ("gradient_checkpointing", _checkpointing),
    ),
    "gradient_accumulation_steps": ("grad_accum_steps", _same),
    "max_steps": ("steps", _positive),
    "bf16": ("_bf16", _same),
    # DeepSpeed's old name of its "bf16" section, read only when "bf16" is absent (deepspeed/runtime/
    # precision_config.py get_bfloat16_config: BFLOAT16_OLD "keeping for backwards compatibility"; read_mapping
    # drops it beside "bf16"); a section only, so that no other tool's bfloat16 flag reads as it
    "bfloat16": ("_bf16", lambda v: v if isinstance(v, Mapping) else None),
    "fp16": ("_fp16", _same),
    **dict.fromkeys(("pure_bf16", "fsdp_config.pure_bf16"), ("_pure_bf16", to_bool)),
    # Meta's llama-cookbook (llama-recipes) finetuning.py: --enable_fsdp, --batch_size_training, --context_length
    # (the packed sequence, packing being its default batching_strategy), --quantization 4bit|8bit
    # (src/llama_cookbook/configs/training.py)
    "enable_fsdp": ("_use_fsdp", to_bool),
    "batch_size_training": ("micro_batch_size", _same),
    "context_length": ("seq_len", _same),
    "quantization": ("_quant_bits", lambda v: {"4bit": 4, "8bit": 8}.get(str(v).strip().lower())),
    # scripts' own bit-width switches: artidoro/qlora's --bits 4 (and LMFlow's), Llama-Chinese's --load_in_bits 4; a
    # QLoRA switch: LMFlow's --use_qlora 1, FastChat's and Qwen's --q_lora True (BitsAndBytesConfig load_in_4bit nf4)
    **dict.fromkeys(("bits", "load_in_bits"), ("_quant_bits", lambda v: {"4": 4, "8": 8}.get(str(v).strip()))),
    **dict.fromkeys(("use_qlora", "q_lora"), ("_quant_bits", lambda v: 4 if to_bool(v) is True else None)),
    # axolotl's torchao weight-only quantization of the base (examples/llama-3/qlora-torchao.yaml: "QLoRA is
    # `adapter: lora` with a 4-bit base quant"): weight_dtype int4 / uint4 / nf4 is a 4-bit base, int8 an 8-bit one
    "model_quantization_config": ("_quant_bits", lambda v: {"int4": 4, "uint4": 4, "nf4": 4, "int8": 8}.get(
        str(v.get("weight_dtype", "")).strip().lower()) if isinstance(v, Mapping) else None),
    "mixed_precision": ("_mixed", _same),
    **dict.fromkeys(("torch_dtype", "dtype"), ("_dtype", _same)),
    **dict.fromkeys(("optim", "optimizer"), ("optimizer", optimizer_name)),
    # TrainingArguments' deprecated --adafactor: __post_init__ sets optim to adafactor
    "adafactor": ("optimizer", lambda v: "adafactor" if to_bool(v) is True else None),
    "optim_args": ("_optim_args", _same),  # HF TrainingArguments.optim_args, e.g. "momentum=0.9"
    "optim_target_modules": ("_optim_target_modules", _same),  # HF low-rank optimizers' (GaLore) targets
    "auto_find_batch_size": ("_auto_batch", to_bool),
    # llama-cookbook's --lora_config.r / .lora_alpha / .lora_dropout / .target_modules (configs/peft.py lora_config)
    **dict.fromkeys(("lora_r", "lora_rank", "lora_config.r"), ("lora.rank", _same)),
    **dict.fromkeys(("lora_alpha", "lora_config.lora_alpha"), ("lora.alpha", _same)),
    **dict.fromkeys(("lora_dropout", "lora_dropout_p", "lora_config.lora_dropout"),  # ms-swift 2.x: lora_dropout_p
                    ("lora.dropout", _same)),
    # PEFT's own key name in trainer YAMLs (HfArgumentParser dataclasses that copy LoraConfig's fields)
    **dict.fromkeys(("lora_target_modules", "lora_target", "lora_config.target_modules", "target_modules"),
                    ("lora.target_modules", _same)),
    # Chinese-LLaMA-Alpaca's run_clm_sft_with_peft.py: --trainable "q_proj,v_proj,..." (its LoRA targets); only a
    # value naming modules counts (a bare switch elsewhere says nothing about them)
    "trainable": ("lora.target_modules", lambda v: v if isinstance(v, str) and "proj" in v else None),
    # scripts' own LoRA switches: Qwen's finetune.py, open-instruct's finetune.py, zero_nlp/BELLE (--use_lora),
    # LongLoRA (--low_rank_training); their ranks and targets are each script's (_script_lora_defaults)
    **dict.fromkeys(("use_lora", "low_rank_training"), ("_peft", to_bool)),
    "lora_target_linear": ("_lora_all_linear", to_bool),
    # PEFT modules_to_save (axolotl: lora_modules_to_save; LLaMA-Factory: additional_target)
    **dict.fromkeys(("modules_to_save", "lora_modules_to_save", "additional_target"),
                    ("lora.modules_to_save", _same)),
    **dict.fromkeys(("use_peft", "use_peft_lora"), ("_peft", to_bool)),
    # preference training: axolotl `rl: dpo|ipo|orpo|simpo|kto`, LLaMA-Factory `stage: dpo|kto` with `pref_loss`
    "rl": ("_rl", _same),
    "ray_num_workers": ("_ray_num_workers", _same),  # LLaMA-Factory's RayArguments (read under USE_RAY=1)
    "max_new_tokens": ("_max_new_tokens", _same),  # LLaMA-Factory's generation length (PPO rollouts)
    # online RL (TRL GRPOConfig, open-r1): the policy trains on prompt + generated completion; beta > 0 keeps a
    # frozen reference model; a colocated vLLM engine shares the training GPUs
    "max_prompt_length": ("_max_prompt_length", _same),
    "max_completion_length": ("_max_completion_length", _same),
    "num_generations": ("_num_generations", _same),
    "beta": ("_beta", _same),
    "use_vllm": ("_use_vllm", to_bool),
    "vllm_mode": ("_vllm_mode", _same),
    "vllm_gpu_memory_utilization": ("_vllm_gpu_memory_utilization", _same),
    "vllm_enable_sleep_mode": ("_vllm_sleep", to_bool),
    # axolotl reward_model: true (AxolotlRewardTrainer, TRL's RewardTrainer: chosen and rejected scored together)
    "reward_model": ("_rl", lambda v: "reward" if to_bool(v) is True else None),
    "stage": ("_stage", _same),
    "pref_loss": ("_pref_loss", _same),
    "adapter": ("_adapter", _same),
    "finetuning_type": ("_finetuning_type", _same),
    # DoRA: PEFT LoraConfig(use_dora=True), TRL --use_dora, LLaMA-Factory use_dora, axolotl peft_use_dora
    **dict.fromkeys(("use_dora", "peft_use_dora"), ("lora.use_dora", to_bool)),
    # HF TrainingArguments --tf32 (also axolotl's and LLaMA-Factory's tf32 key): torch.backends.cuda.matmul.allow_tf32
    "tf32": ("tf32", to_bool),
    # PEFT's examples/sft scripts: --use_4bit_quantization / --use_8bit_quantization / --use_nested_quant (utils.py
    # builds BitsAndBytesConfig from them), --use_peft_lora, --use_flash_attn (flash_attention_2, else eager)
    **dict.fromkeys(("load_in_4bit", "use_4bit_quantization"), ("_4bit", to_bool)),
    **dict.fromkeys(("load_in_8bit", "use_8bit_quantization"), ("_8bit", to_bool)),
    "quantization_bit": ("_quant_bits", _same),
    **dict.fromkeys(("bnb_4bit_quant_type", "quantization_type"), ("_quant_type", _same)),
    **dict.fromkeys(
        ("use_bnb_nested_quant", "bnb_4bit_use_double_quant", "double_quantization", "use_nested_quant"),
        ("_double", to_bool)
    ),
    **dict.fromkeys(("attn_implementation", "flash_attn"), ("attention", attention_name)),
    **dict.fromkeys(
        ("use_flash_attention_2", "flash_attention", "use_flash_attn"),
        ("attention", lambda v: "flash" if to_bool(v) is True else None),
    ),
    "sdp_attention": ("attention", lambda v: "sdpa" if to_bool(v) is True else None),
    # --ds-config: Ray's LLM fine-tuning template and the scripts built on it
    **dict.fromkeys(("deepspeed", "deepspeed_config", "deepspeed_config_file", "ds_config"), ("_deepspeed", _same)),
    "use_deepspeed": ("_use_deepspeed", to_bool),
    "zero_stage": ("_zero_stage", _same),
    "offload_optimizer_device": ("_offload_optimizer", _same),
    "offload_param_device": ("_offload_param", _same),
    "zero_optimization": ("_zero_optimization", _same),
    "fsdp": ("_fsdp", _same),
    "use_fsdp": ("_use_fsdp", to_bool),
    **dict.fromkeys(("fsdp_sharding_strategy", "sharding_strategy"), ("_fsdp_strategy", _same)),
    **dict.fromkeys(("fsdp_offload_params", "offload_params"), ("_fsdp_offload", to_bool)),
    # FSDP2 (accelerate ``fsdp_version: 2``, HF ``fsdp_config.reshard_after_forward``): true is FULL_SHARD, false
    # SHARD_GRAD_OP (torch.distributed.fsdp.fully_shard ``reshard_after_forward``); accelerate also takes an FSDP1
    # strategy name here
    **dict.fromkeys(("fsdp_reshard_after_forward", "reshard_after_forward"), ("_fsdp_reshard", _same)),
    "fsdp_config": ("_fsdp_config", _same),
    "fsdp_version": ("_fsdp_version", _same),
    **dict.fromkeys(
        ("tensor_parallel_size", "tensor_model_parallel_size", "tp_size"), ("tensor_parallel", _same)
    ),
    **dict.fromkeys(("pipeline_parallel_size", "pipeline_model_parallel_size"), ("pipeline_parallel", _same)),
    # axolotl's sequence_parallel_degree: the deprecated name of its context_parallel_size (schemas/config.py;
    # validation.py check_context_parallel_size moves it over)
    # ms-swift's --sequence_parallel_size (Ulysses or ring attention over that many GPUs; ms-swift
    # docs/source_en/Instruction/Command-line-parameters.md) and OpenRLHF's --ring_attn_size (ring attention groups):
    # each GPU holds 1/N of a sequence, as context parallelism
    **dict.fromkeys(("context_parallel_size", "sequence_parallel_degree", "sequence_parallel_size", "ring_attn_size"),
                    ("context_parallel", _same)),
    # accelerate >= 1.10 ND parallelism (accelerate launch --parallelism_config_tp_size/--..._cp_size, its config's
    # parallelism_config section, PARALLELISM_CONFIG_* env; accelerate/parallelism_config.py). sp_size is DeepSpeed
    # Ulysses sequence parallelism: each rank holds 1/sp of the sequence outside attention, read as context_parallel
    # Applied in resolve (_resolve_parallelism_config): the launcher passes them on only with --use_parallelism_config
    # (or a config file's parallelism_config section), and the Accelerator builds its ParallelismConfig only then.
    "parallelism_config_tp_size": ("_pc_tp_size", _same),
    "parallelism_config_cp_size": ("_pc_cp_size", _same),
    "parallelism_config_sp_size": ("_sp_size", _same),
    "parallelism_config_dp_shard_size": ("_dp_shard_size", _same),  # > 1: FSDP2 shards over those ranks
    # > 1 with a dp_shard size: HSDP, the dp_shard ranks' states replicated this many times (shard_group_size)
    "parallelism_config_dp_replicate_size": ("_dp_replicate_size", _same),
    "use_parallelism_config": ("_use_parallelism_config", to_bool),
    # the frozen teacher loaded beside the student: TRL's GKDTrainer (examples/scripts/gkd.py, GKDConfig) and
    # DistillationTrainer (trl/scripts/distillation.py), axolotl's GKD plugin (integrations/gkd: gkd_teacher, "held
    # in-process and run every step")
    **dict.fromkeys(("teacher_model_name_or_path", "gkd_teacher"), ("teacher_model", _same)),
    # DistillKit-style logit-distillation scripts (--teacher_model NAME; aws-samples' distil_logits_cli.py loads it in
    # bf16 and runs it every step): a model id only (torchtune's teacher_model is a component mapping, read there)
    **dict.fromkeys(("teacher_model", "teacher_model_id", "teacher_name_or_path"),
                    ("teacher_model", lambda v: v if isinstance(v, str) else None)),
    # vramfit extensions: HF TrainingArguments --torch_compile / axolotl torch_compile; Liger's fused linear
    # cross-entropy (HF --use_liger_kernel, LLaMA-Factory enable_liger_kernel, axolotl
    # liger_fused_linear_cross_entropy) and Cut Cross-Entropy (axolotl cut_cross_entropy); activation offloading
    # (axolotl activation_offloading: true | legacy | disk, torchtune enable_activation_offloading)
    "torch_compile": ("torch_compile", to_bool),
    # How batches are built (sequence_lengths, resolved in _resolve_lengths): packing (TRL SFTConfig packing,
    # LLaMA-Factory packing / neat_packing, axolotl sample_packing, ms-swift --packing) fills each sequence up to the
    # length; without it the SFT collators pad each batch to its longest sample (TRL's
    # DataCollatorForLanguageModeling, LLaMA-Factory's SFT collator, axolotl's default); axolotl pad_to_sequence_len
    # pads every batch to sequence_len. PyTorch's allocator setting (PYTORCH_CUDA_ALLOC_CONF, or PYTORCH_ALLOC_CONF
    # from torch 2.9) says whether expandable segments are on.
    "packing": ("_packing", to_bool),
    "sample_packing": ("_sample_packing", to_bool),
    "neat_packing": ("_neat_packing", to_bool),  # LLaMA-Factory turns packing on whenever neat_packing is set
    "pad_to_sequence_len": ("_pad_to_length", to_bool),
    "pytorch_cuda_alloc_conf": ("expandable_segments", _expandable_segments),
    **dict.fromkeys(
        # TRL's SFTConfig use_liger (0.14-0.16, before TrainingArguments' use_liger_kernel took over)
        ("use_liger_kernel", "enable_liger_kernel", "liger_fused_linear_cross_entropy", "cut_cross_entropy",
         "use_liger"),
        ("cross_entropy", lambda v: "fused-linear" if to_bool(v) is True else None),
    ),
    **dict.fromkeys(("activation_offloading", "enable_activation_offloading"), ("activation_offloading", _offloading)),
    # transformers >= 5.24 activation_checkpointing_kwargs (gradient_checkpointing_kwargs, its deprecated alias): a
    # JSON object whose every_n_layers checkpoints every n-th block only and whose offload keeps the checkpointed
    # inputs in pinned host memory (PreTrainedModel.activation_checkpointing_enable); other keys (use_reentrant) are
    # passed to torch.utils.checkpoint and change no memory vramfit models
    **dict.fromkeys(("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"),
                    ("_checkpointing_kwargs", _json_mapping)),
    "task_type": (
        "task",
        lambda v: {
            "causal_lm": "causal-lm",
            "seq_cls": "seq-classification",
            "token_cls": "token-classification",
        }.get(str(v).lower(), v),
    ),
}

# Boolean flags may stand alone (``--bf16``); a following token is their value only if it reads as one.
_BOOL_FLAGS = {k for k, (canon, conv) in KEYS.items() if conv is to_bool} | {"bf16", "fp16"}


def norm_key(key: str) -> str:
    return key.lstrip("-").replace("-", "_").strip().lower()


def read_pairs(pairs: Iterable[tuple[str, Any, str]], where: str) -> dict[str, Setting]:
    """(key, value, source) triples through :data:`KEYS`; unknown keys are ignored (lenient)."""
    raw: dict[str, Setting] = {}
    for key, value, source in pairs:
        rule = KEYS.get(norm_key(key))
        if rule is None or value == RUNTIME_ARITHMETIC:
            continue  # an unknown key, or a value computed when the job runs (read_command notes it)
        canon, convert = rule
        converted = convert(value)
        if converted is None or converted == "":
            continue
        raw[canon] = Setting(converted, source, where)
        if canon == "optimizer":  # the name as written, for :func:`optimizer_note`
            raw["_optimizer_name"] = Setting(value, source, where)
    kwargs = raw.pop("_checkpointing_kwargs", None)
    if kwargs is not None:
        every = kwargs.value.get("every_n_layers")
        if every is not None and every != "":
            raw["checkpoint_every_n_layers"] = Setting(every, f"{kwargs.source} every_n_layers", where)
        if to_bool(kwargs.value.get("offload")) is True and "activation_offloading" not in raw:
            raw["activation_offloading"] = Setting(True, f"{kwargs.source} offload", where)
    args, name = raw.get("_optim_args"), raw.get("_optimizer_name")
    if args is not None and name is not None and str(name.value).strip().lower() == "sgd" and \
            _sgd_momentum(args.value):
        # transformers trainer_optimizer._get_sgd passes --optim_args momentum to torch.optim.SGD, which then keeps a
        # momentum_buffer per parameter: one state, as sgd-momentum
        raw["optimizer"] = Setting("sgd-momentum", _joined(name, args)[0], where)
    return raw


# Raw settings the merge turns into shard_group_size once the pods give the GPU count (merge._shard_group_size)
HYBRID_MARKERS = ("_shard_group", "_dp_replicate", "_hybrid_node")


_PARALLELISM_CONFIG_KEYS = ("_pc_tp_size", "_pc_cp_size", "_sp_size", "_dp_shard_size", "_dp_replicate_size")


def _resolve_parallelism_config(raw: Mapping[str, Setting], out: Settings, notes: list[str]) -> dict[str, Setting]:
    """accelerate's ND parallelism (ParallelismConfig: dp_replicate / dp_shard / tp / cp / sp sizes) as TrainingSpec
    fields, when accelerate applies it: ``accelerate launch`` exports its ``--parallelism_config_*`` flags only with
    ``--use_parallelism_config``, which a config file's ``parallelism_config`` section implies (accelerate
    commands/launch.py ``_validate_launch_command``, utils/launch.py), and the Accelerator builds the config only
    when ACCELERATE_USE_PARALLELISM_CONFIG is true. dp_shard_size defaults to 1 (parallelism_config.py), so a
    replicate size alone is no hybrid layout accelerate runs. Returns the raw settings it implies for the FSDP
    resolution (``_use_fsdp``)."""
    given = {k: raw[k] for k in _PARALLELISM_CONFIG_KEYS if k in raw}
    if not given:
        return {}
    use = raw.get("_use_parallelism_config")
    enabled = (use is not None and use.value is True) or any(
        "key parallelism_config." in setting.source for setting in given.values())
    if not enabled:
        notes.append(f"{', '.join(s.source for s in given.values())}: accelerate applies parallelism_config settings "
                     "only with --use_parallelism_config (ACCELERATE_USE_PARALLELISM_CONFIG=true, or a config file's "
                     "parallelism_config section); ignored")
        return {}
    implied: dict[str, Setting] = {}
    for key, name in (("_pc_tp_size", "tensor_parallel"), ("_pc_cp_size", "context_parallel")):
        if key in given and name not in out:
            out[name] = given[key]
    sequence = given.get("_sp_size")
    if sequence is not None and str(sequence.value).strip() not in ("", "1") and "context_parallel" not in out:
        out["context_parallel"] = Setting(sequence.value, f"{sequence.source} (DeepSpeed Ulysses sequence "
                                          "parallelism: the sequence split over its ranks, read as context_parallel)",
                                          sequence.where)
    shard, replicate = given.get("_dp_shard_size"), given.get("_dp_replicate_size")
    if shard is not None and str(shard.value).strip() not in ("", "0", "1"):
        implied["_use_fsdp"] = Setting(True, f"{shard.source} (sharded data parallelism: FSDP)", shard.where)
    if replicate is not None and (launch_count(replicate.value) or 1) > 1 and \
            (shard is None or (launch_count(shard.value) or 1) <= 1):
        notes.append(f"{replicate.source} without a dp_shard size: accelerate's dp_shard_size defaults to 1, and "
                     "its ParallelismConfig refuses FSDP without sharding ranks (the job does not start as written); "
                     "read as no hybrid sharding")
        return implied
    out.update(hybrid_markers(shard, replicate))
    return implied


def _resolve_galore(raw: Mapping[str, Setting], name: Setting, out: Settings, notes: list[str]) -> None:
    """transformers' GaLore optimizers (``--optim galore_adamw[_8bit|_layerwise]``, ``galore_adafactor``): the rank
    from ``--optim_args rank=N`` (default 128), the targets from ``--optim_target_modules`` (trainer_optimizer.py
    _get_galore_optimizer / _setup_low_rank_optimizer); the layer-wise variants step each parameter in its gradient
    hook (optimizer_in_backward)."""
    args = raw.get("_optim_args")
    text = _optim_args(args.value).get("rank", "") if args is not None else ""
    rank = int(text) if _ASCII_COUNT.fullmatch(text) else None
    kind = "APOLLO" if str(name.value).strip().lower().startswith("apollo") else "GaLore"
    out["galore_rank"] = Setting(rank or 128, f"{args.source} rank" if rank else
                                 f"{name.source} (transformers' {kind} default rank 128)", name.where)
    targets = raw.get("_optim_target_modules")
    roles = galore_targets(targets.value) if targets is not None else None
    if roles is not None:
        out["galore_target_modules"] = Setting(roles, targets.source if targets else name.source, name.where)
    elif targets is not None:
        notes.append(f"{targets.source}: no attention or MLP projection named; GaLore read as projecting every "
                     "block linear")
    if str(name.value).strip().lower().endswith("layerwise") and "optimizer_in_backward" not in out:
        out["optimizer_in_backward"] = Setting(True, f"{name.source} (layer-wise: each parameter stepped in its "
                                               "gradient hook)", name.where)


def hybrid_markers(shard: Setting | None, replicate: Setting | None) -> dict[str, Setting]:
    """Hybrid sharding from a shard size and a replicate size (accelerate's ParallelismConfig dp_shard_size /
    dp_replicate_size, axolotl's keys of those names, torchtitan's data_parallel_shard_degree /
    data_parallel_replicate_degree): with more than one replica, the shard group's size (``_shard_group``) when the
    shard size is stated, else the replica count (``_dp_replicate``: the group is the data-parallel ranks over it,
    known once the GPUs are). Merge turns either into ``shard_group_size``."""
    copies = launch_count(replicate.value) if replicate is not None else None
    if replicate is None or copies is None or copies <= 1:
        return {}
    size = launch_count(shard.value) if shard is not None else None
    if shard is not None and size is not None and size > 1:
        return {"_shard_group": Setting(size, f"{shard.source} with {replicate.source} {copies}", shard.where)}
    return {"_dp_replicate": replicate}


def _optim_args(optim_args: Any) -> dict[str, str]:
    """An ``--optim_args`` string (``"momentum=0.9,nesterov=True"``) as transformers ``_parse_optim_args`` reads it:
    comma-separated ``key=value``, spaces dropped, keys lower-cased here."""
    pairs = (item.partition("=") for item in str(optim_args).replace(" ", "").split(","))
    return {key.lower(): value for key, _, value in pairs if key}


def _sgd_momentum(optim_args: Any) -> bool:
    """Whether an ``--optim_args`` string gives SGD a non-zero momentum."""
    try:
        return float(_optim_args(optim_args).get("momentum", "0")) != 0.0
    except ValueError:
        return False


def read_mapping(data: Mapping[str, Any], label: str, where: str) -> dict[str, Setting]:
    """An inline trainer config (axolotl, LLaMA-Factory, HF/TRL YAML, DeepSpeed JSON) as raw settings. DeepSpeed's old
    ``bfloat16`` section counts only when no ``bf16`` is given (get_bfloat16_config)."""
    has_bf16 = any(norm_key(str(k)) == "bf16" and v is not None for k, v in data.items())
    return read_pairs(((str(k), v, f"{label} key {k}") for k, v in data.items()
                       if v is not None and not (has_bf16 and norm_key(str(k)) == "bfloat16")), where)


def looks_like_trainer_config(data: Any, v1: V1Launch | None = None) -> bool:
    """A mapping that an axolotl / LLaMA-Factory / HF / DeepSpeed config would be (a LLaMA-Factory v1 config only
    under ``v1``, a command that runs LLaMA-Factory v1: :func:`llamafactory_v1_launch`)."""
    if not isinstance(data, dict):
        return False
    keys = {norm_key(str(k)) for k in data}
    return is_llamafactory_v1(data, v1) or bool(
        keys
        & {
            "base_model",
            "model_name_or_path",
            "zero_optimization",
            "train_micro_batch_size_per_gpu",
            "finetuning_type",
            "micro_batch_size",
        }
    ) or (bool(keys & {"model_id", "model_name"}) and bool(keys & _TRAINING_ARGUMENT_KEYS)) or (
        "model_id_or_path" in keys and bool(keys & {"lora", "run_dir", "seq_len", "num_microbatches"}))


# TrainingArguments fields that mark a YAML as a trainer's config when its model key is a script's own (philschmid's
# run_fsdp_qlora.py: TrlParser over its ScriptArguments' model_id and TrainingArguments)
_TRAINING_ARGUMENT_KEYS = frozenset({"per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
                                     "num_train_epochs", "max_steps", "gradient_checkpointing"})


def read_trainer_config(data: Mapping[str, Any], label: str, where: str,
                        v1: V1Launch | None = None) -> tuple[dict[str, Setting], list[str]]:
    """A trainer config (:func:`looks_like_trainer_config`) as raw settings and notes: its keys over the defaults
    its trainer applies (:func:`trainer_config_defaults`); a LLaMA-Factory v1 config (run by ``v1``) by its own
    schema."""
    if v1 is not None and is_llamafactory_v1(data, v1):
        return read_llamafactory_v1(data, label, where, v1)
    if config_flavour(data) == "Ludwig config":
        return _read_ludwig(data, label.replace("trainer config", "Ludwig config"), where)
    if config_flavour(data) == "mistral-finetune config":
        return _read_mistral_finetune(data, label.replace("trainer config", "mistral-finetune config"), where)
    implied, notes = trainer_config_defaults(data, label, where)
    raw = {**implied, **read_mapping(data, label, where)}
    trl = data.get("trl")
    if isinstance(trl, Mapping) and config_flavour(data) == "axolotl config":
        # axolotl's online RL settings sit in a nested trl: section (beta, use_vllm, vllm_mode, num_generations,
        # max_completion_length; axolotl core/builders/rl.py passes them to TRL's GRPOConfig)
        nested = read_pairs(((str(k), v, f"{label} key trl.{k}") for k, v in trl.items() if v is not None
                             and norm_key(str(k)) in _AXOLOTL_TRL_KEYS), where)
        raw.update({k: v for k, v in nested.items() if k not in raw})
    return raw, notes


def _read_mistral_finetune(data: Mapping[str, Any], label: str, where: str) -> tuple[dict[str, Setting], list[str]]:
    """mistral-finetune's YAML (``torchrun -m train example/7B.yaml``; finetune/args.py TrainArgs and model/args.py
    LoraArgs at mistralai/mistral-finetune 14f15e5): ``model_id_or_path``; LoRA (``lora.enable`` True) of
    ``lora.rank`` 16 on every linear of the blocks, dropout 0.0; ``seq_len`` (2048) tokens per sample, packed;
    ``batch_size`` 1, ``num_microbatches`` 1 (accumulation); ``checkpoint`` True; the model in bf16, sharded with FSDP
    on every run. Its config was not read (its model is a local folder, so the job still needs the model named)."""
    lora = data.get("lora") if isinstance(data.get("lora"), Mapping) else {}
    enabled = to_bool(lora.get("enable", True)) is not False
    pairs: list[tuple[str, Any, str]] = [
        ("model_name_or_path", data.get("model_id_or_path"), f"{label} key model_id_or_path"),
        ("max_seq_length", data.get("seq_len", 2048), f"{label} key seq_len" if "seq_len" in data
         else "mistral-finetune default seq_len 2048"),
        ("packing", True, f"{label} (samples packed to seq_len)"),
        ("per_device_train_batch_size", data.get("batch_size", 1), f"{label} key batch_size" if "batch_size" in data
         else "mistral-finetune default batch_size 1"),
        ("gradient_accumulation_steps", data.get("num_microbatches", 1), f"{label} key num_microbatches"
         if "num_microbatches" in data else "mistral-finetune default num_microbatches 1"),
        ("gradient_checkpointing", data.get("checkpoint", True), f"{label} key checkpoint" if "checkpoint" in data
         else "mistral-finetune default checkpoint True"),
        ("torch_dtype", "bfloat16", f"{label} (the model in bf16)"),
        ("fsdp", "full_shard", f"{label} (FSDP on every run)")]
    if enabled:
        pairs += [("use_peft", True, f"{label} key lora (enable True by default)"),
                  ("lora_r", lora.get("rank", 16), f"{label} key lora.rank" if "rank" in lora
                   else "mistral-finetune default lora.rank 16"),
                  ("lora_dropout", lora.get("dropout", 0.0), f"{label} key lora.dropout" if "dropout" in lora
                   else "mistral-finetune default lora.dropout 0.0"),
                  ("lora_target_modules", "all-linear", f"{label} (LoRA on every linear of the blocks)")]
    return read_pairs([p for p in pairs if p[1] not in (None, "")], where), []


def _read_ludwig(data: Mapping[str, Any], label: str, where: str) -> tuple[dict[str, Setting], list[str]]:
    """A Ludwig LLM config (``ludwig train --config CONFIG``; ``model_type: llm``), by Ludwig's schema (0.11:
    schema/llms/quantization.py, peft.py, schema/trainer.py, utils/llm_utils.py): ``base_model``; ``quantization.bits``
    4 or 8 with ``bnb_4bit_quant_type`` nf4, ``bnb_4bit_use_double_quant`` True and the model loaded in
    ``bnb_4bit_compute_dtype`` (float16); ``adapter: {type: lora}`` with r 8, alpha 2 x r, dropout 0.05 by default;
    ``trainer.batch_size`` (1), ``gradient_accumulation_steps`` (1), ``enable_gradient_checkpointing`` (False);
    ``preprocessing.global_max_sequence_length`` when set (else the data's). It was read as an axolotl config (its
    ``base_model``), the 4-bit base and the batch lost."""

    def section(name: str) -> Mapping[str, Any]:
        value = data.get(name)
        return value if isinstance(value, Mapping) else {}

    pairs: list[tuple[str, Any, str]] = [("model_name_or_path", data.get("base_model"), f"{label} key base_model")]
    quant, adapter, trainer, prep = section("quantization"), section("adapter"), section("trainer"), \
        section("preprocessing")
    bits = quant.get("bits")
    if bits is not None:
        pairs += [("bits", bits, f"{label} key quantization.bits"),
                  ("bnb_4bit_quant_type", quant.get("bnb_4bit_quant_type", "nf4"), f"{label} quantization "
                   "(bnb_4bit_quant_type, Ludwig default nf4)"),
                  ("bnb_4bit_use_double_quant", quant.get("bnb_4bit_use_double_quant", True),
                   f"{label} quantization (bnb_4bit_use_double_quant, Ludwig default True)"),
                  ("torch_dtype", quant.get("bnb_4bit_compute_dtype", "float16"), f"{label} quantization "
                   "(the model loaded in bnb_4bit_compute_dtype, Ludwig default float16)")]
    kind = str(adapter.get("type", "")).strip().lower()
    if kind in ("lora", "adalora"):
        rank = adapter.get("r", 8)
        pairs += [("use_peft", True, f"{label} key adapter.type {kind}"),
                  ("lora_r", rank, f"{label} key adapter.r" if "r" in adapter else "Ludwig default adapter r 8"),
                  ("lora_alpha", adapter.get("alpha") or 2 * (launch_count(rank) or 8),
                   f"{label} key adapter.alpha" if adapter.get("alpha") else "Ludwig default alpha 2 x r"),
                  ("lora_dropout", adapter.get("dropout", 0.05),
                   f"{label} key adapter.dropout" if "dropout" in adapter else "Ludwig default dropout 0.05")]
        if adapter.get("target_modules"):
            pairs.append(("lora_target_modules", adapter["target_modules"], f"{label} key adapter.target_modules"))
    pairs += [("per_device_train_batch_size", trainer.get("batch_size", 1), f"{label} key trainer.batch_size"
               if "batch_size" in trainer else "Ludwig default trainer.batch_size 1"),
              ("gradient_accumulation_steps", trainer.get("gradient_accumulation_steps", 1),
               f"{label} key trainer.gradient_accumulation_steps" if "gradient_accumulation_steps" in trainer
               else "Ludwig default gradient_accumulation_steps 1"),
              ("gradient_checkpointing", trainer.get("enable_gradient_checkpointing", False),
               f"{label} key trainer.enable_gradient_checkpointing" if "enable_gradient_checkpointing" in trainer
               else "Ludwig default enable_gradient_checkpointing False")]
    if prep.get("global_max_sequence_length") is not None:
        pairs.append(("max_seq_length", prep["global_max_sequence_length"],
                      f"{label} key preprocessing.global_max_sequence_length"))
    notes = [] if prep.get("global_max_sequence_length") is not None else [
        f"{label} sets no preprocessing.global_max_sequence_length: the sequence length is the data's"]
    return read_pairs([p for p in pairs if p[1] is not None], where), notes


# what axolotl's trl: section sets that changes memory (the others are sampling and reward settings)
_AXOLOTL_TRL_KEYS = frozenset({"beta", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "num_generations",
                               "max_completion_length", "max_prompt_length", "vllm_enable_sleep_mode"})


def looks_like_accelerate_config(data: Any) -> bool:
    """A config file of ``accelerate launch --config_file`` (what ``accelerate config`` writes)."""
    return isinstance(data, dict) and bool({norm_key(str(k)) for k in data} & {"distributed_type",
                                                                               "compute_environment"})


def read_accelerate_config(data: Mapping[str, Any], label: str, where: str) -> dict[str, Setting]:
    """An accelerate config file as raw settings: ``distributed_type`` FSDP / DEEPSPEED, ``mixed_precision``, and
    the ``fsdp_config`` / ``deepspeed_config`` section of that type (accelerate reads only the section of the
    distributed type chosen; huggingface.co/docs/accelerate, usage_guides/fsdp and usage_guides/deepspeed)."""
    kind = str(data.get("distributed_type", "")).strip().upper()
    pairs: list[tuple[str, Any, str]] = []
    if kind == "FSDP":
        pairs.append(("use_fsdp", True, f"{label} key distributed_type"))
    elif kind == "DEEPSPEED":
        pairs.append(("use_deepspeed", True, f"{label} key distributed_type"))
    if data.get("mixed_precision") is not None:
        pairs.append(("mixed_precision", data["mixed_precision"], f"{label} key mixed_precision"))
    section = {"FSDP": "fsdp_config", "DEEPSPEED": "deepspeed_config"}.get(kind)
    nested = data.get(section) if section else None
    if isinstance(nested, dict):
        pairs += [(str(k), v, f"{label} key {section}.{k}") for k, v in nested.items() if v is not None]
    parallelism = data.get("parallelism_config")  # its keys carry the parallelism_config_ prefix
    if isinstance(parallelism, dict):
        pairs += [(str(k), v, f"{label} key parallelism_config.{k}") for k, v in parallelism.items() if v is not None]
    return read_pairs(pairs, where)


def trainer_config_defaults(data: Mapping[str, Any], label: str, where: str) -> tuple[dict[str, Setting], list[str]]:
    """The method a trainer config implies by leaving a key out, as raw settings (read before the config's own).
    axolotl attaches an adapter only when ``adapter`` is set (axolotl loaders: no adapter, no PEFT model), so its
    ``lora_*`` keys alone leave the model fully trained; LLaMA-Factory's ``finetuning_type`` defaults to ``lora``
    (llamafactory hparams/finetuning_args.py)."""
    keys = {norm_key(str(k)): v for k, v in data.items()}
    flavour = config_flavour(data)
    implied: dict[str, Setting] = {}
    notes: list[str] = []
    if flavour == "axolotl config" and to_bool(keys.get("bf16")) is True and \
            not any(keys.get(k) not in (None, "", False) for k in ("deepspeed", "fsdp", "fsdp_config")):
        # axolotl loads the model in bf16 when bf16 is on (utils/config normalize_config: cfg.bf16 ->
        # cfg.torch_dtype = torch.bfloat16, passed to from_pretrained by its model loader): weights, gradients and
        # AdamW states are bf16, no fp32 master copy (bf16-true). Not under DeepSpeed (its bf16 optimizer keeps fp32
        # masters) or FSDP (accelerate upcasts trainable parameters to fp32 under mixed precision).
        implied["_dtype"] = Setting("bfloat16", f"{label} key bf16 (axolotl loads the model in bf16)", where)
        notes.append(f"{label} sets bf16: axolotl loads the model in bf16 (bf16-true, no fp32 master weights)")
    ftype = str(keys.get("finetuning_type") or "lora").strip().lower()
    half = next((d for k, d in (("bf16", "bfloat16"), ("fp16", "float16")) if to_bool(keys.get(k)) is True), None)
    if flavour == "LLaMA-Factory config" and half and ftype == "lora" and keys.get("deepspeed") in (None, ""):
        # LLaMA-Factory loads the model in its compute dtype (model/patcher.py patch_config: init_kwargs
        # ["torch_dtype"] = compute_dtype, except under ZeRO-3) and upcasts only the trainable parameters, the
        # adapters, to fp32 (model/adapter.py init_adapter, cast_trainable_params_to_fp32): a 16-bit base, no
        # autocast copies (*-true). Full and freeze tuning upcast what they train, so they stay *-mixed.
        implied["_dtype"] = Setting(half, f"{label} key {'bf16' if half == 'bfloat16' else 'fp16'} (LLaMA-Factory "
                                          "loads the base in the compute dtype)", where)
        notes.append(f"{label}: LLaMA-Factory loads the base model in {half} for LoRA (adapters in fp32)")
    if flavour == "Firefly config":
        firefly, firefly_notes = _firefly_defaults(keys, label, where)
        implied.update(firefly)
        notes += firefly_notes
    if flavour == "LLaMA-Factory config":
        implied.update(_llamafactory_defaults(keys, ftype, label, where))
        if ftype == "freeze":
            freeze, freeze_notes = llamafactory_freeze(keys, label, where)
            implied.update(freeze)
            notes += freeze_notes
        elif ftype == "lora" and to_bool(keys.get("use_llama_pro")) is True:
            # LoRA with LLaMA Pro puts the adapters on the expanded blocks only (model/adapter.py _setup_lora_tuning
            # -> model_utils/misc.py find_expanded_modules: the same every-(L/n)-th blocks as freeze tuning)
            layers = _present(keys, "freeze_trainable_layers", "num_layer_trainable")
            notes.append(f"{label} sets use_llama_pro: LoRA adapters on the {layers[1] if layers else 2} expanded "
                         "blocks only; read as adapters on every block (an over-estimate of the adapters and of "
                         "backward, which stops at the lowest expanded block)")
        if to_bool(keys.get("use_apollo")) is True and to_bool(keys.get("use_galore")) is not True:
            # ApolloArguments: apollo_rank 16, apollo_target "all", apollo_layerwise False; read as GaLore's
            # projected states (see optimizer_note)
            rank = keys.get("apollo_rank")
            implied["galore_rank"] = Setting(16 if rank in (None, "") else rank, f"{label} key apollo_rank" if rank
                                             not in (None, "") else f"{label} (use_apollo: apollo_rank default 16)",
                                             where)
            targets = galore_targets(keys.get("apollo_target", "all"))
            if targets is not None:
                implied["galore_target_modules"] = Setting(targets, f"{label} key apollo_target", where)
            if to_bool(keys.get("apollo_layerwise")) is True:
                implied["optimizer_in_backward"] = Setting(True, f"{label} key apollo_layerwise", where)
            notes.append(f"{label} sets use_apollo: APOLLO's states on a rank-{implied['galore_rank'].value} random "
                         "projection, read as GaLore's (its projector and SVD workspace a small over-estimate)")
        if to_bool(keys.get("use_galore")) is True:
            # LLaMA-Factory's GaloreArguments (hparams/finetuning_args.py): galore_rank 16, galore_target "all",
            # galore_layerwise False; layer-wise GaLore steps each parameter in its gradient hook
            rank = keys.get("galore_rank")
            implied["galore_rank"] = Setting(16 if rank in (None, "") else rank, f"{label} key galore_rank" if rank
                                             not in (None, "") else f"{label} (use_galore: galore_rank default 16)",
                                             where)
            targets = galore_targets(keys.get("galore_target", "all"))
            if targets is not None:
                implied["galore_target_modules"] = Setting(targets, f"{label} key galore_target", where)
            if to_bool(keys.get("galore_layerwise")) is True:
                implied["optimizer_in_backward"] = Setting(True, f"{label} key galore_layerwise", where)
        if to_bool(keys.get("use_badam")) is True:
            mode = str(keys.get("badam_mode") or "layer").strip().lower()
            if ftype == "full" and mode == "layer" and "freeze_trainable_layers" not in keys:
                # BAdam (BAdamArgument, badam_mode default "layer") trains one decoder block at a time, switching
                # blocks every badam_switch_interval steps: gradients and states for that block only. The run's
                # worst moment is the lowest block's turn, when backward runs through every block above it: the
                # first block, trainable_layers -1
                implied["trainable_layers"] = Setting(-1, f"{label} key use_badam (BAdam trains one block at a time; "
                                                          "its worst case is the first block's turn)", where)
            else:
                notes.append(f"{label} sets use_badam with badam_mode {mode}: BAdam trains part of the model at a "
                             "time; read as full fine-tuning (an over-estimate)")
        for key, what in (("use_adam_mini", "Adam-mini keeps the first moment and one second-moment value per block, "
                                            "about one fp32 state per parameter"),
                          ("use_muon", "Muon keeps one momentum buffer per hidden weight matrix and AdamW's two "
                                       "states for the embeddings and the head")):
            if to_bool(keys.get(key)) is True:
                # LLaMA-Factory's create_custom_optimizer replaces the Trainer's optimizer (train/trainer_utils.py)
                implied["optimizer"] = Setting("adamw", f"{label} key {key} (read as AdamW)", where)
                notes.append(f"{label} sets {key}: {what}; read as AdamW's two states (an over-estimate)")
        checkpointing = implied.get("gradient_checkpointing")
        if "trainable_layers" in implied and checkpointing is not None and checkpointing.value is True:
            # LLaMA-Factory's checkpointing function runs a block without trainable parameters unchecked
            # (model/model_utils/checkpointing.py get_custom_gradient_checkpointing_func): the frozen blocks that
            # backward runs through keep all their activations
            implied["checkpoint_trained_blocks_only"] = Setting(
                True, f"{label} (LLaMA-Factory checkpoints only the blocks with trainable parameters)", where)
    if flavour == "axolotl config":
        implied.update(_axolotl_defaults(keys, label, where))
        if keys.get("unfrozen_parameters") not in (None, "", []) and keys.get("adapter") in (None, ""):
            notes.append(f"{label} sets unfrozen_parameters: only the matching parameters train; read as full "
                         "fine-tuning (gradients and optimizer states for every parameter: an over-estimate)")
        replicate, shard = keys.get("dp_replicate_size"), keys.get("dp_shard_size")
        if launch_count(shard) is not None and launch_count(shard) > 1 and replicate in (None, ""):
            # axolotl replicates over whatever ranks the shard, tensor and context sizes leave
            # (utils/distributed.py _get_parallel_config_kwargs: dp_replicate_size = the remaining world size): a
            # group of dp_shard_size, more than one group when the job has more ranks (the merge checks)
            implied["_shard_group"] = Setting(launch_count(shard), f"{label} dp_shard_size (axolotl replicates over "
                                              "the remaining ranks)", where)
        else:
            implied.update(hybrid_markers(
                Setting(shard, f"{label} dp_shard_size", where) if shard not in (None, "") else None,
                Setting(replicate, f"{label} dp_replicate_size", where) if replicate not in (None, "") else None))
    if flavour == "axolotl config" and keys.get("adapter") in (None, ""):
        lora = sorted(k for k, v in keys.items() if k.startswith("lora_") and v not in (None, ""))
        notes.append(f"{label} sets no adapter: full fine-tuning" + (f" ({', '.join(lora)} unused)" if lora else ""))
        return {**implied, "_adapter": Setting("full", f"{label} (no adapter key)", where)}, notes
    if flavour == "LLaMA-Factory config" and "finetuning_type" not in keys:
        implied["_finetuning_type"] = Setting("lora", f"{label} (finetuning_type default lora)", where)
        notes.append(f"{label} sets no finetuning_type: LLaMA-Factory's default lora")
    return implied, notes


def _llamafactory_defaults(keys: Mapping[str, Any], ftype: str, label: str, where: str) -> dict[str, Setting]:
    """What a LLaMA-Factory config leaves to LLaMA-Factory's defaults (src/llamafactory/hparams): it checkpoints every
    layer unless ``disable_gradient_checkpointing`` (model_args, default False; model_utils/checkpointing.py
    prepare_model_for_training calls gradient_checkpointing_enable whatever TrainingArguments says), with
    ``use_unsloth_gc`` keeping the checkpointed inputs in host memory; its LoRA defaults (finetuning_args
    LoraArguments) are rank 8, alpha 2 x rank, dropout 0.0 and every linear layer (``lora_target: all``). Its
    TrainingArguments are transformers' Seq2SeqTrainingArguments (hparams/training_args.py), whose
    per_device_train_batch_size defaults to 8."""
    out: dict[str, Setting] = {
        "micro_batch_size": Setting(8, f"{label} (per_device_train_batch_size default 8, transformers' "
                                       "TrainingArguments)", where)}
    disabled = to_bool(keys.get("disable_gradient_checkpointing")) is True
    out["gradient_checkpointing"] = Setting(
        not disabled, f"{label} key disable_gradient_checkpointing" if "disable_gradient_checkpointing" in keys
        else f"{label} (LLaMA-Factory checkpoints unless disable_gradient_checkpointing)", where)
    if not disabled and to_bool(keys.get("use_unsloth_gc")) is True:
        out["activation_offloading"] = Setting(True, f"{label} key use_unsloth_gc (checkpointed inputs in host "
                                                     "memory)", where)
    if ftype == "lora":
        rank = keys.get("lora_rank")
        defaults = (("lora.rank", 8, "lora_rank default 8"), ("lora.dropout", 0.0, "lora_dropout default 0.0"),
                    ("lora.target_modules", "all", "lora_target default all"))
        out.update({field: Setting(value, f"{label} ({why})", where) for field, value, why in defaults})
        if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0:
            out["lora.alpha"] = Setting(2 * rank, f"{label} (lora_alpha default 2 x lora_rank)", where)
        else:
            out["lora.alpha"] = Setting(16, f"{label} (lora_alpha default 2 x lora_rank 8)", where)
    return out


def _present(keys: Mapping[str, Any], *names: str) -> tuple[str, Any] | None:
    """The first of ``names`` that ``keys`` sets (not null or empty), with its value."""
    return next(((k, keys[k]) for k in names if keys.get(k) not in (None, "", [])), None)


def _module_names(value: Any) -> list[str]:
    """LLaMA-Factory's module lists: a comma-separated string (hparams/finetuning_args.py split_arg) or a list."""
    items = value if isinstance(value, list) else str(value).split(",") if value not in (None, "") else []
    return [str(item).strip() for item in items if str(item).strip()]


def _whole(value: Any) -> int | None:
    """A whole number as a config writes it (``2``, ``"-4"``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        # as it is: float() of an int over ~309 digits raises OverflowError
        return value
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(number) if number.is_integer() else None


# freeze_extra_modules names (a non-block module's last name, model/adapter.py _setup_freeze_tuning
# non_hidden_modules) of the input embedding and of the output head
_EMBEDDING_MODULES = ("embed_tokens", "wte", "wpe", "word_embeddings", "tok_embeddings", "embed_in", "embeddings",
                      "embedding")
_HEAD_MODULES = ("lm_head", "embed_out", "output", "output_layer")
# Names LLaMA-Factory's substring match also finds in every block: the final "norm" of Llama-style models is part of
# each block's input_layernorm / post_attention_layernorm
_EVERY_BLOCK_MODULES = ("norm",)


def llamafactory_freeze(keys: Mapping[str, Any], label: str, where: str) -> tuple[dict[str, Setting], list[str]]:
    """``finetuning_type: freeze`` (LLaMA-Factory model/adapter.py _setup_freeze_tuning; FreezeArguments in
    hparams/finetuning_args.py) as ``trainable_layers``, with notes on what that leaves out.

    - ``freeze_trainable_layers`` (default 2): n > 0 the last n blocks, n < 0 the first -n. Releases before the
      rename (src/llmtuner/hparams/finetuning_args.py) call it ``num_layer_trainable`` (default 3) and the module
      list ``name_module_trainable``: read the same way when the new key is absent.
    - ``use_llama_pro``: blocks stride-1, 2*stride-1, ..., L-1 train (stride = L // n), n of them spread over the
      model. Read as the first n (trainable_layers -n): the same number of trained blocks, so gradients and
      optimizer states are exact, and backward counted through every block where it stops at block stride-1 (an
      over-estimate of the stride-1 blocks' activations below it; the last L-stride+1 blocks would count every block
      from stride-1 up as trained, a far larger over-estimate).
    - ``freeze_extra_modules``: matched as substrings of parameter names. The input embedding (or "norm", which also
      names every block's norms) makes backward run down through every block: read as the first n blocks as well;
      the extra modules' own gradients and states are not counted (noted as under-estimates)."""
    notes: list[str] = []
    layers = _present(keys, "freeze_trainable_layers", "num_layer_trainable")
    old = [k for k in ("num_layer_trainable", "name_module_trainable") if _present(keys, k)]
    if layers is not None:
        value: Any = layers[1]
        source = f"{label} key {layers[0]}"
    elif old:
        value, source = 3, f"{label} (finetuning_type freeze, old LLaMA-Factory keys: num_layer_trainable default 3)"
    else:
        value, source = 2, f"{label} (finetuning_type freeze: freeze_trainable_layers default 2)"
    modules = _present(keys, "freeze_trainable_modules", "name_module_trainable")
    if modules is not None and [m.lower() for m in _module_names(modules[1])] != ["all"]:
        notes.append(f"{label} sets {modules[0]} {', '.join(_module_names(modules[1]))}: only those modules of "
                     "the trained blocks train; read as every module of them (an over-estimate)")
    elif modules is None and old:
        notes.append(f"{label} uses the old key {old[0]}: some of those LLaMA-Factory releases default "
                     "name_module_trainable to mlp (only the MLPs of the trained blocks train); read as every module "
                     "of them (an over-estimate there)")
    count = _whole(value)
    if to_bool(keys.get("use_llama_pro")) is True and count is not None and count != 0:
        n = abs(count)
        value = -n
        source += f" + use_llama_pro (LLaMA Pro trains {n} blocks spread over the model: read as the first {n})"
        notes.append(f"{label} sets use_llama_pro: LLaMA-Factory trains {n} blocks spread evenly over the model "
                     f"(blocks stride-1, 2*stride-1, ..., the last, stride = blocks / {n}), which vramfit cannot "
                     f"express; read as the first {n} blocks training: their gradients and optimizer states are "
                     "exact, but backward is counted through every block where it stops at block stride-1 (an "
                     "over-estimate of the activations of the stride-1 blocks below it)")
    extra = _module_names(keys.get("freeze_extra_modules"))
    embeds = [m for m in extra if m in _EMBEDDING_MODULES or ("embed" in m and m not in _HEAD_MODULES)]
    every = [m for m in extra if m in _EVERY_BLOCK_MODULES]
    heads = [m for m in extra if m in _HEAD_MODULES]
    others = [m for m in extra if m not in (*embeds, *every, *heads)]
    count = _whole(value)
    if (embeds or every) and count is not None and count > 0:
        # backward now has to reach the embedding (or every block's norms): it runs through every block, as when
        # the first n blocks train (predictors/vram.py trained_blocks)
        value = -count
        source += (f" + freeze_extra_modules {', '.join(embeds + every)} (backward runs through every block: read as "
                   f"the first {count})")
    if embeds:
        notes.append(f"{label} sets freeze_extra_modules {', '.join(embeds)}: the input embedding trains too, so "
                     "backward runs through every block down to it (read so: the same number of trained blocks, "
                     "backward through all of them); the embedding's own gradients and optimizer states (vocab x "
                     "hidden parameters) are not counted: an under-estimate")
    if every:
        notes.append(f"{label} sets freeze_extra_modules {', '.join(every)}: LLaMA-Factory matches it as a substring "
                     "of parameter names, so every block's norms train too and backward runs through every block "
                     "(read so); those norms' gradients and optimizer states are not counted (a negligible "
                     "under-estimate)")
    if heads:
        notes.append(f"{label} sets freeze_extra_modules {', '.join(heads)}: the output head trains too; its "
                     "gradients and optimizer states (vocab x hidden parameters, unless tied to the embedding) are "
                     "not counted: an under-estimate")
    if others:
        notes.append(f"{label} sets freeze_extra_modules {', '.join(others)}: those modules train too and are not "
                     "counted (an under-estimate of their gradients and optimizer states)")
    return {"trainable_layers": Setting(value, source, where)}, notes


def _axolotl_defaults(keys: Mapping[str, Any], label: str, where: str) -> dict[str, Setting]:
    """What an axolotl config leaves to axolotl's defaults (src/axolotl/utils/schemas): ``lora_dropout`` 0.0 when an
    adapter is set (LoraConfig.validate_lora_dropout); Cut Cross-Entropy when its plugin is listed
    (integrations/cut_cross_entropy args: ``cut_cross_entropy`` default True); ``gradient_checkpointing`` ``offload``
    or ``unsloth``: checkpointing with the checkpointed inputs in host memory."""
    out: dict[str, Setting] = {}
    if keys.get("adapter") not in (None, ""):
        out["lora.dropout"] = Setting(0.0, f"{label} (lora_dropout default 0.0 with an adapter)", where)
    plugins = keys.get("plugins")
    named = [str(p) for p in plugins] if isinstance(plugins, list) else [str(plugins)] if plugins else []
    cce = next((p for p in named if p.rsplit(".", 1)[-1] == "CutCrossEntropyPlugin"), None)
    if cce is not None and to_bool(keys.get("cut_cross_entropy", True)) is not False:
        out["cross_entropy"] = Setting("fused-linear", f"{label} plugin {cce} (cut_cross_entropy default on)",
                                       where)
    checkpointing = str(keys.get("gradient_checkpointing", "")).strip().lower()
    if checkpointing in ("offload", "unsloth"):
        out["activation_offloading"] = Setting(
            True, f"{label} key gradient_checkpointing: {checkpointing} (checkpointed inputs in host memory)", where)
    return out


def config_flavour(data: Mapping[str, Any], v1: V1Launch | None = None) -> str:
    keys = {norm_key(str(k)) for k in data}
    if "zero_optimization" in keys or "train_micro_batch_size_per_gpu" in keys:
        return "DeepSpeed config"
    if str(data.get("model_type", "")).strip().lower() == "llm" and "base_model" in keys:
        return "Ludwig config"
    if "model_id_or_path" in keys and keys & {"lora", "run_dir", "seq_len", "num_microbatches"}:
        return "mistral-finetune config"
    if "base_model" in keys:
        return "axolotl config"
    if is_llamafactory_v1(data, v1):
        return "LLaMA-Factory v1 config"
    if keys & {"finetuning_type", "cutoff_len", "stage", "template"}:
        return "LLaMA-Factory config"
    if str(data.get("train_mode", "")).strip().lower() in _FIREFLY_MODES or {"train_file", "template_name",
                                                                              "model_name_or_path"} <= keys:
        return "Firefly config"
    return "trainer config"


# Firefly (yangjianxin1/Firefly): ``train.py --train_args_file CONFIG.json``, one JSON of its CustomizedArguments
# (component/argument.py) and TrainingArguments
_FIREFLY_MODES = ("full", "lora", "qlora")


def _firefly_defaults(keys: Mapping[str, Any], label: str, where: str) -> tuple[dict[str, Setting], list[str]]:
    """What Firefly does with a config: ``train_mode`` (default qlora, which its shipped qlora configs leave out) picks
    full, LoRA or QLoRA (BitsAndBytesConfig nf4 with double quantization); the adapters go on every linear layer but
    the head (find_all_linear_names) with ``lora_rank`` 64, ``lora_alpha`` 16, ``lora_dropout`` 0.05 by default; the
    model is loaded in the compute dtype (torch_dtype fp16 with ``fp16``, else bf16); ``task_type`` dpo trains DPO.
    Read before as LoRA of rank 64 on q/v over a 16-bit base."""
    implied: dict[str, Setting] = {}
    notes: list[str] = []
    given = keys.get("train_mode")
    mode = str(given).strip().lower() if given is not None else "qlora"
    source = f"{label} key train_mode" if given is not None else "Firefly default train_mode qlora"
    if mode not in _FIREFLY_MODES:
        return implied, [f"{source} {given!r}: not one of Firefly's full / lora / qlora (it refuses the config)"]
    implied["_finetuning_type"] = Setting(mode, source, where)
    if mode == "qlora":
        implied["_4bit"] = Setting(True, f"{source} (BitsAndBytesConfig load_in_4bit)", where)
        implied["_quant_type"] = Setting("nf4", f"{source} (bnb_4bit_quant_type nf4)", where)
        implied["_double"] = Setting(True, f"{source} (bnb_4bit_use_double_quant)", where)
    if mode != "full":
        implied["lora.target_modules"] = Setting("all-linear", f"{source} (find_all_linear_names: every linear but "
                                                               "lm_head)", where)
        for key, field_name, default in (("lora_rank", "lora.rank", 64), ("lora_alpha", "lora.alpha", 16),
                                         ("lora_dropout", "lora.dropout", 0.05)):
            implied[field_name] = Setting(default, f"Firefly default {key} {default}", where)
    half = "float16" if to_bool(keys.get("fp16")) is True else "bfloat16"
    implied["_dtype"] = Setting(half, f"{label} (Firefly loads the model in torch_dtype {half}: "
                                      f"{'fp16' if half == 'float16' else 'bf16'} is its compute dtype)", where)
    if str(keys.get("task_type", "")).strip().lower() == "dpo":
        implied["_rl"] = Setting("dpo", f"{label} key task_type dpo", where)
    if to_bool(keys.get("use_unsloth")) is True:
        notes.append(f"{label} key use_unsloth: Unsloth's kernels (get_peft_model with use_gradient_checkpointing "
                     "True): predicted as the PEFT model")
    return implied, notes


# --- LLaMA-Factory v1 --------------------------------------------------------------------------------
# ``USE_V1=1 llamafactory-cli sft CONFIG`` (src/llamafactory/cli.py picks src/llamafactory/v1/launcher.py) reads its own
# dataclasses (v1/config/model_args.py, data_args.py, training_args.py): ``model`` for the model, and plugin
# sections ``{name: ..., ...}`` (v1/config/arg_utils.py get_plugin_config) for PEFT, quantization, the distributed
# backend, kernels and the optimizer. A config is read as v1 only when LLaMA-Factory's launcher runs it, or USE_V1 is
# on (:func:`llamafactory_v1_launch`): other tools' YAML has ``model`` and ``micro_batch_size`` too (ms-swift's
# ``megatron sft --config``). Keys only v1 has:
_V1_KEYS = frozenset({"peft_config", "dist_config", "quant_config", "kernel_config", "init_config", "optim_config",
                      "lr_scheduler_config", "model_class", "train_dataset", "eval_dataset", "global_batch_size",
                      "enable_activation_checkpointing", "batching_strategy", "sample_backend", "mtp_config"})
# v1 keys that change no memory vramfit models (output, data, schedule, logging, checkpoint saving, init device,
# the preference losses' coefficients)
_V1_NO_MEMORY = frozenset({"output_dir", "learning_rate", "seed", "logging_steps", "save_steps", "save_epochs",
                           "save_ckpt_as_hf", "save_total_limit", "train_dataset", "eval_dataset", "dataset",
                           "template", "trust_remote_code", "sample_backend", "max_new_tokens", "num_train_epochs",
                           "max_grad_norm", "resume_from_checkpoint", "dist_timeout", "batching_workers",
                           "lr_scheduler_config", "init_config", "dp_size", "mp_shard_size", "pref_beta", "pref_ftx",
                           "simpo_gamma", "ld_alpha", "dpo_label_smoothing"})
# peft_config keys that change no memory (v1/plugins/model_plugins/peft.py LoraConfig / FreezeConfig)
_V1_PEFT_NO_MEMORY = frozenset({"name", "use_rslora", "adapter_name_or_path", "export_dir", "export_size",
                                "export_hub_model_id", "infer_dtype", "export_legacy_format"})
# v1/launcher.py _DIST_TRAIN_COMMANDS: ``train`` runs sft; its trainers by module (v1/trainers/*_trainer.py)
_V1_COMMANDS = {"train": "sft", "sft": "sft", "dpo": "dpo", "rm": "rm"}
_V1_TRAINERS = {"sft_trainer": "sft", "fsdp2_sft_trainer": "sft", "dpo_trainer": "dpo", "rm_trainer": "rm"}
# pyproject.toml [project.scripts]: llamafactory-cli and its shortcut lmf, both llamafactory.cli:main
_LLAMAFACTORY_CLIS = ("llamafactory-cli", "lmf")
# v1's FSDP2 engines: fsdp2 (plugins/trainer_plugins/distributed/fsdp2.py FSDP2Engine) and the expert-parallel
# FSDPTurbo adapters built on it (fsdpturbo.py FSDPTurboFSDP2Engine; mindspeed_fsdp2.py, its former name)
_V1_FSDP_BACKENDS = ("fsdp2", "fsdpturbo", "mindspeed_fsdp2")
_V1_FSDP_KEYS = frozenset({"name", "reshard_after_forward", "offload_params", "pin_memory", "dcp_path", "cp_size",
                           "cp_mode"})
# FSDPTurbo's keys (distributed/hub.py FSDPTurboParams, fsdpturbo.py): expert parallelism shards the experts over
# ep_size ranks and the rest of their data-parallel ranks (EFSDP), so each GPU holds the same share of them as FSDP
# over every rank; param_dtype / reduce_dtype in the examples are not read (the engine takes bf16 from the trainer)
_V1_TURBO_KEYS = frozenset({"ep_size", "ep_dispatcher", "ep_modules", "ep_fsdp_modules", "hook_modules",
                            "fsdp_implementation", "fsdp_modules", "fsdp_ignored_modules", "param_dtype",
                            "reduce_dtype"})
# the preference losses of v1/trainers/dpo_trainer.py DPOTrainer: sigmoid (DPO, with a reference), orpo, simpo
_V1_PREF_LOSSES = ("sigmoid", "orpo", "simpo")


@dataclass(frozen=True)
class V1Launch:
    """A command that runs (or may run) LLaMA-Factory v1: ``how`` names it in notes (``USE_V1=1 llamafactory-cli
    sft``), ``command`` is the v1 trainer it starts (``sft``, ``dpo``, ``rm``), ``v0_cli`` marks LLaMA-Factory's CLI
    without USE_V1, which starts the v0 launcher instead (src/llamafactory/cli.py)."""

    how: str
    command: str = "sft"
    v0_cli: bool = False


def _env_enabled(value: Any) -> bool:
    """An env var as LLaMA-Factory's is_env_enabled reads it (extras/misc.py: "true", "y" or "1")."""
    return str(value or "").strip().lower() in ("true", "y", "1")


def _command_words(tokens: Sequence[str]) -> Iterator[tuple[int, str]]:
    """The tokens of a command that can name a program or module (``-m`` included), with their index: not flags,
    not ``KEY=value`` assignments."""
    return ((i, t) for i, t in enumerate(tokens) if not ((t.startswith("-") and t != "-m") or "=" in t))


def _llamafactory_cli_at(tokens: Sequence[str], i: int) -> tuple[str, list[str]] | None:
    """``(cli, its arguments)`` when ``tokens[i]`` runs LLaMA-Factory's CLI (``llamafactory-cli``, ``lmf``,
    ``python -m llamafactory.cli``), else None."""
    token = tokens[i]
    if basename(token) in _LLAMAFACTORY_CLIS:
        return basename(token), list(tokens[i + 1:])
    if token == "-m" and tokens[i + 1:i + 2] == ["llamafactory.cli"]:
        return "python -m llamafactory.cli", list(tokens[i + 2:])
    return None


def llamafactory_v1_launch(tokens: Sequence[str], env: Mapping[str, str]) -> V1Launch | None:
    """Whether one command runs LLaMA-Factory v1, and which trainer: LLaMA-Factory's CLI (``llamafactory-cli`` /
    ``lmf`` / ``python -m llamafactory.cli SUBCOMMAND``), v1's launcher or trainers by path or module
    (``torchrun ... src/llamafactory/v1/launcher.py sft``, ``python -m llamafactory.v1.trainers.dpo_trainer``),
    another script of LLaMA-Factory's (``torchrun ... src/llamafactory/launcher.py``), or any command with USE_V1 on
    in its environment. None for other commands: their config is not read as v1's."""
    use_v1 = _env_enabled(env.get("USE_V1"))
    for token in tokens:  # ``env USE_V1=1 llamafactory-cli ...``
        if (assign := _ASSIGN.match(token)) is not None and assign.group(1) == "USE_V1":
            use_v1 = _env_enabled(assign.group(2))
    prefix = "USE_V1=1 " if use_v1 else ""
    for i, token in _command_words(tokens):
        rest = list(tokens[i + 1:])
        if (found := _llamafactory_cli_at(tokens, i)) is not None:
            cli, args = found
            sub = args[0].strip().lower() if args and re.fullmatch(r"[A-Za-z_]+", args[0].strip()) else ""
            return V1Launch(f"{prefix}{cli} {sub}".rstrip(), _V1_COMMANDS.get(sub, "sft"), v0_cli=not use_v1)
        if token == "-m" and rest[:1] and rest[0].startswith("llamafactory.v1."):
            stem = rest[0].rsplit(".", 1)[-1]
        elif "llamafactory/" in token.replace("\\", "/") and token.endswith(".py"):
            stem = PurePosixPath(token).stem if "llamafactory/v1/" in token.replace("\\", "/") else ""
        else:
            continue
        what = " ".join(["python -m", rest[0]] if token == "-m" else [token])
        if stem in _V1_TRAINERS:
            return V1Launch(what, _V1_TRAINERS[stem])
        if stem == "launcher":  # v1/launcher.py main(): the sub-command first, or a config alone (sft)
            sub = (rest[1:] if token == "-m" else rest)[:1]
            command = _V1_COMMANDS.get(sub[0].strip().lower(), "sft") if sub else "sft"
            return V1Launch(f"{what} {sub[0]}" if sub and sub[0].lower() in _V1_COMMANDS else what, command)
        # another LLaMA-Factory script: src/llamafactory/launcher.py is v0's whatever USE_V1 says (only cli.py reads it)
        return V1Launch(f"{prefix}{what}", "sft", v0_cli=not use_v1)
    return V1Launch("USE_V1=1", "sft") if use_v1 else None


# the LLaMA-Factory CLI sub-commands that train (v0 cli.py: train; v1 launcher.py: train, sft, dpo, rm); the others
# (chat, api, webchat, webui, eval, export, env, version, help, or a word it does not know) start no training
_LLAMAFACTORY_TRAINING_COMMANDS = frozenset(("train", *_V1_COMMANDS))


def llamafactory_non_training(tokens: Sequence[str]) -> str | None:
    """``llamafactory-cli SUB`` (``lmf``, ``python -m llamafactory.cli``, v1's launcher.py) with a sub-command that does
    not train: a note naming it; None for a training sub-command, a config alone, or another command."""
    for i, token in _command_words(tokens):
        if (found := _llamafactory_cli_at(tokens, i)) is not None:
            cli, args = found
        elif token.replace("\\", "/").endswith("llamafactory/v1/launcher.py"):
            cli, args = token, list(tokens[i + 1:])
        else:
            continue
        sub = args[0].strip() if args else ""
        if not re.fullmatch(r"[A-Za-z_]+", sub) or sub.lower() in _LLAMAFACTORY_TRAINING_COMMANDS:
            return None
        return (f"{cli} {sub[:40]} does not train (LLaMA-Factory trains only under train, sft, dpo or rm), so no "
                "training job is read from it")
    return None


def is_llamafactory_v1(data: Any, v1: V1Launch | None = None) -> bool:
    """A LLaMA-Factory v1 config: run by LLaMA-Factory v1 (``v1``, :func:`llamafactory_v1_launch`), with ``model``
    naming the model (v0 requires ``model_name_or_path``) beside a key only v1 has, or v1's ``cutoff_len``."""
    if v1 is None or not isinstance(data, Mapping):
        return False
    keys = {norm_key(str(k)): v for k, v in data.items()}
    return isinstance(keys.get("model"), str) and "model_name_or_path" not in keys and "base_model" not in keys \
        and bool(set(keys) & (_V1_KEYS | {"cutoff_len"}))


def _plugin(value: Any) -> dict[str, Any] | None:
    """A v1 plugin section: a mapping with ``name``, a JSON object string (get_plugin_config), or (leniently) the
    bare name."""
    if isinstance(value, str) and value.strip().startswith("{"):
        value = _load_mapping(value.strip())
    elif isinstance(value, str) and value.strip():
        value = {"name": value.strip()}
    if not isinstance(value, Mapping):
        return None
    return {norm_key(str(k)): v for k, v in value.items() if v is not None}


def read_llamafactory_v1(data: Mapping[str, Any], label: str, where: str,
                         v1: V1Launch | None = None) -> tuple[dict[str, Setting], list[str]]:
    """A LLaMA-Factory v1 config as raw settings, with a note naming what was read and what was not.

    Defaults (v1/config/training_args.py, data_args.py): micro_batch_size 1, cutoff_len 2048, bf16 true,
    enable_activation_checkpointing true, global_batch_size the data-parallel ranks x micro-batch (no accumulation);
    no peft_config is full tuning. The model loads in the checkpoint's dtype (core/model_engine.py
    ``from_pretrained(dtype="auto")``): full tuning casts it to fp32, and the trainer (core/base_trainer.py) runs no
    autocast, so bf16 takes effect only through FSDP2's MixedPrecisionPolicy (plugins/trainer_plugins/distributed/
    fsdp2.py) or DeepSpeed's bf16 (deepspeed_utils.py infer_deepspeed_mixed_precision): full tuning is bf16-mixed
    under FSDP2, 32-true otherwise; LoRA keeps the 16-bit base (bf16 assumed) with fp32 adapters (bf16-true), computed
    in fp32 under FSDP2 with bf16 false. v1 never uses transformers' TrainingArguments: without optim_config the
    optimizer is ``torch.optim.AdamW(params, lr)`` (foreach, not fused), with ``optim_config`` adamw
    ``torch.optim.AdamW(fused=optim_config.fused)`` (plugins/trainer_plugins/optimizer.py build_adamw). peft_config
    lora: r (alias lora_rank) 8, lora_alpha 16, lora_dropout 0.05, target_modules all; freeze: as v0's freeze tuning
    (plugins/model_plugins/peft.py get_freeze_model). ``v1`` is the command that runs it (the trainer: sft, dpo, rm)."""
    v1 = v1 or V1Launch("USE_V1=1 llamafactory-cli sft")
    keys = {norm_key(str(k)): v for k, v in data.items() if v is not None}
    raw: dict[str, Setting] = {}
    notes: list[str] = []
    used: set[str] = set()
    unread: list[str] = []

    def put(name: str, value: Any, key: str, why: str = "") -> None:
        raw[name] = Setting(value, f"{label} key {key}" + (f" ({why})" if why else ""), where)
        used.add(key.split(".")[0])

    def default(name: str, value: Any, why: str) -> None:
        raw[name] = Setting(value, f"{label} ({why})", where)

    put("model", keys["model"], "model")
    for key, field_name, fallback, convert in (
        ("micro_batch_size", "micro_batch_size", 1, _same),
        ("cutoff_len", "seq_len", 2048, _same),
        ("enable_activation_checkpointing", "gradient_checkpointing", True, to_bool),
    ):
        if key in keys:
            put(field_name, convert(keys[key]), key)
        else:
            default(field_name, fallback, f"v1 {key} default {str(fallback).lower()}")
    if _positive(keys.get("max_steps")) not in (None, ""):
        put("steps", keys["max_steps"], "max_steps")
    if "global_batch_size" in keys:
        put("_global_batch_size", keys["global_batch_size"], "global_batch_size")
    if "flash_attn" in keys and attention_name(keys["flash_attn"]) is not None:
        put("attention", attention_name(keys["flash_attn"]), "flash_attn")
    _v1_model_class(keys, v1, label, where, raw, notes, unread)
    used.add("model_class")
    bf16 = to_bool(keys.get("bf16", True)) is True
    used.add("bf16")

    peft = _plugin(keys.get("peft_config"))
    kind = str(peft.get("name", "")).strip().lower() if peft is not None else "full"
    if peft is not None:
        used.add("peft_config")
    if kind == "full":
        default("_finetuning_type", "full", "no peft_config: full tuning")
    elif kind == "lora":
        put("_finetuning_type", "lora", "peft_config.name")
        rank = next((k for k in ("r", "lora_rank") if k in peft), None)
        for field_name, key, fallback in (("lora.rank", rank, 8), ("lora.alpha", "lora_alpha", 16),
                                          ("lora.dropout", "lora_dropout", 0.05),
                                          ("lora.target_modules", "target_modules", "all")):
            if key is not None and key in peft:
                put(field_name, peft[key], f"peft_config.{key}")
            else:
                default(field_name, fallback, f"v1 peft_config {(key or 'r').removeprefix('lora_')} default {fallback}")
        if "use_dora" in peft:
            put("lora.use_dora", to_bool(peft["use_dora"]), "peft_config.use_dora")
        if peft.get("modules_to_save") not in (None, "", []):
            put("lora.modules_to_save", peft["modules_to_save"], "peft_config.modules_to_save")
        known = {"r", "lora_rank", "lora_alpha", "lora_dropout", "target_modules", "use_dora", "modules_to_save"}
        unread += [f"peft_config.{k}" for k in peft if k not in known | _V1_PEFT_NO_MEMORY]
    elif kind == "freeze":
        put("_finetuning_type", "freeze", "peft_config.name")
        # v1's FreezeConfig (v1/plugins/model_plugins/peft.py) has only these keys: v0's use_llama_pro and the
        # pre-rename names are not read by v1, so they must not change the reading here either
        known = {"freeze_trainable_layers", "freeze_trainable_modules", "freeze_extra_modules"}
        freeze, freeze_notes = llamafactory_freeze({k: v for k, v in peft.items() if k in known},
                                                   f"{label} peft_config", where)
        raw.update(freeze)
        notes += freeze_notes
        unread += [f"peft_config.{k}" for k in peft if k not in known | _V1_PEFT_NO_MEMORY]
        if to_bool(peft.get("cast_trainable_params_to_fp32", True)) is False:
            notes.append(f"{label} peft_config cast_trainable_params_to_fp32 false: the trained blocks stay 16-bit; "
                         "read with fp32 copies of them (an over-estimate)")
    else:
        unread.append(f"peft_config (name {kind or '?'})")

    quant = _plugin(keys.get("quant_config"))
    quantized = quant is not None and _v1_quantization(quant, label, where, raw, notes, unread)
    if quant is not None:
        used.add("quant_config")

    dist = _plugin(keys.get("dist_config"))
    backend = str(dist.get("name", "")).strip().lower() if dist is not None else ""
    if dist is not None:
        used.add("dist_config")
    if backend in _V1_FSDP_BACKENDS:
        put("_use_fsdp", True, "dist_config.name", "FSDP2" if backend == "fsdp2" else f"{backend}: FSDP2 with expert "
            "parallelism")
        if "reshard_after_forward" in dist:
            put("_fsdp_reshard", dist["reshard_after_forward"], "dist_config.reshard_after_forward")
        if to_bool(dist.get("offload_params")) is True:
            put("_fsdp_offload", True, "dist_config.offload_params")
        known = _V1_FSDP_KEYS | (_V1_TURBO_KEYS if backend != "fsdp2" else frozenset())
        unread += [f"dist_config.{k}" for k in dist if k not in known]
        if backend != "fsdp2":
            notes.append(_v1_turbo_note(label, backend, dist, full_bf16=kind == "full" and bf16))
        replicate = keys.get("mp_replicate_size")
        if launch_count(replicate) is not None and launch_count(replicate) > 1:
            # v1 MeshConfig: FSDP2 shards over mp_shard_size ranks (default world / mp_replicate_size), replicated
            # mp_replicate_size times (HSDP)
            raw.update(hybrid_markers(
                Setting(keys["mp_shard_size"], f"{label} key mp_shard_size", where)
                if keys.get("mp_shard_size") not in (None, "") else None,
                Setting(replicate, f"{label} key mp_replicate_size", where)))
            used.add("mp_replicate_size")
    elif backend == "deepspeed":
        if dist.get("config_file") not in (None, ""):
            put("_deepspeed", dist["config_file"], "dist_config.config_file")
            # v1 fills DeepSpeed's bf16/fp16 "auto" itself (plugins/model_plugins/deepspeed_utils.py
            # infer_deepspeed_mixed_precision, called by trainer_plugins/distributed/deepspeed.py DeepSpeedEngine)
            default("_ds_v1_precision", True, "LLaMA-Factory v1 infer_deepspeed_mixed_precision")
        else:
            unread.append("dist_config (deepspeed without config_file)")
        unread += [f"dist_config.{k}" for k in dist if k not in ("name", "config_file", "cp_size", "cp_mode")]
    elif dist is not None:
        unread.append(f"dist_config (name {backend or '?'})")
    if launch_count(keys.get("mp_replicate_size")) in (None, 1):
        used.add("mp_replicate_size")
    cp = keys.get("cp_size", dist.get("cp_size") if dist is not None else None)
    if launch_count(cp) is not None and launch_count(cp) > 1:
        cp_key = "cp_size" if "cp_size" in keys else "dist_config.cp_size"
        put("context_parallel", launch_count(cp), cp_key)
        _v1_sequence_parallel_attention(raw, label, cp_key, where, notes)
    used.update(("cp_size", "cp_mode"))

    fsdp = backend in _V1_FSDP_BACKENDS
    if backend != "deepspeed":
        if kind == "lora" and not quantized and not bf16 and fsdp:
            # FSDP2Engine.get_mp_policy: bf16 false is MixedPrecisionPolicy(param_dtype=float32), so every block's
            # weights are gathered and run in fp32 although the frozen base is stored in the checkpoint's dtype
            default("_dtype", "float32", f"v1 LoRA with bf16 false under {backend}: MixedPrecisionPolicy(param_dtype="
                                         "float32) computes in fp32")
            notes.append(f"{label}: LoRA with bf16 false under {backend} computes in fp32 (FSDP2 MixedPrecisionPolicy "
                         "param_dtype float32); read as 32-true, which also counts the frozen base's shards at 4 bytes "
                         "where they stay in the checkpoint's dtype (bf16: 2 bytes per base parameter over the shard "
                         "group, an over-estimate)")
        elif kind == "lora" or quantized:
            default("_dtype", "bfloat16", "v1 loads the base in the checkpoint's dtype, bf16 assumed; PEFT keeps the "
                                          "adapters in fp32")
        elif kind == "freeze":
            default("_bf16", True, "v1 freeze: the trained blocks in fp32, the rest in the checkpoint's dtype")
        elif kind == "full" and bf16 and fsdp:
            default("_bf16", True, f"v1 full tuning: fp32 weights, {backend} MixedPrecisionPolicy bf16")
        elif kind == "full":
            default("_dtype", "float32", "v1 full tuning casts the model to fp32 and runs no autocast; bf16 applies "
                                         "under FSDP2 only" if bf16 else "v1 full tuning in fp32 (bf16 false)")
    _v1_optimizer(_plugin(keys.get("optim_config")), label, where, raw, notes, unread)
    used.add("optim_config")
    if v1.command == "dpo":
        _v1_preference(keys, kind, v1, label, where, raw, notes)
        used.add("pref_loss")
    mtp = _plugin(keys.get("mtp_config"))
    if mtp is not None:
        layers = launch_count(mtp.get("num_layers"))
        count = f"{layers} multi-token-prediction layer{'s' if layers != 1 else ''}" if layers else \
            "its multi-token-prediction layers"
        notes.append(f"{label} mtp_config ({count}): each adds a decoder block with two hidden x hidden projections "
                     "(weights, gradients, optimizer states, activations) and one more vocab-sized logits tensor with "
                     "its fp32 loss (plugins/model_plugins/mtp.py); none of it is counted: an under-estimate")
    kernel = _plugin(keys.get("kernel_config"))
    if kernel is not None:
        # Liger's fused linear cross-entropy is off for SFT (core/model_engine.py: require_logits while training)
        unread.append(f"kernel_config (name {kernel.get('name', '?')}: fused kernels not modelled, an over-estimate "
                      "at most)")
        used.add("kernel_config")
    strategy = str(keys.get("batching_strategy", "normal")).strip().lower()
    if strategy != "normal":
        unread.append(f"batching_strategy {strategy} (tokens per micro-batch read as micro_batch_size x cutoff_len)")
    used.add("batching_strategy")
    unread += [k for k in keys if k not in used and k not in _V1_NO_MEMORY and k not in _V1_KEYS
               and k not in ("max_steps", "global_batch_size", "flash_attn", "micro_batch_size", "cutoff_len",
                             "enable_activation_checkpointing")]
    if v1.v0_cli:
        notes.append(f"{label}: {v1.how} without USE_V1=1 starts LLaMA-Factory's v0 launcher, which rejects v1 keys "
                     "(src/llamafactory/cli.py picks v1/launcher.py only under USE_V1); read as the v1 config it is")
    notes.append(f"{label} ({v1.how}): v1 keys found, read by LLaMA-Factory v1's schema and defaults (model, "
                 "model_class, peft_config, quant_config, dist_config, optim_config, micro_batch_size, "
                 "global_batch_size, cutoff_len, bf16, enable_activation_checkpointing, flash_attn, cp_size"
                 + (", pref_loss" if v1.command == "dpo" else "") + "); "
                 + (f"not read: {', '.join(unread)}" if unread else "nothing else in it changes memory"))
    return raw, notes


def _v1_model_class(keys: Mapping[str, Any], v1: V1Launch, label: str, where: str, raw: dict[str, Setting],
                    notes: list[str], unread: list[str]) -> None:
    """``model_class`` (v1/config/model_args.py ModelClass; ``llamafactory-cli rm`` sets cls itself,
    v1/trainers/rm_trainer.py run_rm): cls is a reward model, a per-token score head on the model, read as
    token-classification (no vocab-sized logits)."""
    model_class = str(keys.get("model_class", "llm")).strip().lower()
    if v1.command == "rm":
        raw["task"] = Setting("token-classification", f"{label} ({v1.how}: v1's reward-model trainer loads "
                                                       "model_class cls, a per-token score head)", where)
    elif model_class == "cls":
        raw["task"] = Setting("token-classification", f"{label} key model_class (cls: a per-token score head)", where)
    elif model_class != "llm":
        unread.append(f"model_class {model_class}")
        return
    else:
        return
    # core/model_engine.py: before LLaMA-Factory PR #10556 (2026-06) AutoModelForTokenClassification; since, the
    # causal LM with a hidden x 1 ``score`` linear, applied by rm_trainer.py to output_hidden_states[-1]
    notes.append(f"{label}: a reward model (model_class cls), read as task token-classification: a hidden x 2 head "
                 "and no vocab-sized logits. Current LLaMA-Factory v1 loads it as the causal LM plus a hidden x 1 "
                 "score head (core/model_engine.py) and runs the whole LM forward, so the compute-dtype logits "
                 "(micro-batch x cutoff_len x vocab, not trained) and an untied lm_head's weights are not counted: an "
                 "under-estimate")


def _v1_quantization(quant: Mapping[str, Any], label: str, where: str, raw: dict[str, Setting], notes: list[str],
                     unread: list[str]) -> bool:
    """``quant_config`` (v1/plugins/model_plugins/quantization.py BnbParams: name bnb, quantization_bit None,
    quantization_type nf4, double_quantization true): bnb without quantization_bit loads in 4 bits, auto without it
    quantizes nothing. Whether the base is quantized."""
    name = str(quant.get("name", "bnb")).strip().lower()
    bits = str(quant.get("quantization_bit", "")).strip()
    source = f"{label} key quant_config"
    if name not in ("bnb", "auto"):
        unread.append(f"quant_config (name {name})")
        return False
    if bits in ("4", "8"):
        raw["_quant_bits"] = Setting(int(bits), f"{source}.quantization_bit", where)
    elif bits:
        unread.append(f"quant_config.quantization_bit {bits} (v1 takes 4 or 8)")
        return False
    elif name == "bnb":
        raw["_quant_bits"] = Setting(4, f"{source}.name bnb (no quantization_bit: v1's bnb default 4-bit)", where)
    else:
        notes.append(f"{source}.name auto without quantization_bit: LLaMA-Factory v1 applies no quantization "
                     "(quantization.py quantization_auto); read as none")
        return False
    if raw["_quant_bits"].value == 4:
        if "quantization_type" in quant:
            raw["_quant_type"] = Setting(quant["quantization_type"], f"{source}.quantization_type", where)
        if "double_quantization" in quant:
            raw["_double"] = Setting(to_bool(quant["double_quantization"]), f"{source}.double_quantization", where)
    known = {"name", "quantization_bit", "quantization_type", "double_quantization", "compute_dtype"}
    unread += [f"quant_config.{k}" for k in quant if k not in known]
    return True


def _v1_turbo_note(label: str, backend: str, dist: Mapping[str, Any], full_bf16: bool) -> str:
    """What reading an FSDPTurbo backend as FSDP2 leaves out (``full_bf16``: full tuning with bf16 on)."""
    ep, ignored = launch_count(dist.get("ep_size")), dist.get("fsdp_ignored_modules")
    parts = [f"{label} dist_config {backend}: read as FSDP2 (its engine subclasses v1's FSDP2Engine, "
             "plugins/trainer_plugins/distributed/fsdpturbo.py)"]
    if ep is not None and ep > 1:
        parts.append(f"ep_size {ep} shards the experts over {ep} ranks and the rest over their data-parallel peers, "
                     "the same share per GPU as FSDP over every rank; the expert dispatch buffers are not counted "
                     "(an under-estimate)")
    if full_bf16:
        parts.append("a release whose FSDPTurboFSDP2Engine.shard_model casts full tuning's weights to bf16 before "
                     "sharding keeps no fp32 copies (nor fp32 optimizer states): read with them, an over-estimate")
    if ignored not in (None, "", []):
        parts.append("fsdp_ignored_modules are left out of the outer FSDP wrap (replicated on every GPU) and counted "
                     "as sharded: an under-estimate")
    return "; ".join(parts)


def _v1_sequence_parallel_attention(raw: dict[str, Setting], label: str, key: str, where: str,
                                    notes: list[str]) -> None:
    """Sequence parallelism runs on flash_attention_2 only (core/base_trainer.py: cp_size > 1 forces it, or refuses
    another flash_attn)."""
    given = raw.get("attention")
    if given is not None and given.value == "flash":
        return
    if given is not None:
        notes.append(f"{given.source} {given.value} with {key} > 1: LLaMA-Factory v1 runs sequence parallelism with "
                     "flash_attention_2 only (core/base_trainer.py); read as flash")
    raw["attention"] = Setting("flash", f"{label} key {key} (v1 sequence parallelism runs flash_attention_2, "
                                        "core/base_trainer.py)", where)


def _v1_optimizer(optim: Mapping[str, Any] | None, label: str, where: str, raw: dict[str, Setting], notes: list[str],
                  unread: list[str]) -> None:
    """v1 builds its optimizer itself (core/base_trainer.py _init_optimizer), never from transformers'
    TrainingArguments: ``torch.optim.AdamW(params, lr)`` without optim_config, ``OptimizerPlugin(name)`` with it:
    adamw passes ``fused=optim_config.get("fused")`` (plugins/trainer_plugins/optimizer.py build_adamw), muon keeps
    one momentum buffer per hidden matrix and AdamW's states for the rest (optimizers/optimizer.py
    create_muon_optimizer). fused_optimizer is always set, so merge's transformers default does not apply."""
    name = str(optim.get("name", "")).strip().lower() if optim is not None else ""
    source = f"{label} key optim_config"
    if optim is None:
        raw["optimizer"] = Setting("adamw", f"{label} (no optim_config: torch.optim.AdamW)", where)
    elif name in ("adamw", "muon"):
        raw["optimizer"] = Setting("adamw", f"{source}.name" + (" (Muon read as AdamW)" if name == "muon" else ""),
                                   where)
    else:
        raw["optimizer"] = Setting("adamw", f"{source}.name {name or '?'} (read as torch.optim.AdamW)", where)
        unread.append(f"optim_config (name {name or '?'}: read as AdamW)")
    if name == "adamw" and to_bool(optim.get("fused")) is True:
        raw["fused_optimizer"] = Setting(True, f"{source}.fused", where)
    else:
        why = "optim_config adamw: torch.optim.AdamW(fused=None)" if name == "adamw" else \
            "no optim_config: torch.optim.AdamW(params, lr)" if optim is None else f"optim_config {name or '?'}"
        raw["fused_optimizer"] = Setting(False, f"{label} ({why}, foreach)", where)
    if name == "adamw":
        known = {"name", "lr", "betas", "eps", "weight_decay", "foreach", "fused"}
        unread += [f"optim_config.{k}" for k in optim if k not in known]
    elif name == "muon":
        notes.append(f"{source}.name muon: Muon keeps one momentum buffer per hidden weight matrix and AdamW's two "
                     "states for the embeddings, output head and norms; read as AdamW (an over-estimate of one state "
                     "per hidden-matrix parameter)")


def _v1_preference(keys: Mapping[str, Any], kind: str, v1: V1Launch, label: str, where: str,
                   raw: dict[str, Setting], notes: list[str]) -> None:
    """``llamafactory-cli dpo`` (v1/trainers/dpo_trainer.py DPOTrainer): chosen and rejected are concatenated into one
    sample of at most cutoff_len tokens (no doubled micro-batch, unlike v0's and TRL's paired forward); pref_loss
    sigmoid (the default) keeps a reference: a frozen deep copy of the model for full and freeze tuning, the policy
    with its adapter disabled for LoRA (no copy); orpo and simpo use none."""
    loss = str(keys.get("pref_loss", "sigmoid")).strip().lower()
    given = "pref_loss" in keys
    if loss not in _V1_PREF_LOSSES:
        notes.append(f"{label} key pref_loss {loss}: LLaMA-Factory v1 takes sigmoid, orpo or simpo (dpo_trainer.py "
                     "raises on others); read as one without a reference model")
        return
    if loss == "sigmoid" and kind in ("full", "freeze"):
        raw["reference_model"] = Setting(True, f"{label} ({v1.how}, pref_loss sigmoid{'' if given else ' default'}: "
                                               "a frozen deep copy of the model as reference, v1 dpo_trainer.py)",
                                         where)
    notes.append(f"{label} ({v1.how}): v1 concatenates each pair's chosen and rejected into one sequence of at most "
                 "cutoff_len tokens (dpo_trainer.py), so the micro-batch is not doubled")


# --- from raw keys to TrainingSpec fields ---------------------------------------------------------


def _joined(*settings: Setting | None) -> tuple[str, str]:
    present = [s for s in settings if s is not None]
    return " + ".join(dict.fromkeys(s.source for s in present)), present[0].where


def _put(out: Settings, name: str, value: Any, *why: Setting | None) -> None:
    source, where = _joined(*why)
    out[name] = Setting(value, source, where)


_DTYPES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "16",
    "fp16": "16",
    "half": "16",
    "float32": "32",
    "fp32": "32",
    "float": "32",
}


def _enabled(setting: Setting | None) -> bool | str | None:
    """``--bf16`` / DeepSpeed ``"bf16": {"enabled": ...}`` as True/False, ``"auto"`` for DeepSpeed's auto, None
    when absent."""
    if setting is None:
        return None
    value = setting.value.get("enabled") if isinstance(setting.value, dict) else setting.value
    if isinstance(setting.value, dict) and str(value).strip().lower() == "auto":
        return "auto"
    return to_bool(value) is True


def _resolve_precision(raw: Mapping[str, Setting], out: Settings) -> None:
    if (lightning := raw.get("_lightning_precision")) is not None:
        _put(out, "precision", lightning.value, lightning)
        return
    dtype, pure = raw.get("_dtype"), raw.get("_pure_bf16")
    bf16, fp16, mixed = raw.get("_bf16"), raw.get("_fp16"), raw.get("_mixed")
    weights = _DTYPES.get(str(dtype.value).lower()) if dtype else None
    if pure and pure.value is True:
        _put(out, "precision", "bf16-true", pure)
    elif weights in ("bf16", "16"):
        _put(out, "precision", f"{weights}-true", dtype)
    elif _enabled(bf16) is True:
        _put(out, "precision", "bf16-mixed", bf16)
    elif _enabled(fp16) is True:
        _put(out, "precision", "16-mixed", fp16)
    elif mixed:
        text = str(mixed.value).lower()
        value = {"bf16": "bf16-mixed", "fp16": "16-mixed", "no": "32-true", "fp8": "bf16-mixed"}.get(text)
        if value:
            _put(out, "precision", value, mixed)
    elif weights == "32":
        _put(out, "precision", "32-true", dtype)


def _deepspeed_masters(raw: Mapping[str, Setting], out: Settings, notes: list[str]) -> None:
    """A model loaded in bf16/fp16 (``torch_dtype``) that DeepSpeed trains with bf16/fp16 on: ZeRO keeps fp32 master
    weights and fp32 optimizer states whatever dtype the model was loaded in (deepspeed/runtime/zero/stage_1_and_2.py
    ``single_partition_of_fp32_groups``, stage3.py ``fp32_partitioned_groups_flat``), so the job is *-mixed, not
    *-true (alignment-handbook's and TRL's full-training recipes: ``torch_dtype: bfloat16`` with ``bf16: true``).
    Read as *-true, its masters went uncounted: 7 GiB per GPU under for Mistral-7B on 8 GPUs."""
    precision, dtype = out.get("precision"), raw.get("_dtype")
    if precision is None or dtype is None or precision.source != dtype.source:
        return
    if precision.value not in ("bf16-true", "16-true"):
        return
    sharding = out.get("sharding")
    deepspeed = any(k in raw for k in ("_deepspeed", "_use_deepspeed", "_zero_optimization")) or (
        sharding is not None and str(sharding.value).startswith("zero"))
    half = "bf16" if precision.value == "bf16-true" else "16"
    flag = raw.get("_bf16" if half == "bf16" else "_fp16")
    mixed = raw.get("_mixed")
    enabled = _enabled(flag) is True or (mixed is not None and str(mixed.value).lower() == (
        "bf16" if half == "bf16" else "fp16"))
    if not deepspeed or not enabled:
        return
    on = flag if _enabled(flag) is True else mixed
    assert on is not None
    out["precision"] = Setting(f"{half}-mixed", f"{dtype.source} under DeepSpeed with {on.source}", on.where)
    notes.append(f"{dtype.source} ({dtype.value}) under DeepSpeed with {half} on ({on.source}): ZeRO keeps fp32 master "
                 f"weights and optimizer states whatever the model was loaded in, so {half}-mixed, not {half}-true")


def _deepspeed_precision(sub: Mapping[str, Setting], out: Settings, notes: list[str],
                         default_bf16: Setting | None = None) -> None:
    """Precision from a DeepSpeed config when the trainer's own flags did not set it. ``"enabled": "auto"`` is
    filled from the trainer's arguments (transformers integrations/deepspeed.py, HfTrainerDeepSpeedConfig:
    ``fill_match("bf16.enabled", args.bf16)``; accelerate: from ``mixed_precision``), so with no --bf16/--fp16 the
    engine runs fp32: read as 32-true (a later source, e.g. ACCELERATE_MIXED_PRECISION, still wins), unless the
    trainer's own default is bf16 (``default_bf16``: TRL's configs), which "auto" then takes."""
    _resolve_precision(sub, out)
    autos = [s for s in (sub.get("_bf16"), sub.get("_fp16")) if _enabled(s) == "auto"]
    if "precision" not in out and autos and default_bf16 is not None:
        out["precision"] = Setting("bf16-mixed", f"{default_bf16.source}, which the DeepSpeed config's \"auto\" takes",
                                   default_bf16.where)
        return
    if "precision" not in out and autos:
        _put(out, "precision", "32-true", *autos)
        notes.append(f"{' and '.join(s.source for s in autos)}: enabled \"auto\" takes the trainer's --bf16 / "
                     "--fp16, and the job gives neither: fp32 (32-true) assumed")


def _v1_deepspeed_precision(sub: Mapping[str, Setting], v1: Setting, out: Settings, notes: list[str]) -> None:
    """Precision of a DeepSpeed config that LLaMA-Factory v1 runs: v1 sets bf16/fp16 ``enabled`` itself
    (plugins/model_plugins/deepspeed_utils.py infer_deepspeed_mixed_precision, called by trainer_plugins/distributed/
    deepspeed.py): fp16 true is refused (it raises ValueError), bf16 true is bf16, bf16 false or fp16 false (bf16
    "auto" or absent) is fp32, and both "auto" or absent is bf16. An ``enabled`` key left out counts as "auto". v1
    writes ``bf16.enabled``, which shadows DeepSpeed's old ``bfloat16`` section, so that section is not read."""
    def state(key: str) -> tuple[bool | str, Setting | None]:
        setting = sub.get(key)
        if setting is None or setting.source.endswith("key bfloat16"):
            return "auto", None
        value = setting.value.get("enabled", "auto") if isinstance(setting.value, Mapping) else setting.value
        text = str(value).strip().lower()
        return (True if value is True or text == "true" else False if value is False or text == "false"
                else "auto"), setting

    (bf16, bf16_at), (fp16, fp16_at) = state("_bf16"), state("_fp16")
    why = f"{v1.source}: bf16 {str(bf16).lower()}, fp16 {str(fp16).lower()}"
    if fp16 is True and fp16_at is not None:
        _put(out, "precision", "16-mixed", fp16_at)
        notes.append(f"{fp16_at.source} enables fp16: LLaMA-Factory v1 runs DeepSpeed in bf16 or fp32 only "
                     "(deepspeed_utils.py infer_deepspeed_mixed_precision raises ValueError), so the job does not "
                     "start as written; read as 16-mixed")
    elif bf16 is True or (bf16 == "auto" and fp16 == "auto"):
        out["precision"] = Setting("bf16-mixed", why + ("" if bf16 is True else ' (both "auto" or absent: bf16)'),
                                   (bf16_at or v1).where)
    else:
        out["precision"] = Setting("32-true", why + " (no mixed precision)", (bf16_at or fp16_at or v1).where)


# PEFT methods other than LoRA that trainers name (LLaMA-Factory finetuning_type oft; PEFT's OFT, BOFT, IA3, LoHa,
# LoKr, AdaLoRA, VeRA, prompt and prefix tuning): read as LoRA, with a note
_OTHER_ADAPTERS = frozenset({"oft", "boft", "ia3", "loha", "lokr", "adalora", "vera", "prefix", "prefix_tuning",
                             "prompt_tuning", "p_tuning", "ptuning"})


def _resolve_method(raw: Mapping[str, Setting], out: Settings, notes: list[str]) -> None:
    adapter, ftype, peft = raw.get("_adapter"), raw.get("_finetuning_type"), raw.get("_peft")
    four, eight, bits = raw.get("_4bit"), raw.get("_8bit"), raw.get("_quant_bits")
    if bits is not None and str(bits.value) in ("4", "8"):
        flag = Setting(True, bits.source, bits.where)
        four, eight = (flag, eight) if str(bits.value) == "4" else (four, flag)
    quantized = next((s for s in (four, eight) if s is not None and s.value is True), None)
    lora_keys = [s for k, s in raw.items() if k.startswith("lora.") or k == "_lora_all_linear"]
    kind = str(adapter.value).lower() if adapter else str(ftype.value).lower() if ftype else ""
    if kind == "full" or kind == "freeze":
        _put(out, "method", "full", ftype or adapter)
        if kind == "freeze" and "trainable_layers" not in raw:
            notes.append(
                "finetuning_type freeze trains some layers only; read as full fine-tuning "
                "(an over-estimate of gradients and optimizer states)"
            )
        return
    if kind in _OTHER_ADAPTERS:
        # an adapter the TrainingSpec has no method for: the base frozen, small trained matrices beside each
        # targeted linear, each keeping a copy of its input, as LoRA's do; OFT's block-diagonal rotation of block
        # size b trains about in x b / 2 parameters per linear, LoRA of rank b / 4 as many (LLaMA-Factory's OFT:
        # block 32, every linear layer)
        source = ftype or adapter
        _put(out, "method", "lora", source)
        for key, value in (("lora.rank", 8), ("lora.target_modules", "all-linear")):
            out[key] = raw.get(key) or Setting(value, f"{source.source} {kind} (predicted as LoRA of rank 8 on every "
                                                      "linear layer)", source.where)
        notes.append(f"{source.source} {kind}: an adapter the TrainingSpec cannot express; predicted as LoRA (rank "
                     f"{out['lora.rank'].value}, {out['lora.target_modules'].value}): the frozen base and the "
                     "activations as LoRA's, the adapter's own size approximate")
        return
    peft_off = peft is not None and peft.value is False and not kind
    if peft_off and quantized is None:
        # TRL: ``--use_peft false`` builds no adapter whatever the --lora_* values (trl get_peft_config returns
        # None), so the model is trained in full
        _put(out, "method", "full", peft)
        if lora_keys:
            notes.append(f"{', '.join(dict.fromkeys(s.source for s in lora_keys))} ignored: {peft.source} is false")
        return
    wants_lora = kind in ("lora", "qlora") or (peft is not None and peft.value is True) or bool(lora_keys)
    if quantized is not None or kind == "qlora":
        _put(out, "method", "qlora", adapter or ftype or peft, quantized)
        if not wants_lora:
            notes.append(
                f"{quantized.source if quantized else 'a quantized base'} without a LoRA "
                "adapter: quantized weights cannot be fully fine-tuned, read as QLoRA"
            )
        _resolve_quantization(raw, out, four if four is not None and four.value is True else None, eight)
    elif wants_lora:
        _put(out, "method", "lora", adapter or ftype or peft or lora_keys[0])
        if adapter is None and ftype is None and peft is None:
            notes.append(f"{lora_keys[0].source} given without --use_peft / adapter: read as LoRA")
    if "method" in out:
        for key, setting in raw.items():
            if key.startswith("lora."):
                out[key] = setting
        if "_lora_all_linear" in raw and raw["_lora_all_linear"].value is True:
            out["lora.target_modules"] = Setting(
                "all-linear", raw["_lora_all_linear"].source, raw["_lora_all_linear"].where
            )


# Preference losses that score a chosen and a rejected completion in one forward (TRL's DPOTrainer and CPO/ORPO
# trainers concatenate them: concatenated_inputs / concatenated_forward), and those of them that compare against a
# frozen reference model (DPO, IPO; ORPO and SimPO need none)
_PAIRED_LOSSES = ("dpo", "ipo", "orpo", "simpo", "sigmoid", "hinge", "cpo",
                  # a pairwise reward model scores a chosen and a rejected sequence in one micro-batch (TRL's
                  # RewardTrainer with DataCollatorForPreference, LLaMA-Factory's stage rm with its
                  # PairwiseDataCollatorWithPadding: "2 * n examples"), with no reference model
                  "reward")
# KTO scores single completions (its KL term runs the policy under no_grad) against a reference model
_REFERENCE_LOSSES = ("dpo", "ipo", "sigmoid", "hinge", "kto")


def _pair_batch(out: Settings, trainer: str, where: str) -> None:
    """The micro-batch of a trainer that forwards a chosen and a rejected sequence per sample together: twice the
    per-device batch (the TrainingSpec default 1 where the job states none), said in its provenance."""
    batch = out.get("micro_batch_size")
    count = launch_count(batch.value) if batch is not None else 1
    if count is not None:
        what = batch.source if batch is not None else "TrainingSpec default 1"
        out["micro_batch_size"] = Setting(2 * count, f"{what} x 2 ({trainer}: a chosen and a rejected sequence per "
                                                     "sample in one forward)", where)


def _resolve_preference(raw: Mapping[str, Setting], out: Settings, notes: list[str]) -> None:
    """Preference training as the trainers run it: each micro-batch holds a chosen and a rejected sequence per
    sample, forwarded together (twice the sequences of the per-device batch), and DPO/IPO without an adapter keep a
    frozen reference model. axolotl ``rl``; LLaMA-Factory ``stage: dpo`` with ``pref_loss`` (sigmoid, i.e. DPO, by
    default; orpo and simpo use no reference); TRL's ``trl dpo`` sets ``_rl`` itself."""
    rl, stage, loss = raw.get("_rl"), raw.get("_stage"), raw.get("_pref_loss")
    kind, source = None, None
    if rl is not None and str(rl.value).strip().lower() in (*_PAIRED_LOSSES, "kto"):
        kind, source = str(rl.value).strip().lower(), rl
    elif stage is not None and str(stage.value).strip().lower() == "dpo":
        kind = str(loss.value).strip().lower() if loss is not None else "sigmoid"
        source = stage
    elif stage is not None and str(stage.value).strip().lower() == "kto":
        kind, source = "kto", stage
    elif stage is not None and str(stage.value).strip().lower() == "rm":
        kind, source = "reward", stage
    if stage is not None and str(stage.value).strip().lower() == "ppo":
        # LLaMA-Factory's PPO (train/ppo/trainer.py): rollouts generate up to max_new_tokens after a prompt of up to
        # cutoff_len, and the policy (with its value head) trains on both
        length, new = out.get("seq_len"), raw.get("_max_new_tokens")
        if length is not None and new is not None and (total := launch_count(str(length.value))) is not None \
                and (extra := launch_count(str(new.value))) is not None:
            out["seq_len"] = Setting(total + extra, f"{length.source} + {new.source} (PPO trains on prompt and "
                                                    "response)", length.where)
        notes.append(f"{stage.source} ppo: the rollout's generation (its KV cache), the value head and the reward "
                     "model's forward are not in the prediction (an under-estimate)")
    if kind is None or source is None:
        return
    if kind in _PAIRED_LOSSES:
        _pair_batch(out, source.source, source.where)
    if kind == "reward" and "task" not in out and stage is None:
        # a reward model scores a sequence with one label: AutoModelForSequenceClassification, num_labels 1 (axolotl
        # reward_model, TRL's RewardTrainer); LLaMA-Factory's stage rm keeps the LM head under a value head instead
        out["task"] = Setting("seq-classification", f"{source.source} (a sequence classifier with one label)",
                              source.where)
    method = out.get("method")
    if kind in _REFERENCE_LOSSES and "reference_model" not in out and (method is None or method.value == "full"):
        out["reference_model"] = Setting(True, f"{source.source} (a frozen reference model beside the trained one)",
                                         source.where)


def _resolve_quantization(
    raw: Mapping[str, Setting], out: Settings, four: Setting | None, eight: Setting | None
) -> None:
    if four is None and eight is not None and eight.value is True:
        _put(out, "quantization", "int8", eight)
        return
    qtype, double = raw.get("_quant_type"), raw.get("_double")
    kind = str(qtype.value).lower() if qtype else "nf4"
    if kind == "fp4":
        _put(out, "quantization", "fp4", qtype)
    elif double is not None:
        _put(out, "quantization", "nf4-dq" if double.value is True else "nf4", double, qtype)
    elif qtype is not None:
        _put(out, "quantization", "nf4", qtype)


def deepspeed_stage_from_name(name: str) -> tuple[int | None, bool]:
    """ZeRO stage and offload guessed from a config file name (``ds_z3_offload_config.json``)."""
    base = basename(name).lower()
    # FastChat's playground/deepspeed_config_s2.json / _s3.json: "s" for stage
    match = re.search(r"(?:zero|stage|ds_z|_z)[_-]?([0-3])(?!\d)", base) or re.search(r"z([0-3])(?!\d)", base) \
        or re.search(r"(?:^|[_-])s([0-3])(?=[._-]|$)", base)
    # "offload" but not its negation (Chinese-LLaMA-Alpaca's ds_zero2_no_offload.json, open-instruct's
    # stage3_no_offloading_accelerate.conf: copied by many forks)
    return (int(match.group(1)) if match else None), "offload" in base and re.search(r"no[_-]?offload", base) is None


def _zero_sharding(stage: Any) -> str | None:
    return {"0": "ddp", "1": "zero1", "2": "zero2", "3": "zero3"}.get(str(stage).strip())


def _offload_devices(optimizer: Any, param: Any, sharding: Setting | None = None,
                     notes: list[str] | None = None) -> str | None:
    """The offload DeepSpeed does: parameters only at ZeRO stage 3 (below it DeepSpeed ignores offload_param,
    noted), the optimizer at any stage. Parameters without the optimizer (ZeRO-Infinity allows it) keep the
    optimizer states on the GPUs: read as no offload, noted (the parameter shards counted on the GPU are the
    smaller error, and a safe one)."""
    def on(device: Any) -> bool:
        return str(device).lower() in ("cpu", "nvme")

    if on(param):
        if sharding is None or sharding.value == "zero3":
            if on(optimizer):
                return "params+optimizer"
            if notes is not None:
                notes.append("DeepSpeed offload_param without offload_optimizer: the optimizer states stay on the "
                             "GPUs; read as no offload, which also counts the 16-bit parameter shards on the GPU "
                             "(2 bytes per parameter over the ZeRO-3 group: a small over-estimate)")
            return None
        if notes is not None:
            notes.append(f"offload_param ignored: DeepSpeed offloads parameters only at ZeRO stage 3 ({sharding.value} "
                         f"from {sharding.source})")
    return "optimizer" if on(optimizer) else None


def _deepspeed_hierarchy(section: Mapping[str, Any], zero: Setting, out: Settings, notes: list[str]) -> None:
    """ZeRO-3's hierarchical layouts: MiCS (``mics_shard_size`` > 0) shards the model states within groups of that
    many ranks and replicates them across the groups (deepspeed/runtime/zero/mics.py): ``shard_group_size``, through
    the merge's checks. ZeRO++ hpZ (``zero_hpz_partition_size`` > 1) keeps the states sharded over every rank but adds a
    secondary copy of the 16-bit parameters sharded within that many ranks: ``secondary_shard_size``. Both are read
    as markers that the merge keeps once the job's stage is final (a config's "auto" stage, a ``--zero_stage`` flag,
    the annotation), so a config read at another stage is noted, not an error about a field the job never wrote."""
    stage = _zero_sharding(section.get("stage"))
    if stage is not None and stage != "zero3":
        return
    mics = launch_count(section.get("mics_shard_size"))
    if mics is not None and mics > 0:
        out["_shard_group"] = Setting(mics, f"{zero.source} mics_shard_size {mics} (MiCS)", zero.where)
    hpz = launch_count(section.get("zero_hpz_partition_size"))
    if hpz is not None and hpz > 1:
        out["_secondary_shard"] = Setting(hpz, f"{zero.source} zero_hpz_partition_size {hpz} (ZeRO++ hpZ)",
                                          zero.where)
    # how many gathered parameters ZeRO-3 keeps (DeepSpeedZeroConfig accepts the names with and without "stage3_")
    for key, marker in (("max_live_parameters", "_zero3_live"), ("max_reuse_distance", "_zero3_reuse")):
        name = f"stage3_{key}" if f"stage3_{key}" in section else key
        if name not in section:
            continue
        elements = _element_count(section[name], MAX_ZERO3_ELEMENTS)
        if elements is None:
            raise SpecError.one("", f"{zero.source}: zero_optimization.{name} must be a whole number of parameter "
                                    f"elements from 0 to 1e15; got {_shown(section[name])}",
                                "write it as DeepSpeed does (1e9, 0)")
        out[marker] = Setting(elements, f"{zero.source} {name}", zero.where)
    # ZeRO++ qwZ (deepspeed/runtime/zero/config.py DeepSpeedZeroConfig; passed to the ZeRO-3 optimizer and its
    # parameter coordinator only: runtime/engine.py, zero/parameter_offload.py). zero_quantized_nontrainable_weights
    # keeps the parameters that do not train (a LoRA base, freeze tuning's frozen blocks) quantized to int8 in memory;
    # zero_quantized_weights keeps every parameter in its own precision and quantizes only the all-gather traffic.
    if to_bool(section.get("zero_quantized_nontrainable_weights")) is True:
        notes.append(f"{zero.source} zero_quantized_nontrainable_weights (ZeRO++): DeepSpeed keeps the frozen "
                     "parameters' shards in int8; vramfit counts them at full 16-bit width (an over-estimate of up to "
                     "half their bytes; nothing changes for parameters that train)")
    if to_bool(section.get("zero_quantized_weights")) is True:
        notes.append(f"{zero.source} zero_quantized_weights (ZeRO++ qwZ): the parameters stay in their own precision "
                     "and only the all-gather travels in int8; vramfit counts the gathered weights at full 16-bit "
                     "width (at most a small over-estimate of the all-gather buffers)")


# DeepSpeed configs that trainers ship, as they ship them (the keys vramfit reads): their example recipes name them by
# path, and a job of that trainer whose manifest does not carry the file is read with these contents rather than from
# the file name alone (noted). LLaMA-Factory: examples/deepspeed/ds_z*_config.json at hiyouga/LLaMA-Factory 1d6e8b2
# (ZeRO-3's reduce_bucket_size "auto", hidden_size^2 as the HF Trainer fills it: 0.03 GiB of 16-bit values at hidden
# 4096 where DeepSpeed's default is 0.93 GiB; overlap_comm false; fp16/bf16 "auto", filled by the trainer's flags).
# axolotl: deepspeed_configs/*.json at axolotl-ai-cloud/axolotl 58b1d3a (zero1, zero2) and 1377ccc / 1aaebb0 (zero3*),
# e7912a4 / 1377ccc (zero1/zero2_torch_compile: the same ZeRO sections plus DeepSpeed's compile section, which vramfit
# does not read) and 617360c (zero3_cpuoffload),
# where zero2.json offloads the optimizer to the CPU, which its name does not say, zero1.json names DeepSpeed's
# AdamW (a fused kernel) and the zero3 files keep no gathered parameters for reuse (max_live_parameters and
# max_reuse_distance 0). axolotl's names are common ones, so they count only in its deepspeed_configs folder.
_AUTO_PRECISION: dict[str, Any] = {"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
                                   "train_micro_batch_size_per_gpu": "auto"}
_BF16: dict[str, Any] = {"bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": "auto"}
_CPU: dict[str, Any] = {"device": "cpu", "pin_memory": True}
_LF_ZERO_2: dict[str, Any] = {"overlap_comm": False, "reduce_bucket_size": 5e8, "contiguous_gradients": True}
_LF_ZERO_3: dict[str, Any] = {"overlap_comm": False, "reduce_bucket_size": "auto", "contiguous_gradients": True}
_AX_ZERO_2: dict[str, Any] = {"stage": 2, "offload_optimizer": {"device": "cpu"}, "contiguous_gradients": True,
                              "overlap_comm": True}
_AX_ZERO_3: dict[str, Any] = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                              "reduce_bucket_size": "auto", "stage3_max_live_parameters": 0,
                              "stage3_max_reuse_distance": 0}
# the bf16 ones write those two keys without "stage3_" (DeepSpeedZeroConfig takes both names)
_AX_ZERO_3_BF16: dict[str, Any] = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                                   "reduce_bucket_size": "auto", "max_live_parameters": 0, "max_reuse_distance": 0}
SHIPPED_DEEPSPEED_FILES: dict[str, dict[str, dict[str, Any]]] = {
    "LLaMA-Factory": {
        "ds_z0_config.json": {**_AUTO_PRECISION, "zero_optimization": {"stage": 0, **_LF_ZERO_2}},
        "ds_z2_config.json": {**_AUTO_PRECISION, "zero_optimization": {"stage": 2, **_LF_ZERO_2}},
        "ds_z2_offload_config.json": {**_AUTO_PRECISION, "zero_optimization": {
            "stage": 2, "offload_optimizer": _CPU, **_LF_ZERO_2}},
        "ds_z3_config.json": {**_AUTO_PRECISION, "zero_optimization": {"stage": 3, **_LF_ZERO_3}},
        "ds_z3_offload_config.json": {**_AUTO_PRECISION, "zero_optimization": {
            "stage": 3, "offload_optimizer": _CPU, "offload_param": _CPU, **_LF_ZERO_3}},
        # the optimizer only, though the name says offload (ca7359c): the parameters stay on the GPU
        "ds_z3_partial_offload_config.json": {**_AUTO_PRECISION, "zero_optimization": {
            "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": False}, **_LF_ZERO_3,
            "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9}},
    },
    "axolotl": {
        "zero1.json": {**_AUTO_PRECISION, "zero_optimization": {"stage": 1, "overlap_comm": True},
                       "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}},
        "zero1_torch_compile.json": {**_AUTO_PRECISION, "zero_optimization": {"stage": 1, "overlap_comm": True}},
        "zero2.json": {**_AUTO_PRECISION, "zero_optimization": _AX_ZERO_2},
        "zero2_torch_compile.json": {**_AUTO_PRECISION, "zero_optimization": _AX_ZERO_2},
        "zero3.json": {**_AUTO_PRECISION, "zero_optimization": _AX_ZERO_3},
        "zero3_cpuoffload.json": {**_AUTO_PRECISION, "zero_optimization": {
            **_AX_ZERO_3, "offload_optimizer": _CPU, "offload_param": _CPU}},
        "zero3_bf16.json": {**_BF16, "zero_optimization": _AX_ZERO_3_BF16},
        "zero3_bf16_cpuoffload_all.json": {**_BF16, "zero_optimization": {
            **_AX_ZERO_3_BF16, "offload_optimizer": _CPU, "offload_param": _CPU}},
        "zero3_bf16_cpuoffload_params.json": {**_BF16, "zero_optimization": {**_AX_ZERO_3_BF16,
                                                                             "offload_param": _CPU}},
    },
    # Ray's LLM fine-tuning template (doc/source/templates/04_finetuning_llms_with_deepspeed/deepspeed_configs at
    # ray-project/ray 2265392 (13b) and 3b0fce1 (70b)): ZeRO-3 with the optimizer (and for 13B the parameters) in CPU
    # memory; its default zero_3_llama_2_7b.json is not in view and keeps the file-name reading
    "Ray's LLM template": {
        "zero_3_llama_2_13b.json": {**_AUTO_PRECISION, "zero_optimization": {
            "stage": 3, "offload_optimizer": _CPU, "offload_param": _CPU, "overlap_comm": True,
            "contiguous_gradients": True, "reduce_bucket_size": 5e8, "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9}},
        "zero_3_llama_2_70b.json": {"fp16": {"enabled": False}, "bf16": {"enabled": True},
                                    "train_micro_batch_size_per_gpu": "auto", "zero_optimization": {
                                        "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": False},
                                        "overlap_comm": True, "contiguous_gradients": True,
                                        "reduce_bucket_size": "auto"}},
    },
    # Anyscale's fine-tune-llm_v2 template (templates/fine-tune-llm_v2/deepspeed_configs at anyscale/templates
    # 1996e4e (zero_2), d1b3672 (zero_3_hpz), 2b222de (zero_3_offload_optim)), which its LLMForge configs name
    "LLMForge": {
        "zero_2.json": {**_BF16, "zero_optimization": {
            "stage": 2, "contiguous_gradients": True, "overlap_comm": True, "reduce_scatter": True,
            "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8}},
        "zero_3_hpz.json": {**_BF16, "zero_optimization": {
            "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto",
            "zero_hpz_partition_size": 8, "stage3_prefetch_bucket_size": 5e8,
            "stage3_param_persistence_threshold": "auto"}},
        "zero_3_offload_optim.json": {**_BF16, "zero_optimization": {
            "stage": 3, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True, "contiguous_gradients": True,
            "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": 5e8,
            "stage3_param_persistence_threshold": "auto"}},
    },
    # transformers' own test configs, which its DeepSpeed guide's examples name (docs/source/en/deepspeed.md):
    # tests/deepspeed/ds_config_zero2.json @00e12e7 offloads the optimizer; ds_config_zero3.json offloads the
    # optimizer and the parameters (@61c7ec9: fp16 on, later releases "auto")
    "transformers": {
        "ds_config_zero2.json": {**_AUTO_PRECISION, "zero_optimization": {
            "stage": 2, "offload_optimizer": _CPU, "overlap_comm": True, "reduce_bucket_size": 2e8,
            "contiguous_gradients": True}},
        "ds_config_zero3.json": {**_AUTO_PRECISION, "zero_optimization": {
            "stage": 3, "offload_optimizer": _CPU, "offload_param": _CPU, "overlap_comm": True,
            "contiguous_gradients": True, "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9}},
    },
}
# the folder a trainer keeps them in, where its names are too common to be recognised anywhere
_SHIPPED_FOLDER: dict[str, tuple[str, ...]] = {"axolotl": ("deepspeed_configs",),
                                                "transformers": ("tests", "deepspeed"),
                                                "Ray's LLM template": ("deepspeed_configs",),
                                                "LLMForge": ("deepspeed_configs",)}
# owners whose folder (and names) alone identify the file, whatever runs it (transformers' example scripts under any
# launcher; the Ray template's zero_3_llama_2_*.json)
_FOLDER_IDENTIFIES = frozenset({"transformers", "Ray's LLM template"})


# DeepSpeed's optimizer "type" names (deepspeed/runtime/config.py: ADAM_OPTIMIZER ... LION_OPTIMIZER, compared lower
# case) as TrainingSpec optimizers: the Adam family, LAMB and the 1-bit variants keep two fp32 states per parameter
_DEEPSPEED_OPTIMIZERS = {**dict.fromkeys(("adam", "adamw", "lamb", "onebitadam", "zerooneadam", "onebitlamb", "muadam",
                                          "muadamw", "fusedadam", "cpuadam"), "adamw"), "lion": "lion"}


def _deepspeed_optimizer(section: Any, label: str, where: str, out: Settings, notes: list[str]) -> None:
    """A DeepSpeed config's ``optimizer`` section is the optimizer that runs: the HF Trainer then builds none of its
    own (transformers integrations/deepspeed.py deepspeed_optim_sched: a DummyOptim that DeepSpeed replaces with the
    config's), accelerate refuses one in the code beside it, so ``--optim adamw_bnb_8bit`` or axolotl's ``optimizer``
    do not apply (an 8-bit optimizer read under a config that runs fp32 AdamW under-counted its states 4x)."""
    if not isinstance(section, Mapping) or section.get("type") in (None, ""):
        return
    written = str(section["type"])
    kind = _DEEPSPEED_OPTIMIZERS.get(written.strip().lower().replace("_", ""))
    given = out.get("optimizer")
    if kind is None:
        notes.append(f"{label} key optimizer.type {written!r}: DeepSpeed's optimizer, which vramfit does not model; "
                     f"{'the ' + given.source + ' optimizer it replaces is' if given else 'AdamW is'} assumed")
        return
    if given is not None and given.value != kind:
        notes.append(f"{label} key optimizer.type {written!r} runs instead of {given.value} ({given.source}): "
                     "DeepSpeed builds the config's optimizer and the trainer's own is not created")
    out["optimizer"] = Setting(kind, f"{label} key optimizer.type {written!r}", where)
    if kind not in FUSABLE_OPTIMIZERS:
        out.pop("fused_optimizer", None)


def _shipped_deepspeed_config(text: str, config: Setting, trainer: str,
                              raw: Mapping[str, Setting]) -> tuple[str, dict[str, Any]] | None:
    """(trainer, contents) of a trainer's own DeepSpeed config that a job of that trainer names without carrying it:
    the command's ``trainer``, the trainer config the setting came from, or a config of that trainer among the job's
    settings (``accelerate launch -m axolotl.cli.train CONFIG --deepspeed ...``)."""
    path = PurePosixPath(text)
    for owner, shipped in SHIPPED_DEEPSPEED_FILES.items():
        if path.name not in shipped:
            continue
        if owner != trainer and owner not in _FOLDER_IDENTIFIES and owner not in config.source and not any(
                f"{owner} config" in setting.source for setting in raw.values()):
            continue
        folder = _SHIPPED_FOLDER.get(owner)
        if folder is not None and path.parent.parts[-len(folder):] != folder:
            continue
        return owner, json.loads(json.dumps(shipped[path.name]))  # a copy the reading cannot alter
    return None


def _resolve_deepspeed(
    raw: Mapping[str, Setting], out: Settings, notes: list[str], files: Mapping[str, str], trainer: str = ""
) -> None:
    config = raw.get("_deepspeed")
    zero = raw.get("_zero_optimization")
    sharding_before = out.get("sharding")
    if config is not None and (isinstance(config.value, bool)
                               or str(config.value).strip().lower() in ("true", "false")):
        # DeepSpeed's own ``--deepspeed`` switch (deepspeed.add_config_arguments: store_true; DeepSpeed-Chat,
        # OpenRLHF): the script builds its config in code, from flags such as --zero_stage; no file to read
        if to_bool(config.value) is True and "_zero_stage" not in raw and zero is None:
            notes.append(f"{config.source}: DeepSpeed switched on without a config file (the script builds it); "
                         "the ZeRO stage is not known: set sharding in the vramfit.io/spec annotation")
        config = None
    if config is not None:
        value = config.value
        data = value if isinstance(value, dict) else None
        text = str(value).strip()
        if data is None and text.startswith("{"):
            data = _load_mapping(text)
        if data is None and basename(text) in files:
            data = _load_mapping(files[basename(text)])
        label = f"DeepSpeed config {text if len(text) < 60 else '(inline)'}"
        if data is None and (shipped := _shipped_deepspeed_config(text, config, trainer, raw)) is not None:
            owner, data = shipped
            possessive = "'" if owner.endswith("s") else "'s"
            label = f"{owner}{possessive} {basename(text)} (as it ships)"
            notes.append(f"DeepSpeed config {text} is not in the manifest: read as {owner} ships it; a changed "
                         "copy of that name is not seen")
        if isinstance(data, dict):
            sub = read_mapping(data, label, config.where)
            zero = sub.get("_zero_optimization", zero)
            _deepspeed_optimizer(data.get("optimizer"), label, config.where, out, notes)
            autotp = data.get("tensor_parallel")
            size = autotp.get("autotp_size") if isinstance(autotp, dict) else None
            if isinstance(size, int) and not isinstance(size, bool) and size > 1 and "tensor_parallel" not in raw:
                # DeepSpeed's automatic tensor parallelism ("tensor_parallel": {"autotp_size": N}, DeepSpeed >= 0.16;
                # LLaMA-Factory's ds_z2_autotp_config.json): each linear split over N GPUs, the norms and the
                # activations between the linears whole (no sequence parallelism); data parallel over world / N
                source = f"{label} key tensor_parallel.autotp_size {size} (DeepSpeed AutoTP)"
                out.setdefault("tensor_parallel", Setting(size, source, config.where))
                out.setdefault("sequence_parallel", Setting(False, f"{label} (DeepSpeed AutoTP splits the linears "
                                                                   "only)", config.where))
            for key in ("micro_batch_size", "grad_accum_steps"):
                if key in sub and key not in raw and str(sub[key].value) != "auto":
                    out.setdefault(key, sub[key])
            batch = sub.get("micro_batch_size")
            if "_hf_trainer" in raw and "micro_batch_size" not in raw and (batch is None or str(batch.value) == "auto"):
                # the HF Trainer fills "auto" (or an absent batch) with TrainingArguments' per_device_train_batch_size
                out.setdefault("micro_batch_size", Setting(
                    8, "transformers TrainingArguments default per_device_train_batch_size 8 (DeepSpeed config "
                       "\"auto\")", config.where))
            if "precision" not in out and (v1 := raw.get("_ds_v1_precision")) is not None:
                _v1_deepspeed_precision(sub, v1, out, notes)
            elif "precision" not in out:
                _deepspeed_precision(sub, out, notes, raw.get("_bf16_default"))
        else:
            if "_hf_trainer" in raw and "micro_batch_size" not in raw:
                # whatever the config says, the HF Trainer requires its batch to match TrainingArguments'
                out.setdefault("micro_batch_size", Setting(
                    8, "transformers TrainingArguments default per_device_train_batch_size 8", config.where))
            stage, offload = deepspeed_stage_from_name(text)
            if stage is not None:
                _put(out, "sharding", _zero_sharding(stage), config)
                notes.append(
                    f"DeepSpeed config {text} is not in the manifest: ZeRO stage {stage} read "
                    "from its file name" + (", with CPU offload" if offload else "")
                )
                if offload:
                    _put(out, "offload", "params+optimizer" if stage == 3 else "optimizer", config)
            else:
                notes.append(
                    f"DeepSpeed config {text} is not in the manifest and its name does not say the "
                    "ZeRO stage; sharding not known (set it in the vramfit.io/spec annotation)"
                )
    if zero is not None and isinstance(zero.value, dict):
        section = zero.value
        stage = section.get("stage")
        if _zero_sharding(stage):
            _put(out, "sharding", _zero_sharding(stage), zero)
        off = _offload_devices(
            _offload_device(section, "offload_optimizer", zero),
            _offload_device(section, "offload_param", zero),
            out.get("sharding"), notes,
        )
        if off:
            _put(out, "offload", off, zero)
        _deepspeed_hierarchy(section, zero, out, notes)
        _deepspeed_gradient_buffer(section, zero, out, notes)
    stage_flag = raw.get("_zero_stage")
    if stage_flag is not None and _zero_sharding(stage_flag.value):
        _put(out, "sharding", _zero_sharding(stage_flag.value), stage_flag)
    elif (use := raw.get("_use_deepspeed")) is not None and use.value is True and "sharding" not in out:
        _put(out, "sharding", "zero2", use)
        notes.append(f"{use.source} without a ZeRO stage: accelerate's default stage 2 assumed")
    opt, par = raw.get("_offload_optimizer"), raw.get("_offload_param")
    if (opt or par) and (off := _offload_devices(opt.value if opt else None, par.value if par else None,
                                                 out.get("sharding"), notes)):
        _put(out, "offload", off, par if off == "params+optimizer" else opt)
    stage = out.get("sharding")
    if stage is not None and stage is not sharding_before and stage.value == "ddp":
        # ZeRO stage 0: DeepSpeed's engine still runs a 16-bit model with its FP16 / BF16 optimizer's fp32 masters
        # (engine.py _configure_optimizer); the merge says master_weights once the precision is known
        out["_zero0"] = Setting(True, stage.source, stage.where)


# Raw settings of a DeepSpeed config that the merge turns into zero_reduce_bucket_elements, zero_overlap_comm,
# secondary_shard_size (hpZ), zero3_max_live_parameters and zero3_max_reuse_distance once the job's ZeRO stage is
# final (a --zero_stage flag, accelerate's env or the annotation may change the config's own stage)
ZERO_STAGE_MARKERS = ("_zero_bucket", "_zero_overlap", "_secondary_shard", "_zero3_live", "_zero3_reuse", "_zero0")
# what DeepSpeed's pydantic config takes for a bool (pydantic's lax bool strings): to_bool's words without its "auto",
# "none" and empty string, which DeepSpeed refuses
_STRICT_TRUE = (_TRUE - {"auto"}) | {"t"}
_STRICT_FALSE = (_FALSE - {"none", ""}) | {"f"}


def _deepspeed_gradient_buffer(section: Mapping[str, Any], zero: Setting, out: Settings, notes: list[str]) -> None:
    """The ZeRO optimizer's contiguous gradient buffer: ``reduce_bucket_size`` elements (a number, or "auto", which
    the HF Trainer and accelerate fill with hidden_size^2) and ``overlap_comm`` (two buffers at ZeRO-2), read into
    markers that the merge keeps where the job's final stage has the buffer (:data:`ZERO_STAGE_MARKERS`)."""
    size = section.get("reduce_bucket_size")
    if size is not None:
        if str(size).strip().lower() == "auto":
            out["_zero_bucket"] = Setting("auto", zero.source, zero.where)
        else:
            # DeepSpeed's reduce_bucket_size is a non-negative int (with 0 every gradient takes its own path)
            elements = _element_count(size, MAX_ZERO_BUCKET_ELEMENTS)
            if elements is None:
                raise SpecError.one(
                    "", f"{zero.source}: zero_optimization.reduce_bucket_size must be a whole number of elements "
                        f"from 0 to 1e11, or \"auto\"; got {_shown(size)}",
                    "write it as DeepSpeed does (5e8, 200000000) or \"auto\"")
            out["_zero_bucket"] = Setting(elements, zero.source, zero.where)
    overlap = section.get("overlap_comm")
    if overlap is not None:
        text = str(overlap).strip().lower()
        if isinstance(overlap, bool) or (text in _STRICT_TRUE | _STRICT_FALSE and not isinstance(overlap, float)):
            out["_zero_overlap"] = Setting(overlap if isinstance(overlap, bool) else text in _STRICT_TRUE,
                                           zero.source, zero.where)
        else:
            raise SpecError.one(
                "", f"{zero.source}: zero_optimization.overlap_comm must be true or false; got {overlap!r}",
                "write it as true or false")
    stage = _zero_sharding(section.get("stage"))
    offloaded = _offload_device(section, "offload_optimizer", zero) not in (None, "none")
    # stages 1-2 keep contiguous gradients on with an offloaded optimizer (stage_1_and_2.py: contiguous_gradients or
    # cpu_offload); stage 3 does not
    if to_bool(section.get("contiguous_gradients", True)) is False and (stage == "zero3" or not offloaded):
        notes.append(f"{zero.source} contiguous_gradients false: DeepSpeed keeps no gradient buffer and flattens each "
                     "bucket as it reduces it; vramfit counts the buffer (an over-estimate of at most a bucket)")


def _shown(value: Any) -> str:
    """``repr(value)`` for an error message, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _element_count(value: Any, limit: int) -> int | None:
    """A whole number of elements from 0 to ``limit`` as DeepSpeed configs write one (1000000000, 1e9, "1e9"); None
    for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= limit else None
    if isinstance(value, float):
        number = value
    else:
        try:
            number = float(str(value).strip())
        except ValueError:
            return None
    if not math.isfinite(number) or not number.is_integer() or not 0 <= number <= limit:
        return None
    return int(number)


def _offload_device(section: Mapping[str, Any], key: str, zero: Setting) -> Any:
    """The ``device`` of a ZeRO ``offload_optimizer`` / ``offload_param`` section. DeepSpeed takes only a mapping
    there (runtime/zero/config.py: ``Optional[DeepSpeedZeroOffloadOptimizerConfig]`` / ``...ParamConfig``, pydantic
    models that reject a bare ``"cpu"``): anything else set is an input error naming the key."""
    value = section.get(key)
    if not value:
        return None
    if isinstance(value, Mapping):
        return value.get("device")
    raise SpecError.one(
        "", f"{zero.source}: zero_optimization.{key} must be a mapping (DeepSpeed's offload config); got "
            f"{type(value).__name__} {_shown(value)}",
        'write it as {"device": "cpu"} (or "nvme", "none"), as DeepSpeed requires')


# FSDP1 sharding strategies by name and by torch's ShardingStrategy number (accelerate's fsdp_sharding_strategy
# takes both: 1 FULL_SHARD, 2 SHARD_GRAD_OP, 3 NO_SHARD, 4 HYBRID_SHARD, 5 _HYBRID_SHARD_ZERO2).
_FSDP_STRATEGIES = {
    "full_shard": "fsdp",
    "1": "fsdp",
    "hybrid_shard": "fsdp",
    "4": "fsdp",
    "shard_grad_op": "fsdp-grad-op",
    "2": "fsdp-grad-op",
    "_hybrid_shard_zero2": "fsdp-grad-op",
    "hybrid_shard_zero2": "fsdp-grad-op",
    "5": "fsdp-grad-op",
    "no_shard": "ddp",
    "3": "ddp",
}
_HYBRID = {"hybrid_shard", "4", "_hybrid_shard_zero2", "hybrid_shard_zero2", "5"}
# HF ``--fsdp`` words that are options, not strategies (transformers trainer_utils.FSDPOption)
_FSDP_OPTIONS = {"offload", "auto_wrap"}


def _fsdp_strategy(text: str) -> str:
    return text.strip().lower().removeprefix("shardingstrategy.")


def _fsdp_config(nested: Setting, files: Mapping[str, str], notes: list[str]) -> dict[str, Any] | None:
    """HF ``--fsdp_config``: a mapping, a JSON string (TrainingArguments parses a ``{``-string of its dict fields
    with json.loads) or a path to a JSON file (json.load in TrainingArguments' FSDP setup; transformers
    training_args.py ``_VALID_DICT_FIELDS``), read from the files the manifest carries; its ``fsdp_`` key prefixes
    are optional, as TrainingArguments strips them."""
    if isinstance(nested.value, dict):
        return nested.value
    text = str(nested.value).strip()
    if text.startswith("{"):
        data = _load_mapping(text)
        if data is None:
            notes.append(f"{nested.source}: not a JSON object, FSDP settings in it not read")
        return data
    if basename(text) in files:
        data = _load_mapping(files[basename(text)])
        if data is None:
            notes.append(f"FSDP config {text} ({nested.source}) is not a JSON object, FSDP settings in it not read")
        return data
    notes.append(f"FSDP config {text} ({nested.source}) is not in the manifest: its sharding strategy, offload and "
                 "activation checkpointing are unknown")
    return None


def _resolve_fsdp(raw: Mapping[str, Setting], out: Settings, notes: list[str],
                  files: Mapping[str, str] | None = None) -> None:
    fsdp, use, strategy = raw.get("_fsdp"), raw.get("_use_fsdp"), raw.get("_fsdp_strategy")
    reshard = raw.get("_fsdp_reshard")
    nested = raw.get("_fsdp_config")
    data = _fsdp_config(nested, files or {}, notes) if nested is not None else None
    if nested is not None and data is not None:
        label = nested.source if isinstance(nested.value, dict) or str(nested.value).lstrip().startswith("{") \
            else f"FSDP config {nested.value}"
        sub = read_mapping(data, label, nested.where)
        strategy = sub.get("_fsdp_strategy", strategy)
        reshard = sub.get("_fsdp_reshard", reshard)
        if "_fsdp_offload" in sub and "_fsdp_offload" not in raw:
            raw = {**raw, "_fsdp_offload": sub["_fsdp_offload"]}
        if "gradient_checkpointing" in sub and "gradient_checkpointing" not in out:
            out["gradient_checkpointing"] = sub["gradient_checkpointing"]
    words: list[str] = []
    if fsdp is not None and isinstance(fsdp.value, list) and not fsdp.value:
        fsdp = None  # TrainingArguments.to_dict() of a job without FSDP: "fsdp": []
    if fsdp is not None and fsdp.value not in (False, None, ""):
        value = fsdp.value
        words = [str(w).lower() for w in value] if isinstance(value, list) else str(value).lower().split()
        if to_bool(value) is False:
            words, fsdp = [], None
        elif to_bool(value) is True:
            words = []  # ``--fsdp true``: FULL_SHARD, transformers' default strategy
    if not (fsdp is not None or (use is not None and use.value is True) or strategy is not None
            or reshard is not None):
        off = raw.get("_fsdp_offload")
        if off is not None and off.value is True:
            _put(out, "offload", "params+optimizer", off)
        return
    named = [w for w in words if w in _FSDP_STRATEGIES]
    unknown = [w for w in words if w not in _FSDP_STRATEGIES and w not in _FSDP_OPTIONS]
    chosen_word, why = (named[-1], fsdp) if named else ("", None)
    if strategy is not None:
        text = _fsdp_strategy(str(strategy.value))
        if text in _FSDP_STRATEGIES:
            chosen_word, why = text, strategy
        else:
            unknown.append(text)
    if reshard is not None:  # FSDP2: a bool, or (accelerate) an FSDP1 strategy name
        flag = to_bool(reshard.value)
        text = _fsdp_strategy(str(reshard.value))
        if isinstance(flag, bool):
            chosen_word, why = ("full_shard" if flag else "shard_grad_op"), reshard
        elif text in _FSDP_STRATEGIES:
            chosen_word, why = text, reshard
        else:
            unknown.append(text)
    for word in dict.fromkeys(unknown):
        notes.append(f"FSDP sharding strategy {word!r} is not one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
                     "HYBRID_SHARD, HYBRID_SHARD_ZERO2 (or 1-5): ignored (FULL_SHARD unless another setting names one)")
    chosen = _FSDP_STRATEGIES.get(chosen_word, "fsdp")
    source = why or strategy or fsdp or use or reshard
    off = raw.get("_fsdp_offload")
    offload = "offload" in words or (off is not None and off.value is True)
    offload_source = off if off is not None and off.value is True else fsdp
    if chosen == "ddp" and offload:
        # NO_SHARD with CPUOffload(offload_params=True) runs in FSDP1: each unit's whole flat parameter is copied to
        # the GPU before its forward/backward and dropped after (FlatParamHandle.pre_unshard -> flat_param_to;
        # reshard -> _use_sharded_flat_param), and the all-reduced gradient is copied to CPU (_runtime_utils
        # _reduce_grad_no_shard -> _offload_grad), where the optimizer steps. Nothing stays resident on the GPU,
        # as with FULL_SHARD + offload, whose per-GPU memory does not depend on the shard count: read as that.
        chosen = "fsdp"
        notes.append(f"FSDP NO_SHARD with parameter offload ({_joined(source, offload_source)[0]}) keeps only the "
                     "unit being computed on the GPU, as FULL_SHARD with offload does: read as sharding fsdp")
    _put(out, "sharding", chosen, source)
    version = raw.get("_fsdp_version")
    if chosen_word in _HYBRID and version is not None and str(version.value).strip() == "2" and why is strategy:
        # accelerate reads sharding_strategy for FSDP1 only (utils/dataclasses.py FullyShardedDataParallelPlugin:
        # FSDP2 warns it is deprecated and shards by reshard_after_forward over the whole data-parallel mesh)
        notes.append(f"FSDP {chosen_word.upper().lstrip('_')} ({strategy.source}) with fsdp_version 2 "
                     f"({version.source}): accelerate reads sharding_strategy for FSDP1 only; FSDP2 shards over every "
                     "rank (hybrid sharding there is parallelism_config's dp_replicate_size)")
    elif chosen_word in _HYBRID:
        # FSDP1's default hybrid process groups: the intra-node group of the GPUs the process sees
        # (torch.distributed.fsdp._init_utils._init_intra_and_inter_node_groups, num_devices_per_node =
        # device_count()), replicated across nodes; the pods give that count (merge: shard_group_size)
        out["_hybrid_node"] = Setting(chosen_word.upper().lstrip("_"), source.source, source.where)
    if offload:
        _put(out, "offload", "params+optimizer", offload_source)


def resolve(raw: Mapping[str, Setting], files: Mapping[str, str] | None = None, trainer: str = "") -> Reading:
    """Raw keys of one source -> TrainingSpec fields (method, precision, sharding are derived); ``trainer``: the
    command's trainer, whose shipped DeepSpeed configs a name can refer to."""
    out: Settings = {k: v for k, v in raw.items()
                     if not k.startswith(("_", "lora.")) or k in HYBRID_MARKERS + ZERO_STAGE_MARKERS
                     or k in ("_global_batch_size", MICRO_BATCH_CAP, TRAINING_WORLD)}
    notes: list[str] = []
    _resolve_precision(raw, out)
    _resolve_method(raw, out, notes)
    _resolve_preference(raw, out, notes)
    _resolve_deepspeed(raw, out, notes, files or {}, trainer)
    _deepspeed_masters(raw, out, notes)
    implied = _resolve_parallelism_config(raw, out, notes)
    _resolve_fsdp({**implied, **raw} if implied else raw, out, notes, files or {})
    _resolve_lengths(raw, out)
    teacher = raw.get("teacher_model")
    if teacher is not None and "teacher_model_name_or_path" in teacher.source:
        # GKDTrainer: AutoModelForCausalLM.from_pretrained(teacher, **teacher_model_init_kwargs), {} by default
        notes.append(f"teacher_model ({teacher.source}): predicted in the compute dtype. TRL's GKDTrainer loads it "
                     "with teacher_model_init_kwargs, by default in transformers' default dtype (float32 before "
                     "transformers 5, the checkpoint's from 5): a float32 teacher holds twice its weights' bytes "
                     "(trl/scripts/distillation.py passes the student's dtype)")
    auto_batch = raw.get("_auto_batch")
    if auto_batch is not None and auto_batch.value is True:
        # transformers' Trainer (accelerate find_executable_batch_size) halves the per-device batch after each CUDA
        # out-of-memory error and retries, so a job too large for its GPU still runs, with a smaller batch
        notes.append(f"auto_find_batch_size ({auto_batch.source}): the trainer halves micro_batch_size after an "
                     "out-of-memory error and retries; the prediction is for the batch the job states, the most it "
                     "can use")
    name = raw.get("_optimizer_name")
    if name is not None and (note := optimizer_note(name.value, name.source)) is not None:
        notes.append(note)
    if name is not None and str(name.value).strip().lower().startswith(("galore", "apollo")) \
            and "galore_rank" not in out:
        _resolve_galore(raw, name, out, notes)
    if name is not None and str(name.value).strip().lower().endswith("_fused") and "fused_optimizer" not in out \
            and out.get("optimizer") is not None and out["optimizer"].value in FUSABLE_OPTIMIZERS:
        # adamw_torch_fused (transformers' default optim with torch >= 2.8), adamw_apex_fused: one fused kernel
        out["fused_optimizer"] = Setting(True, name.source, name.where)
    accumulates = str(out["grad_accum_steps"].value).strip() not in ("1", "") if "grad_accum_steps" in out else False
    if name is not None and "lomo" in str(name.value).lower() and "optimizer_in_backward" not in out \
            and not accumulates:
        # LOMO / AdaLomo update each parameter in its gradient hook (Lv et al. 2023, arXiv:2306.09782); with
        # gradient accumulation the gradients are kept (the spec's whole-gradient count)
        out["optimizer_in_backward"] = Setting(True, f"{name.source} (LOMO updates in backward)", name.where)
    return Reading(out, notes)


def _resolve_lengths(raw: Mapping[str, Setting], out: Settings) -> None:
    """``sequence_lengths`` from packing and padding: fixed when every batch is padded to the length or packed up to
    it, variable when the job says it does not pack (each batch padded to its longest sample); unset otherwise."""
    if "sequence_lengths" in out:
        return
    given = [raw[key] for key in ("_pad_to_length", "_neat_packing", "_packing", "_sample_packing") if key in raw]
    odd = next((setting for setting in given if not isinstance(setting.value, bool)), None)
    if odd is not None:  # not a boolean: the spec refuses the value, and the message names the flag
        out["sequence_lengths"] = odd
        return
    pad = raw.get("_pad_to_length")
    packed = next((setting for setting in given if setting is not pad and setting.value is True), None)
    unpacked = next((setting for setting in given if setting is not pad and setting.value is False), None)
    if pad is not None and pad.value is True:
        out["sequence_lengths"] = Setting("fixed", f"{pad.source} (every batch padded to the length)", pad.where)
    elif packed is not None:  # any packing switch on packs (whatever the order of the flags)
        out["sequence_lengths"] = Setting("fixed", f"{packed.source} (samples packed up to the length)", packed.where)
    elif unpacked is not None:
        out["sequence_lengths"] = Setting(
            "variable", f"{unpacked.source} (no packing: each batch padded to its longest sample)", unpacked.where)


@functools.lru_cache(maxsize=32)
def _load_mapping(text: str) -> dict[str, Any] | None:
    """A config file's text as a mapping (None when it is not one). Cached: a script may name the file its
    heredoc wrote in every one of a thousand commands, and each parse of 64 KiB of YAML takes about 0.5 s.
    Callers only read the result."""
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else safe_load(text, unique_keys=False)
    except (ValueError, *YAML_ERRORS):
        return None
    return data if isinstance(data, dict) else None


# --- shell scripts -----------------------------------------------------------------------------

_SHELLS = {"sh", "bash", "zsh", "dash", "ash"}
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
# ``${NAME}``, ``${NAME:-default}`` (a default may hold ``$OTHER`` but not another ``${``: the scan for the
# closing brace stops at the next ``${``, so an unclosed ``${a:-${a:-...`` costs linear time, not quadratic),
# and ``$NAME``.
# ``${NAME}``, ``${NAME:-default}`` (the default may hold one nested ``${...}``: ``${A:-${B}}``) or ``$NAME``; then
# bash's other parameter expansions of one variable with literal operands: ``${#NAME}``, ``${NAME#pattern}`` /
# ``##`` / ``%`` / ``%%`` (glob patterns: ``MODEL_NAME=${MODEL_PATH##*/}``), ``${NAME/from/to}`` / ``//``,
# ``${NAME^^}`` / ``${NAME,,}``, ``${NAME:offset[:length]}``
_SHELL_VAR = re.compile(
    r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-((?:[^}$]|\$(?!\{)|\$\{[^{}$]*\})*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)"
    r"|\$\{(#?)([A-Za-z_][A-Za-z0-9_]*)(?:(##?|%%?|//?|\^\^|,,|:)([^}$]*))?\}")
# the longest value a pattern operator is applied to (a suffix match backtracks over it: quadratic in its length)
_MAX_PATTERN_OPERAND = 256
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_OPERATORS = {";", "&&", "||", "|", "&", "(", ")", ";;"}


@dataclass
class Script:
    """A command line split into simple commands, with heredoc files and exported variables."""

    commands: list[list[str]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # basename -> content written by a heredoc
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what was not read, and why


_READ_INTO = re.compile(r"(?:^|[;&|]\s*)read\b(?:\s+-[A-Za-z]+(?:\s+(?:''|\"\"|\S+))?)*"
                        r"\s+([A-Za-z_][A-Za-z0-9_]*)\s*<<")


def _heredocs(text: str, files: dict[str, str], variables: dict[str, str] | None = None) -> str:
    """Cut heredoc bodies out of a script, keeping each under the name of the file it is written to, or, for
    ``read -r -d '' NAME <<EOF`` (OpenRLHF's example scripts keep the whole training command so, then run
    ``deepspeed --module $training_commands``), as the variable NAME: the body's lines joined by spaces."""
    lines = text.split("\n")
    kept: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        match = _HEREDOC.search(line)
        kept.append(line)
        i += 1
        if not match:
            continue
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != match.group(2):
            body.append(lines[i])
            i += 1
        i += 1
        target = re.search(r">\s*([^\s;&|<>]+)", line)
        into = _READ_INTO.search(line)
        stdin = _STDIN_PYTHON.match(line)
        if stdin:  # python - <<'EOF': the heredoc is the script python runs
            files[INLINE_PYTHON] = "\n".join(body)
            kept[-1] = f"{stdin.group(1)} {INLINE_PYTHON}"
        elif into and variables is not None:
            variables[into.group(1)] = " ".join(part.strip() for part in body if part.strip())
        elif target:
            files[PurePosixPath(target.group(1).strip("'\"")).name] = "\n".join(body)
    return "\n".join(kept)


def _expand(text: str, env: Mapping[str, str], budget: TextBudget) -> str:
    """``$NAME`` / ``${NAME}`` / ``${NAME:-default}`` replaced from ``env``; what expansion adds is taken from
    ``budget`` (the job's, shared with the scripts and configs it reads: :func:`substitute_within`)."""

    def value(m: re.Match[str]) -> str | None:
        if m.group(5) is not None:
            if budget.pattern_expansions_left <= 0:
                return None
            budget.pattern_expansions_left -= 1
            return _parameter_operation(env.get(m.group(5)), m.group(4), m.group(6), m.group(7))
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        # the default, expanded in turn (one nested ``${...}`` at most: verl's CI scripts'
        # LORA_ALPHA=${LORA_ALPHA:-${LORA_RANK}})
        return _expand(m.group(2), env, budget) if m.group(2) is not None else None

    return substitute_within(_SHELL_VAR, text, value, budget)


@functools.lru_cache(maxsize=1024)
def _parameter_operation(base: str | None, length: str, operator: str | None, operand: str | None) -> str | None:
    """The value of ``${#NAME}`` or ``${NAME<operator><operand>}`` for NAME's value ``base`` (None: unset, or an
    operation this does not evaluate; the text then stays as written)."""
    if base is None or (not length and operator is None) or (length and operator is not None):
        return None
    if length:
        return str(len(base))
    operand = operand or ""
    if operator in ("#", "##", "%", "%%"):
        lazy, greedy = _glob_regex(operand.replace("\\", "").strip("'\""))
        if lazy is None or greedy is None or len(base) > _MAX_PATTERN_OPERAND:
            return None
        if operator == "#":  # the shortest prefix that matches, ## the longest; % and %% the same for suffixes
            match = re.match(lazy, base)
        elif operator == "##":
            match = re.match(greedy, base)
        elif operator == "%":
            match = re.match(r"(?s:.*)(" + lazy + r")\Z", base)
        else:
            match = re.search("(" + greedy + r")\Z", base)
        if match is None:
            return base
        return base[match.end():] if operator.startswith("#") else base[:match.start(match.lastindex or 0)]
    if operator in ("/", "//"):
        old, slash, new = operand.partition("/")
        if not old or any(ch in old for ch in "*?["):
            return None  # a glob replacement is not evaluated
        return base.replace(old, new if slash else "", -1 if operator == "//" else 1)
    if operator in ("^^", ",,"):
        return None if operand else base.upper() if operator == "^^" else base.lower()
    if operator == ":":
        match = re.fullmatch(r"\s*(-?\d{1,6})(?::(\d{1,6}))?", operand)
        if match is None:
            return None
        start = int(match.group(1))
        start = max(len(base) + start, 0) if start < 0 else start
        return base[start:start + int(match.group(2))] if match.group(2) is not None else base[start:]
    return None


def _glob_regex(pattern: str) -> tuple[str | None, str | None]:
    """A shell glob as two regular expressions, its ``*`` lazy and greedy; (None, None) for a bracket expression
    or more than one ``*`` (patterns of several stars backtrack for a long time over a long value)."""
    if "[" in pattern or pattern.count("*") > 1:
        return None, None

    def translated(star: str) -> str:
        return "(?s:" + "".join(star if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern) + ")"

    return translated(".*?"), translated(".*")


def _commands_text(text: str) -> str:
    """Drop comments and turn unquoted newlines into ``;`` so that shlex sees one command list."""
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"' and i + 1 < len(text):
                out.append(text[i : i + 2])
                i += 2
                continue
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (not out or out[-1] in " \t\n;"):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif ch == "\n":
            ch = ";"
        out.append(ch)
        i += 1
    return "".join(out)


_ARITHMETIC = re.compile(r"\$\(\(([^()]*(?:\([^()]*\)[^()]*)*)\)\)")
# what an arithmetic expansion vramfit cannot evaluate stands for (one word: its operands are known only when the job
# runs, e.g. ``$((1024 / $GPUS / 4))`` over ``GPUS=$(python -c ...)``); a flag given it is left unset, with a note
RUNTIME_ARITHMETIC = "ARITHMETIC"
_ARITHMETIC_TEXT = re.compile(r"[0-9+\-*/% ()]{1,200}")
_ARITHMETIC_NAME = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)|\b([A-Za-z_]\w*)\b")


def _arithmetic(text: str, env: Mapping[str, str] | None = None) -> str:
    """``$((1024 * 8))`` as its value (whole numbers, + - * / %, parentheses; the names of ``env`` variables holding
    whole numbers, bare or as ``$NAME`` / ``${NAME}``, as bash reads them), else the expression as one word: its
    parentheses were taken for subshell operators and split the command in two (a verl job lost every override after
    ``data.max_response_length=$((1024 * 8))``), and verl's ``$(((max_prompt_length + max_response_length) * 1))`` was
    not evaluated."""
    def number(match: re.Match[str]) -> str:
        found = (env or {}).get(match.group(1) or match.group(2) or match.group(3) or "", "").strip()
        return found if _ARITHMETIC_TEXT.fullmatch(found) and found.lstrip("-").isdigit() else "@"

    def value(match: re.Match[str]) -> str:
        expression = _ARITHMETIC_NAME.sub(number, match.group(1)).strip()
        if _ARITHMETIC_TEXT.fullmatch(expression) and "**" not in expression:
            try:
                result = _integer_arithmetic(ast.parse(expression, mode="eval").body)
                if abs(result) < 10**18:
                    return str(result)
            except (SyntaxError, ZeroDivisionError, ValueError, RecursionError, MemoryError):
                pass
        return RUNTIME_ARITHMETIC

    return _ARITHMETIC.sub(value, text)


def _integer_arithmetic(node: ast.expr) -> int:
    """A bash arithmetic expression's value: whole numbers, + - * / % and parentheses, division and remainder
    truncating toward zero as bash's (C's) do; anything else is a ValueError. No eval: only these nodes are read."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _integer_arithmetic(node.operand)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp):
        left, right = _integer_arithmetic(node.left), _integer_arithmetic(node.right)
        if max(abs(left), abs(right)) > 10**18:
            raise ValueError("too large")
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
            if right == 0:
                raise ZeroDivisionError
            quotient = abs(left) // abs(right) * (1 if (left < 0) == (right < 0) else -1)
            return quotient if not isinstance(node.op, ast.Mod) else left - quotient * right
    raise ValueError("not integer arithmetic")


_SUBSTITUTED = "_"  # what a command substitution stands for (a word vramfit cannot know), no longer than "``"


def _command_substitutions(text: str) -> str:
    """``$(...)`` and `` `...` `` (outside single quotes) replaced by one placeholder word: the command they run is
    not the script's (``--master_addr=`scontrol show hostnames $NODES | head -n 1``` was cut at its ``|``, and the
    trainer's command lost its flags before it). ``$((...))`` arithmetic is evaluated before this."""
    if "$(" not in text and "`" not in text:
        return text
    out: list[str] = []
    quote = ""
    i = 0
    unclosed = False  # an unclosed ``$(`` was met: no later one closes at depth 0 either (keeps this linear)
    while i < len(text):
        ch = text[i]
        if quote == "'":
            if ch == "'":
                quote = ""
        elif ch == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])
            i += 2
            continue
        elif ch in "'\"" and (not quote or ch == quote):
            quote = "" if quote else ch
        elif ch == "`":
            end = text.find("`", i + 1)
            if end > i:
                out.append(_SUBSTITUTED)
                i = end + 1
                continue
        elif ch == "$" and not unclosed and text.startswith("$(", i) and not text.startswith("$((", i):
            depth, j = 0, i + 1
            while j < len(text):
                if text[j] == "(":
                    depth += 1
                elif text[j] == ")":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            if j < len(text):
                out.append(_SUBSTITUTED)
                i = j + 1
                continue
            unclosed = True
        out.append(ch)
        i += 1
    return "".join(out)


def _split_shell(text: str, env: Mapping[str, str] | None = None) -> list[str]:
    text = _command_substitutions(_arithmetic(text, env))
    lexer = shlex.shlex(_commands_text(text), posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: fall back to words
        return text.split()
    return [part for token in tokens for part in _operator_run(token)]


_OPERATOR_PARTS = re.compile(r"&&|\|\||;;|[;&|()]")


def _operator_run(token: str) -> list[str]:
    """shlex joins adjacent punctuation into one token: ``cmd &`` at the end of a line becomes ``&;`` (the newline is
    a ``;`` by then), which separated nothing, so a server started in the background swallowed the trainer's command
    after it. Such a run is split into the operators it is made of."""
    if token in _OPERATORS or not token or set(token) - set(";&|()"):
        return [token]
    return _OPERATOR_PARTS.findall(token)


_SOURCED = re.compile(r"(^|[;&|(]|&&|\|\|)([ \t]*)(?:source|\.)[ \t]+([^\s;&|()]+)", re.M)


def _inline_sourced(text: str, files: Mapping[str, str], budget: TextBudget, where: str, notes: list[str],
                    depth: int = 0, written: dict[str, str] | None = None,
                    read_into: dict[str, str] | None = None) -> str:
    """``source FILE`` / ``. FILE`` of a script replaced by FILE's text when the manifest carries it: what it sets
    (``export SEQ=4096``) is the script's own environment from there on, as the shell runs it. Within the job's text
    budget and a few levels deep (a sourced file may source another, or itself)."""
    if depth >= _MAX_SCRIPT_DEPTH or not files:
        return text

    def inline(match: re.Match[str]) -> str:
        content = files.get(PurePosixPath(match.group(3)).name)
        if content is None or budget.refuse(content, f"{where}: {match.group(3)}, sourced") is not None:
            return match.group(0)
        # the sourced file's own heredocs (cat > ds.json <<EOF in it) cut out as the script's are, into ``written``
        own: dict[str, str] = {}
        body = _heredocs(content.replace("\r\n", "\n").replace("\\\n", " "), own, read_into)
        if written is not None:
            written.update(own)
        body = _inline_sourced(body, {**files, **own}, budget, where, notes, depth + 1, written, read_into)
        note = f"{where}: the command runs {match.group(3)}, carried by the manifest: read as its commands"
        if note not in notes:
            notes.append(note)
        return f"{match.group(1)}\n{body}\n"

    return _SOURCED.sub(inline, text)


_POSITIONAL_ALL = re.compile(r'"\$(?:@|\{@\})"|"\$(?:\*|\{\*\})"|\$(?:@|\{@\}|\*|\{\*\})')
# ``$1``..``$9`` and ``${N}`` / ``${N:-default}`` for any N (bash reads ``$10`` as ``$1`` then ``0``)
_POSITIONAL_ONE = re.compile(r"\$(?:([1-9])|\{([1-9][0-9]{0,3})(?::?-([^{}$]*))?\})")
_MAX_BOUND_CHARS = 256 * 1024  # what binding a script's arguments may add to it


# the head of a loop over the script's own arguments: `while [[ "$1" != "" ]]`, `while [ $# -gt 0 ]`,
# `while (( "$#" ))`, `until [ -z "$1" ]`, `for arg in "$@"`, `for arg; do`
_ARGUMENT_LOOP = re.compile(r"^[ \t]*(?:(?:while|until)\b[^\n]*(?:\$\{?1\b|\$\{?#|\$\{?[@*])"
                            r"|for[ \t]+[A-Za-z_][A-Za-z0-9_]*(?:[ \t]+in[ \t]+\"?\$\{?[@*]\}?\"?)?[ \t]*(?:;|$))")
_LOOP_OPENS = re.compile(r"(?:^|[;\s])do(?:$|[;\s])")
_LOOP_CLOSES = re.compile(r"(?:^|[;\s])done(?:$|[;\s|&>])")


def drop_argument_loops(text: str) -> str:
    """A script run without arguments, without the loops over its arguments: their bodies never run (Qwen's
    finetune.sh parses `-m MODEL --deepspeed CONFIG` in a `while [[ "$1" != "" ]]; do case $1 in ...` loop, whose
    `MODEL=$1` arms were applied line by line: the model read as '$1' and the DeepSpeed config lost). A loop whose
    end is not found is kept."""
    if "do" not in text:
        return text
    lines = text.split("\n")
    kept: list[str] = []
    i = 0
    while i < len(lines):
        code = _code(lines[i])
        if _ARGUMENT_LOOP.match(code) is None:
            kept.append(lines[i])
            i += 1
            continue
        depth, j = 0, i
        while j < len(lines):
            body = _code(lines[j])
            depth += len(_LOOP_OPENS.findall(body)) - len(_LOOP_CLOSES.findall(body))
            if depth <= 0 and (j > i or _LOOP_CLOSES.search(body)):
                break
            j += 1
        if j >= len(lines):
            return text  # no end: not followed
        kept += [""] * (j - i + 1)  # the lines stay (counts), empty
        i = j + 1
    return "\n".join(kept)


def bind_positional(text: str, args: Sequence[str]) -> str:
    """A script's ``$@`` / ``$*`` / ``$1``..``$9`` bound to the arguments it is run with (``bash run.sh key=value``,
    ``bash -c SCRIPT arg0 key=value``), each quoted for the shell: every verl example ends in ``$@`` so that
    overrides appended to the command win, and they were read as nothing."""
    if "$" not in text:
        return text
    uses = len(_POSITIONAL_ALL.findall(text)) + len(_POSITIONAL_ONE.findall(text))
    if uses and sum(len(a) + 1 for a in args) * uses <= _MAX_BOUND_CHARS:
        joined = " ".join(shlex.quote(a) for a in args)
    else:  # no use of them, or a script that would grow past what any real one passes on: bound to nothing
        joined, args = "", []
    bound = list(args)

    def one(match: re.Match[str]) -> str:
        i = int(match.group(1) or match.group(2))
        if i <= len(bound) and bound[i - 1]:
            return shlex.quote(bound[i - 1])
        return match.group(3) or ""  # ${1:-default}: the default when the argument is not given

    return _POSITIONAL_ONE.sub(one, _POSITIONAL_ALL.sub(lambda _: joined, text))


def split_script(
    argv: Sequence[str], env: Mapping[str, str], budget: TextBudget | None = None, where: str = "",
    files: Mapping[str, str] | None = None,
) -> Script:
    """A container command (exec form or ``bash -c SCRIPT``) as simple commands, ``$VAR`` expanded in
    shell scripts from the container env and the script's own ``export``s. A script that ``budget`` (by
    default one of its own) refuses is not read, with a note naming ``where`` it is."""
    script = Script(env=dict(env))
    tokens = list(argv)
    shell_text: str | None = None
    shell_args: list[str] = []
    if tokens and basename(tokens[0]) in _SHELLS:
        # the shell's own options come first; the first other word is the script (with -c), then $0 and the
        # arguments, flags among them (bash -c 'train "$@"' _ --model_name_or_path x)
        at = next((i for i, t in enumerate(tokens[1:], 1) if not t.startswith(("-", "+"))), len(tokens))
        flags = tokens[1:at]
        if any("c" in f for f in flags if not f.startswith("--")) and at < len(tokens):  # -c, -xc; not --rcfile
            shell_text = tokens[at]
            shell_args = tokens[at + 2:]  # after $0; bound once the budget has taken the script
    if shell_text is None:
        script.commands = [tokens] if tokens else []
        return script
    what = f"{where}: the shell script of the command" if where else "the shell script of the command"
    budget = budget or TextBudget()
    if (note := budget.refuse(shell_text, what)) is not None:
        script.notes.append(note)
        return script
    if shell_args:  # only when it is run with arguments: a `${1:-x}` may belong to a function or a written script
        shell_text = bind_positional(shell_text, shell_args)
    elif not _FUNCTION.search(shell_text):  # a function's loops go over the function's arguments
        shell_text = drop_argument_loops(shell_text)
    read_into: dict[str, str] = {}
    text = _heredocs(shell_text.replace("\\\r\n", " ").replace("\\\n", " "), script.files, read_into)
    text = _inline_sourced(text, {**(files or {}), **script.files}, budget, where, script.notes,
                           written=script.files, read_into=read_into)
    script.env.update(read_into)
    command: list[str] = []
    seeded = dict(script.env)  # the container's environment
    text = _prune_branches(text, script.env, budget)
    text, arrays = _arrays(text)
    text = _exports(text, script.env, budget)
    _array_words(arrays, script.env, budget)
    for name in [n for n in script.files if "$" in n]:  # `cat <<EOT > $config_json`: the file its variable names
        named = PurePosixPath(_expand(name, script.env, budget).strip("'\"")).name
        if "$" not in named and named:
            script.files.setdefault(named, script.files.pop(name))
    for name, body in read_into.items():  # an unquoted heredoc's body is expanded as bash reads it
        script.env[name] = _expand(body, script.env, budget)
    recorded = {name for name, value in script.env.items() if seeded.get(name) != value}  # whole-line exports
    # a value's newlines are word breaks where the script expands it (`eval ${run_cmd}` of a command assigned over
    # several lines runs as one command: Pai-Megatron-Patch's run scripts), not command separators
    flat = {name: value.replace("\n", " ") if "\n" in value else value for name, value in script.env.items()}
    for token in [*_split_shell(_expand(text, flat, budget), script.env), ";"]:
        if token in _OPERATORS:
            if command:
                script.commands.append(command)
            command = []
        elif not command and (assign := _ASSIGN.match(token)):
            # an assignment the script runs (`export NAME=value; ...` on one line too) replaces the container's
            # value; a whole-line export was recorded (and expanded within the budget) already
            if assign.group(1) not in recorded:
                script.env[assign.group(1)] = assign.group(2)
        elif command or token != "export":
            command.append(token)
    return script


_IF_LINE = re.compile(r"^(if|elif)[ \t]+(.*?)(?:[ \t]*;[ \t]*then)?$")
_TEST = re.compile(r"^(\[\[|\[|test)\s+(.*?)\s*(?:\]\]|\])?$")
_MAX_BRANCH_DEPTH = 64
_SIMPLE_ASSIGN = re.compile(r"^(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"`]*\"|'[^']*'|[^\s;&|<>()`]*)$")
_ANY_ASSIGN = re.compile(r"(?<![\w$])([A-Za-z_][A-Za-z0-9_]*)\+?=")
_OTHER_SETTERS = re.compile(r"\b(?:read(?:[ \t]+-\S+(?:[ \t]+\S+)?)*|for|select|getopts[ \t]+\S+)[ \t]+"
                            r"([A-Za-z_][A-Za-z0-9_]*)")
_FUNCTION = re.compile(r"^[ \t]*(?:function[ \t]+[A-Za-z_][\w-]*|[A-Za-z_][\w-]*[ \t]*\(\))[ \t]*\{?[ \t]*$", re.M)
_VAR_NAMES = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def _code(line: str) -> str:
    """A script line without its comment (a ``#`` after whitespace, outside quotes) and surrounding blanks."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].strip()
    return line.strip()


def _condition(text: str, env: Mapping[str, str], budget: TextBudget, untracked: set[str]) -> bool | None:
    """The value of an ``if`` condition made of string tests (``[ $A = b ]``, ``[[ "$A" == "b" ]]``, ``!=``, ``-z``,
    ``-n``; ``[[ $A == *8B* ]]`` as a pattern), joined by ``||`` or ``&&`` but not both, over variables the script
    sets in ways that are followed (``untracked``: set in a ``case`` arm, after ``&&``, by ``read``, from a command's
    output...); None when it is anything else or a variable is not known."""
    text = text.strip()
    if "||" in text and "&&" in text:
        return None
    if untracked & set(_VAR_NAMES.findall(text)):
        return None
    joiner = "||" if "||" in text else "&&"
    values: list[bool] = []
    for part in text.split(joiner):
        match = _TEST.match(part.strip())
        if match is None:
            return None
        double = match.group(1) == "[["
        raw = match.group(2)
        expanded = _expand(raw, env, budget)
        if "$" in expanded or "`" in expanded:
            return None
        try:
            words = shlex.split(expanded)
            raw_words = shlex.split(raw, posix=False)
        except ValueError:
            return None
        if len(words) == 3 and words[1] in ("=", "==", "!="):
            pattern = len(raw_words) == 3 and raw_words[2][:1] not in "'\"" and any(c in words[2] for c in "*?[")
            if pattern and not double:
                return None  # `[ $A = b* ]` is a file-name glob before the test: not followed
            equal = fnmatch.fnmatchcase(words[0], words[2]) if pattern else words[0] == words[2]
            values.append(equal != (words[1] == "!="))
        elif len(words) == 2 and words[0] in ("-z", "-n"):
            values.append((words[1] == "") == (words[0] == "-z"))
        else:
            return None  # anything else, and `[ -n $EMPTY ]` (one word left: a test of the string "-n")
    return any(values) if joiner == "||" else all(values)


def _untracked_variables(text: str) -> set[str]:
    """Variables a script sets in a way :func:`_prune_branches` does not follow line by line: anywhere but a whole-line
    ``NAME=value`` (a ``case`` arm, after ``&&`` or ``;``, ``read``, ``for``), or from a command's output."""
    names: set[str] = set()
    for line in text.split("\n"):
        code = _code(line)
        simple = _SIMPLE_ASSIGN.match(code)
        for name in _ANY_ASSIGN.findall(code):
            if simple is None or simple.group(1) != name or "$(" in code:
                names.add(name)
        names.update(_OTHER_SETTERS.findall(code))
    return names


def _prune_branches(text: str, env: Mapping[str, str], budget: TextBudget) -> str:
    """A script without the ``if``/``elif``/``else`` branches that do not run, where the conditions are string tests
    over variables it sets before them on lines of their own (and the container's env, the arguments bound):
    Pai-Megatron-Patch picks its model's shape by ``if [ $MODEL_SIZE = 7B ]; then NUM_LAYERS=28 ...; elif ...``, and
    Megatron-DeepSpeed turns recomputation on only ``if [ "${activation_checkpoint}" = "true" ]``; every branch's
    assignments were applied, the last one winning. Conservative: a condition that cannot be decided keeps its
    branches, as before, and a script whose structure is not followed (functions, ``else if``, an ``if`` left open,
    deeper than 64) is returned as it is."""
    if "if" not in text or "fi" not in text or _FUNCTION.search(text):
        return text
    known = dict(env)
    untracked = _untracked_variables(text)
    # (this branch runs: True / False / None unknown, a branch of this if already ran, the enclosing block runs)
    frames: list[tuple[bool | None, bool, bool]] = []
    kept: list[str] = []
    for line in text.split("\n"):
        code = _code(line)
        first = code.split(None, 1)[0] if code else ""
        outer = not frames or (frames[-1][2] and frames[-1][0] is not False)  # this line runs, as far as known
        if first == "if" and not re.search(r"(?:^|[\s;])fi(?:$|[\s;])", code):
            head = _IF_LINE.match(code)
            if head is None or len(frames) >= _MAX_BRANCH_DEPTH:
                return text
            state = _condition(head.group(2), known, budget, untracked) if outer else False
            frames.append((state, state is True, outer))
            kept.append(line if outer else "")
            continue
        if first == "elif":
            head = _IF_LINE.match(code)
            if head is None or not frames:
                return text
            _, taken, parent = frames[-1]
            state = False if taken else (_condition(head.group(2), known, budget, untracked) if parent else False)
            frames[-1] = (state, taken or state is True, parent)
            kept.append(line if parent else "")
            continue
        if first == "else":
            if code != "else" or not frames:
                return text  # `else if ...` (an if nested in the else) and the like: not followed
            state_before, taken, parent = frames[-1]
            state = False if taken else (True if state_before is False else None)
            frames[-1] = (state if parent else False, True, parent)
            kept.append(line if parent else "")
            continue
        if first in ("fi", "fi;"):
            if not frames:
                return text
            parent = frames.pop()[2]
            kept.append(line if parent else "")
            continue
        if outer:
            kept.append(line)
            if (match := _SIMPLE_ASSIGN.match(code)) is not None:
                name = match.group(1)
                if any(state is None for state, _, _ in frames):
                    known.pop(name, None)  # set in a branch that may or may not run: no longer known
                    untracked.add(name)
                elif name not in untracked:
                    known[name] = _expand(match.group(2).strip("'\""), known, budget)
        else:
            kept.append("")  # a branch that does not run
    return text if frames else "\n".join(kept)


_ARRAY_START = re.compile(r"^[ \t]*(?:(?:declare|local|typeset)[ \t]+-a[ \t]+|export[ \t]+)?"
                          r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=\(", re.M)
# ``${NAME[@]}`` / ``${NAME[*]}``, and ``"${NAME[@]}"``: every element of an array, as separate words
_ARRAY_USE = re.compile(r"(\")?\$\{([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]\}(\")?")
_QUOTED_ARRAY = "__vramfit_words_"  # the env name of an array's elements, each quoted: what "${NAME[@]}" gives


def _array_body_end(text: str, start: int) -> int:
    """Index of the ``)`` closing an array body that starts at ``start`` (after ``(``), quotes and nested
    parentheses (``$(...)``) skipped; -1 when it is not closed."""
    depth, quote, i = 0, "", start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == start or text[i - 1] in " \t\n"):
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline
            continue
        elif ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return -1


def _arrays(text: str) -> tuple[str, list[tuple[str, bool, str]]]:
    """Bash arrays: the script without its ``NAME=( ... )`` / ``NAME+=( ... )`` assignments (over several lines, with
    comments), ``${NAME[@]}`` / ``"${NAME[@]}"`` turned into ``${NAME}``, and the assignments in order as (name,
    appends, body). Every Megatron-LM example builds its command so (``torchrun ${DISTRIBUTED_ARGS[@]}
    pretrain_gpt.py ${MODEL_ARGS[@]} ...``); read word by word, each body became one-flag pseudo-commands and the
    trainer's own command lost its flags. :func:`_array_words` gives them their words once the script's variables
    are known."""
    if "=(" not in text:
        return text, []
    out: list[str] = []
    at = 0
    arrays: list[tuple[str, bool, str]] = []
    for match in _ARRAY_START.finditer(text):
        if match.start() < at:
            continue
        end = _array_body_end(text, match.end())
        if end < 0:
            break
        body = "\n".join(_code(line) for line in text[match.end():end].split("\n"))
        arrays.append((match.group(1), bool(match.group(2)), body))
        out.append(text[at:match.start()])
        at = end + 1
    out.append(text[at:])
    names = {name for name, _, _ in arrays}
    return _ARRAY_USE.sub(lambda m: _array_use(m, names), "".join(out)), arrays


def _array_use(match: re.Match[str], names: set[str] | None = None) -> str:
    """``"${NAME[@]}"`` (each element one word, blanks kept) as the quoted elements; ``${NAME[@]}`` and the rest as the
    elements joined, which the shell splits into words again."""
    name = match.group(2)
    if names is not None and name not in names:
        return match.group(0)
    if match.group(1) and match.group(4) and match.group(3) == "@":
        return f"${{{_QUOTED_ARRAY}{name}}}"
    return (match.group(1) or "") + f"${{{name}}}" + (match.group(4) or "")


def _array_words(arrays: Sequence[tuple[str, bool, str]], env: dict[str, str], budget: TextBudget) -> None:
    """Each array's elements (variables expanded, an array used inside another expanded to its elements), joined by
    spaces into ``env``: an unquoted ``${NAME[@]}`` splits them into words again, as bash does (a quoted element
    ``"--fp8-format hybrid"`` becomes two words)."""
    for name, appends, body in arrays:
        body = _ARRAY_USE.sub(_array_use, body)
        try:
            elements = shlex.split(_expand(body, env, budget))
        except ValueError:  # an unbalanced quote: the words as they stand
            elements = _expand(body, env, budget).split()
        quoted = " ".join(shlex.quote(element) for element in elements)
        words = " ".join(elements)
        if appends:
            words = f"{env.get(name, '')} {words}".strip()
            quoted = f"{env.get(_QUOTED_ARRAY + name, '')} {quoted}".strip()
        env[name], env[_QUOTED_ARRAY + name] = words, quoted


def _exports(text: str, env: dict[str, str], budget: TextBudget) -> str:
    """Record ``export NAME=value`` / ``NAME=value`` lines of a script before ``$NAME`` is expanded."""
    for match in re.finditer(
        # a trailing `;` ends the command (`SIZE=13b;`): not part of the value
        r"^[ \t]*(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|'[^']*'|\$\(\((?:[^()\n]|\([^()\n]*\))*\)\)"
        r"|[^\s;]*)[ \t]*;?[ \t]*(?:#.*)?$", text, re.M
    ):
        env[match.group(1)] = _arithmetic(_expand(match.group(2).strip("'\""), env, budget), env)
    return text


# --- command lines -----------------------------------------------------------------------------


# Flags that take several values: TRL's ModelConfig ``lora_target_modules`` and ``lora_modules_to_save`` are
# ``list[str]`` fields, which HfArgumentParser turns into ``nargs="+"`` (``--lora_target_modules q_proj v_proj``).
_LIST_FLAGS = {"lora_target_modules", "lora_modules_to_save", "modules_to_save", "optim_target_modules"}


def _flag_values(tokens: Sequence[str]) -> dict[str, tuple[Any, str]]:
    """Every flag of a command line by its normalised key, as (value, source): what the trainer-specific readers
    (Megatron-LM, OpenRLHF, ms-swift, ...) look up beside :data:`KEYS`."""
    return {key: (value, source) for key, value, source in _flag_pairs(tokens)[0]}


def read_flags(tokens: Sequence[str], where: str) -> tuple[dict[str, Setting], list[str]]:
    """``--key value`` / ``--key=value`` / bare boolean flags, and positional arguments."""
    pairs, positionals = _flag_pairs(tokens)
    return read_pairs(pairs, where), positionals


def _flag_pairs(tokens: Sequence[str]) -> tuple[list[tuple[str, Any, str]], list[str]]:
    """The ``(key, value, source)`` of every flag (keys normalised), and the positional arguments."""
    pairs: list[tuple[str, Any, str]] = []
    positionals: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--") or token == "--":
            positionals.append(token)
            continue
        name, eq, value = token.partition("=")
        key = norm_key(name)
        if not eq:
            nxt = tokens[i] if i < len(tokens) else None
            if key in _LIST_FLAGS and nxt is not None and not nxt.startswith("-"):
                items = []
                while i < len(tokens) and not tokens[i].startswith("-"):
                    items.append(tokens[i])
                    i += 1
                pairs.append((key, items if len(items) > 1 else items[0], f"flag --{key}"))
                continue
            if key in _BOOL_FLAGS:
                if nxt is not None and str(to_bool(nxt)) in ("True", "False") and not nxt.startswith("-"):
                    value, i = nxt, i + 1
                else:
                    value = "true"
            elif nxt is not None and not nxt.startswith("--"):
                value, i = nxt, i + 1
            else:
                value = "true"
        pairs.append((key, value, f"flag --{key}"))
    return pairs, positionals


def hydra_overrides(tokens: Sequence[str]) -> dict[str, str]:
    """Hydra-style ``key=value`` overrides of a command (verl, NeMo 2): keys without Hydra's ``+`` / ``~`` prefixes,
    values without their quotes; later ones win."""
    return {t.split("=", 1)[0].lstrip("+~"): t.split("=", 1)[1].strip("'\"") for t in tokens
            if "=" in t and not t.startswith("-")}


def _key_values(tokens: Sequence[str]) -> list[tuple[str, str]]:
    return [
        (t.split("=", 1)[0], t.split("=", 1)[1])
        for t in tokens
        if "=" in t and not t.startswith("-") and re.match(r"^[A-Za-z_][\w.]*=", t)
    ]


# a marker the merge resolves once the GPU count is known: a global batch whose per-GPU share caps the micro-batch
# (llm-foundry's global_train_batch_size over device_train_microbatch_size)
MICRO_BATCH_CAP = "_micro_batch_cap_global"
# a marker the merge resolves once the GPU count is known: the GPUs that train the model when a trainer places other
# roles on GPUs of their own (OpenRLHF's actor world), training_gpus when fewer than the job's
TRAINING_WORLD = "_training_world"
# arguments whose .json/.yaml value is data, a model file or an output, never a trainer config: transformers' task
# scripts accept only .csv/.json data files (DataTrainingArguments.__post_init__), so `--train_file train.json` is
# common; taken for an unread config, it switched off the trainers' defaults (batch 8, fp32) without a word
_DATA_FILE_ARGS = frozenset({
    "train_file", "validation_file", "test_file", "eval_file", "predict_file", "dev_file", "train_data_file",
    "eval_data_file", "train_files", "val_files", "validation_files", "test_files", "eval_files", "data_path",
    "data_file", "data_files", "data_dir", "dataset", "dataset_name", "dataset_path", "dataset_config_name",
    "train_data", "eval_data", "valid_data", "val_data", "test_data", "train_data_path", "eval_data_path",
    "val_data_path", "test_data_path", "prompt_data", "eval_dataset", "label_file", "vocab_file", "config_name",
    "tokenizer_name", "tokenizer", "output_dir", "logging_dir", "output_file", "predictions_file",
})


def _config_paths(tokens: Sequence[str]) -> list[str]:
    """The .json/.yaml/.yml paths a command names that may be trainer, launcher or DeepSpeed configs: every such token
    (``--flag=PATH``, ``key=PATH``, or a positional or flag value) but the values of data and model-file arguments
    (``_DATA_FILE_ARGS``)."""
    paths: list[str] = []
    for i, token in enumerate(tokens):
        if not token.lower().endswith((".yaml", ".yml", ".json")):
            continue
        key, sep, value = token.partition("=")
        name = (key if sep else (tokens[i - 1] if i else "")).lstrip("-+~").rsplit(".", 1)[-1].lower()
        # Hydra's --config-name names the config (NeMo, verl); transformers' --config_name a model's config.json
        if name == "config-name" or name.replace("-", "_") not in _DATA_FILE_ARGS:
            paths.append(value if sep else token)
    return paths


_FILE_WRITERS = {"cat", "tee", "echo", "printf"}  # commands that write a file, never a trainer
# the words of one command that are read (verl's longest example scripts pass about 60 overrides; Megatron-LM's
# pretraining scripts about 150 flags and values)
MAX_COMMAND_WORDS = 4096


def read_command(
    argv: Sequence[str], env: Mapping[str, str], where: str, files: Mapping[str, str] | None = None,
    budget: TextBudget | None = None,
) -> tuple[Reading, Script]:
    """Settings from a container's command line: the trainer flags, torchtune overrides, and trainer
    config files the manifest itself carries (heredocs, ConfigMaps in the same file)."""
    from scheduler.spec.litgpt import litgpt_method, read_litgpt  # both build on this module's Reading
    from scheduler.spec.torchtitan import is_torchtitan, read_torchtitan

    budget = budget or TextBudget()
    script = split_script(argv, env, budget, where, files)
    known = {**(files or {}), **script.files}
    _run_carried_scripts(script, known, budget, where)
    reading = Reading(notes=list(script.notes))
    for tokens in script.commands:
        if len(tokens) > MAX_COMMAND_WORDS:
            # no trainer takes thousands of arguments; a command that long is read as far as a real one goes, so that
            # the dozen readers that scan every word stay fast (an 8 MiB Pod of one repeated flag took 30 s)
            reading.notes.append(f"{where}: a command of {len(tokens):,} words; its first {MAX_COMMAND_WORDS:,} are "
                                 "read")
            tokens = tokens[:MAX_COMMAND_WORDS]
        if tokens and basename(tokens[0]) in _FILE_WRITERS:
            continue  # ``cat > f.yml <<EOF``: writes the config a later command reads (the heredoc is in files)
        runtime = [tokens[i - 1] if t == RUNTIME_ARITHMETIC else t.split("=", 1)[0] for i, t in enumerate(tokens)
                   if (t == RUNTIME_ARITHMETIC and i and tokens[i - 1].startswith("-"))
                   or (t.startswith("-") and t.endswith("=" + RUNTIME_ARITHMETIC))]
        if runtime:
            reading.notes.append(f"{where}: {', '.join(dict.fromkeys(runtime))} "
                                 f"{'is' if len(set(runtime)) == 1 else 'are'} computed when the job runs (an "
                                 "arithmetic expansion over a command's output): not known here, left to the "
                                 "defaults; set them in the vramfit.io/spec annotation")
        if (helper := _helper_script(tokens)) is not None and reading.settings:
            # a script after the trainer that exports, merges, converts or evaluates (alpaca-lora's
            # export_checkpoint.py with the same --base_model and --lora_target_modules): its flags are not the
            # training's, and they replaced them (an 8-bit LoRA job read as LoRA over a 16-bit base)
            reading.notes.append(f"{where}: {helper} after the training command does not train; its flags are not "
                                 "read")
            continue
        if (server := _inference_server(tokens)) is not None:
            # a generation server started beside the trainer (TRL's one-node GRPO example: vLLM on GPUs 0-3 in the
            # background, the trainer on 4-7): its tensor-parallel size and model are not the training job's
            reading.notes.append(f"{where}: {server} serves generation beside the training; its flags are not read "
                                 "as the trainer's, and the GPUs it holds are not in the prediction")
            continue
        inner = _unwrapped(tokens)  # `srun tune run ...`, `nohup tune run ... &`, `exec tune run ...`
        if len(inner) >= 2 and basename(inner[0]) == "tune" and inner[1] == "run":
            part = read_torchtune(inner[2:], where, script.env, known)
        elif is_torchtitan(tokens):
            part = read_torchtitan(tokens, where, known, script.env)
        elif litgpt_method(tokens) is not None:
            part = read_litgpt(tokens, where, known)
        else:
            part = _read_with_script_facts(tokens, where, known, script.env)
        if part.settings:
            reading.settings.update(part.settings)
            reading.notes += [note for note in part.notes if note not in reading.notes]  # `cat > f.yml` names f too
            reading.trainer = reading.trainer or part.trainer
        reading.launch = reading.launch or part.launch
        reading.unresolved_model = reading.unresolved_model or part.unresolved_model
        reading.not_training = reading.not_training or part.not_training
    return reading, script


def _read_with_script_facts(tokens: Sequence[str], where: str, known: Mapping[str, str],
                            env: Mapping[str, str]) -> Reading:
    """``_read_launcher`` of a command, with what the Python script it runs states about itself when the manifest
    carries that script (scheduler/spec/pyscript.py): its argparse defaults as flags the command did not pass, the
    DeepSpeed config it writes as a dict, the model it loads by name, and its Ray Train workers."""
    from scheduler.spec.pyscript import default_flags, positional_names, read_script

    unwrapped = _unwrapped(tokens)
    if len(unwrapped) >= 3 and _PYTHON.fullmatch(basename(unwrapped[0])) and unwrapped[1] == "-c":
        # ``python -c CODE [ARGS]``: the code read as a carried script of its own (Unsloth's notebooks pasted into a
        # Job), the long code word kept out of the launcher's reading
        known = {**known, INLINE_PYTHON: unwrapped[2]}
        tokens = [unwrapped[0], INLINE_PYTHON, *unwrapped[3:]]
    path = next((t for t in tokens if t.endswith(".py") and basename(t) in known), None)
    content = known.get(basename(path)) if path is not None else None
    if path is None or content is None or _SHELL_SHEBANG.match(content.lstrip()):
        return _read_launcher(tokens, where, known, env)
    pairs, positionals = _flag_pairs(tokens[tokens.index(path) + 1:])
    given = {key: value for key, value, _ in pairs}
    # the script's argparse positionals filled by the command's words in order (python train.py MODEL DATA)
    placed = {name: value for name, value in zip(positional_names(content), positionals, strict=False)
              if name not in given}
    given.update(placed)
    facts = read_script(content, given)
    if facts is None:
        return _read_launcher(tokens, where, known, env)
    label = basename(path)
    # the training calls' keyword arguments (TrainingArguments(...), LoraConfig(...)) before the argparse defaults:
    # a value the script passes literally is the one that runs; the command's own flags win over both
    stated = {name: (value, what) for name, value, what in facts.calls if name not in given}
    stated.update({name: (value, f"positional {name} ({value})") for name, value in placed.items()})
    extra = [word for name, (value, _) in stated.items() for word in (f"--{name}", str(value))]
    extra += default_flags(facts, [*given, *stated])
    injected = {name for name, _ in facts.defaults if name not in given} | set(stated)
    if facts.deepspeed is not None and not any(k in given or k in injected for k in (
            "deepspeed", "deepspeed_config", "ds_config")):
        extra += ["--deepspeed", json.dumps(facts.deepspeed)]
        injected.add("deepspeed")
    model_keys = ("model_name_or_path", "model_name", "model_id", "model", "base_model", "model_path",
                  "pretrained_model_name_or_path")
    if facts.model is not None and not any(k in given or k in injected for k in model_keys):
        extra += ["--model_name_or_path", facts.model]
        injected.add("model_name_or_path")
    scripted = _SCRIPT_TRL_COMMAND.set(facts.trl_command)
    try:
        part = _read_launcher([*tokens, *extra], where, known, env)
    finally:
        _SCRIPT_TRL_COMMAND.reset(scripted)
    renamed = {name: (f"{label} {stated[name][1]}" if name in stated
                      else "DeepSpeed config dict in " + label if name == "deepspeed"
                      else f"{label} from_pretrained" if name == "model_name_or_path" and facts.model is not None
                      and "model_name_or_path" not in dict(facts.defaults)
                      else f"{label} default --{name}") for name in injected}
    names = "|".join(map(re.escape, sorted(renamed, key=len, reverse=True)))
    pattern = re.compile(r"flag --(" + names + r")(?![\w-])") if renamed else None

    def relabel(text: str) -> str:
        return pattern.sub(lambda m: renamed[m.group(1)], text) if pattern is not None else text

    part.settings = {k: replace(v, source=relabel(v.source)) for k, v in part.settings.items()}
    part.notes = [relabel(note) for note in part.notes]
    method = part.settings.get("method")
    if facts.kbit_prepared is not None and method is not None and method.value == "qlora":
        checkpointing, call = facts.kbit_prepared
        part.settings["kbit_prepared"] = Setting(True, f"{label} {call}", where)
        if checkpointing:  # it turns checkpointing on whatever TrainingArguments says
            part.settings["gradient_checkpointing"] = Setting("full", f"{label} {call} (use_gradient_checkpointing "
                                                              "True: gradient_checkpointing_enable)", where)
    if facts.task is not None and "task" not in part.settings:
        part.settings["task"] = Setting(facts.task[0], f"{label} {facts.task[1]}.from_pretrained", where)
    if facts.workers is not None and TRAINING_WORLD not in part.settings:
        part.settings[TRAINING_WORLD] = Setting(facts.workers, f"{label} ScalingConfig(num_workers={facts.workers}, "
                                                "use_gpu=True) (Ray Train workers, one GPU each)", where)
    part.notes.append(f"{where}: {label}, carried by the manifest, read for its defaults"
                      + (", DeepSpeed config" if facts.deepspeed is not None else "")
                      + (", Ray Train workers" if facts.workers is not None else "") + " (not run)")
    return part


# Python scripts that do not train, by their names' first word: they follow a training command in the same script
_HELPER_SCRIPT = re.compile(r"^(?:export|merge|convert|generate|infer|inference|predict|eval|evaluate|serve|chat|"
                            r"quantize|download|upload|apply)(?:[_-][\w-]*)?\.py$")


def _helper_script(tokens: Sequence[str]) -> str | None:
    """The name of the non-training Python script a command runs (``python export_checkpoint.py ...``), or None."""
    script = next((t for t in tokens[:6] if t.endswith(".py")), None)
    name = basename(script) if script else ""
    return name if name and _HELPER_SCRIPT.match(name) else None


# How deep a script that runs a script that the manifest carries is followed (a script may run itself)
_MAX_SCRIPT_DEPTH = 4
# the name under which ``python -c CODE`` and ``python - <<EOF`` code is read as a script
INLINE_PYTHON = "inline-python.py"
_PYTHON = re.compile(r"python(?:3(?:\.\d+)?)?")
# ``python - <<'EOF'`` (the script on standard input, from a heredoc), alone on its line
_STDIN_PYTHON = re.compile(r"^(\s*(?:exec\s+)?(?:\S*/)?python(?:3(?:\.\d+)?)?)\s+-\s*<<-?\s*(['\"]?)[A-Za-z_]\w*\2"
                           r"\s*$")
_SHELL_SHEBANG = re.compile(r"#![ \t]*\S*(?:/|env[ \t]+)(?:ba|z|da|a)?sh\b")


def _inference_server(tokens: Sequence[str]) -> str | None:
    """The inference server a command starts (``trl vllm-serve``, ``vllm serve``, vLLM's or SGLang's server module,
    ``swift rollout`` / ``swift deploy``, TGI's launcher), or None."""
    names = [basename(t) for t in tokens[:4]]
    pairs = list(pairwise(names))
    if ("trl", "vllm-serve") in pairs or ("vllm", "serve") in pairs:
        return " ".join(next(p for p in pairs if p in (("trl", "vllm-serve"), ("vllm", "serve"))))
    if ("swift", "rollout") in pairs or ("swift", "deploy") in pairs:
        return " ".join(next(p for p in pairs if p[0] == "swift"))
    if names and names[0] == "text-generation-launcher":
        return "text-generation-launcher"
    module = next((tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == "-m"), "")
    if module.startswith(("vllm.entrypoints", "sglang.launch_server")):
        return f"python -m {module}"
    return None


# Commands that run the command after them: a script they start is the one they run (``exec /x.sh``,
# ``nohup bash x.sh``, ``timeout 1h ./run.sh``, ``/usr/bin/env bash x.sh``), with their own options and values
_WRAPPERS = {"exec", "nohup", "time", "setsid", "env", "timeout", "stdbuf", "nice", "ionice", "taskset", "numactl",
             "srun"}  # Slurm's srun starts the command once per task (sbatch files run per-node scripts so)
_WRAPPER_VALUES = {"timeout": 1, "taskset": 1}  # positional values before the command (a duration, a CPU mask)
# the wrappers' options that take the next word as their value (nice -n 10, timeout -k 30 72h, numactl -N 0)
_WRAPPER_OPTION_VALUES = {
    "nice": {"-n", "--adjustment"}, "timeout": {"-k", "-s", "--kill-after", "--signal"},
    "numactl": {"-N", "-m", "-C", "-p", "-i", "--cpunodebind", "--membind", "--physcpubind", "--preferred",
                "--interleave"},
    "ionice": {"-c", "-n", "-p", "-P", "-u", "--class", "--classdata"}, "env": {"-u", "--unset", "-C", "--chdir"},
    "stdbuf": {"-i", "-o", "-e"}, "exec": {"-a"}, "time": {"-f", "-o"},
    # srun's options that take a value as the next word (slurm.schedmd.com/srun.html); --opt=value is one word
    "srun": {"-N", "-n", "-c", "-p", "-t", "-J", "-o", "-e", "-i", "-w", "-x", "-A", "-G", "-D", "-C", "-q", "-m",
             "--nodes", "--ntasks", "--ntasks-per-node", "--cpus-per-task", "--partition", "--time", "--job-name",
             "--output", "--error", "--input", "--nodelist", "--exclude", "--account", "--gpus", "--gpus-per-node",
             "--gpus-per-task", "--gres", "--mem", "--mem-per-cpu", "--mem-per-gpu", "--chdir", "--constraint",
             "--qos", "--distribution", "--export", "--mpi", "--container-image", "--container-mounts",
             "--container-name", "--container-workdir", "--cpu-bind"},
}
_SHELL_VALUE_FLAGS = ("o", "O")  # set -o OPTION / shopt -O OPTION as bash's own flags: the next word is the value


def _unwrapped(tokens: Sequence[str]) -> list[str]:
    """``tokens`` without the wrappers in front of the command they run (and their options and values)."""
    rest = list(tokens)
    while rest and basename(rest[0]) in _WRAPPERS:
        head = PurePosixPath(rest.pop(0)).name
        values = _WRAPPER_VALUES.get(head, 0)
        takes = _WRAPPER_OPTION_VALUES.get(head, set())
        while rest and (rest[0].startswith("-") or (head == "env" and _ASSIGN.match(rest[0]))):
            option = rest.pop(0)  # options (-oL, -n 10) and env's NAME=value
            if option in takes and rest:
                rest.pop(0)
        del rest[:values]
    return rest


def _script_run(tokens: Sequence[str]) -> str | None:
    """The script file a command runs: ``bash [-x] [-o pipefail] FILE``, ``source FILE`` / ``. FILE``, or ``FILE``
    itself when it is a path (``/opt/tas/train.sh``, ``./run.sh``), also behind ``exec``/``nohup``/``env``/...;
    None for anything else (``bash -c`` is split_script's)."""
    tokens = _unwrapped(tokens)
    if not tokens:
        return None
    head = basename(tokens[0])
    if head in _SHELLS or head in ("source", "."):
        rest = list(tokens[1:])
        while rest and rest[0].startswith(("-", "+")):
            flag = rest.pop(0)
            if head in _SHELLS and not flag.startswith("--") and "c" in flag:
                return None
            takes_value = flag in ("--rcfile", "--init-file") or (
                flag[-1:] in _SHELL_VALUE_FLAGS and not flag.startswith("--"))
            if takes_value and rest:
                rest.pop(0)  # bash -eo pipefail x.sh: pipefail is -o's value, x.sh the script
        return rest[0] if rest else None
    return tokens[0] if "/" in tokens[0] or tokens[0].endswith(".sh") else None


def _run_carried_scripts(script: Script, known: dict[str, str], budget: TextBudget, where: str, depth: int = 0
                         ) -> None:
    """Replace each command that runs a script file the manifest carries (a ConfigMap key mounted where the command
    looks for it, or a heredoc) by that script's commands, read as a ``bash -c`` script is: platform teams template
    jobs as an entrypoint script in a ConfigMap (``command: [bash, /workspace/script.sh]``), which was never opened
    (the container's env then named the model the script overrides). A script that is not carried is named."""
    commands: list[list[str]] = []
    for tokens in script.commands:
        path = _script_run(tokens)
        content = known.get(basename(path)) if path else None
        inner_tokens = _unwrapped(tokens)
        runs_shell = bool(inner_tokens) and basename(inner_tokens[0]) in (*_SHELLS, "source", ".")
        if content is not None and not runs_shell and not path.endswith(".sh") and \
                not _SHELL_SHEBANG.match(content.lstrip()):
            content = None  # a carried file that is no shell script (a Python entry point, a config)
        if path is None or content is None or depth >= _MAX_SCRIPT_DEPTH or len(content) > budget.left:
            if path is not None and content is None and path.endswith((".sh", ".bash")):
                note = (f"{where}: the command runs {path}, which the manifest does not carry: what it runs is not "
                        "read (carry it in a ConfigMap of the same file, or set the settings in the vramfit.io/spec "
                        "annotation)")
            elif content is not None:
                note = (f"{where}: the command runs {path}, carried by the manifest, but it is run more often or "
                        "more deeply than vramfit reads scripts of one job: not read again")
            else:
                note = ""
            if note and note not in script.notes:
                script.notes.append(note)
            commands.append(tokens)
            continue
        unwrapped = _unwrapped(tokens)
        args = unwrapped[unwrapped.index(path) + 1:] if path in unwrapped else []
        if not args and not _FUNCTION.search(content):
            content = drop_argument_loops(content)
        inner = split_script(["bash", "-c", bind_positional(content, args)], script.env, budget, f"{where}: {path}",
                             known)
        known.update(inner.files)
        script.files.update(inner.files)
        _run_carried_scripts(inner, known, budget, where, depth + 1)
        script.env.update(inner.env)
        for note in [*inner.notes, f"{where}: the command runs {path}, carried by the manifest: read as its commands"]:
            if note not in script.notes:
                script.notes.append(note)
        commands += inner.commands
    script.commands = commands


def _trainer_label(tokens: Sequence[str]) -> str:
    names = [basename(t) for t in tokens[:4]]
    if any(basename(t) == "train_bash.py" for t in tokens):
        return "LLaMA-Factory"  # its launcher before llamafactory-cli (src/train_bash.py), often behind accelerate's
    if any(basename(t) == "train.py" and PurePosixPath(t).parent.name == "src" for t in tokens) and any(
            t == "--finetuning_type" or t.startswith("--finetuning_type=") for t in tokens):
        # its src/train.py (run_exp) under torchrun or deepspeed, with LLaMA-Factory's own --finetuning_type
        return "LLaMA-Factory"
    joined = " ".join(tokens)
    for label, needle in (
        ("axolotl", "axolotl"),
        ("LLaMA-Factory", "llamafactory-cli"),
        ("LLaMA-Factory", "lmf"),  # llamafactory-cli's shortcut (LLaMA-Factory pyproject.toml [project.scripts])
        ("TRL", "trl"),
        ("accelerate", "accelerate"),
        ("torchrun", "torchrun"),
        ("deepspeed", "deepspeed"),
        ("torchrun", "torch.distributed.run"),
    ):
        if needle in names or needle in joined.split():
            return label
    return names[0] if names else ""


# Tools that train on the Hugging Face stack (transformers, PEFT, bitsandbytes), and what only transformers'
# TrainingArguments (which HF Trainer / TRL scripts parse) or those tools' configs name: a command with them runs on
# transformers, whose memory and time the model knows (TrainingSpec ``framework``); torchtune's `tune run` is read
# as framework torchtune (read_torchtune); torchtitan and plain torchrun scripts keep the framework-neutral model.
_HF_TRAINERS = ("axolotl", "LLaMA-Factory", "TRL")


def framework_setting(trainer: str, raw: Mapping[str, Setting], where: str) -> Setting | None:
    if trainer in _HF_TRAINERS:
        return Setting("transformers", f"{trainer} (trains with transformers and PEFT)", where)
    for setting in raw.values():
        for tool in ("axolotl", "LLaMA-Factory", "LLaMA-Factory v1"):
            if f"{tool} config" in setting.source:  # "axolotl config PATH key K": the config, not the key
                config = setting.source.split(" key ")[0]
                return Setting("transformers", f"{config} ({tool} trains with transformers and PEFT)", where)
        if "per_device_train_batch_size" in setting.source:
            return Setting("transformers", f"{setting.source} (transformers' TrainingArguments)", where)
    return None


# --- ChatGLM3 / GLM-4 finetune_demo ----------------------------------------------------------------
# THUDM/ChatGLM3 finetune_demo/finetune_hf.py and THUDM/GLM-4 finetune_demo/finetune.py (typer): positional DATA_DIR,
# MODEL_DIR, CONFIG_FILE; the YAML holds data_config, max_input_length / max_output_length, a training_args section
# (Seq2SeqTrainingArguments) and an optional peft_config (PEFT's get_peft_config: LORA or PREFIX_TUNING).
_GLM_DEMO_SCRIPTS = ("finetune_hf.py", "finetune.py")
_GLM_DEMO_CONFIGS = {"lora.yaml": "lora", "ptuning_v2.yaml": "prefix_tuning", "sft.yaml": "full"}


def is_glm_finetune_config(data: Mapping[str, Any]) -> bool:
    return isinstance(data.get("training_args"), Mapping) and ("data_config" in data or "max_input_length" in data)


def _glm_demo_model(tokens: Sequence[str], path: str) -> str | None:
    """MODEL_DIR of ``finetune_hf.py DATA_DIR MODEL_DIR CONFIG`` when the config is one of the demo's own (its file
    names) and the manifest does not carry it; None otherwise."""
    scripts = [i for i, t in enumerate(tokens) if basename(t) in _GLM_DEMO_SCRIPTS]
    if not scripts or path not in tokens:
        return None
    between = list(tokens[scripts[0] + 1:tokens.index(path)])  # the positional form only: DATA_DIR MODEL_DIR
    if any(t.startswith("-") for t in between) or len(between) != 2:
        return None
    if basename(path) not in _GLM_DEMO_CONFIGS and not any(glm in between[1].lower() for glm in ("chatglm", "glm-4",
                                                                                                  "glm4")):
        return None
    return between[1]


def read_glm_finetune(tokens: Sequence[str], path: str, data: Mapping[str, Any] | None,
                      where: str) -> tuple[dict[str, Setting], list[str]]:
    """The demo's settings: the model the second positional names; LoRA (rank 8, alpha 8 and dropout 0 by PEFT's
    defaults; on ``query_key_value`` for the GLM families, PEFT's target mapping for chatglm) or prefix tuning (an
    adapter the TrainingSpec has no method for: predicted as LoRA) or, with no peft_config, full fine-tuning;
    checkpointing always (``model.gradient_checkpointing_enable()``); sequences up to max_input_length +
    max_output_length + 1, each batch padded to its longest (DataCollatorForSeq2Seq padding longest); ChatGLM3's
    finetune_hf.py loads the model without a torch_dtype (float32, its trainable parameters cast to fp32 again) and
    GLM-4's finetune.py in bf16."""
    scripts = [t for t in tokens if basename(t) in _GLM_DEMO_SCRIPTS]
    script = basename(scripts[0]) if scripts else "finetune_hf.py"
    label = f"GLM finetune_demo config {path}"
    raw: dict[str, Setting] = {}
    notes: list[str] = []
    between = list(tokens[tokens.index(scripts[0]) + 1:tokens.index(path)]) if scripts and path in tokens else []
    model = between[1] if len(between) == 2 and not any(t.startswith("-") for t in between) else None
    if model is not None:
        raw["model"] = Setting(model, f"{script} positional MODEL_DIR", where)
    raw["gradient_checkpointing"] = Setting(True, f"{script} (model.gradient_checkpointing_enable())", where)
    glm4 = script == "finetune.py"
    raw["_dtype"] = Setting("bfloat16" if glm4 else "float32", f"{script} (from_pretrained "
                            + ("torch_dtype=torch.bfloat16)" if glm4 else "without torch_dtype: float32)"), where)
    if data is None:
        kind = _GLM_DEMO_CONFIGS.get(basename(path), "lora")
        notes.append(f"{label} is not in the manifest: read as the demo's own {basename(path)} by its name "
                     f"({'full fine-tuning' if kind == 'full' else kind}); its batch and lengths are unknown (set "
                     "them in the vramfit.io/spec annotation)")
        raw["_finetuning_type"] = Setting(kind, f"{label} (by its name)", where)
        if kind == "lora":
            raw["lora.target_modules"] = Setting(["query_key_value"], f"{label} (the demo's target)", where)
        return raw, notes
    training = data["training_args"]
    raw.update(read_pairs(((str(k), v, f"{label} key training_args.{k}") for k, v in training.items()
                           if v is not None and not isinstance(v, Mapping)), where))
    prompt, answer = (launch_count(data.get(k)) for k in ("max_input_length", "max_output_length"))
    if prompt is not None and answer is not None:
        raw["seq_len"] = Setting(prompt + answer + 1, f"{label} keys max_input_length {prompt} + "
                                 f"max_output_length {answer} + 1", where)
        raw["sequence_lengths"] = Setting("variable", f"{script} (DataCollatorForSeq2Seq padding longest)", where)
    peft = data.get("peft_config")
    kind = str(peft.get("peft_type", "")).strip().lower() if isinstance(peft, Mapping) else ""
    if not kind:
        raw["_finetuning_type"] = Setting("full", f"{label} (no peft_config: full fine-tuning)", where)
    elif kind == "lora":
        raw["_peft"] = Setting(True, f"{label} key peft_config.peft_type LORA", where)
        for key, name, default in (("r", "lora.rank", 8), ("lora_alpha", "lora.alpha", 8),
                                   ("lora_dropout", "lora.dropout", 0.0)):
            value = peft.get(key)
            raw[name] = Setting(value if value is not None else default, f"{label} key peft_config.{key}"
                                if value is not None else f"PEFT default {key} {default}", where)
        targets = peft.get("target_modules")
        raw["lora.target_modules"] = Setting(targets if targets else ["query_key_value"],
                                             f"{label} key peft_config.target_modules" if targets else
                                             "PEFT's target mapping for chatglm: query_key_value", where)
    else:
        raw["_finetuning_type"] = Setting(kind, f"{label} key peft_config.peft_type {peft.get('peft_type')}", where)
    return raw, notes


def _read_launcher(tokens: Sequence[str], where: str, files: Mapping[str, str],
                   env: Mapping[str, str] | None = None) -> Reading:
    """HF Trainer / TRL / accelerate / torchrun / deepspeed / axolotl / LLaMA-Factory command lines."""
    from scheduler.spec.llmforge import is_llmforge_config, read_llmforge
    from scheduler.spec.llmfoundry import is_llm_foundry_config, read_llm_foundry  # they build on this module
    from scheduler.spec.nemo import is_nemo, is_nemo2, read_nemo, read_nemo2
    from scheduler.spec.oumi import oumi_config, oumi_pairs
    from scheduler.spec.skyrl import is_skyrl, skyrl_settings
    from scheduler.spec.xtuner import xtuner_config, xtuner_pairs

    flags, positionals = read_flags(tokens, where)
    raw: dict[str, Setting] = {}
    notes: list[str] = []
    trainer = _trainer_label(tokens)
    if (idle := llamafactory_non_training(tokens)) is not None:
        # llamafactory-cli chat / export / env ...: nothing trains, as for a pod that runs no trainer (no model found,
        # the error naming the sub-command)
        return Reading(notes=[idle], unresolved_model=idle, launch=launch_layout(tokens, {}, env), not_training=True)
    v1 = llamafactory_v1_launch(tokens, env or {})  # a LLaMA-Factory v1 config is read as one only under it
    deepspeed_value = str(flags["_deepspeed"].value) if "_deepspeed" in flags else ""
    # every token: a launcher's own ``--config_file FILE`` is not a trainer flag, so read_flags drops it
    accelerate: dict[str, Any] = {}
    unread: list[str] = []
    for path in dict.fromkeys(_config_paths(tokens)):
        if path == deepspeed_value:
            continue
        content = files.get(basename(path))
        if content is None:
            unread.append(path)
        data = _load_mapping(content) if content is not None else None
        if isinstance(data, dict) and is_llm_foundry_config(data):
            # llm-foundry's training YAML (composer train.py CONFIG key=value ...): its overrides merged over it
            settings, config_notes = read_llm_foundry(data, _key_values(positionals), f"llm-foundry config {path}",
                                                      where)
            raw.update(settings)
            notes += config_notes
            continue
        if (isinstance(data, dict) and is_glm_finetune_config(data)) or (content is None
                                                                         and _glm_demo_model(tokens, path)):
            # ChatGLM3 / GLM-4 finetune_demo: ``finetune_hf.py DATA_DIR MODEL_DIR configs/lora.yaml``
            settings, config_notes = read_glm_finetune(tokens, path, data if isinstance(data, dict) else None,
                                                       where)
            raw.update(settings)
            notes += config_notes
            continue
        if isinstance(data, dict) and is_llmforge_config(data):
            # Anyscale's LLMForge (llmforge anyscale finetune CONFIG): one YAML, its DeepSpeed config named inside
            settings, config_notes = read_llmforge(data, f"LLMForge config {path}", where)
            raw.update(settings)
            notes += config_notes
            continue
        if isinstance(data, dict) and config_flavour(data, v1) == "DeepSpeed config" and "_deepspeed" not in flags:
            # a DeepSpeed config under another flag (Ray's fine-tuning template: --ds-config): read as --deepspeed is,
            # its "auto" values filled from the trainer's arguments
            raw["_deepspeed"] = Setting(path, f"DeepSpeed config {path} named by the command", where)
            continue
        if isinstance(data, dict) and looks_like_trainer_config(data, v1):
            label = f"{config_flavour(data, v1)} {path}"
            if trainer == "LLaMA-Factory":
                # LLaMA-Factory merges the command's key=value overrides over the file before reading any of it
                # (src/llamafactory/hparams/parser.py _read_args: OmegaConf.merge of the YAML and from_cli), so its
                # defaults and derived readings (finetuning_type, freeze tuning, checkpointing) see them too
                data = {**data, **dict(_key_values(positionals))}
            settings, config_notes = read_trainer_config(data, label, where, v1)
            raw.update(settings)
            notes += config_notes
        elif isinstance(data, dict) and looks_like_accelerate_config(data):
            # accelerate launch flags override the config file (accelerate commands/launch.py): flags come after
            raw.update(read_accelerate_config(data, f"accelerate config {path}", where))
            accelerate = {**data, "_label": f"accelerate config {path}"}
        elif trainer in ("axolotl", "LLaMA-Factory") and content is None:
            notes.append(
                f"{trainer} config {path} is not in the manifest; its settings are unknown "
                "(inline it, or set them in the vramfit.io/spec annotation)"
            )
    if unread and not accelerate:
        _accelerate_config_by_name(tokens, unread, raw, notes, where)
    if trainer == "LLaMA-Factory":  # llamafactory-cli train CONFIG key=value ...
        raw.update(read_pairs(((k, v, f"override {k}={v}") for k, v in _key_values(positionals)), where))
        flag_map = {k: v for k, v, _ in _flag_pairs(tokens)[0]}
        if not any("LLaMA-Factory config" in setting.source for setting in raw.values()) and \
                config_flavour(flag_map, v1) == "LLaMA-Factory config":
            # the arguments as flags (src/train_bash.py, llamafactory-cli train --key value): LLaMA-Factory's own
            # defaults where they leave a setting out, as for a config file
            implied, implied_notes = trainer_config_defaults(flag_map, "LLaMA-Factory arguments", where)
            raw = {**implied, **raw}
            notes += implied_notes
    raw.update(flags)
    if "training_parameters" in _flag_values(tokens):
        _kubeflow_sdk_settings(tokens, raw, notes, where)
    if _is_megatron(tokens):
        _megatron_settings(tokens, raw, notes, where)
    if _is_fms_fsdp(tokens):
        _fms_fsdp_settings(tokens, raw, notes, where)
    if _is_awsome_fsdp(tokens):
        _awsome_fsdp_settings(tokens, raw, notes, where)
    if any(basename(t) == "finetune_hf_llm.py" for t in tokens):
        _ray_template_settings(tokens, raw, notes, where)
    if (openrlhf := _openrlhf_command(tokens)) is not None:
        _openrlhf_settings(openrlhf, tokens, raw, notes, where)
    if (oumi := oumi_config(tokens)) is not None:
        # oumi train -c CONFIG: Oumi's TrainingConfig YAML (scheduler/spec/oumi.py)
        content = files.get(basename(oumi[0]))
        pairs, oumi_notes = oumi_pairs(oumi[0], oumi[1], _load_mapping(content) if content is not None else None)
        for key, setting in read_pairs(pairs, where).items():
            raw.setdefault(key, setting)
        notes += oumi_notes
    if (xtuner := xtuner_config(tokens)) is not None:
        # xtuner train CONFIG: a carried Python config or a built-in config's name (scheduler/spec/xtuner.py)
        pairs, xtuner_notes = xtuner_pairs(xtuner, files)
        for key, setting in read_pairs(pairs, where).items():
            raw.setdefault(key, setting)  # the command's own flags (--deepspeed deepspeed_zero2) stay
        notes += xtuner_notes
    if (swift := _swift_command(tokens)) is not None:
        _swift_settings(tokens, raw, notes, where)
        if swift == "rlhf":
            _swift_rlhf_settings(tokens, raw, notes, where)
    if trainer == "LLaMA-Factory" and to_bool((env or {}).get("USE_RAY", "")) is True:
        # USE_RAY=1: LLaMA-Factory trains on Ray Train with ray_num_workers workers (default 1), one GPU each
        # (hparams/training_args.py RayArguments, resources_per_worker {"GPU": 1}; hiyouga/LLaMA-Factory 8c88065)
        given = raw.get("_ray_num_workers")
        count = launch_count(given.value) if given is not None else 1
        if count is not None:
            stated = f"{given.source} {count}" if given else "LLaMA-Factory default ray_num_workers 1"
            raw.setdefault(TRAINING_WORLD, Setting(count, f"{stated} (USE_RAY=1: Ray Train workers, one GPU each)",
                                                   where))
    _research_scripts(tokens, raw, notes, where)
    _script_lora_defaults(tokens, raw, notes, where)
    _qlora_repo_defaults(tokens, raw, notes, where)
    if "_double" not in raw and (trainer == "TRL" or _uses_trl_model_config(tokens)) and any(
            k in raw for k in ("_4bit", "_quant_bits")):
        # TRL's ModelConfig: use_bnb_nested_quant defaults to False (trl get_quantization_config passes it as
        # bnb_4bit_use_double_quant); the spec's default for a QLoRA base is NF4 with double quantization
        raw["_double"] = Setting(False, "TRL ModelConfig default use_bnb_nested_quant False", where)
    if any(basename(t) in ("unsloth-cli.py", "unsloth_cli.py") for t in tokens):
        _unsloth_cli_settings(tokens, raw, notes, where)
    _lightning_settings(tokens, raw, notes, where)
    if _is_llama_cookbook(tokens):
        _llama_cookbook_defaults(tokens, raw, notes, where)
    if is_verl_trainer(tokens):
        _verl_settings(tokens, raw, notes, where)
    if is_verl_sft_trainer(tokens):
        _verl_sft_settings(tokens, raw, notes, where)
    if is_skyrl(tokens):
        skyrl_settings(tokens, raw, notes, where)
    if is_nemo(tokens):
        nemo_settings, nemo_notes = read_nemo(tokens, files, where)
        raw.update(nemo_settings)
        notes += nemo_notes
    elif is_nemo2(tokens):
        nemo_settings, nemo_notes = read_nemo2(tokens, where)
        raw.update(nemo_settings)
        notes += nemo_notes
    script = next((basename(t) for t in tokens if basename(t) in _SCRIPT_TASKS), None)
    if script is not None and "task" not in raw:
        raw["task"] = Setting(_SCRIPT_TASKS[script], f"transformers' {script} example script", where)
    if "_dtype" in raw and "(axolotl loads the model in bf16)" in raw["_dtype"].source and \
            any(k in flags for k in ("_deepspeed", "_fsdp", "_use_fsdp", "_use_deepspeed", "_fsdp_config")):
        del raw["_dtype"]  # DeepSpeed / FSDP keep fp32 masters: the config's bf16 is mixed precision again
        notes = [n for n in notes if "axolotl loads the model in bf16" not in n]
    no_trainer = any(t.endswith("_no_trainer.py") for t in tokens)
    if no_trainer and not any(k in raw for k in ("optimizer", "fused_optimizer")):
        # transformers' *_no_trainer examples build torch.optim.AdamW(params, lr=...) themselves: foreach, not fused
        raw["fused_optimizer"] = Setting(False, "torch.optim.AdamW of a *_no_trainer script (foreach, not the "
                                                "Trainer's fused default)", where)
    if "model_max_length" in _flag_values(tokens) and trainer not in _HF_TRAINERS and not any(
            k in raw for k in ("optimizer", "fused_optimizer")):
        # --model_max_length is no TrainingArguments field: it is Stanford Alpaca's train.py subclass's, whose
        # `optim: str = field(default="adamw_torch")` the scripts copied from it keep (FastChat, LLaVA, LongLoRA,
        # Qwen's finetune.py, ...): the foreach AdamW, not the Trainer's fused default
        raw["fused_optimizer"] = Setting(False, "an Alpaca-lineage train.py (--model_max_length: its TrainingArguments "
                                                "subclass sets optim adamw_torch, foreach)", where)
    _trl_defaults(tokens, trainer, raw, flags, notes, where, all_read=not unread)
    _online_rl_settings(tokens, raw, notes, where)
    _hf_trainer_defaults(tokens, trainer, raw, notes, where, all_read=not unread)
    _task_script_settings(tokens, raw, notes, where, all_read=not unread)
    if trainer == "LLaMA-Factory" and not notes and "_finetuning_type" not in raw and "model" in raw:
        # every setting is in view (flags, overrides, configs read) and none names the method: LLaMA-Factory's
        # default finetuning_type is lora (llamafactory hparams/finetuning_args.py)
        raw["_finetuning_type"] = Setting("lora", "LLaMA-Factory (finetuning_type default lora)", where)
        notes.append("llamafactory-cli sets no finetuning_type: LLaMA-Factory's default lora")
    reading = resolve(raw, files, trainer)
    _unread_size_flags(tokens, {**raw, **reading.settings}, notes)  # a DeepSpeed config may state them
    framework = framework_setting(trainer, raw, where)
    if framework is not None and reading.settings:
        reading.settings.setdefault("framework", framework)
    reading.notes = notes + reading.notes
    reading.trainer = trainer if reading.settings else ""
    reading.launch = launch_layout(tokens, accelerate, env)
    if "model" not in reading.settings:  # what a reader found of the model but could not size (Megatron's vocabulary)
        reading.unresolved_model = next((n for n in notes if n.startswith(_MEGATRON_NO_VOCAB)), "")
    return reading


# transformers Auto classes of Kubeflow's SDK trainer (--transformer_type) and the task they train
_AUTO_CLASS_TASKS = {"automodelforcausallm": "causal-lm", "automodelforsequenceclassification": "seq-classification",
                     "automodelfortokenclassification": "token-classification", "automodelformaskedlm": "masked-lm"}


def _kubeflow_sdk_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """Kubeflow's SDK trainer (``TrainingClient.train()``: the trainer-huggingface image runs
    kubeflow/trainer/hf_llm_training.py with ``--model_uri hf://ORG/NAME --transformer_type CLASS --lora_config JSON
    --training_parameters JSON``): ``TrainingArguments(**json.loads(training_parameters))``, the model loaded by the
    Auto class and always wrapped in ``LoraConfig(**json.loads(lora_config))`` (an empty config: PEFT's defaults).
    Before, none of it was read: a LoRA job at batch 4 with checkpointing was a full fine-tune at batch 1."""
    pairs = _flag_values(tokens)
    params, lora, uri, auto = (pairs.get(k) for k in ("training_parameters", "lora_config", "model_uri",
                                                     "transformer_type"))
    def unquoted(text: Any) -> str:  # Katib's templates keep the shell quotes around the JSON: '{...}'
        body = str(text).strip()
        return body[1:-1] if len(body) > 1 and body[0] == body[-1] and body[0] in "'\"" else body

    if uri is not None and str(uri[0]).startswith("hf://") and str(uri[0])[5:].strip("/") and "model" not in raw:
        raw["model"] = Setting(str(uri[0]).removeprefix("hf://").strip("/"), uri[1], where)
    if auto is not None and (task := _AUTO_CLASS_TASKS.get(str(auto[0]).strip().lower())) is not None:
        raw["task"] = Setting(task, auto[1], where)
    data = _load_mapping(unquoted(params[0])) if params is not None else None
    if data is None and params is not None:
        notes.append(f"{params[1]} is not a JSON object of TrainingArguments (the trainer's json.loads would fail); "
                     "its settings are unknown")
    for key, setting in read_pairs(((k, v, f"{params[1]} key {k}") for k, v in (data or {}).items()),
                                   where).items():
        raw.setdefault(key, setting)
    if data is not None and not any(_enabled(raw.get(k)) is True for k in ("_bf16", "_fp16")) \
            and "_dtype" not in raw:
        # TrainingArguments' bf16/fp16 off (or absent): fp32 training, of a model the Auto class loads in fp32
        raw["_dtype"] = Setting("float32", f"{params[1]} (bf16 and fp16 off: fp32)", where)
    if "seq_len" not in raw:
        notes.append("Kubeflow SDK trainer: the texts are tokenized without truncation and each batch padded to its "
                     "longest; the length is the data's, which vramfit cannot see: set seq_len in the vramfit.io/spec "
                     "annotation")
    config = _load_mapping(unquoted(lora[0])) if lora is not None else None
    if lora is not None and config is None:
        notes.append(f"{lora[1]} is not a JSON object of LoraConfig; PEFT's defaults assumed")
    raw.setdefault("_peft", Setting(True, "Kubeflow SDK trainer (hf_llm_training.py wraps every model in LoRA)",
                                    where))
    names = {"r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
             "target_modules": "lora_target_modules"}
    for key, setting in read_pairs(((names[k], v, f"{lora[1]} key {k}") for k, v in (config or {}).items()
                                    if k in names and v is not None), where).items():
        raw.setdefault(key, setting)


def _ray_template_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """Ray's LLM fine-tuning template (doc/source/templates/04_finetuning_llms_with_deepspeed/finetune_hf_llm.py at
    ray-project/ray 0146d49; earlier versions, 3fb556b among them, load the model without FlashAttention-2 and have
    no --lora, which changes little here): ``--batch-size-per-device`` / ``-bs`` (default 16; DeepSpeed's
    micro-batch is set from it), ``--ctx-len`` (default 512; each batch is padded to it), gradient checkpointing
    unless ``--no-grad-ckpt``, ``--mx`` (accelerate's mixed precision, default bf16; it fills the DeepSpeed config's
    "auto"), ``--grad_accum``, the model loaded in bf16 with FlashAttention-2, and ``--lora``
    (./lora_configs/lora.json, not in view: PEFT's settings as written there are unknown). Before, the batch, length,
    checkpointing and precision were missed."""
    values: dict[str, tuple[Any, str]] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, value = token.partition("=")
        key = {"-bs": "batch_size_per_device", "-nd": "num_devices"}.get(name, norm_key(name)) \
            if name.startswith("-") else ""
        if key and not eq and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            value, i = tokens[i + 1], i + 1
        if key:
            values[key] = (value if (eq or value) else True, f"flag {name}")
        i += 1

    def put(field: str, key: str, default: Any, what: str) -> None:
        found = values.get(key)
        raw[field] = Setting(found[0] if found else default, found[1] if found else f"Ray template default {what}",
                             where)

    put("micro_batch_size", "batch_size_per_device", 16, "--batch-size-per-device 16")
    if "ds_config" not in values:  # the template always trains under DeepSpeed: its default config
        raw.setdefault("_deepspeed", Setting("./deepspeed_configs/zero_3_llama_2_7b.json", "Ray template default "
                                             "--ds-config ./deepspeed_configs/zero_3_llama_2_7b.json", where))
    devices = values.get("num_devices")
    if devices is not None and (count := launch_count(str(devices[0]))) is not None:
        # --num-devices: the TorchTrainer's workers, one GPU each (ScalingConfig(num_workers=args.num_devices))
        raw.setdefault(TRAINING_WORLD, Setting(count, f"{devices[1]} {count} (Ray Train workers, one GPU each)", where))
    put("seq_len", "ctx_len", 512, "--ctx-len 512 (each batch padded to it)")
    put("grad_accum_steps", "grad_accum", 1, "--grad_accum 1")
    put("_mixed", "mx", "bf16", "--mx bf16 (accelerate's mixed precision)")
    raw["_dtype"] = Setting("bfloat16", "Ray template (from_pretrained torch_dtype=torch.bfloat16)", where)
    raw["attention"] = Setting("flash", "Ray template (use_flash_attention_2=True)", where)
    if "no_grad_ckpt" in values:
        raw["gradient_checkpointing"] = Setting("none", values["no_grad_ckpt"][1], where)
    else:
        raw["gradient_checkpointing"] = Setting("full", "Ray template (gradient checkpointing unless "
                                                        "--no-grad-ckpt)", where)
    if "lora" in values and to_bool(values["lora"][0]) is not False:
        raw["_peft"] = Setting(True, values["lora"][1], where)
        notes.append(f"{values['lora'][1]}: the template's ./lora_configs/lora.json is not in view; its rank and "
                     "modules are unknown (set lora in the vramfit.io/spec annotation)")


# A script's own flags that look like the micro-batch or the sequence length but whose meaning only the script knows
# (per GPU or global; padded to or truncated at): said when nothing else set the field, so that the assumption that
# follows ("the job does not say") is not taken for the job's silence
_SIZE_LIKE_FLAGS = {"micro_batch_size": ("batch_size", "train_batch_size", "bs", "batch"),
                    "seq_len": ("seq_length", "context_length", "ctx_len", "max_len", "max_tokens", "seqlen")}
_SIZE_LIKE_DOUBT = {"micro_batch_size": "per GPU or global", "seq_len": "every sequence padded to it, or a cap"}


def _unread_size_flags(tokens: Sequence[str], raw: Mapping[str, Setting], notes: list[str]) -> None:
    pairs = _flag_values(tokens)
    for name, keys in _SIZE_LIKE_FLAGS.items():
        if name in raw:
            continue
        found = [pairs[key] for key in keys if key in pairs]
        if found:
            value, source = found[0]
            notes.append(f"{source} {value} not read as {name}: the script decides what it means "
                         f"({_SIZE_LIKE_DOUBT[name]}); set {name} in the vramfit.io/spec annotation if it is")


def is_verl_trainer(tokens: Sequence[str]) -> bool:
    """verl's PPO trainer (``verl.trainer.main_ppo``) or one of its recipes' entry points, which take the same Hydra
    config (``recipe.dapo.main_dapo``, ``recipe/dapo/src/main_dapo.py``, ``recipe.one_step_off_policy.main_ppo``)."""
    return any(t.endswith(("verl.trainer.main_ppo", "verl/trainer/main_ppo.py")) or _VERL_RECIPE.match(t) is not None
               for t in tokens)


_VERL_RECIPE = re.compile(r"^(?:\S*/)?recipe[./](?:\w+[./])+main_\w+(?:\.py)?$")


def is_verl_sft_trainer(tokens: Sequence[str]) -> bool:
    """verl's SFT trainer (``torchrun -m verl.trainer.fsdp_sft_trainer``, or the script's path)."""
    return any(t.endswith(("verl.trainer.fsdp_sft_trainer", "verl/trainer/fsdp_sft_trainer.py")) for t in tokens)


def _verl_sft_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """verl's SFT trainer and its Hydra overrides over verl/trainer/config/sft_trainer.yaml (volcengine/verl 005a83d):
    ``model.partial_pretrain`` the model; ``data.micro_batch_size_per_gpu`` (4) and ``data.max_length`` (1024) the
    micro-batch and the length; ``data.train_batch_size`` (256, global) over the data-parallel ranks (the GPUs / the
    Ulysses size) the accumulation; FSDP full shard of fp32 parameters (``model.fsdp_config.model_dtype`` fp32) with
    bf16 compute; ``model.enable_gradient_checkpointing`` (off); ``model.lora_rank`` > 0 LoRA (``lora_alpha`` 16,
    ``target_modules`` all-linear); ``ulysses_sequence_parallel_size`` the sequence split (read as context
    parallelism); ``model.fsdp_config.cpu_offload`` / ``offload_params`` FSDP's CPU offload; ``model.use_liger``
    Liger's kernels (the fused linear cross-entropy)."""
    pairs = hydra_overrides(tokens)
    label = "verl SFT"

    def value(key: str, default: str) -> tuple[str, str]:
        if key in pairs:
            return pairs[key], f"{label} override {key}={pairs[key]}"
        return default, f"{label} default {key} {default} (sft_trainer.yaml)"

    if "model.partial_pretrain" in pairs:
        raw.setdefault("model", Setting(pairs["model.partial_pretrain"], f"{label} override model.partial_pretrain",
                                        where))
    for key, default, name in (("data.micro_batch_size_per_gpu", "4", "micro_batch_size"),
                               ("data.max_length", "1024", "seq_len"),
                               ("data.train_batch_size", "256", "_global_batch_size")):
        text, source = value(key, default)
        if (count := launch_count(text)) is not None and count > 0:
            raw.setdefault(name, Setting(count, source, where))
        else:
            notes.append(f"{source}: not a positive whole number, ignored")
    raw.setdefault("_use_fsdp", Setting(True, f"{label} (FSDP full shard of every layer)", where))
    raw.setdefault("_bf16", Setting(True, f"{label} FSDP mixed precision (bf16 compute over model_dtype fp32 "
                                          "parameters)", where))
    checkpointing, checkpointing_source = value("model.enable_gradient_checkpointing", "False")
    raw.setdefault("gradient_checkpointing", Setting(to_bool(checkpointing) is True, checkpointing_source, where))
    sp, sp_source = value("ulysses_sequence_parallel_size", "1")
    if (size := launch_count(sp)) is not None and size > 1:
        raw.setdefault("context_parallel", Setting(size, f"{sp_source} (Ulysses: each GPU holds 1/{size} of a "
                                                         "sequence)", where))
    given = pairs.get("model.lora_rank", "0").strip()
    rank = launch_count(given)
    if rank is None and given not in ("0", "null", ""):
        notes.append(f"{label} override model.lora_rank={given}: not a positive whole number, read as no LoRA")
    if rank is not None:
        raw.setdefault("_finetuning_type", Setting("lora", f"{label} override model.lora_rank={rank}", where))
        raw.setdefault("lora.rank", Setting(rank, f"{label} override model.lora_rank={rank}", where))
        alpha, alpha_source = value("model.lora_alpha", "16")
        raw.setdefault("lora.alpha", Setting(alpha, alpha_source, where))  # a number, as the verl PPO reader passes it
        targets, targets_source = value("model.target_modules", "all-linear")
        raw.setdefault("lora.target_modules", Setting(targets, targets_source, where))
        raw.setdefault("lora.dropout", Setting(0.0, f"{label} (its LoraConfig passes no dropout: PEFT's 0)", where))
    if any(to_bool(pairs.get(f"model.fsdp_config.{k}", "false")) is True for k in ("cpu_offload", "offload_params")):
        raw.setdefault("offload", Setting("params+optimizer", f"{label} model.fsdp_config cpu_offload / offload_params "
                                                              "(FSDP CPUOffload)", where))
    if to_bool(pairs.get("model.use_liger", "false")) is True:
        raw.setdefault("cross_entropy", Setting("fused-linear", f"{label} override model.use_liger (Liger's fused "
                                                                "linear cross-entropy)", where))
    if to_bool(pairs.get("use_remove_padding", "false")) is True:
        notes.append(f"{label} use_remove_padding: sequences run unpadded; sized at data.max_length (the longest "
                     "batch)")


def _verl_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """verl's PPO/GRPO trainer (``python -m verl.trainer.main_ppo`` or a recipe's entry point, with Hydra
    ``key=value`` overrides; verl/trainer/config/_generated_ppo_trainer.yaml @ volcengine/verl 035682e, fsdp_workers.py
    @ 004c888): the actor is what trains. ``actor_rollout_ref.model.path`` the model, ``data.max_prompt_length`` +
    ``data.max_response_length`` (512 each by default) the trained length, ``actor.ppo_micro_batch_size_per_gpu`` the
    micro-batch (:func:`_verl_micro_batch`), ``actor.ulysses_sequence_parallel_size`` the sequence split (read as
    context parallelism: FSDP still shards over every GPU), ``model.enable_gradient_checkpointing`` (on by default),
    ``model.lora_rank`` > 0 LoRA (no dropout: verl's LoraConfig passes none).
    - FSDP (the default strategy) keeps bf16 compute over fp32 sharded parameters. ``fsdp_config.param_offload`` /
      ``optimizer_offload`` move the actor to host memory between its calls and back for its update (update_actor
      loads both first): on the GPUs at its own peak, away while a critic trains (``idle_offload``); FSDP2's
      ``offload_policy`` offloads during training.
    - The KL term's reference model (``actor.use_kl_loss``, ``algorithm.use_kl_in_reward``) and a reward model live in
      host memory under FSDP (fsdp_workers.py: CPUOffload(offload_params=True) for every role but the actor).
    - ``--config-name ppo_megatron_trainer`` (or strategy megatron): Megatron with its distributed optimizer (read as
      ZeRO-1), ``megatron.tensor_model_parallel_size`` / ``pipeline_model_parallel_size`` /
      ``context_parallel_size``, no recompute unless ``override_transformer_config.recompute_granularity`` says so,
      and a reference model on the GPUs.
    - The rollout engine (vLLM/SGLang) frees its memory while the actor trains (``rollout.free_cache_engine``, on by
      default), else it keeps ``rollout.gpu_memory_utilization`` of each GPU.
    - PPO (``algorithm.adv_estimator`` gae, the default) trains a critic on the same GPUs (:func:`_verl_critic`)."""
    pairs = hydra_overrides(tokens)
    label = "verl override"

    def put(key: str, name: str, value: Any) -> None:
        raw.setdefault(name, Setting(value, f"{label} {key}={pairs[key]}", where))

    config_name = next((t.split("=", 1)[1] if "=" in t else tokens[i + 1] for i, t in enumerate(tokens)
                        if t.startswith("--config-name") and ("=" in t or i + 1 < len(tokens))), "")
    megatron_default = "megatron" in config_name
    if "actor_rollout_ref.model.path" in pairs:
        put("actor_rollout_ref.model.path", "model", pairs["actor_rollout_ref.model.path"])
    lengths = {k: pairs.get(f"data.{k}", "512") for k in ("max_prompt_length", "max_response_length")}
    prompt, response = (launch_count(v) for v in lengths.values())
    if prompt and response and "seq_len" not in raw:
        raw["seq_len"] = Setting(prompt + response, f"verl data.max_prompt_length {prompt} + data.max_response_length "
                                 f"{response} (the actor trains on prompt and response)", where)
    elif not (prompt and response):
        notes.append(f"verl data lengths not read ({', '.join(f'{k}={v}' for k, v in lengths.items())}): set seq_len "
                     "in the vramfit.io/spec annotation")
    world = (launch_count(pairs.get("trainer.n_gpus_per_node", "8")) or 8) * (
        launch_count(pairs.get("trainer.nnodes", "1")) or 1)
    length = prompt + response if prompt and response else None
    sp = launch_count(pairs.get("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "1")) or 1
    actor_batch = _verl_micro_batch(pairs, "actor_rollout_ref.actor", world, length, 16384, False, sp)
    if actor_batch is not None:
        raw.setdefault("micro_batch_size", Setting(actor_batch[0], actor_batch[1], where))
    if sp > 1:
        raw.setdefault("context_parallel", Setting(sp, f"{label} actor_rollout_ref.actor.ulysses_sequence_parallel_"
                                                       f"size={sp} (Ulysses: each GPU holds 1/{sp} of a sequence)",
                                                   where))
    strategy = pairs.get("actor_rollout_ref.actor.strategy", "megatron" if megatron_default else "fsdp")
    megatron = strategy == "megatron"
    if megatron:
        _verl_megatron(pairs, raw, notes, where, config_name)
    elif strategy.startswith("fsdp"):
        raw.setdefault("_use_fsdp", Setting(True, f"verl actor strategy {strategy}", where))
        key = "actor_rollout_ref.actor.fsdp_config.fsdp_size"
        group = launch_count(pairs.get(key, "-1"))
        if group is not None and 0 < group < world:
            # fsdp_size (-1: every GPU): a 2-D device mesh, shard groups of fsdp_size replicated world / fsdp_size
            # times (verl fsdp_workers.py create_device_mesh, HSDP)
            raw.setdefault("_shard_group", Setting(group, f"{label} {key}={group} (HSDP: shard groups of {group} "
                                                          "GPUs, the states replicated across them)", where))
        if "actor_rollout_ref.model.enable_gradient_checkpointing" in pairs:
            put("actor_rollout_ref.model.enable_gradient_checkpointing", "gradient_checkpointing",
                to_bool(pairs["actor_rollout_ref.model.enable_gradient_checkpointing"]) is True)
        else:
            raw.setdefault("gradient_checkpointing", Setting(True, "verl default actor_rollout_ref.model."
                                                                   "enable_gradient_checkpointing True", where))
    else:
        notes.append(f"verl actor strategy {strategy}: its parallelism is not read")
    actor_idle = _verl_offloaded_when_idle(pairs, "actor_rollout_ref.actor", "the actor", raw, notes, where)
    rank = launch_count(pairs.get("actor_rollout_ref.model.lora_rank", "0"))
    if rank:
        put("actor_rollout_ref.model.lora_rank", "lora.rank", rank)
        raw.setdefault("_finetuning_type", Setting("lora", f"{label} actor_rollout_ref.model.lora_rank", where))
        if "actor_rollout_ref.model.lora_alpha" in pairs:
            put("actor_rollout_ref.model.lora_alpha", "lora.alpha", pairs["actor_rollout_ref.model.lora_alpha"])
        raw.setdefault("lora.target_modules", Setting("all-linear", "verl default target_modules all-linear", where))
        raw.setdefault("lora.dropout", Setting(0.0, "verl's LoraConfig (fsdp_workers.py: no lora_dropout, PEFT's 0)",
                                               where))
    raw.setdefault("_bf16", Setting(True, f"verl actor {'Megatron' if megatron else 'FSDP'} mixed precision (bf16 "
                                          "compute, fp32 masters)", where))
    kl = [k for k in ("actor_rollout_ref.actor.use_kl_loss", "algorithm.use_kl_in_reward")
          if to_bool(pairs.get(k, "false")) is True]
    ref_offloaded = to_bool(pairs.get("actor_rollout_ref.ref.megatron.param_offload", "false")) is True
    if kl and megatron and not ref_offloaded:
        raw.setdefault("reference_model", Setting(True, f"{label} {kl[0]}=True (the KL term's reference model, on the "
                                                        "GPUs under Megatron)", where))
    elif kl:
        notes.append(f"verl {kl[0]}: the reference model's parameters live in host memory ("
                     + ("ref.megatron.param_offload" if megatron else "verl puts every FSDP role but the actor under "
                        "CPUOffload") + "): not on the GPUs at the actor's peak")
    engine = pairs.get("actor_rollout_ref.rollout.name", "vllm")
    free = to_bool(pairs.get("actor_rollout_ref.rollout.free_cache_engine", "true")) is not False
    if free:
        notes.append(f"verl rollout {engine}: the engine frees its memory while the actor trains (free_cache_engine)")
    elif "actor_rollout_ref.rollout.gpu_memory_utilization" in pairs:
        put("actor_rollout_ref.rollout.gpu_memory_utilization", "colocated_engine_memory_fraction",
            pairs["actor_rollout_ref.rollout.gpu_memory_utilization"])
    critic_idle = _verl_critic(pairs, raw, notes, where, world, length, megatron)
    if "critic_model" in raw and (actor_idle or critic_idle):
        which = "both" if actor_idle and critic_idle else ("policy" if actor_idle else "critic")
        raw.setdefault("idle_offload", Setting(which, "verl fsdp_config param_offload and optimizer_offload of "
                                                      + {"both": "the actor and the critic", "policy": "the actor",
                                                         "critic": "the critic"}[which], where))
    if to_bool(pairs.get("reward_model.enable", "false")) is True:
        notes.append("verl reward_model.enable: " + (
            "the reward model's weights on the GPUs (Megatron) are not in the prediction (an under-estimate)"
            if pairs.get("reward_model.strategy", "megatron" if megatron else "fsdp") == "megatron" else
            "the reward model's parameters live in host memory (FSDP CPUOffload) and come to the GPUs for scoring, "
            "not while the actor trains"))


def _verl_offloaded_when_idle(pairs: Mapping[str, str], role: str, what: str, raw: dict[str, Setting],
                              notes: list[str], where: str) -> bool:
    """Whether verl moves ``role``'s parameters and optimizer to host memory between its calls (both
    ``param_offload`` and ``optimizer_offload``, under ``fsdp_config`` or ``megatron``): it loads them back before
    its own update (fsdp_workers.py update_actor / update_critic: load_fsdp_model_to_gpu, load_fsdp_optimizer), so
    they are on the GPUs at its own peak and away while another model trains. One of the two alone: resident, noted.
    FSDP2's ``offload_policy`` (CPUOffloadPolicy) offloads during training itself: CPU offload."""
    base = f"{role}.fsdp_config" if role.startswith("actor") else f"{role}.model.fsdp_config"
    flags = {name: any(to_bool(pairs.get(f"{prefix}.{name}", "false")) is True
                       for prefix in (base, f"{role}.megatron"))
             for name in ("param_offload", "optimizer_offload")}
    if to_bool(pairs.get(f"{base}.offload_policy", "false")) is True and role.startswith("actor"):
        raw.setdefault("offload", Setting("params+optimizer", f"verl override {base}.offload_policy=True (FSDP2 "
                                                              "CPUOffloadPolicy: offloaded while training)", where))
        return False
    if all(flags.values()):
        notes.append(f"verl: {what}'s parameters and optimizer go to host memory between its calls and come back for "
                     "its update (param_offload and optimizer_offload): on the GPUs at its own peak")
        return True
    if any(flags.values()):
        notes.append(f"verl: {what}'s {'parameters' if flags['param_offload'] else 'optimizer states'} go to host "
                     "memory between its calls; predicted on the GPUs throughout (an over-estimate where another "
                     "model trains meanwhile)")
    return False


def _verl_megatron(pairs: Mapping[str, str], raw: dict[str, Setting], notes: list[str], where: str,
                   config_name: str) -> None:
    """verl's Megatron strategy for the actor (_generated_ppo_megatron_trainer.yaml @ 00bbce4; megatron_utils.py
    get_model): tensor / pipeline / context parallel sizes (1 each by default), the distributed optimizer (on by
    default: fp32 main parameters and Adam states sharded over data parallel, the bf16 parameters and fp32 gradient
    buffer whole: read as ZeRO-1), no recompute unless ``override_transformer_config.recompute_granularity`` sets
    it."""
    base = "actor_rollout_ref.actor.megatron"
    source = f"verl Megatron ({'--config-name ' + config_name if config_name else 'actor strategy megatron'})"
    for key, name in (("tensor_model_parallel_size", "tensor_parallel"),
                      ("pipeline_model_parallel_size", "pipeline_parallel"),
                      ("context_parallel_size", "context_parallel")):
        if (count := launch_count(pairs.get(f"{base}.{key}", "1"))) and count > 1:
            raw.setdefault(name, Setting(count, f"verl override {base}.{key}={count}", where))
    distributed = to_bool(pairs.get(f"{base}.use_distributed_optimizer", "true")) is not False
    raw.setdefault("_zero_stage", Setting(1 if distributed else 0, f"{source}: use_distributed_optimizer "
                                                                   f"{'True' if distributed else 'False'}", where))
    granularity = pairs.get(f"{base}.override_transformer_config.recompute_granularity", "null")
    text = str(granularity).strip().lower()
    raw.setdefault("gradient_checkpointing", Setting(
        {"full": "full", "selective": "selective"}.get(text, "none"),
        f"verl override {base}.override_transformer_config.recompute_granularity={granularity}"
        if text not in ("null", "none", "") else f"{source}: recompute_granularity null (no recompute)", where))
    notes.append(f"{source}: the distributed optimizer read as ZeRO-1 (bf16 parameters whole on each GPU, fp32 masters "
                 "and Adam states sharded)")
    # megatron_utils.py make_megatron_module: DistributedDataParallelConfig(grad_reduce_in_fp32=True, ...) updated by
    # override_ddp_config; Megatron-Core's optimizer is Transformer Engine's / apex's fused Adam
    fp32 = to_bool(pairs.get(f"{base}.override_ddp_config.grad_reduce_in_fp32", "true")) is not False
    raw.setdefault("fp32_gradients", Setting(fp32, f"{source}: DDP grad_reduce_in_fp32 {fp32} (an fp32 gradient "
                                                   "buffer, kept between updates)" if fp32 else
                                             f"verl override {base}.override_ddp_config.grad_reduce_in_fp32=False",
                                             where))
    raw.setdefault("fused_optimizer", Setting(True, f"{source}: Megatron-Core's fused Adam", where))
    raw.setdefault("framework", Setting("megatron", f"{source}: the actor trains through Megatron-Core", where))


def _verl_micro_batch(pairs: Mapping[str, str], role: str, world: int, length: int | None, token_budget: int,
                      critic: bool, sp: int = 1) -> tuple[int, str] | None:
    """verl's micro-batch per GPU for ``role`` (``actor_rollout_ref.actor`` or ``critic``) and where it came from:
    with ``use_dynamic_bsz`` (the critic's defaults to the actor's) micro-batches are packed to
    ``ppo_max_token_len_per_gpu`` real tokens (``token_budget`` by default; seqlen_balancing.py
    rearrange_micro_batches), read as that many tokens over the trained length, rounded up; else
    ``ppo_micro_batch_size_per_gpu``, or the deprecated global ``ppo_micro_batch_size`` over the ``world`` GPUs / the
    Ulysses size ``sp`` (fsdp_workers.py divides it by device_mesh.size() // ulysses_sequence_parallel_size)."""
    dynamic = pairs.get(f"{role}.use_dynamic_bsz")
    if dynamic is None and critic:
        dynamic = pairs.get("actor_rollout_ref.actor.use_dynamic_bsz")
    if to_bool(dynamic if dynamic is not None else "false") is True and length:
        # the budget is per GPU: a micro-batch packs budget x sp tokens, which Ulysses splits over the sp ranks
        # (dp_actor.py / dp_critic.py: max_token_len = ppo_max_token_len_per_gpu * ulysses_sequence_parallel_size)
        budget = launch_count(pairs.get(f"{role}.ppo_max_token_len_per_gpu", str(token_budget))) or token_budget
        return max(1, math.ceil(budget * sp / length)), (
            f"verl {role}.use_dynamic_bsz: micro-batches packed to ppo_max_token_len_per_gpu {budget:,} tokens"
            + (f" x Ulysses {sp}" if sp > 1 else "") + f", {length:,}-token sequences (rounded up)")
    if f"{role}.ppo_micro_batch_size_per_gpu" in pairs:
        value = pairs[f"{role}.ppo_micro_batch_size_per_gpu"]
        count = launch_count(value)
        return (count, f"verl override {role}.ppo_micro_batch_size_per_gpu={value}") if count else None
    total = launch_count(pairs.get(f"{role}.ppo_micro_batch_size", ""))
    if total:
        ranks = max(1, world // sp)
        return max(1, total // ranks), (f"verl {role}.ppo_micro_batch_size {total} (global) over {ranks} data-"
                                        "parallel ranks (trainer.n_gpus_per_node x trainer.nnodes"
                                        + (f" / Ulysses {sp}" if sp > 1 else "") + ")"
                                        + ("; verl computes 0 here and fails, 1 assumed" if total < ranks else ""))
    return None


def _verl_critic(pairs: Mapping[str, str], raw: dict[str, Setting], notes: list[str], where: str, world: int,
                 length: int | None, megatron: bool = False) -> bool:
    """verl's PPO critic: trained on the actor's GPUs (every role is colocated in one resource pool by default) when
    the advantage estimator is gae (critic.enable unset) or critic.enable is true; its own micro-batch, checkpointing
    (on by default under FSDP) and LoRA (``critic.model.lora_rank``: noted, predicted in full). Whether it goes to host
    memory between its calls (:func:`_verl_offloaded_when_idle`) is returned."""
    enable = pairs.get("critic.enable")
    estimator = pairs.get("algorithm.adv_estimator", "gae")
    if (to_bool(enable) is not True) if enable is not None else estimator != "gae":
        return False
    label = f"verl critic (algorithm.adv_estimator {estimator})" if enable is None else "verl critic.enable=True"
    if "critic.model.path" in pairs:
        raw.setdefault("critic_model", Setting(pairs["critic.model.path"], f"{label}: critic.model.path="
                                               f"{pairs['critic.model.path']}", where))
    elif "model" in raw:
        raw.setdefault("critic_model", Setting(raw["model"].value, f"{label}: critic.model.path not given, the "
                                               "actor's model assumed", where))
    else:
        return False
    sp = launch_count(pairs.get("critic.ulysses_sequence_parallel_size", "1")) or 1
    batch = _verl_micro_batch(pairs, "critic", world, length, 32768, True, sp)
    if batch is not None:
        raw.setdefault("critic_micro_batch_size", Setting(batch[0], batch[1], where))
    # the critic's own layout, whatever the actor's (1 each by default: critic.yaml / megatron_critic.yaml)
    layout = [("critic_context_parallel", sp, "critic.ulysses_sequence_parallel_size")]
    if megatron:
        layout += [(name, launch_count(pairs.get(f"critic.megatron.{key}", "1")) or 1, f"critic.megatron.{key}")
                   for name, key in (("critic_tensor_parallel", "tensor_model_parallel_size"),
                                     ("critic_pipeline_parallel", "pipeline_model_parallel_size"))]
    for name, size, key in layout:
        raw.setdefault(name, Setting(size, f"verl {key} {size}" + ("" if key in " ".join(pairs) else " (default)"),
                                     where))
    raw.setdefault("critic_offload", Setting("none", "verl critic: no CPU offload while it trains (its "
                                                     "fsdp_config.offload_policy default False)", where))
    key = "critic.model.enable_gradient_checkpointing"
    if not megatron or key in pairs:
        raw.setdefault("critic_gradient_checkpointing", Setting(
            to_bool(pairs[key]) is True if key in pairs else True,
            f"verl override {key}={pairs[key]}" if key in pairs else f"verl default {key} True", where))
    if (launch_count(pairs.get("critic.model.lora_rank", "0")) or 0) > 0:
        notes.append(f"{label}: critic.model.lora_rank {pairs['critic.model.lora_rank']}: the critic trains an "
                     "adapter; predicted in full (an over-estimate)")
    return _verl_offloaded_when_idle(pairs, "critic", "the critic", raw, notes, where)


# PyTorch Lightning's Trainer(precision=...) values (lightning/fabric/connector.py _PRECISION_INPUT, with the 1.x
# spellings it still maps) and the TrainingSpec precision each trains in
_LIGHTNING_PRECISION = {"16": "16-mixed", "16-mixed": "16-mixed", "bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed",
                        "16-true": "16-true", "bf16-true": "bf16-true", "32": "32-true", "32-true": "32-true"}


def _lightning_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """PyTorch Lightning's Trainer arguments as scripts and LightningCLI take them (``--precision 16``,
    ``--strategy deepspeed_stage_2``, ``--trainer.precision bf16-mixed``, ``--trainer.strategy fsdp``,
    ``--accumulate_grad_batches``), and ``fabric run`` / ``lightning run model`` with the same names: read only with
    Lightning's own values, so that another tool's ``--precision`` or ``--strategy`` is not taken for them. They were
    not read at all ("the job does not say")."""
    values = _flag_values(tokens)
    strategy = values.get("strategy") or values.get("trainer.strategy")
    precision = values.get("precision") or values.get("trainer.precision")
    name = str(strategy[0]).strip().lower() if strategy is not None else ""
    # Trainer(strategy=...) names (lightning/pytorch/strategies/deepspeed.py register_strategies, fsdp.py):
    # deepspeed_stage_{1,2,3}[_offload[_nvme]], read as the DeepSpeed config names are
    stage, offload = deepspeed_stage_from_name(name) if name.startswith("deepspeed_stage_") else (None, False)
    lightning = stage is not None or name.startswith(("fsdp", "ddp")) or "trainer.precision" in values
    if precision is not None and str(precision[0]).strip().lower() in _LIGHTNING_PRECISION and (
            lightning or any(basename(t) in ("fabric", "lightning") for t in tokens[:2])):
        raw.setdefault("_lightning_precision", Setting(_LIGHTNING_PRECISION[str(precision[0]).strip().lower()],
                                                       f"Lightning {precision[1]}", where))
    if not lightning:
        return
    label = f"Lightning {strategy[1]}" if strategy is not None else "Lightning"
    if stage is not None:
        raw.setdefault("_zero_stage", Setting(stage, label, where))
        if offload:
            raw.setdefault("offload", Setting("params+optimizer" if stage == 3 else "optimizer", label, where))
        # Lightning's DeepSpeedStrategy builds the ZeRO section from its own defaults (strategies/deepspeed.py
        # __init__: overlap_comm True, contiguous_gradients True, reduce_bucket_size and allgather_bucket_size
        # 200_000_000), not DeepSpeed's (5e8, overlap off at ZeRO-2)
        section = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                   "reduce_bucket_size": 200_000_000, "allgather_bucket_size": 200_000_000}
        raw.setdefault("_zero_optimization", Setting(section, f"{label} (Lightning's DeepSpeedStrategy defaults)",
                                                     where))
    elif name.startswith("fsdp"):
        raw.setdefault("_use_fsdp", Setting(True, label, where))
    accumulate = values.get("accumulate_grad_batches") or values.get("trainer.accumulate_grad_batches")
    if accumulate is not None and (count := launch_count(accumulate[0])):
        raw.setdefault("grad_accum_steps", Setting(count, f"Lightning {accumulate[1]}", where))


# unsloth-cli.py's LoRA targets: FastLanguageModel.get_peft_model(target_modules=[...]), hard-coded
_UNSLOTH_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _unsloth_cli_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """Unsloth's starter script ``unsloth-cli.py`` (argparse @ unslothai/unsloth 066c227): LoRA always
    (``get_peft_model``) with ``--r`` (16), ``--lora_alpha`` (16), ``--lora_dropout`` (0) on the seven projections it
    names; ``--use_gradient_checkpointing`` ("unsloth": checkpointing with the kept inputs in host memory; "True" /
    "False"); 4-bit with ``--load_in_4bit``; ``--per_device_train_batch_size`` 2, ``--gradient_accumulation_steps``
    4, ``--optim`` adamw_8bit, ``--max_seq_length`` 2048 (SFTTrainer without packing: padded batches up to it),
    ``--max_steps`` 400; bf16 where the GPU has it (``bf16=is_bfloat16_supported()``); ``--model_name``
    unsloth/llama-3-8b. Its ``--r`` read as nothing, and its rank and targets as PEFT's (8 on q/v) before."""
    values = _flag_values(tokens)
    label = "unsloth-cli.py default"
    if "model" not in raw:
        raw["model"] = Setting("llama-3-8b", f"{label} --model_name unsloth/llama-3-8b (Llama-3-8B)", where)
    rank = values.get("r")
    raw["lora.rank"] = Setting(rank[0], rank[1], where) if rank is not None else Setting(16, f"{label} --r 16", where)
    raw["_peft"] = Setting(True, "unsloth-cli.py (FastLanguageModel.get_peft_model: LoRA always)", where)
    raw["lora.target_modules"] = Setting(list(_UNSLOTH_TARGETS), "unsloth-cli.py get_peft_model target_modules "
                                                                 "(the seven projections, hard-coded)", where)
    checkpointing = values.get("use_gradient_checkpointing", ("unsloth", f"{label} --use_gradient_checkpointing "
                                                                         "unsloth"))
    offloaded = str(checkpointing[0]).strip().strip("'\"").lower() == "unsloth"
    raw["gradient_checkpointing"] = Setting(offloaded or to_bool(checkpointing[0]) is True, checkpointing[1], where)
    if offloaded:
        raw["activation_offloading"] = Setting(True, f"{checkpointing[1]} (Unsloth's checkpointing keeps the "
                                                     "checkpointed inputs in host memory)", where)
    applied = _fill_defaults(raw, (("lora.alpha", 16, "--lora_alpha 16"), ("lora.dropout", 0.0, "--lora_dropout 0"),
                                   ("micro_batch_size", 2, "--per_device_train_batch_size 2"),
                                   ("grad_accum_steps", 4, "--gradient_accumulation_steps 4"),
                                   ("optimizer", "adamw-8bit", "--optim adamw_8bit"),
                                   ("seq_len", 2048, "--max_seq_length 2048"), ("steps", 400, "--max_steps 400")),
                             label, where)
    if not any(k in raw for k in _PRECISION_KEYS):
        raw["_bf16"] = Setting(True, "unsloth-cli.py TrainingArguments(bf16=is_bfloat16_supported()): bf16 on GPUs "
                                     "that have it (Ampere and later)", where)
        applied.append("bf16")
    if applied:
        notes.append(f"unsloth-cli.py defaults where the command sets none: {', '.join(applied)}")


# Meta's llama-cookbook (llama-recipes) finetuning entry point and the flags only it takes
_LLAMA_COOKBOOK_FLAGS = ("--enable_fsdp", "--batch_size_training", "--context_length", "--batching_strategy",
                         "--peft_method", "--one_gpu", "--fsdp_config.")


def _is_llama_cookbook(tokens: Sequence[str]) -> bool:
    """``finetuning.py`` (recipes/quickstart, getting-started/finetuning) or ``-m llama_recipes.finetuning`` /
    ``llama_cookbook.finetuning``, with at least one flag of its train_config / fsdp_config."""
    script = any(basename(t) == "finetuning.py" or t.endswith(("llama_recipes.finetuning",
                                                                          "llama_cookbook.finetuning"))
                 for t in tokens)
    return script and any(t.startswith(_LLAMA_COOKBOOK_FLAGS) for t in tokens)


def _llama_cookbook_defaults(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """llama-cookbook's own defaults where the command sets none (src/llama_cookbook/configs/training.py, fsdp.py,
    peft.py @ meta-llama/llama-recipes 341539a): batch_size_training 4; batching_strategy "packing" to
    context_length 4096 (every sample a full 4,096-token block; "padding" pads each batch to its longest sample); under
    --enable_fsdp, fsdp_activation_checkpointing True, which finetuning.py applies (apply_fsdp_checkpointing); with
    --use_peft, peft_method lora with r 8, alpha 32, q_proj and v_proj, dropout 0.05. Read before as the TrainingSpec's
    defaults: 2,048 tokens, no checkpointing (Llama-3-8B on 2 x 8 GPUs: 142.8 GiB, fitting no GPU, for 65.4)."""
    label = "llama-cookbook default"
    applied = _fill_defaults(raw, (("micro_batch_size", 4, "batch_size_training 4"),), label, where)
    strategy = _flag_values(tokens).get("batching_strategy")
    if strategy is not None and str(strategy[0]).strip().lower() == "padding":
        raw.setdefault("sequence_lengths", Setting("variable", f"{strategy[1]} padding (each batch padded to its "
                                                               "longest sample)", where))
        if "seq_len" not in raw:
            notes.append(f"{strategy[1]} padding: batches are as long as their longest sample, up to the data's "
                         "longest; 4,096 (context_length's default) assumed")
            raw["seq_len"] = Setting(4096, f"{label} context_length 4096 (padding: the longest sample assumed "
                                           "under it)", where)
    else:
        applied += _fill_defaults(raw, (("seq_len", 4096, "context_length 4096 (packing)"),), label, where)
    fsdp = raw.get("_use_fsdp")
    if fsdp is not None and fsdp.value is True:
        ckpt = _flag_values(tokens).get("fsdp_config.fsdp_activation_checkpointing")
        if ckpt is not None:
            raw["gradient_checkpointing"] = Setting(to_bool(ckpt[0]) is not False, ckpt[1], where)
        else:
            applied += _fill_defaults(raw, (("gradient_checkpointing", True,
                                             "fsdp_activation_checkpointing True (under --enable_fsdp)"),),
                                      label, where)
    peft = raw.get("_peft")
    if peft is not None and peft.value is True:
        applied += _fill_defaults(raw, (("lora.rank", 8, "lora_config r 8"), ("lora.alpha", 32, "lora_alpha 32"),
                                        ("lora.target_modules", ["q_proj", "v_proj"], "target_modules q_proj, v_proj"),
                                        ("lora.dropout", 0.05, "lora_dropout 0.05")), label, where)
    if applied:
        notes.append(f"llama-cookbook defaults where its command sets none: {', '.join(applied)}")


def _research_scripts(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """Training scripts of research codebases that take HF-style flags but train differently from what the flags say:
    - allenai/open-instruct ``dpo_tune_cache.py`` / ``dpo_tune.py`` / ``dpo.py``: DPO with the chosen and rejected
      sequences forwarded together (FlatArguments.concatenated_forward True); ``dpo_tune_cache`` computes the reference
      log-probabilities before training, so no reference model is resident while it trains;
    - open-instruct ``reward_modeling.py``: a one-label sequence classifier scoring ``torch.cat((chosen, rejected))``,
      ``--max_token_length`` (default 512) the length, torch's foreach AdamW;
    - DeepSpeed-Chat (``step1_supervised_finetuning`` / ``step2_reward_model_finetuning`` ``main.py``): ``--offload``
      puts parameters and optimizer on the CPU (utils/ds_utils.py get_train_ds_config: both offload devices "cpu";
      DeepSpeed uses the parameter offload at ZeRO-3 only), and step 2 is a reward model (a value head on the base,
      ``DataCollatorReward`` concatenating the chosen and rejected batches)."""
    pairs = _flag_values(tokens)
    paths = [t for t in tokens if t.endswith(".py")]
    name = basename(paths[0]) if paths else ""
    open_instruct = any("open_instruct" in p for p in paths)
    if open_instruct and name in ("dpo_tune_cache.py", "dpo_tune.py", "dpo.py"):
        raw.setdefault("_rl", Setting("dpo", f"open-instruct {name} (chosen and rejected forwarded together)", where))
        if name == "dpo_tune_cache.py":
            raw.setdefault("reference_model", Setting(False, "open-instruct dpo_tune_cache.py (reference log-probs "
                                                             "cached before training)", where))
    if open_instruct and name == "reward_modeling.py":
        raw.setdefault("_rl", Setting("reward", "open-instruct reward_modeling.py (chosen and rejected scored "
                                                "together)", where))
        length = pairs.get("max_token_length")
        raw.setdefault("seq_len", Setting(length[0] if length else 512, length[1] if length else
                                          "open-instruct default --max_token_length 512", where))
        raw.setdefault("fused_optimizer", Setting(False, "open-instruct reward_modeling.py (torch.optim.AdamW, "
                                                         "foreach)", where))
    # DeepSpeed-Chat's scripts are main.py run from their step's folder: known by their paths or by their own flags
    # (--zero_stage with the store_true --deepspeed; step 2's --num_padding_at_beginning)
    chat = any("step1_supervised_finetuning" in p or "step2_reward_model_finetuning" in p or "DeepSpeed-Chat" in p
               for p in paths) or (name == "main.py" and "zero_stage" in pairs and "deepspeed" in pairs)
    if chat and (off := pairs.get("offload")) is not None and to_bool(off[0]) is not False:
        raw["_offload_optimizer"] = Setting("cpu", off[1], where)
        raw["_offload_param"] = Setting("cpu", off[1], where)
    if chat and (any("step2_reward_model_finetuning" in p for p in paths) or "num_padding_at_beginning" in pairs):
        raw.setdefault("_rl", Setting("reward", "DeepSpeed-Chat step 2 (a reward model: chosen and rejected "
                                                "concatenated)", where))
    if chat:
        _deepspeed_chat_precision_and_lora(pairs, raw, notes, where)


def _deepspeed_chat_precision_and_lora(pairs: Mapping[str, tuple[str, str]], raw: dict[str, Setting],
                                       notes: list[str], where: str) -> None:
    """DeepSpeed-Chat's own precision and LoRA (DeepSpeedExamples applications/DeepSpeed-Chat, dschat/utils):
    - ``--dtype`` (fp16 by default; older versions have no flag and always fp16) is DeepSpeed's mixed precision
      (ds_utils.get_train_ds_config writes an ``fp16`` or ``bfloat16`` section, ``enabled``), not a torch dtype;
    - ``--lora_dim N`` (> 0) wraps every nn.Linear whose name contains ``--lora_module_name`` (default
      ``decoder.layers.``, OPT's blocks; the Llama scripts pass ``layers.``) in LinearLayer_LoRA of rank N, dropout 0,
      the wrapped weight frozen; the rest (embeddings, head, norms) stays trainable unless ``--only_optimize_lora``."""
    dtype = raw.pop("_dtype", None)
    half = str(dtype.value).strip().lower() if dtype is not None else "fp16"
    source = (f"{dtype.source} {dtype.value} (DeepSpeed-Chat: DeepSpeed's {half} mixed precision)" if dtype is not None
              else "DeepSpeed-Chat default --dtype fp16 (DeepSpeed fp16 mixed precision, ds_utils.get_train_ds_config)")
    if half in ("bf16", "bfloat16"):
        raw.setdefault("_bf16", Setting(True, source, where))
    elif half == "fp16":
        raw.setdefault("_fp16", Setting(True, source, where))
    elif dtype is not None:
        raw["_dtype"] = dtype  # a value DeepSpeed-Chat's choices refuse: left to the dtype check's error
    rank = pairs.get("lora_dim")
    dim = launch_count(rank[0]) if rank is not None else None
    if rank is None or dim is None:
        return
    scope_given = pairs.get("lora_module_name")
    scope = scope_given[0] if scope_given else "decoder.layers."
    what = f"{rank[1]} {dim} (DeepSpeed-Chat LinearLayer_LoRA)"
    raw["_peft"] = Setting(True, what, where)
    raw["lora.rank"] = Setting(dim, what, where)
    raw.setdefault("lora.dropout", Setting(0.0, "DeepSpeed-Chat LinearLayer_LoRA lora_droppout 0", where))
    raw.setdefault("lora.alpha", Setting(dim, f"{what}: lora_scaling 1 / lora_dim (alpha = rank)", where))
    named = scope_given[1] if scope_given else "DeepSpeed-Chat default --lora_module_name"
    raw.setdefault("lora.target_modules", Setting("all-linear", f"{named} {scope!r}: every linear in the blocks",
                                                  where))
    if not any(part in scope for part in ("layers", ".h.", "blocks", "decoder")):
        notes.append(f"DeepSpeed-Chat --lora_module_name {scope!r}: the linears of that scope are read as every "
                     "linear in the blocks (an upper estimate of the adapters)")
    if "only_optimize_lora" not in pairs:
        # without --only_optimize_lora only the wrapped weights are frozen: the embeddings and the head still train
        # (in place; PEFT's modules_to_save trains a copy, so the frozen original counted here is an over-estimate of
        # one embedding's weights)
        raw.setdefault("lora.modules_to_save", Setting(["embed_tokens", "lm_head"], f"{what} without "
                                                       "--only_optimize_lora: embeddings and head still trained",
                                                       where))


# The seven projections of a Llama-type block: the LoRA targets several scripts hard-code
_SEVEN_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# TRL's scripts by name (trl/scripts, the handbook's scripts/): under a scripts/ folder they parse TRL's ModelConfig
_TRL_SCRIPT_NAMES = ("sft.py", "dpo.py", "orpo.py", "kto.py", "grpo.py", "rloo.py", "reward_modeling.py", "ppo.py",
                     "gkd.py", "cpo.py", "online_dpo.py")


def _uses_trl_model_config(tokens: Sequence[str]) -> bool:
    """A script that parses TRL's ModelConfig: TRL's own scripts (trl/scripts, examples/scripts) and the
    alignment-handbook's (scripts/run_sft.py, run_dpo.py, ...: TrlParser with ModelConfig)."""
    scripts = [t for t in tokens if t.endswith(".py")]
    return any("trl/" in t or "examples/scripts/" in t or "alignment-handbook" in t for t in scripts) or any(
        basename(t) in ("run_sft.py", "run_dpo.py", "run_orpo.py", "run_cpt.py", "run_distill.py") or (
            PurePosixPath(t).parent.name == "scripts" and basename(t) in _TRL_SCRIPT_NAMES) for t in scripts)


def _qlora_repo_defaults(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """artidoro/qlora's ``qlora.py`` (commit 00e5ad2, the Guanaco scripts' entry point), whose argument dataclasses
    set: ``--bits`` 4 (``load_in_4bit=args.bits == 4``), ``--double_quant`` True, ``--quant_type`` nf4, LoRA on every
    4-bit linear but lm_head (find_all_linear_names) with ``--lora_r`` 64, ``--lora_alpha`` 16, ``--lora_dropout``
    0.0 unless ``--full_finetune``; sources up to ``--source_max_len`` (1024) plus targets up to
    ``--target_max_len`` (256), each batch padded to its longest (DataCollatorForCausalLM); ``gradient_checkpointing``
    True, ``optim`` paged_adamw_32bit, batch 1 x 16 accumulated."""
    pairs = _flag_values(tokens)
    scripts = [t for t in tokens if t.endswith(".py")]
    if not scripts or basename(scripts[0]) != "qlora.py" or not (
            {"bits", "double_quant", "source_max_len", "target_max_len", "quant_type", "full_finetune"} & set(pairs)):
        return
    what = "artidoro/qlora qlora.py"
    applied: list[str] = []

    def default(field: str, value: Any, flag: str) -> None:
        if field not in raw:
            raw[field] = Setting(value, f"{what} default --{flag}", where)
            applied.append(f"--{flag} {value}")

    full = to_bool(pairs["full_finetune"][0]) is True if "full_finetune" in pairs else False
    if not full:
        raw.setdefault("_peft", Setting(True, f"{what} (LoRA unless --full_finetune)", where))
        default("_quant_bits", 4, "bits")
        default("_double", True, "double_quant")
        default("_quant_type", "nf4", "quant_type")
        default("lora.rank", 64, "lora_r")
        default("lora.alpha", 16, "lora_alpha")
        default("lora.dropout", 0.0, "lora_dropout")
        raw["lora.target_modules"] = Setting("all-linear", f"{what} (find_all_linear_names: every linear but "
                                                           "lm_head)", where)
    default("gradient_checkpointing", True, "gradient_checkpointing")
    default("micro_batch_size", 1, "per_device_train_batch_size")
    default("grad_accum_steps", 16, "gradient_accumulation_steps")
    if "optimizer" not in raw:
        raw["optimizer"] = Setting("adamw", f"{what} default --optim paged_adamw_32bit (fp32 states, paged)", where)
        applied.append("--optim paged_adamw_32bit")
    source, target = (launch_count(pairs[k][0]) if k in pairs else d for k, d in (("source_max_len", 1024),
                                                                                   ("target_max_len", 256)))
    if source is not None and target is not None and "seq_len" not in raw:
        raw["seq_len"] = Setting(source + target, f"{what} --source_max_len {source} + --target_max_len {target}",
                                 where)
        raw["sequence_lengths"] = Setting("variable", f"{what} (DataCollatorForCausalLM pads to the longest)", where)
    if applied:
        notes.append(f"{what} defaults where the command sets none: {', '.join(applied)}")


def _script_lora_defaults(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """The LoRA settings that widely copied fine-tuning scripts hard-code or default, where the command leaves them:
    - tloen/alpaca-lora ``finetune.py`` (fire flags ``--base_model``, ``--micro_batch_size``, ``--cutoff_len``): LoRA
      always, over a base loaded in 8 bits (``load_in_8bit=True``), with PEFT's ``prepare_model_for_int8_training``
      turning checkpointing on, fp16 training, ``--batch_size`` (128) / ``--micro_batch_size`` (4) accumulation,
      ``--cutoff_len`` 256, r 8 / alpha 16 / dropout 0.05 on q_proj, v_proj;
    - Qwen's ``finetune.py`` with ``--use_lora`` (QwenLM/Qwen1.5 examples/sft, Qwen2.5 likewise): LoraArguments r 64,
      alpha 16, dropout 0.05 on the seven projections; ``--q_lora`` loads the base in 4 bits (nf4);
    - open-instruct's ``finetune.py`` with ``--use_lora``: ``--lora_rank`` 64, ``--lora_alpha`` 16, ``--lora_dropout``
      0.1 on the seven projections;
    - LongLoRA's ``supervised-fine-tune*.py`` / ``fine-tune.py`` with ``--low_rank_training``: r 8, alpha 16, dropout
      0 on q, k, v, o, with the embeddings (and norms) trained too, checkpointing on in the script; the ``-qlora``
      script loads the base in nf4 with double quantization.
    Any other script's ``--use_lora``: LoRA, its rank and targets unknown (noted)."""
    pairs = _flag_values(tokens)
    scripts = [t for t in tokens if t.endswith(".py")]
    name = basename(scripts[0]) if scripts else ""

    def default(field: str, value: Any, what: str) -> None:
        raw.setdefault(field, Setting(value, what, where))

    if name == "finetune.py" and "base_model" in pairs and ({"micro_batch_size", "cutoff_len", "lora_r",
                                                               "lora_target_modules"} & set(pairs)):
        what = "alpaca-lora finetune.py"
        default("_peft", True, f"{what} (LoRA always)")
        default("_8bit", True, f"{what} (load_in_8bit=True)")
        default("_fp16", True, f"{what} (fp16=True)")
        default("gradient_checkpointing", True, f"{what} (prepare_model_for_int8_training: checkpointing on)")
        default("micro_batch_size", 4, f"{what} default --micro_batch_size 4")
        default("seq_len", 256, f"{what} default --cutoff_len 256")
        default("lora.rank", 8, f"{what} default --lora_r 8")
        default("lora.alpha", 16, f"{what} default --lora_alpha 16")
        default("lora.dropout", 0.05, f"{what} default --lora_dropout 0.05")
        default("lora.target_modules", ["q_proj", "v_proj"], f"{what} default --lora_target_modules")
        total = launch_count(pairs["batch_size"][0]) if "batch_size" in pairs else 128
        micro = launch_count(raw["micro_batch_size"].value)
        if total and micro and "grad_accum_steps" not in raw:
            # gradient_accumulation_steps = batch_size // micro_batch_size, divided again by the DDP world size
            raw.setdefault("_global_batch_size", Setting(total, f"{what} --batch_size {total} (global)", where))
        return
    peft = raw.get("_peft")
    switch = next((k for k in ("use_lora", "low_rank_training") if k in pairs), None)
    if switch is None or peft is None or peft.value is not True:
        return
    if switch == "low_rank_training" or "longlora" in " ".join(scripts).lower() or name.startswith(
            "supervised-fine-tune"):
        what = f"LongLoRA {name or 'script'} --low_rank_training"
        default("lora.rank", 8, f"{what} (LoraConfig r 8)")
        default("lora.alpha", 16, f"{what} (lora_alpha 16)")
        default("lora.dropout", 0.0, f"{what} (lora_dropout 0)")
        default("lora.target_modules", ["q_proj", "k_proj", "v_proj", "o_proj"], f"{what} (q, k, v, o)")
        default("lora.modules_to_save", ["embed_tokens"], f"{what} (trainable_params embed,norm)")
        default("gradient_checkpointing", True, f"{what} (gradient_checkpointing_enable in the script)")
        if "qlora" in name:
            default("_4bit", True, f"LongLoRA {name} (nf4 base)")
            default("_double", True, f"LongLoRA {name} (bnb_4bit_use_double_quant=True)")
        return
    open_instruct = any("open_instruct" in p or "open-instruct" in p for p in scripts) or (
        name == "finetune.py" and "use_flash_attn" in pairs)
    qwen = name == "finetune.py" and "model_max_length" in pairs
    if open_instruct:
        what = "open-instruct finetune.py --use_lora"
        default("lora.rank", 64, f"{what} (--lora_rank default 64)")
        default("lora.alpha", 16, f"{what} (--lora_alpha default 16)")
        default("lora.dropout", 0.1, f"{what} (--lora_dropout default 0.1)")
        default("lora.target_modules", list(_SEVEN_PROJECTIONS), f"{what} (the seven projections)")
    elif qwen:
        what = "Qwen finetune.py --use_lora"
        default("lora.rank", 64, f"{what} (LoraArguments lora_r 64)")
        default("lora.alpha", 16, f"{what} (lora_alpha 16)")
        default("lora.dropout", 0.05, f"{what} (lora_dropout 0.05)")
        default("lora.target_modules", list(_SEVEN_PROJECTIONS), f"{what} (lora_target_modules: the seven "
                                                                  "projections)")
        if "q_lora" in pairs and to_bool(pairs["q_lora"][0]) is True:
            default("_4bit", True, f"{pairs['q_lora'][1]} (Qwen finetune.py: the base in nf4)")
    elif not any(k in raw for k in ("lora.rank", "lora.target_modules")):
        notes.append(f"{pairs[switch][1]}: LoRA, the script's own rank and targets unknown (set lora in the "
                     "vramfit.io/spec annotation)")


# transformers' task example scripts (examples/pytorch/*): the task their Auto class trains (None: the model's own,
# causal or seq2seq LM) and the input length their DataTrainingArguments / argparse default to (None: the tokenizer's
# limit, which the model's position table stands for). Question answering puts a 2-output span head on every token
# (AutoModelForQuestionAnswering: qa_outputs = Linear(hidden, 2)), the per-token tiny head of token-classification;
# multiple choice scores each ending as a sequence with a one-output head (seq-classification, the batch x its
# choices: _MULTIPLE_CHOICE). Defaults read at transformers 0055f834 (run_glue), 03ea97ae (run_qa), 00e6a185
# (run_summarization; run_translation has the same 1024/128).
_TASK_SCRIPTS: dict[str, tuple[str | None, int | None, str]] = {
    "run_glue.py": ("seq-classification", 128, "max_seq_length 128 (padded to it)"),
    "run_glue_no_trainer.py": ("seq-classification", 128, "max_length 128"),
    "run_classification.py": ("seq-classification", 128, "max_seq_length 128 (padded to it)"),
    "run_ner.py": ("token-classification", None, ""),
    "run_ner_no_trainer.py": ("token-classification", None, ""),
    "run_mlm.py": ("masked-lm", None, ""),
    "run_mlm_no_trainer.py": ("masked-lm", None, ""),
    "run_qa.py": ("token-classification", 384, "max_seq_length 384 (padded to it)"),
    "run_qa_beam_search.py": ("token-classification", 384, "max_seq_length 384 (padded to it)"),
    "run_qa_no_trainer.py": ("token-classification", 384, "max_seq_length 384"),
    "run_qa_beam_search_no_trainer.py": ("token-classification", 384, "max_seq_length 384"),
    "run_swag.py": ("seq-classification", None, ""),
    "run_swag_no_trainer.py": ("seq-classification", 128, "max_seq_length 128"),
    "run_summarization.py": (None, 1024, "max_source_length 1024"),
    "run_summarization_no_trainer.py": (None, 1024, "max_source_length 1024"),
    "run_translation.py": (None, 1024, "max_source_length 1024"),
    "run_translation_no_trainer.py": (None, 1024, "max_source_length 1024"),
    "run_seq2seq_qa.py": (None, 384, "max_seq_length 384"),
}
_SCRIPT_TASKS = {name: task for name, (task, _, _) in _TASK_SCRIPTS.items() if task is not None}
# SWAG's endings per example: run_swag*.py build four choices per context (ending0..ending3)
_MULTIPLE_CHOICE = {"run_swag.py": 4, "run_swag_no_trainer.py": 4}


def _task_script_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str,
                          all_read: bool) -> None:
    """What a transformers task script trains where its command leaves it out: its input length (``_TASK_SCRIPTS``);
    for a ``*_no_trainer.py`` script, argparse's per-device batch of 8 and, with no ``--mixed_precision`` and no
    accelerate config to say otherwise, fp32 (accelerate's mixed_precision defaults to "no", as ``Accelerator()``
    does); for multiple choice, every ending a sequence of the micro-batch."""
    script = next((basename(t) for t in tokens if basename(t) in _TASK_SCRIPTS), None)
    if script is None:
        return
    label = f"transformers' {script} default"
    _, length, what = _TASK_SCRIPTS[script]
    applied = _fill_defaults(raw, (("seq_len", length, what),), label, where) if length else []
    if script.endswith("_no_trainer.py") and "model" in raw:
        applied += _fill_defaults(raw, (("micro_batch_size", 8, "per_device_train_batch_size 8"),), label, where)
        if all_read and not any(k in raw for k in _PRECISION_KEYS):
            raw["_dtype"] = Setting("float32", "accelerate's default mixed_precision \"no\" (no --mixed_precision, "
                                               "no accelerate config): fp32", where)
            applied.append("fp32 (accelerate's mixed_precision \"no\")")
    if applied:
        notes.append(f"{script} defaults where the command sets none: {', '.join(applied)}")
    choices = _MULTIPLE_CHOICE.get(script)
    batch = raw.get("micro_batch_size")
    if choices and batch is not None and (count := launch_count(batch.value)):
        raw["micro_batch_size"] = Setting(count * choices, f"{batch.source} x {choices} endings (multiple choice "
                                                           "scores each ending as a sequence)", batch.where)


def _swift_command(tokens: Sequence[str]) -> str | None:
    """``sft`` / ``rlhf`` for ``swift sft ...`` / ``swift rlhf ...`` (ms-swift's CLI) or their scripts
    ``swift/cli/sft.py`` / ``swift/cli/rlhf.py``."""
    names = [basename(t) for t in tokens]
    for command in ("sft", "rlhf"):
        if any(n == "swift" and i + 1 < len(names) and names[i + 1] == command for i, n in enumerate(names[:4])) \
                or any(t.endswith(f"swift/cli/{command}.py") for t in tokens):
            return command
    return None


# ms-swift RLHFArguments rlhf_type (swift/llm/argument/rlhf_args.py; default dpo) as vramfit's preference kinds:
# simpo runs as CPO with the simpo loss (_init_simpo), rm is a pairwise reward model
_SWIFT_RLHF = {"dpo": "dpo", "simpo": "simpo", "orpo": "orpo", "cpo": "cpo", "kto": "kto", "rm": "reward",
               "grpo": "grpo"}


def _swift_rlhf_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """ms-swift's ``swift rlhf --rlhf_type dpo|simpo|orpo|cpo|kto|rm|grpo|ppo|gkd`` (default dpo): the preference
    kinds take the paired forward and, for full training, the reference model that RLHFArguments loads (not for
    cpo/orpo/simpo/rm); GRPO is read as TRL's GRPOTrainer, which ms-swift's trainer extends, with ms-swift's vLLM
    defaults (colocate unless a server is named, vllm_gpu_memory_utilization 0.9, sleep_level 0)."""
    pairs = _flag_values(tokens)
    found = pairs.get("rlhf_type")
    kind = str(found[0]).strip().lower() if found is not None else "dpo"
    label = f"{found[1]} {kind}" if found is not None else "ms-swift default rlhf_type dpo"
    tp = raw.get("tensor_parallel")
    if tp is not None and "tensor_parallel_size" in tp.source:
        # swift rlhf trains without tensor parallelism: --tensor_parallel_size is the vLLM engine's, under its older
        # name (swift/trainers/arguments.py VllmArguments: "compatibility ... tensor_parallel_size")
        del raw["tensor_parallel"]
        notes.append(f"{tp.source} {tp.value}: ms-swift's older name of vllm_tensor_parallel_size (the generation "
                     "engine's), not training tensor parallelism")
    if (sp := pairs.get("sequence_parallel_size")) is not None and launch_count(sp[0]) not in (None, 1):
        raw.setdefault("context_parallel", Setting(sp[0], f"{sp[1]} (ms-swift's Ulysses sequence parallelism)", where))
    if kind == "gkd":
        notes.append(f"{label}: the teacher (--teacher_model) is predicted; GKD's on-policy generation is not")
        return
    mapped = _SWIFT_RLHF.get(kind)
    if mapped is None:
        notes.append(f"{label}: an ms-swift RLHF algorithm vramfit does not model beyond the trained policy (PPO's "
                     "value and reward models are not in the prediction: an under-estimate)")
        return
    raw.setdefault("_rl", Setting(mapped, f"{label} (ms-swift RLHF)", where))
    if mapped != "grpo":
        return
    # ms-swift's GRPO (swift rlhf_args.py _init_grpo and RLHFArguments): --max_length caps the prompt (the maintainers:
    # "max_length refers to the length of the query (prompt) part"), --max_completion_length defaults to 512, beta to
    # 0.04 (a reference model; beta 0 drops it)
    length = raw.get("seq_len")
    if length is not None and "max_length" in length.source:
        raw["_max_prompt_length"] = raw.pop("seq_len")
    raw.setdefault("_max_completion_length", Setting(512, "ms-swift default max_completion_length", where))
    raw.setdefault("_beta", Setting(0.04, "ms-swift default beta for grpo", where))
    if "_vllm_mode" not in raw and "_use_vllm" in raw:
        if "vllm_device" in pairs:  # ms-swift 3.2-3.4: vLLM on its own GPU ("the first GPU training does not use")
            raw["_vllm_mode"] = Setting("server", f"{pairs['vllm_device'][1]} (vLLM on a GPU of its own)", where)
        else:
            server = any(k in pairs for k in ("vllm_server_host", "vllm_server_base_url"))
            raw["_vllm_mode"] = Setting("server" if server else "colocate", "ms-swift vllm_mode default (colocate "
                                        "unless a vllm_server_host / base_url is given)", where)
    sleep = pairs.get("sleep_level")
    if sleep is not None and launch_count(sleep[0]) is not None:
        raw.setdefault("_vllm_sleep", Setting(True, f"{sleep[1]} {sleep[0]}", where))
    raw.setdefault("_vllm_gpu_memory_utilization", Setting(0.9, "ms-swift default vllm_gpu_memory_utilization", where))


# ms-swift 2.x model types (swift/llm/utils/model.py ModelType: qwen1half-7b-chat, qwen2_5-7b-instruct,
# llama3_1-8b-instruct, llama2-7b-chat, gemma2-9b-it, ...) -> catalog name spellings: the family's version written
# with a dot and a dash (the tuned suffix is the merge's to take off)
_SWIFT_FAMILIES = ((r"^qwen1half-", "qwen1.5-"), (r"^qwen2_5-", "qwen2.5-"), (r"^llama3_(\d)-", r"llama-3.\1-"),
                   (r"^llama([23])-", r"llama-\1-"), (r"^gemma([23])-", r"gemma-\1-"),
                   (r"^mistral-7b-v(\d)", r"mistral-7b-v0.\1"), (r"^phi3_5-", "phi-3.5-"), (r"^phi3-", "phi-3-"))


def swift_model_type(model_type: str) -> str | None:
    """An ms-swift 2.x ``--model_type`` as a model name the catalog may know (``qwen2_5-7b-instruct`` ->
    ``qwen2.5-7b-instruct``); None for no model type (a Hub id, a path: ``--model_type`` of 3.x is the template)."""
    name = model_type.strip().lower()
    if not re.fullmatch(r"[a-z][a-z0-9_.]*-[a-z0-9_.-]+", name) or "/" in name:
        return None
    for pattern, spelled in _SWIFT_FAMILIES:
        name = re.sub(pattern, spelled, name)
    return name


def _swift_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """ms-swift's ``swift sft`` (modelscope/ms-swift 3.x, swift/llm/argument): ``--model`` names the model (its
    ``--model_name`` is the self-cognition display name, not a model); ``--train_type`` (default lora; 2.x's
    ``--sft_type``) with ``--quant_bits 4`` is QLoRA; ``--target_modules`` (default all-linear), ``--lora_rank`` (8),
    ``--lora_alpha`` (32), ``--lora_dropout`` (0.05); gradient checkpointing on by default
    (TrainArgumentsMixin.gradient_checkpointing True); ``--max_length``; ``--attn_impl``; the model in
    ``--torch_dtype``, by default the checkpoint's (bf16 for today's models), with the matching bf16/fp16 flag."""
    pairs = _flag_values(tokens)
    model, display = pairs.get("model") or pairs.get("model_id_or_path"), pairs.get("model_name")
    model_type = pairs.get("model_type")
    if model is not None:
        raw["model"] = Setting(model[0], model[1], where)
    elif model_type is not None and (name := swift_model_type(str(model_type[0]))) is not None:
        # ms-swift 2.x: --model_type alone names the model (its MODEL_MAPPING gives the checkpoint)
        raw["model"] = Setting(name, f"{model_type[1]} {model_type[0]} (ms-swift 2.x model type)", where)
    elif display is not None and "model" in raw and raw["model"].source == display[1]:
        del raw["model"]  # --model_name is swift's display name for self-cognition data
        notes.append(f"{display[1]} is ms-swift's self-cognition display name, not the model (its flag is --model)")
    kind = pairs.get("tuner_type") or pairs.get("train_type") or pairs.get("sft_type")  # 4.x: tuner_type
    raw["_finetuning_type"] = Setting(kind[0] if kind else "lora", kind[1] if kind else "ms-swift default "
                                      "train_type lora", where)
    if kind is not None and str(kind[0]).lower() not in ("lora", "full", "qlora"):
        notes.append(f"{kind[1]} {kind[0]}: an ms-swift tuner vramfit does not model; read as "
                     f"{'full fine-tuning' if str(kind[0]).lower() == 'llamapro' else 'LoRA'}")
        raw["_finetuning_type"] = Setting("full" if str(kind[0]).lower() == "llamapro" else "lora", kind[1], where)
    if "sft_type" in pairs and (batch := pairs.get("batch_size")) is not None:
        raw["micro_batch_size"] = Setting(batch[0], batch[1], where)  # 2.x SftArguments batch_size: per device
    bits = pairs.get("quant_bits")
    if bits is not None and str(bits[0]).strip() not in ("", "0", "None"):
        if str(raw["_finetuning_type"].value).lower() == "full":
            notes.append(f"{bits[1]} with full fine-tuning: ms-swift refuses to train quantized weights in full "
                         "(the job does not start as written); read as full fine-tuning of the unquantized model")
        else:
            raw["_quant_bits"] = Setting(str(bits[0]), bits[1], where)
    for key, name, default in (("target_modules", "lora.target_modules", "all-linear"), ("lora_rank", "lora.rank", 8),
                               ("lora_alpha", "lora.alpha", 32), ("lora_dropout", "lora.dropout", 0.05)):
        found = pairs.get(key)
        if found is not None:
            raw[name] = Setting(found[0], found[1], where)
        elif name in raw and str(raw[name].value).upper() in ("DEFAULT", "['DEFAULT']"):
            # 2.x's --lora_target_modules DEFAULT: the model type's attention projections (q/v for most)
            raw[name] = Setting(["q_proj", "v_proj"], f"{raw[name].source} (ms-swift 2.x DEFAULT: the attention "
                                                      "projections)", where)
        else:  # a value read from the flag's other name (2.x's --lora_target_modules, --lora_dropout_p) stays
            raw.setdefault(name, Setting(default, f"ms-swift default {key} {default}", where))
    if "gradient_checkpointing" not in raw:
        raw["gradient_checkpointing"] = Setting(True, "ms-swift default gradient_checkpointing true", where)
    for key, name in (("max_length", "seq_len"), ("attn_impl", "attention")):
        if (found := pairs.get(key)) is not None and str(found[0]).strip() != "-1":
            raw[name] = Setting(attention_name(found[0]) if name == "attention" else found[0], found[1], where)
        elif found is not None:  # 2.x's max_length -1: no limit, the data's longest sample
            raw.pop(name, None)
            notes.append(f"{found[1]} -1: no length limit (the data's longest sample); set seq_len in the "
                         "vramfit.io/spec annotation")
    if "_dtype" not in raw:
        raw["_dtype"] = Setting("bfloat16", "ms-swift default torch_dtype: the checkpoint's (bf16 assumed)", where)
    # ms-swift turns the Trainer's bf16 / fp16 on to match torch_dtype (model_args _init_mixed_precision): under
    # DeepSpeed that is mixed precision with fp32 masters (_deepspeed_masters)
    half = _DTYPES.get(str(raw["_dtype"].value).lower())
    flag = {"bf16": "_bf16", "16": "_fp16"}.get(half or "")
    if flag is not None and flag not in raw:
        raw[flag] = Setting(True, f"{raw['_dtype'].source} (ms-swift sets the Trainer's {half} to match)", where)


# OpenRLHF's trainers (openrlhf/cli/train_<name>.py at OpenRLHF/OpenRLHF f2afba4 / a3be906 / bdf7dfa / abb0475):
# their --micro_train_batch_size and --max_len defaults (every one --zero_stage 2). The reward model forwards a chosen
# and a rejected sequence per sample (RewardModelTrainer: "merged chosen + rejected response forward") through a value
# head; KTO's collate_fn adds one mismatched sample per sample for the KL estimate, forwarded with gradients kept
# (kto_trainer.py compute_model_logps_with_KL): both twice the micro-batch, as DPO's pairs are.
_OPENRLHF_DEFAULTS = {"sft": (8, 2048), "dpo": (8, 512), "rm": (1, 512), "kto": (8, None)}


def _openrlhf_command(tokens: Sequence[str]) -> str | None:
    """``sft``/``dpo``/``rm``/``kto`` when the command runs OpenRLHF's ``openrlhf.cli.train_<name>`` (as a module or a
    script), else None."""
    for token in tokens:
        name = token.removesuffix(".py").replace("/", ".")
        if "openrlhf.cli.train_" in name:
            command = name.rsplit("train_", 1)[-1]
            return command if command in ("sft", "dpo", "rm", "kto", "ppo_ray") else None
    return None


def _openrlhf_ppo_settings(pairs: Mapping[str, tuple[Any, str]], raw: dict[str, Setting], notes: list[str],
                           where: str) -> None:
    """OpenRLHF's ``openrlhf.cli.train_ppo_ray`` (PPO, GRPO, REINFORCE++: one entry point): the actor is what trains,
    ``--pretrain`` on ``--micro_train_batch_size`` sequences of ``--prompt_max_len`` + ``--generate_max_len`` (1,024
    each by default), ``--zero_stage`` (2), ``--gradient_checkpointing``, ``--lora_rank``; ``--init_kl_coef`` (0.01 by
    default) or ``--use_kl_loss`` keep a reference model; with ``--colocate_all_models`` the vLLM engines share the
    GPUs and keep ``--vllm_gpu_memory_utilization`` of each unless ``--vllm_enable_sleep``. PPO
    (``--advantage_estimator`` gae, the default) trains a critic, ``--critic_pretrain`` (else the first
    ``--reward_pretrain``, else ``--pretrain`` with ``--remote_rm_url``), on the actor's GPUs with
    ``--colocate_all_models``, its states resident while the actor trains unless ``--deepspeed_enable_sleep``
    (train_ppo_ray.py @ OpenRLHF 021d1b0). The reward model is noted, not predicted. It was refused with the generic
    no-model error."""
    def put(key: str, field: str) -> None:
        if (found := pairs.get(key)) is not None:
            raw.setdefault(field, Setting(found[0], found[1], where))

    put("pretrain", "model")
    # the actor's DeepSpeed world: RayActorGroup(actor_num_nodes, actor_num_gpus_per_node) in train_ppo_ray.py, whose
    # defaults are 1 node of 8 GPUs; vLLM engines and the models not colocated with it take GPUs of their own
    nodes = pairs.get("actor_num_nodes", (1, "OpenRLHF default --actor_num_nodes 1"))
    per_node = pairs.get("actor_num_gpus_per_node", (8, "OpenRLHF default --actor_num_gpus_per_node 8"))
    world = [launch_count(str(nodes[0])), launch_count(str(per_node[0]))]
    if world[0] and world[1]:
        raw.setdefault(TRAINING_WORLD, Setting(world[0] * world[1], f"{nodes[1]} x {per_node[1]} (the actor's "
                                                                    "DeepSpeed world)", where))
    prompt = pairs.get("prompt_max_len", (1024, "OpenRLHF default --prompt_max_len 1024"))
    new = pairs.get("generate_max_len", (1024, "OpenRLHF default --generate_max_len 1024"))
    lengths = launch_count(str(prompt[0])), launch_count(str(new[0]))
    if lengths[0] and lengths[1] and "seq_len" not in raw:
        raw["seq_len"] = Setting(lengths[0] + lengths[1], f"{prompt[1]} + {new[1]} (the actor trains on prompt and "
                                 "response)", where)
    if "use_dynamic_batch" in pairs and to_bool(pairs["use_dynamic_batch"][0]) is not False and lengths[0] and \
            lengths[1]:
        # packed micro-batches of up to --train_max_tokens_per_gpu tokens (default 16,192), actor and critic alike
        budget = pairs.get("train_max_tokens_per_gpu", (16192, "OpenRLHF default --train_max_tokens_per_gpu 16192"))
        tokens = launch_count(str(budget[0])) or 16192
        raw.setdefault("micro_batch_size", Setting(
            max(1, math.ceil(tokens / (lengths[0] + lengths[1]))), f"{pairs['use_dynamic_batch'][1]}: micro-batches "
            f"packed to {budget[1]} {tokens:,} tokens, {lengths[0] + lengths[1]:,}-token sequences (rounded up)",
            where))
    put("micro_train_batch_size", "micro_batch_size")
    raw.setdefault("micro_batch_size", Setting(4, "OpenRLHF default --micro_train_batch_size 4", where))
    zero = pairs.get("zero_stage", (2, "OpenRLHF default --zero_stage 2"))
    raw.setdefault("_zero_stage", Setting(zero[0], zero[1], where))
    if (found := pairs.get("adam_offload")) is not None and to_bool(found[0]) is not False:
        raw["_offload_optimizer"] = Setting("cpu", found[1], where)  # DeepSpeed's CPU Adam, actor and critic alike
    if (rank := pairs.get("lora_rank")) is not None and (launch_count(str(rank[0])) or 0) > 0:
        raw["_peft"] = Setting(True, rank[1], where)
        raw.setdefault("lora.target_modules", Setting("all-linear", "OpenRLHF default --target_modules all-linear",
                                                      where))
    kl = pairs.get("init_kl_coef", (0.01, "OpenRLHF default --init_kl_coef 0.01"))
    try:
        kl_value = float(kl[0])
    except (TypeError, ValueError):
        kl_value = 0.0
    colocated_ref = "colocate_actor_ref" in pairs or "colocate_all_models" in pairs
    if (kl_value > 0 or "use_kl_loss" in pairs) and colocated_ref and "ref_reward_offload" in pairs:
        notes.append(f"{pairs['ref_reward_offload'][1]}: the reference model's parameters live in host memory "
                     "(DeepSpeed parameter offload): not on the actor's GPUs while it trains")
    elif (kl_value > 0 or "use_kl_loss" in pairs) and colocated_ref:
        raw.setdefault("reference_model", Setting(
            "copy" if "_peft" in raw else True, f"{kl[1]} (the KL term's reference model, an Actor of its own on the "
                                                "actor's GPUs: --colocate_actor_ref / --colocate_all_models)", where))
    elif kl_value > 0 or "use_kl_loss" in pairs:
        notes.append("OpenRLHF train_ppo_ray: the reference model runs on GPUs of its own (no --colocate_actor_ref): "
                     "not on the actor's")
    if "colocate_all_models" in pairs and "vllm_enable_sleep" not in pairs and \
            (share := pairs.get("vllm_gpu_memory_utilization")) is not None:
        raw.setdefault("colocated_engine_memory_fraction", Setting(share[0], f"{share[1]} (vLLM colocated with "
                                                                             "--colocate_all_models)", where))
    estimator = str(pairs.get("advantage_estimator", ("gae", ""))[0]).strip().lower()
    critic = pairs.get("critic_pretrain")
    remote = "remote_rm_url" in pairs or "agent_func_path" in pairs  # an agent function sets remote_rm_url "agent"
    if critic is None and not remote and (reward := pairs.get("reward_pretrain")) is not None:
        critic = (str(reward[0]).split(",")[0], f"{reward[1]} (OpenRLHF's critic starts from the first reward model "
                                                "when --critic_pretrain is not given)")
    elif critic is None and remote:
        critic = pairs.get("pretrain")
    if estimator == "gae" and critic is not None:
        if "colocate_all_models" in pairs:
            raw.setdefault("critic_model", Setting(critic[0], f"{critic[1]} (PPO's critic, on the actor's GPUs: "
                                                              "--colocate_all_models)", where))
            if "deepspeed_enable_sleep" in pairs:
                # each DeepSpeed engine sleeps (its states in host memory) while the other trains, and reloads
                # before its own fit (trainer/ray/ppo_critic.py reload_states)
                raw.setdefault("idle_offload", Setting("both", f"{pairs['deepspeed_enable_sleep'][1]} (the actor and "
                                                               "the critic sleep while the other trains)", where))
        else:
            notes.append("OpenRLHF train_ppo_ray: the critic trains on GPUs of its own (no --colocate_all_models): "
                         "not on the actor's")
    notes.append("OpenRLHF train_ppo_ray: the reward model (and the vLLM engines unless colocated) are not in the "
                 "prediction: an under-estimate where they share the actor's GPUs")


def _openrlhf_settings(command: str, tokens: Sequence[str], raw: dict[str, Setting], notes: list[str],
                       where: str) -> None:
    """OpenRLHF's own flags and defaults: ``--pretrain`` (the model), ``--micro_train_batch_size`` and ``--max_len``
    (:data:`_OPENRLHF_DEFAULTS`), ``--train_batch_size`` (global: the gradient accumulation), ``--zero_stage``
    (default 2), ``--adam_offload`` (the optimizer on the CPU), ``--lora_rank`` > 0 (LoRA on ``--target_modules``,
    default all-linear, dropout 0); DPO and KTO load the reference model as an Actor of its own beside the trained one
    (with LoRA too), which ``--ref_offload`` puts in CPU memory. Before, the model, batch and length were not read and
    DPO's paired forward and reference model were missed: a 12.5 GiB under-estimate for its Llama 3 8B example."""
    pairs = _flag_values(tokens)
    label = f"OpenRLHF train_{command}"

    def given(key: str, field: str, default: Any = None, what: str = "") -> None:
        found = pairs.get(key)
        if found is not None:
            raw[field] = Setting(found[0], found[1], where)
        elif default is not None:
            raw[field] = Setting(default, f"{label} default --{key} {what or default}", where)

    if command == "ppo_ray":
        _openrlhf_ppo_settings(pairs, raw, notes, where)
        return
    batch, length = _OPENRLHF_DEFAULTS[command]
    given("pretrain", "model")
    given("micro_train_batch_size", "micro_batch_size", batch)
    given("max_len", "seq_len", length)
    given("train_batch_size", "_global_batch_size", 128)
    backend = pairs.get("backend")
    if backend is not None and str(backend[0]).strip().lower().startswith("fsdp"):
        # --backend fsdp2: OpenRLHF's FSDP2 strategy shards every decoder layer (fully_shard) instead of DeepSpeed's
        # ZeRO, whose --zero_stage it does not read
        raw["_use_fsdp"] = Setting(True, f"{backend[1]} {backend[0]} (FSDP2, every layer sharded)", where)
    else:
        given("zero_stage", "_zero_stage", 2)
        tp = pairs.get("ds_tensor_parallel_size")
        if tp is not None and (size := launch_count(str(tp[0]))) is not None and size > 1:
            # DeepSpeed's automatic tensor parallelism: each linear layer split over the group, the norms and the
            # activations between the layers whole (no sequence parallelism); data parallel over world / size
            raw["tensor_parallel"] = Setting(size, f"{tp[1]} {tp[0]} (DeepSpeed AutoTP)", where)
            raw["sequence_parallel"] = Setting(False, f"{tp[1]} (DeepSpeed AutoTP splits the linears only)", where)
    if (found := pairs.get("adam_offload")) is not None and to_bool(found[0]) is not False:
        raw["_offload_optimizer"] = Setting("cpu", found[1], where)
    rank = pairs.get("lora_rank")
    if rank is not None and (launch_count(str(rank[0])) or 0) > 0:
        raw["_peft"] = Setting(True, rank[1], where)
        given("target_modules", "lora.target_modules", "all-linear")
        given("lora_dropout", "lora.dropout", 0.0)
    if command == "rm":
        raw["task"] = Setting("seq-classification", f"{label} (a value head on the sequence, no vocabulary head)",
                              where)
    if command not in ("dpo", "kto", "rm"):
        return
    total = raw["_global_batch_size"]
    if (count := launch_count(str(total.value))) is not None:
        # the global batch counts samples, the micro-batch (doubled below) sequences
        raw["_global_batch_size"] = Setting(2 * count, f"{total.source} (x2: two sequences per sample)", where)
    if command in ("rm", "kto"):
        micro = raw["micro_batch_size"]
        if (size := launch_count(str(micro.value))) is not None:
            what = "a chosen and a rejected sequence" if command == "rm" else "each sample and a mismatched one"
            raw["micro_batch_size"] = Setting(2 * size, f"{micro.source} x 2 ({label} forwards {what} together)",
                                              where)
    if command == "rm":
        return
    ipo = pairs.get("ipo")
    raw["_rl"] = Setting("ipo" if ipo is not None and to_bool(ipo[0]) is not False else command, label, where)
    offload = pairs.get("ref_offload")
    if offload is not None and to_bool(offload[0]) is not False:
        raw["reference_model"] = Setting(False, f"{offload[1]} (the reference model's weights in CPU memory, "
                                                "gathered layer by layer)", where)
    else:
        raw["reference_model"] = Setting("copy" if "_peft" in raw else True,
                                         f"{label} (ref_model: an Actor of its own, with LoRA too)", where)


def _is_megatron(tokens: Sequence[str]) -> bool:
    """Whether a command runs Megatron-LM's training: ``pretrain_gpt.py`` and its siblings, Megatron-LM's paths, or a
    Python entry point given Megatron's own argument parser's flags (Megatron-DeepSpeed's ``finetune_llama.py``,
    Pai-Megatron-Patch's ``pretrain_qwen2_moe.py``: ``--tensor-model-parallel-size``, ``--use-distributed-optimizer``,
    or ``--num-layers`` with ``--hidden-size`` and ``--micro-batch-size``)."""
    if any(basename(t).startswith("pretrain_") and t.endswith(".py")
           and ("megatron" in t.lower() or basename(t) in _MEGATRON_SCRIPTS) for t in tokens):
        return True
    if not any(t.endswith(".py") for t in tokens):
        return False
    flags = {t.split("=", 1)[0] for t in tokens if t.startswith("--")}
    return bool(flags & _MEGATRON_ONLY_FLAGS) or {"--num-layers", "--hidden-size", "--micro-batch-size"} <= flags


# flags only Megatron's argument parser spells so (megatron/training/arguments.py; other trainers' are snake_case or
# dotted)
_MEGATRON_ONLY_FLAGS = frozenset({"--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                  "--use-distributed-optimizer", "--recompute-granularity"})


_MEGATRON_SCRIPTS = {"pretrain_gpt.py", "pretrain_mamba.py", "pretrain_bert.py", "pretrain_t5.py"}


def _megatron_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """Megatron-LM's own flags (megatron/training/arguments.py): ``--seq-length``; ``--use-distributed-optimizer``
    (the fp32 main weights and Adam states sharded over the data-parallel ranks, as ZeRO-1 does); activation
    recomputation (``--recompute-granularity full`` with ``--recompute-method uniform``: every layer, ``selective``:
    the attention core, Korthikanti et al.'s scheme that vramfit's selective is; ``block`` recomputes only
    ``--recompute-num-layers`` layers per stage: read as none, an over-estimate); ``--global-batch-size`` (gradient
    accumulation once the GPU count is known); ``--train-iters``. With no model named, a SwiGLU + RMSNorm
    architecture given by flags (``--num-layers``, ``--hidden-size``, ``--ffn-hidden-size``, ``--num-attention-heads``,
    ``--num-query-groups``, ``--vocab-size``, ...) becomes an inline Llama-style config."""
    pairs = _flag_values(tokens)

    def flag(key: str) -> tuple[Any, str] | None:
        return pairs.get(key)

    for key, name in (("seq_length", "seq_len"), ("train_iters", "steps")):
        if (found := flag(key)) is None:
            continue
        if name == "steps" and (launch_count(str(found[0])) or 0) < 1:
            # a launcher's own arithmetic (Pai: TRAIN_ITERS=$(( TRAIN_TOKENS / GBS / SEQ_LEN ))) can give 0; the job's
            # memory does not depend on it, its runtime is then not known
            notes.append(f"{found[1]} {found[0]}: not a step count; the runtime is predicted without one")
            continue
        raw[name] = Setting(found[0], found[1], where)
    if (found := flag("global_batch_size")) is not None:
        raw["_global_batch_size"] = Setting(found[0], found[1], where)
    if (found := flag("use_distributed_optimizer")) is not None and to_bool(found[0]) is True:
        raw["sharding"] = Setting("zero1", f"{found[1]} (Megatron's distributed optimizer shards the fp32 main "
                                           "weights and Adam states over the data-parallel ranks, as ZeRO-1)", where)
    granularity, method = flag("recompute_granularity"), flag("recompute_method")
    if granularity is None and (short := flag("recompute_activations")) is not None \
            and to_bool(short[0]) is not False:
        # megatron/training/arguments.py validate_args: --recompute-activations sets recompute_granularity selective
        granularity = ("selective", f"{short[1]} (Megatron's shorthand for --recompute-granularity selective)")
    elif granularity is None and (old := flag("checkpoint_activations")) is not None and to_bool(old[0]) is not False:
        # Megatron-DeepSpeed / bigscience: every layer (checkpoint_num_layers 1 by default)
        granularity = ("full", f"{old[1]} (Megatron-DeepSpeed: every --checkpoint-num-layers layers, 1 by default)")
    if granularity is not None and str(granularity[0]).lower() == "selective":
        raw["gradient_checkpointing"] = Setting("selective", granularity[1], where)
    elif granularity is not None and str(granularity[0]).lower() == "full":
        if method is not None and str(method[0]).lower() == "block":
            layers = flag("recompute_num_layers")
            notes.append(f"{method[1]} block: Megatron recomputes only {layers[0] if layers else 'some'} layers per "
                         "pipeline stage and keeps the others' activations; read as no recomputation (an "
                         "over-estimate)")
        else:
            raw["gradient_checkpointing"] = Setting("full", granularity[1], where)
    raw.setdefault("framework", Setting("megatron", "Megatron-LM (its Float16Module over a 16-bit model, fp32 main "
                                                    "parameters, its gradient buffer)", where))
    _megatron_gradients_and_optimizer(flag, raw, notes, where)
    _megatron_attention(flag, raw, notes, where)
    tp = flag("tensor_model_parallel_size")
    if tp is not None and (launch_count(str(tp[0])) or 1) > 1:
        sp = flag("sequence_parallel")
        raw["sequence_parallel"] = Setting(
            sp is not None and to_bool(sp[0]) is not False,
            sp[1] if sp is not None else f"{tp[1]} without --sequence-parallel (each tensor-parallel rank keeps the "
                                         "norms' inputs and the first linears' input whole)", where)
    if (found := flag("fp8_format")) is not None:
        notes.append(f"{found[1]} {found[0]}: Megatron's FP8 (Transformer Engine) linears are not expressible in the "
                     "TrainingSpec; the prediction is for bf16 matmuls")
    if "model" not in raw:
        model = _megatron_model(flag, notes)
        if model is not None:
            raw["model"] = Setting(model, "Megatron-LM architecture flags (--num-layers, --hidden-size, ...)", where)


# foundation-model-stack/fms-fsdp: its model variants (fms_fsdp/utils/config_utils.py get_model_config; "7b" in
# the first releases) that are catalog models, and its sharding strategies as FSDP's
_FMS_VARIANTS = {"7b": "llama-2-7b", "llama2_7b": "llama-2-7b", "llama2_13b": "llama-2-13b",
                 "llama2_70b": "llama-2-70b", "llama3_8b": "llama-3-8b", "llama3_8b_4k": "llama-3-8b",
                 "llama3_70b": "llama-3-70b", "llama3_70b_4k": "llama-3-70b"}
_FMS_STRATEGIES = {"hsdp": "hybrid_shard", "fsdp": "full_shard", "ddp": "no_shard"}


def _is_fms_fsdp(tokens: Sequence[str]) -> bool:
    """Whether a command runs fms-fsdp's trainer (``main_training.py`` / ``main_training_llama.py`` with its
    ``--model_variant``)."""
    return any(basename(t).startswith("main_training") and t.endswith(".py") for t in tokens) and any(
        t.split("=", 1)[0] == "--model_variant" for t in tokens)


def _is_awsome_fsdp(tokens: Sequence[str]) -> bool:
    """Whether a command runs aws-samples/awsome-distributed-training's FSDP ``train.py``: a Python script given that
    script's own model flags (``--hidden_width``, ``--max_context_width``: no other trainer spells them so)."""
    flags = {t.split("=", 1)[0] for t in tokens if t.startswith("--")}
    return any(t.endswith(".py") for t in tokens) and bool(flags & {"--hidden_width", "--max_context_width"})


# awsome-distributed-training FSDP --model_type values and the Hugging Face config family each builds (train_utils.py
# get_model_config: LlamaConfig for llama_v2 / llama_v3, MistralConfig, GPTNeoXConfig)
_AWSOME_MODEL_TYPES = {"llama_v2": "llama", "llama_v3": "llama", "mistral": "mistral", "gpt_neox": "gpt_neox"}


def _awsome_fsdp_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """awsome-distributed-training's FSDP ``train.py`` (3.test_cases/pytorch/FSDP/src; model_utils/arguments.py @
    03282a1): the model built from its flags (``--model_type`` gpt_neox by default, ``--hidden_width`` 768,
    ``--num_layers`` 12, ``--num_heads`` 12, ``--num_key_value_heads`` (the heads), ``--intermediate_size`` 11008,
    ``--vocab_size`` 50432 whatever ``--tokenizer`` says, ``--max_context_width`` 2048 the positions); the C4 stream
    packed into 4,096-token chunks (the data loader's default: train.py does not pass ``--max_context_width`` on);
    ``--train_batch_size`` (2) per GPU; FSDP
    (``--sharding_strategy`` full, or hybrid: within a node) with bf16 MixedPrecision over fp32 parameters
    (``--bf16`` 1), ``--activation_checkpointing`` (1) with ``--offload_activations`` (0) moving the checkpoints to
    CPU memory, ``--cpu_offload`` (0) FSDP's CPUOffload, torch's AdamW (foreach). Before, every such job was refused
    (no model found): awsome ships about ten PyTorchJobs of it."""
    pairs = _flag_values(tokens)

    def value(key: str, default: Any) -> tuple[Any, str]:
        found = pairs.get(key)
        return found if found is not None else (default, f"awsome-distributed-training FSDP default --{key} {default}")

    def count(key: str, default: int) -> tuple[int | None, str]:
        found = value(key, default)
        return launch_count(str(found[0])), found[1]

    kind = str(value("model_type", "gpt_neox")[0]).strip().lower()
    family = _AWSOME_MODEL_TYPES.get(kind)
    sizes = {key: count(key, default) for key, default in (
        ("hidden_width", 768), ("num_layers", 12), ("num_heads", 12), ("intermediate_size", 11008),
        ("vocab_size", 50432), ("max_context_width", 2048))}
    heads = sizes["num_heads"][0]
    kv = launch_count(str(pairs["num_key_value_heads"][0])) if "num_key_value_heads" in pairs else heads
    if family is None or any(v is None for v, _ in sizes.values()) or heads is None or kv is None:
        notes.append(f"awsome-distributed-training FSDP --model_type {kind}: not a layout vramfit builds from its "
                     "flags (llama_v2, llama_v3, mistral, gpt_neox); set model in the vramfit.io/spec annotation")
    else:
        hidden, layers, inter, vocab, positions = (sizes[k][0] for k in ("hidden_width", "num_layers",
                                                                          "intermediate_size", "vocab_size",
                                                                          "max_context_width"))
        if family == "gpt_neox":
            config: dict[str, Any] = {"model_type": "gpt_neox", "hidden_size": hidden, "num_hidden_layers": layers,
                                      "num_attention_heads": heads, "intermediate_size": 4 * hidden,
                                      "vocab_size": vocab, "max_position_embeddings": positions,
                                      "tie_word_embeddings": False}
        else:
            config = {"model_type": family, "hidden_size": hidden, "num_hidden_layers": layers,
                      "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": inter,
                      "vocab_size": vocab, "max_position_embeddings": positions, "tie_word_embeddings": False,
                      "hidden_act": "silu"}
        source = ", ".join(f"--{k} {v}" if "default" not in why else f"{k} {v} (default)"
                           for k, (v, why) in sizes.items())
        raw["model"] = Setting({"name": f"awsome-fsdp-{kind}-{layers}l-{hidden}h", "config": config},
                               f"awsome-distributed-training FSDP --model_type {kind}: {source}", where)
        if "vocab_size" not in pairs and "tokenizer" in pairs:
            notes.append(f"awsome-distributed-training FSDP: the vocabulary is --vocab_size's (default 50,432), not "
                         f"{pairs['tokenizer'][1]}'s tokenizer (get_model_config builds the config from the flags)")
    # train.py calls create_streaming_dataloader without max_context_width: the stream is cut into its default
    # 4,096-token chunks (model_utils/train_utils.py @ 11c8b14), whatever --max_context_width gives the positions
    loader = "awsome-distributed-training FSDP create_streaming_dataloader's chunks (max_context_width default 4096)"
    raw["seq_len"] = Setting(4096, loader, where)
    raw["sequence_lengths"] = Setting("fixed", f"{loader}: ConcatTokensDataset fills every chunk", where)
    batch = value("train_batch_size", 2)
    raw["micro_batch_size"] = Setting(launch_count(str(batch[0])) or 2, f"{batch[1]} (per GPU)", where)
    raw.pop("_global_batch_size", None)  # the key table reads --train_batch_size as DeepSpeed's global batch
    raw["_use_fsdp"] = Setting(True, "awsome-distributed-training FSDP train.py (FSDP)", where)
    strategy = value("sharding_strategy", "full")
    raw["_fsdp_strategy"] = Setting("hybrid_shard" if str(strategy[0]).strip().lower() == "hybrid" else "full_shard",
                                    strategy[1], where)
    bf16 = value("bf16", 1)
    if to_bool(bf16[0]) is False:
        raw["precision"] = Setting("32-true", bf16[1], where)
    else:
        raw["_bf16"] = Setting(True, f"{bf16[1]} (FSDP bf16 MixedPrecision over fp32 parameters)", where)
    checkpointing = value("activation_checkpointing", 1)
    raw["gradient_checkpointing"] = Setting(to_bool(checkpointing[0]) is True, checkpointing[1], where)
    offload = value("offload_activations", 0)
    if to_bool(offload[0]) is True:
        raw["activation_offloading"] = Setting(True, f"{offload[1]} (the checkpoints in CPU memory)", where)
    cpu = value("cpu_offload", 0)
    if to_bool(cpu[0]) is True:
        raw["offload"] = Setting("params+optimizer", f"{cpu[1]} (FSDP CPUOffload)", where)
    raw.setdefault("optimizer", Setting("adamw", "awsome-distributed-training FSDP train.py (torch.optim.AdamW)",
                                        where))
    raw.setdefault("fused_optimizer", Setting(False, "awsome-distributed-training FSDP train.py (torch.optim.AdamW, "
                                                     "foreach)", where))
    raw.setdefault("framework", Setting("transformers", "awsome-distributed-training FSDP train.py (a transformers "
                                                        "model from its config)", where))


def _fms_fsdp_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """fms-fsdp's flags over its train_config defaults (fms_fsdp/config/training.py @ 6a9c379): ``--model_variant``
    ("7b"), ``--batch_size`` (2 per GPU), ``--seq_length`` (4096), ``--sharding_strategy`` (hsdp: FSDP within a node,
    replicated across nodes), ``--mixed_precision`` (true: FSDP's bf16 MixedPrecision over fp32 shards),
    ``--fsdp_activation_checkpointing`` (false) every ``1 / --selective_checkpointing`` blocks, torch's AdamW
    (foreach). Before, the model was not read (refused), nor the batch, length or HSDP: its 7B job read 18.6 GiB for
    about 66."""
    pairs = _flag_values(tokens)

    def value(key: str, default: Any) -> tuple[Any, str]:
        return pairs.get(key, (default, f"fms-fsdp default {key} {default}"))

    variant = value("model_variant", "7b")
    name = _FMS_VARIANTS.get(str(variant[0]).strip().lower())
    if name is not None:
        raw.setdefault("model", Setting(name, f"{variant[1]} (fms-fsdp get_model_config)", where))
    else:
        notes.append(f"fms-fsdp {variant[1]} {variant[0]}: not a catalog model; set model in the vramfit.io/spec "
                     "annotation")
    for key, name_in_spec, default in (("batch_size", "micro_batch_size", 2), ("seq_length", "seq_len", 4096)):
        found = value(key, default)
        raw[name_in_spec] = Setting(found[0], found[1], where)
    strategy = value("sharding_strategy", "hsdp")
    mapped = _FMS_STRATEGIES.get(str(strategy[0]).strip().lower())
    if mapped is not None:
        raw["_fsdp_strategy"] = Setting(mapped, f"{strategy[1]} ({strategy[0]}: FSDP {mapped.upper()})", where)
    mixed = value("mixed_precision", True)
    if to_bool(mixed[0]) is False:
        raw.setdefault("precision", Setting("32-true", mixed[1], where))
    else:
        raw.setdefault("_bf16", Setting(True, f"{mixed[1]} (FSDP bf16 MixedPrecision)", where))
    checkpointing = value("fsdp_activation_checkpointing", False)
    raw["gradient_checkpointing"] = Setting(to_bool(checkpointing[0]) is True, checkpointing[1], where)
    if to_bool(checkpointing[0]) is True:
        ratio = value("selective_checkpointing", 1)
        try:
            every = round(1 / float(ratio[0]))
        except (TypeError, ValueError, ZeroDivisionError):
            every = 1
        if every > 1:
            raw["checkpoint_every_n_layers"] = Setting(every, f"{ratio[1]} (1 block in {every} checkpointed)", where)
    raw.setdefault("fused_optimizer", Setting(False, "fms-fsdp's torch.optim.AdamW (foreach)", where))


def _megatron_attention(flag: Any, raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """The attention kernel: ``--attention-backend`` (flash, fused (cuDNN) or auto: a fused kernel that keeps no
    score matrix and takes the k/v heads as they are; unfused or local: Megatron's own, which keeps the softmax),
    ``--use-flash-attn`` (and Megatron-DeepSpeed's ``--use-flash-attn-v1/-v2/-triton``). Without them,
    Megatron-DeepSpeed (a ``--deepspeed`` run) and ``--transformer-impl local`` run the unfused CoreAttention;
    Megatron-Core with Transformer Engine picks a fused kernel (auto)."""
    backend = flag("attention_backend")
    flash = next((found for key in ("use_flash_attn", "use_flash_attn_v1", "use_flash_attn_v2", "use_flash_attn_triton")
                  if (found := flag(key)) is not None and to_bool(found[0]) is not False), None)
    if backend is not None:
        kind = str(backend[0]).strip().lower()
        raw.setdefault("attention", Setting("eager" if kind in ("unfused", "local") else "flash",
                                            f"{backend[1]} {kind}", where))
    elif flash is not None:
        raw.setdefault("attention", Setting("flash", flash[1], where))
    elif flag("deepspeed") is not None or flag("deepspeed_config") is not None or (
            (impl := flag("transformer_impl")) is not None and str(impl[0]).strip().lower() == "local"):
        raw.setdefault("attention", Setting("eager", "Megatron without a flash-attention flag (Megatron-DeepSpeed or "
                                                     "--transformer-impl local: the unfused CoreAttention keeps the "
                                                     "softmax of every score)", where))
    else:
        raw.setdefault("attention", Setting("flash", "Megatron-Core's --attention-backend auto (Transformer Engine's "
                                                     "fused attention)", where))


def _megatron_gradients_and_optimizer(flag: Any, raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """Megatron-LM's gradient buffer and optimizer kernel. Its DDP accumulates gradients into a main_grad buffer in
    fp32 when accumulate_allreduce_grads_in_fp32 is on, which ``--bf16`` turns on unless ``--grad-reduce-in-bf16``
    (megatron/training/arguments.py; param_and_grad_buffer.py allocates the buffer as torch.float); with ``--fp16``
    only ``--accumulate-allreduce-grads-in-fp32`` does. Its Adam and SGD are Transformer Engine's or apex's fused
    multi-tensor kernels (megatron/core/optimizer/__init__.py), with no per-tensor step temporaries."""
    explicit, bf16 = flag("accumulate_allreduce_grads_in_fp32"), flag("bf16")
    deepspeed = flag("deepspeed") or flag("deepspeed_config")
    if deepspeed is not None:
        # Megatron-DeepSpeed hands the model to deepspeed.initialize before Megatron's own DDP wraps it: DeepSpeed's
        # optimizer keeps the gradients, 16-bit at ZeRO 1-3 (at stage 0 its BF16_Optimizer accumulates them in fp32,
        # which the merge reads from the final ZeRO stage)
        stage = flag("zero_stage")
        if stage is None or str(stage[0]).strip() != "0":
            raw["fp32_gradients"] = Setting(False, f"{deepspeed[1]} (Megatron-DeepSpeed: DeepSpeed's optimizer keeps "
                                                    "the model's 16-bit gradients)", where)
    elif flag("grad_reduce_in_bf16") is not None:
        raw["fp32_gradients"] = Setting(False, flag("grad_reduce_in_bf16")[1], where)
    elif explicit is not None and to_bool(explicit[0]) is not False:
        raw["fp32_gradients"] = Setting(True, explicit[1], where)
    elif bf16 is not None and to_bool(bf16[0]) is not False:
        raw["fp32_gradients"] = Setting(True, f"{bf16[1]} (Megatron-LM's arguments.py turns "
                                              "accumulate_allreduce_grads_in_fp32 on for bf16: an fp32 gradient "
                                              "buffer)", where)
    optimizer = flag("optimizer")
    name = str(optimizer[0]).lower() if optimizer is not None else "adam"
    if name in ("adam", "sgd"):
        named = optimizer[1] if optimizer else "its default --optimizer"
        raw.setdefault("fused_optimizer", Setting(True, f"Megatron-LM's {name} ({named}): Transformer Engine's or "
                                                        "apex's fused kernel", where))


def _megatron_model(flag: Any, notes: list[str] | None = None) -> dict[str, Any] | None:
    """An inline config from Megatron's architecture flags, else None: Llama-style with ``--swiglu`` (gated SiLU MLP,
    RMSNorm), GPT-style without it (Megatron's GPT: GeLU MLP of ``--ffn-hidden-size`` (4 x hidden by default),
    LayerNorm, learned positions unless rope), Mixtral-style with ``--num-experts`` (top ``--moe-router-topk``, 2 by
    default, of ``--moe-ffn-hidden-size`` experts). The vocabulary: ``--vocab-size``, else the tokenizer's
    (GPT2BPETokenizer 50,257; a ``--tokenizer-model`` that names a catalog model), padded as Megatron pads it to a
    multiple of ``--make-vocab-size-divisible-by`` (128) x tensor parallel. Megatron ties the embedding and the
    output layer unless ``--untie-embeddings-and-output-weights``."""
    sizes = {key: launch_count(str(found[0])) if (found := flag(key)) is not None else None
             for key in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "num_query_groups",
                         "kv_channels", "vocab_size", "max_position_embeddings", "seq_length", "num_experts",
                         "moe_router_topk", "moe_ffn_hidden_size", "make_vocab_size_divisible_by",
                         "tensor_model_parallel_size", "num_key_value_heads")}
    layers, hidden, heads = sizes["num_layers"], sizes["hidden_size"], sizes["num_attention_heads"]
    if layers is None or hidden is None or heads is None:
        return None
    vocab = sizes["vocab_size"] or _megatron_tokenizer_vocab(flag)
    if vocab is None:
        if notes is not None:
            notes.append(f"{_MEGATRON_NO_VOCAB} (no --vocab-size, and the tokenizer names no catalog model): give "
                         "--vocab-size, or the model in the vramfit.io/spec annotation")
        return None
    # padded as Megatron pads the tokenizer's size (_vocab_size_with_padding), --vocab-size's too
    multiple = (sizes["make_vocab_size_divisible_by"] or 128) * (sizes["tensor_model_parallel_size"] or 1)
    vocab = -(-vocab // multiple) * multiple
    swiglu, norm = flag("swiglu") is not None, flag("normalization")
    # Megatron-LM's --group-query-attention --num-query-groups, Megatron-DeepSpeed's --num-key-value-heads
    groups = sizes["num_query_groups"] if flag("group_query_attention") is not None else sizes["num_key_value_heads"]
    positions = sizes["max_position_embeddings"] or sizes["seq_length"] or 4096
    tied = flag("untie_embeddings_and_output_weights") is None
    # Megatron's default --ffn-hidden-size: 4 x hidden, and with --swiglu int(4h x 2/3 / 64) x 64 (arguments.py)
    width = sizes["ffn_hidden_size"] or (int(4 * hidden * 2 / 3 / 64) * 64 if flag("swiglu") is not None
                                         else 4 * hidden)
    name = f"megatron-{layers}l-{hidden}h"
    # --attention-dropout and --hidden-dropout, 0.1 each unless given (arguments.py): eager attention keeps a mask of
    # its scores, and every block one per residual-dropout output
    attention_dropout, hidden_dropout = (_megatron_probability(flag(key)) for key in ("attention_dropout",
                                                                                      "hidden_dropout"))
    if not swiglu and not sizes["num_experts"]:
        config: dict[str, Any] = {
            "model_type": "gpt2", "n_layer": layers, "n_embd": hidden, "n_head": heads, "n_positions": positions,
            "n_inner": width, "vocab_size": vocab, "activation_function": "gelu", "tie_word_embeddings": tied,
            "attn_pdrop": attention_dropout, "resid_pdrop": hidden_dropout,
        }
        if (groups or (norm is not None and str(norm[0]).lower() == "rmsnorm")) and notes is not None:
            notes.append("Megatron-LM: a GeLU model with grouped-query attention or RMSNorm is sized as GPT-2's "
                         "layout (full-head k/v, LayerNorm): the parameter count is a little over")
        return {"name": name, "config": config}
    config = {
        "model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden,
        "num_attention_heads": heads, "num_key_value_heads": groups or heads,
        "head_dim": sizes["kv_channels"] or hidden // heads,
        "intermediate_size": width, "vocab_size": vocab, "max_position_embeddings": positions,
        "tie_word_embeddings": tied, "hidden_act": "silu", "attention_bias": flag("disable_bias_linear") is None,
        "attention_dropout": attention_dropout, "hidden_dropout": hidden_dropout,
    }
    if sizes["num_experts"]:
        config.update(model_type="mixtral", num_local_experts=sizes["num_experts"],
                      num_experts_per_tok=sizes["moe_router_topk"] or 2,
                      intermediate_size=sizes["moe_ffn_hidden_size"] or width)
        if sizes["kv_channels"] is None:
            config.pop("head_dim")
        if notes is not None and (shared := flag("moe_shared_expert_intermediate_size")) is not None:
            notes.append(f"{shared[1]} {shared[0]}: Megatron's shared expert is not in the Mixtral layout vramfit "
                         "sizes the model as (an under-estimate of its parameters)")
        if notes is not None and (ep := flag("expert_model_parallel_size")) is not None \
                and (launch_count(str(ep[0])) or 1) > 1:
            notes.append(f"{ep[1]} {ep[0]}: expert parallelism (each GPU holds 1/{ep[0]} of the experts) is not "
                         "expressible in the TrainingSpec; every expert is counted on every GPU (an over-estimate)")
        if not swiglu and notes is not None:
            notes.append("Megatron-LM: MoE experts without --swiglu are sized as gated (SwiGLU) experts: over")
    return {"name": name, "config": config}


def _megatron_probability(found: Any) -> float:
    """A Megatron dropout flag's probability (0.1, Megatron's default, when the flag is absent or not a probability)."""
    if found is None:
        return 0.1
    try:
        value = float(str(found[0]))
    except ValueError:
        return 0.1
    return value if 0 <= value < 1 else 0.1


# Megatron-LM's --tokenizer-type values with a fixed vocabulary (megatron/training/tokenizer): GPT-2's BPE, BERT's
# WordPiece, and Llama 2's SentencePiece model (Llama2Tokenizer, whatever file --tokenizer-model names)
_MEGATRON_NO_VOCAB = "Megatron-LM: the architecture flags give the model's shape but not its vocabulary"
_MEGATRON_TOKENIZERS = {"gpt2bpetokenizer": 50257, "bertwordpiecelowercase": 30522, "bertwordpiececase": 28996,
                        "llama2tokenizer": 32000}


def _megatron_tokenizer_vocab(flag: Any) -> int | None:
    """The vocabulary of Megatron's ``--tokenizer-type`` (GPT2BPETokenizer: GPT-2's 50,257), or of the catalog model a
    ``--tokenizer-model`` names (HuggingFaceTokenizer, Llama2Tokenizer ...), else None."""
    kind = flag("tokenizer_type")
    if kind is not None and (size := _MEGATRON_TOKENIZERS.get(str(kind[0]).strip().lower())):
        return size
    if kind is None and flag("merge_file") is not None:  # a BPE vocabulary and merges file: GPT-2's tokenizer
        return _MEGATRON_TOKENIZERS["gpt2bpetokenizer"]
    model = flag("tokenizer_model") or flag("tokenizer_name_or_path")
    if model is None:
        return None
    from scheduler.spec.nemo import _catalog_vocab  # nemo imports this module: a late import

    return _catalog_vocab(str(model[0]))


def _trl_defaults(tokens: Sequence[str], trainer: str, raw: dict[str, Setting], flags: Mapping[str, Setting],
                  notes: list[str], where: str, all_read: bool) -> None:
    """TRL's own defaults where they differ from the TrainingSpec's, when every config the command names was read.
    ``trl sft``: SFTConfig ``max_length`` 1024 (trl/trainer/sft_config.py; docs: "min(tokenizer.model_max_length,
    1024)" in older releases). TRL's 4-bit loading (``--load_in_4bit``, ModelConfig -> trl get_quantization_config)
    passes ``bnb_4bit_use_double_quant=use_bnb_nested_quant``, default false, and ``bnb_4bit_quant_type`` nf4
    (trl/trainer/model_config.py): nf4 without double quantization, not the spec's nf4-dq default."""
    command = _trl_command(tokens)
    if (trainer != "TRL" and command is None) or not all_read:
        return  # a script that merely takes --use_peft may default otherwise
    _trl_accelerate_config(tokens, raw, notes, where)
    if _enabled(raw.get("_peft")) is True and "model" in raw:
        # TRL's ModelConfig (trl/trainer/model_config.py), which every TRL script parses: lora_r 16, lora_alpha 32,
        # lora_dropout 0.05; lora_target_modules None leaves PEFT's per-architecture default
        applied = _fill_defaults(raw, (("lora.rank", 16, "lora_r 16"), ("lora.alpha", 32, "lora_alpha 32"),
                                       ("lora.dropout", 0.05, "lora_dropout 0.05")), "TRL ModelConfig default", where)
        if applied:
            notes.append(f"TRL ModelConfig defaults where the command sets none: {', '.join(applied)}")
    if command == "dpo" and "model" in raw:
        # DPOConfig max_length 1024 (trl/trainer/dpo_config.py) and TrainingArguments' per_device_train_batch_size 8;
        # the paired forward and the reference model (a frozen copy without an adapter) follow from _rl
        # (_resolve_preference)
        applied = _fill_defaults(raw, (("seq_len", 1024, "max_length 1024"),
                                       ("micro_batch_size", 8, "per_device_train_batch_size 8")),
                                 "TRL DPOConfig default", where, batch_decided_elsewhere="_deepspeed" in raw)
        if applied:
            notes.append(f"trl dpo defaults where its command sets none: {', '.join(applied)}")
        if "_rl" not in raw:  # DPOTrainer: pairs in one forward, a reference model without an adapter
            raw["_rl"] = Setting("dpo", "TRL DPOTrainer", where)
    legacy = any(t.endswith(("examples/scripts/reward_modeling.py", "examples/scripts/kto.py")) for t in tokens)
    if command in ("grpo", "rloo") and "model" in raw:
        # GRPOConfig's and RLOOConfig's own defaults (trl/trainer/grpo_config.py, rloo_config.py: "gradient_
        # checkpointing: Defaults to True", "bf16: Defaults to True if fp16 is not set") and TrainingArguments'
        # per-device batch 8 (completions per device); RLOO's KL coefficient beta defaults to 0.05 (a reference model)
        label = {"grpo": "TRL GRPOConfig default", "rloo": "TRL RLOOConfig default"}[command]
        applied = _trl_config_defaults(raw, (("micro_batch_size", 8, "per_device_train_batch_size 8"),
                                             ("gradient_checkpointing", True, "gradient_checkpointing on")),
                                       label, where)
        if command == "rloo" and "_beta" not in raw:
            raw["_beta"] = Setting(0.05, f"{label} beta", where)
            applied.append("beta 0.05")
        if applied:
            notes.append(f"trl {command} defaults where its command sets none: {', '.join(applied)}")
    if command in ("kto", "reward") and "model" in raw and legacy:
        # the examples/scripts era's configs set no checkpointing or bf16 default (the scripts' docstrings pass them):
        # TrainingArguments' per-device batch 8 only
        applied = _fill_defaults(raw, (("micro_batch_size", 8, "per_device_train_batch_size 8"),),
                                 "transformers TrainingArguments default", where, batch_decided_elsewhere="_deepspeed"
                                 in raw)
        if "_deepspeed" not in raw and not any(k in raw for k in _PRECISION_KEYS):
            raw["_dtype"] = Setting("float32", "transformers TrainingArguments default (no --bf16 / --fp16: fp32)",
                                    where)
            applied.append("fp32 (no --bf16 / --fp16)")
        if applied:
            notes.append(f"TRL {command} example script defaults where its command sets none: {', '.join(applied)}")
    if command in ("kto", "reward") and "model" in raw and not legacy:
        # KTOConfig (trl/experimental/kto/kto_config.py) and RewardConfig (trl/trainer/reward_config.py): max_length
        # 1024, gradient_checkpointing True, bf16 True when fp16 is not set; TrainingArguments' per-device batch 8.
        # KTO keeps a frozen reference model (the script loads it) and runs its KL term under no_grad; the reward
        # model is a sequence classifier (AutoModelForSequenceClassification, num_labels 1) scoring pairs
        label = {"kto": "TRL KTOConfig default", "reward": "TRL RewardConfig default"}[command]
        applied = _trl_config_defaults(raw, (("seq_len", 1024, "max_length 1024"),
                                             ("micro_batch_size", 8, "per_device_train_batch_size 8"),
                                             ("gradient_checkpointing", True, "gradient_checkpointing on")),
                                       label, where)
        if applied:
            notes.append(f"trl {command} defaults where its command sets none: {', '.join(applied)}")
    if command in ("kto", "reward") and "model" in raw:
        trainer_name = {"kto": "TRL KTOTrainer", "reward": "TRL RewardTrainer"}[command]
        raw.setdefault("_rl", Setting(command, trainer_name, where))
        if command == "reward":
            raw.setdefault("task", Setting("seq-classification", "TRL RewardTrainer (a sequence classifier, "
                                                                 "num_labels 1)", where))
        elif _enabled(raw.get("_peft")) is True or any(k.startswith("lora.") for k in raw):
            # trl/scripts/kto.py loads ref_model itself and passes it to KTOTrainer, adapter or not
            raw.setdefault("reference_model", Setting("copy", "TRL's kto script (it loads a reference model of its "
                                                              "own, with an adapter too)", where))
    if command in ("orpo", "cpo") and "model" in raw:
        # ORPOTrainer / CPOTrainer: pairs in one forward, no reference; ORPOConfig / CPOConfig max_length 1024 and
        # TrainingArguments' per-device batch 8
        applied = _fill_defaults(raw, (("seq_len", 1024, "max_length 1024"),
                                       ("micro_batch_size", 8, "per_device_train_batch_size 8")),
                                 f"TRL {command.upper()}Config default", where,
                                 batch_decided_elsewhere="_deepspeed" in raw)
        if applied:
            notes.append(f"TRL {command} defaults where its command sets none: {', '.join(applied)}")
        raw.setdefault("_rl", Setting(command, f"TRL {command.upper()}Trainer", where))
    if command == "sft" and "model" in raw:
        # SFTConfig's own defaults (its docstring: max_length 1024; "gradient_checkpointing: Defaults to True";
        # "bf16: Defaults to True if fp16 is not set") and TrainingArguments' per_device_train_batch_size 8
        applied = _trl_config_defaults(raw, (("seq_len", 1024, "max_length 1024"),
                                             ("micro_batch_size", 8, "per_device_train_batch_size 8"),
                                             ("gradient_checkpointing", True, "gradient_checkpointing on")),
                                       "TRL SFTConfig default", where)
        if applied:
            notes.append(f"trl sft defaults where its command sets none: {', '.join(applied)} (a field the "
                         "vramfit.io/spec annotation sets still wins)")
    if command == "distillation" and "model" in raw:
        # DistillationConfig's own defaults (trl/trainer/distillation_config.py: "gradient_checkpointing: Defaults to
        # True", "bf16: Defaults to True if fp16 is not set"); its sequences are prompts + on-policy completions
        # (max_completion_length 512), whose length the command does not say
        applied = _trl_config_defaults(raw, (("gradient_checkpointing", True, "gradient_checkpointing on"),),
                                       "TRL DistillationConfig default", where)
        if applied:
            notes.append(f"trl distillation defaults where its command sets none: {', '.join(applied)}")
    four = raw.get("_4bit")
    if four is not None and four.value is True and "_double" not in raw and "_quant_bits" not in raw:
        raw["_double"] = Setting(False, "TRL ModelConfig use_bnb_nested_quant default false", where)


# raw keys that state a precision: a trainer's default precision applies only without any of them
_PRECISION_KEYS = ("_bf16", "_fp16", "_dtype", "_pure_bf16", "_mixed", "_lightning_precision")


# TRL GRPOConfig max_completion_length default (trl/trainer/grpo_config.py), and the max_prompt_length default of the
# releases that truncated prompts (GRPOConfig 0.14-0.2x; later releases keep prompts whole)
_GRPO_COMPLETION_TOKENS = 256
_VLLM_COLOCATE_SHARE = 0.3
_GRPO_PROMPT_TOKENS = 512


def _online_rl_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """GRPO as TRL's GRPOTrainer runs it (``trl grpo``, open-r1's grpo.py, any script taking GRPOConfig's
    ``--num_generations`` and ``--max_completion_length``): each micro-batch holds ``per_device_train_batch_size``
    completions, and the policy's forward and backward run over prompt + completion, so the trained length is
    ``max_prompt_length + max_completion_length``; ``beta > 0`` keeps a frozen reference model (with an adapter, the
    base with the adapter disabled), ``beta`` 0 none; a vLLM engine colocated in the training processes (``vllm_mode
    colocate`` without sleep mode) holds its ``vllm_gpu_memory_utilization`` share of every GPU. The rollout's own
    generation (transformers' generate, or a vLLM server on other GPUs) is named in a note."""
    rl = raw.get("_rl")
    grpo = _trl_command(tokens) in ("grpo", "rloo") or (
        "_num_generations" in raw and "_max_completion_length" in raw) or (
        rl is not None and str(rl.value).strip().lower() == "grpo")
    if not grpo or "model" not in raw:
        return
    completion, prompt = raw.get("_max_completion_length"), raw.get("_max_prompt_length")
    # TRL's GRPOTrainer asks the model for the logits of the completion only (logits_to_keep): the vocabulary-sized
    # tensors scale with it, not with prompt + completion
    kept = launch_count(completion.value) if completion is not None else None
    raw.setdefault("logits_tokens", Setting(kept or _GRPO_COMPLETION_TOKENS, (
        f"{completion.source} {kept}" if kept and completion is not None else
        f"GRPOConfig default max_completion_length {_GRPO_COMPLETION_TOKENS}")
        + " (GRPO scores the completion only: logits_to_keep)", where))
    if "seq_len" not in raw:
        new = launch_count(completion.value) if completion is not None else None
        new_what = f"{completion.source} {new}" if new is not None and completion is not None else \
            f"GRPOConfig default max_completion_length {_GRPO_COMPLETION_TOKENS}"
        new = new or _GRPO_COMPLETION_TOKENS
        old = launch_count(prompt.value) if prompt is not None else None
        if old is None:
            old = _GRPO_PROMPT_TOKENS
            old_what = f"max_prompt_length {_GRPO_PROMPT_TOKENS} assumed"
            notes.append(f"GRPO: the prompts' length is not stated; {_GRPO_PROMPT_TOKENS} tokens assumed (the "
                         "max_prompt_length default of TRL releases that truncate prompts; later ones keep prompts "
                         "whole): pass --max_prompt_length, or set seq_len in the vramfit.io/spec annotation")
        else:
            old_what = f"{prompt.source} {old}" if prompt is not None else ""
        raw["seq_len"] = Setting(old + new, f"{old_what} + {new_what} (GRPO trains on prompt and completion)",
                                 where)
    beta = raw.get("_beta")
    try:
        beta_value = float(beta.value) if beta is not None else None
    except (TypeError, ValueError):
        beta_value = None
    if beta_value is not None and beta_value > 0 and "reference_model" not in raw:
        raw["reference_model"] = Setting(True, f"{beta.source} {beta.value} > 0 (GRPO's KL term: a frozen reference "
                                               "model; with an adapter, the base with the adapter disabled)", where)
    elif beta is None:
        notes.append("GRPO: beta not set; TRL's current GRPOConfig default 0.0 loads no reference model (older "
                     "releases defaulted to 0.04 and load one: set beta to say which)")
    use_vllm, mode = raw.get("_use_vllm"), raw.get("_vllm_mode")
    if use_vllm is not None and use_vllm.value is True:
        colocate = mode is not None and str(mode.value).strip().lower() == "colocate"
        sleep = raw.get("_vllm_sleep")
        if colocate and not (sleep is not None and sleep.value is True):
            # GRPOConfig vllm_gpu_memory_utilization default 0.3 (trl/trainer/grpo_config.py); vLLM sizes its
            # instance as that share of the device's memory and holds it through the training step
            share = raw.get("_vllm_gpu_memory_utilization")
            try:
                fraction = float(share.value) if share is not None else _VLLM_COLOCATE_SHARE
            except (TypeError, ValueError):
                fraction = -1.0
            source = f"{share.source} {share.value}" if share is not None else \
                f"GRPOConfig default vllm_gpu_memory_utilization {_VLLM_COLOCATE_SHARE}"
            if 0 < fraction < 1:
                raw.setdefault("colocated_engine_memory_fraction", Setting(
                    fraction, f"{source} (vLLM colocated in the training processes: its share of every GPU's "
                              "memory, held through the training step)", where))
            else:
                notes.append(f"GRPO with vLLM colocated: {source} is not a share between 0 and 1; the engine's "
                             "memory is not in the prediction")
        elif colocate:
            notes.append("GRPO with vLLM colocated in sleep mode: the engine frees its memory while the policy trains, "
                         "so only the training step is predicted")
        else:
            notes.append("GRPO with vLLM in server mode: generation runs on the vLLM server's own GPUs, not in this "
                         "prediction")
    else:
        notes.append("GRPO: the rollout generates with the policy itself (transformers generate); its KV cache, "
                     "freed before the training step, is not in the prediction")


def _trl_config_defaults(raw: dict[str, Setting], defaults: Sequence[tuple[str, Any, str]], label: str, where: str
                         ) -> list[str]:
    """A TRL config's defaults where the command sets none (:func:`_fill_defaults`), and its bf16 default (on when
    fp16 is not set). Under a DeepSpeed config the micro-batch is the config's, or where it says "auto" (TRL's own
    zero1/2/3 configs do) the Trainer's per-device 8, which transformers fills in (the ``_hf_trainer`` reading); its
    "auto" precision follows bf16, so the default stands there too (a config that names another would not start:
    the Trainer refuses a mismatch)."""
    deepspeed = "_deepspeed" in raw
    applied = _fill_defaults(raw, defaults, label, where, batch_decided_elsewhere=deepspeed)
    if deepspeed:
        raw.setdefault("_hf_trainer", Setting(True, f"{label.split(' default')[0]} (an HF Trainer)", where))
    if not any(k in raw for k in _PRECISION_KEYS):
        # under DeepSpeed a default only: the config's own bf16/fp16 "enabled" wins, its "auto" takes this
        raw["_bf16_default" if deepspeed else "_bf16"] = Setting(True, f"{label} bf16 (fp16 not set)", where)
        applied.append("bf16")
    return applied


def _fill_defaults(raw: dict[str, Setting], defaults: Sequence[tuple[str, Any, str]], source: str, where: str,
                   batch_decided_elsewhere: bool = False) -> list[str]:
    """A trainer's defaults ``(field, value, what)`` for the fields the command leaves unset (the micro-batch not
    where a DeepSpeed config decides it); the ``what`` of those set."""
    applied = []
    for key, value, what in defaults:
        if key not in raw and not (batch_decided_elsewhere and key == "micro_batch_size"):
            raw[key] = Setting(value, f"{source} {what}", where)
            applied.append(what)
    return applied


def _hf_trainer_defaults(tokens: Sequence[str], trainer: str, raw: dict[str, Setting], notes: list[str], where: str,
                         all_read: bool) -> None:
    """transformers' TrainingArguments defaults for an HF Trainer script (``--do_train``, the flag of transformers'
    example scripts and of every HfArgumentParser(TrainingArguments) script) that sets neither: a per-device batch of
    8 and fp32 training (``bf16``/``fp16`` default False; src/transformers/training_args.py). Not for TRL (its own
    defaults), axolotl or LLaMA-Factory, nor where a DeepSpeed/FSDP config or accelerate may decide."""
    if trainer in ("TRL", "axolotl", "LLaMA-Factory") or _trl_command(tokens) is not None or not all_read:
        return
    if not any(t == "--do_train" or t.startswith("--do_train=") for t in tokens) or "model" not in raw:
        return
    # DeepSpeed's config may state the batch and the precision ("auto": the Trainer's, transformers
    # integrations/deepspeed.py trainer_config_process); FSDP takes both from the Trainer's arguments
    engine = any(k in raw for k in ("_deepspeed", "_use_deepspeed"))
    if engine:
        raw["_hf_trainer"] = Setting(True, "an HF Trainer script (--do_train)", where)
    applied = _fill_defaults(raw, (("micro_batch_size", 8, "per_device_train_batch_size 8"),),
                             "transformers TrainingArguments default", where, batch_decided_elsewhere=engine)
    halves = [raw[k] for k in ("_bf16", "_fp16") if k in raw]
    switched_off = bool(halves) and all(to_bool(h.value) is False for h in halves) and not any(
        k in raw for k in _PRECISION_KEYS if k not in ("_bf16", "_fp16"))
    if not engine and (switched_off or not any(k in raw for k in _PRECISION_KEYS)):
        # --bf16 False (--fp16 False) says what the default says: fp32 training of a model loaded in fp32
        source = (f"{' and '.join(h.source for h in halves)} false: fp32" if switched_off
                  else "transformers TrainingArguments default (no --bf16 / --fp16: fp32)")
        raw["_dtype"] = Setting("float32", source, where)
        applied.append("fp32 (no --bf16 / --fp16)")
    if applied:
        notes.append(f"HF Trainer defaults where the command sets none: {', '.join(applied)}")


# TRL's example scripts, run directly or by its CLI (trl/cli.py runs trl/scripts/<command>.py with the same argv):
# older releases kept them in examples/scripts/
# TRL's example scripts that parse one of these configs under another name (GSPO is GRPOConfig with sequence-level
# importance sampling; the VLM and gpt-oss scripts take SFTConfig, DPOConfig, GRPOConfig)
# The alignment-handbook's scripts (scripts/sft.py, dpo.py, orpo.py; run_sft.py, run_dpo.py before) parse TRL's
# configs the same way (TrlParser over ScriptArguments, SFTConfig / DPOConfig / ORPOConfig, ModelConfig).
_TRL_SCRIPTS = {"sft": ("trl/scripts/sft.py", "examples/scripts/sft.py", "examples/scripts/sft_vlm.py",
                        "examples/scripts/sft_gpt_oss.py", "examples/scripts/sft_vlm_gemma3.py",
                        "examples/scripts/sft_video_llm.py", "scripts/run_sft.py"),
                "grpo": ("trl/scripts/grpo.py", "examples/scripts/grpo.py", "open_r1/grpo.py",
                         "examples/scripts/gspo.py", "examples/scripts/gspo_vlm.py", "examples/scripts/grpo_vlm.py"),
                "rloo": ("trl/scripts/rloo.py",),
                "dpo": ("trl/scripts/dpo.py", "examples/scripts/dpo.py", "examples/scripts/dpo_vlm.py",
                        "scripts/dpo.py", "scripts/run_dpo.py"),
                "distillation": ("trl/scripts/distillation.py", "examples/scripts/distillation.py"),
                "kto": ("trl/scripts/kto.py", "examples/scripts/kto.py"),
                "reward": ("trl/scripts/reward.py", "examples/scripts/reward_modeling.py"),
                "orpo": ("trl/scripts/orpo.py", "examples/scripts/orpo.py", "scripts/orpo.py", "scripts/run_orpo.py"),
                "cpo": ("trl/scripts/cpo.py", "examples/scripts/cpo.py")}
# the accelerate configs TRL ships (trl/accelerate_configs/<name>.yaml) that `trl ... --accelerate_config NAME` takes
_TRL_ACCELERATE = {"zero1": ("_zero_stage", 1), "zero2": ("_zero_stage", 2), "zero3": ("_zero_stage", 3),
                   "fsdp1": ("_use_fsdp", True), "fsdp2": ("_use_fsdp", True)}


# the TRL command a carried script runs by building its trainer (GRPOTrainer(...) -> "grpo"), while that script's
# command is read (_read_with_script_facts sets it around _read_launcher)
_SCRIPT_TRL_COMMAND: ContextVar[str | None] = ContextVar("script_trl_command", default=None)


def _trl_command(tokens: Sequence[str]) -> str | None:
    """``sft`` / ``dpo`` for ``trl sft ...`` / ``trl dpo ...``, for TRL's own scripts run directly, and for a carried
    script that builds one of TRL's preference or RL trainers."""
    names = [basename(t) for t in tokens[:3]]
    if "trl" in names:
        return next((c for c in _TRL_SCRIPTS if c in tokens[:4]), None)
    found = next((c for c, paths in _TRL_SCRIPTS.items() if any(t.endswith(paths) for t in tokens)), None)
    return found if found is not None else _SCRIPT_TRL_COMMAND.get()


def _accelerate_config_by_name(tokens: Sequence[str], unread: Sequence[str], raw: dict[str, Setting],
                               notes: list[str], where: str) -> None:
    """``accelerate launch --config_file zero2.yaml ...`` whose config the manifest does not carry (baked into the
    image: open-r1's recipes/accelerate_configs/zero2.yaml, TRL's examples/accelerate_configs/deepspeed_zero3.yaml):
    its distributed type read from the file name, as an unread DeepSpeed config's stage is, and said so. Without
    this, such a job read as plain data parallel: the model states of every rank unsharded."""
    if [basename(t) for t in tokens[:2]] != ["accelerate", "launch"]:
        return
    path = next((t.split("=", 1)[1] if t.startswith("--config_file=") else tokens[i + 1]
                 for i, t in enumerate(tokens[:-1] if tokens else [])
                 if t == "--config_file" or t.startswith("--config_file=")), None)
    if path is None and tokens and tokens[-1].startswith("--config_file="):
        path = tokens[-1].split("=", 1)[1]
    if path is None or path not in unread:
        return
    if any(k in raw for k in ("_deepspeed", "_fsdp", "_zero_stage", "_use_fsdp", "_use_deepspeed")):
        return  # the trainer's own flags say it
    name = basename(path).lower()
    stage, offload = deepspeed_stage_from_name(name)
    missing = f"accelerate config {path} is not in the manifest"
    if stage is not None and "fsdp" not in name:
        raw["_zero_stage"] = Setting(stage, f"accelerate config {path} (its file name: DeepSpeed ZeRO-{stage})", where)
        if offload:
            raw["offload"] = Setting("params+optimizer" if stage == 3 else "optimizer",
                                     f"accelerate config {path} (its file name: CPU offload)", where)
        notes.append(f"{missing}: DeepSpeed ZeRO stage {stage}{' with CPU offload' if offload else ''} read from its "
                     "file name (inline the config, or set sharding in the vramfit.io/spec annotation, if it says "
                     "otherwise)")
    elif "fsdp" in name:
        raw["_use_fsdp"] = Setting(True, f"accelerate config {path} (its file name: FSDP)", where)
        notes.append(f"{missing}: FSDP (full shard) read from its file name; its offload and precision are unknown")
    elif not any(word in name for word in ("multi_gpu", "ddp", "single_gpu")):
        notes.append(f"{missing} and its name does not say the distributed type: read as plain data parallel (inline "
                     "it, or set sharding in the vramfit.io/spec annotation)")


def _trl_accelerate_config(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    """``trl sft --accelerate_config zero2``: one of TRL's shipped accelerate configs by name (trl/accelerate_configs:
    zero1/zero2/zero3 are DeepSpeed ZeRO stages, fsdp1/fsdp2 full-shard FSDP, multi_gpu plain DDP)."""
    for i, token in enumerate(tokens):
        name = token.split("=", 1)[1] if token.startswith("--accelerate_config=") else (
            tokens[i + 1] if token == "--accelerate_config" and i + 1 < len(tokens) else None)
        if name is None:
            continue
        key = PurePosixPath(name).stem
        setting = _TRL_ACCELERATE.get(key)
        if setting is not None and not any(k in raw for k in ("_deepspeed", "_fsdp", "_zero_stage", "_use_fsdp")):
            raw[setting[0]] = Setting(setting[1], f"flag --accelerate_config {name} (TRL's {key} config)", where)
        elif setting is None and key not in ("multi_gpu", "single_gpu"):
            notes.append(f"--accelerate_config {name}: not one of TRL's shipped configs; its sharding is unknown")
        return


def launch_count(text: Any) -> int | None:
    """A positive whole count as launchers and configs write it: ``8`` -> 8; an elastic range ``1:4`` -> 4 (its
    maximum); ``gpu``/``auto``, 0 and the like -> None."""
    last = str(text).strip().rsplit(":", 1)[-1]
    # ASCII digits only (str.isdigit also accepts '²', which int() rejects), and short enough for int() (Python
    # limits int() of a string to 4300 digits); a count of more than 18 digits is no launch count
    if not _ASCII_COUNT.fullmatch(last):
        return None
    count = int(last)
    return count if count > 0 else None


_ASCII_COUNT = re.compile(r"[0-9]{1,18}")


def _launcher_flags(tokens: Sequence[str]) -> dict[str, str]:
    """The ``--flag value`` / ``--flag=value`` pairs of a launcher's own flags (before the script it runs)."""
    out: dict[str, str] = {}
    for i, token in enumerate(tokens):
        if token.endswith(".py") or token in ("-m", "--"):
            break
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            if not eq and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                value = tokens[i + 1]
            out.setdefault(norm_key(name), value)
    return out


def launch_layout(tokens: Sequence[str], accelerate_config: Mapping[str, Any] | None = None,
                  env: Mapping[str, str] | None = None) -> Launch | None:
    """Processes per node and nodes of a torchrun / ``python -m torch.distributed.run`` / accelerate / DeepSpeed
    launcher command (torch.distributed.run, accelerate commands/launch.py and deepspeed/launcher/runner.py
    argument lists); None for another command or when the flags do not say. torchrun takes a flag it is not given
    from the env var ``PET_<FLAG>`` (torch/distributed/argparse_util.py ``env``), e.g. ``PET_NPROC_PER_NODE``, which
    the Kubeflow training operator sets from a PyTorchJob's ``nprocPerNode``, or a user sets."""
    names = [basename(t) for t in tokens[:3]]
    module = "torch.distributed.run" in tokens[:4]  # python -m torch.distributed.run
    if module or names[:1] == ["torchrun"] or names[:2] == ["tune", "run"]:
        flags = _launcher_flags(tokens[list(tokens).index("torch.distributed.run") + 1 if module else 1:])
        from_env = {key: (env or {})[f"PET_{key.upper()}"] for key in ("nproc_per_node", "nnodes")
                    if key not in flags and f"PET_{key.upper()}" in (env or {})}
        flags = {**from_env, **flags}
        per_node, nodes = launch_count(flags.get("nproc_per_node", "")), launch_count(flags.get("nnodes", ""))
        source = "torchrun --nproc_per_node x --nnodes" + (
            f" ({', '.join(f'env PET_{k.upper()}' for k in from_env)})" if from_env else "")
    elif names and names[0] == "deepspeed":
        flags = _launcher_flags(tokens[1:])
        per_node, nodes = launch_count(flags.get("num_gpus", "")), launch_count(flags.get("num_nodes", ""))
        source = "deepspeed --num_gpus x --num_nodes"
    elif names[:2] == ["accelerate", "launch"]:
        flags = _launcher_flags(tokens[2:])
        config = accelerate_config or {}
        total = launch_count(flags.get("num_processes", config.get("num_processes", "")))
        nodes = launch_count(flags.get("num_machines", config.get("num_machines", "")))
        per_node = total // (nodes or 1) if total else None
        source = "accelerate --num_processes / --num_machines" + (
            f" ({config['_label']})" if config and "num_processes" not in flags else "")
    else:
        return None
    return Launch(per_node, nodes, source) if per_node or nodes else None


# --- torchtune ---------------------------------------------------------------------------------

_TUNE_LAUNCHER_VALUE_FLAGS = {
    "--nproc_per_node",
    "--nnodes",
    "--rdzv_endpoint",
    "--rdzv_backend",
    "--rdzv_id",
    "--master_addr",
    "--master_port",
    "--node_rank",
    "--max_restarts",
    "--rdzv-endpoint",
    "--nproc-per-node",
}
# torchtune model families -> catalog name prefixes (``llama3_2`` + ``1B`` -> ``llama-3.2-1b``).
_TUNE_FAMILIES = {
    "llama2": "llama-2",
    "llama3": "llama-3",
    "llama3_1": "llama-3.1",
    "llama3_2": "llama-3.2",
    "llama3_3": "llama-3.3",
    "code_llama2": "codellama",
    "mistral": "mistral",
    "gemma": "gemma",
    "gemma2": "gemma-2",
    "qwen2": "qwen2",
    "qwen2_5": "qwen2.5",
    "qwen3": "qwen3",
    "phi3": "phi-3",
    "phi4": "phi-4",
}


def torchtune_model(family: str, size: str) -> str:
    prefix = _TUNE_FAMILIES.get(family.lower(), family.lower().replace("_", "-"))
    name = f"{prefix}-{size.lower().replace('_', '.')}"
    # torchtune's mistral_7b is Mistral-7B-v0.1 (its configs download mistralai/Mistral-7B-v0.1), phi3_mini
    # Phi-3-Mini-4K-Instruct (microsoft/Phi-3-mini-4k-instruct), phi4_14b Phi-4 (microsoft/phi-4)
    return {"mistral-7b": "mistral-7b-v0.1", "phi-3-mini": "phi-3-mini-4k-instruct",
            "phi-4-14b": "phi-4"}.get(name, name)


def _tune_model_from_config(config: str) -> str | None:
    """The model a shipped config's name implies (``llama3_1/8B_lora`` -> llama-3.1-8b); None when the directory
    is not one of torchtune's model families (a mounted ``/cfg/8B_full.yaml`` names no model)."""
    parts = config.strip("/").split("/")
    if len(parts) < 2 or parts[-2].lower() not in _TUNE_FAMILIES:
        return None
    # a distillation config names the teacher's size, then the student's: llama3_2/8B_to_1B_KD_lora_single_device
    student = re.match(r"^\d+(?:[._]\d+)?[bm]?_to_(\d+(?:[._]\d+)?[bm])", parts[-1], re.I)
    size = student or re.match(r"^(\d+(?:[._]\d+)?[bm]|mini)", parts[-1], re.I)
    return torchtune_model(parts[-2], size.group(1)) if size else None


def _tune_model_from_component(component: str) -> tuple[str | None, str | None]:
    name = component.rsplit(".", 1)[-1]
    method = "qlora" if name.startswith("qlora_") else "lora" if name.startswith("lora_") else None
    name = re.sub(r"^q?lora_", "", name)
    # a known family first (``llama3_1_8b`` is llama3_1 + 8b, not llama3 + 1_8b), then any ``family_size``
    for family in sorted(_TUNE_FAMILIES, key=len, reverse=True):
        if name.lower().startswith(family + "_"):
            size = re.match(r"^(\d+(?:_\d+)?[bm])(?:_|$)", name[len(family) + 1:], re.I)
            if size:
                return torchtune_model(family, size.group(1)), method
    match = re.match(r"^(.*?)_(\d+(?:_\d+)?[bm])(?:_.*)?$", name, re.I)
    return (torchtune_model(match.group(1), match.group(2)) if match else None), method


def _tune_loss(component: Any) -> str | None:
    """torchtune's loss component as a cross_entropy value: CEWithChunkedOutputLoss is chunked, torch's
    CrossEntropyLoss the full loss. LinearCrossEntropyLoss (the newest configs) applies the output projection chunk
    by chunk inside the loss: read as chunked, which also counts a list of every chunk's logits that it does not
    keep (an over-estimate of 2 bytes per logit); KD losses are not read."""
    name = str(component).strip().rsplit(".", 1)[-1]
    return {"CEWithChunkedOutputLoss": "chunked", "LinearCrossEntropyLoss": "chunked",
            "CrossEntropyLoss": "full"}.get(name)


_TUNE_LORA_PARTS = ("model.lora_attn_modules", "model.apply_lora_to_mlp", "model.apply_lora_to_output")


@functools.lru_cache(maxsize=1)
def _torchtune_configs() -> dict[str, dict[str, Any]]:
    from importlib import resources

    text = (resources.files("scheduler") / "data" / "torchtune_configs.yaml").read_text(encoding="utf-8")
    data = safe_load(text)
    return data if isinstance(data, dict) else {}


def torchtune_config(name: str) -> dict[str, Any] | None:
    """The settings of torchtune's shipped config ``name`` (``llama3_1/8B_lora_single_device``, a trailing
    ``.yaml`` allowed), or None for a config vramfit does not know (a local file, a newer config)."""
    key = name.strip().removesuffix(".yaml").removesuffix(".yml")
    return _torchtune_configs().get(key)


_TUNE_KEYS: dict[str, tuple[str, Convert]] = {
    "batch_size": ("micro_batch_size", _same),
    "gradient_accumulation_steps": ("grad_accum_steps", _same),
    "enable_activation_checkpointing": ("gradient_checkpointing", to_bool),
    "tokenizer.max_seq_len": ("seq_len", _same),
    "model.lora_rank": ("lora.rank", _same),
    "model.lora_alpha": ("lora.alpha", _same),
    "model.lora_dropout": ("lora.dropout", _same),
    "model.use_dora": ("lora.use_dora", to_bool),  # torchtune's LoRA builders take use_dora (DoRALinear)
    "optimizer._component_": ("optimizer", optimizer_name),
    "dtype": (
        "precision",
        lambda v: {"bf16": "bf16-true", "fp32": "32-true", "fp16": "16-true"}.get(str(v), v),
    ),
    "fsdp_cpu_offload": ("offload", lambda v: "params+optimizer" if to_bool(v) is True else "none"),
    "optimizer_in_bwd": ("optimizer_in_backward", to_bool),
    "optimizer.fused": ("fused_optimizer", to_bool),
    "compile": ("torch_compile", to_bool),
    "enable_activation_offloading": ("activation_offloading", to_bool),
    **dict.fromkeys(("loss", "loss._component_"), ("cross_entropy", _tune_loss)),
    "max_steps_per_epoch": ("steps", _positive),
    # torchtune's SFT datasets: packed (PackedDataset, every sequence filled to max_seq_len) or each batch padded to
    # its longest sample (padded_collate_sft)
    "dataset.packed": ("sequence_lengths", lambda v: {True: "fixed", False: "variable"}[b]
                       if isinstance(b := to_bool(v), bool) else str(v)),
}


def _flatten(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """A nested config as dotted keys (``model: {_component_: x}`` -> ``model._component_``), as torchtune's
    ``key=value`` overrides name them."""
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        dotted_key = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out += _flatten(value, f"{dotted_key}.")
        else:
            out.append((dotted_key, value))
    return out


def _split_config_tokens(tokens: Sequence[str]) -> list[str]:
    """``--config NAME`` given as one argv element (Kubeflow Trainer's torchtune runtimes ship
    ``- --config llama3_2/1B_full.yaml``) as the two tokens torchtune's parser sees after the launcher splits it."""
    out: list[str] = []
    for token in tokens:
        if token.startswith(("--config ", "-c ")) and len(token.split()) == 2:
            out += token.split()
        else:
            out.append(token)
    return out


def _tune_parallel_dims(pairs: Sequence[tuple[str, Any, str]], where: str) -> Settings:
    """The device mesh of torchtune's distributed recipes (full_finetune_distributed and the others that build
    ``training.ParallelDims``): ``tensor_parallel_dim`` (a plan of Colwise/Rowwise linears, the norms and the
    activations between them whole: no sequence parallelism), ``context_parallel_dim``, and
    ``data_parallel_shard_dim`` / ``data_parallel_replicate_dim`` (HSDP: the shard groups' states replicated). Each
    defaults to 1 (shard: -1, every remaining rank)."""
    last = {key: (value, source) for key, value, source in pairs}
    out: Settings = {}
    tp = last.get("tensor_parallel_dim")
    if tp is not None and (size := launch_count(tp[0])) is not None and size > 1:
        out["tensor_parallel"] = Setting(size, tp[1], where)
        out["sequence_parallel"] = Setting(False, f"{tp[1]} (torchtune's tensor-parallel plans split the linears "
                                                  "only)", where)
    cp = last.get("context_parallel_dim")
    if cp is not None and (size := launch_count(cp[0])) is not None and size > 1:
        out["context_parallel"] = Setting(size, cp[1], where)
    shard, replicate = last.get("data_parallel_shard_dim"), last.get("data_parallel_replicate_dim")
    out.update(hybrid_markers(Setting(shard[0], shard[1], where) if shard is not None else None,
                              Setting(replicate[0], replicate[1], where) if replicate is not None else None))
    return out


def read_torchtune(tokens: Sequence[str], where: str, env: Mapping[str, str] | None = None,
                   files: Mapping[str, str] | None = None) -> Reading:
    """``tune run [launcher flags] RECIPE --config CONFIG key=value ...`` (tokens after ``tune run``): the config
    the manifest carries (a heredoc or a ConfigMap key of its file name), else torchtune's shipped config of that
    name, then the overrides."""
    recipe, config = "", ""
    overrides: list[tuple[str, str]] = []
    tokens = _split_config_tokens(tokens)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        name = token.split("=", 1)[0]
        if token in ("--config", "-c") and i < len(tokens):
            config, i = tokens[i], i + 1
        elif name == "--config":
            config = token.split("=", 1)[1]
        elif token.startswith("-"):
            if name in _TUNE_LAUNCHER_VALUE_FLAGS and "=" not in token:
                i += 1
        elif not recipe and "=" not in token:
            recipe = token
        elif "=" in token:
            overrides.append((name, token.split("=", 1)[1]))
    out: Settings = {}
    notes: list[str] = []
    launch = launch_layout(["tune", "run", *tokens], None, env)
    label = f"torchtune {recipe} --config {config}".strip()
    recipe = PurePosixPath(recipe).stem if recipe.endswith(".py") else recipe  # a copied recipe (`tune cp`)
    if recipe.startswith("full_finetune"):
        out["method"] = Setting("full", f"torchtune recipe {recipe}", where)
    elif recipe.startswith("lora_finetune"):
        method = "qlora" if "qlora" in config.lower() else "lora"
        out["method"] = Setting(method, f"{label}", where)
    elif recipe.startswith(("knowledge_distillation", "kd_")):
        # torchtune's KD recipes (kd_single_device / kd_distributed before their rename) train the student's LoRA
        # adapters (_setup_model: get_adapter_params, set_trainable_params), whatever the config's name says
        out["method"] = Setting("lora", f"torchtune recipe {recipe} (trains LoRA adapters)", where)
    if recipe.endswith("_distributed"):
        out["sharding"] = Setting("fsdp", f"torchtune recipe {recipe} (FSDP)", where)
    if recipe:  # torchtune's own LoRA modules and torchao's NF4 (TrainingSpec framework: torchtune)
        out["framework"] = Setting("torchtune", f"torchtune recipe {recipe}", where)
        # importing torchtune turns on expandable segments unless the allocator setting turns them off
        # (torchtune/__init__.py: torch.cuda.memory._set_allocator_settings("expandable_segments:True"))
        # (torchtune reads PYTORCH_CUDA_ALLOC_CONF only: with PYTORCH_ALLOC_CONF alone it still turns them on)
        if "expandable_segments:False" not in (env or {}).get("PYTORCH_CUDA_ALLOC_CONF", ""):
            out["expandable_segments"] = Setting(True, TORCHTUNE_ALLOCATOR_SOURCE, where)
    content = (files or {}).get(basename(config)) if config else None
    carried = _load_mapping(content) if content is not None else None
    model = _tune_model_from_config(config) if carried is None else None
    if model:
        out["model"] = Setting(model, f"torchtune config {config}", where)
    shipped = torchtune_config(config) if config and carried is None else None
    pairs: list[tuple[str, Any, str]] = []
    if carried is not None:
        pairs = [(k, v, f"torchtune config {config} key {k}") for k, v in _flatten(carried)]
        if not any(k == "dtype" for k, _, _ in pairs):
            out["precision"] = Setting("bf16-true", f"torchtune config {config} (no dtype: bf16 assumed)", where)
        if not any(k == "tokenizer.max_seq_len" and v not in (None, "") for k, v, _ in pairs):
            notes.append(f"torchtune config {config} sets no tokenizer.max_seq_len: sequence length is the "
                         "dataset's")
    elif content is not None:
        notes.append(f"torchtune config {config} in the manifest is not a readable YAML mapping; its settings "
                     "are unknown")
    if shipped is not None:
        commit = str(shipped.get("commit", ""))[:9]
        pairs = [(k, v, f"torchtune config {config} (shipped, pytorch/torchtune@{commit})")
                 for k, v in shipped.items() if k != "commit"]
        notes.append(f"torchtune config {config}: its shipped settings (pytorch/torchtune@{commit}) are used; a "
                     "local copy that differs is not seen (give its settings as key=value overrides or in the "
                     "vramfit.io/spec annotation); sequence length is the dataset's")
    elif config and carried is None:
        out["precision"] = Setting("bf16-true", f"torchtune config {config} (dtype bf16)", where)
        notes.append(
            f"torchtune config {config} is not read (only its name and the overrides): dtype bf16 "
            "assumed as in torchtune's shipped configs; batch size and sequence length unknown"
        )
    pairs += [(key, value, f"torchtune override {key}" if key == "model._component_" else
               f"torchtune override {key}={value}") for key, value in overrides]
    lora_parts: dict[str, tuple[Any, str]] = {}  # lora_attn_modules / apply_lora_to_mlp / apply_lora_to_output
    for key, value, source in pairs:
        if key == "model._component_":
            component_model, method = _tune_model_from_component(str(value))
            if component_model:
                out["model"] = Setting(component_model, source, where)
            if method:
                out["method"] = Setting(method, source, where)
            continue
        if key in _TUNE_LORA_PARTS:
            lora_parts[key] = (value, source)
            continue
        rule = _TUNE_KEYS.get(key)
        if rule is not None and (converted := rule[1](value)) is not None:
            out[rule[0]] = Setting(converted, source, where)
    fused, optimizer = out.get("fused_optimizer"), out.get("optimizer")
    if fused is not None and optimizer is not None and optimizer.value not in FUSABLE_OPTIMIZERS:
        del out["fused_optimizer"]  # the config's fused: True belongs to the torch optimizer an override replaced
    out.update(_tune_parallel_dims(pairs, where))
    if "model.lora_attn_modules" in lora_parts:
        # torchtune's LoRA builders: adapters on the named attention projections, on the MLP's three projections
        # (w1, w2, w3) with apply_lora_to_mlp, and on the output head with apply_lora_to_output
        attn, attn_source = lora_parts["model.lora_attn_modules"]
        targets = re.findall(r"\w+", str(attn))
        sources = [attn_source]
        for key, roles in (("model.apply_lora_to_mlp", ["gate_proj", "up_proj", "down_proj"]),
                           ("model.apply_lora_to_output", ["lm_head"])):
            if key in lora_parts and to_bool(lora_parts[key][0]) is True:
                targets += [r for r in roles if r not in targets]
                sources.append(lora_parts[key][1])
        out["lora.target_modules"] = Setting(targets, "; ".join(dict.fromkeys(sources)), where)
    quantize = next(((v, source) for k, v, source in reversed(pairs) if k == "model.quantize_base"), None)
    if quantize is not None and to_bool(quantize[0]) is True and out.get("method") is not None and \
            out["method"].value == "lora":
        # torchtune's LoRA builders take quantize_base (its qlora_* builders are partials with it set): the adapted
        # layers' base weights in NF4 (torchao to_nf4; DoRALinear / LoRALinear), i.e. QLoRA / QDoRA
        out["method"] = Setting("qlora", f"{quantize[1]} (quantize_base: NF4 base weights)", where)
    method = out.get("method")
    if method is not None and method.value in ("lora", "qlora") and "lora.dropout" not in out:
        # torchtune's LoRA builders default lora_dropout to 0.0 (torchtune/models/*/_model_builders.py)
        out["lora.dropout"] = Setting(0.0, "torchtune LoRA builders' default lora_dropout 0.0", where)
    if "dpo" in recipe:
        # torchtune's DPO recipes forward the chosen and rejected responses together (concatenated_forward); the full
        # recipe also loads a frozen reference model (recipes/full_dpo_distributed.py)
        _pair_batch(out, f"torchtune {recipe}", where)
        if recipe.startswith("full_dpo"):
            out["reference_model"] = Setting(True, f"torchtune {recipe} (a frozen reference model)", where)
    teacher = next(((v, source) for k, v, source in pairs if k == "teacher_model._component_"), None)
    if teacher is not None:
        # torchtune's KD recipes build the teacher from this component beside the student, in the same dtype
        teacher_name, _ = _tune_model_from_component(str(teacher[0]))
        if teacher_name:
            out["teacher_model"] = Setting(teacher_name, teacher[1], where)
        else:
            notes.append(f"knowledge distillation: the teacher {str(teacher[0]).rsplit('.', 1)[-1]} ({teacher[1]}) "
                         "names no model vramfit knows; it is not counted (an under-estimate of its weights' bytes): "
                         "set teacher_model in the vramfit.io/spec annotation")
    elif "distillation" in recipe or recipe.startswith("kd_"):
        notes.append(f"knowledge distillation recipe {recipe}: its teacher is not known (the config is not read); it "
                     "is not counted (an under-estimate of its weights' bytes): set teacher_model in the "
                     "vramfit.io/spec annotation")
    return Reading(out, notes, "torchtune" if recipe else "", launch)
