"""NVIDIA NeMo 1 (Megatron) jobs: ``python .../megatron_gpt_pretraining.py [--config-path DIR --config-name FILE]
key=value ...`` and the tuning scripts (``megatron_gpt_finetuning.py``, ``megatron_gpt_sft.py``).

NeMo 1's examples take a Hydra config (the script's ``conf/*.yaml``, or ``--config-name`` in ``--config-path``,
which the NeMo-Framework-Launcher's Kubernetes chart mounts from a ConfigMap) and ``key=value`` overrides over it.
Read: the carried ``--config-name`` file when the manifest carries it, then the overrides, the later winning:

* the model: ``model.restore_from_path`` (a ``.nemo`` file, read by its name: ``Llama-2-7b-chat.nemo`` as
  Llama-2-7b-chat), or the config's own shape (``model.num_layers``, ``hidden_size``, ``ffn_hidden_size``,
  ``num_attention_heads``, ``num_query_groups``; the vocabulary from ``model.tokenizer.type`` when it names a catalog
  model) as an inline Llama-style config;
* ``model.micro_batch_size``, ``model.tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
  ``context_parallel_size``; the length from ``model.data.train_ds.max_seq_length``, ``model.data.seq_length`` or
  ``model.encoder_seq_length``;
* ``trainer.precision`` (``bf16`` / ``bf16-mixed``, ``16`` / ``16-mixed``, ``32``): mixed precision either way
  (``megatron_amp_O2`` keeps bf16 parameters with fp32 main ones in the optimizer);
* ``model.activations_checkpoint_granularity`` (``full`` / ``selective``; null: no recompute);
* ``model.optim.name``: ``distributed_fused_adam`` shards the fp32 main parameters and Adam states over the
  data-parallel ranks (read as ZeRO-1), ``fused_adam`` / ``adam`` AdamW;
* ``model.peft.peft_scheme``: ``lora`` (``lora_tuning.adapter_dim``, default 32, on ``attention_qkv``: the fused QKV,
  megatron_gpt_finetuning_config.yaml), other schemes (ptuning, adapter, ia3) freeze the base as LoRA does and are
  read as it, noted.

NeMo 2 (``nemo llm finetune --factory NAME``) builds its recipe in Python and is not read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from scheduler.spec.trainer_args import Setting, _flatten, _load_mapping, basename, launch_count

_SCRIPTS = ("megatron_gpt_pretraining.py", "megatron_gpt_finetuning.py", "megatron_gpt_sft.py",
            "megatron_gpt_peft_tuning.py", "megatron_llama_pretraining.py")
_PRECISION = {"bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed", "16": "16-mixed", "16-mixed": "16-mixed",
              "32": "32-true", "32-true": "32-true", "bf16-true": "bf16-true"}
# NeMo's LoRA target names (megatron_gpt_finetuning_config.yaml lora_tuning.target_modules) as TrainingSpec roles
_TARGETS = {"attention_qkv": ["q_proj", "k_proj", "v_proj"], "attention_dense": ["o_proj"],
            "mlp_fc1": ["gate_proj", "up_proj"], "mlp_fc2": ["down_proj"],
            "all": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def is_nemo(tokens: Sequence[str]) -> bool:
    """A NeMo 1 Megatron example script among the command's words."""
    return any(basename(t) in _SCRIPTS for t in tokens)


def read_nemo(tokens: Sequence[str], files: Mapping[str, str], where: str
              ) -> tuple[dict[str, Setting], list[str]]:
    """Raw settings (as the trainer readers give them) of a NeMo 1 command: its carried Hydra config, then its
    overrides."""
    notes: list[str] = []
    values: dict[str, tuple[Any, str]] = {}
    config_name = _flag(tokens, "--config-name")
    if config_name:
        name = config_name if config_name.endswith((".yaml", ".yml")) else f"{config_name}.yaml"
        content = files.get(basename(name))
        data = _load_mapping(content) if content is not None else None
        if isinstance(data, dict):
            values.update({k: (v, f"NeMo config {name} key {k}") for k, v in _flatten(data)})
        else:
            notes.append(f"NeMo config {name} is not in the manifest: only the command's overrides are read")
    for token in tokens:
        key, sep, value = token.partition("=")
        if sep and not token.startswith("-") and key.lstrip("+~").startswith(("model.", "trainer.")):
            values[key.lstrip("+~")] = (value.strip("'\""), f"NeMo override {key.lstrip('+~')}={value}")
    out: dict[str, Setting] = {}

    def put(field: str, value: Any, key: str) -> None:
        if value is not None:
            out[field] = Setting(value, values[key][1], where)

    def get(*keys: str) -> tuple[Any, str] | None:
        return next(((values[k][0], k) for k in keys if k in values and values[k][0] not in (None, "", "null")),
                    None)

    _model(values, out, notes, where)
    for key, field in (("model.micro_batch_size", "micro_batch_size"),
                       ("model.tensor_model_parallel_size", "tensor_parallel"),
                       ("model.pipeline_model_parallel_size", "pipeline_parallel"),
                       ("model.context_parallel_size", "context_parallel")):
        if (found := get(key)) is not None and (count := launch_count(found[0])) is not None:
            put(field, count, found[1])
    if (length := get("model.data.train_ds.max_seq_length", "model.data.seq_length", "model.encoder_seq_length")):
        put("seq_len", launch_count(length[0]), length[1])
    if (precision := get("trainer.precision")) is not None:
        put("precision", _PRECISION.get(str(precision[0]).strip().lower()), precision[1])
    granularity = get("model.activations_checkpoint_granularity")
    text = str(granularity[0]).strip().lower() if granularity else ""
    if granularity is not None and text in ("full", "selective"):
        put("gradient_checkpointing", text, granularity[1])
    elif "model.activations_checkpoint_granularity" in values:
        out["gradient_checkpointing"] = Setting("none", values["model.activations_checkpoint_granularity"][1] +
                                                " (null: no recompute)", where)
    if (optim := get("model.optim.name")) is not None:
        name = str(optim[0]).strip().lower()
        if name == "distributed_fused_adam":
            out["_zero_stage"] = Setting(1, values[optim[1]][1] + " (fp32 main parameters and Adam states sharded "
                                                                  "over the data-parallel ranks)", where)
        if "adam" in name:
            put("optimizer", "adamw", optim[1])
    _peft(values, out, notes, where)
    if out and "_bf16" not in out and "precision" not in out:
        notes.append("NeMo: trainer.precision not in view (the config's own default, often bf16, is not read): "
                     "set precision in the vramfit.io/spec annotation")
    return out, notes


def _model(values: Mapping[str, tuple[Any, str]], out: dict[str, Setting], notes: list[str], where: str) -> None:
    """The model a ``.nemo`` checkpoint's name gives, else the shape the config states."""
    restore = values.get("model.restore_from_path")
    if restore is not None and str(restore[0]).strip() not in ("", "null"):
        name = PurePosixPath(str(restore[0]).strip()).name
        if name.endswith(".nemo"):
            name = name[: -len(".nemo")]
        out["model"] = Setting(name, f"{restore[1]} (the .nemo checkpoint's name)", where)
        return
    shape = {k: values[f"model.{k}"][0] for k in ("num_layers", "hidden_size", "ffn_hidden_size",
                                                  "num_attention_heads") if f"model.{k}" in values}
    if len(shape) < 4 or any(launch_count(v) is None for v in shape.values()):
        return
    heads = launch_count(shape["num_attention_heads"])
    groups = values.get("model.num_query_groups")
    tokenizer = values.get("model.tokenizer.type")
    vocab = _catalog_vocab(str(tokenizer[0])) if tokenizer is not None else None
    if vocab is None:
        notes.append("NeMo: the vocabulary is not in view (model.tokenizer.type names no catalog model); 32,000 "
                     "assumed")
    config = {"model_type": "llama", "hidden_size": launch_count(shape["hidden_size"]),
              "num_hidden_layers": launch_count(shape["num_layers"]), "num_attention_heads": heads,
              "num_key_value_heads": (launch_count(groups[0]) if groups is not None else None) or heads,
              "intermediate_size": launch_count(shape["ffn_hidden_size"]), "vocab_size": vocab or 32000,
              "tie_word_embeddings": False}
    out["model"] = Setting({"name": "nemo-config", "config": config}, "NeMo config model.num_layers, hidden_size, "
                           "ffn_hidden_size, num_attention_heads, num_query_groups (a Llama-style shape)", where)


def _catalog_vocab(name: str) -> int | None:
    """The vocabulary of the catalog model a tokenizer name names (``meta-llama/Meta-Llama-3-8B``), if any."""
    from predictors.catalog import lookup_model  # the catalog: data only, no I/O beyond the package's files
    from predictors.errors import SpecError

    candidates = [name.strip()]
    bare = PurePosixPath(name.strip()).name
    candidates += [bare, bare.removesuffix("-hf").removesuffix("-HF")]  # meta-llama/Llama-3-8b-hf: llama-3-8b
    for candidate in candidates:
        try:
            entry = lookup_model(candidate)
            break
        except SpecError:
            continue
    else:
        return None
    vocab = entry.config.get("vocab_size")
    return int(vocab) if isinstance(vocab, int) else None


def _peft(values: Mapping[str, tuple[Any, str]], out: dict[str, Setting], notes: list[str], where: str) -> None:
    scheme = values.get("model.peft.peft_scheme")
    text = str(scheme[0]).strip().lower() if scheme is not None else ""
    if scheme is None or text in ("", "none", "null"):
        return
    out["_peft"] = Setting(True, scheme[1], where)
    rank = values.get("model.peft.lora_tuning.adapter_dim")
    out["lora.rank"] = Setting(launch_count(rank[0]) or 32, rank[1], where) if rank is not None else Setting(
        32, "NeMo default lora_tuning.adapter_dim 32", where)
    targets = values.get("model.peft.lora_tuning.target_modules")
    names = targets[0] if targets is not None else ["attention_qkv"]
    if isinstance(names, str):
        names = [n.strip(" '\"") for n in names.strip("[]").split(",") if n.strip()]
    roles = [r for n in names for r in _TARGETS.get(str(n), [])]
    out["lora.target_modules"] = Setting(roles or _TARGETS["attention_qkv"], targets[1] if targets is not None else
                                         "NeMo default lora_tuning.target_modules ['attention_qkv']", where)
    if text != "lora":
        notes.append(f"NeMo peft_scheme {text}: the base is frozen as with LoRA; predicted as LoRA of rank "
                     f"{out['lora.rank'].value} on the fused QKV")


def _flag(tokens: Sequence[str], name: str) -> str:
    for i, token in enumerate(tokens):
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
        if token == name and i + 1 < len(tokens):
            return tokens[i + 1]
    return ""
