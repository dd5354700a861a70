"""Anyscale LLMForge jobs: ``llmforge anyscale finetune CONFIG.yaml`` (and the template's ``python main.py
CONFIG.yaml``).

LLMForge (Anyscale's fine-tuning library on Ray Train, DeepSpeed and transformers) trains from one YAML. Read when
the manifest carries the file (a heredoc or a ConfigMap key of that name), from Anyscale's config reference
(docs.anyscale.com/reference/finetuning-config-api) and the fine-tune-llm_v2 template at anyscale/templates
079c80e (``cookbooks/optimize_cost/README.md``, ``training_configs/``, ``deepspeed_configs/``):

* ``model_id`` the model; ``num_devices`` the Ray Train workers, one GPU each; ``worker_resources`` with an
  ``accelerator_type:<GPU>`` (or ``anyscale/accelerator_shape:<N>x<GPU>``) key the GPU the workers run on;
* ``train_batch_size_per_device`` the micro-batch and ``context_length`` the length (both chosen from the data and a
  table of earlier runs when left out: unknown, noted); ``padding`` ``longest`` (the default) pads each batch to its
  longest sample, so the peak is at a batch that reaches ``context_length``; ``gradient_accumulation_steps``;
* activation checkpointing on unless ``no_gradient_checkpoint: true``; ``flash_attention_2`` (default true);
* ``deepspeed.config_path`` the DeepSpeed config (its ``auto`` values filled from the above); none: data parallel;
* ``lora_config`` (PEFT's LoraConfig: ``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``,
  ``modules_to_save``): LoRA; without it a full fine-tune;
* ``liger_kernel.enabled`` with Liger's ``fused_linear_cross_entropy`` (Liger's default when ``cross_entropy`` is not
  asked for): the fused linear cross-entropy;
* ``task: preference_tuning`` DPO: chosen and rejected forwarded together; the reference model's log-probabilities
  are computed by separate Ray Data workers (``preference_tuning_config.logprob_processor_scaling_config``), not on
  the training GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from scheduler.spec.pods import map_gpu_label
from scheduler.spec.raycluster import ACCELERATOR_LABEL
from scheduler.spec.trainer_args import TRAINING_WORLD, Setting, launch_count, to_bool

# keys only an LLMForge config has beside model_id (FinetuningConfig's fields)
_LLMFORGE_KEYS = ("train_path", "num_devices", "train_batch_size_per_device", "context_length", "worker_resources",
                  "no_gradient_checkpoint", "num_data_blocks_per_device", "preference_tuning_config")
_SHAPE = re.compile(r"^(?:\d+x)?(.+)$", re.IGNORECASE)


def is_llmforge_config(data: Mapping[str, Any]) -> bool:
    """An LLMForge fine-tuning YAML: ``model_id`` beside at least two of its own keys (``train_path`` is required)."""
    return isinstance(data.get("model_id"), str) and sum(k in data for k in _LLMFORGE_KEYS) >= 2


def worker_gpu(resources: Any) -> str | None:
    """The GPU type a ``worker_resources`` mapping asks for (``accelerator_type:A10G``,
    ``anyscale/accelerator_shape:4xA10G``), as written, or None."""
    if not isinstance(resources, Mapping):
        return None
    for key in resources:
        name, _, value = str(key).partition(":")
        if name in ("accelerator_type", "anyscale/accelerator_shape") and value:
            match = _SHAPE.match(value.strip())
            return match.group(1) if match else None
    return None


def read_llmforge(data: Mapping[str, Any], label: str, where: str) -> tuple[dict[str, Setting], list[str]]:
    """Raw settings (as the trainer readers give them) of an LLMForge config, and notes on what it leaves unknown."""
    out: dict[str, Setting] = {}
    notes: list[str] = []

    def put(field: str, value: Any, key: str) -> None:
        if value is not None:
            out[field] = Setting(value, f"{label} key {key}", where)

    put("model", str(data["model_id"]).strip(), "model_id")
    devices = launch_count(data.get("num_devices"))
    if devices is not None:
        out[TRAINING_WORLD] = Setting(devices, f"{label} key num_devices {devices} (Ray Train workers, one GPU each)",
                                      where)
    gpu = worker_gpu(data.get("worker_resources"))
    if gpu is not None:
        known = map_gpu_label(ACCELERATOR_LABEL, gpu)
        if known is not None:  # Ray places each worker on a node with that accelerator
            out["gpu"] = Setting(known, f"{label} key worker_resources accelerator {gpu}", where)
        else:
            notes.append(f"{label}: worker_resources asks for accelerator {gpu}, not in the GPU catalog; not pinned")
    micro = launch_count(data.get("train_batch_size_per_device"))
    if micro is not None:
        put("micro_batch_size", micro, "train_batch_size_per_device")
    else:
        notes.append(f"{label}: no train_batch_size_per_device (LLMForge picks one from a table of earlier runs for "
                     "the context length); set micro_batch_size in the vramfit.io/spec annotation")
    length = launch_count(data.get("context_length"))
    if length is not None:
        padding = str(data.get("padding", "longest")).strip().lower()
        put("seq_len", length, "context_length" + (" (each batch padded to its longest sample, up to it)"
                                                   if padding == "longest" else " (every batch padded to it)"))
    else:
        notes.append(f"{label}: no context_length (LLMForge takes the larger of the data's 95th percentile and the "
                     "model's context); set seq_len in the vramfit.io/spec annotation")
    put("grad_accum_steps", launch_count(data.get("gradient_accumulation_steps")), "gradient_accumulation_steps")
    if to_bool(data.get("no_gradient_checkpoint")) is True:
        put("gradient_checkpointing", "none", "no_gradient_checkpoint")
    else:
        out["gradient_checkpointing"] = Setting(
            "full", f"{label} (LLMForge checkpoints activations unless no_gradient_checkpoint: true)", where)
    if to_bool(data.get("flash_attention_2", True)) is not False:
        out["attention"] = Setting("flash", f"{label} (flash_attention_2, LLMForge's default true)", where)
    deepspeed = data.get("deepspeed")
    path = deepspeed.get("config_path") if isinstance(deepspeed, Mapping) else None
    if isinstance(path, str) and path.strip():
        put("_deepspeed", path.strip(), "deepspeed.config_path")
        # the DeepSpeed config's "auto" precision: LLMForge trains in bf16 (its shipped configs enable bf16)
        out["_mixed"] = Setting("bf16", f"{label} (LLMForge trains in bf16)", where)
    else:
        notes.append(f"{label}: no deepspeed.config_path; read as data parallel in bf16")
        out["_mixed"] = Setting("bf16", f"{label} (LLMForge trains in bf16; no DeepSpeed config)", where)
    lora = data.get("lora_config")
    if isinstance(lora, Mapping):
        out["_peft"] = Setting(True, f"{label} key lora_config (LoRA)", where)
        put("lora.rank", lora.get("r", 8), "lora_config.r" if "r" in lora else "lora_config (PEFT's r 8)")
        put("lora.alpha", lora.get("lora_alpha"), "lora_config.lora_alpha")
        put("lora.dropout", lora.get("lora_dropout"), "lora_config.lora_dropout")
        put("lora.target_modules", lora.get("target_modules"), "lora_config.target_modules")
        if lora.get("modules_to_save"):
            put("lora.modules_to_save", lora.get("modules_to_save"), "lora_config.modules_to_save")
    liger = data.get("liger_kernel")
    if isinstance(liger, Mapping) and to_bool(liger.get("enabled")) is True:
        kwargs = liger.get("kwargs") if isinstance(liger.get("kwargs"), Mapping) else {}
        # Liger's apply_liger_kernel_to_* default: fused_linear_cross_entropy on, unless cross_entropy is asked for
        fused = to_bool(kwargs.get("fused_linear_cross_entropy", to_bool(kwargs.get("cross_entropy")) is not True))
        if fused is True:
            put("cross_entropy", "fused-linear", "liger_kernel (Liger's fused linear cross-entropy)")
    task = str(data.get("task", "")).strip().lower()
    if task == "preference_tuning":
        out["_rl"] = Setting("dpo", f"{label} key task preference_tuning (DPO: chosen and rejected forwarded "
                                    "together)", where)
        out["reference_model"] = Setting(False, f"{label} (the reference log-probabilities are computed by "
                                                "separate Ray Data workers, not on the training GPUs)", where)
    elif task == "classification" or isinstance(data.get("classifier_config"), Mapping):
        notes.append(f"{label}: an LLM classifier (classifier_config); predicted as causal LM training")
    return out, notes
