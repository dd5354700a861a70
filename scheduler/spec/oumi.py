"""Oumi (oumi-ai/oumi): ``oumi train -c CONFIG.yaml [--section.key value ...]``, also behind
``oumi distributed torchrun`` / ``accelerate`` (``-m oumi train``).

One YAML of Oumi's TrainingConfig (oumi/core/configs: ``model`` ModelParams, ``training`` TrainingParams, ``peft``
PeftParams, ``fsdp`` FSDPParams), read as the HF-style flags the trainer readers know, with Oumi's own defaults where
they differ from the TrainingSpec's (params at oumi 0a5176b): the model loaded in ``torch_dtype_str`` (default
float32) and trained without autocast unless ``mixed_precision_dtype`` is FP16 / BF16 (default NONE); the collator
truncating at ``model_max_length``; ``lora_r`` 8, ``lora_alpha`` 8, ``lora_dropout`` 0.0; QLoRA (``q_lora``) in
``q_lora_bits`` (4) with ``bnb_4bit_quant_type`` (fp4 by default, as bitsandbytes') and ``use_bnb_nested_quant``
(False); FSDP from ``enable_fsdp`` with its ``sharding_strategy`` (FULL_SHARD) and ``cpu_offload``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# section.key -> the flag of the same meaning
_KEYS = {
    "model.model_name": "model_name_or_path", "model.model_max_length": "max_seq_length",
    "model.torch_dtype_str": "torch_dtype", "model.attn_implementation": "attn_implementation",
    "training.per_device_train_batch_size": "per_device_train_batch_size",
    "training.gradient_accumulation_steps": "gradient_accumulation_steps",
    "training.enable_gradient_checkpointing": "gradient_checkpointing", "training.optimizer": "optim",
    "training.use_peft": "use_peft", "training.compile": "torch_compile", "training.max_steps": "max_steps",
    "peft.lora_r": "lora_r", "peft.lora_alpha": "lora_alpha", "peft.lora_dropout": "lora_dropout",
    "peft.lora_target_modules": "lora_target_modules", "peft.bnb_4bit_quant_type": "bnb_4bit_quant_type",
    "peft.use_bnb_nested_quant": "bnb_4bit_use_double_quant",
}
# Oumi's defaults that differ from the spec's, as (section.key, value, what)
_DEFAULTS = (("model.torch_dtype_str", "float32", "torch_dtype_str float32"),
             ("peft.lora_r", 8, "lora_r 8"), ("peft.lora_alpha", 8, "lora_alpha 8"),
             ("peft.lora_dropout", 0.0, "lora_dropout 0.0"),
             ("peft.use_bnb_nested_quant", False, "use_bnb_nested_quant False"),
             ("peft.bnb_4bit_quant_type", "fp4", "bnb_4bit_quant_type fp4"))
_MIXED = {"fp16": ("fp16", True), "bf16": ("bf16", True)}
_STRATEGIES = {"FULL_SHARD": "full_shard", "HYBRID_SHARD": "hybrid_shard", "SHARD_GRAD_OP": "shard_grad_op",
               "HYBRID_SHARD_ZERO2": "hybrid_shard_zero2", "NO_SHARD": "no_shard"}


def oumi_config(tokens: Sequence[str]) -> tuple[str, list[tuple[str, str]]] | None:
    """(CONFIG, the ``--section.key value`` overrides) of ``oumi train -c CONFIG ...``, else None."""
    for i, token in enumerate(tokens[:-1]):
        if (token == "oumi" or token.endswith("/oumi")) and tokens[i + 1] == "train":
            rest = list(tokens[i + 2:])
            config, overrides, j = None, [], 0
            while j < len(rest):
                word = rest[j]
                name, eq, value = word.partition("=")
                if name in ("-c", "--config"):
                    config, j = (value, j + 1) if eq else (rest[j + 1] if j + 1 < len(rest) else None, j + 2)
                    continue
                if name.startswith("--") and "." in name:
                    if not eq and j + 1 < len(rest):
                        value, j = rest[j + 1], j + 1
                    overrides.append((name[2:], value))
                j += 1
            return (config, overrides) if config else None
    return None


def oumi_pairs(config: str, overrides: Sequence[tuple[str, str]], data: Mapping[str, Any] | None
               ) -> tuple[list[tuple[str, Any, str]], list[str]]:
    """The job's settings as ``(flag, value, source)`` and notes."""
    label = f"Oumi config {config}"
    if data is None:
        return [], [f"{label} is not in the manifest: its settings are unknown (set them in the vramfit.io/spec "
                    "annotation)"]
    values: dict[str, tuple[Any, str]] = {}
    for section in ("model", "training", "peft", "fsdp"):
        part = data.get(section)
        if isinstance(part, Mapping):
            for key, value in part.items():
                values[f"{section}.{key}"] = (value, f"{label} key {section}.{key}")
    for key, value in overrides:
        values[key] = (value, f"override --{key}")
    for key, value, what in _DEFAULTS:
        values.setdefault(key, (value, f"Oumi default {what}"))
    targets = values.get("peft.lora_target_modules")
    if targets is not None and targets[0] == ["all-linear"]:
        values["peft.lora_target_modules"] = ("all-linear", targets[1])  # PeftParams.to_lora passes the string
    pairs = [(flag, values[key][0], values[key][1]) for key, flag in _KEYS.items()
             if key in values and values[key][0] is not None]
    peft = str(values.get("training.use_peft", (False, ""))[0]).lower() in ("true", "1")
    quantized = values.get("peft.q_lora")
    if peft and quantized is not None and str(quantized[0]).lower() in ("true", "1"):
        bits = str(values.get("peft.q_lora_bits", (4, ""))[0])
        pairs.append(("load_in_8bit" if bits == "8" else "load_in_4bit", True, quantized[1]))
    mixed = values.get("training.mixed_precision_dtype")
    flag = _MIXED.get(str(mixed[0]).strip().lower()) if mixed is not None else None
    if flag is not None and mixed is not None:
        pairs.append((flag[0], flag[1], mixed[1]))
    enabled = values.get("fsdp.enable_fsdp")
    if enabled is not None and str(enabled[0]).lower() in ("true", "1"):
        strategy = values.get("fsdp.sharding_strategy", ("FULL_SHARD", "Oumi default sharding_strategy FULL_SHARD"))
        words = [_STRATEGIES.get(str(strategy[0]).strip().upper(), "full_shard"), "auto_wrap"]
        offload = values.get("fsdp.cpu_offload")
        if offload is not None and str(offload[0]).lower() in ("true", "1"):
            words.append("offload")
        pairs.append(("fsdp", " ".join(words), f"{enabled[1]} ({strategy[1]})"))
    notes = [f"{label}: Oumi's TrainingConfig read (model, training, peft, fsdp); the model trains in "
             f"{values['model.torch_dtype_str'][0]}"
             + ("" if flag else " without autocast (mixed_precision_dtype NONE)")]
    return pairs, notes
