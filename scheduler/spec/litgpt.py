"""litgpt jobs: ``litgpt finetune_lora CHECKPOINT [--config FILE.yaml] [--train.micro_batch_size 2] ...``.

litgpt (github.com/Lightning-AI/litgpt) takes its fine-tuning settings from jsonargparse: a YAML config
(``--config``; its ``config_hub/finetune/*/*.yaml`` recipes) and flags over it, nested ones dotted
(``--train.max_seq_length 512``). The config is read when the manifest carries it (a heredoc or a ConfigMap key of
that file name), then the flags, which win. Read from ``litgpt/finetune/lora.py`` and ``full.py`` (``setup``) at
Lightning-AI/litgpt c16c72c / 29ece59:

* the commands ``finetune_lora`` / ``finetune`` (LoRA; also ``finetune lora``), ``finetune_full`` (full), and the
  scripts ``litgpt/finetune/lora.py`` / ``full.py``; the model is the positional checkpoint directory or the
  ``checkpoint_dir`` key (``checkpoints/<org>/<name>``, or the Hugging Face id itself);
* ``precision`` (``bf16-true``, ``bf16-mixed``, ``16-true``, ``32-true``; when unset ``bf16-mixed``, litgpt's
  ``get_default_supported_precision(training=True)`` on a GPU with bf16, ``16-mixed`` on one without);
* ``quantize`` ``bnb.nf4`` / ``bnb.nf4-dq`` / ``bnb.fp4`` / ``bnb.fp4-dq`` / ``bnb.int8-training``: QLoRA with that
  4-bit (or 8-bit) base; litgpt then steps bitsandbytes' PagedAdamW (32-bit states);
* ``lora_r``, ``lora_alpha``, ``lora_dropout`` and the layer switches ``lora_query`` / ``lora_key`` / ``lora_value``
  / ``lora_projection`` / ``lora_mlp`` / ``lora_head`` (defaults r 8, alpha 16, dropout 0.05, query and value);
* ``train.micro_batch_size`` (default 1), ``train.global_batch_size`` (default 16: the gradient accumulation, once
  the GPU count is known), ``train.max_seq_length`` (unset: the longest sample of the data, up to the model's
  context: not known here, noted), ``train.max_steps``;
* ``devices`` x ``num_nodes`` > 1: Fabric's FSDP with every ``Block`` wrapped and checkpointed
  (``FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block})``); one device trains without
  sharding or checkpointing. ``devices`` defaults to 1 (GPUs the pod has beyond it stay idle: the merge notes it).

The framework stays unset: litgpt's blocks are what the published litgpt runs (the S07 and S25 rows) describe.
Adapter fine-tuning (``finetune_adapter``, ``adapter_v2``) and ``pretrain`` are not read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from scheduler.spec.trainer_args import (
    Launch,
    Reading,
    Setting,
    Settings,
    _load_mapping,
    basename,
    launch_count,
    to_bool,
)

_COMMANDS = {"finetune_lora": "lora", "finetune": "lora", "finetune_full": "full"}
_SCRIPTS = {"lora.py": "lora", "full.py": "full"}
_QUANTIZE = {"bnb.nf4": "nf4", "bnb.nf4-dq": "nf4-dq", "bnb.fp4": "fp4", "bnb.fp4-dq": "fp4",
             "bnb.int8-training": "int8"}
_PRECISIONS = {"bf16-true", "bf16-mixed", "16-true", "16-mixed", "32-true"}
# litgpt's LoRA layer switches and the role names vramfit's specs use for them (litgpt/lora.py: the fused qkv's
# query, key and value parts, the attention projection, the MLP's linears, the output head)
_LAYERS = (("lora_query", ("q_proj",)), ("lora_key", ("k_proj",)), ("lora_value", ("v_proj",)),
           ("lora_projection", ("o_proj",)), ("lora_mlp", ("gate_proj", "up_proj", "down_proj")),
           ("lora_head", ("lm_head",)))
_LAYER_DEFAULTS = {"lora_query": True, "lora_value": True}
# A marker the merge resolves once the pods give the GPU count: FSDP with every block checkpointed when there is more
# than one GPU, neither on one (litgpt with devices auto / -1)
FSDP_WHEN_SEVERAL_GPUS = "_fsdp_when_several_gpus"


def litgpt_method(tokens: Sequence[str]) -> tuple[str, int] | None:
    """(method, index of the first argument after the command) when ``tokens`` run litgpt's LoRA or full
    fine-tuning, else None."""
    names = [basename(t) for t in tokens]
    for i, name in enumerate(names[:4]):
        if name == "litgpt" or (name == "-m" and i + 1 < len(names) and names[i + 1] == "litgpt"):
            at = i + 1 if name == "litgpt" else i + 2
            command = names[at] if at < len(names) else ""
            if command == "finetune" and at + 1 < len(names) and names[at + 1] in ("lora", "full"):
                return names[at + 1], at + 2
            if command in _COMMANDS:
                return _COMMANDS[command], at + 1
            return None
        if name in _SCRIPTS and PurePosixPath(tokens[i]).parent.name == "finetune" \
                and "litgpt" in PurePosixPath(tokens[i]).parts:
            return _SCRIPTS[name], i + 1
    return None


def dashed_arguments(tokens: Sequence[str]) -> tuple[list[tuple[str, Any]], list[str]]:
    """jsonargparse's (and torchtitan's) ``--key value`` / ``--key=value`` / a lone ``--key`` (true), and the
    positional arguments."""
    flags: list[tuple[str, Any]] = []
    positionals: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--"):
            positionals.append(token)
            continue
        name, eq, value = token[2:].partition("=")
        if eq:
            flags.append((name, value))
        elif i < len(tokens) and not tokens[i].startswith("--"):
            flags.append((name, tokens[i]))
            i += 1
        else:
            flags.append((name, True))
    return flags, positionals


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and key in ("train", "eval"):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _model(checkpoint: str) -> str:
    """The Hugging Face id of a litgpt checkpoint directory (``checkpoints/meta-llama/Llama-2-7b-hf``)."""
    parts = [p for p in PurePosixPath(checkpoint.strip()).parts if p not in ("/", ".")]
    if "checkpoints" in parts:
        parts = parts[len(parts) - parts[::-1].index("checkpoints"):]
    return "/".join(parts[-2:])


def _optimizer(given: tuple[Any, str] | None, put: Any, notes: list[str]) -> None:
    """litgpt's ``optimizer``: a torch.optim class name or ``{class_path, init_args}`` (default ``AdamW``)."""
    value, source = given if given is not None else ("AdamW", "litgpt default optimizer AdamW")
    args: Mapping[str, Any] = {}
    if isinstance(value, Mapping):
        args = value.get("init_args") if isinstance(value.get("init_args"), Mapping) else {}
        value = value.get("class_path", "")
    name = str(value).rsplit(".", 1)[-1].lower()
    if name in ("adamw", "adam"):
        put("optimizer", "adamw", source)
    elif name == "sgd":
        momentum = args.get("momentum", 0)
        put("optimizer", "sgd-momentum" if momentum not in (0, 0.0, None, "0") else "sgd", source)
    else:
        notes.append(f"litgpt optimizer {value} ({source}) is read as AdamW's two states")


def read_litgpt(tokens: Sequence[str], where: str, files: Mapping[str, str]) -> Reading:
    """Settings of a litgpt fine-tuning command and the YAML config it names, where the manifest carries it."""
    found = litgpt_method(tokens)
    if found is None:
        return Reading()
    method, start = found
    flags, positionals = dashed_arguments(tokens[start:])
    notes: list[str] = []
    values: dict[str, tuple[Any, str]] = {}
    config = next((str(v) for k, v in flags if k == "config"), "")
    if config:
        content = files.get(basename(config))
        data = _load_mapping(content) if content is not None else None
        if data is None:
            notes.append(f"litgpt config {config} is " + ("not in the manifest" if content is None else
                                                         "not a readable YAML mapping here")
                         + "; its settings are unknown (inline it, or set them in the vramfit.io/spec annotation)")
        else:
            values.update({k: (v, f"litgpt config {config} key {k}") for k, v in _flatten(data).items()})
    for key, value in flags:
        values[key] = (value, f"flag --{key}")
    if positionals:
        values["checkpoint_dir"] = (positionals[0], "litgpt positional checkpoint_dir")
    out: Settings = {}

    def put(field: str, value: Any, source: str) -> None:
        out[field] = Setting(value, source, where)

    def get(key: str) -> tuple[Any, str] | None:
        return values.get(key)

    put("task", "causal-lm", f"litgpt {method} fine-tuning")
    checkpoint = get("checkpoint_dir")
    unresolved = ""
    if checkpoint is not None and _model(str(checkpoint[0])):
        put("model", _model(str(checkpoint[0])), checkpoint[1])
    elif checkpoint is not None:
        unresolved = f"litgpt checkpoint_dir {checkpoint[0]!r} ({checkpoint[1]}) names no model"
    quantize = get("quantize")
    quantized = _QUANTIZE.get(str(quantize[0]).strip().lower()) if quantize and quantize[0] not in (None, "") else None
    if quantize is not None and quantize[0] not in (None, "") and quantized is None:
        notes.append(f"litgpt quantize {quantize[0]} ({quantize[1]}) is not one vramfit reads; the base is counted "
                     "unquantized")
    if method == "lora" and quantized is not None:
        assert quantize is not None
        put("method", "qlora", quantize[1])
        put("quantization", quantized, quantize[1])
        put("optimizer", "adamw", f"{quantize[1]} (litgpt steps bitsandbytes' PagedAdamW, 32-bit states)")
        if str(quantize[0]).strip().lower() == "bnb.fp4-dq":
            notes.append(f"{quantize[1]}: fp4 with double-quantized constants, counted as fp4")
    else:
        put("method", method, f"litgpt finetune_{method}")
        dotted = get("optimizer.class_path")
        _optimizer(({"class_path": dotted[0], "init_args": {
            k.rsplit(".", 1)[-1]: v for k, (v, _) in values.items() if k.startswith("optimizer.init_args.")}},
            dotted[1]) if dotted else get("optimizer"), put, notes)
    precision = get("precision")
    if precision is not None and str(precision[0]).strip().lower() in _PRECISIONS:
        put("precision", str(precision[0]).strip().lower(), precision[1])
    elif precision is not None and precision[0] not in (None, ""):
        notes.append(f"litgpt precision {precision[0]} ({precision[1]}) is not one vramfit reads")
    else:
        put("precision", "bf16-mixed", "litgpt default precision (get_default_supported_precision: bf16-mixed, "
                                       "16-mixed on GPUs without bf16)")
        if quantized is not None:
            notes.append("litgpt with quantize and no precision: its default is mixed precision, which litgpt "
                         "refuses with quantization (ValueError); the job does not start as written")
    if method == "lora":
        for key, field, default in (("lora_r", "rank", 8), ("lora_alpha", "alpha", 16),
                                    ("lora_dropout", "dropout", 0.05)):
            given = get(key)
            put(f"lora.{field}", given[0] if given else default,
                given[1] if given else f"litgpt default {key} {default}")
        modules: list[str] = []
        sources: list[str] = []
        for key, roles in _LAYERS:
            given = get(key)
            on = to_bool(given[0]) if given else _LAYER_DEFAULTS.get(key, False)
            if on is True:
                modules += roles
            sources.append(given[1] if given else f"litgpt default {key} {_LAYER_DEFAULTS.get(key, False)}")
        if modules:
            stated = [s for s in sources if not s.startswith("litgpt default")]
            put("lora.target_modules", modules, ", ".join(stated) if stated else "litgpt defaults: query and value")
        else:
            notes.append("litgpt LoRA with every lora_* layer switch off trains nothing; q_proj/v_proj assumed")
    batch = get("train.micro_batch_size")
    put("micro_batch_size", batch[0] if batch else 1, batch[1] if batch else "litgpt default train.micro_batch_size 1")
    global_batch = get("train.global_batch_size")
    # gradient accumulation = global / (micro-batch x data-parallel ranks): the merge works it out once the GPU count
    # is known (scheduler.spec.merge), as for torchtitan
    put("_global_batch_size", global_batch[0] if global_batch else 16,
        global_batch[1] if global_batch else "litgpt default train.global_batch_size 16")
    length = get("train.max_seq_length")
    if length is not None and length[0] not in (None, ""):
        put("seq_len", length[0], length[1])
    else:
        notes.append("litgpt train.max_seq_length not set: it trains on the longest sample of its data, up to the "
                     "model's context, which vramfit cannot see; set seq_len in the vramfit.io/spec annotation")
    steps = get("train.max_steps")
    if steps is not None and steps[0] not in (None, ""):
        put("steps", steps[0], steps[1])
    devices, nodes = get("devices"), get("num_nodes")
    per_node = launch_count(devices[0]) if devices else 1
    node_count = launch_count(nodes[0]) if nodes else 1
    why = (", ".join(s for s in (devices[1] if devices else "", nodes[1] if nodes else "") if s)
           or "litgpt default devices 1")
    if per_node is None or node_count is None:
        # devices auto / -1: every GPU the process sees (litgpt parse_devices: torch.cuda.device_count()); the merge
        # decides from the pods' GPUs whether that is more than one (FSDP with every block checkpointed) or not
        put(FSDP_WHEN_SEVERAL_GPUS, True, f"{why} (litgpt: FSDPStrategy over more than one device)")
        if quantized is not None:
            notes.append("litgpt refuses quantize on more than one device (NotImplementedError)")
    elif per_node * node_count > 1:
        put("sharding", "fsdp", f"{why} (litgpt: FSDPStrategy over more than one device)")
        put("gradient_checkpointing", "full", f"{why} (litgpt's FSDPStrategy checkpoints every Block)")
        if quantized is not None:
            notes.append("litgpt refuses quantize on more than one device (NotImplementedError); the job does not "
                         "start as written")
    else:
        put("sharding", "none", f"{why} (one device: no sharding)")
        put("gradient_checkpointing", "none", f"{why} (litgpt checkpoints only under FSDP)")
    launch = Launch(per_node, node_count, why) if per_node is not None and node_count is not None else None
    return Reading(out, notes, trainer="litgpt", launch=launch, unresolved_model=unresolved)
