"""Analytic peak-VRAM model: what a training step holds on its most loaded GPU, component by component.

Pure: takes a :class:`~predictors.spec.TrainingSpec`, its resolved :class:`~predictors.architecture.Architecture`
and optionally a GPU, returns a :class:`VramPrediction` whose ``breakdown_bytes`` sums to the device peak.

How the peak is found. A training step passes through two high-water marks and the larger one is the peak:

* ``backward``: at the start of the backward pass every saved activation and the logits/loss tensors
  are alive, together with the resident model states (weights, optimizer states, master weights) and
  the first gradients (output head).
* ``optimizer_step``: the activations are gone but every gradient exists, and the optimizer's update
  allocates temporaries (PyTorch's default multi-tensor AdamW keeps one state-sized buffer).

Three levels, as in the TrainingSpec output contract:
``peak_allocated_bytes`` (live tensors) <= ``peak_reserved_bytes`` (+ caching-allocator slack)
<= ``peak_vram_bytes`` (+ CUDA context, cuBLAS workspaces, NCCL buffers, paged optimizer states).

Sources for the constants are given where they are defined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from predictors.architecture import (
    ATTENTION_ROLES,
    CLASSIFICATION_LABELS,
    FUSED_MODULES,
    MLP_ROLES,
    Architecture,
    LinearGroup,
    saved_module_params,
)
from predictors.errors import FieldProblem, SpecError
from predictors.hardware import GpuSpec
from predictors.spec import LoraSpec, TrainingSpec

MIB = 2**20

# ---- bytes per element -------------------------------------------------------------------------
_DTYPE_BYTES = {"32": 4, "16": 2, "bf16": 2}

# Quantized base weights, bytes per parameter including block constants.
# bitsandbytes NF4/FP4: 4-bit codes + one fp32 absmax per 64-value block = 0.5 + 4/64.
# Double quantization (QLoRA paper, Dettmers et al. 2023, sec. 3): absmax as 8-bit per 64 values plus an
# fp32 constant per 256 blocks = 0.5 + 1/64 + 4/(64*256).
# LLM.int8 (bitsandbytes): 1 byte + fp32 row scale (negligible per parameter).
# GPTQ int4, group size 128 (AutoGPTQ default): 0.5 + fp16 scale and packed 4-bit zero per group.
_QUANT_BYTES = {
    "nf4": 0.5 + 4 / 64,
    "fp4": 0.5 + 4 / 64,
    "nf4-dq": 0.5 + 1 / 64 + 4 / (64 * 256),
    "int8": 1.0 + 0.002,
    "gptq-int4": 0.5 + (2 + 0.5) / 128,
}

# Optimizer state bytes per trainable parameter, by the dtype the states are kept in.
# AdamW: exp_avg + exp_avg_sq, each in the parameter's dtype (torch.optim keeps states like the param).
# 8-bit AdamW (bitsandbytes blockwise, block 2048 + fp32 absmax; Dettmers et al. 2021): 2 x (1 + 4/2048).
# 4-bit AdamW (torchao, block 128 + scale): 2 x (0.5 + 4/128).  Lion: one momentum buffer.
# SGD with momentum: one buffer. Adafactor: factored second moment, computed per matrix below.
_STATE_FACTOR = {"adamw": 2.0, "sgd": 0.0, "sgd-momentum": 1.0, "lion": 1.0}
_QUANT_STATE_BYTES = {"adamw-8bit": 2 * (1 + 4 / 2048), "paged-adamw-8bit": 2 * (1 + 4 / 2048),
                      "adamw-4bit": 2 * (0.5 + 4 / 128)}

# Logits and loss at the end of the forward pass, bytes per (token x vocab) element: the logits in
# the compute dtype, their fp32 upcast and the saved fp32 log-softmax of the cross-entropy (Hugging
# Face's causal-LM loss upcasts logits to fp32 before the loss; litgpt/torchtune chunk the upcast, so
# this is the common case, not the best one), plus the 16-bit gradient of the logits in the backward.
# The dev reference runs' sequence-length sweeps (S14, Qwen-1 on HF) show a slope of ~8 bytes per element.
_LOGITS_BYTES_PER_ELEMENT_16BIT = 2 + 4 + 4
_LOGITS_BYTES_PER_ELEMENT_32BIT = 4 + 4
# DeepSpeed's fp16/bf16 engine runs the whole model in 16-bit without autocast, so the logits and the
# log-softmax stay 16-bit unless the model's own loss upcasts (checked against the S14 ZeRO-2 sweeps).
_LOGITS_BYTES_PER_ELEMENT_DEEPSPEED = 2 + 2
# Megatron's vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py) takes an fp32 copy of the
# logits (GPTModel.compute_language_model_loss: logits.float() unless fp16_lm_cross_entropy) and turns it into the
# softmax in place (subtract the max, exp with out=, div_), which it saves for backward and turns into the gradient in
# place. At the end of the forward the 16-bit logits and that fp32 tensor; in backward the fp32 gradient and its
# 16-bit cast for the output layer (the 16-bit logits are freed once GPTModel.forward returns): 2 + 4 either way.
_LOGITS_BYTES_PER_ELEMENT_MEGATRON = 2 + 4
# ... but a transformers-native model upcasts its logits itself (ForCausalLMLoss: logits.float() before the loss,
# src/transformers/loss/loss_utils.py since 4.46; Llama, Mistral, Qwen2 and the like in their forward before that), so
# with framework: transformers under DeepSpeed the loss tensors are the 16-bit case's. The exceptions are the
# families that run as remote code with their own loss on the 16-bit logits: Qwen-1 (modeling_qwen.py
# QWenLMHeadModel), ChatGLM, Baichuan, InternLM (the S14/S19 ZeRO rows the 2 + 2 above was checked against).
# Giles Thomas's Llama-3-8B ZeRO-2 sweep (HF Trainer, fp16; bench/data/external_runs_5.jsonl X20) grows by 11.4
# bytes per logit beyond the checkpoints per sample, where 2 + 2 and its 16-bit gradient gave 6.
_REMOTE_CODE_16BIT_LOSS = frozenset({"qwen", "chatglm", "baichuan", "internlm", "internlm2"})
# framework: transformers, full checkpointing. Backward frees the loss tensors before it recomputes the last
# block, so the peak is the larger of the logits phase and the recompute phase, not their sum (the sum stays the
# default: the published runs, torchtune's chunked loss among them, fit it better). vramfit's H200 rows hold
# ~12 bytes per logit beyond the layers' inputs and the embeddings in the logits phase, whatever the width (LoRA on
# 70B-width blocks at 2/4/6 layers, 8B-width at 4/16; predictors/data/measured/H200.jsonl): the loss tensors above
# plus the gradient of the logits in the compute dtype.
# In the recompute phase the block in backward holds, besides its recomputed activations and its output's
# gradient, the gradients of the MLP's width that its backward makes (of the activation output, the gate and the
# up projection): its classification runs, which have no logits phase, sat 8-9 % under without them.
_CKPT_BACKWARD_WIDTH_GRADIENTS = 3
# cross_entropy: chunked (torchtune's CEWithChunkedOutputLoss, num_output_chunks 8 in every shipped recipe): the
# head's output is a list of chunks in the compute dtype that the recipe holds until the loss is computed, and each
# chunk is upcast to fp32 and log-softmaxed on its own; eager autograd keeps every chunk's fp32 log-probabilities
# for backward (4 bytes per logit), the upcast of the chunk in flight adds 4/8. With torch_compile (the recipes'
# compile=True compiles the loss too) each chunk's loss is fused and keeps less (_logits).
_CHUNKED_CE_CHUNKS = 8
# cross_entropy: fused-linear (Liger's fused_linear_cross_entropy_forward, linkedin/Liger-Kernel
# src/liger_kernel/ops/fused_linear_cross_entropy.py): the gradient of the head's input (tokens x hidden, the input
# dtype) is computed in the forward, and the logits exist one chunk of tokens at a time, the chunk sized so that it
# holds about tokens x hidden elements (rounded up to a power of two: at most twice that); the loss kernel writes the
# gradient into the chunk in place (_fused_loss_bytes follows its chunk arithmetic).
# activation_offloading: what stays on the GPU of the activations the forward saves, in blocks: the block whose
# backward runs (brought back) and the next one prefetched (torchtune's OffloadActivations with use_streams; S02's
# Llama-3.2-3B rows: offloading took 1.3 GiB off a 23.1 GiB peak, about all of the 28 checkpointed inputs).
_OFFLOADED_BLOCKS_ON_GPU = 2

# Caching allocator: block rounding (2 MiB large-pool segments, 512-byte rounding) and fragmentation
# of large transient tensors. PyTorch CUDA semantics docs ("memory management"); the fractions are
# typical reserved/allocated ratios, fitted globally over the dev reference runs, not per run.
_ALLOC_STATIC_FRACTION = 0.02
_ALLOC_TRANSIENT_FRACTION = 0.12
_ALLOC_FIXED_BYTES = 64 * MIB
# sequence_lengths: variable. When each micro-batch is as long as its longest sample, the loss's vocabulary-sized
# tensors (the logits, their fp32 upcast, log-probabilities and gradients) take a different size every step, and the
# caching allocator keeps splitting and caching blocks of those sizes: its reserved memory grows far above what is
# allocated. vramfit's bench (bench/variable_lengths.py, bench/data/variable_lengths-H100.jsonl: H100 80GB HBM3,
# torch 2.11.0+cu130, transformers 5.17.0, peft 0.21.0; Qwen2.5 LoRA r8 on q/k/v, bf16, checkpointing, sample lengths
# of the ms-swift benchmark's dataset) measured the excess over the same micro-batches padded to max_length as 15.1,
# 13.5 and 20.5 fp32 copies of a mean-length micro-batch's logits (7B at 2,048 tokens after 128 micro-batches, 1.5B
# at 1,024 after 182, 1.5B at 2,048 after 480); allocated differed by under 20 MiB. The median is the factor below.
# With expandable_segments:True the same 1.5B run reserved 0.12 GiB more than fixed lengths did (no term).
_VARIABLE_LENGTH_LOGIT_COPIES = 15.0

# CUDA context with lazy module loading (CUDA >= 11.7) plus the PyTorch kernels touched by training:
# about 0.3-1.3 GB per shared/reference/README ("What the metrics mean"); older cards and drivers sit at
# the high end (S17 V100 runs ~1.3 GB). Hopper is measured: vramfit's own calibration rows
# (predictors/data/measured/H200.jsonl: H200, driver 580.159.04, torch 2.11.0+cu130) read NVML's used memory
# 1,366-1,382 MiB above torch's peak reserved in 62 of 62 runs (paged optimizers aside), the context, the
# kernel images and the library handles outside the caching allocator; with the 32 MiB below that is 1,382 MiB.
_CUDA_CONTEXT_BYTES = {"volta": 1300 * MIB, "turing": 900 * MIB, "ampere": 520 * MIB, "ada": 520 * MIB,
                       "hopper": 1350 * MIB, "blackwell": 650 * MIB}
# On the H100 80GB HBM3 (predictors/data/measured/H100-80GB.jsonl, same driver and stack) the gap is 1,247 MiB in
# 38 of 38 runs, on the same configs whose allocated and reserved peaks equal the H200's byte for byte: the context
# grows with the card's memory (135 MiB for 62,212 MiB more). Hopper cards take the line through the two.
_HOPPER_CONTEXT_REFERENCE = (81559 * MIB, 1215 * MIB)  # H100 80GB: NVML total, context without cuBLAS workspace
# to the H200 (143,771 MiB), whose context is the family's figure above
_HOPPER_CONTEXT_PER_MEMORY_BYTE = ((_CUDA_CONTEXT_BYTES["hopper"] - _HOPPER_CONTEXT_REFERENCE[1])
                                   / (143771 * MIB - _HOPPER_CONTEXT_REFERENCE[0]))
_CUBLAS_WORKSPACE_BYTES = 32 * MIB  # 4 MiB x 8 (cuBLAS workspace config default on Hopper: 32 MiB)
# NCCL: NCCL_BUFFSIZE 4 MiB per channel and peer direction; ~2 x 16 channels x (in + out) for
# ring/tree collectives on one node (NCCL environment-variable docs), plus its own CUDA kernels.
_NCCL_BYTES = 400 * MIB

# Selective activation checkpointing keeps the matmul inputs/outputs and recomputes element-wise ops
# and attention internals: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
# Transformer Models", table 2) keep 34 of the 34 + 5as/h bytes per token and layer for attention-core
# recompute; torchtitan's "op" policy also recomputes every second matmul, keeping roughly 40 %.
_SELECTIVE_KEPT_FRACTION = 0.4

# DDP gradient buckets (torch DistributedDataParallel, gradient_as_bucket_view=False by default):
# the reducer keeps flat bucket copies of every gradient.
# DeepSpeed ZeRO defaults: reduce_bucket_size = allgather_bucket_size = 5e8 elements (DeepSpeed config
# docs); the buffers hold 16-bit values. ZeRO-3 prefetch bucket 5e7 elements.
# The ZeRO-2/3 optimizer allocates its contiguous gradient buffer at reduce_bucket_size elements whatever the
# trainable parameter count (deepspeed/runtime/zero/stage_1_and_2.py setup_buckets: torch.empty(reduce_bucket_size),
# a second one with overlap_comm; stage3.py _setup_for_real_optimizer: one), in the dtype of the parameters it
# trains; at stage 1 DeepSpeed turns contiguous_gradients off (runtime/engine.py _configure_zero_optimizer) unless
# the optimizer is offloaded (stage_1_and_2.py: contiguous_gradients or cpu_offload).
_ZERO_BUCKET_ELEMENTS = 5e8
_ZERO3_PREFETCH_ELEMENTS = 5e7
_ZERO3_MAX_LIVE_ELEMENTS = 1e9  # stage3_max_live_parameters and stage3_max_reuse_distance defaults (DeepSpeed docs)


@dataclass(frozen=True)
class VramPrediction:
    """Peak memory of the most loaded GPU, with the components that make it up."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_vram_bytes: int
    breakdown_bytes: dict[str, int]
    peak_phase: str
    params_total: int
    params_trainable: int
    gpus: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, object]:
        return {
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_vram_bytes": self.peak_vram_bytes,
            "breakdown_bytes": dict(self.breakdown_bytes),
            "peak_phase": self.peak_phase,
            "params_total": self.params_total,
            "params_trainable": self.params_trainable,
        }


@dataclass(frozen=True)
class _Layout:
    """How the job is split: sizes per GPU follow from these."""

    gpus: int
    dp: int
    shard: int  # data-parallel ranks one copy of the sharded states spans (dp unless hybrid sharding)
    tp: int
    pp: int
    cp: int
    sharding: str


def trained_blocks(spec: TrainingSpec, arch: Architecture) -> tuple[int, int]:
    """(blocks that train, blocks backward runs through). Under ``trainable_layers`` the last n blocks train and
    backward stops at the lowest of them (nothing below needs a gradient: LLaMA-Factory's freeze tuning makes only a
    trained block's checkpointed inputs require grad); the first n train and backward runs through every block above
    them as well. Otherwise every block does both."""
    layers = arch.num_layers
    if spec.trainable_layers is None or spec.method != "full":
        return layers, layers
    n = min(abs(spec.trainable_layers), layers)
    return n, (n if spec.trainable_layers > 0 else layers)


def _layout(spec: TrainingSpec, gpus: int) -> _Layout:
    return _Layout(gpus=gpus, dp=spec.data_parallel(gpus), shard=spec.shard_group(gpus), tp=spec.tensor_parallel,
                   pp=spec.pipeline_parallel, cp=spec.context_parallel, sharding=spec.resolved_sharding(gpus))


def _sixteen_bit_masters(spec: TrainingSpec, lay: _Layout) -> bool:
    """Whether *-mixed runs a 16-bit model whose optimizer keeps fp32 masters, without autocast: DeepSpeed's ZeRO
    optimizers, Megatron's Float16Module, or a spec that says so (``master_weights``: DeepSpeed at stage 0)."""
    if spec.master_weights is not None:
        return spec.master_weights
    return lay.sharding.startswith("zero") or spec.framework == "megatron"


def _autocast_over_fp32(spec: TrainingSpec, lay: _Layout, mixed: bool) -> bool:
    """Whether a mixed-precision stream (``mixed``: *-mixed, or a prepared k-bit model) is torch autocast over an fp32
    model: no sharding engine of its own (DeepSpeed and FSDP keep 16-bit compute weights), and not a 16-bit model with
    fp32 masters (Megatron's Float16Module, ``master_weights``)."""
    return mixed and lay.sharding in ("none", "ddp") and not _sixteen_bit_masters(spec, lay)


def _shard_degree(lay: _Layout) -> int:
    """Ranks that share one copy of the sharded states: data parallel x context parallel (torchtitan
    shards FSDP over dp_shard x cp; DeepSpeed ZeRO over the data-parallel group). Under hybrid sharding only the
    shard group's data-parallel ranks (FSDP HYBRID_SHARD: a node's GPUs), the states replicated across groups."""
    return lay.shard * lay.cp


def _task_notes(spec: TrainingSpec, arch: Architecture) -> list[str]:
    if arch.for_task(spec.task) is not arch:
        head = arch.lm_head
        assert head is not None
        replaced = f"{head.params:,} parameters" if head.params else "tied to the token embedding"
        return [f"task {spec.task}: a {arch.hidden_size} x {CLASSIFICATION_LABELS} classification head replaces the "
                f"LM head ({replaced})"]
    if spec.task == "causal-lm" and arch.is_encoder_only:
        return [f"task causal-lm on an encoder-only model ({arch.model_type}): sized as its encoder with a "
                "vocab-sized output; did you mean masked-lm or a classification task?"]
    if spec.task == "masked-lm" and not arch.is_encoder_only:
        return [f"task masked-lm on a {'encoder-decoder' if arch.is_encoder_decoder else 'decoder'} model "
                f"({arch.model_type}): sized like causal-lm (a vocab-sized output per token)"]
    return []


def _check_model_parallel(spec: TrainingSpec, arch: Architecture) -> None:
    """Tensor parallelism splits attention heads (and KV heads: Megatron-LM requires num_query_groups divisible
    by it, torchtitan shards wk/wv column-wise) across ranks; a pipeline stage holds at least one block."""
    tp, pp = spec.tensor_parallel, spec.pipeline_parallel
    if tp > 1:
        for what, heads in (("attention heads", arch.num_attention_heads), ("key/value heads", arch.num_kv_heads)):
            if heads and heads % tp:
                raise SpecError.one("tensor_parallel", f"must divide the model's {heads} {what}; got {tp}",
                                    f"use a divisor of {heads}")
    blocks = arch.num_layers + arch.num_encoder_layers
    if pp > 1 and blocks and pp > blocks:
        raise SpecError.one("pipeline_parallel", f"exceeds the model's {blocks} blocks; got {pp}",
                            f"use at most {blocks} stages")


def _compute_bytes(precision: str) -> int:
    return 4 if precision.startswith("32") else 2


def predict_vram(
    spec: TrainingSpec,
    arch: Architecture,
    gpu: GpuSpec | None = None,
    gpus: int | None = None,
    params_override: int | None = None,
    teacher: Architecture | None = None,
    critic: Architecture | None = None,
) -> VramPrediction:
    """Predict peak memory per GPU for ``spec`` on ``gpu`` (context sizes depend on the GPU family): the training
    step's, without a colocated inference engine's share (``predictors.predict`` adds that after the residual model,
    and training takes it off a measured peak, so that the residual model learns the training step only).

    ``gpus`` overrides ``spec.gpus`` (needed when the spec says ``auto``); ``teacher`` and ``critic`` are the
    architectures of the spec's ``teacher_model`` and ``critic_model`` (``ResolvedModel.teacher_architecture``,
    ``critic_architecture``), required when it names them.
    """
    return on_gpu(predict_vram_without_gpu(spec, arch, gpus, params_override, teacher, critic), gpu)


def colocated_engine_bytes(spec: TrainingSpec, gpu: GpuSpec | None) -> int:
    """The memory a colocated inference engine holds on ``gpu`` beside training: ``colocated_engine_memory_fraction``
    of the memory the device reports (vLLM sizes its instance, weights and KV cache, as gpu_memory_utilization times
    the device's total memory: vllm/worker gpu_worker.py determine_available_memory), 0 without the setting or a
    GPU. It is a setting, not a prediction: added after the learned bound, never scaled by it."""
    fraction = spec.colocated_engine_memory_fraction
    if not fraction or gpu is None:
        return 0
    return int(round(fraction * gpu.memory_bytes))


def with_colocated_engine(vram: VramPrediction, engine_bytes: int) -> VramPrediction:
    """``vram`` with a colocated engine's ``engine_bytes`` (:func:`colocated_engine_bytes`): tensors of the same
    processes (vLLM allocates through PyTorch), so in every level, and its own breakdown component."""
    if engine_bytes <= 0:
        return vram
    return replace(vram, peak_allocated_bytes=vram.peak_allocated_bytes + engine_bytes,
                   peak_reserved_bytes=vram.peak_reserved_bytes + engine_bytes,
                   peak_vram_bytes=vram.peak_vram_bytes + engine_bytes,
                   breakdown_bytes={**vram.breakdown_bytes, "colocated_engine": engine_bytes})


def _fp32_stream(spec: TrainingSpec) -> bool:
    """Whether the model runs as mixed precision does, fp32 parameters beside 16-bit compute: ``*-mixed``, or a
    QLoRA model that PEFT's prepare_model_for_kbit_training left with fp32 non-quantized parameters
    (``kbit_prepared``; peft/utils/other.py casts every fp16/bf16 parameter but the 4-bit ones to fp32), whose
    fp32 norms put the residual stream in fp32 as autocast over an fp32 model does. bitsandbytes only: GPTQ
    checkpoints stay fp16 there. On IBM's fms-acceleration A100 runs (TRL 0.11 SFTTrainer, 1 GPU) the prepared
    Mistral-7B and Mixtral QLoRA peaks sit within 2 % of this reading and 12-28 % above the 16-bit one."""
    mixed = spec.precision.endswith("mixed")
    if spec.method != "qlora" or spec.kbit_prepared is None or spec.resolved_quantization == "gptq-int4":
        return mixed
    return spec.kbit_prepared


def _context_bytes(gpu: GpuSpec | None) -> int:
    family = gpu.family if gpu is not None else "ampere"
    context = _CUDA_CONTEXT_BYTES[family]
    if gpu is not None and family == "hopper":
        memory, at_memory = _HOPPER_CONTEXT_REFERENCE
        context = at_memory + _HOPPER_CONTEXT_PER_MEMORY_BYTE * (gpu.memory_bytes - memory)
    return int(round(context + _CUBLAS_WORKSPACE_BYTES))


def device_peak_on_gpu(vram: VramPrediction, gpu: GpuSpec | None) -> int:
    """``on_gpu(vram, gpu).peak_vram_bytes`` without building the prediction."""
    breakdown = vram.breakdown_bytes
    peak = int(sum(breakdown.values()) - breakdown.get("cuda_context", 0) + _context_bytes(gpu))
    return peak - _cache_beyond_device(breakdown.get("allocator_fragmentation", 0), peak, gpu)


def _cache_beyond_device(cache: int, peak: int, gpu: GpuSpec | None) -> int:
    """The part of the caching allocator's fragmentation (``cache`` bytes of a device peak of ``peak``) that ``gpu``
    has no room for. The allocator only caches what the device holds: when cudaMalloc fails it frees its unused
    cached segments and retries (c10/cuda/CUDACachingAllocator.cpp, release_cached_blocks), so on a smaller GPU the
    job reserves up to the device's memory and no more (ms-swift's batch-8 Qwen-7B LoRA run, X06-047, reserved
    76.1 GiB of an A100 80GB where 126 GiB is predicted with room)."""
    if cache <= 0 or gpu is None or peak <= gpu.memory_bytes:
        return 0
    return min(cache, peak - gpu.memory_bytes)


def with_breakdown(vram: VramPrediction, breakdown: dict[str, int], peak_vram_bytes: int | None = None
                   ) -> VramPrediction:
    """``vram`` with another breakdown (and device peak): ``dataclasses.replace`` by the constructor, which costs
    less; placement makes one per GPU type and count it tries."""
    return VramPrediction(
        peak_allocated_bytes=vram.peak_allocated_bytes, peak_reserved_bytes=vram.peak_reserved_bytes,
        peak_vram_bytes=vram.peak_vram_bytes if peak_vram_bytes is None else peak_vram_bytes,
        breakdown_bytes=breakdown, peak_phase=vram.peak_phase, params_total=vram.params_total,
        params_trainable=vram.params_trainable, gpus=vram.gpus, notes=vram.notes)


def on_gpu(vram: VramPrediction, gpu: GpuSpec | None) -> VramPrediction:
    """``vram`` from :func:`predict_vram_without_gpu` with the CUDA context of ``gpu`` (None: ampere's), and with
    no more of the allocator's fragmentation than ``gpu`` has room for (:func:`_cache_beyond_device`)."""
    breakdown = {**vram.breakdown_bytes, "cuda_context": _context_bytes(gpu)}
    peak = int(sum(breakdown.values()))
    cache = breakdown.get("allocator_fragmentation", 0)
    beyond = _cache_beyond_device(cache, peak, gpu)
    if not beyond:
        return with_breakdown(vram, breakdown, peak)
    assert gpu is not None
    breakdown["allocator_fragmentation"] = cache - beyond
    note = (f"on {gpu.name} the allocator caches blocks of many lengths only up to the device's memory: "
            f"{cache / 2**30:.2f} -> {(cache - beyond) / 2**30:.2f} GiB (PyTorch frees cached segments and retries "
            "before an allocation fails)")
    return replace(vram, peak_reserved_bytes=vram.peak_reserved_bytes - beyond, peak_vram_bytes=peak - beyond,
                   breakdown_bytes=breakdown, notes=(*vram.notes, note))


def predict_vram_without_gpu(
    spec: TrainingSpec,
    arch: Architecture,
    gpus: int | None = None,
    params_override: int | None = None,
    teacher: Architecture | None = None,
    critic: Architecture | None = None,
) -> VramPrediction:
    """All of :func:`predict_vram` but the GPU type's part: ``cuda_context`` is 0 until :func:`on_gpu`.

    Nothing else depends on the GPU, so placement computes this once per GPU count for all pools.

    With pipeline parallelism the two ends of the pipeline are predicted apart: the first stage holds
    ``pipeline_parallel`` micro-batches of activations in flight and no logits, the last one micro-batch and the
    head's logits (also cached by the allocator at an optimizer-step peak). The most loaded GPU is the end whose
    device peak is higher, every level and the breakdown taken from that one end.
    """
    if spec.teacher_model is not None and teacher is None:
        raise ValueError("spec.teacher_model needs its architecture: pass teacher= (catalog.resolve_model resolves it "
                         "as ResolvedModel.teacher_architecture)")
    critic_spec = spec.critic_spec()
    if critic_spec is not None:
        if critic is None:
            raise ValueError("spec.critic_model needs its architecture: pass critic= (catalog.resolve_model resolves "
                             "it as ResolvedModel.critic_architecture)")
        policy = _predict_model(spec, arch, gpus, params_override, teacher)
        try:
            critic_step = _predict_model(critic_spec, critic, gpus, None, None)
        except SpecError as exc:  # say that it is the critic's model that the layout does not fit
            raise SpecError([FieldProblem(p.path, f"{p.message} (critic_model {critic.name})", p.hint)
                             for p in exc.problems], exc.source) from None
        return _with_critic(policy, critic_step, critic, spec.idle_offload, spec.resolved_fp32_gradients())
    return _predict_model(spec, arch, gpus, params_override, teacher)


def _predict_model(
    spec: TrainingSpec,
    arch: Architecture,
    gpus: int | None,
    params_override: int | None,
    teacher: Architecture | None,
) -> VramPrediction:
    """One trained model's step on its most loaded GPU (with pipeline parallelism the higher of the two ends)."""
    if spec.pipeline_parallel <= 1:
        return _predict_stage(spec, arch, gpus, params_override, last_stage=False, teacher=teacher)
    first = _predict_stage(spec, arch, gpus, params_override, last_stage=False)
    last = _predict_stage(spec, arch, gpus, params_override, last_stage=True)
    # the allocator's fragmentation (the last stage's, which holds the logits) is cache that is freed before an
    # allocation fails: the stage that needs more is the one whose peak without it is higher
    if needed_peak_bytes(last) > needed_peak_bytes(first):
        return replace(last, notes=(*last.notes, f"pipeline: the last stage (the head's logits) peaks higher than "
                                    f"the first ({spec.pipeline_parallel} micro-batches in flight)"))
    return replace(first, notes=(*first.notes, f"pipeline: the first stage ({spec.pipeline_parallel} micro-batches "
                                 "in flight) peaks at least as high as the last (the head's logits)"))


# What a model keeps on its GPUs between its own updates: its weights (the sharded fp32 flat parameters under FSDP),
# copies, adapters, master weights and optimizer states, and DeepSpeed's persistent gradient buffer. Its gradients
# are not: verl's actor and critic updates end with optimizer.zero_grad() (set_to_none), so each model's gradients
# are freed before the other trains (verl/workers/critic/dp_critic.py update_critic, actor/dp_actor.py update_policy).
_MODEL_STATES = ("weights", "secondary_weights", "reference_weights", "teacher_weights", "lora_adapters",
                 "saved_modules", "master_weights", "optimizer_states", "communication_buffers",
                 "paged_optimizer_states")


def _with_critic(policy: VramPrediction, critic_step: VramPrediction, critic: Architecture,
                 idle_offload: str | None = None, fp32_gradients: bool = False) -> VramPrediction:
    """The peak of a PPO step whose critic trains on the policy's GPUs: the two updates take turns, each with the
    other's model states resident (``_MODEL_STATES``), unless ``idle_offload`` moves them to host memory while the
    other trains (verl loads an offloaded model back for its own update: fsdp_workers.py update_actor /
    update_critic call load_fsdp_model_to_gpu and load_fsdp_optimizer first). The higher phase is the peak; its
    breakdown is that update's, with the other model's states as one component (``critic_states`` or
    ``policy_states``)."""
    # Megatron's fp32 gradient buffer (fp32_gradients) stays allocated between its model's updates
    kept = _MODEL_STATES + (("gradients",) if fp32_gradients else ())
    critic_states = sum(critic_step.breakdown_bytes.get(k, 0) for k in kept)
    policy_states = sum(policy.breakdown_bytes.get(k, 0) for k in kept)
    if idle_offload in ("critic", "both"):
        critic_states = 0
    if idle_offload in ("policy", "both"):
        # the policy's own weights and optimizer leave; a frozen reference (or teacher) beside it stays (verl's
        # Megatron reference is not offloaded with the actor)
        policy_states = sum(policy.breakdown_bytes.get(k, 0) for k in ("reference_weights", "teacher_weights"))
    policy_peak = policy.peak_vram_bytes + critic_states
    critic_peak = critic_step.peak_vram_bytes + policy_states
    held = "weights and optimizer states" + (" and fp32 gradient buffer" if fp32_gradients else "")
    states_note = (f"critic_model {critic.name}: a PPO value model trained in turn with the policy on the same GPUs "
                   f"({critic_step.params_total:,} parameters with its value head); its {held} hold "
                   f"{critic_states / 2**30:.2f} GiB per GPU while the policy trains, the policy's "
                   f"{policy_states / 2**30:.2f} GiB while it trains"
                   + (f" (idle_offload {idle_offload}: in host memory while the other model trains)"
                      if idle_offload else ""))
    gap = abs(policy_peak - critic_peak) / 2**30
    if policy_peak >= critic_peak:
        base, extra, name = policy, critic_states, "critic_states"
        phase_note = (f"the policy's update peaks {gap:.2f} GiB higher than the critic's: the breakdown is the "
                      "policy's, with the critic's states (critic_states)")
    else:
        base, extra, name = critic_step, policy_states, "policy_states"
        phase_note = (f"the critic's update peaks {gap:.2f} GiB higher than the policy's: weights, activations and "
                      "the other components are the critic's, with the policy's states (policy_states) beside them")
    breakdown = {**base.breakdown_bytes, name: int(extra)}
    notes = [*policy.notes, states_note, phase_note]
    if base is critic_step:
        notes += [n for n in critic_step.notes if n not in policy.notes]
    return replace(policy, peak_allocated_bytes=base.peak_allocated_bytes + int(extra),
                   peak_reserved_bytes=base.peak_reserved_bytes + int(extra),
                   peak_vram_bytes=base.peak_vram_bytes + int(extra), breakdown_bytes=breakdown,
                   peak_phase=base.peak_phase, notes=tuple(notes))


def _predict_stage(
    spec: TrainingSpec,
    arch: Architecture,
    gpus: int | None,
    params_override: int | None,
    last_stage: bool,
    teacher: Architecture | None = None,
) -> VramPrediction:
    """:func:`predict_vram_without_gpu` of the first pipeline stage, or with ``last_stage`` of the last one
    (without pipeline parallelism the one stage is both: ``last_stage`` False)."""
    model_parallel = spec.model_parallel()
    n_gpus = gpus if gpus is not None else (spec.gpus if isinstance(spec.gpus, int) else model_parallel)
    if spec.training_gpus is not None and n_gpus < spec.training_gpus:
        raise SpecError.one("gpus", f"{n_gpus} is fewer than training_gpus ({spec.training_gpus}), the GPUs that "
                            "train the model", "predict for at least as many GPUs as train, or lower training_gpus")
    if spec.training_gpus is None and (n_gpus < 1 or n_gpus % model_parallel):
        raise SpecError.one("gpus", f"must be a positive multiple of tensor_parallel x pipeline_parallel x "
                            f"context_parallel ({model_parallel}); got {n_gpus}")
    _check_model_parallel(spec, arch)
    lay = _layout(spec, n_gpus)
    notes: list[str] = [*arch.warnings, *_task_notes(spec, arch)]
    arch = arch.for_task(spec.task)
    if gpus is None and spec.gpus == "auto":
        notes.append(f"gpus: auto: predicted for {n_gpus} GPU{'s' if n_gpus > 1 else ''}; `vramfit place` chooses "
                     "the count (or give --gpus N)")
    e = _compute_bytes(spec.precision)
    mixed = _fp32_stream(spec)
    method = spec.method
    lora = spec.resolved_lora
    quant = spec.resolved_quantization

    if 0 < arch.max_position_embeddings < spec.seq_len:
        notes.append(f"seq_len {spec.seq_len:,} is beyond the model's max_position_embeddings "
                     f"{arch.max_position_embeddings:,}: learned position tables cannot take it, rotary ones were "
                     "not trained for it")

    scale = 1.0
    total_params = arch.params_total
    if params_override and params_override != total_params:
        scale = params_override / total_params
        total_params = params_override
        notes.append(f"parameter count overridden to {params_override:,}; weight-sized terms scaled")

    # ---- parameters held by the most loaded GPU (before data-parallel sharding) -----------------
    per_stage_layers = math.ceil(arch.num_layers / lay.pp)
    layer_frac = per_stage_layers / arch.num_layers if lay.pp > 1 else 1.0
    linear_body = arch.body_linear_params
    lm_head = arch.lm_head
    lm_head_params = lm_head.params if lm_head is not None else 0
    embed = arch.embedding_params
    other = arch.norm_params + arch.other_params
    if lay.pp > 1:
        # first stage: the embedding and its blocks; last stage: its blocks and the output head (a tied head is the
        # embedding's copy there)
        head_end = lm_head_params if lm_head_params else embed
        stage_params = (linear_body + other) * layer_frac + (head_end if last_stage else embed)
        notes.append(f"pipeline stage of {per_stage_layers} layers")
    else:
        stage_params = linear_body + other + embed + lm_head_params
    # tensor parallel splits linear layers and the vocabulary; norms are replicated
    tp_params = (stage_params - other * layer_frac) / lay.tp + other * layer_frac
    params_gpu = tp_params * scale

    quantizable = arch.quantizable_params() * scale * layer_frac / lay.tp
    if lora is not None:
        groups = arch.lora_groups(lora.target_modules)
        if not groups:  # PEFT refuses such an adapter ("Target modules ... not found in the base model")
            raise SpecError.one("lora.target_modules", f"match no linear layer of this {arch.model_type} model; got "
                                f"{lora.target_modules}", "use all-linear or role names: "
                                f"{', '.join((*ATTENTION_ROLES, *MLP_ROLES))}")
        if lora.target_modules != "all-linear":
            unmatched = [n for n in lora.target_modules if not arch.lora_groups([n])]
            if unmatched:  # PEFT skips them too, as long as one name matches
                notes.append(f"lora.target_modules {', '.join(unmatched)} match no linear layer of this "
                             f"{arch.model_type} model: no adapter counted there")
        lora_params_total = sum(g.count * (g.in_features + g.out_features) * lora.rank for g in groups)
        if lora.use_dora:  # DoRA's magnitude: one trainable value per output feature of each adapted linear
            lora_params_total += sum(g.count * g.out_features for g in groups)
        trainable_gpu = lora_params_total * layer_frac / lay.tp
        trainable_total = lora_params_total
    else:
        trainable_gpu = params_gpu
        trainable_total = total_params
        lora_params_total = 0
    # trainable_layers (freeze tuning): the trained blocks' parameters train, everything else is frozen
    frozen_gpu = 0.0
    trained, _ = trained_blocks(spec, arch)
    frozen_ends = spec.trainable_layers is not None and lora is None  # the embedding and the head do not train
    if frozen_ends:
        if arch.num_encoder_layers:
            raise SpecError.one("trainable_layers", "is modelled for decoder-only and encoder-only models; this "
                                f"{arch.model_type} model has an encoder and a decoder", "drop trainable_layers")
        block = (linear_body + other) / max(arch.num_layers, 1)
        trainable_gpu = trained * block * scale / lay.tp
        trainable_total = trained * block * scale
        frozen_gpu = params_gpu - trainable_gpu
        side = "last" if spec.trainable_layers > 0 else "first"
        notes.append(f"trainable_layers {spec.trainable_layers}: the {side} {trained} of {arch.num_layers} blocks "
                     f"train ({int(trainable_total):,} parameters); the embeddings, the other blocks and the output "
                     "head are frozen in the compute dtype"
                     + (", and backward stops at the lowest trained block" if spec.trainable_layers > 0 else ""))
    # PEFT modules_to_save: full trainable copies of the embedding / output head (vocab x hidden each) beside the
    # frozen originals; on different pipeline stages, the larger end counts; tensor parallel splits the vocab
    saved = saved_module_params(arch, lora.modules_to_save if lora is not None else [])
    if lay.pp > 1:  # the embedding's copy on the first stage, the head's on the last
        saved_gpu = saved.get("lm_head" if last_stage else "embed_tokens", 0) * scale / lay.tp
    else:
        saved_gpu = sum(saved.values()) * scale / lay.tp
    trainable_total += sum(saved.values()) * scale

    # ---- dtypes ------------------------------------------------------------------------------
    sharded = lay.sharding in ("zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op")
    deepspeed = lay.sharding.startswith("zero")
    fsdp = lay.sharding.startswith("fsdp")
    megatron = spec.framework == "megatron"
    master16 = _sixteen_bit_masters(spec, lay)  # a 16-bit model whose optimizer keeps fp32 masters, no autocast
    if method == "full":
        if mixed and (master16 or lay.sharding in ("none", "ddp")) and not fsdp:
            if master16:
                weight_bytes, grad_bytes, master_bytes = 2.0, 2.0, 4.0  # 16-bit model, fp32 master
            else:
                weight_bytes, grad_bytes, master_bytes = 4.0, 4.0, 0.0  # AMP: fp32 model is the master
        elif mixed and fsdp:
            weight_bytes, grad_bytes, master_bytes = 4.0, 4.0, 0.0  # FSDP MP: sharded fp32 params and grads
        else:
            weight_bytes = grad_bytes = float(e)
            master_bytes = 0.0
        state_dtype_bytes = 4.0 if (mixed or e == 4) else float(e)
    else:
        # LoRA/QLoRA: frozen base; adapters trainable
        base_bytes = 4.0 if (mixed and method == "lora" and not master16) or e == 4 else 2.0
        weight_bytes = base_bytes
        # Adapters are fp32 whatever the base dtype: PEFT upcasts fp16/bf16 adapter weights to fp32 by default
        # (get_peft_model(autocast_adapter_dtype=True), huggingface.co/docs/peft/package_reference/peft_model),
        # so their gradients and Adam states are fp32 too. torchtune and litgpt keep bf16 adapters under
        # bf16-true; for them this over-counts 2 bytes x 4 per adapter parameter, under 1 % of most jobs' peak.
        # framework torchtune: its LoRALinear keeps the adapters in the model's dtype (and torch optimizers keep
        # their states in the parameter's dtype)
        adapter_bytes = float(e) if spec.framework == "torchtune" and not mixed else 4.0
        grad_bytes = adapter_bytes
        master_bytes = 4.0 if (mixed and master16) else 0.0
        state_dtype_bytes = adapter_bytes
    held_bytes = grad_bytes  # the trained parameters' own dtype (LoRA adapters are held as their gradients are)
    fp32_gradients = spec.resolved_fp32_gradients()
    if fp32_gradients and grad_bytes < 4:
        # Megatron-Core's DDP accumulates every gradient into an fp32 main_grad buffer (param_and_grad_buffer.py:
        # torch.float when grad_reduce_in_fp32) and the 16-bit .grad is never kept; megatron/training/arguments.py
        # turns accumulate_allreduce_grads_in_fp32 on for --bf16 unless --grad-reduce-in-bf16
        notes.append("fp32_gradients: the gradients accumulate in an fp32 buffer, 4 bytes per trained parameter "
                     f"where the model's dtype would keep {grad_bytes:g}")
        grad_bytes = 4.0

    # ---- model states (resident) --------------------------------------------------------------
    dp = _shard_degree(lay)
    if spec.training_gpus is not None and spec.training_gpus < lay.gpus:
        notes.append(f"training_gpus {spec.training_gpus}: the model trains on {spec.training_gpus} of the job's "
                     f"{lay.gpus} GPUs (its data-parallel world); the others run other roles, not predicted here")
    if lay.shard < lay.dp and lay.sharding in ("zero3", "fsdp", "fsdp-grad-op"):
        notes.append(f"hybrid sharding: the states are split over {dp} ranks (shard_group_size {lay.shard}"
                     + (f" x context parallel {lay.cp}" if lay.cp > 1 else "")
                     + f") and replicated across {lay.dp // lay.shard} groups")
    # FSDP SHARD_GRAD_OP also keeps parameters sharded at rest (unsharded only between fwd and bwd)
    shard_params = lay.sharding in ("zero3", "fsdp", "fsdp-grad-op") and dp > 1
    shard_grads = lay.sharding in ("zero2", "zero3", "fsdp", "fsdp-grad-op") and dp > 1
    shard_states = sharded and dp > 1
    offload_states = spec.offload in ("optimizer", "params+optimizer")
    offload_params = spec.offload == "params+optimizer"

    if method == "qlora":
        assert quant is not None
        non_quant = params_gpu - quantizable
        # PEFT's prepare_model_for_kbit_training upcasts the non-quantized parameters to fp32 in *-mixed,
        # except for GPTQ checkpoints, which it leaves in fp16 (peft/utils/other.py).
        nonq_bytes = 4.0 if (mixed or e == 4) and quant != "gptq-int4" else 2.0
        weights = quantizable * _QUANT_BYTES[quant] + non_quant * nonq_bytes
    else:
        # frozen blocks stay in the compute dtype; what trains is held as the method holds it (LLaMA-Factory's freeze
        # tuning upcasts only the trainable parameters to fp32)
        weights = (params_gpu - frozen_gpu) * weight_bytes + frozen_gpu * e
    weights_unsharded = weights
    if shard_params:
        weights /= dp  # FSDP / ZeRO-3 shard frozen base weights as well
    if offload_params:
        weights = 0.0  # ZeRO-3 / FSDP parameter offload: only the gathered working set stays on the GPU
    adapters = trainable_gpu * (held_bytes if lora is not None else 0)

    grads = trainable_gpu * grad_bytes
    if shard_grads and method == "full":
        grads /= dp
    if offload_params and method == "full":
        grads = 0.0
    # ZeRO-Offload at stages 2-3: as each gradient bucket is reduced during backward, DeepSpeed copies this rank's part
    # into the fp32 gradient on the host and frees the GPU copy (stage_1_and_2.py async_inplace_copy_grad_to_fp32_
    # buffer_from_gpu clears param.grad; stage 3 allocates grad_partitions_flat_buffer on the offload device), so no
    # gradient partition stays on the GPU beyond the reduce bucket counted below. Stage 1 reduces nothing in backward
    # (process_gradients: neither partition_gradients nor overlap_comm, which the engine turns off at stage 1): every
    # 16-bit gradient is on the GPU when backward ends, and goes to the host in reduce_gradients after it.
    host_grads = deepspeed and offload_states and lay.sharding in ("zero2", "zero3")
    if host_grads:
        grads = 0.0

    opt = spec.optimizer
    if opt in _QUANT_STATE_BYTES:
        states = trainable_gpu * _QUANT_STATE_BYTES[opt]
    elif opt == "adafactor":
        # factored second moment: rows + columns per matrix, fp32 (Shazeer & Stern 2018)
        matrices = arch.lora_groups("all-linear") if lora is None else arch.lora_groups(lora.target_modules)
        if lora is None:
            factored = sum(g.count * (g.in_features + g.out_features) for g in matrices) * 4.0
            # the embedding is a matrix too (a row and a column factor); a norm's weight is a vector, whose second
            # moment transformers' Adafactor keeps whole (_get_options: factored only for 2-D parameters)
            vectors = (arch.hidden_size + arch.vocab_size) * 4.0 + arch.norm_params * 4.0
            states = (factored + vectors) * layer_frac / lay.tp
            if spec.trainable_layers is not None:  # the trained blocks' matrices only
                states = factored * trained / max(arch.num_layers, 1) / lay.tp
        else:
            # each adapter matrix factored: A (rank x in) keeps rank + in fp32 factors, B (out x rank) out + rank
            states = sum(g.count * (2 * lora.rank + g.in_features + g.out_features) for g in matrices) * 4.0 \
                * layer_frac / lay.tp
    else:
        states = trainable_gpu * _STATE_FACTOR[opt] * state_dtype_bytes
    if spec.galore_rank and lora is None:
        states = _galore_states(spec, arch, trainable_gpu, state_dtype_bytes, layer_frac * scale / lay.tp, notes)
    master = trainable_gpu * master_bytes
    if shard_states:
        states /= dp
        master /= dp
    paged_states = 0.0
    if opt == "paged-adamw-8bit":
        paged_states, states = states, 0.0  # CUDA managed memory: outside the PyTorch allocator
    if offload_states:  # on the host, paged ones too
        states = 0.0
        master = 0.0
        paged_states = 0.0

    # the saved modules' copies are kept in the dtype of the base's unquantized parameters, their gradients
    # too, and torch optimizers keep states in the parameter's dtype
    copies = 0.0
    if saved_gpu:
        copy_bytes = 4.0 if e == 4 or (mixed and not master16) else 2.0
        copy_weights = saved_gpu * copy_bytes / (dp if shard_params else 1)
        if opt in _QUANT_STATE_BYTES:
            copy_states = saved_gpu * _QUANT_STATE_BYTES[opt]
        elif opt == "adafactor":  # factored second moment: a row and a column vector per matrix
            copy_states = len(saved) * (arch.vocab_size + arch.hidden_size) * 4.0 / lay.tp
        else:
            copy_states = saved_gpu * _STATE_FACTOR[opt] * copy_bytes
        if shard_states:
            copy_states /= dp
        if offload_states:
            copy_states = 0.0
        copy_grads = 0.0 if host_grads else saved_gpu * copy_bytes
        copies = copy_weights + copy_grads + copy_states
        notes.append(f"modules_to_save {', '.join(saved)}: {int(saved_gpu):,} parameters trained in full per GPU "
                     f"(copy {copy_weights / 2**30:.2f} GiB + gradients {copy_grads / 2**30:.2f} GiB "
                     f"+ optimizer states {copy_states / 2**30:.2f} GiB)")

    # ---- buffers for communication and sharding -----------------------------------------------
    comm = 0.0
    layer_params = (linear_body + other) / max(arch.num_layers + arch.num_encoder_layers, 1) * scale / lay.tp
    if lay.sharding == "ddp" and dp > 1 and not (fp32_gradients or megatron or spec.master_weights):
        comm += trainable_gpu * grad_bytes  # DDP flat gradient buckets (Megatron's DDP and DeepSpeed's engine reduce
        # their own buffers)
    elif deepspeed and trainable_gpu > 0 and spec.keeps_zero_gradient_buffer():
        elements, bucket = _zero_gradient_buffer(spec, arch, e)
        comm += bucket
        if elements > trainable_gpu:
            notes.append(f"DeepSpeed {lay.sharding}: the contiguous gradient buffer is {bucket / 2**30:.2f} GiB "
                         "(reduce_bucket_size elements, whatever the trainable parameter count; "
                         "zero_reduce_bucket_elements sets it)")
        if offload_states and lay.sharding in ("zero1", "zero2"):
            # stages 1-2 with an offloaded optimizer also keep a GPU staging buffer the size of the largest trainable
            # parameter, in its dtype (stage_1_and_2.py: temp_grad_buffer_for_gpu_offload, allocated at start-up), and
            # upcast each gradient slice to fp32 on the GPU before its copy to the host
            # (async_inplace_copy_grad_to_fp32_buffer_from_gpu: src_tensor.to(fp32)), the largest's at most
            largest = _largest_trainable_matrix(arch, lora, saved, frozen_ends) * scale / lay.tp
            staging = largest * (4.0 if e == 4 else 2.0) + (largest * 4.0 if e != 4 else 0.0)
            comm += staging
            notes.append(f"DeepSpeed {lay.sharding} with the optimizer offloaded: gradients go to the host "
                         + ("bucket by bucket, and none stay on the GPU" if host_grads else
                            "after backward (stage 1 reduces none during it)")
                         + f"; {staging / 2**30:.2f} GiB for the largest trainable parameter's staging buffer and "
                           "its gradient's fp32 copy")
    gathered = 0.0
    if (lay.sharding in ("zero3", "fsdp") and dp > 1) or offload_params:
        # gathered parameters of the block being computed and the prefetched next one
        gathered = 2 * layer_params * (weight_bytes if method != "qlora" else 1.0)
        if deepspeed:
            # ZeRO-3 keeps a gathered parameter that is used again within stage3_max_reuse_distance elements (at the
            # turn from forward to backward, the last blocks' parameters); stage3_max_live_parameters only bounds what
            # it prefetches beyond what is already gathered (deepspeed/runtime/zero/partitioned_param_coordinator.py:
            # __params_to_release; fetch_sub_module's max_params_to_prefetch, the live limit less the gathered)
            live_limit, reuse = spec.zero3_max_live_parameters, spec.zero3_max_reuse_distance
            live = min(params_gpu, _ZERO3_MAX_LIVE_ELEMENTS if reuse is None else reuse)
            prefetch = _ZERO3_PREFETCH_ELEMENTS if live_limit is None else min(_ZERO3_PREFETCH_ELEMENTS, live_limit)
            gathered = max(gathered, live * (weight_bytes if method == "full" else float(e))) + prefetch * 2.0
            if live_limit is not None or reuse is not None:
                limits = (f"stage3_max_live_parameters {'1e9' if live_limit is None else f'{live_limit:,}'}, "
                          f"stage3_max_reuse_distance {'1e9' if reuse is None else f'{reuse:,}'}")
                notes.append(f"DeepSpeed ZeRO-3 ({limits}): " + (
                    "every parameter is released after its module, only the blocks being computed stay gathered"
                    if live == 0 else f"up to {live:,.0f} gathered parameter elements are kept for reuse")
                    + ("; no prefetching" if live_limit == 0 else ""))
    if lay.sharding == "fsdp-grad-op" and shard_params:
        # SHARD_GRAD_OP keeps every unit's parameters unsharded from its forward until its backward, frozen
        # LoRA bases included (FSDP treats all parameters of a unit alike): the whole stage at the compute dtype
        # (FSDP mixed precision gathers param_dtype; a 32-true model stays fp32), 4-bit bases in their storage
        gathered = params_gpu * float(e) if method != "qlora" else weights_unsharded

    # ---- activations ----------------------------------------------------------------------------
    acts = _activations(spec, arch, e, mixed, lay)
    act = acts.total
    logits = _logits(spec, arch, e, lay)
    # DoRA: the weight norm's temporaries (one layer's, in its forward) and, with adapter dropout, the base weights
    # that PEFT recomputes the base output with (per block; what full checkpointing recomputes holds one block's)
    dora_work = dora_copy_block = 0.0
    dora_copy_blocks = 0
    if lora is not None and lora.use_dora:
        dora_work = _dora_workspace(arch, lora, int(adapter_bytes), lay.tp)
        dora_copy_block = _dora_base_copy_bytes_per_block(spec, arch, lora, e, mixed, lay.sharding) * scale / lay.tp
        dora_copy_blocks = _blocks_keeping_weight_copies(spec, per_stage_layers)
    dora_copies = dora_copy_block * dora_copy_blocks
    cached_logits = logits  # what the allocator still holds of them at an optimizer-step peak
    cached_other_phase = 0.0  # what it still holds of the backward phase that is not the peak
    if lay.pp > 1:
        # the first stage holds pp micro-batches of activations and no logits, the last stage one micro-batch and
        # the logits (predict_vram_without_gpu predicts both ends and keeps the more loaded)
        if last_stage:
            act = _activations(spec, arch, e, mixed, lay, first_stage=False).total
        else:
            logits = 0.0
        cached_logits = logits
    elif spec.framework == "transformers" and spec.gradient_checkpointing == "full" and logits > 0:
        # the larger of the logits phase (+ the logits' gradient) and the recompute phase (_CKPT_... above)
        logits_phase = logits + _logits_gradient(spec, arch, e, lay)
        cached_logits = logits_phase
        # the caching allocator keeps the blocks of one phase while the other allocates its own: vramfit's H200
        # rows reserve 2.0-6.2 GiB above allocated here, what the two phases together would allocate (the sum
        # counted before the phases were told apart predicted their reserved peak within -2..+2 %)
        cached_other_phase = max(acts.total + logits - max(acts.kept + logits_phase, acts.total), 0.0)
        if logits_phase >= acts.recompute + dora_work + dora_copy_block:
            act, logits = acts.kept, logits_phase
            # DoRA's weight-norm temporaries and the recomputed block's base-weight copies come after the logits are
            # freed (vramfit's H100 rows: checkpointed DoRA on Llama-3.2-1B peaks at the same 8.65 GiB as LoRA)
            dora_work, dora_copies = 0.0, dora_copies - dora_copy_block
            notes.append("framework transformers: backward peaks with the logits; the recomputed block comes after "
                         "they are freed")
        else:
            logits = 0.0
            notes.append("framework transformers: backward peaks in a recomputed block, after the logits are freed")
    head_grad = 0.0
    # The output head's weight gradient exists from the first step of backward, while the logits are still alive;
    # a tied head writes its vocab x hidden gradient into the embedding's .grad just the same. Counted for tied
    # heads since vramfit's H200 rows (full fine-tuning of Llama-3.2-1B, Qwen2.5-0.5B/1.5B, Qwen3-0.6B, Gemma-3-1B,
    # all tied) showed it: allocated median 2.7 % -> 1.4 %. The dev set's p90 moves 41.5 -> 42.3 % through
    # torchtune's tied Llama 3.2 rows (S01/S02), which step the optimizer inside backward and free each gradient at
    # once (optimizer_in_bwd), what the spec cannot express.
    head_params = lm_head_params or (arch.vocab_size * arch.hidden_size if arch.tie_word_embeddings else 0)
    if method == "full" and spec.task in ("causal-lm", "masked-lm") and head_params and (lay.pp == 1 or last_stage) \
            and spec.trainable_layers is None:
        head_grad = head_params * scale / lay.tp * grad_bytes / (dp if shard_grads else 1)

    # QLoRA dequantizes one weight matrix at a time into the compute dtype (bitsandbytes matmul_4bit)
    quant_work = 0.0
    if method == "qlora":
        biggest = max((g.in_features * g.out_features for g in arch.linears if g.role != "lm_head"), default=0)
        quant_work = biggest * 2.0 * 2 / lay.tp

    # Autocast with an fp32 model (AMP without FSDP/DeepSpeed casting the model itself): every linear casts its
    # fp32 weight to 16 bits per call, and that 16-bit copy is what autograd keeps to compute the input's
    # gradient, so a 16-bit copy of the linear weights is live from the forward until backward reaches each
    # layer (the Hugging Face single-GPU training guide, huggingface.co/docs/transformers/perf_train_gpu_one,
    # mixed-precision section, counts mixed precision as holding the model in both precisions, 1.5x its size,
    # hence more memory than fp32 at small batches). Frozen LoRA bases cast as well (autocast caches no frozen
    # weight, so nothing is shared). Checkpointed blocks drop theirs after the forward and recompute one block
    # at a time in backward; the output head runs outside the blocks and keeps its copy. 4-bit layers
    # dequantize into a temporary that autograd does not keep.
    amp_copies = 0.0
    if _autocast_over_fp32(spec, lay, mixed) and e == 2:
        body = 0.0 if method == "qlora" else linear_body * layer_frac
        cast_blocks = per_stage_layers if spec.trainable_layers is None else trained  # frozen 16-bit blocks: no cast
        body *= cast_blocks / max(per_stage_layers, 1)
        if spec.gradient_checkpointing == "full":
            kept_blocks = _blocks_keeping_weight_copies(spec, per_stage_layers)
            body *= min(kept_blocks, cast_blocks) / max(cast_blocks, 1)
        head = arch.vocab_size * arch.hidden_size if spec.task in ("causal-lm", "masked-lm") and (
            lay.pp == 1 or last_stage) and spec.trainable_layers is None else 0
        amp_copies = (body + head) * scale / lay.tp * e

    # optimizer-step temporaries: torch.optim's foreach AdamW allocates one state-sized buffer
    # (torch/optim/adamw.py, _multi_tensor_adamw: exp_avg_sq_sqrt); 8-bit/paged/fused kernels do not (the fused
    # implementation, fused_optimizer, is transformers' default optim adamw_torch_fused with torch >= 2.8 and what
    # torchtune's configs ask for with fused: True; a spec without the extension keeps the foreach count).
    step_tmp = 0.0
    if spec.resolved_fused_optimizer():
        pass  # one fused kernel per parameter group (torch.optim.AdamW(fused=True)): no state-sized temporaries
    elif opt in ("adamw", "lion") and not offload_states:
        step_tmp = trainable_gpu * state_dtype_bytes / (dp if shard_states else 1)
    elif opt == "adafactor" and not offload_states:
        # transformers' Adafactor (what HF Trainer's optim="adafactor" runs) steps one parameter at a time: for the
        # largest it holds fp32 copies of a 16-bit parameter and its gradient, the squared update and the scaled
        # update, 16 bytes per element (12 for fp32 parameters, which it uses as they are). vramfit's H200 rows:
        # Llama-3.2-1B and Qwen2.5-1.5B full bf16 (largest: the tied embedding) peak 8.59 / 9.30 GiB, weights +
        # gradients + 16 bytes x the embedding = 8.5 / 9.2 GiB (one state-sized buffer for all, the foreach rule
        # of AdamW above, gave 6.9 / 8.6)
        step_tmp = (_largest_trainable_matrix(arch, lora, saved, frozen_ends) * (12.0 if e == 4 or mixed else 16.0)
                    / lay.tp)
    if spec.galore_rank and lora is None and not offload_states:
        # galore_torch's optimizers step one parameter at a time (no foreach buffer); the peak is the projector
        # update's SVD of the largest targeted gradient
        step_tmp = _galore_svd_workspace(spec, arch, layer_frac * scale / lay.tp)
    if deepspeed and not offload_states:
        # DeepSpeed converts the 16-bit gradient partition into an fp32 copy for the optimizer
        # (stage 1/2 ``single_partition_of_fp32_groups`` grads, stage 3 fp32 partitioned grads)
        step_tmp = trainable_gpu * 4.0 / (dp if shard_states else 1)

    # a frozen reference copy (DPO/KTO without an adapter: TRL loads ref_model as it loads the model, and DeepSpeed
    # ZeRO-3 or FSDP shard it as they shard the model it copies, trl/trainer/dpo_trainer.py _prepare_deepspeed /
    # prepare_fsdp); with an adapter the reference is the same base with the adapter disabled
    reference = 0.0
    copy = spec.reference_model == "copy"
    if spec.reference_model and (method == "full" or copy) and not offload_params:
        # with an adapter, a trainer that loads its own reference (reference_model: copy) holds the base again, in the
        # compute dtype (TRL's kto script loads it without the model's quantization config)
        reference = params_gpu * (weight_bytes if method == "full" else float(e)) / (dp if shard_params else 1)
        notes.append(f"reference_model: a frozen copy of the weights, {reference / 2**30:.2f} GiB per GPU")
    elif spec.reference_model and method != "full":
        notes.append("reference_model: with an adapter the reference is the base with the adapter disabled (no copy)")
    # a frozen teacher (knowledge distillation): its weights in the compute dtype, sharded as the model is (torchtune's
    # KD recipes build it under set_default_dtype(dtype) and FSDP-shard it with the student's settings; TRL's GKD
    # prepares it as DPO's reference model); its forward's working set and logits, and the distillation loss's saved
    # tensors, are transient beside the student's (below)
    teacher_weights = teacher_gathered = 0.0
    if teacher is not None:
        teacher_params = teacher.params_total / lay.tp
        if not offload_params:
            teacher_weights = teacher_params * e / (dp if shard_params else 1)
        if (lay.sharding in ("zero3", "fsdp", "fsdp-grad-op") and dp > 1) or offload_params:
            # the teacher's no_grad forward gathers one block and prefetches the next, as the student's does
            teacher_gathered = 2 * teacher.body_linear_params / max(teacher.num_layers, 1) / lay.tp * e
        notes.append(f"teacher_model {teacher.name}: frozen weights {teacher_weights / 2**30:.2f} GiB per GPU "
                     f"({teacher.params_total:,} parameters, {e} bytes each"
                     + (f", sharded over {dp}" if shard_params and not offload_params else "")
                     + (", offloaded" if offload_params else "") + ")")
    # ZeRO++ hpZ (DeepSpeed zero_hpz_partition_size) / FSDP2 reshard_after_forward=<int>: after its forward every
    # parameter is partitioned a second time over a node's ranks, so that backward gathers it on the node's links.
    # DeepSpeed allocates that secondary shard once per parameter, in the parameter's 16-bit dtype, and keeps it
    # (deepspeed/runtime/zero/partition_parameters.py _partition_param_sec: aligned size // the hpZ group size);
    # FSDP2 holds its post-forward shards until each block's backward, which includes the backward's start, the peak
    secondary = 0.0
    if spec.secondary_shard_size and lay.sharding in ("zero3", "fsdp") and dp > 1 and not offload_params:
        group = min(spec.secondary_shard_size, lay.shard)
        secondary = (params_gpu * float(e) if method == "full" else weights_unsharded) / group
        notes.append(f"secondary_shard_size {spec.secondary_shard_size}: a second copy of the parameters sharded over "
                     f"{group} ranks for backward's gathers, {secondary / 2**30:.2f} GiB per GPU")
    resident = {
        "weights": weights,
        "secondary_weights": secondary,
        "reference_weights": reference,
        "teacher_weights": teacher_weights,
        "lora_adapters": adapters if lora is not None else 0.0,
        "saved_modules": copies,
        "master_weights": master,
        "optimizer_states": states,
        "communication_buffers": comm,
        "gathered_params": gathered,
    }
    # Pipeline schedules run the stage's micro-batches without gradient sync until the last one
    # (torch.distributed.pipelining stage backward: FSDP set_requires_gradient_sync(False)), so a sharded
    # stage accumulates its gradients unsharded, in the reduce dtype (fp32 under mixed precision).
    pp_grads = 0.0
    if fp32_gradients and method == "full":
        # Megatron-Core allocates its fp32 gradient buffer whole when it wraps the model (DistributedDataParallel
        # __init__), so it is there through forward and backward, and gradient accumulation adds into it in place
        pp_grads = grads - head_grad
    elif lay.pp > 1 and method == "full" and shard_grads and not offload_params:
        pp_grads = trainable_gpu * (4.0 if mixed or fp32_gradients else float(e))
    elif spec.grad_accum_steps > 1 and method == "full":
        # gradient accumulation: the previous micro-batches' gradients stay allocated through the next
        # forward and backward (sharded where the sharding reduces them every micro-batch)
        pp_grads = grads
    teacher_forward, distillation = _distillation_bytes(spec, arch, teacher, e, lay)
    if lora is not None and lora.use_dora:
        notes.append(f"DoRA: magnitude vectors train beside the adapters; each adapted layer keeps its base and "
                     f"adapter outputs for backward, and its weight norm needs "
                     f"{_dora_workspace(arch, lora, int(adapter_bytes), lay.tp) / 2**30:.2f} GiB of temporaries (the "
                     "largest adapted layer's)" + ("" if spec.framework == "torchtune" else
                                                   "; PEFT >= 0.14 assumed: earlier releases recompute each base "
                                                   "output in the adapters' dtype even without dropout (not counted)"))
        if dora_copy_block:
            notes.append(f"DoRA with adapter dropout: PEFT recomputes each adapted layer's base output from the "
                         f"dropped-out input with the base weight cast to the adapter's dtype, and keeps that copy for "
                         f"backward: {dora_copies / 2**30:.2f} GiB here (lora.dropout 0 avoids it with PEFT >= 0.14; "
                         "earlier releases recompute it whatever the dropout, which is not counted)")
    if teacher_gathered:
        resident["gathered_params"] = max(gathered, teacher_gathered)
    backward_phase = {
        **resident,
        "gradients": head_grad + pp_grads + (grads if method != "full" else 0.0),
        "activations": act,
        "logits": logits,
        "teacher_forward": teacher_forward,
        "distillation_loss": distillation,
        "dora_workspace": dora_work,
        "dora_weight_copies": dora_copies,
        "quantization_workspace": quant_work,
        "autocast_weight_copies": amp_copies,
    }
    step_phase = {**resident, "gradients": grads, "optimizer_step_workspace": step_tmp}
    in_backward_step = 0.0
    if spec.optimizer_in_backward:
        # Each parameter is updated in its post-accumulate-grad hook as soon as its gradient is complete, and the
        # gradient freed (torchtune optimizer_in_bwd; PyTorch's "How to save memory by fusing the optimizer step
        # into the backward pass" tutorial): one parameter's gradient and its update's temporaries at a time, in
        # backward, and no moment that holds every gradient. S02's Llama-3.2-3B full fine-tuning: 24.9 -> 23.1 GiB.
        largest = _largest_trainable_matrix(arch, lora, saved, frozen_ends) * scale / lay.tp
        one_grad = largest * grad_bytes / (dp if shard_grads else 1)
        if opt == "adafactor" or spec.galore_rank:
            in_backward_step = step_tmp
        elif opt in ("adamw", "lion") and not offload_states and not spec.resolved_fused_optimizer():
            stepped = largest
            if lora is None and arch.tie_word_embeddings:
                # a tied head's gradient is complete only when backward reaches the embedding, after the blocks'
                # activations are freed, so its step's temporaries never meet the peak; a block's largest matrix
                # does (vramfit's H100 rows, tied Llama-3.2-1B / Qwen2.5-1.5B: the same peak with and without
                # optimizer_in_backward)
                stepped = float(max((g.in_features * g.out_features for g in arch.linears if g.role != "lm_head"),
                                    default=0)) * scale / lay.tp
            in_backward_step = stepped * state_dtype_bytes / (dp if shard_states else 1)
        backward_phase["gradients"] = one_grad
        backward_phase["optimizer_step_workspace"] = in_backward_step
        in_backward_step += one_grad
        step_phase = {}
        notes.append("optimizer_in_backward: each gradient is freed when its parameter is updated in backward; no "
                     "optimizer-step peak")
    if (spec.checkpoint_every_n_layers or 1) > 1 and spec.gradient_checkpointing == "full":
        blocks = math.ceil(arch.num_layers / lay.pp) + arch.num_encoder_layers
        notes.append(f"checkpoint_every_n_layers {spec.checkpoint_every_n_layers}: "
                     f"{math.ceil(blocks / spec.checkpoint_every_n_layers)} of {blocks} blocks checkpointed, the "
                     "others keep all their activations")
    if spec.checkpoint_trained_blocks_only and spec.trainable_layers is not None \
            and spec.gradient_checkpointing == "full":
        trained, through = trained_blocks(spec, arch)
        if through > trained:
            notes.append(f"checkpoint_trained_blocks_only: {trained} trained blocks checkpointed; the "
                         f"{through - trained} frozen blocks backward runs through keep all their activations")
    if spec.activation_offloading:
        notes.append(f"activation_offloading: saved activations wait in CPU memory; {_OFFLOADED_BLOCKS_ON_GPU} "
                     "blocks' worth are on the GPU in backward")
    if spec.cross_entropy in ("chunked", "fused-linear") and logits:
        if spec.cross_entropy == "chunked":
            kept = "the logits; fp32 work one chunk at a time" if spec.torch_compile else (
                "the logits and every chunk's fp32 log-probabilities (eager)")
            notes.append(f"cross_entropy chunked: the loss holds {logits / 2**30:.2f} GiB at the end of the forward "
                         f"({kept})")
        else:
            notes.append(f"cross_entropy fused-linear: the loss holds {logits / 2**30:.2f} GiB (the head input's "
                         "gradient and one chunk of logits), never the whole batch's logits")
    if spec.torch_compile:
        notes.append("torch_compile: fused norms and gated activation keep their inputs only")
    b_total = sum(backward_phase.values())
    s_total = sum(step_phase.values())
    # What the caching allocator holds at each phase's high-water mark: block rounding and fragmentation of the
    # phase's tensors, plus the blocks it still caches from the phase before.
    b_reserved = b_total + _allocator_overhead(
        b_total, act + logits + quant_work + gathered + amp_copies + in_backward_step + teacher_forward
        + distillation + dora_work) + cached_other_phase
    # The caching allocator still holds the blocks of the backward's logits (vocab-sized, the largest transient
    # tensors, which the optimizer step's parameter-shaped tensors do not fill) when the optimizer step peaks:
    # on vramfit's H200 rows (predictors/data/measured/H200.jsonl) full fine-tuning with an optimizer-step peak
    # reserved 0.4-7.7 GiB above allocated, the most with large vocabularies (Qwen 152k, Gemma-3 262k);
    # counting the logits took their reserved median error from 7.0 % to 5.3 % and the dev set's `unknown`
    # (reserved) rows from 16.7 % to 13.8 %.
    # the gradients are allocated during backward, in among the activations backward frees: half of them are taken
    # to sit in those fragmented blocks (a choice of the first version, global, not fitted to any reference row)
    fragmented_grads = 0.0 if fp32_gradients else grads * 0.5  # Megatron's buffer predates the activations
    s_reserved = (s_total + _allocator_overhead(s_total, step_tmp + fragmented_grads) + cached_logits) \
        if step_phase else 0.0
    if b_total >= s_total:
        phase, comps = "backward", backward_phase
    else:
        phase, comps = "optimizer_step", step_phase
    allocated = sum(comps.values())
    # The allocator returns nothing to the device between the phases of a step, so the reserved peak is the larger
    # of the two phases' (not the one of the phase with more live tensors): without this a batch just large enough
    # to move the allocated peak into backward could reserve less than a smaller batch did.
    reserved = max(b_reserved, s_reserved)
    overhead = reserved - allocated

    fragmentation = _length_fragmentation(spec, arch, lay) if (lay.pp == 1 or last_stage) else 0.0
    if fragmentation:
        notes.append(f"sequence_lengths variable: the caching allocator holds {fragmentation / 2**30:.2f} GiB of "
                     "blocks of many lengths' logits ("
                     f"{_VARIABLE_LENGTH_LOGIT_COPIES:g} fp32 copies of a {_mean_seq_len(spec)}-token micro-batch's); "
                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids it (expandable_segments: true)")
    elif spec.sequence_lengths == "variable" and spec.expandable_segments:
        notes.append("sequence_lengths variable with expandable_segments: no fragmentation of varying-length blocks")
    reserved += fragmentation
    nccl = _NCCL_BYTES if n_gpus > 1 else 0.0


    breakdown = {k: int(round(v)) for k, v in comps.items() if v > 0 or k in ("weights", "activations")}
    breakdown["allocator_overhead"] = int(round(overhead))
    if fragmentation:
        breakdown["allocator_fragmentation"] = int(round(fragmentation))
    breakdown["cuda_context"] = 0  # the GPU's: on_gpu
    if nccl:
        breakdown["nccl_buffers"] = int(round(nccl))
    if paged_states:
        breakdown["paged_optimizer_states"] = int(round(paged_states))
    peak_vram = sum(breakdown.values())
    if spec.offload != "none":
        notes.append(f"offload={spec.offload}: those states live in CPU memory")
    if spec.framework == "torchtune" and lora is not None:
        notes.append("framework torchtune: adapters in the model's dtype, each input kept once for the adapters that "
                     "read it" + ("; NF4 layers keep no input" if method == "qlora" else ""))
    if spec.framework == "transformers":
        if method == "qlora" and spec.resolved_quantization not in ("gptq-int4", "int8"):
            notes.append("framework transformers: 4-bit layers keep no input for backward (bitsandbytes >= 0.44)")
        elif method == "qlora" and spec.resolved_quantization == "int8":
            notes.append("framework transformers: 8-bit layers keep their 16-bit input for backward (bitsandbytes "
                         "MatMul8bitLt, every release)")
        if arch.activation in _PYTHON_GELU and arch.model_type not in _PYTHON_GELU_FAMILIES:
            notes.append(f"framework transformers: {arch.activation} runs unfused and keeps 3 tensors of the MLP's "
                         "width per block")
    return VramPrediction(
        peak_allocated_bytes=int(round(allocated)),
        peak_reserved_bytes=int(round(reserved)),
        peak_vram_bytes=int(peak_vram),
        breakdown_bytes=breakdown,
        peak_phase=phase,
        params_total=int(total_params),
        params_trainable=int(trainable_total),
        gpus=n_gpus,
        notes=tuple(notes),
    )


def needed_peak_bytes(vram: VramPrediction) -> int:
    """The device peak without the caching allocator's fragmentation of variable-length blocks, which PyTorch frees
    and retries before an allocation fails (so it never decides whether a job fits)."""
    return vram.peak_vram_bytes - vram.breakdown_bytes.get("allocator_fragmentation", 0)


def _mean_seq_len(spec: TrainingSpec) -> int:
    """Mean tokens per sample of a variable-length job: ``mean_seq_len``, else half of ``seq_len``."""
    return spec.mean_seq_len or max(spec.seq_len // 2, 1)


def _length_fragmentation(spec: TrainingSpec, arch: Architecture, lay: _Layout) -> float:
    """Reserved bytes beyond the fixed-length prediction when micro-batches vary in length (0 when they do not, with
    ``expandable_segments``, or without a vocabulary-sized loss): :data:`_VARIABLE_LENGTH_LOGIT_COPIES` fp32 copies
    of a mean-length micro-batch's logits; a chunked loss's tensors are one chunk's size."""
    if spec.sequence_lengths != "variable" or spec.expandable_segments:
        return 0.0
    if spec.task in ("seq-classification", "token-classification") or spec.cross_entropy == "fused-linear":
        return 0.0  # no vocabulary-sized tensor of the batch's size (fused-linear: token chunks of fixed size)
    elements = _logit_elements(spec, arch, lay) * _mean_seq_len(spec) / spec.seq_len
    if spec.cross_entropy == "chunked":
        elements /= _CHUNKED_CE_CHUNKS
    return _VARIABLE_LENGTH_LOGIT_COPIES * (2.0 if spec.cross_entropy == "16-bit" else 4.0) * elements


def _allocator_overhead(allocated: float, transient: float) -> float:
    """What the caching allocator reserves beyond ``allocated`` live bytes, ``transient`` of them short-lived:
    block rounding of the resident tensors, fragmentation of the transient ones, and its fixed pools."""
    return (_ALLOC_STATIC_FRACTION * (allocated - transient) + _ALLOC_TRANSIENT_FRACTION * transient
            + _ALLOC_FIXED_BYTES)


def offloaded_activation_bytes(spec: TrainingSpec, arch: Architecture, gpus: int) -> float:
    """Bytes of saved activations that ``activation_offloading`` moves to host memory per micro-batch on the most
    loaded GPU (each goes down in the forward and comes back in backward); 0 without it."""
    if not spec.activation_offloading:
        return 0.0
    arch = arch.for_task(spec.task)
    lay = _layout(spec, gpus)
    e = _compute_bytes(spec.precision)
    mixed = _fp32_stream(spec)
    kept = _activations(spec, arch, e, mixed, lay).total
    whole = _activations(spec.model_copy(update={"activation_offloading": False}), arch, e, mixed, lay).total
    return max(whole - kept, 0.0)


def _largest_trainable_matrix(arch: Architecture, lora: LoraSpec | None, saved: dict[str, float],
                              blocks_only: bool = False) -> float:
    """Elements of the largest parameter an optimizer steps: a weight matrix or the embedding in full fine-tuning
    (a block's matrix only under freeze tuning, ``blocks_only``: the embedding and the head stay frozen); an
    adapter's A or B (or a saved module's full copy) with LoRA."""
    if lora is None:
        if blocks_only:
            return float(max((g.in_features * g.out_features for g in arch.linears if g.role != "lm_head"),
                             default=0))
        return float(max([g.in_features * g.out_features for g in arch.linears]
                         + [arch.vocab_size * arch.hidden_size]))
    adapters = [lora.rank * max(g.in_features, g.out_features) for g in arch.lora_groups(lora.target_modules)]
    return float(max(adapters + list(saved.values()), default=0))


def _adapters_per_block(arch: Architecture, lora: LoraSpec) -> list[tuple[LinearGroup, float]]:
    """The adapted linear groups of the blocks (not the output head), each with its adapters per block and token: a
    routed expert's adapter only sees the tokens routed to it, top-k of the layer's experts per token (Mixtral /
    Qwen-MoE / DeepSeek-MoE route each token to num_experts_per_tok experts; HF MixtralSparseMoeBlock gathers each
    expert's tokens)."""
    out = []
    for g in arch.lora_groups(lora.target_modules):
        if g.role == "lm_head":
            continue
        per_layer = g.count / max(arch.num_layers + arch.num_encoder_layers, 1)
        if g.expert and arch.num_experts:
            per_layer *= arch.num_experts_per_tok / arch.num_experts
        out.append((g, per_layer))
    return out


def _galore_projected(spec: TrainingSpec, arch: Architecture) -> list[tuple[int, int, int]]:
    """(count, rows, columns) of the weight matrices GaLore projects (galore_target_modules, else every block
    linear; as PEFT reads target names)."""
    targets = spec.galore_target_modules or "all-linear"
    return [(g.count, g.out_features, g.in_features) for g in arch.lora_groups(targets) if g.role != "router"]


def _galore_states(spec: TrainingSpec, arch: Architecture, trainable_gpu: float, state_bytes: float,
                   per_gpu: float, notes: list[str]) -> float:
    """Optimizer-state bytes per GPU under GaLore (Zhao et al. 2024, arXiv:2403.03507; galore_torch): each targeted
    m x n matrix keeps its states on the gradient projected to rank r (r x max(m, n) elements) and the projector
    (r x min(m, n), in the parameter's dtype: GaLoreProjector.get_orthogonal_matrix); every other parameter
    (embeddings, norms, the head) keeps full states. ``per_gpu`` scales a whole-model count to one GPU."""
    assert spec.galore_rank is not None
    r = spec.galore_rank
    opt = spec.optimizer
    matrices = _galore_projected(spec, arch)
    projected_params = sum(c * m * n for c, m, n in matrices) * per_gpu
    rest = max(trainable_gpu - projected_params, 0.0)
    if opt == "adafactor":  # factored moments on the projected gradient: a row and a column per matrix
        low_rank = sum(c * (min(r, m, n) + max(m, n)) * 4.0 for c, m, n in matrices)
        rest_states = rest * 0.1 * 4.0
    else:
        per_element = _QUANT_STATE_BYTES[opt] if opt in _QUANT_STATE_BYTES else _STATE_FACTOR[opt] * state_bytes
        low_rank = sum(c * min(r, m, n) * max(m, n) * per_element for c, m, n in matrices)
        rest_states = rest * per_element
    projectors = sum(c * min(r, m, n) * min(m, n) * state_bytes for c, m, n in matrices)
    states = (low_rank + projectors) * per_gpu + rest_states
    notes.append(f"GaLore rank {r}: {len(matrices)} matrix groups keep rank-{r} states and projectors "
                 f"({(low_rank + projectors) * per_gpu / 2**30:.2f} GiB per GPU), the other "
                 f"{int(rest):,} parameters full states")
    return states


def _galore_svd_workspace(spec: TrainingSpec, arch: Architecture, per_gpu: float) -> float:
    """The projector update's temporaries (every update_proj_gap steps, at the optimizer step): the largest targeted
    matrix's gradient in fp32 and its thin SVD factors (torch.linalg.svd full_matrices=False), about three
    matrices of fp32 in all."""
    largest = max((m * n for _, m, n in _galore_projected(spec, arch)), default=0)
    return largest * 12.0 * per_gpu


def _zero_gradient_buffer(spec: TrainingSpec, arch: Architecture, e: int) -> tuple[float, float]:
    """DeepSpeed's contiguous gradient buffer, (elements, bytes): ``zero_reduce_bucket_elements`` (unset: DeepSpeed's
    5e8; ``auto``: hidden_size^2, what the HF Trainer and accelerate fill "auto" with), two of them at ZeRO-2 with
    ``zero_overlap_comm`` (stage 1 turns overlap off), in the dtype of the trained parameters (16-bit unless the run
    is 32-true)."""
    size = spec.zero_reduce_bucket_elements
    if size == "auto":
        elements = float(arch.hidden_size) ** 2
    else:
        elements = float(_ZERO_BUCKET_ELEMENTS if size is None else size)
    buffers = 2 if spec.sharding == "zero2" and spec.zero_overlap_comm else 1
    return elements * buffers, elements * buffers * (4.0 if e == 4 else 2.0)


def _dora_bytes_per_output(lora: LoraSpec, e: int, adapter_bytes: int) -> float:
    """Bytes per token and output feature that a DoRA layer keeps beyond LoRA's: it scales the base output and the
    adapter's output by the trainable magnitude over the weight norm, so autograd keeps both products' tensor
    operands (peft/tuners/lora/dora.py DoraLinearLayer.forward: ``(mag_norm_scale - 1) * base_result +
    mag_norm_scale * lora_result * scaling``). The base output is the base layer's own (model dtype) when the adapter
    has no dropout; with dropout PEFT recomputes it from the dropped-out input in the adapter's dtype
    (Linear.forward). PEFT's MetaMathQA benchmark (Llama-3.2-3B, q/v rank 32, batch 4 x 768, L40S): DoRA peaks
    2.27 GB above LoRA; these 6 bytes give 2.1 GB."""
    return (e if lora.dropout == 0 else adapter_bytes) + adapter_bytes


def _blocks_keeping_weight_copies(spec: TrainingSpec, per_stage_layers: int) -> int:
    """Blocks whose per-forward weight copies (autocast's 16-bit casts, DoRA's recomputed base weights) autograd holds
    at once: every block of the stage without full checkpointing; with it the block being recomputed plus the blocks
    checkpoint_every_n_layers leaves unchecked."""
    if spec.gradient_checkpointing != "full":
        return per_stage_layers
    return per_stage_layers - math.ceil(per_stage_layers / (spec.checkpoint_every_n_layers or 1)) + 1


def _dora_base_copy_bytes_per_block(spec: TrainingSpec, arch: Architecture, lora: LoraSpec, e: int, mixed: bool,
                                    sharding: str) -> float:
    """Bytes per block of the base weights a PEFT DoRA layer with adapter dropout keeps for backward. With dropout
    the layer cannot reuse the base layer's output (it was computed from the input before dropout), so it computes
    ``F.linear(dropout(x), weight.to(x.dtype))`` again, x in the adapter's dtype (peft/tuners/lora/layer.py
    Linear.forward, ``base_result = None`` when the dropout is not an identity; peft/tuners/lora/dora.py
    DoraLinearLayer.forward). The input needs its gradient, so autograd keeps that weight operand: an fp32 copy of
    every adapted 16-bit (or dequantized 4-bit) weight under 16-true/bf16-true (vramfit's H100 rows, Llama-3.2-1B
    all-linear DoRA, dropout 0.05, no checkpointing: 34.36 GiB against 26.66 GiB without dropout, 3.6 GiB of it
    these copies); autocast's 16-bit cast of the fp32 weight under mixed precision without a sharding engine; none
    for a 32-true model (the cast returns the weight itself), FSDP/DeepSpeed's 16-bit compute weights, or torchtune's
    DoRALinear (which reuses its base output). A 4-bit base is dequantized into a fresh tensor each time
    (dequantize_module_weight), so its copy is never free: 4 bytes where the input is cast to fp32 adapters (no
    autocast), 2 where it stays 16-bit (bitsandbytes' LoRA layers skip the cast under autocast,
    peft/tuners/lora/bnb.py; FSDP casts the adapters to 16 bits). PEFT >= 0.14 (its base-output reuse, 2024-12);
    earlier releases recompute the base output with or without dropout (0.10-0.13 dora.py), which this leaves out."""
    if lora.dropout == 0 or not lora.use_dora or spec.framework == "torchtune":
        return 0.0
    if spec.method == "qlora":
        copy_bytes = 4.0 if (e == 4 or not mixed) else 2.0
    elif e == 4:
        return 0.0
    elif mixed:
        copy_bytes = 2.0 if sharding in ("none", "ddp") and spec.framework != "megatron" and not spec.master_weights \
            else 0.0
    else:
        copy_bytes = 4.0
    blocks = max(arch.num_layers + arch.num_encoder_layers, 1)
    return sum(g.count * g.in_features * g.out_features for g in arch.lora_groups(lora.target_modules)
               if g.role != "lm_head") / blocks * copy_bytes


def _dora_workspace(arch: Architecture, lora: LoraSpec, adapter_bytes: int, tp: int) -> float:
    """One DoRA layer's weight-norm temporaries (the largest adapted linear's): the identity it feeds through the
    adapter (in x in), the adapter's weight product (in x out), the base weight cast to the adapter's dtype and
    their scaled sum (out x in each), in the adapter's dtype (DoraLinearLayer.forward / get_weight_norm). Alive in
    each adapted layer's forward, and in backward when checkpointing recomputes it."""
    sizes = [(g.in_features * g.in_features + 3 * g.in_features * g.out_features)
             for g in arch.lora_groups(lora.target_modules) if g.role != "lm_head"]
    return max(sizes, default=0) * adapter_bytes / tp


def _torchtune_lora_activations(arch: Architecture, lora: LoraSpec, e: int, width: float) -> float:
    """Bytes per token and block that torchtune's LoRA adapters keep (torchtune/modules/peft/lora.py LoRALinear):
    ``lora_a(dropout(x))`` keeps its input in the model's dtype, no cast. Without dropout (an identity) the adapters
    that read the same tensor keep it once: the attention norm's output for q/k/v, the MLP norm's for gate/up, and
    the gated product for down; o_proj's input is the attention kernel's output, which the block keeps already.
    With dropout each adapter keeps its own dropped copy and mask. ``lora_b`` keeps the rank-r intermediate."""
    roles: dict[str, float] = {}
    for g, per_layer in _adapters_per_block(arch, lora):
        for role in FUSED_MODULES.get(g.role, (g.role,)):
            roles[role] = max(roles.get(role, 0.0), per_layer)
    total = sum(per_layer * e * lora.rank for per_layer in roles.values())
    if lora.use_dora:
        # torchtune's DoRALinear scales the base output and the adapter's by the magnitude over the weight norm: both
        # kept for backward, in the model's dtype (torchtune/modules/peft/dora.py)
        total += sum(per_layer * g.out_features * 2 * e for g, per_layer in _adapters_per_block(arch, lora))
    h = arch.hidden_size
    if lora.dropout > 0:
        inputs = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": arch.num_attention_heads * arch.head_dim,
                  "gate_proj": h, "up_proj": h, "down_proj": width}
        return total + sum(per_layer * inputs.get(role, h) * (e + 1) for role, per_layer in roles.items())
    shared = [("attention input", ("q_proj", "k_proj", "v_proj"), h), ("MLP input", ("gate_proj", "up_proj"), h),
              ("down input", ("down_proj",), width)]
    for _, members, size in shared:
        present = [roles[m] for m in members if m in roles]
        if present:
            total += max(present) * size * e
    return total


def _saves_input(role: str, spec: TrainingSpec, targets: set[str]) -> bool:
    """Whether a linear layer keeps its input for backward.

    PyTorch's autograd saves a matmul's input only when the weight needs a gradient, so the frozen base
    linears of LoRA keep nothing; an adapter on one keeps its own copy of the input (PEFT casts it to the
    adapter's dtype), counted per adapter in :func:`_activations`. bitsandbytes' 4-bit matmul
    (``MatMul4Bit``) keeps its input whenever the activation needs a gradient: QLoRA saves them all.
    That holds up to bitsandbytes 0.43 (``ctx.tensors = (A, B)`` in autograd/_functions.py); 0.44 keeps
    ``(None, B)``, so newer stacks save less and this errs on the safe side; with ``framework: transformers``
    (bitsandbytes >= 0.44: vramfit's H200 QLoRA rows without checkpointing sat 8-12 % over with the inputs counted)
    they keep none. The old attribute-held input
    also outlives backward when a training loop keeps the previous step's outputs (litgpt), which this
    model does not count: litgpt QLoRA rows of the dev set sit 11-27 % above it.
    GPTQ kernels dequantize into a temporary that needs no gradient, so plain autograd rules apply.
    bitsandbytes' 8-bit matmul (``MatMul8bitLt``) keeps its 16-bit input whenever it needs a gradient, in every
    release to date (``ctx.tensors = (CAt, subA, A)``): LLM.int8 layers save it under any framework.
    """
    if spec.method == "qlora" and spec.resolved_quantization == "int8":
        return True
    if spec.method == "qlora" and spec.resolved_quantization != "gptq-int4" and spec.framework is None:
        return True  # torchao's NF4 (torchtune) keeps no input either: linear_nf4 saves the weight only
    # LoRA: the base weight is frozen, so its matmul keeps no input; what the adapter keeps is its own copy of
    # the input (counted per adapter in _activations)
    return spec.method == "full"


class _Activations(NamedTuple):
    """Activation bytes of one GPU in backward: ``kept`` (saved through the forward) and ``recompute`` (what the
    block that full checkpointing recomputes holds while backward runs through it; 0 without checkpointing)."""

    kept: float
    recompute: float

    @property
    def total(self) -> float:
        return self.kept + self.recompute


def _activations(
    spec: TrainingSpec, arch: Architecture, e: int, mixed: bool, lay: _Layout, first_stage: bool = True
) -> _Activations:
    """Saved activations of one pipeline stage's GPU at the start of the backward pass, in bytes.

    ``first_stage`` picks the first pipeline stage (pp micro-batches in flight under 1F1B); otherwise the
    last stage (one micro-batch). Without pipeline parallelism both are the same.
    """
    b = spec.micro_batch_size
    s = spec.seq_len / lay.cp
    tokens = b * s
    h = arch.hidden_size
    heads, kv, hd = arch.num_attention_heads, arch.num_kv_heads, arch.head_dim
    lora = spec.resolved_lora
    if lora is None:
        targets: set[str] = set()
    elif lora.target_modules == "all-linear":
        targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    else:
        targets = arch.lora_roles(lora.target_modules)
    full = spec.method == "full"
    # residual stream dtype: fp32 under AMP with an fp32 model; FSDP/DeepSpeed mixed precision computes
    # with 16-bit parameters, so the stream stays 16-bit
    amp_fp32_model = _autocast_over_fp32(spec, lay, mixed)
    res_bytes = 4 if (amp_fp32_model or e == 4) else e
    # Norms in HF/litgpt upcast to fp32 and keep that copy for backward (+ the normalised output when
    # the norm weight trains).
    norm = 4 * h + ((4 if amp_fp32_model else e) * h if full else 0)
    compiled = bool(spec.torch_compile)
    if compiled or spec.framework == "megatron":
        # torch.compile fuses the norm into one kernel that saves its input (the residual stream's dtype) and the
        # per-token reciprocal RMS, and recomputes the fp32 copy and the normalised output in backward; Megatron's
        # fused LayerNorm / RMSNorm (apex, Transformer Engine) saves its input and the per-token statistics likewise
        norm = res_bytes * h
    dropout, hidden_dropout = _dropout(arch)
    # attention block
    attn = 2 * norm / 2  # one norm
    if any(_saves_input(r, spec, targets) for r in ("q_proj", "k_proj", "v_proj")):
        attn += e * h
    # q, k, v (after rotary) kept by the attention kernel. With grouped-query attention, the sdpa and eager
    # paths of HF transformers (repeat_kv), litgpt (k/v expand + reshape), torchtitan (repeat_kv) and
    # torchtune (expand before SDPA) materialise k and v at the full head count and that copy is what the
    # kernel keeps; flash-attn takes the kv heads as they are.
    kv_kept = kv if spec.attention == "flash" else heads
    attn += e * (heads + 2 * kv_kept) * hd
    if arch.kv_lora_rank:
        attn += e * arch.kv_lora_rank
    attn += e * heads * (arch.v_head_dim or hd)  # attention output (o_proj input and kernel output)
    # per query token and attended key: eager attention's kept scores (0 for the fused kernels)
    score_bytes = heads * _eager_score_bytes(arch, e, amp_fp32_model, dropout, spec.framework == "megatron") \
        if spec.attention == "eager" else 0.0
    if spec.attention == "eager":
        attn += score_bytes * s
    else:
        attn += 4 * heads  # log-sum-exp per row (fp32)
    # MLP block
    mlp = norm
    if arch.is_moe:
        width = arch.moe_intermediate_size * arch.num_experts_per_tok + arch.shared_expert_intermediate_size
        moe_share = arch.num_moe_layers / arch.num_layers
        # token dispatch (each routed copy of the input and each expert output) + fp32 router softmax, in the MoE
        # layers only (DeepSeek's first_k_dense_replace layers and Qwen-MoE's mlp_only_layers are dense)
        mlp += (e * h * arch.num_experts_per_tok * 2 + 4 * arch.num_experts) * moe_share
        width = width * moe_share + arch.intermediate_size * (1 - moe_share)
    else:
        width = arch.intermediate_size
    if any(_saves_input(r, spec, targets) for r in ("gate_proj", "up_proj")):
        mlp += e * h
    if arch.gated_mlp:
        # gate output (activation input), activation output, up output; compiled, act(gate) * up is one kernel
        # that keeps its two inputs and recomputes the activation in backward
        mlp += (2 if compiled else 3) * e * width
    else:
        mlp += e * width  # activation input
    if not compiled:  # a compiled activation is one fused kernel whatever the Python that writes it
        mlp += _activation_function_bytes(arch, e, amp_fp32_model, spec.framework) * width
    if _saves_input("down_proj", spec, targets):
        mlp += e * width
    if hidden_dropout > 0:
        mlp += 2 * h  # residual-dropout masks (1 byte each) after attention and MLP
    # LoRA: each adapter's copy of its input and the rank-r intermediate
    lora_extra = 0.0
    if lora is not None and spec.framework == "torchtune":
        lora_extra = _torchtune_lora_activations(arch, lora, e, width)
    elif lora is not None:
        for g, per_layer in _adapters_per_block(arch, lora):
            # PEFT casts each adapter's input to the adapter's dtype (Linear.forward, _cast_input_dtype): fp32
            # adapters (its default) on a 16-bit model keep a 4-byte copy of the input per adapter, after dropout
            # (+ its 1-byte mask); under autocast with an fp32 model, or FSDP casting the adapters to 16 bits,
            # lora_A keeps its 16-bit cast instead. q, k and v each keep their own copy.
            copy_bytes = 4 if (e == 4 or not mixed) else 2
            extra = copy_bytes * lora.rank + g.in_features * (copy_bytes + (1 if lora.dropout > 0 else 0))
            if lora.use_dora:
                extra += g.out_features * _dora_bytes_per_output(lora, e, copy_bytes)
            lora_extra += per_layer * extra
    # Blocks with other than two norms: Gemma 2/3 also normalise each sublayer's output before the residual add
    # (post-attention and post-feedforward norms, four per block); Phi-1/2 and GPT-J run attention and MLP in
    # parallel from one norm. Each norm keeps what the two counted above keep.
    norms = norm * (arch.norms_per_layer - 2)
    if arch.qk_norm:
        # q_norm / k_norm (an RMSNorm over each head of q and k, before rotary): the fp32 copy of their input (+ the
        # normalised output when their weights train), at q's and k's widths
        norms += (e if compiled else 4 + ((4 if amp_fp32_model else e) if full else 0)) * (heads + kv) * hd
    per_layer = (attn + mlp + lora_extra + norms) / lay.tp
    if lay.tp > 1 and spec.sequence_parallel is False:
        # without sequence parallelism the tensor-parallel ranks each keep whole what lies outside the parallel
        # regions: the norms' inputs, the first linears' input (the norm output they all read) and the residual
        # dropout masks (Korthikanti et al. 2022: 10sbh of a GPT layer's 34sbh)
        replicated = norm * arch.norms_per_layer + (2 * h if hidden_dropout > 0 else 0.0)
        replicated += e * h * sum(any(_saves_input(r, spec, targets) for r in group)
                                  for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")))
        per_layer += replicated * (1 - 1 / lay.tp)
    # residual stream additions keep nothing; the block output is the next block's norm input.

    # 1F1B pipeline: the first stage holds the activations of pp micro-batches, the last stage one; under
    # trainable_layers only the blocks backward runs through keep anything
    layers = math.ceil(arch.num_layers / lay.pp) if spec.trainable_layers is None else trained_blocks(spec, arch)[1]
    enc_layers = arch.num_encoder_layers
    if arch.is_encoder_decoder:
        # Decoder blocks see the target sequence (usually far shorter than the input): their self-attention
        # scores are s_dec x s_dec. Cross-attention (HF T5LayerCrossAttention) adds a third norm, q and the
        # attention output per decoder token, s_dec x s_enc eager scores, and per decoder block k and v
        # projected from the encoder output, so at the ENCODER length; the encoder output itself (the k/v
        # projections' input) is one tensor all decoder blocks share.
        s_dec = decoder_tokens(spec) / lay.cp
        dec_ratio = decoder_tokens(spec) / spec.seq_len
        dec_self = per_layer - score_bytes * (s - s_dec) / lay.tp
        q_in = e * h if _saves_input("q_proj", spec, targets) else 0.0
        cross_per_dec_token = (norm + q_in + 2 * e * heads * hd + (score_bytes * s if spec.attention == "eager"
                                                                    else 4 * heads)) / lay.tp
        cross_per_enc_token = 2 * e * heads * hd / lay.tp
        dec_per_layer = (dec_self + cross_per_dec_token) * dec_ratio + cross_per_enc_token  # per encoder token
        kv_input = e * h / lay.tp if any(_saves_input(r, spec, targets) for r in ("k_proj", "v_proj")) else 0.0
        stack = enc_layers * per_layer + layers * dec_per_layer + kv_input
        biggest = max(per_layer, dec_per_layer)
        scores = (enc_layers * score_bytes * s + layers * score_bytes * (s_dec + s) * dec_ratio) / lay.tp
        layer_scores = max(score_bytes * s, score_bytes * (s_dec + s) * dec_ratio) / lay.tp
    else:
        stack = layers * per_layer
        biggest = per_layer
        scores = layers * score_bytes * s / lay.tp
        if full and spec.trainable_layers is not None and layers > trained_blocks(spec, arch)[0]:
            # freeze tuning, the first -n blocks trained: the frozen blocks above them, which backward runs through,
            # keep neither their linears' inputs (no weight gradient) nor their norms' normalised outputs
            trained_norm = (4 if amp_fp32_model else e) * h if not compiled else 0.0
            frozen_less = (e * h * 2 + e * width + trained_norm * arch.norms_per_layer) / lay.tp
            stack -= (layers - min(trained_blocks(spec, arch)[0], layers)) * frozen_less
        layer_scores = score_bytes * s / lay.tp

    ckpt = spec.gradient_checkpointing
    recompute = 0.0  # held once, whatever the number of micro-batches in flight
    uncheckpointed = 0.0  # blocks that checkpoint_every_n_layers leaves unchecked: neither recomputed nor offloaded
    offloadable_blocks = layers + enc_layers
    if ckpt == "full":
        # each block keeps only its input; the block being recomputed holds its full activations and
        # the gradient of its output while backward runs through it
        # (with tensor parallelism the kept inputs are sequence-parallel shards; without sequence parallelism each
        # rank keeps them whole)
        kept_tp = 1 if spec.sequence_parallel is False else lay.tp
        act_per_token = (layers + enc_layers) * res_bytes * h / kept_tp
        if arch.is_encoder_decoder:  # decoder block inputs at the decoder length, + the shared encoder output
            act_per_token = ((layers * decoder_tokens(spec) / spec.seq_len + enc_layers) * res_bytes + e) * h / kept_tp
        recompute = biggest + 2 * e * h / lay.tp
        if spec.framework == "transformers":
            recompute += _CKPT_BACKWARD_WIDTH_GRADIENTS * e * width / lay.tp
        every = spec.checkpoint_every_n_layers or 1
        if every > 1:
            # only blocks 0, n, 2n, ... are checkpointed (transformers' _set_gradient_checkpointing: layer index % n
            # == 0); the others keep what a block keeps without checkpointing
            blocks = layers + enc_layers
            offloadable_blocks = math.ceil(blocks / every)
            uncheckpointed = (1.0 - offloadable_blocks / blocks) * stack
            act_per_token *= offloadable_blocks / blocks
        elif spec.checkpoint_trained_blocks_only and spec.trainable_layers is not None:
            # LLaMA-Factory checkpoints a block only if it has trainable parameters
            # (src/llamafactory/model/model_utils/checkpointing.py, get_custom_gradient_checkpointing_func): the
            # frozen blocks that backward runs through (above the first -n trained ones) keep all their activations
            trained = min(trained_blocks(spec, arch)[0], layers)
            if layers > trained:
                offloadable_blocks = trained
                uncheckpointed = stack - trained * per_layer  # the frozen blocks' (stack counts them as frozen)
                act_per_token *= trained / layers
                # backward frees the frozen blocks above before it reaches the trained ones and recomputes them: the
                # recomputed block never meets the frozen blocks' activations (kept + recompute is the larger of
                # the two moments)
                recompute = max(recompute - uncheckpointed, 0.0)
    elif ckpt == "selective":
        # recompute the cheap element-wise ops; keep matmul inputs/outputs (Korthikanti et al. 2022). The attention
        # core (scores, softmax, dropout: their 5as/h term) is always among what is recomputed, so eager attention's
        # s x s scores are not kept; the layer running backward recomputes its own once.
        act_per_token = (stack - scores) * _SELECTIVE_KEPT_FRACTION
        recompute = layer_scores
    else:
        act_per_token = stack
    in_flight = lay.pp
    if spec.activation_offloading:
        # the saved activations go to CPU memory block by block; backward brings one block back and prefetches the
        # next (micro-batches in flight on a pipeline stage are offloaded alike). With checkpoint_every_n_layers
        # only the checkpointed blocks' inputs go (transformers' offload wraps the checkpoint call in save_on_cpu).
        act_per_token = min(act_per_token, _OFFLOADED_BLOCKS_ON_GPU * act_per_token / max(offloadable_blocks, 1))
        in_flight = 1
    if lay.pp > 1 and first_stage:
        # the first stage ends at a block boundary: no final norm; its input is the next stage's
        return _Activations((act_per_token * in_flight + uncheckpointed * lay.pp) * tokens, recompute * tokens)
    # final norm: its input and fp32 copy (sequence-parallel shards under tensor parallelism; compiled, the input)
    fp32_copy = 4 * h if spec.task != "seq-classification" and not spec.torch_compile else 0
    act_per_token += uncheckpointed + (res_bytes * h + fp32_copy) / lay.tp
    return _Activations(act_per_token * tokens, recompute * tokens)


# Families whose eager attention runs softmax in the scores' own dtype (HF modeling_gpt2 eager_attention_forward,
# modeling_bert BertSelfAttention and modeling_distilbert MultiHeadSelfAttention: ``softmax(scores, dim=-1)``;
# modeling_falcon: ``softmax(..., dtype=hidden_states.dtype)``). Every other HF family (the shared
# ``eager_attention_forward`` of Llama, Mistral, Qwen2, Gemma, Phi-3, ...: ``softmax(scores, dim=-1,
# dtype=torch.float32).to(query.dtype)``; T5: ``softmax(scores.float())``) and litgpt's eager path
# (``F.softmax(scores, dim=-1, dtype=torch.float)``) upcast to fp32.
_EAGER_SOFTMAX_IN_INPUT_DTYPE = frozenset({"gpt2", "bert", "roberta", "distilbert", "falcon", "refinedwebmodel"})


def _eager_score_bytes(arch: Architecture, e: int, amp_fp32_model: bool, dropout: float, megatron: bool = False
                       ) -> float:
    """Bytes eager attention keeps for backward per element of its ``heads x s x s`` score matrix.

    softmax keeps its output (``_softmax_backward_data`` takes the result); the matmul with V keeps the
    probabilities it was given. With an fp32 upcast (or autocast, which runs softmax in fp32) and 16-bit compute
    those are two tensors: the fp32 softmax output and its 16-bit cast (4 + 2 bytes). With attention dropout the
    matmul keeps the dropped probabilities instead, and dropout its 1-byte mask. Gemma 2's score soft-capping
    (``tanh(scores / cap) * cap``) keeps the tanh output as well (``tanh_backward`` takes the result). Megatron's
    FusedScaleMaskSoftmax computes in fp32 inside one kernel and returns (and keeps) the probabilities in the input
    dtype: with dropout, 2 + 1 + 2 bytes per score (Korthikanti et al. 2022's 5as^2b per layer).
    """
    softmax_bytes = 4 if (e == 4 or amp_fp32_model or (arch.model_type not in _EAGER_SOFTMAX_IN_INPUT_DTYPE
                                                       and not megatron)) else e
    matmul_bytes = e  # the compute dtype (autocast casts P to 16 bits for P @ V)
    if dropout > 0:
        # under autocast the matmul keeps its 16-bit cast of the dropped fp32 probabilities (2 bytes); this still
        # counts them at 4 (9 bytes, not 7), which the S17 BERT fp16 row (an nvml reading that includes cached
        # transients) fits better
        per_score = softmax_bytes + 1 + (softmax_bytes if amp_fp32_model else matmul_bytes)
    else:
        per_score = softmax_bytes + (matmul_bytes if matmul_bytes != softmax_bytes else 0)
    if arch.attn_logit_softcapping:
        per_score += e
    return float(per_score)


# Activations that transformers writes as a chain of element-wise tensor ops rather than one fused kernel, so that
# autograd keeps intermediates beyond the input: NewGELUActivation ("gelu_new": GPT-2, GPT-J, GPT-Neo, Phi-1/2,
# T5 gated-gelu) computes 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))), whose tanh keeps its output and
# whose last product keeps both factors (0.5 * x and 1 + tanh): three tensors of the MLP's width besides x itself.
# Fused ones (silu, gelu, gelu_pytorch_tanh, relu) keep only their input, which the MLP term already counts.
_PYTHON_GELU = frozenset({"gelu_new"})
# ... in the families trained through transformers' modeling code. Phi-1/2 also name gelu_new, but litgpt, whose
# runs are the public Phi measurements (shared/reference S07), computes it as one fused F.gelu(approximate="tanh"):
# Phi gets the fused count, which under-counts a transformers Phi run by 3 tensors of the MLP width (vramfit's H200
# Phi-2 LoRA row: 14.5 % under), unless the spec says framework: transformers, where every gelu_new is the chain.
_PYTHON_GELU_FAMILIES = frozenset({"gpt2", "gptj", "gpt_neo", "codegen", "t5", "mt5", "umt5"})


def _activation_function_bytes(arch: Architecture, e: int, amp_fp32_model: bool, framework: str | None = None
                                ) -> float:
    """Bytes per MLP-width element that the activation function keeps beyond its input (transformers
    activations.py). Without autocast the three intermediates are in the compute dtype. Under autocast ``pow``
    runs in fp32 (autocast's fp32 op list), so it keeps an fp32 copy of x in place of the 16-bit x (which nothing
    else keeps), and everything after it is promoted to fp32 except ``0.5 * x``: (4 - 2) for the copy, 4 (tanh),
    2 (0.5x), 4 (1 + tanh). Megatron fuses the bias and the GeLU into one kernel that keeps its input
    (fused_bias_gelu.py; Transformer Engine's fused GeLU likewise): nothing beyond it."""
    if framework == "megatron":
        return 0.0
    if arch.activation not in _PYTHON_GELU or not (framework == "transformers"
                                                   or arch.model_type in _PYTHON_GELU_FAMILIES):
        return 0.0
    if amp_fp32_model and e != 4:
        return (4.0 - e) + 4.0 + e + 4.0
    return 3.0 * e


# Target length assumed for encoder-decoder models (the spec's seq_len is the encoder input length,
# shared/reference/README "How settings were mapped"): fine-tuning targets are short (labels of a few
# tokens in the PEFT examples; 128 is the default max_target_length of HF's summarization example).
_DECODER_TOKENS = 128


def decoder_tokens(spec: TrainingSpec) -> int:
    return min(spec.seq_len, _DECODER_TOKENS)


def _family_dropout(arch: Architecture) -> float:
    """Families trained with dropout by default (GPT-2, BERT, T5: 0.1); modern decoders use none."""
    return 0.1 if arch.model_type in ("gpt2", "bert", "roberta", "t5", "mt5", "bloom_train") else 0.0


def _dropout(arch: Architecture) -> tuple[float, float]:
    """The attention and the hidden (residual) dropout probabilities: what the config states, else the family's."""
    family = _family_dropout(arch)
    return (family if arch.attention_dropout is None else arch.attention_dropout,
            family if arch.hidden_dropout is None else arch.hidden_dropout)


def _logits_bytes_per_element(e: int, lay: _Layout, spec: TrainingSpec, arch: Architecture) -> float:
    if e == 4:
        return _LOGITS_BYTES_PER_ELEMENT_32BIT
    if spec.cross_entropy == "16-bit":
        return _LOGITS_BYTES_PER_ELEMENT_DEEPSPEED  # the logits and their log-softmax, both 16-bit
    if spec.framework == "megatron" and spec.cross_entropy in (None, "full"):
        return _LOGITS_BYTES_PER_ELEMENT_MEGATRON
    # DeepSpeed's engine at any stage (ZeRO, or stage 0: master_weights)
    deepspeed_engine = lay.sharding.startswith("zero") or (spec.master_weights and spec.framework != "megatron")
    if deepspeed_engine and not (spec.framework == "transformers" and arch.model_type not in _REMOTE_CODE_16BIT_LOSS):
        return _LOGITS_BYTES_PER_ELEMENT_DEEPSPEED
    return _LOGITS_BYTES_PER_ELEMENT_16BIT


def _logits(spec: TrainingSpec, arch: Architecture, e: int, lay: _Layout) -> float:
    """Logits and cross-entropy tensors (vocab-sized, fp32 upcast) at the end of the forward pass."""
    if spec.task in ("seq-classification", "token-classification"):
        return 0.0
    if spec.cross_entropy == "fused-linear":
        return _fused_loss_bytes(spec, arch, e, lay)
    per_elem = _logits_bytes_per_element(e, lay, spec, arch)
    if spec.cross_entropy == "chunked":
        # every chunk's logits in the compute dtype and fp32 log-probabilities, one chunk's fp32 upcast in flight;
        # never more than the whole-batch loss (a 16-bit DeepSpeed loss is already smaller). Compiled, each chunk's
        # loss is a fused kernel that keeps the chunk's logits and recomputes the fp32 log-probabilities in backward:
        # the logits and one chunk's fp32 work (S02's Llama-3.2-3B LoRA/QLoRA rows, compiled, peak 8.5 / 4.6 GiB,
        # which leaves about 2 bytes per logit)
        if spec.torch_compile:
            chunked = e + (4.0 + 4.0) / _CHUNKED_CE_CHUNKS
        else:
            chunked = e + 4.0 + (4.0 if e != 4 else 0.0) / _CHUNKED_CE_CHUNKS
        per_elem = min(per_elem, chunked)
    elif spec.torch_compile and spec.cross_entropy in (None, "full") and spec.framework not in ("megatron",
                                                                                               "torchtune"):
        # a compiled whole-batch loss over the 16-bit logits (torchtitan compiles cross_entropy(pred.float(), ...)
        # beside the blocks) is one fused reduction that computes the fp32 log-softmax in registers and keeps only
        # the logits (and a per-row log-sum-exp); backward writes the logits' gradient in the compute dtype: 2 x the
        # dtype per logit. torchtune's decoder upcasts its output itself (TransformerDecoder: output(h).float(),
        # outside the compiled blocks), so there the fp32 logits stay (S02's compiled full-loss row: -2.9 % as it
        # was, -14.4 % read fused). torchtitan's Llama 3 8B rows: S12 +25 % -> -2.5 %, external X70 +33 % -> +12 %.
        per_elem = min(per_elem, 2.0 * e)
    if arch.final_logit_softcapping:
        # HF Gemma2ForCausalLM: logits = tanh(logits / cap) * cap in the compute dtype; tanh keeps its output for
        # backward (its gradient comes after the fp32 loss tensors are freed, so it does not add to the peak)
        per_elem += min(e, 4)
    # with pipeline parallelism the head lives on the last stage, which holds one micro-batch
    return _logit_elements(spec, arch, lay) * per_elem


# Bytes per logit that a forward-KL distillation loss saves for backward: the teacher's fp32 probabilities, the
# student's fp32 log-probabilities and the -inf mask (torchtune/modules/loss/kd_losses.py ForwardKLLoss: softmax and
# log_softmax in float32, a masked product; autograd keeps both operands of the product). Chunking
# (ForwardKLWithChunkedOutputLoss) bounds the fp32 work in flight, not what every chunk saves. TRL's GKD
# (generalized JSD) keeps a few more log-probability tensors of the same size.
_KD_SAVED_BYTES_PER_LOGIT = 4.0 + 4.0 + 1.0


def _distillation_bytes(spec: TrainingSpec, arch: Architecture, teacher: Architecture | None, e: int,
                        lay: _Layout) -> tuple[float, float]:
    """(teacher_forward, distillation_loss): the teacher's logits in the compute dtype (alive until the losses are
    computed; the recipes delete them then) plus the widest tensor of its no_grad forward, one block's MLP
    intermediates; and the distillation loss's saved fp32 tensors over the student's logits."""
    if teacher is None:
        return 0.0, 0.0
    tokens = spec.micro_batch_size * spec.seq_len / lay.cp
    teacher_logits = tokens * teacher.vocab_size / lay.tp * e
    width = max(teacher.intermediate_size, teacher.moe_intermediate_size * max(teacher.num_experts_per_tok, 1))
    working = tokens * width * (3 if teacher.gated_mlp else 2) / lay.tp * e
    saved = _logit_elements(spec, arch, lay) * _KD_SAVED_BYTES_PER_LOGIT
    return teacher_logits + working, saved


def _fused_loss_bytes(spec: TrainingSpec, arch: Architecture, e: int, lay: _Layout) -> float:
    """cross_entropy fused-linear: the head input's gradient (tokens x hidden) and one chunk of logits."""
    vocab = arch.vocab_size / lay.tp
    tokens = _logit_elements(spec, arch, lay) / vocab  # the micro-batch's scored tokens on this GPU
    hidden = arch.hidden_size
    inc_factor = max(math.ceil(vocab / hidden), 1)
    chunk_tokens = min(2 ** math.ceil(math.log2(max(math.ceil(tokens / inc_factor), 1))), tokens)
    return tokens * hidden * e + chunk_tokens * vocab * e


def _logits_gradient(spec: TrainingSpec, arch: Architecture, e: int, lay: _Layout) -> float:
    """The gradient of the logits in the compute dtype while backward runs through the loss: the whole batch's, one
    chunk's (chunked), or none beyond what the fused loss already holds."""
    if spec.cross_entropy == "fused-linear":
        return 0.0
    elements = _logit_elements(spec, arch, lay)
    return elements * e / (_CHUNKED_CE_CHUNKS if spec.cross_entropy == "chunked" else 1)


def _logit_elements(spec: TrainingSpec, arch: Architecture, lay: _Layout) -> float:
    """Logits of one micro-batch on one GPU (tokens x vocab, split by tensor and context parallelism): of every
    position, or of the last ``logits_tokens`` of each sequence where the loss needs no more (online RL scores the
    completion only: TRL's GRPO/RLOO ask the model for ``logits_to_keep`` positions)."""
    length = decoder_tokens(spec) if arch.is_encoder_decoder else spec.seq_len
    if spec.logits_tokens is not None:
        length = min(length, spec.logits_tokens)
    return spec.micro_batch_size * length / lay.cp * arch.vocab_size / lay.tp
