"""TrainingSpec v1: the one contract every input is parsed into (see docs/training-spec.md).

The model lives in ``predictors`` because the predictors consume it and ``predictors`` may not import
from ``scheduler``; the job-kind parsers in ``scheduler/spec/`` produce it. Strict: unknown fields are
errors, every problem is reported at once with its path (:func:`parse_training_spec`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from predictors.errors import FieldProblem, SpecError
from predictors.hardware import lookup_gpu
from predictors.units import QuantityError, parse_count, parse_float_count

Task = Literal["causal-lm", "masked-lm", "seq-classification", "token-classification"]
Method = Literal["full", "lora", "qlora"]
Quantization = Literal["nf4", "nf4-dq", "fp4", "int8", "gptq-int4"]
Precision = Literal["32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"]
Optimizer = Literal[
    "adamw", "adamw-8bit", "paged-adamw-8bit", "adamw-4bit", "sgd", "sgd-momentum", "adafactor", "lion"
]
Checkpointing = Literal["none", "full", "selective"]
Attention = Literal["sdpa", "flash", "eager"]
Sharding = Literal["none", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op"]
Offload = Literal["none", "optimizer", "params+optimizer"]
# Extension of v1: the framework whose memory and time behaviour the model assumes where frameworks differ
# (docs/analytic-model.md: what the model assumes about the framework). Unset: the blend the published runs of many
# frameworks fit. "transformers": the Hugging Face stack (Trainer, Accelerate, TRL, axolotl, LLaMA-Factory) with
# PEFT and bitsandbytes >= 0.44, as vramfit calibrate measures it. "torchtune": torchtune's own LoRA modules (adapters
# in the model's dtype, one saved input shared by the adapters that read it) and torchao's NF4 (keeps no input).
# "megatron": Megatron-LM / Megatron-Core (and what trains through it: verl's Megatron workers): under *-mixed a 16-bit
# model with fp32 main parameters in the optimizer and no autocast, gradients in a contiguous buffer that the
# data-parallel reduction runs on (fp32 under bf16 unless fp32_gradients says otherwise), a fused Adam.
Framework = Literal["transformers", "torchtune", "megatron"]
_FRAMEWORK_ALIASES = {"hf": "transformers", "huggingface": "transformers", "hugging-face": "transformers",
                      "megatron-lm": "megatron", "megatron-core": "megatron", "mcore": "megatron"}
# Extension of v1: how the loss is computed over the vocabulary. Unset or "full": the logits of the whole micro-batch
# in the compute dtype, their fp32 upcast and log-softmax. "chunked": the head and the loss run chunk by chunk
# (torchtune's CEWithChunkedOutputLoss, 8 chunks): one chunk is upcast at a time. "fused-linear": the head and the
# loss are one kernel that never holds the whole batch's logits (Liger's FusedLinearCrossEntropy, Apple's Cut
# Cross-Entropy). "16-bit": the loss of the whole micro-batch's logits in the compute dtype, without an fp32 upcast
# (F.cross_entropy of a 16-bit model's logits outside autocast, as hand-written loops over a bf16 model take it).
CrossEntropy = Literal["full", "chunked", "fused-linear", "16-bit"]
SequenceLengths = Literal["fixed", "variable"]
IdleOffload = Literal["policy", "critic", "both"]
_CROSS_ENTROPY_ALIASES = {"standard": "full", "chunked-output": "chunked", "fused": "fused-linear",
                          "liger": "fused-linear", "flce": "fused-linear", "cut": "fused-linear",
                          "cce": "fused-linear", "fused_linear": "fused-linear", "16bit": "16-bit",
                          "bf16": "16-bit", "fp16": "16-bit", "no-upcast": "16-bit", "half": "16-bit"}
# Parameter offload is a feature of the sharded data-parallel engines: DeepSpeed's offload_param needs ZeRO
# stage 3, FSDP's CPUOffload(offload_params=True) an FSDP sharding strategy. Optimizer offload alone also runs
# unsharded (DeepSpeed ZeRO-Offload at stage 1/2, torchao's CPUOffloadOptimizer on one GPU).
PARAM_OFFLOAD_SHARDING = ("zero3", "fsdp", "fsdp-grad-op")
# GaLore's optimizers (galore_torch GaLoreAdamW, GaLoreAdamW8bit, GaLoreAdafactor)
GALORE_OPTIMIZERS = ("adamw", "adamw-8bit", "adafactor")
# the sharding that hybrid sharding (shard_group_size) applies to: FSDP HYBRID_SHARD / _HYBRID_SHARD_ZERO2, torchtitan
# HSDP, DeepSpeed MiCS (a ZeRO-3 feature)
HYBRID_SHARDING = ("zero3", "fsdp", "fsdp-grad-op")
# the sharding a second, coarser parameter shard for backward (secondary_shard_size) applies to: engines that gather
# the parameters again in backward (FSDP SHARD_GRAD_OP keeps them whole from forward to backward)
SECONDARY_SHARDING = ("zero3", "fsdp")
# the ZeRO stages whose optimizer keeps a contiguous gradient buffer of reduce_bucket_size elements
ZERO_BUCKET_SHARDING = ("zero2", "zero3")


def keeps_zero_gradient_buffer(sharding: str | None, offload: str | None) -> bool:
    """Whether DeepSpeed's ZeRO optimizer keeps a contiguous gradient buffer: at stages 2 and 3, and at stage 1 when
    the optimizer is offloaded (stage_1_and_2.py: contiguous_gradients or cpu_offload; the engine turns contiguous
    gradients off at stage 1 otherwise)."""
    return sharding in ZERO_BUCKET_SHARDING or (sharding == "zero1" and offload in ("optimizer", "params+optimizer"))

# torch.optim's fused implementations (fused=True) of the TrainingSpec optimizers
FUSABLE_OPTIMIZERS = ("adamw", "sgd", "sgd-momentum")

ALLOWED: dict[str, tuple[str, ...]] = {
    "task": Task.__args__,  # type: ignore[attr-defined]
    "method": Method.__args__,  # type: ignore[attr-defined]
    "quantization": Quantization.__args__,  # type: ignore[attr-defined]
    "precision": Precision.__args__,  # type: ignore[attr-defined]
    "optimizer": Optimizer.__args__,  # type: ignore[attr-defined]
    "gradient_checkpointing": Checkpointing.__args__,  # type: ignore[attr-defined]
    "attention": Attention.__args__,  # type: ignore[attr-defined]
    "sharding": Sharding.__args__,  # type: ignore[attr-defined]
    "offload": Offload.__args__,  # type: ignore[attr-defined]
    "framework": Framework.__args__,  # type: ignore[attr-defined]
    "cross_entropy": CrossEntropy.__args__,  # type: ignore[attr-defined]
    "sequence_lengths": SequenceLengths.__args__,  # type: ignore[attr-defined]
    "idle_offload": IdleOffload.__args__,  # type: ignore[attr-defined]
}


def _parse_count_value(value: Any, binary_k: bool = False) -> Any:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    try:
        return parse_count(value, "value", binary_k=binary_k)
    except QuantityError as exc:
        raise ValueError(str(exc).replace("value ", "", 1)) from exc


def _element_count_value(value: Any, limit: int, what: str) -> Any:
    """An element count as DeepSpeed configs write one (5e8 as a JSON float, "2e8", "500M"), at most ``limit``."""
    parsed = _parse_count_value(value)
    if isinstance(parsed, int) and parsed > limit:
        raise ValueError(f"must be at most {limit:.0e} {what}; got {value!r}")
    return parsed


def _count(binary_k: bool = False):  # type: ignore[no-untyped-def]
    return BeforeValidator(lambda value: _parse_count_value(value, binary_k))


def _float_count(value: Any) -> Any:
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    try:
        return parse_float_count(value, "value")
    except QuantityError as exc:
        raise ValueError(str(exc).replace("value ", "", 1)) from exc


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


PositiveCount = Annotated[int, _count(), Field(gt=0)]
# 16M tokens: beyond the longest context windows published (10M); a larger value is a typo, and the quadratic
# terms of the model would turn it into meaningless numbers
MAX_SEQ_LEN = 2**24
SeqLen = Annotated[int, _count(binary_k=True), Field(gt=0, le=MAX_SEQ_LEN)]
# Upper bounds that no real job reaches, so that a typo (1e300 tokens, 10^12 GPUs) is an error, not a prediction of
# 10^295 seconds or 10^31 bytes: 10^15 tokens is ~70x the largest published pre-training run (Llama 3, 15T tokens);
# 10^15 parameters as architecture.MAX_PARAMS; a million GPUs is several times the largest clusters built.
MAX_TRAIN_TOKENS = 1e15
MAX_STEPS = 10**9
MAX_GPUS = 10**6
# 10^11 elements: a 200 GB gradient bucket, more memory than any GPU has; a larger reduce_bucket_size is a typo
MAX_ZERO_BUCKET_ELEMENTS = 10**11
# ZeRO-3's live-parameter and reuse-distance limits count parameter elements: 10^15, as MAX_PARAMS_OVERRIDE
MAX_ZERO3_ELEMENTS = 10**15
MAX_MICRO_BATCH = 2**20
MAX_PARAMS_OVERRIDE = 1e15
Tokens = Annotated[float, BeforeValidator(_float_count), Field(ge=1, le=MAX_TRAIN_TOKENS)]  # at least one token
GpuCount = Annotated[int, _count(), Field(gt=0, le=MAX_GPUS)]
StepCount = Annotated[int, _count(), Field(gt=0, le=MAX_STEPS)]


class ModelRef(BaseModel):
    """A model given as a mapping: a catalog name, an inline HF config, or a path to a config.json."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = Field(None, description="Catalog name or Hugging Face id, or a free label")
    config: dict[str, Any] | None = Field(None, description="Hugging Face config.json fields, inline")
    config_path: str | None = Field(None, description="Path to a Hugging Face config.json file")
    params: Annotated[float, BeforeValidator(_float_count), Field(gt=0, le=MAX_PARAMS_OVERRIDE)] | None = Field(
        None, description="Override of the total parameter count"
    )

    @model_validator(mode="after")
    def _needs_something(self) -> ModelRef:
        if self.name is None and self.config is None and self.config_path is None:
            raise ValueError("needs `name`, `config` or `config_path`")
        if self.config is not None and self.config_path is not None:
            raise ValueError("give either `config` or `config_path`, not both")
        return self

    @property
    def label(self) -> str:
        return self.name or str(self.config.get("_name_or_path", "custom")) if self.config else (
            self.name or self.config_path or "custom"
        )


# Module names users give PEFT's ``modules_to_save`` in the families of the catalog, by role.
_SAVED_MODULE_ALIASES = {
    **dict.fromkeys(("embed_tokens", "wte", "embed_in", "word_embeddings", "tok_embeddings", "embeddings",
                     "embedding", "shared", "transformer.wte", "model.embed_tokens"), "embed_tokens"),
    **dict.fromkeys(("lm_head", "output", "embed_out", "output_layer"), "lm_head"),
}


def target_names(value: Any) -> Any:
    """Linear-layer names as written: "all-linear" (or "all"), a comma-separated string, a list as it is, or a list
    in Python's or JSON's brackets, as a python-fire script takes it on its command line (alpaca-lora's
    ``--lora_target_modules '[q_proj,v_proj]'``; split at the comma by a shell-style reader, ``['[q_proj',
    'v_proj]']``)."""
    if isinstance(value, list) and value and all(isinstance(m, str) for m in value) and \
            value[0].lstrip().startswith("[") and value[-1].rstrip().endswith("]"):
        value = ",".join(value)
    if isinstance(value, str):
        text = value.strip()
        if set(text) & set("(){}|*+?\\^$") or "[" in text[1:]:
            return [text]  # a regular expression (PEFT's string form): its commas ("\\d{1,2}") are not separators
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        if text.strip().lower().replace("_", "-") in ("all-linear", "all"):
            return "all-linear"
        return [m.strip().strip("'\"").strip() for m in text.split(",") if m.strip().strip("'\"").strip()]
    return value


class LoraSpec(BaseModel):
    """LoRA adapter settings (for ``lora`` and ``qlora``); immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    rank: Annotated[int, Field(gt=0, le=65536, description="LoRA rank r")] = 8
    alpha: Annotated[float, Field(gt=0, description="LoRA alpha (scaling = alpha / rank)")] = 16
    target_modules: list[str] | Literal["all-linear"] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        description="Llama-style role names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
        "down_proj, lm_head) or 'all-linear'",
    )
    dropout: Annotated[float, Field(ge=0, lt=1, description="LoRA dropout probability")] = 0.05
    # Extension of v1: modules trained in full next to the adapter (PEFT ``modules_to_save``): a trainable copy
    # of the input embedding and/or the output head, with its own gradients and optimizer states.
    modules_to_save: list[Literal["embed_tokens", "lm_head"]] = Field(
        default_factory=list,
        description="modules trained in full beside the adapter (PEFT modules_to_save): embed_tokens, lm_head",
    )

    # Extension of v1: DoRA (PEFT LoraConfig(use_dora=True), torchtune use_dora): a trainable magnitude per output
    # feature of each adapted linear, which rescales the base output and the adapter's, so both are kept for backward.
    use_dora: bool = Field(
        False, description="DoRA (weight-decomposed LoRA): a trainable magnitude vector per adapted linear"
    )

    @model_serializer(mode="wrap")
    def _drop_empty_extension(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # v1 documents have neither extension: leave them out unless set, so v1 specs serialize as before
        data: dict[str, Any] = handler(self)
        if not self.modules_to_save:
            data.pop("modules_to_save", None)
        if not self.use_dora:
            data.pop("use_dora", None)
        return data

    @field_validator("modules_to_save", mode="before")
    @classmethod
    def _saved(cls, value: Any) -> Any:
        if value is None:
            return []
        names = [m.strip() for m in value.split(",") if m.strip()] if isinstance(value, str) else value
        if not isinstance(names, list):
            return names
        out: list[Any] = []
        for name in names:
            role = _SAVED_MODULE_ALIASES.get(str(name).strip().lower(), name) if isinstance(name, str) else name
            if role not in out:
                out.append(role)
        return out

    @field_validator("target_modules", mode="before")
    @classmethod
    def _modules(cls, value: Any) -> Any:
        return target_names(value)

    @field_validator("target_modules")
    @classmethod
    def _nonempty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("must name at least one module, or be 'all-linear'")
        return value


# the adapter settings of a lora/qlora spec that names none (shared: LoraSpec is frozen)
_DEFAULT_LORA = LoraSpec()


class TrainingSpec(BaseModel):
    """One training job, described well enough to predict its peak VRAM per GPU and its runtime."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    api_version: Literal["vramfit/v1"] | None = Field(None, alias="apiVersion", description="Optional")
    kind: Literal["TrainingSpec"] | None = Field(None, description="Optional")
    model: str | ModelRef = Field(..., description="Catalog name / HF id, or a mapping (name/config/...)")
    task: Annotated[Task, BeforeValidator(_lower)] = Field("causal-lm", description="Training objective")
    method: Annotated[Method, BeforeValidator(_lower)] = Field("full", description="full | lora | qlora")
    lora: LoraSpec | None = Field(None, description="LoRA settings for lora/qlora (defaults when omitted)")
    quantization: Annotated[Quantization, BeforeValidator(_lower)] | None = Field(
        None, description="Base-weight quantization for qlora (nf4-dq when omitted)"
    )
    precision: Annotated[Precision, BeforeValidator(_lower)] = Field(
        "bf16-mixed", description="*-mixed keeps fp32 master weights; *-true holds weights in that dtype"
    )
    optimizer: Annotated[Optimizer, BeforeValidator(_lower)] = Field("adamw", description="Optimizer")
    micro_batch_size: Annotated[int, _count(), Field(gt=0, le=MAX_MICRO_BATCH)] = Field(
        1, description="Samples per GPU per forward pass")
    seq_len: SeqLen = Field(2048, description="Tokens per sample as padded/packed ('4k' = 4096)")
    gradient_checkpointing: Annotated[Checkpointing, BeforeValidator(_lower)] = Field(
        "none", description="none | full | selective (true = full, false = none)"
    )
    attention: Annotated[Attention, BeforeValidator(_lower)] = Field("sdpa", description="sdpa|flash|eager")
    gpus: GpuCount | Literal["auto"] = Field(1, description="GPUs for the whole job, or 'auto'")
    sharding: Annotated[Sharding, BeforeValidator(_lower)] | None = Field(
        None, description="none | ddp | zero1 | zero2 | zero3 | fsdp | fsdp-grad-op (ddp when gpus > 1)"
    )
    offload: Annotated[Offload, BeforeValidator(_lower)] = Field("none", description="CPU offload")
    tensor_parallel: GpuCount = Field(1, description="Tensor-parallel size")
    pipeline_parallel: GpuCount = Field(1, description="Pipeline-parallel size")
    context_parallel: GpuCount = Field(1, description="Context-parallel size")
    train_tokens: Tokens | None = Field(None, description="Tokens to train on, for runtime")
    steps: StepCount | None = Field(None, description="Optimizer steps, alternative to train_tokens")
    grad_accum_steps: StepCount = Field(1, description="Micro-batches per optimizer step")
    gpu: str | None = Field(None, description="Pin a GPU type (catalog name); otherwise placement chooses")
    deadline_seconds: Annotated[float, Field(gt=0)] | None = Field(
        None, description="vramfit extension: the job must finish within this many seconds"
    )
    framework: Framework | None = Field(
        None, description="vramfit extension: transformers (HF Trainer/Accelerate/TRL/axolotl/LLaMA-Factory with "
                          "PEFT and bitsandbytes >= 0.44), torchtune, megatron (Megatron-LM / Megatron-Core: a 16-bit "
                          "model with fp32 main parameters, its gradient buffer, a fused Adam), or unset for the blend "
                          "of published runs"
    )
    optimizer_in_backward: bool | None = Field(
        None, description="vramfit extension: the optimizer updates each parameter during backward as soon as its "
                          "gradient is ready and frees it (torchtune optimizer_in_bwd): no step with all gradients"
    )
    activation_offloading: bool | None = Field(
        None, description="vramfit extension: saved activations move to CPU memory after the forward and come back "
                          "layer by layer in backward (torchtune/axolotl enable_activation_offloading)"
    )
    fused_optimizer: bool | None = Field(
        None, description="vramfit extension: AdamW/SGD run as one fused kernel (torch.optim.AdamW(fused=True), HF "
                          "adamw_torch_fused) with no step temporaries"
    )
    torch_compile: bool | None = Field(
        None, description="vramfit extension: the model's blocks (and the loss) run through torch.compile, which fuses "
                          "norms and the gated activation (torchtune compile=True)"
    )
    tf32: bool | None = Field(
        None, description="vramfit extension: fp32 matmuls run as TF32 on the tensor cores (HF --tf32, "
                          "torch.backends.cuda.matmul.allow_tf32, set_float32_matmul_precision('high')); changes the "
                          "runtime of fp32 matmuls only, on GPUs that have TF32 (Ampere and later)"
    )
    cross_entropy: CrossEntropy | None = Field(
        None, description="vramfit extension: full (default: the logits upcast to fp32, as transformers' and "
                          "torchtune's losses do) | chunked (torchtune CEWithChunkedOutputLoss) | fused-linear (Liger "
                          "FusedLinearCrossEntropy, Cut Cross-Entropy) | 16-bit (F.cross_entropy of a 16-bit model's "
                          "logits as they are, outside autocast: a hand-written loop over a *-true model)"
    )
    reference_model: Annotated[bool | Literal["copy"], BeforeValidator(_lower)] | None = Field(
        None, description="vramfit extension: preference training (DPO, KTO) that holds a frozen reference copy of the "
                          "model beside the one it trains (TRL's ref_model; with LoRA/QLoRA the reference is the base "
                          "with the adapter disabled, no copy); copy: a separate frozen copy of the base even with an "
                          "adapter (TRL's kto script, OpenRLHF's reference Actor)"
    )
    trainable_layers: int | None = Field(
        None, description="vramfit extension: with method full, only these transformer blocks train (LLaMA-Factory "
                          "finetuning_type freeze: freeze_trainable_layers): n > 0 the last n blocks, n < 0 the first "
                          "-n. The embeddings, the other blocks and the output head are frozen, held in the compute "
                          "dtype, with no gradients or optimizer states; backward runs from the loss down to the "
                          "lowest trained block only. Unset: every parameter trains"
    )
    galore_rank: PositiveCount | None = Field(
        None, description="vramfit extension: GaLore (full fine-tuning with adamw, adamw-8bit or adafactor): the "
                          "targeted matrices' gradients are projected to this rank and the optimizer keeps the "
                          "projected states and the projector (HF --optim galore_*, LLaMA-Factory use_galore)"
    )
    galore_target_modules: list[str] | Literal["all-linear"] | None = Field(
        None, description="vramfit extension: the linear layers GaLore projects (role names as lora.target_modules); "
                          "unset: every linear layer of the blocks"
    )
    teacher_model: str | ModelRef | None = Field(
        None, description="vramfit extension: knowledge distillation from a frozen teacher (a catalog name, HF id or "
                          "mapping, as `model`) held on the same GPUs in the compute dtype, sharded as the model is, "
                          "running one forward per micro-batch (torchtune's KD recipes, TRL's GKDTrainer)"
    )
    critic_model: str | ModelRef | None = Field(
        None, description="vramfit extension: PPO's value model (critic), trained on the same GPUs as the policy (a "
                          "catalog name, HF id or mapping, as `model`): the named model with a one-output head per "
                          "token in place of its LM head, trained in full with the spec's precision, optimizer, "
                          "sharding and checkpointing (verl's critic worker, colocated with the actor by default; "
                          "OpenRLHF with --colocate_all_models). Its weights and optimizer states stay on the GPUs "
                          "while the policy trains, and the policy's while it trains; the two updates take turns, so "
                          "the peak is the larger of the two phases. Unset: no critic on these GPUs"
    )
    critic_micro_batch_size: PositiveCount | None = Field(
        None, description="vramfit extension: with critic_model, the critic's micro-batch per GPU (verl critic."
                          "ppo_micro_batch_size_per_gpu, OpenRLHF --micro_train_batch_size). Unset: micro_batch_size"
    )
    critic_gradient_checkpointing: Annotated[Checkpointing, BeforeValidator(_lower)] | None = Field(
        None, description="vramfit extension: with critic_model, the critic's activation checkpointing, as "
                          "gradient_checkpointing (verl critic.model.enable_gradient_checkpointing). Unset: "
                          "gradient_checkpointing"
    )
    critic_tensor_parallel: GpuCount | None = Field(
        None, description="vramfit extension: with critic_model, the critic's tensor-parallel size (verl's "
                          "critic.megatron.tensor_model_parallel_size). Unset: tensor_parallel"
    )
    critic_pipeline_parallel: GpuCount | None = Field(
        None, description="vramfit extension: with critic_model, the critic's pipeline-parallel size. Unset: "
                          "pipeline_parallel"
    )
    critic_context_parallel: GpuCount | None = Field(
        None, description="vramfit extension: with critic_model, the critic's context (sequence) parallel size "
                          "(verl's critic.ulysses_sequence_parallel_size). Unset: context_parallel"
    )
    critic_offload: Annotated[Offload, BeforeValidator(_lower)] | None = Field(
        None, description="vramfit extension: with critic_model, the critic's CPU offload while it trains. Unset: "
                          "offload"
    )
    idle_offload: Annotated[IdleOffload, BeforeValidator(_lower)] | None = Field(
        None, description="vramfit extension: with critic_model, the models whose weights and optimizer states move "
                          "to host memory while the other one trains and come back for their own update: policy | "
                          "critic | both (verl's fsdp_config param_offload + optimizer_offload of the actor or the "
                          "critic; OpenRLHF --deepspeed_enable_sleep: both). Unset: both stay on the GPUs"
    )
    shard_group_size: PositiveCount | None = Field(
        None, description="vramfit extension: hybrid sharding (HSDP): the data-parallel ranks one copy of the "
                          "sharded states is split over, replicated across the other ranks (FSDP HYBRID_SHARD: the "
                          "GPUs of a node; torchtitan data_parallel_shard_degree with a replicate degree; DeepSpeed "
                          "MiCS mics_shard_size). Unset: every data-parallel rank"
    )
    secondary_shard_size: PositiveCount | None = Field(
        None, description="vramfit extension: ZeRO-3 / FSDP keep a second copy of the 16-bit parameters sharded over "
                          "this many ranks (a node's GPUs) for backward's all-gathers (DeepSpeed ZeRO++ hpZ "
                          "zero_hpz_partition_size; FSDP2 reshard_after_forward=<int>): 16-bit parameters / this "
                          "size more per GPU, backward's gathers on the node's links. Unset: no second copy"
    )
    checkpoint_trained_blocks_only: bool | None = Field(
        None, description="vramfit extension: with gradient_checkpointing full and trainable_layers, only the blocks "
                          "that train are checkpointed; the frozen blocks backward runs through (above the first -n "
                          "trained ones) keep all their activations (LLaMA-Factory's gradient-checkpointing function "
                          "runs a block without trainable parameters unchecked). Unset or false: every block "
                          "checkpointed"
    )
    checkpoint_every_n_layers: PositiveCount | None = Field(
        None, description="vramfit extension: with gradient_checkpointing full, only every n-th block is "
                          "checkpointed and the others keep all their activations (transformers "
                          "activation_checkpointing_kwargs every_n_layers; 1 or unset: every block). With "
                          "activation_offloading only the checkpointed blocks' inputs go to CPU memory (transformers' "
                          "offload)"
    )

    sequence_lengths: Annotated[SequenceLengths, BeforeValidator(_lower)] | None = Field(
        None, description="vramfit extension: fixed (every micro-batch padded or packed to seq_len) | variable (each "
                          "micro-batch as long as its longest sample, lengths spread below seq_len: a collator that "
                          "pads to the longest, no packing, few samples cut at seq_len). Unset: fixed"
    )
    mean_seq_len: SeqLen | None = Field(
        None, description="vramfit extension: with sequence_lengths variable, the dataset's mean tokens per sample "
                          "(at most seq_len). Unset: half of seq_len"
    )
    logits_tokens: SeqLen | None = Field(
        None, description="vramfit extension: the positions of each sequence whose vocabulary logits the loss needs, "
                          "the last ones (online RL scores its completions only: TRL's GRPO/RLOO logits_to_keep, "
                          "verl's response); more than seq_len reads as seq_len. Unset: every position"
    )
    expandable_segments: bool | None = Field(
        None, description="vramfit extension: PyTorch's caching allocator runs with "
                          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place, so blocks of "
                          "varying sizes do not fragment it)"
    )
    zero_reduce_bucket_elements: Annotated[int, Field(ge=0, le=MAX_ZERO_BUCKET_ELEMENTS)] | Literal["auto"] | None = (
        Field(None, description="vramfit extension: DeepSpeed ZeRO-2/3 reduce_bucket_size, in elements: the "
                                "contiguous gradient buffer the ZeRO optimizer allocates at this size whatever the "
                                "trainable parameter count (ZeRO-1 only with an offloaded optimizer); auto: "
                                "hidden_size^2, as the HF Trainer and accelerate fill \"auto\". Unset: DeepSpeed's "
                                "default 5e8")
    )
    zero_overlap_comm: bool | None = Field(
        None, description="vramfit extension: DeepSpeed overlap_comm; ZeRO-2 then keeps two gradient buffers of "
                          "zero_reduce_bucket_elements (ZeRO-3 keeps one either way). Unset: false, DeepSpeed's "
                          "default at stage 2"
    )
    zero3_max_live_parameters: Annotated[int, Field(ge=0, le=MAX_ZERO3_ELEMENTS)] | None = Field(
        None, description="vramfit extension: DeepSpeed ZeRO-3 stage3_max_live_parameters, in elements: how many "
                          "gathered parameters it may hold before it stops prefetching more (0: no prefetching; what "
                          "it keeps for reuse is zero3_max_reuse_distance's). Unset: DeepSpeed's default 1e9"
    )
    zero3_max_reuse_distance: Annotated[int, Field(ge=0, le=MAX_ZERO3_ELEMENTS)] | None = Field(
        None, description="vramfit extension: DeepSpeed ZeRO-3 stage3_max_reuse_distance, in elements: a gathered "
                          "parameter that is used again within this many parameter elements is kept rather than "
                          "released (0: every parameter is released after its module). Unset: DeepSpeed's default 1e9"
    )
    kbit_prepared: bool | None = Field(
        None, description="vramfit extension, qlora with bitsandbytes: the model went through PEFT's "
                          "prepare_model_for_kbit_training (most hand-written QLoRA scripts call it; TRL's trainers "
                          "did in 0.9-0.2x), which leaves the non-quantized parameters (embeddings, norms, head) in "
                          "fp32, so the residual stream runs in fp32 whatever the precision; false: they stay 16-bit. "
                          "Unset: as the precision says (*-mixed: fp32, *-true: the 16-bit dtype)"
    )
    master_weights: bool | None = Field(
        None, description="vramfit extension, *-mixed without FSDP: the model (and its activations) is 16-bit and the "
                          "optimizer keeps fp32 master copies, with no autocast: DeepSpeed's engine at ZeRO stage 0 "
                          "(its FP16 / BF16 optimizers), apex amp O2; what ZeRO stages 1-3 and framework megatron "
                          "imply. Unset: as the sharding and framework imply (none or ddp: autocast over an fp32 model)"
    )
    sequence_parallel: bool | None = Field(
        None, description="vramfit extension, with tensor_parallel > 1: sequence parallelism splits the activations "
                          "outside the tensor-parallel regions (the norms' inputs, the inputs of the first linears, "
                          "the residual dropout masks) over the tensor-parallel ranks (Megatron --sequence-parallel, "
                          "torchtitan's TP plan); false: every rank keeps them whole (Megatron without the flag; "
                          "Korthikanti et al. 2022). Unset: split"
    )
    training_gpus: GpuCount | None = Field(
        None, description="vramfit extension: how many of the job's GPUs train the model, when the job runs other "
                          "roles on GPUs of their own (OpenRLHF's --actor_num_nodes x --actor_num_gpus_per_node beside "
                          "vLLM engines and reference, reward or critic models placed apart): the data-parallel world "
                          "its sharding, batch and throughput use. The job still holds (and pays for) all its gpus. "
                          "Unset: every GPU of the job trains"
    )
    fp32_gradients: bool | None = Field(
        None, description="vramfit extension: the trainer accumulates and reduces the gradients in fp32 buffers "
                          "whatever the model's dtype, 4 bytes per trained parameter where a 16-bit model's .grad "
                          "takes 2 (Megatron-Core's main_grad buffer: accumulate_allreduce_grads_in_fp32, on by "
                          "default under --bf16; NeMo's grad_sync_dtype fp32; verl's Megatron grad_reduce_in_fp32). "
                          "The buffer is also what the data-parallel reduction runs on: no separate bucket. Unset or "
                          "false: gradients in the dtype the precision and sharding give them"
    )
    colocated_engine_memory_fraction: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        None, description="vramfit extension: the share of every training GPU's memory that an inference engine in the "
                          "same processes holds through the training step: online RL generating with vLLM colocated "
                          "(TRL's vllm_mode colocate, its vllm_gpu_memory_utilization; not with vLLM's sleep mode, "
                          "which frees it while training). Counted exactly on each GPU, outside the learned bound"
    )

    @field_validator("gradient_checkpointing", "critic_gradient_checkpointing", mode="before")
    @classmethod
    def _checkpointing_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return "full" if value else "none"
        return value

    @field_validator("framework", mode="before")
    @classmethod
    def _framework_known(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        name = value.strip().lower()
        if name in ("", "unknown", "any", "auto"):
            return None
        name = _FRAMEWORK_ALIASES.get(name, name)
        if name not in ALLOWED["framework"]:
            raise ValueError(
                f"framework {value!r} has no framework-specific model: only transformers (the Hugging Face stack "
                "vramfit calibrate measures), torchtune and megatron change an assumption. To fix: leave framework "
                "out (the model then assumes what the published runs of many frameworks fit), or use one of those")
        return name

    @field_validator("galore_target_modules", mode="before")
    @classmethod
    def _galore_targets(cls, value: Any) -> Any:
        return target_names(value)

    @field_validator("zero_reduce_bucket_elements", mode="before")
    @classmethod
    def _bucket_elements(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        return _element_count_value(value, MAX_ZERO_BUCKET_ELEMENTS, "elements (a 200 GB buffer)")

    @field_validator("zero3_max_live_parameters", "zero3_max_reuse_distance", mode="before")
    @classmethod
    def _zero3_elements(cls, value: Any) -> Any:
        return _element_count_value(value, MAX_ZERO3_ELEMENTS, "parameter elements")

    @field_validator("cross_entropy", mode="before")
    @classmethod
    def _cross_entropy_alias(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        name = value.strip().lower()
        return _CROSS_ENTROPY_ALIASES.get(name, name)

    @field_validator("offload")
    @classmethod
    def _offload_needs_sharding(cls, value: str, info: ValidationInfo) -> str:
        sharding = info.data.get("sharding")
        if value == "params+optimizer" and sharding not in PARAM_OFFLOAD_SHARDING and "sharding" in info.data:
            raise ValueError(
                f"params+optimizer needs sharding {', '.join(PARAM_OFFLOAD_SHARDING)} (parameter offload is a "
                f"ZeRO stage 3 / FSDP feature; DeepSpeed ignores offload_param below stage 3); got sharding "
                f"{sharding or 'unset'}. To fix: set sharding: zero3 or fsdp, or use offload: optimizer")
        return value

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus_auto(cls, value: Any) -> Any:
        return "auto" if isinstance(value, str) and value.strip().lower() == "auto" else value

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_known(cls, value: Any) -> Any:
        """A catalog GPU, checked here so that every reader (parse, the webhook) refuses an unknown one as the
        predictor would; the name is kept as written (the catalog resolves aliases such as ``H100``)."""
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # `gpu: 4090`
        if isinstance(value, str) and value.strip().lower() in ("", "unknown", "any"):
            return None
        if isinstance(value, str):
            try:
                lookup_gpu(value)
            except SpecError as exc:
                problem = exc.problems[0]
                raise ValueError(f"{problem.message}; {problem.hint}") from None
        return value

    @field_validator("model", "teacher_model", "critic_model", mode="before")
    @classmethod
    def _model_str(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must name a model")
        if isinstance(value, str) and value.strip().startswith("hf://"):  # a Kubeflow storageUri, as in TrainJobs
            return value.strip().removeprefix("hf://")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TrainingSpec:
        if self.steps is not None:
            tokens = (self.steps * self.grad_accum_steps * self.micro_batch_size * self.seq_len
                      * self.data_parallel())
            if tokens > MAX_TRAIN_TOKENS:
                raise ValueError(f"steps {self.steps:,} x grad_accum_steps x micro_batch_size x seq_len x "
                                 f"data-parallel ranks is {tokens:.3g} tokens, beyond {MAX_TRAIN_TOKENS:.0e} (about "
                                 "70x the largest published training run). To fix: check steps, or give train_tokens")
        if self.method == "full" and self.quantization is not None:
            raise ValueError("`quantization` applies to qlora; full fine-tuning of quantized weights "
                             "is not supported. To fix: use method: qlora, or drop quantization")
        if self.method == "lora" and self.quantization is not None:
            raise ValueError("`quantization` is set but method is lora. To fix: use method: qlora")
        if self.kbit_prepared is not None and self.method != "qlora":
            raise ValueError(f"kbit_prepared applies to qlora (PEFT's preparation of a quantized model); method is "
                             f"{self.method}. To fix: drop kbit_prepared")
        if self.method == "full" and self.lora is not None:
            raise ValueError("`lora` settings given but method is full. To fix: set method: lora or qlora")
        if self.optimizer_in_backward:
            # the update needs the whole step's gradient, so nothing may accumulate across micro-batches (torchtune
            # refuses optimizer_in_bwd with gradient accumulation); DeepSpeed runs its own optimizer step
            if self.grad_accum_steps > 1:
                raise ValueError(
                    f"optimizer_in_backward frees each gradient when its parameter is updated, so gradients cannot "
                    f"accumulate over grad_accum_steps {self.grad_accum_steps}. To fix: set grad_accum_steps: 1, or "
                    "drop optimizer_in_backward")
            if self.pipeline_parallel > 1:
                raise ValueError(
                    "optimizer_in_backward cannot run under pipeline_parallel > 1: a pipeline stage accumulates "
                    "gradients over its micro-batches. To fix: drop optimizer_in_backward or pipeline_parallel")
            if self.sharding in ("zero1", "zero2", "zero3"):
                raise ValueError(
                    f"optimizer_in_backward needs sharding none, ddp, fsdp or fsdp-grad-op; DeepSpeed "
                    f"({self.sharding}) runs its own optimizer step after backward. To fix: drop "
                    "optimizer_in_backward")
        if self.fused_optimizer and self.optimizer not in FUSABLE_OPTIMIZERS:
            raise ValueError(
                f"fused_optimizer applies to {', '.join(FUSABLE_OPTIMIZERS)} (PyTorch's fused kernels); optimizer "
                f"{self.optimizer} runs its own kernels. To fix: drop fused_optimizer")
        if (self.checkpoint_every_n_layers or 1) > 1 and self.gradient_checkpointing != "full":
            raise ValueError(
                f"checkpoint_every_n_layers applies to full gradient checkpointing (every n-th block checkpointed, "
                f"the others keeping their activations); gradient_checkpointing is {self.gradient_checkpointing}. "
                "To fix: set gradient_checkpointing: full, or drop checkpoint_every_n_layers")
        if self.checkpoint_trained_blocks_only and self.gradient_checkpointing != "full":
            raise ValueError(
                f"checkpoint_trained_blocks_only applies to full gradient checkpointing; gradient_checkpointing is "
                f"{self.gradient_checkpointing}. To fix: set gradient_checkpointing: full, or drop "
                "checkpoint_trained_blocks_only")
        if self.checkpoint_trained_blocks_only and (self.checkpoint_every_n_layers or 1) > 1:
            raise ValueError(
                "checkpoint_trained_blocks_only with checkpoint_every_n_layers > 1 is not modelled. To fix: drop one "
                "of them")
        if self.mean_seq_len is not None and self.sequence_lengths != "variable":
            raise ValueError(
                f"mean_seq_len applies to variable-length micro-batches; sequence_lengths is "
                f"{self.sequence_lengths or 'unset (fixed)'}. To fix: set sequence_lengths: variable, or drop "
                "mean_seq_len")
        if self.mean_seq_len is not None and self.mean_seq_len > self.seq_len:
            raise ValueError(
                f"mean_seq_len ({self.mean_seq_len}) is more than seq_len ({self.seq_len}), the longest a micro-batch "
                "is padded to. To fix: set seq_len to the longest sample (max_length), mean_seq_len to the average")
        if self.cross_entropy == "16-bit" and (self.precision == "32-true" or (
                self.precision.endswith("mixed") and (self.sharding or "none") in ("none", "ddp")
                and not self.master_weights and self.framework != "megatron")):
            raise ValueError(
                f"cross_entropy 16-bit is a loss over 16-bit logits without autocast; precision {self.precision}"
                + (" computes them in fp32" if self.precision == "32-true" else
                   " runs it under autocast, which computes the cross-entropy in fp32 whatever its input")
                + ". To fix: set precision bf16-true (or 16-true), or drop cross_entropy")
        if self.cross_entropy not in (None, "full") and self.task in ("seq-classification", "token-classification"):
            raise ValueError(
                f"cross_entropy applies to the vocabulary-sized loss of causal-lm and masked-lm; task {self.task} "
                "has a classifier head. To fix: drop cross_entropy")
        if self.master_weights is False and ((self.sharding or "").startswith("zero") or self.framework == "megatron"):
            raise ValueError(
                "master_weights false is autocast over an fp32 model; "
                + (f"sharding {self.sharding}'s ZeRO optimizer" if (self.sharding or "").startswith("zero") else
                   "Megatron's Float16Module") + " always keeps a 16-bit model with fp32 masters. To fix: drop "
                "master_weights")
        if self.master_weights is not None and (not self.precision.endswith("mixed")
                                                or (self.sharding or "").startswith("fsdp")):
            raise ValueError(
                "master_weights says how *-mixed keeps its weights (a 16-bit model with fp32 masters, or autocast "
                f"over an fp32 model); precision is {self.precision}"
                + (f" and sharding {self.sharding}, whose mixed-precision policy decides it"
                   if (self.sharding or "").startswith("fsdp") else "")
                + ". To fix: drop master_weights")
        if self.training_gpus is not None and not isinstance(self.gpus, int):
            raise ValueError(
                "training_gpus is the part of a fixed GPU count that trains; gpus is auto. To fix: give gpus as a "
                "number (every GPU the job holds), or drop training_gpus")
        if self.training_gpus is not None and isinstance(self.gpus, int) and self.training_gpus > self.gpus:
            raise ValueError(
                f"training_gpus ({self.training_gpus}) is more than the job's gpus ({self.gpus}). To fix: set gpus to "
                "every GPU the job holds, training_gpus to those that train the model")
        if isinstance(self.gpus, int):
            model_parallel = self.model_parallel()
            training = self.training_gpus or self.gpus
            if training % model_parallel:
                raise ValueError(
                    f"{'training_gpus' if self.training_gpus else 'gpus'} ({training}) must be a multiple of "
                    f"tensor_parallel x pipeline_parallel x context_parallel ({model_parallel})"
                )
        if self.galore_target_modules is not None and self.galore_rank is None:
            raise ValueError("galore_target_modules is set but galore_rank is not. To fix: set galore_rank (GaLore's "
                             "projection rank, e.g. 128), or drop galore_target_modules")
        if self.trainable_layers is not None:
            if self.trainable_layers == 0:
                raise ValueError("trainable_layers 0 trains nothing. To fix: give the number of blocks that train, the "
                                 "last n (n > 0) or the first n (-n), or drop trainable_layers")
            if self.method != "full":
                raise ValueError(f"trainable_layers freezes blocks of full fine-tuning; method is {self.method}, whose "
                                 "base is frozen already. To fix: set method: full, or drop trainable_layers")
            if self.pipeline_parallel > 1 or self.galore_rank is not None:
                raise ValueError("trainable_layers with " + ("pipeline_parallel > 1" if self.pipeline_parallel > 1
                                                              else "galore_rank") + " is not modelled. To fix: drop "
                                 "one of them")
        if self.galore_rank is not None:
            if self.method != "full":
                raise ValueError(f"galore_rank projects full fine-tuning's gradients; method is {self.method}. To fix: "
                                 "set method: full, or drop galore_rank")
            if self.optimizer not in GALORE_OPTIMIZERS:
                raise ValueError(f"galore_rank applies to {', '.join(GALORE_OPTIMIZERS)} (GaLoreAdamW, "
                                 f"GaLoreAdamW8bit, GaLoreAdafactor); optimizer is {self.optimizer}. To fix: use one "
                                 "of those, or drop galore_rank")
        if self.teacher_model is not None and self.pipeline_parallel > 1:
            raise ValueError(
                "teacher_model with pipeline_parallel > 1 is not modelled: distillation recipes (torchtune KD, TRL "
                "GKD) run the teacher beside a data-parallel student. To fix: drop pipeline_parallel or teacher_model")
        if self.teacher_model is not None and self.task in ("seq-classification", "token-classification"):
            raise ValueError(
                f"teacher_model distils a language model's token distribution; task {self.task} has a classifier "
                "head. To fix: drop teacher_model")
        for name in ("critic_micro_batch_size", "critic_gradient_checkpointing", "critic_tensor_parallel",
                     "critic_pipeline_parallel", "critic_context_parallel", "critic_offload", "idle_offload"):
            if getattr(self, name) is not None and self.critic_model is None:
                raise ValueError(f"{name} is set but critic_model is not. To fix: name the critic's model "
                                 f"(critic_model), or drop {name}")
        if isinstance(self.critic_model, ModelRef) and self.critic_model.params is not None:
            raise ValueError("critic_model.params is not read: the critic is sized from its config. To fix: give the "
                             "critic's config (critic_model: {config: {...}}) or a catalog name")
        if self.critic_model is not None and isinstance(self.gpus, int):
            critic_parallel = ((self.critic_tensor_parallel or self.tensor_parallel)
                               * (self.critic_pipeline_parallel or self.pipeline_parallel)
                               * (self.critic_context_parallel or self.context_parallel))
            training = self.training_gpus or self.gpus
            if training % critic_parallel:
                raise ValueError(
                    f"{'training_gpus' if self.training_gpus else 'gpus'} ({training}) must be a multiple of the "
                    f"critic's tensor x pipeline x context parallel ({critic_parallel}). To fix: set "
                    "critic_tensor_parallel / critic_pipeline_parallel / "
                    "critic_context_parallel to sizes that divide the GPUs")
        if self.critic_model is not None and self.task != "causal-lm":
            raise ValueError(
                f"critic_model is PPO's value model beside a language-model policy; task is {self.task}. To fix: "
                "set task: causal-lm, or drop critic_model")
        if self.shard_group_size is not None:
            if self.sharding not in HYBRID_SHARDING:
                raise ValueError(
                    f"shard_group_size {self.shard_group_size} splits the states of sharding "
                    f"{', '.join(HYBRID_SHARDING)} over groups of ranks; sharding is {self.sharding or 'unset'}. "
                    "To fix: set sharding: fsdp (or zero3, fsdp-grad-op), or drop shard_group_size")
            dp = self.data_parallel()
            if isinstance(self.gpus, int) and dp % self.shard_group_size:
                raise ValueError(
                    f"shard_group_size {self.shard_group_size} must divide the {dp} data-parallel ranks (gpus "
                    f"{self.gpus} / tensor x pipeline x context parallel {self.model_parallel()}): each group holds "
                    f"one whole copy of the states. To fix: use a divisor of {dp}, or drop shard_group_size")
        for name in ("zero_reduce_bucket_elements", "zero_overlap_comm"):
            if getattr(self, name) is not None and not self.keeps_zero_gradient_buffer():
                raise ValueError(
                    f"{name} sizes the contiguous gradient buffer of DeepSpeed ZeRO stage 2 or 3 (or stage 1 with "
                    f"an offloaded optimizer); sharding is {self.sharding or 'unset'}"
                    + (" without offload (DeepSpeed turns contiguous_gradients off at stage 1 then)"
                       if self.sharding == "zero1" else "")
                    + f". To fix: set sharding: zero2 or zero3, or drop {name}")
        for name in ("zero3_max_live_parameters", "zero3_max_reuse_distance"):
            if getattr(self, name) is not None and self.sharding != "zero3":
                raise ValueError(
                    f"{name} limits the parameters DeepSpeed ZeRO-3 keeps gathered; sharding is "
                    f"{self.sharding or 'unset'}. To fix: set sharding: zero3, or drop {name}")
        if self.secondary_shard_size is not None:
            if self.sharding not in SECONDARY_SHARDING:
                raise ValueError(
                    f"secondary_shard_size {self.secondary_shard_size} is a second copy of the parameters that "
                    f"sharding {', '.join(SECONDARY_SHARDING)} gathers from in backward (ZeRO++ hpZ); sharding is "
                    f"{self.sharding or 'unset'}. To fix: set sharding: zero3 (or fsdp), or drop secondary_shard_size")
            if self.secondary_shard_size == 1:
                raise ValueError(
                    "secondary_shard_size 1 is DeepSpeed's default zero_hpz_partition_size, which turns hpZ off. To "
                    "fix: drop secondary_shard_size, or give the GPUs per node (e.g. 8)")
            group = self.shard_group()
            # a size above the data-parallel ranks is read as all of them (one secondary group)
            if isinstance(self.gpus, int) and group % min(self.secondary_shard_size, group):
                raise ValueError(
                    f"secondary_shard_size {self.secondary_shard_size} must divide the {group} data-parallel ranks "
                    f"that share the states (gpus {self.gpus}"
                    + (f", shard_group_size {self.shard_group_size}" if self.shard_group_size else "")
                    + f"): DeepSpeed builds its hpZ groups from consecutive ranks. To fix: use a divisor of {group}, "
                    "or drop secondary_shard_size")
        return self

    # --- resolved views (defaults that depend on other fields) ---------------------------------
    @property
    def model_name(self) -> str:
        if isinstance(self.model, str):
            return self.model
        return self.model.name or self.model.config_path or "custom"

    @property
    def resolved_lora(self) -> LoraSpec | None:
        if self.method == "full":
            return None
        return self.lora or _DEFAULT_LORA

    @property
    def resolved_quantization(self) -> str | None:
        if self.method != "qlora":
            return None
        return self.quantization or "nf4-dq"

    def resolved_fp32_gradients(self) -> bool:
        """Whether the gradients accumulate in fp32 buffers: ``fp32_gradients`` when set, else Megatron's default
        (accumulate_allreduce_grads_in_fp32 on under bf16, megatron/training/arguments.py)."""
        if self.fp32_gradients is not None:
            return self.fp32_gradients
        return self.framework == "megatron" and self.precision == "bf16-mixed"

    def resolved_fused_optimizer(self) -> bool:
        """Whether the optimizer steps as one fused kernel: ``fused_optimizer`` when set, else Megatron's Adam and
        SGD (Transformer Engine's or apex's fused kernels, megatron/core/optimizer/__init__.py)."""
        if self.fused_optimizer is not None:
            return self.fused_optimizer
        return self.framework == "megatron" and self.optimizer in FUSABLE_OPTIMIZERS

    def training_gpu_count(self, gpus: int | None = None) -> int:
        """GPUs that train the model: ``training_gpus`` when the job runs other roles on GPUs of their own, else
        ``gpus`` (the job's count, for ``gpus: auto`` the count being tried), else the spec's, else 1."""
        if self.training_gpus is not None:
            return self.training_gpus
        return gpus if gpus is not None else (self.gpus if isinstance(self.gpus, int) else 1)

    def resolved_sharding(self, gpus: int | None = None) -> str:
        n = self.training_gpu_count(gpus)
        if self.sharding is not None:
            return self.sharding
        return "ddp" if n > 1 else "none"

    def model_parallel(self) -> int:
        """GPUs one model replica spans: tensor x pipeline x context parallel."""
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel

    def data_parallel(self, gpus: int | None = None) -> int:
        n = self.training_gpu_count(gpus)
        return max(1, n // self.model_parallel())

    def shard_group(self, gpus: int | None = None) -> int:
        """Data-parallel ranks that share one copy of the sharded states: ``shard_group_size`` (hybrid sharding),
        at most the data-parallel size; every data-parallel rank when unset."""
        dp = self.data_parallel(gpus)
        return min(self.shard_group_size, dp) if self.shard_group_size else dp

    def keeps_zero_gradient_buffer(self) -> bool:
        """Whether the ZeRO optimizer keeps a contiguous gradient buffer (:func:`keeps_zero_gradient_buffer`)."""
        return keeps_zero_gradient_buffer(self.sharding, self.offload)

    def with_gpus(self, gpus: int) -> TrainingSpec:
        return self.model_copy(update={"gpus": gpus})

    def critic_spec(self) -> TrainingSpec | None:
        """The critic's own training step (``critic_model``): its model with a per-token value head (task
        token-classification, as verl loads it: AutoModelForTokenClassification with one label), trained in full on
        the policy's GPUs, sequences, precision, optimizer, sharding and checkpointing, at ``critic_micro_batch_size``;
        None without a critic."""
        if self.critic_model is None:
            return None
        kept = self.model_dump(exclude_none=True, exclude=_POLICY_ONLY_FIELDS)
        kept.update(model=self.critic_model, task="token-classification", method="full",
                    micro_batch_size=self.critic_micro_batch_size or self.micro_batch_size,
                    gradient_checkpointing=self.critic_gradient_checkpointing or self.gradient_checkpointing,
                    tensor_parallel=self.critic_tensor_parallel or self.tensor_parallel,
                    pipeline_parallel=self.critic_pipeline_parallel or self.pipeline_parallel,
                    context_parallel=self.critic_context_parallel or self.context_parallel,
                    offload=self.critic_offload or self.offload)
        try:
            return TrainingSpec.model_validate(kept)
        except ValidationError as exc:  # the policy's settings that the critic's own step cannot take
            first = exc.errors()[0]
            raise SpecError.one("critic_model", f"the critic's training step is not valid: {first.get('msg', exc)}",
                                "set the critic's own settings (critic_micro_batch_size, critic_tensor_parallel, "
                                "...) or drop critic_model") from None


# what belongs to the policy alone, not to the critic trained beside it (TrainingSpec.critic_spec): its adapter and
# quantization, the models around it, its loss over the vocabulary, and the job's length and deadline
_POLICY_ONLY_FIELDS = frozenset({
    "model", "task", "method", "lora", "quantization", "kbit_prepared", "reference_model", "teacher_model",
    "critic_model", "critic_micro_batch_size", "critic_gradient_checkpointing", "critic_tensor_parallel",
    "critic_pipeline_parallel", "critic_context_parallel", "critic_offload", "idle_offload",
    "checkpoint_every_n_layers",
    "checkpoint_trained_blocks_only", "trainable_layers", "galore_rank", "galore_target_modules",
    "cross_entropy", "logits_tokens", "colocated_engine_memory_fraction", "train_tokens", "steps",
    "deadline_seconds",
})


def _path(loc: tuple[Any, ...], prefix: str) -> str:
    parts: list[str] = [prefix] if prefix else []
    for item in loc:
        if isinstance(item, int):
            if parts:
                parts[-1] += f"[{item}]"
            else:
                parts.append(f"[{item}]")
        elif item in ("str", "ModelRef", "int", "function-after[_needs_something(), ModelRef]") or str(
            item
        ).startswith(("function-", "literal[", "constrained-")):
            continue
        else:
            parts.append(str(item))
    return ".".join(parts)


# fields whose bounds are a fraction's (0 < x < 1), not a count's
_FRACTION_FIELDS = frozenset({"colocated_engine_memory_fraction"})
_HINTS: dict[str, str] = {
    "colocated_engine_memory_fraction": "give the engine's share of a GPU's memory between 0 and 1 (vLLM's "
                                        "gpu_memory_utilization, e.g. 0.3), or null when no engine shares the GPUs",
    "micro_batch_size": "use a positive integer such as 1, 4 or '8'",
    "seq_len": "use a positive token count such as 2048 or '4k'",
    "gpus": "use a positive integer or 'auto'",
    "zero_reduce_bucket_elements": "use DeepSpeed's reduce_bucket_size in elements (5e8, '2e8') or 'auto' "
                                   "(hidden_size^2)",
    "zero3_max_live_parameters": "use DeepSpeed's stage3_max_live_parameters in elements (1e9, '0')",
    "zero3_max_reuse_distance": "use DeepSpeed's stage3_max_reuse_distance in elements (1e9, '0')",
    "model": "use a catalog name (run `vramfit models`), a Hugging Face id, or {config: {...}}",
}


def _problem(err: Any, prefix: str) -> FieldProblem:
    loc = tuple(err.get("loc", ()))
    field_name = next((str(x) for x in loc if isinstance(x, str)), "")
    got = err.get("input")
    typ = err.get("type", "")
    msg = err.get("msg", "is invalid")
    if typ == "extra_forbidden":
        names = [f.alias or name for name, f in TrainingSpec.model_fields.items()]
        allowed = ", ".join(sorted(names)) if len(loc) == 1 else ""
        hint = f"remove it; known fields: {allowed}" if allowed else "remove it"
        return FieldProblem(_path(loc, prefix), "is not a known field", hint)
    if typ == "literal_error" and field_name in ALLOWED:
        return FieldProblem(
            _path(loc, prefix), f"must be one of {', '.join(ALLOWED[field_name])}; got {got!r}",
            "pick one of the listed values",
        )
    if typ == "missing":
        return FieldProblem(_path(loc, prefix), "is required", _HINTS.get(field_name, ""))
    if typ in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        fractional = field_name in _FRACTION_FIELDS  # an integer 0 there is a fraction out of range, not a count
        kind = "a positive integer" if typ == "greater_than" and isinstance(got, int) and not fractional else "in range"
        text = msg.replace("Input should be", "must be")
        if kind == "a positive integer":
            text = "must be a positive integer"
        return FieldProblem(_path(loc, prefix), f"{text}; got {got!r}", _HINTS.get(field_name, ""))
    msg = msg.replace("Value error, ", "").replace("Input should be", "must be")
    if typ == "model_type" and field_name == "model":  # pydantic names the class: "instance of ModelRef"
        msg = "must be a model name (a string) or a mapping with name, config, config_path or params"
    shown = f"; got {got!r}" if not isinstance(got, dict | list) and got is not None and "got" not in msg else ""
    return FieldProblem(_path(loc, prefix), f"{msg}{shown}", _HINTS.get(field_name, ""))


def problems_from_validation(exc: ValidationError, prefix: str = "spec") -> list[FieldProblem]:
    """Turn pydantic's errors into our one message shape, merging the union-branch duplicates."""
    seen: dict[str, FieldProblem] = {}
    literal_branch: set[str] = set()  # keys of problems from a union's literal branch (`gpus: count | 'auto'`)
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        # `model` is a union (str | ModelRef): report the mapping branch only when a mapping was given.
        if loc and loc[0] == "model" and len(loc) > 1 and loc[1] == "str":
            continue
        problem = _problem(err, prefix)
        key = problem.path + problem.message
        seen.setdefault(key, problem)
        if any(str(item).startswith("literal[") for item in loc[1:]):
            literal_branch.add(key)
    # A union with a literal (`gpus: 0`) fails in both branches; the literal's "must be 'auto'" repeats what
    # the hint already says, so it is kept only where it is the field's only problem.
    other_paths = {p.path for k, p in seen.items() if k not in literal_branch}
    return [p for k, p in seen.items() if k not in literal_branch or p.path not in other_paths]


def parse_training_spec(data: Any, source: str = "", prefix: str = "spec") -> TrainingSpec:
    """Validate a mapping as a TrainingSpec, raising :class:`SpecError` with every problem at once."""
    if not isinstance(data, dict):
        raise SpecError.one(prefix, f"must be a mapping of TrainingSpec fields; got {type(data).__name__}",
                            "write `model: ...` and the other fields as YAML keys", source)
    try:
        return TrainingSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from_validation(exc, prefix), source=source) from None


def spec_to_dict(spec: TrainingSpec) -> dict[str, Any]:
    """The contract's JSON form (field names as documented, None values dropped)."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)
