"""llm-foundry jobs: ``composer scripts/train/train.py CONFIG.yaml [key=value ...]``.

MosaicML's llm-foundry (github.com/mosaicml/llm-foundry) trains from one YAML (``scripts/train/yamls/``), with
OmegaConf ``key=value`` overrides after it, and ``${variables.NAME}`` interpolations of its ``variables:`` section.
Read when the manifest carries the file (a heredoc or a ConfigMap key of that name), from
``llmfoundry/command_utils/train.py`` and ``scripts/train/yamls/finetune/llama-3-8b_dolly_sft.yaml`` at
mosaicml/llm-foundry 6ea80d3:

* ``model.pretrained_model_name_or_path`` (``hf_causal_lm``), or ``mpt_causal_lm``'s own ``d_model``, ``n_heads``,
  ``n_layers``, ``expansion_ratio`` and ``vocab_size`` (an inline MPT config); ``model.peft_config`` (LoRA: ``r``,
  ``lora_alpha``, ``lora_dropout``, ``target_modules``);
* ``max_seq_len`` the trained length; ``device_train_microbatch_size`` the micro-batch (``auto``: Composer searches
  the largest that fits, noted), at most each GPU's share of ``global_train_batch_size`` (the merge applies it once
  the GPU count is known);
* ``precision``: ``amp_bf16`` / ``amp_fp8`` bf16 mixed, ``amp_fp16`` fp16 mixed, ``fp32``;
* ``fsdp_config``: ``sharding_strategy`` (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD),
  ``activation_checkpointing``, ``activation_cpu_offload``; no ``fsdp_config`` on several GPUs is DDP;
* ``optimizer.name``: ``decoupled_adamw`` / ``adamw`` AdamW, ``decoupled_lionw`` Lion, ``decoupled_sgdw`` SGD.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.spec.trainer_args import MICRO_BATCH_CAP, Setting, launch_count, to_bool

_PRECISION = {"amp_bf16": "bf16-mixed", "amp_fp8": "bf16-mixed", "amp_fp16": "16-mixed", "fp32": "32-true"}
_SHARDING = {"FULL_SHARD": "fsdp", "SHARD_GRAD_OP": "fsdp-grad-op", "NO_SHARD": "ddp", "HYBRID_SHARD": "fsdp",
             "_HYBRID_SHARD_ZERO2": "fsdp-grad-op"}
_OPTIMIZERS = {"decoupled_adamw": "adamw", "adamw": "adamw", "decoupled_lionw": "lion", "decoupled_sgdw": "sgd",
               "decoupled_adopt": "adamw"}
_MPT_KEYS = ("d_model", "n_heads", "n_layers", "expansion_ratio", "vocab_size", "max_seq_len", "no_bias")
_INTERPOLATION = re.compile(r"^\$\{variables\.([\w.]+)\}$")


def is_llm_foundry_config(data: Mapping[str, Any]) -> bool:
    """A training YAML of llm-foundry: a ``model`` mapping whose ``name`` is one of its model classes, beside its
    own batch keys."""
    model = data.get("model")
    return (isinstance(model, Mapping) and str(model.get("name", "")) in ("hf_causal_lm", "mpt_causal_lm",
                                                                          "hf_t5")
            and any(k in data for k in ("global_train_batch_size", "device_train_microbatch_size", "max_seq_len")))


def read_llm_foundry(data: Mapping[str, Any], overrides: Sequence[tuple[str, str]], label: str,
                     where: str) -> tuple[dict[str, Setting], list[str]]:
    """Raw settings (as the trainer readers give them) of an llm-foundry YAML with the command's overrides."""
    merged = _with_overrides(data, overrides)
    variables = merged.get("variables") if isinstance(merged.get("variables"), Mapping) else {}

    def get(path: str) -> Any:
        node: Any = merged
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return _resolved(node, variables)

    out: dict[str, Setting] = {}
    notes: list[str] = []

    def put(field: str, value: Any, key: str) -> None:
        if value is not None:
            out[field] = Setting(value, f"{label} key {key}", where)

    model = get("model")
    model = model if isinstance(model, Mapping) else {}  # an override may replace the mapping by a word
    name = get("model.pretrained_model_name_or_path")
    if isinstance(name, str) and name.strip():
        put("model", name.strip(), "model.pretrained_model_name_or_path")
    elif str(model.get("name")) == "mpt_causal_lm" and all(get(f"model.{k}") is not None
                                                           for k in ("d_model", "n_heads", "n_layers")):
        config = {"model_type": "mpt", **{k: get(f"model.{k}") for k in _MPT_KEYS if get(f"model.{k}") is not None}}
        config.setdefault("vocab_size", 50368)  # MPTConfig's default vocabulary (llmfoundry/models/mpt)
        config.setdefault("expansion_ratio", 4)
        put("model", {"name": "mpt_causal_lm", "config": config}, "model (mpt_causal_lm)")
    peft = get("model.peft_config")
    if isinstance(peft, Mapping) and str(peft.get("peft_type", "LORA")).upper() == "LORA":
        out["_peft"] = Setting(True, f"{label} key model.peft_config (LoRA)", where)
        put("lora.rank", peft.get("r"), "model.peft_config.r")
        put("lora.alpha", peft.get("lora_alpha"), "model.peft_config.lora_alpha")
        put("lora.dropout", peft.get("lora_dropout"), "model.peft_config.lora_dropout")
        put("lora.target_modules", peft.get("target_modules"), "model.peft_config.target_modules")
    length = launch_count(get("max_seq_len"))
    put("seq_len", length, "max_seq_len")
    micro = get("device_train_microbatch_size")
    if str(micro).strip().lower() == "auto":
        notes.append(f"{label}: device_train_microbatch_size auto (Composer searches the largest micro-batch that "
                     "fits); set micro_batch_size in the vramfit.io/spec annotation")
    elif (count := launch_count(micro)) is not None:
        put("micro_batch_size", count, "device_train_microbatch_size")
        total = launch_count(get("global_train_batch_size"))
        if total is not None:  # each GPU's share caps the micro-batch: the merge knows the GPU count
            out[MICRO_BATCH_CAP] = Setting(total, f"{label} key global_train_batch_size", where)
    precision = get("precision")
    if precision is not None:
        put("precision", _PRECISION.get(str(precision).strip().lower()), "precision")
        if str(precision).strip().lower() not in _PRECISION:
            notes.append(f"{label}: precision {precision} is not one vramfit reads")
    fsdp = get("fsdp_config")
    if isinstance(fsdp, Mapping):
        strategy = str(fsdp.get("sharding_strategy", "FULL_SHARD")).strip().upper()
        put("sharding", _SHARDING.get(strategy), "fsdp_config.sharding_strategy")
        if strategy.startswith(("HYBRID", "_HYBRID")):
            notes.append(f"{label}: fsdp_config.sharding_strategy {strategy} shards within a node and replicates "
                         "across nodes; set shard_group_size (GPUs per node) in the vramfit.io/spec annotation")
        if fsdp.get("activation_checkpointing") is not None:
            put("gradient_checkpointing", to_bool(fsdp.get("activation_checkpointing")) is True,
                "fsdp_config.activation_checkpointing")
        if to_bool(fsdp.get("activation_cpu_offload")) is True:
            put("activation_offloading", True, "fsdp_config.activation_cpu_offload")
    optimizer = get("optimizer.name")
    if optimizer is not None:
        put("optimizer", _OPTIMIZERS.get(str(optimizer).strip().lower(), optimizer), "optimizer.name")
    return out, notes


def _with_overrides(data: Mapping[str, Any], overrides: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``data`` with OmegaConf dotted ``key=value`` overrides (scripts/train/train.py merges them over the YAML)."""
    merged: dict[str, Any] = _copy(data)
    for key, value in overrides:
        node = merged
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):  # a word where a mapping was: OmegaConf replaces it too
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    return merged


def _copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def _resolved(value: Any, variables: Mapping[str, Any], depth: int = 0) -> Any:
    """``${variables.NAME}`` -> that variable's value (itself resolved, a few levels deep); anything else as it is."""
    match = _INTERPOLATION.match(value.strip()) if isinstance(value, str) else None
    if match is None or depth > 4:
        return value
    node: Any = variables
    for part in match.group(1).split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return _resolved(node, variables, depth + 1)
