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

NeMo 2 (``nemo llm pretrain|finetune --factory NAME [key=value ...]``) builds its recipe in Python: read from a table
of the recipes' settings (scheduler/data/nemo2_recipes.yaml) for its factories, then the command's overrides
(:func:`read_nemo2`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from scheduler.spec.trainer_args import Setting, _flatten, _load_mapping, basename, hydra_overrides, launch_count

_SCRIPTS = ("megatron_gpt_pretraining.py", "megatron_gpt_finetuning.py", "megatron_gpt_sft.py",
            "megatron_gpt_peft_tuning.py", "megatron_llama_pretraining.py")
_PRECISION = {"bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed", "16": "16-mixed", "16-mixed": "16-mixed",
              "32": "32-true", "32-true": "32-true", "bf16-true": "bf16-true"}
# NeMo's LoRA target names (megatron_gpt_finetuning_config.yaml lora_tuning.target_modules) as TrainingSpec roles
_TARGETS = {"attention_qkv": ["q_proj", "k_proj", "v_proj"], "attention_dense": ["o_proj"],
            "mlp_fc1": ["gate_proj", "up_proj"], "mlp_fc2": ["down_proj"],
            # NeMo 2's names (nemo/collections/llm/peft/lora.py: Megatron-Core's module names)
            "linear_qkv": ["q_proj", "k_proj", "v_proj"], "linear_proj": ["o_proj"],
            "linear_fc1": ["gate_proj", "up_proj"], "linear_fc2": ["down_proj"],
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


# --- NeMo 2 -------------------------------------------------------------------------------------------------------

# NeMo 2's LoRA default target_modules (nemo/collections/llm/peft/lora.py)
_NEMO2_LORA_TARGETS = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


def is_nemo2(tokens: Sequence[str]) -> bool:
    """``nemo llm pretrain|finetune ...``: NeMo 2's command line (NeMo-Run's CLI over its recipes)."""
    words = [basename(t) for t in tokens[:3]]
    return len(words) == 3 and words[0] == "nemo" and words[1] == "llm" and words[2] in ("pretrain", "finetune")


@functools.lru_cache(maxsize=1)
def _nemo2_recipes() -> dict[str, Any]:
    from importlib import resources

    from scheduler.spec.yamltext import safe_load

    data = safe_load((resources.files("scheduler") / "data" / "nemo2_recipes.yaml").read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


_FACTORY_CALL = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(?:\((.*)\))?\s*$", re.DOTALL)
_FACTORY_ARG = re.compile(r"(\w+)\s*=\s*('[^']*'|\"[^\"]*\"|[^,]+)")


def _factory(tokens: Sequence[str]) -> tuple[str, dict[str, str]] | None:
    """The ``--factory`` / ``-f`` value: the recipe's name and the arguments of a call (``"llama3_8b(peft_scheme=
    'none', seq_length=4096)"``), each as its text."""
    value = _flag(tokens, "--factory") or _flag(tokens, "-f")
    match = _FACTORY_CALL.match(value) if value else None
    if match is None:
        return None
    args = {k: v.strip().strip("'\"") for k, v in _FACTORY_ARG.findall(match.group(2) or "")}
    return match.group(1), args


def read_nemo2(tokens: Sequence[str], where: str) -> tuple[dict[str, Setting], list[str]]:
    """Raw settings of ``nemo llm pretrain|finetune --factory NAME [overrides]``: the recipe's own settings for the
    factories in scheduler/data/nemo2_recipes.yaml, the factory call's arguments (``peft_scheme``: ``'lora'`` by
    default, ``'dora'`` alike, ``'none'`` full fine-tuning with the recipe's parallelism for it; ``seq_length``,
    ``packed_sequence``), then the dotted overrides (``trainer.strategy.tensor_model_parallel_size``,
    ``pipeline_model_parallel_size``, ``context_parallel_size``, ``sequence_parallel``, ``data.seq_length``,
    ``data.micro_batch_size``, ``data.global_batch_size``, ``peft=lora|dora|none``, ``peft.dim``, ``peft.alpha``,
    ``peft.target_modules``, ``trainer.max_steps``). NeMo 2 trains through Megatron-Core with the bf16_mixed plugin:
    bf16 parameters, fp32 main parameters in the optimizer (Megatron's distributed optimizer, read as ZeRO-1, unless
    the LoRA recipe turns it off), gradients reduced in fp32, a fused Adam."""
    notes: list[str] = []
    out: dict[str, Setting] = {}
    mode = basename(tokens[2])
    found = _factory(tokens)
    if found is None:
        notes.append(f"nemo llm {mode} without --factory: the recipe is not known (set the model and its settings in "
                     "the vramfit.io/spec annotation)")
        return out, notes
    name, args = found
    recipe = _nemo2_recipes().get(name)
    label = f"NeMo 2 recipe {name}"
    if not isinstance(recipe, dict):
        notes.append(f"NeMo 2 factory {name!r} is not among the recipes vramfit knows ("
                     f"{', '.join(sorted(_nemo2_recipes()))}): only the command's overrides are read")
        recipe = {}
    overrides = hydra_overrides(tokens[3:])

    def put(field: str, value: Any, source: str) -> None:
        if value is not None:
            out[field] = Setting(value, source, where)

    if "model" in recipe:
        put("model", recipe["model"], f"{label} (its model(), resumed from {recipe['model']})")
    put("framework", "megatron", f"{label} (NeMo 2 trains through Megatron-Core)")
    put("_bf16", True, f"{label} precision plugin bf16_mixed (bf16 parameters, fp32 main parameters)")
    put("fp32_gradients", True, f"{label} bf16_mixed grad_reduce_in_fp32 True (an fp32 gradient buffer)")
    put("fused_optimizer", True, f"{label} distributed_fused_adam_with_cosine_annealing (Megatron's fused Adam)")
    put("optimizer", "adamw", f"{label} distributed_fused_adam_with_cosine_annealing")
    put("attention", "flash", f"{label} (Megatron-Core's Transformer Engine fused attention: no score matrix kept)")
    phase: dict[str, Any] = {}
    peft: str | None = None
    if mode == "pretrain":
        phase = dict(recipe.get("pretrain") or {})
    else:
        finetune = dict(recipe.get("finetune") or {})
        scheme = args.get("peft_scheme", "lora").lower()
        peft = None if scheme in ("none", "null") else scheme
        phase = {**finetune, **(finetune.get("lora" if peft else "none") or {})}
        packed = str(args.get("packed_sequence", "false")).lower() == "true"
        if packed:
            phase["seq_len"] = finetune.get("packed_seq_len", phase.get("seq_len"))
            phase["global_batch_size"] = finetune.get("packed_global_batch_size", phase.get("global_batch_size"))
        if "seq_length" in args:
            length = launch_count(args["seq_length"])
            if length is None or length <= 0:
                notes.append(f"NeMo 2 factory argument seq_length={args['seq_length']} is not a positive whole "
                             "number: ignored")
            else:
                phase["seq_len"] = length
        if finetune.get("expert_parallel"):
            notes.append(f"{label}: expert parallelism {finetune['expert_parallel']} (each GPU holds a share of the "
                         "experts) is not expressible; every expert is counted on every GPU (an over-estimate)")
    for key, field in (("tensor_parallel", "tensor_parallel"), ("pipeline_parallel", "pipeline_parallel"),
                       ("context_parallel", "context_parallel"), ("sequence_parallel", "sequence_parallel"),
                       ("seq_len", "seq_len"), ("micro_batch_size", "micro_batch_size"),
                       ("global_batch_size", "_global_batch_size")):
        if key in phase:
            put(field, phase[key], f"{label} {mode}" + (f" (peft_scheme {peft or 'none'})" if mode == "finetune"
                                                         else "") + f" {key} {phase[key]}")
    if mode == "finetune" and "sequence_parallel" not in phase:
        put("sequence_parallel", False, f"{label} finetune (default_finetune_trainer: sequence_parallel False)")
    if phase.get("distributed_optimizer", True):
        put("_zero_stage", 1, f"{label}: Megatron's distributed optimizer (fp32 main parameters and Adam states "
                              "sharded over the data-parallel ranks)")
    for key, field in (("trainer.strategy.tensor_model_parallel_size", "tensor_parallel"),
                       ("trainer.strategy.pipeline_model_parallel_size", "pipeline_parallel"),
                       ("trainer.strategy.context_parallel_size", "context_parallel"),
                       ("data.seq_length", "seq_len"), ("data.micro_batch_size", "micro_batch_size"),
                       ("data.global_batch_size", "_global_batch_size")):
        if key in overrides and (count := launch_count(overrides[key])) is not None and count > 0:
            put(field, count, f"NeMo 2 override {key}={overrides[key]}")
        elif key in overrides:
            notes.append(f"NeMo 2 override {key}={overrides[key]} is not a positive whole number: ignored (the "
                         "recipe's value is used)")
    if "trainer.strategy.sequence_parallel" in overrides:
        put("sequence_parallel", overrides["trainer.strategy.sequence_parallel"].lower() == "true",
            f"NeMo 2 override trainer.strategy.sequence_parallel={overrides['trainer.strategy.sequence_parallel']}")
    if "trainer.max_steps" in overrides and (steps := launch_count(overrides["trainer.max_steps"])) is not None:
        put("steps", steps, f"NeMo 2 override trainer.max_steps={steps}")
    if "peft" in overrides:
        value = overrides["peft"].lower()
        if value in ("none", "null", "") and peft:
            notes.append(f"NeMo 2 override peft={overrides['peft']}: the adapter is dropped after the recipe set its "
                         f"LoRA parallelism ({name}(peft_scheme='none') takes the full fine-tuning one); read as full "
                         "fine-tuning with the LoRA recipe's parallelism")
            peft = None
        elif value in ("lora", "dora"):
            peft = value
    if mode == "finetune" and peft:
        lora = phase
        put("_peft", True, f"{label} finetune peft_scheme {peft}" + (" (DoRA: read as LoRA)" if peft == "dora"
                                                                     else ""))
        put("lora.rank", launch_count(overrides.get("peft.dim", "")) or lora.get("rank", 32),
            f"NeMo 2 override peft.dim={overrides['peft.dim']}" if "peft.dim" in overrides
            else f"{label} LoRA dim {lora.get('rank', 32)}")
        put("lora.alpha", launch_count(overrides.get("peft.alpha", "")) or lora.get("alpha", 32),
            f"NeMo 2 override peft.alpha={overrides['peft.alpha']}" if "peft.alpha" in overrides
            else f"{label} LoRA alpha {lora.get('alpha', 32)}")
        put("lora.dropout", 0.0, f"{label} LoRA dropout 0.0 (peft/lora.py)")
        names = overrides.get("peft.target_modules") or lora.get("target_modules") or _NEMO2_LORA_TARGETS
        if isinstance(names, str):
            names = [n.strip(" '\"") for n in names.strip("[]").split(",") if n.strip()]
        roles = [r for n in names for r in _TARGETS.get(str(n), [])]
        put("lora.target_modules", roles or _TARGETS["linear_qkv"], f"{label} LoRA target_modules {list(names)}")
    elif mode == "finetune":
        put("_finetuning_type", "full", f"{label} finetune peft_scheme none (full fine-tuning)")
    put("gradient_checkpointing", "none", f"{label} (no recompute: the recipe sets none)")
    return out, notes

