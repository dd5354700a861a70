"""xtuner (InternLM/xtuner): ``xtuner train CONFIG [--deepspeed deepspeed_zero2]``.

CONFIG is either a file the manifest carries (a Python config in mmengine's style: module-level settings, then
``model = dict(type=SupervisedFinetune, llm=dict(type=AutoModelForCausalLM.from_pretrained, ...), lora=dict(
type=LoraConfig, ...))``), or the name of one of xtuner's built-in configs (``llama2_7b_qlora_alpaca_e3``: model,
method, dataset, epochs), read by its name with the settings xtuner's config templates share (xtuner/configs at
InternLM/xtuner 01ef5ba, e.g. llama/llama2_7b/llama2_7b_qlora_alpaca_e3.py): ``max_length`` 2048 packed
(``pack_to_max_length``), ``batch_size`` 1 per device, ``accumulative_counts`` 16, LoRA r 64 / alpha 16 / dropout
0.1 on every linear layer but the head (SupervisedFinetune: find_all_linear_names when target_modules is None),
QLoRA's base in NF4 with double quantization, the model in fp16 (``torch_dtype=torch.float16``) under
``AmpOptimWrapper`` fp16, PagedAdamW32bit, activation checkpointing on (SupervisedFinetune's
use_activation_checkpointing default).

Settings come back as the HF-style flags the trainer readers know (``per_device_train_batch_size``, ``lora_r``, ...),
each with its source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from scheduler.spec.pyscript import module_assignments, read_script

# xtuner's built-in config names: MODEL_METHOD_DATASET[_eN] (llama2_7b_qlora_alpaca_e3, internlm2_chat_7b_full_...)
_BUILTIN = re.compile(r"^(?P<model>[a-z0-9_]+?)_(?P<method>qlora|lora|full)_(?P<rest>[a-z0-9_]+)$")
_MAX_NAME = 200  # xtuner's config names are under 60 characters
# model-part spellings -> catalog spellings (the tuned suffix is the merge's to take off)
_FAMILIES = ((r"^llama2-", "llama-2-"), (r"^llama3-1-", "llama-3.1-"), (r"^llama3-2-", "llama-3.2-"),
             (r"^llama3-", "llama-3-"), (r"^qwen1-5-", "qwen1.5-"), (r"^qwen2-5-", "qwen2.5-"),
             (r"^gemma2-", "gemma-2-"), (r"^mistral-7b$", "mistral-7b-v0.1"), (r"^phi3-mini", "phi-3-mini"))
# the template's settings of a built-in config: (flag, value, what)
_TEMPLATE: tuple[tuple[str, Any, str], ...] = (
    ("max_seq_length", 2048, "max_length 2048"),
    ("packing", True, "pack_to_max_length True"),
    ("per_device_train_batch_size", 1, "batch_size 1 (per device)"),
    ("gradient_accumulation_steps", 16, "accumulative_counts 16"),
    ("torch_dtype", "float16", "torch_dtype=torch.float16"),
    ("fp16", True, "AmpOptimWrapper dtype float16"),
    ("optim", "adamw_torch", "optim_type PagedAdamW32bit (fp32 AdamW states, paged)"),
    ("gradient_checkpointing", True, "SupervisedFinetune use_activation_checkpointing True"),
)
_LORA_TEMPLATE: tuple[tuple[str, Any, str], ...] = (
    ("use_peft", True, "lora=dict(type=LoraConfig)"),
    ("lora_r", 64, "LoraConfig r 64"), ("lora_alpha", 16, "lora_alpha 16"), ("lora_dropout", 0.1, "lora_dropout 0.1"),
    ("lora_target_modules", "all-linear", "target_modules None: every linear but the head"),
)
_QLORA_TEMPLATE: tuple[tuple[str, Any, str], ...] = (
    ("load_in_4bit", True, "BitsAndBytesConfig load_in_4bit"), ("bnb_4bit_quant_type", "nf4", "nf4"),
    ("bnb_4bit_use_double_quant", True, "bnb_4bit_use_double_quant True"),
)
# mmengine / bitsandbytes optimizer classes -> transformers' optim names (what the trainer readers map)
_OPTIMIZERS = {"pagedadamw32bit": "adamw_torch", "adamw": "adamw_torch", "pagedadamw8bit": "paged_adamw_8bit",
               "adamw8bit": "adamw_bnb_8bit", "pagedadamw": "adamw_torch"}
# module-level settings of an xtuner config -> flags
_CONSTANTS = {"pretrained_model_name_or_path": "model_name_or_path", "max_length": "max_seq_length",
              "pack_to_max_length": "packing", "batch_size": "per_device_train_batch_size",
              "accumulative_counts": "gradient_accumulation_steps"}


def xtuner_config(tokens: Sequence[str]) -> str | None:
    """CONFIG of ``xtuner train CONFIG ...`` (also ``NPROC_PER_NODE=8 xtuner train``), else None."""
    for i, token in enumerate(tokens[:-2]):
        if (token == "xtuner" or token.endswith("/xtuner")) and tokens[i + 1] == "train" and \
                not tokens[i + 2].startswith("-"):
            return tokens[i + 2]
    return None


def xtuner_pairs(config: str, files: Mapping[str, str]) -> tuple[list[tuple[str, Any, str]], list[str]]:
    """The job's settings as ``(flag, value, source)`` and notes, from the carried config or the built-in one's name."""
    name = PurePosixPath(config).name
    content = files.get(name)
    if content is not None:
        return _carried(config, content)
    stem = PurePosixPath(config).stem.lower()
    match = _BUILTIN.match(stem) if len(stem) <= _MAX_NAME else None  # a name, not a text to backtrack over
    if match is None:
        return [], [f"xtuner config {config} is not in the manifest and is no built-in config's name: its settings "
                    "are unknown (set them in the vramfit.io/spec annotation)"]
    label = f"xtuner built-in config {config} (by its name; the template's"
    model = _catalog_spelling(match.group("model"))
    pairs = [("model_name_or_path", model, f"xtuner built-in config {config} (its model part)")]
    method = match.group("method")
    template = _TEMPLATE + (_LORA_TEMPLATE if method != "full" else ()) + (_QLORA_TEMPLATE if method == "qlora"
                                                                            else ())
    pairs += [(flag, value, f"{label} {what})") for flag, value, what in template]
    return pairs, [f"xtuner config {config}: xtuner's built-in config, read by its name ({method}) with the settings "
                   "its templates share (max_length 2048 packed, batch 1, accumulative_counts 16, fp16, "
                   "checkpointing); a changed copy is not seen"]


def _catalog_spelling(model: str) -> str:
    text = model.replace("_", "-")
    for pattern, spelled in _FAMILIES:
        text = re.sub(pattern, spelled, text)
    return text


def _carried(config: str, content: str) -> tuple[list[tuple[str, Any, str]], list[str]]:
    label = f"xtuner config {config}"
    constants = module_assignments(content)
    facts = read_script(content, {})
    if constants is None or facts is None:
        return [], [f"{label} is no Python vramfit can parse: its settings are unknown"]
    pairs: list[tuple[str, Any, str]] = []
    for key, flag in _CONSTANTS.items():
        if key in constants:
            pairs.append((flag, constants[key], f"{label} {key} = {constants[key]!r}"))
    optimizer = str(constants.get("optim_type", "")).lower()
    if optimizer in _OPTIMIZERS:
        pairs.append(("optim", _OPTIMIZERS[optimizer], f"{label} optim_type = {constants['optim_type']}"))
    called = {flag for flag, _, _ in facts.calls}
    pairs += [(flag, value, f"{label} {where}") for flag, value, where in facts.calls
              if flag not in {p[0] for p in pairs}]
    if "use_peft" in called and "lora_target_modules" not in called:
        pairs.append(("lora_target_modules", "all-linear", f"{label} LoraConfig without target_modules "
                                                           "(SupervisedFinetune: every linear but the head)"))
    if "gradient_checkpointing" not in called and "use_activation_checkpointing = False" not in content:
        pairs.append(("gradient_checkpointing", True, f"{label} (SupervisedFinetune use_activation_checkpointing "
                                                      "default True)"))
    if "AmpOptimWrapper" in content and re.search(r"dtype\s*=\s*['\"]float16['\"]", content) and "fp16" not in called:
        pairs.append(("fp16", True, f"{label} AmpOptimWrapper dtype float16"))
    return pairs, [f"{label}, carried by the manifest, read for its settings (not run)"]
