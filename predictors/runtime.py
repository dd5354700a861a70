"""Analytic runtime model: training FLOPs per token over the achieved throughput of a GPU type.

Pure: takes a :class:`~predictors.spec.TrainingSpec`, its :class:`~predictors.architecture.Architecture`
and a :class:`~predictors.hardware.GpuSpec`, returns a :class:`RuntimePrediction` with the time of one
optimizer step split into components (compute, memory-bound floor, dequantization, pipeline bubble,
communication, offload, optimizer step).

FLOPs per token (2 per multiply-accumulate; the convention of the MFU figures in ``efficiency.yaml``,
mosaicml/llm-foundry benchmarking README):

* linear layers: forward ``2 * in * out`` per layer (routed MoE experts weighted by top-k / experts);
  backward ``2x`` forward when the weight is trained (input and weight gradients), ``1x`` when it is
  frozen (LoRA/QLoRA still propagate through it but skip its weight gradient); LoRA adapters add
  ``6 * r * (in + out)`` (on a routed expert also weighted by top-k / experts). An encoder-only model on a
  language-model task adds its ``h x vocab`` prediction head.
* attention scores and values: ``4 * seq_len * heads * head_dim`` per layer forward (grows with
  seq_len^2 per sequence), backward ``2x``.
* encoder-decoder models: FLOPs per encoder token (``seq_len``); decoder blocks and the LM head run on the
  decoder's tokens (:func:`predictors.vram.decoder_tokens`), cross-attention projects k and v from every
  encoder token and attends from every decoder token over the encoder tokens.
* recomputation: ``full`` adds one forward of everything; ``selective`` adds the attention forward
  (Korthikanti et al. 2022 recompute the attention core only).

Time of one micro-batch on one GPU = max(FLOPs / (peak x efficiency), weight bytes / bandwidth)
+ QLoRA dequantization + the elementwise passes of fp32 LoRA adapters + eager attention's score traffic; a
step is ``n_micro`` micro-batches, at least the host's time to walk every block per pass (eager PyTorch:
``host_seconds_per_layer_pass`` in ``efficiency.yaml``, measured by ``vramfit calibrate``, plus the Python paths of
each LoRA adapter and bitsandbytes 4-bit layer in the block), plus the pipeline
bubble, the optimizer update, the part of data-parallel/FSDP communication that compute does not hide,
tensor-parallel all-reduces, the part of context parallelism's ring K/V transfers that the attention does not hide,
and CPU offload transfers and the CPU optimizer step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field

from predictors.architecture import (
    ATTENTION_ROLES,
    CLASSIFICATION_TASKS,
    FUSED_MODULES,
    Architecture,
    LinearGroup,
    saved_module_params,
)
from predictors.hardware import GpuSpec
from predictors.spec import TrainingSpec
from predictors.vram import decoder_tokens, offloaded_activation_bytes, trained_blocks


class FamilyEfficiency(BaseModel):
    model_config = ConfigDict(extra="forbid")

    family: str = Field(..., description="GPU family as in gpus.yaml")
    hardware_flops_utilization: float = Field(..., gt=0, le=1, description="Achieved fraction of 16-bit peak")
    sources: list[str] = Field(..., min_length=1, description="Public figures the value comes from")


class EfficiencyTable(BaseModel):
    """``predictors/data/efficiency.yaml``: sourced efficiency figures and stated assumptions."""

    model_config = ConfigDict(extra="forbid")

    half_efficiency_hidden_size: float = Field(..., gt=0)
    half_efficiency_sources: list[str] = Field(..., min_length=1)
    families: list[FamilyEfficiency]
    fp32_flops_utilization: float = Field(..., gt=0, le=1)
    fp32_sources: list[str] = Field(..., min_length=1)
    memory_bandwidth_utilization: float = Field(..., gt=0, le=1)
    memory_bandwidth_sources: list[str] = Field(..., min_length=1)
    dequantization_bandwidth_utilization: float = Field(..., gt=0, le=1)
    dequantization_sources: list[str] = Field(..., min_length=1)
    collective_bandwidth_utilization: float = Field(..., gt=0, le=1)
    collective_sources: list[str] = Field(..., min_length=1)
    communication_overlap: float = Field(..., ge=0, le=1)
    communication_overlap_sources: list[str] = Field(..., min_length=1)
    host_memory_bytes_per_second_per_gpu: float = Field(..., gt=0)
    host_memory_sources: list[str] = Field(..., min_length=1)
    inter_node_bytes_per_second_per_gpu: float = Field(..., gt=0)
    inter_node_sources: list[str] = Field(..., min_length=1)
    host_seconds_per_layer_pass: float = Field(..., ge=0)
    host_seconds_per_adapter_pass: float = Field(0.0, ge=0)
    host_seconds_per_quantized_linear_pass: float = Field(0.0, ge=0)
    host_sources: list[str] = Field(..., min_length=1)
    eager_elementwise_bytes_per_hidden: float = Field(0.0, ge=0)
    eager_elementwise_bytes_per_mlp_width: float = Field(0.0, ge=0)
    eager_elementwise_sources: list[str] = Field(default_factory=list)

    def family_hfu(self, family: str) -> float:
        for row in self.families:
            if row.family == family:
                return row.hardware_flops_utilization
        return min(row.hardware_flops_utilization for row in self.families)


@cache
def efficiency_table() -> EfficiencyTable:
    text = (resources.files("predictors") / "data" / "efficiency.yaml").read_text(encoding="utf-8")
    return EfficiencyTable.model_validate(yaml.safe_load(text))


@dataclass(frozen=True)
class Interconnect:
    """How the job's GPUs talk: inside a node (None: NVLink if the GPU has it, else PCIe) and between nodes."""

    gpus_per_node: int = 8
    intra_node_bytes_per_second: float | None = None
    inter_node_bytes_per_second: float | None = None


@dataclass(frozen=True)
class FlopsPerToken:
    forward: float
    backward: float
    recompute: float

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


@dataclass(frozen=True)
class RuntimePrediction:
    """Throughput of the whole job and the time of one optimizer step, component by component."""

    tokens_per_second: float
    step_time_seconds: float
    tokens_per_step: float
    runtime_seconds: float | None
    flops_per_token: float
    matmul_efficiency: float
    components_seconds: dict[str, float]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def step_breakdown(self) -> tuple[dict[str, float], dict[str, float]]:
        """``(parts, overlapped)``: the parts of one optimizer step that add up to ``step_time_seconds`` (the
        larger of the compute and the weights' memory traffic, the passes added to it, the host's wait, the bubble,
        the optimizer update, the communication compute does not hide, ...), and what runs under them without
        adding time (the smaller of compute and memory traffic, the data-parallel communication and offload
        transfers compute hides). Zero parts are left out."""
        c = self.components_seconds
        bound, under = ("compute", "memory_floor") if c["compute"] >= c["memory_floor"] else ("memory_floor", "compute")
        additive = (bound, "dequantization", "lora_elementwise", "dora_base_recompute", "eager_elementwise",
                    "eager_attention_scores", "reference_forward", "teacher_forward", "host_wait",
                    "pipeline_bubble", "optimizer_step", "communication_exposed", "tensor_parallel_communication",
                    "context_parallel_exposed", "cpu_optimizer_step", "critic_update")
        parts = {name: c[name] for name in additive if c.get(name, 0.0) > 0}
        hidden = c.get("data_parallel_communication", 0.0) + c.get("offload_transfer", 0.0) \
            + c.get("activation_offload_transfer", 0.0) - c.get("communication_exposed", 0.0)
        overlapped = {under: c[under]} if c[under] > 0 else {}
        if hidden > 1e-12:
            overlapped["communication_hidden"] = hidden
        if c.get("context_parallel_hidden", 0.0) > 0:
            overlapped["context_parallel_hidden"] = c["context_parallel_hidden"]
        return parts, overlapped

    def to_dict(self) -> dict[str, object]:
        return {
            "throughput_tokens_per_second": self.tokens_per_second,
            "step_time_seconds": self.step_time_seconds,
            "tokens_per_step": self.tokens_per_step,
            "runtime_seconds": self.runtime_seconds,
            "flops_per_token": self.flops_per_token,
            "matmul_efficiency": self.matmul_efficiency,
            "components_seconds": dict(self.components_seconds),
            "notes": list(self.notes),
        }


def _linear_forward_flops(arch: Architecture) -> float:
    """Forward FLOPs per token of every linear layer (MoE: the routed top-k experts only), memoised per
    architecture object: placement predicts one spec on many GPUs. Encoder-decoder models: see
    :func:`_encoder_decoder_linear_flops`."""
    hit = _LINEAR_FLOPS.get(id(arch))
    if hit is not None and hit[0] is arch:
        return hit[1]
    total = sum(2.0 * g.in_features * g.out_features * _rows_per_token(arch, g, 1.0) for g in arch.linears)
    if len(_LINEAR_FLOPS) > 1024:
        _LINEAR_FLOPS.clear()
    _LINEAR_FLOPS[id(arch)] = (arch, total)
    return total


_LINEAR_FLOPS: dict[int, tuple[Architecture, float]] = {}

# Projections of a cross-attention block that run on the decoder's tokens; its k and v project the encoder output
# (HF T5LayerCrossAttention: q from the decoder hidden states, k/v from encoder_hidden_states).
_DECODER_SIDE_ROLES = ("q_proj", "o_proj")


def _rows_per_token(arch: Architecture, group: LinearGroup, decoder_ratio: float) -> float:
    """How many input rows the ``count`` layers of ``group`` multiply per token of the spec's ``seq_len``.

    Routed MoE experts: each token goes through ``num_experts_per_tok`` of ``num_experts`` (Mixtral/Qwen-MoE
    sparse blocks gather each expert's tokens), so an expert group sees ``top_k / experts`` of the tokens; the
    router and shared experts see all of them. Encoder-decoder models (``decoder_ratio`` = decoder tokens per
    encoder token): encoder blocks run on the encoder tokens, decoder blocks and the LM head on the decoder
    tokens, and each decoder block's cross-attention projects k and v from every encoder token.
    """
    if group.expert and arch.num_experts:
        return group.count * arch.num_experts_per_tok / arch.num_experts
    if not arch.is_encoder_decoder or decoder_ratio == 1.0:
        return float(group.count)
    enc, dec = arch.num_encoder_layers, arch.num_layers
    role = FUSED_MODULES.get(group.role, (group.role,))[0]
    if role in ("lm_head", "classifier"):
        return group.count * decoder_ratio
    if role in ATTENTION_ROLES:  # one group per role over enc self + dec self + dec cross blocks
        cross = decoder_ratio if role in _DECODER_SIDE_ROLES else 1.0
        per_block = group.count / (enc + 2 * dec)
        return per_block * (enc + dec * decoder_ratio + dec * cross)
    per_block = group.count / (enc + dec)  # MLP: one per encoder and per decoder block
    return per_block * (enc + dec * decoder_ratio)


def _decoder_ratio(spec: TrainingSpec, arch: Architecture) -> float:
    """Decoder tokens per encoder token of an encoder-decoder model (the spec's seq_len is the encoder input;
    the decoder length is the one the VRAM model assumes, :func:`predictors.vram.decoder_tokens`); 1 otherwise."""
    return decoder_tokens(spec) / spec.seq_len if arch.is_encoder_decoder else 1.0


def _masked_lm_head_flops(spec: TrainingSpec, arch: Architecture) -> float:
    """Forward FLOPs per token of the vocabulary head an encoder-only model trains with on a language-model task.

    The architecture of an encoder-only model (BERT, RoBERTa) carries the base model's pooler but no vocabulary
    head. ``BertForMaskedLM`` drops the pooler and adds ``cls.predictions``: an ``h x h`` transform and an
    ``h x vocab`` decoder (tied to the word embeddings) applied to every position's hidden state (transformers
    ``modeling_bert.BertLMPredictionHead``; RoBERTa's ``RobertaLMHead`` is the same shape). The transform costs
    what the pooler did, so the head adds the decoder: ``2 x h x vocab``. Classification tasks keep the pooler
    and a ``h x labels`` classifier (negligible)."""
    if not arch.is_encoder_only or arch.lm_head is not None or spec.task in CLASSIFICATION_TASKS:
        return 0.0
    return 2.0 * arch.hidden_size * arch.vocab_size


def _attention_forward_flops(arch: Architecture, seq_len: int, decoder_ratio: float = 1.0) -> float:
    """Forward FLOPs per token of attention scores and values: ``2 x keys x (qk + v widths)`` per query token
    and layer. Encoder-decoder: encoder self-attention over the encoder tokens, decoder self-attention over the
    decoder tokens, and cross-attention of every decoder token over the encoder tokens."""
    qk_width = arch.num_attention_heads * arch.head_dim
    v_width = arch.num_attention_heads * (arch.v_head_dim or arch.head_dim)
    per_key = 2.0 * (qk_width + v_width)
    if not arch.is_encoder_decoder:
        return per_key * seq_len * (arch.num_layers + arch.num_encoder_layers)
    decoder_len = seq_len * decoder_ratio
    per_input_token = (arch.num_encoder_layers * seq_len
                       + arch.num_layers * decoder_ratio * (decoder_len + seq_len))
    return per_key * per_input_token


def recomputed_fraction(spec: TrainingSpec, arch: Architecture) -> float:
    """Share of the blocks whose forward runs again in backward: all of them under full gradient checkpointing,
    ``ceil(blocks / n) / blocks`` when only every n-th block is checkpointed (``checkpoint_every_n_layers``), none
    otherwise (selective checkpointing recomputes the attention core only: :func:`flops_per_token`); under
    ``checkpoint_trained_blocks_only`` the trained share of the blocks backward runs through."""
    if spec.gradient_checkpointing != "full":
        return 0.0
    if spec.checkpoint_trained_blocks_only and spec.trainable_layers is not None:
        # of the blocks backward runs through, only the trained ones are checkpointed (flops_per_token and the
        # weight passes scale this by the blocks backward runs through)
        trained, through = trained_blocks(spec, arch)
        return trained / max(through, 1)
    every = spec.checkpoint_every_n_layers or 1
    blocks = arch.num_layers + arch.num_encoder_layers
    if every == 1 or blocks <= 0:
        return 1.0
    return math.ceil(blocks / every) / blocks


def flops_per_token(spec: TrainingSpec, arch: Architecture) -> FlopsPerToken:
    """Training FLOPs per token (forward, backward, recomputation) for the whole model."""
    ratio = _decoder_ratio(spec, arch)
    if ratio == 1.0:
        linear = _linear_forward_flops(arch)
    else:
        linear = sum(2.0 * g.in_features * g.out_features * _rows_per_token(arch, g, ratio) for g in arch.linears)
    linear += _masked_lm_head_flops(spec, arch)
    attention = _attention_forward_flops(arch, spec.seq_len, ratio)
    lora = spec.resolved_lora
    adapter = 0.0
    if lora is not None:
        # a routed expert's adapter only sees the tokens routed to that expert
        adapter = sum(2.0 * lora.rank * (g.in_features + g.out_features) * _rows_per_token(arch, g, ratio)
                      for g in arch.lora_groups(lora.target_modules))
        backward = linear + 2.0 * adapter + 2.0 * attention  # frozen weights: input gradients only
        if "lm_head" in lora.modules_to_save:  # a trained copy of the head also needs its weight gradient
            head = arch.lm_head
            head_rows = _rows_per_token(arch, head, ratio) if head is not None else 1.0
            backward += 2.0 * arch.vocab_size * arch.hidden_size * head_rows
    elif spec.trainable_layers is not None:
        # freeze tuning: the trained blocks need input and weight gradients, the frozen blocks above the lowest
        # trained one input gradients only, the blocks below nothing; the frozen head its input's gradient
        trained, through = trained_blocks(spec, arch)
        share = 1.0 / max(arch.num_layers, 1)
        head = sum(2.0 * g.in_features * g.out_features * _rows_per_token(arch, g, ratio)
                   for g in arch.linears if g.role == "lm_head") + _masked_lm_head_flops(spec, arch)
        backward = ((2.0 * trained + (through - trained)) * share * (linear - head) + 2.0 * attention * through * share
                    + head)
    else:
        backward = 2.0 * linear + 2.0 * attention
    forward = linear + adapter + attention
    if spec.gradient_checkpointing == "full" and spec.trainable_layers is not None:
        # only the blocks backward runs through are recomputed
        recompute = (linear + attention) * trained_blocks(spec, arch)[1] / max(arch.num_layers, 1) * (
            recomputed_fraction(spec, arch))
    elif spec.gradient_checkpointing == "full":
        recompute = forward * recomputed_fraction(spec, arch)
    elif spec.gradient_checkpointing == "selective":
        recompute = attention
    else:
        recompute = 0.0
    return FlopsPerToken(forward=forward, backward=backward, recompute=recompute)


def matmul_efficiency(spec: TrainingSpec, arch: Architecture, gpu: GpuSpec) -> float:
    table = efficiency_table()
    if spec.precision.startswith("32") and not gpu.runs_tf32(spec.tf32):
        # CUDA-core GEMMs saturate at much smaller shapes than tensor-core ones: no width factor. TF32 GEMMs run on
        # the tensor cores, with the 16-bit ones' utilization of their (half as high) peak below
        return table.fp32_flops_utilization
    return _tensor_core_efficiency(arch, gpu)


def _tensor_core_efficiency(arch: Architecture, gpu: GpuSpec) -> float:
    table = efficiency_table()
    h = arch.hidden_size
    return table.family_hfu(gpu.family) * h / (h + table.half_efficiency_hidden_size)


def _link_bytes_per_second(gpu: GpuSpec, gpus: int, link: Interconnect, table: EfficiencyTable,
                           stride: int | None = 1) -> float:
    """Bus bandwidth per GPU of a collective over ``gpus`` consecutive GPUs whose members are ``stride`` apart (a
    data-parallel group's are the tensor-parallel size apart); ``stride=None``: point-to-point sends between
    neighbours (ring attention's K/V blocks), which cross a node boundary over one GPU's NIC.

    Inside a node: NVLink (else PCIe). Across nodes NCCL's collectives spread their channels over the node's NICs,
    so a ring collective moves data at the NICs of the group's members in a node together, up to the NVLink
    bandwidth, when each GPU has its own NIC (DGX A100/H100: 8 NICs for 8 GPUs). NCCL's maintainers say so in
    NVIDIA/nccl#412 (adding NICs on the GPUs' PCI switches raises the bus bandwidth up to NVLink's) and
    NVIDIA/nccl-tests#267 (all-to-all, like any point-to-point send, is limited to one NIC). llm-foundry's MPT-13b
    measured 4,792 tokens/s per H100 on 8 GPUs and 4,800 on 64 (bench/data/external_runtime.jsonl): about 100 GB of
    gathers and reductions per 0.85 s step, which one GPU's 50 GB/s NIC could not have carried."""
    intra = link.intra_node_bytes_per_second or gpu.nvlink_bytes_per_second or gpu.pcie_bytes_per_second
    if gpus <= link.gpus_per_node:
        bandwidth = intra
    else:
        inter = link.inter_node_bytes_per_second or table.inter_node_bytes_per_second_per_gpu
        if stride is not None:
            # the members in a node, one NIC each; a partly filled node (a count that is not a multiple of the
            # node) holds fewer, and the ring runs at its pace
            per_node = gpus % link.gpus_per_node or link.gpus_per_node
            inter *= max(per_node // max(stride, 1), 1)
        bandwidth = min(intra, inter)
    return bandwidth * table.collective_bandwidth_utilization


def _weight_dtype_bytes(spec: TrainingSpec) -> float:
    """Bytes of a weight as the GEMMs read it and as collectives move it, and of an activation: 4 with 32-bit
    training, else 2 (16-bit weights, or the 16-bit copies mixed precision gathers and computes with)."""
    return 4.0 if spec.precision.startswith("32") else 2.0


# Bytes per parameter of the stored codes of a quantized base weight (what a dequantization kernel reads and
# what FSDP moves): bitsandbytes packs two 4-bit NF4/FP4 codes per byte (Params4bit; the absmax constants are
# quantization state outside the sharded tensor, bitsandbytes docs "FSDP-QLoRA", quant_storage), GPTQ packs
# eight 4-bit values per int32; LLM.int8 stores one int8 per weight (Int8Params).
_QUANT_CODE_BYTES = {"nf4": 0.5, "nf4-dq": 0.5, "fp4": 0.5, "gptq-int4": 0.5, "int8": 1.0}


def job_tokens(spec: TrainingSpec, gpus: int | None = None) -> float | None:
    """Tokens the whole job trains on (the work its runtime is predicted for): ``train_tokens``, else ``steps``
    optimizer steps of ``micro_batch_size x seq_len x`` micro-batches per step (``grad_accum_steps``, at least
    the pipeline depth) ``x`` data-parallel replicas; ``None`` when the spec gives neither."""
    if spec.train_tokens is not None:
        return float(spec.train_tokens)
    if spec.steps is None:
        return None
    n_gpus = gpus if gpus is not None else (spec.gpus if isinstance(spec.gpus, int) else 1)
    return float(spec.steps * spec.micro_batch_size * spec.seq_len * _micro_batches_per_step(spec)
                 * spec.data_parallel(n_gpus))


# Bytes moved per token and per input (output) feature of one fp32 LoRA adapter on a 16-bit linear:
# forward: cast the input to fp32 (read 2, write 4), dropout (read 4, write 4, mask 1), lora_A reads it (4);
# backward: lora_A's weight gradient reads it again (4), the gradient flows back through dropout (read 4 + 1,
# write 4) and the cast (read 4, write 2). Output side, forward: lora_B writes 4, the scaling reads and writes
# (4 + 4), the fp32 sum with the 16-bit result (read 2 + 4, write 4), the cast back to 16 bits (read 4,
# write 2); backward: the 16-bit gradient cast to fp32 (read 2, write 4), the scaling (4 + 4), lora_B reads it
# (4). Without dropout its 9 + 9 bytes go. Counted from peft/tuners/lora/layer.py (Linear.forward).
_LORA_IN_BYTES = 19.0 + 19.0
_LORA_IN_DROPOUT_BYTES = 9.0 + 9.0
_LORA_OUT_BYTES = 28.0 + 18.0
# DoRA's rescaling on top (peft/tuners/lora/dora.py DoraLinearLayer.forward), per token and output feature:
# forward, (magnitude scale - 1) x the 16-bit base output into fp32 (read 2, write 4), the scale x the adapter output
# (4 + 4), x scaling (4 + 4), their sum (8 + 4); backward, the gradients of both products and of the magnitude
# (a reduction over the tokens of the gradient x each output) and the scaling: about as many again
_DORA_OUT_BYTES = 26.0 + 40.0
# DoRA's weight norm, per adapted layer and forward: the identity fed through the adapter (in x in, fp32: written
# and read), and per weight element the adapter product written (4), the base weight cast to fp32 (2 + 4), the
# scaled product (4 + 4), the sum (8 + 4) and the norm's read (4)
_DORA_NORM_BYTES_PER_IN_SQUARED = 8.0
_DORA_NORM_BYTES_PER_WEIGHT = 34.0
# Bytes per attention-score element and layer of eager attention (transformers' eager_attention_forward):
# forward: QK^T writes 16-bit scores (2), the mask add reads and writes them (2 + 2), softmax in fp32 reads 2 and
# writes 4, the cast back reads 4 and writes 2, the value matmul reads 2 -> 20; backward about as many.
_EAGER_SCORE_BYTES = 20.0 + 20.0


def _lora_elementwise_bytes_per_token(spec: TrainingSpec, arch: Architecture) -> float:
    """Bytes of the adapters' elementwise passes per token (forward, backward and a recomputed forward)."""
    lora = spec.resolved_lora
    if lora is None:
        return 0.0
    in_bytes = _LORA_IN_BYTES - (0.0 if lora.dropout > 0 else _LORA_IN_DROPOUT_BYTES)
    ratio = _decoder_ratio(spec, arch)
    total = 0.0
    out_bytes = _LORA_OUT_BYTES + (_DORA_OUT_BYTES if lora.use_dora else 0.0)
    for g in arch.lora_groups(lora.target_modules):
        rows = _rows_per_token(arch, g, ratio)
        total += rows * (in_bytes * g.in_features + out_bytes * g.out_features)
    if spec.gradient_checkpointing == "full":  # the forward half again, for the checkpointed blocks
        total *= 1.0 + 0.5 * recomputed_fraction(spec, arch)
    return total


def _dora_norm_bytes(spec: TrainingSpec, arch: Architecture) -> float:
    """Bytes DoRA's weight norms move per micro-batch, whatever its tokens: every adapted layer in each forward (and
    in the recomputed one under checkpointing); 0 without DoRA."""
    lora = spec.resolved_lora
    if lora is None or not lora.use_dora:
        return 0.0
    per_forward = sum(g.count * (_DORA_NORM_BYTES_PER_IN_SQUARED * g.in_features * g.in_features
                                 + _DORA_NORM_BYTES_PER_WEIGHT * g.in_features * g.out_features)
                      for g in arch.lora_groups(lora.target_modules))
    return per_forward * (1.0 + recomputed_fraction(spec, arch))


def _dora_base_recompute_seconds(spec: TrainingSpec, arch: Architecture, gpu: GpuSpec, table: EfficiencyTable,
                                 model_flops_per_second: float) -> float:
    """Seconds per token of the base matmuls a PEFT DoRA layer with adapter dropout runs again: it recomputes the
    base output from the dropped-out input, ``F.linear(dropout(x), weight.to(x.dtype))`` with x in the adapter's
    dtype (peft/tuners/lora/dora.py DoraLinearLayer.forward; predictors/vram.py _dora_base_copy_bytes_per_block),
    forward, the input's gradient in backward and the recomputed forward under checkpointing. PEFT's adapters are
    fp32, so on a 16-true/bf16-true model these matmuls run in fp32 on the CUDA cores; under autocast and on a
    32-true model at the model's own rate. vramfit's H100 rows (Llama-3.2-1B all-linear DoRA, 4 x 1,024 tokens):
    dropout 0.05 makes a step 0.32 s (no checkpointing) and 0.49 s (full) longer than dropout 0, 2.5x-2.9x.
    PEFT >= 0.14: earlier releases run this matmul whatever the dropout (not counted)."""
    lora = spec.resolved_lora
    if lora is None or not lora.use_dora or lora.dropout == 0 or spec.framework == "torchtune":
        return 0.0
    ratio = _decoder_ratio(spec, arch)
    flops = sum(2.0 * g.in_features * g.out_features * _rows_per_token(arch, g, ratio)
                for g in arch.lora_groups(lora.target_modules) if g.role != "lm_head")
    flops *= 2.0 + recomputed_fraction(spec, arch)
    if spec.precision in ("16-true", "bf16-true"):
        tf32 = gpu.runs_tf32(spec.tf32)
        rate = gpu.dense_flops("32-true", tf32) * (
            _tensor_core_efficiency(arch, gpu) if tf32 else table.fp32_flops_utilization)
    else:
        rate = model_flops_per_second
    return flops / rate


def _mlp_width(arch: Architecture) -> float:
    """Intermediate width one token goes through per block (MoE: its routed experts and the shared one)."""
    if arch.is_moe:
        return float(arch.moe_intermediate_size * arch.num_experts_per_tok + arch.shared_expert_intermediate_size)
    return float(arch.intermediate_size)


def _host_seconds_per_layer_pass(spec: TrainingSpec, arch: Architecture, table: EfficiencyTable) -> float:
    """Host time of one block in one pass: the block's own modules, plus each LoRA adapter's Python path (PEFT's
    cast, dropout, two matmuls, scale and add) and each 4-bit base layer's (bitsandbytes' quant-state handling and
    dequantization call) in the block."""
    blocks = max(arch.num_layers + arch.num_encoder_layers, 1)

    def per_block(groups: Iterable[LinearGroup]) -> float:
        # routed experts counted as the top-k a token visits (transformers 5 runs the experts fused)
        return sum(g.count * (arch.num_experts_per_tok / arch.num_experts if g.expert and arch.num_experts else 1)
                   for g in groups if g.role not in ("lm_head", "router")) / blocks

    seconds = table.host_seconds_per_layer_pass
    lora = spec.resolved_lora
    if lora is not None:
        # DoRA runs about as many kernels again per adapter (the weight norm, the two rescaled products)
        adapter_paths = 2.0 if lora.use_dora else 1.0
        seconds += per_block(arch.lora_groups(lora.target_modules)) * table.host_seconds_per_adapter_pass \
            * adapter_paths
    if spec.method == "qlora" and spec.resolved_quantization != "gptq-int4":
        seconds += per_block(arch.linears) * table.host_seconds_per_quantized_linear_pass
    return seconds


def _context_parallel_ring_seconds(spec: TrainingSpec, arch: Architecture, gpu: GpuSpec, link: Interconnect,
                                   table: EfficiencyTable, tokens_micro: int, flops_per_second: float,
                                   weight_bytes: float) -> tuple[float, float]:
    """(exposed, hidden) seconds of ring attention's K/V traffic in one micro-batch (0, 0 without context
    parallelism). Each of the ``cp`` ranks holds ``1/cp`` of the sequence; the K and V blocks go round the ring in
    ``cp - 1`` steps, each overlapping the attention of the block at hand (ring attention, Liu et al. 2023; PyTorch's
    context_parallel in torchtitan, Megatron-LM's CP), so a step costs extra only where its transfer outlasts that
    attention. Backward moves K, V and their gradients (twice the bytes) under twice the FLOPs; a recomputed forward
    moves them again. A cp group spans ``cp x tp`` consecutive GPUs (tensor parallel innermost)."""
    cp, tp, pp = spec.context_parallel, spec.tensor_parallel, spec.pipeline_parallel
    if cp <= 1:
        return 0.0, 0.0
    cp_link = _link_bytes_per_second(gpu, cp * tp, link, table, stride=None)
    layers = (arch.num_layers + arch.num_encoder_layers) / pp
    local_tokens = tokens_micro / cp
    # one ring step, all layers of the stage: one K and one V block of the local tokens (kv heads: GQA sends them
    # unrepeated) against the attention of the local queries over one block of keys
    transfer_s = 2.0 * arch.num_kv_heads * arch.head_dim / tp * local_tokens * weight_bytes * layers / cp_link
    attention_s = (local_tokens * _attention_forward_flops(arch, spec.seq_len, _decoder_ratio(spec, arch)) / cp
                   / (tp * pp) / flops_per_second)
    forward_equivalents = 1.0 + 2.0 + recomputed_fraction(spec, arch)
    steps = (cp - 1) * forward_equivalents
    return steps * max(transfer_s - attention_s, 0.0), steps * min(transfer_s, attention_s)


def _micro_batches_per_step(spec: TrainingSpec) -> int:
    """Micro-batches per optimizer step and data-parallel replica: ``grad_accum_steps``, at least the pipeline
    depth (a pipeline needs that many in flight)."""
    pp = spec.pipeline_parallel
    return spec.grad_accum_steps if pp == 1 else max(spec.grad_accum_steps, pp)


def predict_runtime(
    spec: TrainingSpec,
    arch: Architecture,
    gpu: GpuSpec,
    gpus: int | None = None,
    interconnect: Interconnect | None = None,
    params_override: int | None = None,
    teacher: Architecture | None = None,
    critic: Architecture | None = None,
) -> RuntimePrediction:
    """Predict job throughput, step time and runtime of ``spec`` on ``gpus`` GPUs of type ``gpu`` (``teacher`` and
    ``critic``: the architectures of the spec's ``teacher_model`` and ``critic_model``, required when it names
    them). A critic (PPO's value model) trains in turn with the policy on the same GPUs and tokens: its own step,
    predicted as a training step of its own, adds to every step (``critic_update``)."""
    if spec.teacher_model is not None and teacher is None:
        raise ValueError("spec.teacher_model needs its architecture: pass teacher= (catalog.resolve_model resolves it "
                         "as ResolvedModel.teacher_architecture)")
    critic_spec = spec.critic_spec()
    policy = _predict_runtime(spec, arch, gpu, gpus, interconnect, params_override, teacher)
    if critic_spec is None:
        return policy
    if critic is None:
        raise ValueError("spec.critic_model needs its architecture: pass critic= (catalog.resolve_model resolves it "
                         "as ResolvedModel.critic_architecture)")
    critic_step = _predict_runtime(critic_spec, critic, gpu, gpus, interconnect, None, None)
    # the critic trains on the policy's tokens of the step, in micro-batches of its own size
    critic_s = policy.tokens_per_step / critic_step.tokens_per_second
    step_s = policy.step_time_seconds + critic_s
    tokens_per_second = policy.tokens_per_step / step_s
    runtime = _job_seconds(spec, tokens_per_second, step_s)
    components = {**policy.components_seconds, "critic_update": critic_s, "step": step_s}
    note = (f"critic_model {critic.name}: its update takes {critic_s:.3g} s of every {step_s:.3g} s step (a training "
            "step of its own on the same tokens)")
    return replace(policy, tokens_per_second=tokens_per_second, step_time_seconds=step_s, runtime_seconds=runtime,
                   flops_per_token=policy.flops_per_token + critic_step.flops_per_token,
                   components_seconds=components, notes=(*policy.notes, note))


def _job_seconds(spec: TrainingSpec, tokens_per_second: float, step_seconds: float) -> float | None:
    """The whole job's runtime: ``train_tokens`` at the job's throughput, or ``steps`` steps; None without either."""
    if spec.train_tokens is not None:
        return spec.train_tokens / tokens_per_second
    if spec.steps is not None:
        return spec.steps * step_seconds
    return None


def _predict_runtime(
    spec: TrainingSpec,
    arch: Architecture,
    gpu: GpuSpec,
    gpus: int | None,
    interconnect: Interconnect | None,
    params_override: int | None,
    teacher: Architecture | None,
) -> RuntimePrediction:
    """:func:`predict_runtime` of one trained model (the policy, or a critic's own step)."""
    table = efficiency_table()
    link = interconnect or Interconnect()
    arch = arch.for_task(spec.task)
    n_gpus = gpus if gpus is not None else (spec.gpus if isinstance(spec.gpus, int) else 1)
    tp, pp, cp = spec.tensor_parallel, spec.pipeline_parallel, spec.context_parallel
    model_parallel = tp * pp * cp
    dp = spec.data_parallel(n_gpus)
    shard = spec.shard_group(n_gpus)  # data-parallel ranks of one copy of the sharded states (dp unless hybrid)
    sharding = spec.resolved_sharding(n_gpus)
    notes: list[str] = []
    scale = params_override / arch.params_total if params_override else 1.0

    fpt = flops_per_token(spec, arch)
    fpt_total = fpt.total * scale
    tokens_micro = spec.micro_batch_size * spec.seq_len  # per data-parallel replica
    n_micro = _micro_batches_per_step(spec)
    tokens_per_step = float(tokens_micro * n_micro * dp)

    # --- compute of one micro-batch on one GPU: the roofline of FLOPs and weight traffic --------------
    efficiency = matmul_efficiency(spec, arch, gpu)
    peak = gpu.dense_flops(spec.precision, gpu.runs_tf32(spec.tf32))
    compute_s = tokens_micro * fpt_total / model_parallel / (peak * efficiency)
    weight_bytes = _weight_dtype_bytes(spec)
    params_gpu = arch.params_total * scale / model_parallel
    # weight reads per micro-batch: forward, backward dX, backward dW (+ the recomputed forward); frozen weights
    # (LoRA/QLoRA bases) have no dW pass, so they are read in the forward and the dX pass only
    passes = (3.0 if spec.method == "full" else 2.0) + recomputed_fraction(spec, arch)
    if spec.trainable_layers is not None:
        # freeze tuning: the trained blocks' weights are read 3 times (+ recomputation), the frozen blocks backward
        # runs through twice, the rest (and the embeddings) once
        trained, through = trained_blocks(spec, arch)
        share = 1.0 / max(arch.num_layers, 1)
        passes = 1.0 + (2.0 * trained + (through - trained)) * share + recomputed_fraction(spec, arch) * through * share
    bandwidth = gpu.memory_bandwidth_bytes_per_second * table.memory_bandwidth_utilization
    memory_floor_s = params_gpu * weight_bytes * passes / bandwidth
    micro_s = max(compute_s, memory_floor_s)
    if memory_floor_s > compute_s:
        notes.append("memory-bandwidth bound: the micro-batch is too small to keep the tensor cores busy")
    dequant_s = 0.0
    if spec.method == "qlora":
        quantizable = arch.quantizable_params() * scale / model_parallel
        dequant_passes = 2.0 + recomputed_fraction(spec, arch)
        # read the stored codes, write the 16-bit copy the GEMM then reads
        code_bytes = _QUANT_CODE_BYTES.get(spec.resolved_quantization or "nf4-dq", 0.5)
        dequant_bytes = quantizable * (code_bytes + 2.0 + 2.0) * dequant_passes
        dequant_s = dequant_bytes / (gpu.memory_bandwidth_bytes_per_second * table.dequantization_bandwidth_utilization)
    micro_s += dequant_s
    # LoRA adapters in fp32 (PEFT's default) on a 16-bit base: each adapted linear casts its input to fp32,
    # applies dropout, and adds the scaled fp32 output back to the 16-bit result, elementwise passes over
    # activation-sized tensors that no FLOP count sees (all-linear on an 8B model: ~0.1 s per 4k tokens on an H200)
    lora_traffic_s = 0.0
    if spec.resolved_lora is not None:
        lora_traffic_s = ((tokens_micro / cp * _lora_elementwise_bytes_per_token(spec, arch)
                           + _dora_norm_bytes(spec, arch)) / (tp * pp)
                          / (gpu.memory_bandwidth_bytes_per_second * table.memory_bandwidth_utilization))
    micro_s += lora_traffic_s
    dora_base_s = (_dora_base_recompute_seconds(spec, arch, gpu, table, peak * efficiency)
                   * tokens_micro / cp / (tp * pp))
    micro_s += dora_base_s
    # eager attention writes the seq x seq scores and reads them back (mask, fp32 softmax, cast, dropout, the
    # value matmul; the same again in backward); sdpa/flash kernels keep them on chip
    eager_scores_s = 0.0
    if spec.attention == "eager":
        score_elements = (tokens_micro / cp) * arch.num_attention_heads * spec.seq_len / cp \
            * (arch.num_layers + arch.num_encoder_layers) / (tp * pp)
        bytes_per_score = _EAGER_SCORE_BYTES * (1.0 + 0.5 * recomputed_fraction(spec, arch))
        eager_scores_s = score_elements * bytes_per_score / (
            gpu.memory_bandwidth_bytes_per_second * table.memory_bandwidth_utilization)
    micro_s += eager_scores_s
    # framework: transformers runs each block's element-wise ops one kernel at a time (RMSNorm's fp32 upcast and
    # scaling, rotary embeddings, the k/v repeat, SiLU-and-multiply, residual adds): passes over activation-sized
    # tensors in memory that the FLOP count does not see, and that fused or compiled frameworks (the published
    # runs' efficiency figures) do not have. Bytes per token, block and pass (backward = 2 passes). torch_compile
    # fuses them into the kernels around them.
    elementwise_s = 0.0
    if spec.framework == "transformers" and not spec.torch_compile:
        per_token = (table.eager_elementwise_bytes_per_hidden * arch.hidden_size
                     + table.eager_elementwise_bytes_per_mlp_width * _mlp_width(arch))
        ew_passes = 3.0 + recomputed_fraction(spec, arch)
        if spec.trainable_layers is not None:  # backward's two passes over the blocks it runs through only
            ew_passes = 1.0 + (2.0 + recomputed_fraction(spec, arch)) * trained_blocks(spec, arch)[1] / max(
                arch.num_layers, 1)
        elementwise_s = (tokens_micro / cp * per_token * ew_passes
                         * (arch.num_layers + arch.num_encoder_layers) / (tp * pp)
                         / (gpu.memory_bandwidth_bytes_per_second * table.memory_bandwidth_utilization))
    micro_s += elementwise_s
    # a frozen reference model (reference_model: DPO/KTO without an adapter) runs one forward per micro-batch, under
    # no_grad, beside the trained model's forward and backward
    reference_s = 0.0
    if spec.reference_model and (spec.method == "full" or spec.reference_model == "copy"):
        reference_s = tokens_micro * fpt.forward * scale / model_parallel / (peak * efficiency)
    micro_s += reference_s
    # a distillation teacher (teacher_model) runs one no_grad forward per micro-batch on the same tokens: its forward
    # FLOPs at the same tensor-core efficiency, or its weights' read where that takes longer
    teacher_s = 0.0
    if teacher is not None:
        as_full = spec.model_copy(update={"method": "full", "lora": None, "quantization": None,
                                          "teacher_model": None})
        teacher_flops = tokens_micro * flops_per_token(as_full, teacher).forward / model_parallel
        teacher_read = teacher.params_total / model_parallel * weight_bytes / bandwidth
        teacher_s = max(teacher_flops / (peak * efficiency), teacher_read)
    micro_s += teacher_s
    compute_step_s = micro_s * n_micro
    # the host: eager PyTorch issues every kernel from Python; a micro-batch cannot run faster than the host
    # walks the layers (forward, backward, and the recomputed forward under full checkpointing). On small
    # micro-batches this, not the GPU, sets the step time.
    passes_host = 2.0 + recomputed_fraction(spec, arch) + (1.0 if reference_s else 0.0)  # + the reference forward
    layers_gpu = (arch.num_layers + arch.num_encoder_layers) / pp
    host_step_s = n_micro * layers_gpu * passes_host * _host_seconds_per_layer_pass(spec, arch, table)
    if teacher is not None:  # the teacher's forward, one pass over its blocks
        host_step_s += n_micro * max(teacher.num_layers, 1) * table.host_seconds_per_layer_pass
    if host_step_s > compute_step_s:
        notes.append("host bound: launching the kernels of each layer takes longer than running them "
                     "(a larger micro-batch costs little extra time)")
    host_wait_s = max(host_step_s - compute_step_s, 0.0)
    bubble_s = micro_s * (pp - 1) if pp > 1 else 0.0

    # --- optimizer update (memory bound): read param, grad, states; write param, states -----------
    if spec.resolved_lora is not None:
        lora = spec.resolved_lora
        trainable = (sum(lora.rank * (g.in_features + g.out_features) * g.count
                         for g in arch.lora_groups(lora.target_modules))
                     + sum(saved_module_params(arch, lora.modules_to_save).values()) * scale) / model_parallel
    elif spec.trainable_layers is not None:
        block = (arch.body_linear_params + arch.norm_params + arch.other_params) / max(arch.num_layers, 1)
        trainable = trained_blocks(spec, arch)[0] * block * scale / model_parallel
    else:
        trainable = params_gpu
    sharded_states = sharding in ("zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op") and shard * cp > 1
    trainable_shard = trainable / (shard * cp) if sharded_states else trainable
    optimizer_bytes_per_param = 28.0 if spec.precision.endswith("mixed") or weight_bytes == 4 else 14.0
    offload_states = spec.offload in ("optimizer", "params+optimizer")
    optimizer_s = 0.0 if offload_states else trainable_shard * optimizer_bytes_per_param / bandwidth

    # --- communication ----------------------------------------------------------------------------
    group = dp * cp
    # ranks are laid out tensor-parallel fastest and pipeline stages outermost (Megatron-LM parallel_state order
    # tp-cp-ep-dp-pp, torchtitan's device mesh pp, dp, cp, tp; DeepSpeed's PipeDataParallelTopology): a
    # data-parallel group spans dp x cp x tp consecutive GPUs, so with pipeline stages one node per stage its
    # collectives stay on the node's links
    link_bps = _link_bytes_per_second(gpu, group * tp, link, table, stride=tp)
    # hybrid sharding: gathers and reduce-scatters run inside a shard group (shard x cp x tp consecutive GPUs: a
    # node's for FSDP HYBRID_SHARD), and each group's gradient shard is all-reduced across the replica groups
    shard_group = shard * cp
    replicas = group // shard_group
    shard_link_bps = (_link_bytes_per_second(gpu, shard_group * tp, link, table, stride=tp) if replicas > 1
                      else link_bps)
    grad_bytes = 4.0 if spec.precision.endswith("mixed") or weight_bytes == 4 or spec.resolved_fp32_gradients() else 2.0
    dp_comm_bytes = 0.0
    # bytes of the weights a sharded engine all-gathers: the 16-bit (32-bit) weights; QLoRA's frozen base
    # weights are sharded and gathered as their packed codes (FSDP-QLoRA, bitsandbytes quant_storage), the
    # rest (embeddings, norms, the output head) in the weight dtype
    gathered_bytes = params_gpu * weight_bytes
    if spec.method == "qlora":
        quantized = arch.quantizable_params() * scale / model_parallel
        code_bytes = _QUANT_CODE_BYTES.get(spec.resolved_quantization or "nf4-dq", 0.5)
        gathered_bytes = quantized * code_bytes + max(params_gpu - quantized, 0.0) * weight_bytes
    dp_comm_s = 0.0
    # a sharded teacher's weights are gathered for its forward of every micro-batch
    teacher_gathered = (teacher.params_total / model_parallel * weight_bytes
                        if teacher is not None and sharding in ("zero3", "fsdp", "fsdp-grad-op") else 0.0)
    if group > 1:
        ring = (shard_group - 1) / shard_group
        secondary = min(spec.secondary_shard_size or 0, shard_group)
        if sharding in ("zero3", "fsdp") and secondary > 1:
            # ZeRO++ hpZ / FSDP2 reshard_after_forward=<int>: forward gathers over the shard group, backward from
            # the secondary shard inside a node-sized group of consecutive ranks (its own, faster links)
            dp_comm_bytes = n_micro * ring * (gathered_bytes + trainable * grad_bytes + teacher_gathered)
            secondary_link_bps = _link_bytes_per_second(gpu, secondary * tp, link, table, stride=tp)
            dp_comm_s = n_micro * (secondary - 1) / secondary * gathered_bytes / secondary_link_bps
        elif sharding in ("zero3", "fsdp"):
            # all-gather parameters for forward and backward of every micro-batch, reduce-scatter gradients
            dp_comm_bytes = n_micro * ring * (2 * gathered_bytes + trainable * grad_bytes + teacher_gathered)
        elif sharding == "fsdp-grad-op":
            dp_comm_bytes = ring * gathered_bytes + n_micro * ring * (trainable * grad_bytes + teacher_gathered)
        else:  # ddp, zero1, zero2: all-reduce (= reduce-scatter + all-gather) of gradients once per step
            dp_comm_bytes = 2 * ring * trainable * grad_bytes
        dp_comm_s += dp_comm_bytes / shard_link_bps
        if replicas > 1:
            # FSDP's post-backward hook all-reduces the reduce-scattered shard across replicas, every micro-batch
            replica_bytes = n_micro * 2 * (replicas - 1) / replicas * trainable / shard_group * grad_bytes
            # each replica group holds one rank per shard group (shard x tp apart): with node-sized shard groups one
            # member per node, so its all-reduce crosses the network at one NIC per GPU
            replica_link_bps = _link_bytes_per_second(gpu, group * tp, link, table, stride=shard_group * tp)
            dp_comm_s += replica_bytes / replica_link_bps
    tp_comm_s = 0.0
    if tp > 1:
        # a tensor-parallel group wider than a node spans nodes: its all-reduces run at the network's bandwidth
        tp_link = _link_bytes_per_second(gpu, tp, link, table, stride=1)
        # all-reduces of the activations per token: one after attention and one after the MLP of every block
        # (Megatron-LM, Shoeybi et al. 2019, sec. 3: f/g operators), a third after the cross-attention of an
        # encoder-decoder's decoder blocks, which run on the decoder's tokens
        ratio = _decoder_ratio(spec, arch)
        per_pass = 2.0 * arch.num_encoder_layers + (3.0 if arch.is_encoder_decoder else 2.0) * arch.num_layers * ratio
        # the forward's all-reduces and as many in backward
        tp_bytes = 2.0 * per_pass * 2 * (tp - 1) / tp * tokens_micro / cp * arch.hidden_size * weight_bytes
        tp_comm_s = tp_bytes * n_micro / tp_link

    # --- CPU offload ------------------------------------------------------------------------------
    pcie = gpu.pcie_bytes_per_second * table.memory_bandwidth_utilization
    offload_transfer_s = 0.0
    cpu_step_s = 0.0
    if offload_states:
        # gradients down, updated parameters (in the weight dtype) up, once per step
        offload_transfer_s = trainable_shard * (grad_bytes + weight_bytes) / pcie
        cpu_step_s = trainable_shard * 28.0 / table.host_memory_bytes_per_second_per_gpu
    if spec.offload == "params+optimizer":
        offloaded_shard = gathered_bytes / (shard_group if sharding in ("zero3", "fsdp") else 1)
        offload_transfer_s += n_micro * 2 * offloaded_shard / pcie  # parameters up for forward and backward

    # activation offloading: the saved activations go to host memory in the forward and come back in backward, on a
    # side stream that compute hides (torchtune's OffloadActivations with use_streams, TRL's and axolotl's ports:
    # S02's Llama-3.2-3B went from 7,309 to 7,301 tokens/s when it was switched on). transformers' offload copies on
    # the compute stream, so its jobs take longer than this says.
    activation_transfer_s = 0.0
    if spec.activation_offloading:
        activation_transfer_s = n_micro * 2 * offloaded_activation_bytes(spec, arch, n_gpus) / pcie
    overlappable = dp_comm_s + offload_transfer_s + activation_transfer_s
    hidden = min(overlappable, table.communication_overlap * compute_step_s)
    exposed_s = overlappable - hidden
    cp_exposed_s, cp_hidden_s = _context_parallel_ring_seconds(spec, arch, gpu, link, table, tokens_micro,
                                                               peak * efficiency, weight_bytes)
    cp_exposed_s *= n_micro
    cp_hidden_s *= n_micro
    step_s = (compute_step_s + host_wait_s + bubble_s + optimizer_s + exposed_s + tp_comm_s + cpu_step_s
              + cp_exposed_s)
    tokens_per_second = tokens_per_step / step_s
    runtime = _job_seconds(spec, tokens_per_second, step_s)
    if cp_exposed_s > 0:
        notes.append("context parallel: passing K/V blocks round the ring takes longer than the attention of a block, "
                     "which hides it only in part")
    components = {
        "compute": compute_s * n_micro,
        "memory_floor": memory_floor_s * n_micro,
        "dequantization": dequant_s * n_micro,
        "lora_elementwise": lora_traffic_s * n_micro,
        "dora_base_recompute": dora_base_s * n_micro,
        "eager_elementwise": elementwise_s * n_micro,
        "eager_attention_scores": eager_scores_s * n_micro,
        "reference_forward": reference_s * n_micro,
        "teacher_forward": teacher_s * n_micro,
        "host_wait": host_wait_s,
        "pipeline_bubble": bubble_s,
        "optimizer_step": optimizer_s,
        "data_parallel_communication": dp_comm_s,
        "tensor_parallel_communication": tp_comm_s,
        "offload_transfer": offload_transfer_s,
        "activation_offload_transfer": activation_transfer_s,
        "cpu_optimizer_step": cpu_step_s,
        "communication_exposed": exposed_s,
        "context_parallel_exposed": cp_exposed_s,
        "context_parallel_hidden": cp_hidden_s,
        "step": step_s,
    }
    return RuntimePrediction(
        tokens_per_second=tokens_per_second,
        step_time_seconds=step_s,
        tokens_per_step=tokens_per_step,
        runtime_seconds=runtime,
        flops_per_token=fpt_total,
        matmul_efficiency=efficiency,
        components_seconds=components,
        notes=tuple(notes),
    )
