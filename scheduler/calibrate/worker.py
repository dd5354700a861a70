"""The child process of a calibration run: build one model, train a few steps, print one result line.

Run as ``python -m scheduler.calibrate.worker`` with a JSON job on stdin; the result is the last stdout line
that starts with :data:`RESULT_PREFIX`. This is the only module that imports torch, transformers, peft,
bitsandbytes and flash-attn, and it does so inside functions, so that importing it (for the helpers
below) costs nothing and vramfit works without the ``calibrate`` extra.

What a run does: build the model from its config with random weights (``AutoConfig.for_model`` +
``from_config``; nothing is downloaded), quantize it to 4/8 bit with bitsandbytes for qlora (CUDA only),
apply LoRA with PEFT, set dtypes per precision (``*-true``: weights, adapters and optimizer states in that
dtype; ``*-mixed``: fp32 weights and autocast), train full copies of ``lora.modules_to_save``, enable gradient
checkpointing, and run warm-up then measured optimizer steps, each of ``grad_accum_steps`` forward/backward passes
on random token ids of shape (micro_batch_size, seq_len); ``optimizer_in_backward`` steps one optimizer per
parameter in its gradient hook, ``cross_entropy`` chunked / fused-linear computes the loss as torchtune's chunked
loss / Liger's fused kernel do, ``checkpoint_every_n_layers`` and ``activation_offloading`` (with full checkpointing)
run through transformers' ``activation_checkpointing_enable(every_n_layers=..., offload=...)`` (transformers >= 5.24),
and ``torch_compile`` is skipped. On CUDA it reports
``max_memory_allocated``/``max_memory_reserved`` since just before the first step (the weights are
resident then, so they are in the peak) and the device peak from NVML; tokens/s comes from the measured
steps only. A CUDA out-of-memory is an outcome (``oom``), not a failure.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import platform
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from typing import Any

from predictors.spec import TrainingSpec, parse_training_spec

RESULT_PREFIX = "VRAMFIT_CALIBRATE_RESULT "
INSTALL_HINT = "install the calibration extra: pip install 'vramfit[calibrate]'"
# Set by the runner for the spare worker it starts while a config runs: torch and transformers are imported
# (seconds of CPU, no CUDA context) before the job is read, so the next config starts without that wait.
PREIMPORT_ENV = "VRAMFIT_CALIBRATE_PREIMPORT"

# Model types whose positions are learned embeddings: seq_len cannot exceed the table without changing
# the model. Others (RoPE, ALiBi) get max_position_embeddings raised to seq_len, which adds no parameters.
LEARNED_POSITIONS: frozenset[str] = frozenset(
    {"gpt2", "bert", "roberta", "distilbert", "opt", "gpt_neo", "xlm-roberta", "electra"}
)
BNB_OPTIMIZERS: frozenset[str] = frozenset({"adamw-8bit", "paged-adamw-8bit", "lion"})
BNB_QUANTIZATIONS: frozenset[str] = frozenset({"nf4", "nf4-dq", "fp4", "int8"})
TOKEN_CLASSIFICATION_LABELS = 9

# LoRA target roles (Llama-style names, as TrainingSpec writes them) by module-name suffix, most specific
# first. A fused module carries several roles; it is targeted when any of them is asked for.
ROLE_SUFFIXES: tuple[tuple[str, frozenset[str]], ...] = (
    ("q_proj", frozenset({"q_proj"})),
    ("k_proj", frozenset({"k_proj"})),
    ("v_proj", frozenset({"v_proj"})),
    ("o_proj", frozenset({"o_proj"})),
    ("gate_proj", frozenset({"gate_proj"})),
    ("up_proj", frozenset({"up_proj"})),
    ("down_proj", frozenset({"down_proj"})),
    ("qkv_proj", frozenset({"q_proj", "k_proj", "v_proj"})),  # phi3
    ("gate_up_proj", frozenset({"gate_proj", "up_proj"})),  # phi3
    ("attn.c_attn", frozenset({"q_proj", "k_proj", "v_proj"})),  # gpt2
    ("attn.c_proj", frozenset({"o_proj"})),
    ("mlp.c_fc", frozenset({"up_proj"})),
    ("mlp.c_proj", frozenset({"down_proj"})),
    ("query_key_value", frozenset({"q_proj", "k_proj", "v_proj"})),  # gpt_neox, bloom, falcon
    ("attention.dense", frozenset({"o_proj"})),
    ("self_attention.dense", frozenset({"o_proj"})),
    ("dense_h_to_4h", frozenset({"up_proj"})),
    ("dense_4h_to_h", frozenset({"down_proj"})),
    ("self_attn.dense", frozenset({"o_proj"})),  # phi
    ("mlp.fc1", frozenset({"up_proj"})),
    ("mlp.fc2", frozenset({"down_proj"})),
    ("attention.self.query", frozenset({"q_proj"})),  # bert
    ("attention.self.key", frozenset({"k_proj"})),
    ("attention.self.value", frozenset({"v_proj"})),
    ("attention.output.dense", frozenset({"o_proj"})),
    ("intermediate.dense", frozenset({"up_proj"})),
    ("output.dense", frozenset({"down_proj"})),
    ("lm_head", frozenset({"lm_head"})),
)


class MissingDependency(RuntimeError):
    """torch, transformers or peft is not installed."""


# --- pure helpers (no torch): tested directly ---------------------------------------------------------

def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a measurement depends on (None: not installed)."""
    versions: dict[str, str | None] = {}
    for key, dist in (("torch", "torch"), ("transformers", "transformers"), ("peft", "peft"),
                      ("bitsandbytes", "bitsandbytes"), ("flash_attn", "flash-attn"),
                      ("accelerate", "accelerate"), ("torchao", "torchao"), ("nvidia_ml_py", "nvidia-ml-py"),
                      ("liger_kernel", "liger-kernel")):
        try:
            versions[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def lora_roles(module_name: str) -> frozenset[str]:
    """The Llama-style roles of a linear module, from its qualified name (empty: not a LoRA target role)."""
    for suffix, roles in ROLE_SUFFIXES:
        if module_name == suffix or module_name.endswith("." + suffix):
            return roles
    return frozenset()


def lora_target_names(linear_names: Sequence[str], roles: Sequence[str]) -> tuple[list[str], list[str]]:
    """Full names of the linear modules to wrap for the requested roles, and notes on fused modules.

    Raises ValueError when no module has any of the roles (the family's names are not known here).
    """
    wanted = set(roles)
    targets: list[str] = []
    fused_extra: set[str] = set()
    for name in linear_names:
        module_roles = lora_roles(name)
        if module_roles & wanted:
            targets.append(name)
            if module_roles - wanted:
                fused_extra.add(f"{name.rsplit('.', 1)[-1]} (fused {'+'.join(sorted(module_roles))})")
    if not targets:
        raise ValueError(f"no linear module of this model has a LoRA role in {sorted(wanted)}; "
                         "give target_modules: all-linear")
    notes = [f"LoRA wraps fused modules whole: {', '.join(sorted(fused_extra))}"] if fused_extra else []
    return targets, notes


# transformers' PreTrainedModel.activation_checkpointing_enable(every_n_layers=..., offload=...): checkpoint every n-th
# decoder block only, and keep the checkpointed inputs in pinned host memory (torch.autograd.graph.save_on_cpu); the
# version this was read from (older ones have gradient_checkpointing_enable without either)
LAYERED_CHECKPOINTING_TRANSFORMERS = (5, 24)


def _has_layered_checkpointing(version: str | None) -> bool:
    """Whether an installed transformers version has activation_checkpointing_enable's offload and every_n_layers."""
    if not version:
        return False
    numbers = re.findall(r"\d+", version)[:2]
    return len(numbers) == 2 and (int(numbers[0]), int(numbers[1])) >= LAYERED_CHECKPOINTING_TRANSFORMERS


def skip_reason(spec: TrainingSpec, config: dict[str, Any], device_type: str,
                installed: dict[str, str | None]) -> str | None:
    """Why this config cannot be measured here (None: it can). Pure: decided before importing torch."""
    if spec.gpus != 1 or spec.model_parallel() != 1:
        return "multi-GPU configs are not supported: the harness trains in one process on one device"
    if spec.resolved_sharding() not in ("none", "ddp") or spec.offload != "none":
        return "sharding and CPU offload are not supported by the harness"
    if spec.torch_compile:
        return "torch_compile: not run by the harness (it trains eagerly)"
    if spec.sequence_lengths == "variable" or spec.expandable_segments:
        return ("sequence_lengths variable / expandable_segments: the harness repeats one fixed-length batch with "
                "the default allocator; bench/variable_lengths.py measures these")
    if spec.reference_model and spec.method == "full":
        return "reference_model: the harness trains one model, without a frozen reference copy"
    if spec.teacher_model is not None:
        return "teacher_model: the harness has no distillation loop (no teacher forward, no KD loss)"
    if spec.critic_model is not None:
        return "critic_model: the harness trains one model, without a PPO critic beside it"
    if spec.galore_rank is not None:
        return "galore_rank: the harness runs torch and bitsandbytes optimizers, not galore_torch's"
    if spec.trainable_layers is not None:
        return "trainable_layers: the harness trains every parameter (no freeze tuning)"
    layered = (spec.checkpoint_every_n_layers or 1) > 1
    if (spec.activation_offloading or layered) and not _has_layered_checkpointing(installed.get("transformers")):
        return ("activation_offloading and checkpoint_every_n_layers need transformers >= "
                f"{'.'.join(map(str, LAYERED_CHECKPOINTING_TRANSFORMERS))} (activation_checkpointing_enable's offload "
                "and every_n_layers); pip install -U transformers")
    if spec.activation_offloading and device_type != "cuda":
        return "activation_offloading pins host memory for the offloaded inputs: measured on CUDA only"
    if spec.activation_offloading and spec.gradient_checkpointing != "full":
        return ("activation_offloading is run through transformers' offload, which moves the inputs of checkpointed "
                "blocks only: use gradient_checkpointing full")
    if spec.optimizer_in_backward and spec.precision.startswith("16"):
        return "optimizer_in_backward with 16-mixed: loss scaling needs every gradient before the step"
    if spec.cross_entropy in ("chunked", "fused-linear") and spec.task != "causal-lm":
        return f"cross_entropy {spec.cross_entropy} is run for causal-lm only"
    if spec.cross_entropy == "fused-linear" and (device_type != "cuda" or installed.get("liger_kernel") is None):
        return "cross_entropy fused-linear needs liger-kernel on a CUDA GPU: pip install liger-kernel"
    if spec.gradient_checkpointing == "selective":
        return "selective activation checkpointing has no Hugging Face switch; use none or full"
    if spec.method == "qlora":
        quantization = spec.resolved_quantization
        if quantization not in BNB_QUANTIZATIONS:
            return f"quantization {quantization} is not supported (bitsandbytes nf4, nf4-dq, fp4, int8 are)"
        if device_type != "cuda":
            return "qlora needs bitsandbytes quantization on a CUDA GPU"
        if installed.get("bitsandbytes") is None:
            return "qlora needs bitsandbytes: pip install bitsandbytes"
    if spec.optimizer in BNB_OPTIMIZERS:
        if device_type != "cuda":
            return f"optimizer {spec.optimizer} is a bitsandbytes optimizer and needs a CUDA GPU"
        if installed.get("bitsandbytes") is None:
            return f"optimizer {spec.optimizer} needs bitsandbytes: pip install bitsandbytes"
    if spec.optimizer == "adamw-4bit" and (device_type != "cuda" or installed.get("torchao") is None):
        return "optimizer adamw-4bit needs torchao on a CUDA GPU"
    if spec.attention == "flash" and (device_type != "cuda" or installed.get("flash_attn") is None):
        return "attention flash needs the flash-attn package on a CUDA GPU"
    if spec.precision.startswith("16") and device_type != "cuda":
        return "fp16 training is measured on CUDA only"
    model_type = str(config.get("model_type", ""))
    positions = config.get("n_positions") or config.get("max_position_embeddings")
    if model_type in LEARNED_POSITIONS and isinstance(positions, int) and spec.seq_len > positions:
        return f"seq_len {spec.seq_len} exceeds the {positions} learned positions of {model_type}"
    return None


def hf_config_fields(config: dict[str, Any], spec: TrainingSpec) -> tuple[str, dict[str, Any]]:
    """The model_type and the keyword arguments for ``AutoConfig.for_model`` (training settings applied)."""
    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = str(fields.pop("model_type", ""))
    if not model_type:
        raise ValueError("the model config has no model_type")
    if model_type == "gpt2" and fields.get("n_inner") is None and fields.get("intermediate_size"):
        fields["n_inner"] = fields["intermediate_size"]
    if model_type not in LEARNED_POSITIONS:
        positions = fields.get("max_position_embeddings")
        if isinstance(positions, int) and spec.seq_len > positions:
            fields["max_position_embeddings"] = spec.seq_len
    if spec.task in ("seq-classification", "token-classification"):
        fields["num_labels"] = 2 if spec.task == "seq-classification" else TOKEN_CLASSIFICATION_LABELS
        if fields.get("pad_token_id") is None:
            fields["pad_token_id"] = 0
    fields["use_cache"] = False
    return model_type, fields


def model_config_of(spec: TrainingSpec) -> dict[str, Any]:
    """The HF config of a spec's model: inline, from a file, or from the catalog."""
    ref = spec.model
    if not isinstance(ref, str) and ref.config is not None:
        return dict(ref.config)
    if not isinstance(ref, str) and ref.config_path is not None:
        with open(ref.config_path, encoding="utf-8") as handle:
            return dict(json.load(handle))
    from predictors.catalog import lookup_model

    return dict(lookup_model(spec.model_name).config)


# --- the run (imports torch) ----------------------------------------------------------------------------

def _import(name: str) -> Any:
    """Import a calibration dependency (peft only when LoRA is asked for: it costs seconds per process)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise MissingDependency(f"calibration needs torch, transformers and peft ({exc.name} is missing): "
                                f"{INSTALL_HINT}") from None


def environment(torch: Any, device: Any) -> dict[str, Any]:
    """Versions and device facts recorded with every row (no host names, no paths)."""
    from scheduler.calibrate.nvml import driver_version

    env: dict[str, Any] = {"device": device.type, "python": platform.python_version(), **package_versions(),
                           "cuda": torch.version.cuda, "cudnn": None, "gpu_name": None, "gpu_memory_bytes": None,
                           "gpu_compute_capability": None, "gpu_count": 0, "driver": None,
                           "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    env["torch"] = torch.__version__  # the local build tag (+cu124, +cpu) says which wheel it is
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu_name=props.name, gpu_memory_bytes=int(props.total_memory),
                   gpu_compute_capability=f"{props.major}.{props.minor}", gpu_count=torch.cuda.device_count(),
                   cudnn=str(torch.backends.cudnn.version()), driver=driver_version())
    else:
        env["cpu"] = platform.processor() or platform.machine()
        env["cpu_threads"] = torch.get_num_threads()
    # the host issues every kernel of eager training: its CPU bounds small micro-batches (efficiency.yaml's
    # host_seconds_per_layer_pass), so the rows say which CPU they were measured with
    env["host_cpu"] = cpu_model()
    env["host_cpu_count"] = os.cpu_count()
    return env


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    with contextlib.suppress(OSError), open(cpuinfo, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine()


def _pick_device(torch: Any, wanted: str) -> Any:
    if wanted == "cpu" or (wanted == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("device cuda was asked for but torch sees no CUDA GPU")
    return torch.device("cuda", torch.cuda.current_device())


def _dtypes(torch: Any, precision: str) -> tuple[Any, Any]:
    """(dtype of the weights, autocast dtype or None) for a TrainingSpec precision."""
    return {
        "32-true": (torch.float32, None),
        "16-true": (torch.float16, None),
        "bf16-true": (torch.bfloat16, None),
        "16-mixed": (torch.float32, torch.float16),
        "bf16-mixed": (torch.float32, torch.bfloat16),
    }[precision]


def _dtype_kwarg(transformers: Any) -> str:
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _auto_class(transformers: Any, task: str) -> Any:
    return {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "seq-classification": transformers.AutoModelForSequenceClassification,
        "token-classification": transformers.AutoModelForTokenClassification,
    }[task]


def _attn_implementation(attention: str) -> str:
    return {"sdpa": "sdpa", "eager": "eager", "flash": "flash_attention_2"}[attention]


def _bnb_config(transformers: Any, spec: TrainingSpec, compute_dtype: Any) -> Any:
    quantization = spec.resolved_quantization
    if quantization == "int8":
        return transformers.BitsAndBytesConfig(load_in_8bit=True)
    return transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="fp4" if quantization == "fp4" else "nf4",
        bnb_4bit_use_double_quant=quantization == "nf4-dq",
        bnb_4bit_compute_dtype=compute_dtype,
    )


def build_dense_model(torch: Any, transformers: Any, spec: TrainingSpec, config: dict[str, Any], device: Any,
                      dtype: Any) -> Any:
    """The model with random weights, created directly on ``device`` (``meta``: no memory, for checks)."""
    model_type, fields = hf_config_fields(config, spec)
    hf_config = transformers.AutoConfig.for_model(model_type, **fields)
    kwargs = {"attn_implementation": _attn_implementation(spec.attention), _dtype_kwarg(transformers): dtype}
    with torch.device(device):
        return _auto_class(transformers, spec.task).from_config(hf_config, **kwargs)


def _build_model(torch: Any, transformers: Any, spec: TrainingSpec, config: dict[str, Any], device: Any,
                 scratch_dir: str | None) -> Any:
    weight_dtype, autocast_dtype = _dtypes(torch, spec.precision)
    if spec.method != "qlora":
        return build_dense_model(torch, transformers, spec, config, device, weight_dtype)
    # bitsandbytes quantizes while loading a checkpoint: write random weights, reload them quantized.
    compute_dtype = autocast_dtype or weight_dtype  # bf16-mixed: bf16 compute, unquantized parts in bf16
    kwargs = {"attn_implementation": _attn_implementation(spec.attention), _dtype_kwarg(transformers): compute_dtype}
    with tempfile.TemporaryDirectory(prefix="vramfit-calibrate-", dir=scratch_dir) as folder:
        dense = build_dense_model(torch, transformers, spec, config, device, compute_dtype)
        dense.save_pretrained(folder)
        del dense
        gc.collect()
        torch.cuda.empty_cache()
        auto = _auto_class(transformers, spec.task)
        return auto.from_pretrained(folder, quantization_config=_bnb_config(transformers, spec, compute_dtype),
                                    device_map={"": device.index or 0}, **kwargs)


def saved_module_names(model: Any, roles: Sequence[str]) -> list[str]:
    """Qualified names of the modules ``lora.modules_to_save`` names by role (``embed_tokens``: the input
    embedding, ``lm_head``: the output head), whatever the family calls them (GPT-2 ``wte``, ...).

    PEFT trains a full copy of each. Raises ValueError when the model has no such module.
    """
    by_role = {"embed_tokens": model.get_input_embeddings(), "lm_head": model.get_output_embeddings()}
    names: list[str] = []
    for role in roles:
        module = by_role.get(role)
        name = next((n for n, m in model.named_modules() if n and m is module), None) if module is not None else None
        if name is None:
            raise ValueError(f"lora.modules_to_save names {role}, which this model does not have")
        names.append(name)
    return names


def _apply_lora(torch: Any, model: Any, spec: TrainingSpec) -> tuple[Any, list[str]]:
    peft = _import("peft")
    lora = spec.resolved_lora
    assert lora is not None
    notes: list[str] = []
    if lora.target_modules == "all-linear":
        targets: Any = "all-linear"
    else:
        from transformers.pytorch_utils import Conv1D

        linear_types: tuple[type, ...] = (torch.nn.Linear, Conv1D)
        try:
            import bitsandbytes as bnb  # only present (and only needed) for qlora

            linear_types += (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)
        except ImportError:
            pass
        names = [name for name, module in model.named_modules() if isinstance(module, linear_types)]
        targets, notes = lora_target_names(names, lora.target_modules)
    task_type = {"causal-lm": "CAUSAL_LM", "seq-classification": "SEQ_CLS",
                 "token-classification": "TOKEN_CLS"}.get(spec.task)
    saved = saved_module_names(model, lora.modules_to_save) if lora.modules_to_save else None
    dora = {"use_dora": True} if lora.use_dora else {}  # peft >= 0.10 (an older one refuses the keyword)
    config = peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=targets, task_type=task_type, modules_to_save=saved, **dora)
    # PEFT's default (autocast_adapter_dtype=True) upcasts bf16/fp16 adapter weights to fp32 whatever the base
    # dtype, and the predictor counts adapters that way (predictors/vram.py): measure what a PEFT user runs.
    try:
        return peft.get_peft_model(model, config, autocast_adapter_dtype=True), notes
    except TypeError:  # peft < 0.12 has no autocast_adapter_dtype and leaves adapters in the base dtype
        return peft.get_peft_model(model, config), notes


def _optimizer(torch: Any, transformers: Any, spec: TrainingSpec, params: list[Any]) -> Any:
    lr = 1e-5
    name = spec.optimizer
    fused = {"fused": True} if spec.fused_optimizer else {}  # torch's fused kernels (fused_optimizer)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, **fused)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, **fused)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, **fused)
    if name == "adafactor":
        return transformers.optimization.Adafactor(params, lr=lr, scale_parameter=False, relative_step=False)
    if name == "adamw-4bit":
        from torchao.optim import AdamW4bit  # type: ignore[import-not-found]

        return AdamW4bit(params, lr=lr)
    import bitsandbytes as bnb  # type: ignore[import-not-found]

    if name == "adamw-8bit":
        return bnb.optim.AdamW8bit(params, lr=lr)
    if name == "paged-adamw-8bit":
        return bnb.optim.PagedAdamW8bit(params, lr=lr)
    if name == "lion":
        return bnb.optim.Lion(params, lr=lr, optim_bits=32)
    raise ValueError(f"optimizer {name} is not supported")


def _in_backward_optimizers(torch: Any, transformers: Any, spec: TrainingSpec, params: list[Any]) -> list[Any]:
    """optimizer_in_backward: one optimizer per parameter, stepped in the parameter's post-accumulate-grad hook, its
    gradient freed right after (PyTorch's tutorial "How to save memory by fusing the optimizer step into the
    backward pass"; torchtune's optimizer_in_bwd does the same)."""
    optimizers = {param: _optimizer(torch, transformers, spec, [param]) for param in params}

    def step_and_free(param: Any) -> None:
        optimizers[param].step()
        optimizers[param].zero_grad(set_to_none=True)

    for param in params:
        param.register_post_accumulate_grad_hook(step_and_free)
    return list(optimizers.values())


# torchtune's CEWithChunkedOutputLoss splits the sequence into 8 chunks (num_output_chunks in its recipes)
CHUNKED_LOSS_CHUNKS = 8


def _loss(torch: Any, model: Any, spec: TrainingSpec, batch: dict[str, Any]) -> Any:
    """The micro-batch's loss as ``spec.cross_entropy`` computes it: the model's own (full); the head applied to
    chunks of the sequence, every chunk's logits kept until each is upcast and scored on its own (chunked, as
    torchtune's recipes with CEWithChunkedOutputLoss); or Liger's fused linear cross-entropy (fused-linear)."""
    if spec.cross_entropy in (None, "full"):
        return model(**batch).loss
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT: the LoRA-injected model
    hidden = causal.base_model(input_ids=batch["input_ids"])[0][:, :-1]
    labels = batch["labels"][:, 1:]
    head = causal.get_output_embeddings()
    if spec.cross_entropy == "fused-linear":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss  # type: ignore[import-not-found]

        weight = head.weight
        return LigerFusedLinearCrossEntropyLoss()(weight, hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype),
                                                  labels.reshape(-1))
    cap = getattr(causal.config, "final_logit_softcapping", None)
    chunks = [head(part) for part in hidden.chunk(CHUNKED_LOSS_CHUNKS, dim=1)]
    if cap:
        chunks = [torch.tanh(c / cap) * cap for c in chunks]
    total = sum(torch.nn.functional.cross_entropy(c.float().reshape(-1, c.shape[-1]), y.reshape(-1),
                                                  reduction="sum")
                for c, y in zip(chunks, labels.chunk(CHUNKED_LOSS_CHUNKS, dim=1), strict=True))
    del chunks
    return total / labels.numel()


def _batch(torch: Any, spec: TrainingSpec, vocab_size: int, device: Any) -> dict[str, Any]:
    shape = (spec.micro_batch_size, spec.seq_len)
    input_ids = torch.randint(0, vocab_size, shape, device=device)
    if spec.task == "seq-classification":
        labels = torch.randint(0, 2, (spec.micro_batch_size,), device=device)
    elif spec.task == "token-classification":
        labels = torch.randint(0, TOKEN_CLASSIFICATION_LABELS, shape, device=device)
    else:
        labels = input_ids  # causal LM shifts inside the model; masked LM: every position is a target
    return {"input_ids": input_ids, "labels": labels}


# Messages of allocation failures that are not torch.OutOfMemoryError: the caching allocator's own error text,
# and cuBLAS failing to allocate its handle or workspace once the allocator has taken the whole device.
OOM_MESSAGES: tuple[str, ...] = ("out of memory", "cublas_status_alloc_failed")


def _is_oom(torch: Any, exc: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    text = str(exc).lower()
    return isinstance(exc, oom_type) or (isinstance(exc, RuntimeError) and any(m in text for m in OOM_MESSAGES))


@contextlib.contextmanager
def _nvml_sampler(torch: Any, device: Any) -> Iterator[Any]:
    from scheduler.calibrate.nvml import NvmlPeakSampler

    if device.type != "cuda":
        yield None
        return
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "") or None
    with NvmlPeakSampler(uuid=uuid, index=device.index or 0) as sampler:
        yield sampler


def _train(torch: Any, spec: TrainingSpec, model: Any, optimizer: Any | None, batch: dict[str, Any], device: Any,
           warmup_steps: int, measured_steps: int, deadline: float) -> tuple[list[float], float | None, int]:
    """Run the steps; returns the measured steps' durations, the last loss and the micro-batches run.

    An optimizer step is ``spec.grad_accum_steps`` forward/backward passes (gradients accumulate across them,
    as a trainer with gradient accumulation does), then one optimizer update (none with ``optimizer`` None: the
    gradient hooks of optimizer_in_backward updated every parameter during backward).
    """
    _, autocast_dtype = _dtypes(torch, spec.precision)
    scaler = None
    if autocast_dtype == torch.float16 and device.type == "cuda":  # 16-mixed: loss scaling as AMP does it
        scaler = torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    accum_steps = spec.grad_accum_steps
    micro_batches = 0

    def step() -> float:
        nonlocal micro_batches
        total: Any = 0.0  # a tensor after the first micro-batch: read once per step (one host sync, as before)
        for _ in range(accum_steps):
            context = (torch.autocast(device_type=device.type, dtype=autocast_dtype) if autocast_dtype is not None
                       else contextlib.nullcontext())
            with context:
                loss = _loss(torch, model, spec, batch) / accum_steps
            (scaler.scale(loss) if scaler is not None else loss).backward()
            total = total + loss.detach()
            micro_batches += 1
        if optimizer is None:  # optimizer_in_backward: every parameter was updated in its gradient hook
            return float(total)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(total)

    loss: float | None = None
    for _ in range(warmup_steps):
        loss = step()
    sync()
    durations_seconds: list[float] = []
    for _ in range(measured_steps):
        start = time.perf_counter()
        loss = step()
        sync()
        durations_seconds.append(time.perf_counter() - start)
        if time.monotonic() > deadline:  # keep what was measured rather than be killed by the parent
            break
    return durations_seconds, loss, micro_batches


def _enable_checkpointing(model: Any, spec: TrainingSpec) -> list[str]:
    """Full activation checkpointing as transformers' Trainer turns it on (non-reentrant), every n-th block only
    with ``checkpoint_every_n_layers`` and the checkpointed inputs in host memory with ``activation_offloading``;
    notes for the row."""
    kwargs = {"use_reentrant": False}
    every = spec.checkpoint_every_n_layers or 1
    if not hasattr(model, "activation_checkpointing_enable"):  # transformers before the rename
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return []
    # every_n_layers and offload only when asked (skip_reason makes sure the installed transformers has them)
    extra: dict[str, Any] = {}
    if every > 1:
        extra["every_n_layers"] = every
    if spec.activation_offloading:
        extra["offload"] = True
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, **extra)
    notes = []
    if every > 1:
        notes.append(f"checkpoint_every_n_layers {every}: activation_checkpointing_enable(every_n_layers={every})")
    if spec.activation_offloading:
        notes.append("activation_offloading: activation_checkpointing_enable(offload=True), the checkpointed inputs "
                     "in pinned host memory")
    return notes


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Measure one config. Never raises for a bad config: failures are outcomes in the result."""
    started = time.monotonic()
    torch = _import("torch")
    device = _pick_device(torch, str(job.get("device", "auto")))
    result: dict[str, Any] = {"outcome": "ok", "reason": None, "environment": environment(torch, device),
                              "notes": []}
    if job.get("mode") == "probe":
        return result
    transformers = _import("transformers")
    spec = parse_training_spec(job["spec"])
    config = model_config_of(spec)
    reason = skip_reason(spec, config, device.type, package_versions())
    if reason is not None:
        return {**result, "outcome": "skipped", "reason": reason}
    warmup_steps = int(job.get("warmup_steps", 2))
    measured_steps = int(job.get("measured_steps", 3))
    budget_seconds = float(job.get("time_budget_seconds", 900))
    deadline = started + 0.8 * budget_seconds
    torch.manual_seed(0)
    on_cuda = device.type == "cuda"
    model = None
    try:
        model = _build_model(torch, transformers, spec, config, device, job.get("scratch_dir"))
        if spec.gradient_checkpointing == "full":
            result["notes"] += _enable_checkpointing(model, spec)
        if spec.method in ("lora", "qlora"):
            model, lora_notes = _apply_lora(torch, model, spec)
            result["notes"] += lora_notes
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        result["params_total"] = int(sum(p.numel() for p in model.parameters()))
        result["params_trainable"] = int(sum(p.numel() for p in params))
        if spec.optimizer_in_backward:
            in_backward = _in_backward_optimizers(torch, transformers, spec, params)
            result["notes"].append(f"optimizer_in_backward: {len(in_backward)} per-parameter optimizers stepped in "
                                   "gradient hooks")
            optimizer = None
        else:
            optimizer = _optimizer(torch, transformers, spec, params)
        batch = _batch(torch, spec, int(model.config.vocab_size), device)
        if on_cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        with _nvml_sampler(torch, device) as sampler:
            durations_seconds, loss, micro_batches = _train(torch, spec, model, optimizer, batch, device,
                                                            warmup_steps, measured_steps, deadline)
        tokens = spec.micro_batch_size * spec.seq_len * spec.grad_accum_steps * len(durations_seconds)
        result.update(tokens_per_second=tokens / sum(durations_seconds), step_seconds=durations_seconds,
                      warmup_steps=warmup_steps, measured_steps=len(durations_seconds), loss=loss,
                      micro_batches=micro_batches)
        if on_cuda:
            result.update(peak_allocated_bytes=int(torch.cuda.max_memory_allocated(device)),
                          peak_reserved_bytes=int(torch.cuda.max_memory_reserved(device)))
        if sampler is not None:
            result.update(peak_nvml_bytes=sampler.peak_used_bytes, nvml_baseline_bytes=sampler.baseline_used_bytes,
                          nvml_samples=sampler.samples)
    except Exception as exc:
        if not (on_cuda and _is_oom(torch, exc)):
            raise
        result.update(outcome="oom", reason=str(exc).splitlines()[0][:500],
                      peak_allocated_before_oom_bytes=int(torch.cuda.max_memory_allocated(device)),
                      peak_reserved_before_oom_bytes=int(torch.cuda.max_memory_reserved(device)))
    finally:
        del model
        gc.collect()
    return result


def main(argv: Sequence[str] | None = None, stdin: Any = None, emit: Callable[[str], None] | None = None) -> int:
    """Read a job from stdin, print the result line; exit 0 for ok/oom/skipped, 1 for a crash."""
    if os.environ.get(PREIMPORT_ENV) == "1":  # a spare worker: pay the imports while the previous config runs
        for name in ("torch", "transformers"):  # not peft: it imports bitsandbytes, which can open a CUDA context
            with contextlib.suppress(ImportError):  # a missing package is reported when the job needs it
                importlib.import_module(name)
    text = (stdin or sys.stdin).read()
    out = emit or (lambda line: print(line, flush=True))
    try:
        job = json.loads(text)
        result = run_job(job)
    except MissingDependency as exc:
        result = {"outcome": "crash", "reason": str(exc)}
    except Exception as exc:
        tail = traceback.format_exc().strip().splitlines()[-6:]
        result = {"outcome": "crash", "reason": f"{type(exc).__name__}: {exc}"[:1000], "traceback": tail}
    out(RESULT_PREFIX + json.dumps(result, default=str))
    return 0 if result["outcome"] in ("ok", "oom", "skipped") else 1


if __name__ == "__main__":
    sys.exit(main())
