"""The numbers a learned correction sees: a fixed, named feature vector per (spec, analytic prediction, GPU,
measured metric).

Pure: no I/O, no scikit-learn. Every feature is a float; categorical settings are integer codes into a fixed
vocabulary (``NaN`` for a value outside it, which tree models treat as missing). The order of
:data:`FEATURE_NAMES` is the order of the vector; :func:`feature_schema_sha256` fingerprints names and
vocabularies so a persisted model trained on another layout is recognised as incompatible.

Sizes are ``log2`` of bytes or counts (a factor of two is one unit), shares are fractions of the analytic
level the measurement is compared with.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from predictors.architecture import Architecture
from predictors.hardware import GpuSpec
from predictors.reference import LEVEL_FOR_METRIC
from predictors.spec import ALLOWED, TrainingSpec
from predictors.vram import VramPrediction

# Breakdown entries that are resident model states: they exist for the whole step, whatever the batch.
# Their sum is the floor below which no corrected prediction may fall.
RESIDENT_COMPONENTS: tuple[str, ...] = ("weights", "secondary_weights", "reference_weights", "teacher_weights",
                                         "lora_adapters", "saved_modules", "master_weights", "optimizer_states",
                                         "critic_states", "policy_states")
# Entries that scale with the tokens of a micro-batch (the backward-phase high-water mark).
TRANSIENT_COMPONENTS: tuple[str, ...] = ("activations", "logits", "quantization_workspace", "teacher_forward",
                                          "distillation_loss", "dora_workspace")
# Held outside the PyTorch caching allocator.
FIXED_COMPONENTS: tuple[str, ...] = ("cuda_context", "nccl_buffers", "paged_optimizer_states")

METRICS: tuple[str, ...] = ("allocated", "active", "reserved", "nvml", "unknown")
GPU_FAMILIES: tuple[str, ...] = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")

# Categorical features and their vocabularies (the code is the index).
CATEGORIES: dict[str, tuple[str, ...]] = {
    "method": ALLOWED["method"],
    "precision": ALLOWED["precision"],
    "optimizer": ALLOWED["optimizer"],
    "gradient_checkpointing": ALLOWED["gradient_checkpointing"],
    "attention": ALLOWED["attention"],
    "sharding": ALLOWED["sharding"],
    "offload": ALLOWED["offload"],
    "quantization": ("none", *ALLOWED["quantization"]),
    "task": ALLOWED["task"],
    "gpu_family": ("unknown", *GPU_FAMILIES),
    "metric": METRICS,
}

# Numeric features with the sign of their monotonic constraint on the log correction (0: none).
# Every feature that grows with the tokens of a micro-batch is constrained so that the correction never
# shrinks as the batch or the sequence grows; with the analytic level growing too, the corrected
# prediction is non-decreasing in micro_batch_size and seq_len.
NUMERIC: dict[str, int] = {
    "log2_params_total": 0,
    "log2_params_trainable": 0,
    "trainable_fraction": 0,
    "log2_hidden_size": 0,
    "log2_num_layers": 0,
    "log2_vocab_size": 0,
    "log2_lora_rank": 0,
    "log2_gpus": 0,
    "log2_gpu_memory_bytes": 0,
    "log2_resident_bytes": 0,
    "weights_share_of_resident": 0,
    "optimizer_share_of_resident": 0,
    "log2_seq_len": 1,
    "log2_micro_batch_size": 1,
    "log2_tokens_per_micro_batch": 1,
    "log2_transient_bytes": 1,
    "transient_share": 1,
    "fixed_share": -1,
    "backward_phase": 1,
}

# The side on which each numeric feature moves when a job of a given model needs more memory: +1 grows, -1 shrinks,
# 0 either way. The bound's distance to the training data counts a signed feature only on that side (a job smaller
# than a training case is no farther from it for that feature), so the bound's widening, and the bound, never fall
# as a job grows: more tokens (the NUMERIC constraints), a larger LoRA rank or more adapted modules (more trainable
# parameters, adapter optimizer states and resident bytes; the frozen weights a smaller share of them). Not the
# residual's monotonic constraints: those are NUMERIC's, on the correction itself.
DISTANCE_SIGNS: dict[str, int] = {
    **{name: sign for name, sign in NUMERIC.items() if sign},
    "log2_params_trainable": 1,
    "trainable_fraction": 1,
    "log2_lora_rank": 1,
    "log2_resident_bytes": 1,
    "weights_share_of_resident": -1,
    "optimizer_share_of_resident": 1,
}

FEATURE_NAMES: tuple[str, ...] = (*NUMERIC, *CATEGORIES)
CATEGORICAL_MASK: tuple[bool, ...] = tuple(name in CATEGORIES for name in FEATURE_NAMES)
MONOTONIC_CST: tuple[int, ...] = tuple(NUMERIC.get(name, 0) for name in FEATURE_NAMES)


def feature_schema_sha256() -> str:
    """Fingerprint of the feature layout: names, constraint signs and category vocabularies."""
    blob = json.dumps({"numeric": NUMERIC, "categories": {k: list(v) for k, v in CATEGORIES.items()}},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class VramCase:
    """Everything one row of the residual model needs: the spec, its resolved architecture, the GPU,
    the measured (or wanted) metric, and the analytic prediction for it."""

    spec: TrainingSpec
    architecture: Architecture
    gpu: GpuSpec | None
    metric: str
    vram: VramPrediction

    @property
    def level(self) -> str:
        """The predicted level (``peak_allocated_bytes`` ...) the metric is compared with."""
        return LEVEL_FOR_METRIC[self.metric]

    @property
    def level_bytes(self) -> int:
        return int(getattr(self.vram, self.level))

    @property
    def floor_bytes(self) -> int:
        """Resident model states: what must be on the GPU whatever the batch (weights, adapters, master
        weights, optimizer states)."""
        return resident_bytes(self.vram)


def _total(breakdown: dict[str, int], keys: tuple[str, ...]) -> int:
    """The sum of ``keys`` in ``breakdown`` (a plain loop: called several times per row, no generator)."""
    total = 0
    for k in keys:
        total += breakdown.get(k, 0)
    return total


def resident_bytes(vram: VramPrediction) -> int:
    return _total(vram.breakdown_bytes, RESIDENT_COMPONENTS)


def _log2(x: float) -> float:
    return math.log2(x) if x > 0 else 0.0


# The code of each category value (the index in its vocabulary), looked up per row and setting.
_CODES: dict[str, dict[str, float]] = {
    name: {value: float(vocab.index(value)) for value in vocab} for name, vocab in CATEGORIES.items()
}


def _code(name: str, value: str | None) -> float:
    return _CODES[name].get(value, math.nan)  # type: ignore[arg-type]


def _spec_features(spec: TrainingSpec, arch: Architecture) -> dict[str, float]:
    """The features that depend on the spec and its architecture alone (the same in every row of a spec)."""
    lora = spec.resolved_lora
    tokens = spec.micro_batch_size * spec.seq_len / spec.context_parallel
    return {
        "log2_hidden_size": _log2(arch.hidden_size),
        "log2_num_layers": _log2(arch.num_layers + arch.num_encoder_layers),
        "log2_vocab_size": _log2(arch.vocab_size),
        "log2_lora_rank": _log2(lora.rank) if lora is not None else 0.0,
        "log2_seq_len": _log2(spec.seq_len),
        "log2_micro_batch_size": _log2(spec.micro_batch_size),
        "log2_tokens_per_micro_batch": _log2(tokens),
        "method": _code("method", spec.method),
        "precision": _code("precision", spec.precision),
        "optimizer": _code("optimizer", spec.optimizer),
        "gradient_checkpointing": _code("gradient_checkpointing", spec.gradient_checkpointing),
        "attention": _code("attention", spec.attention),
        "offload": _code("offload", spec.offload),
        "quantization": _code("quantization", spec.resolved_quantization or "none"),
        "task": _code("task", spec.task),
    }


_INDEX: dict[str, int] = {name: i for i, name in enumerate(FEATURE_NAMES)}
_SPEC_FEATURES: tuple[str, ...] = ("log2_hidden_size", "log2_num_layers", "log2_vocab_size", "log2_lora_rank",
                                   "log2_seq_len", "log2_micro_batch_size", "log2_tokens_per_micro_batch", "method",
                                   "precision", "optimizer", "gradient_checkpointing", "attention", "offload",
                                   "quantization", "task")
# the row's own features, in the order _row computes them
(_I_PARAMS_TOTAL, _I_PARAMS_TRAINABLE, _I_TRAINABLE_FRACTION, _I_GPUS, _I_GPU_MEMORY, _I_RESIDENT, _I_WEIGHTS_SHARE,
 _I_OPTIMIZER_SHARE, _I_TRANSIENT, _I_TRANSIENT_SHARE, _I_FIXED_SHARE, _I_BACKWARD, _I_SHARDING, _I_GPU_FAMILY,
 _I_METRIC) = (_INDEX[name] for name in (
    "log2_params_total", "log2_params_trainable", "trainable_fraction", "log2_gpus", "log2_gpu_memory_bytes",
    "log2_resident_bytes", "weights_share_of_resident", "optimizer_share_of_resident", "log2_transient_bytes",
    "transient_share", "fixed_share", "backward_phase", "sharding", "gpu_family", "metric"))


def _template(shared: dict[str, float]) -> list[float]:
    """A row with the spec's own features in place (the others are filled per row)."""
    row = [0.0] * len(FEATURE_NAMES)
    for name in _SPEC_FEATURES:
        row[_INDEX[name]] = shared[name]
    return row


def _row(case: VramCase, shared: dict[str, float] | list[float]) -> list[float]:
    """The features of ``case`` in the order of :data:`FEATURE_NAMES`; ``shared``: its spec's (as returned by
    :func:`_spec_features`, or its :func:`_template`)."""
    return _row_of(case.spec, case.vram, case.gpu, case.metric, shared)


def _row_of(spec: TrainingSpec, vram: VramPrediction, gpu: GpuSpec | None, metric: str,
            shared: dict[str, float] | list[float]) -> list[float]:
    """:func:`_row` of the case ``(spec, vram, gpu, metric)``, without the case object."""
    b = vram.breakdown_bytes
    get = b.get
    level_name = LEVEL_FOR_METRIC[metric]
    level = max(int(getattr(vram, level_name)), 1)
    resident = resident_bytes(vram)
    transient = _total(b, TRANSIENT_COMPONENTS)
    # context and NCCL count only where the level includes them (nvml)
    fixed = _total(b, FIXED_COMPONENTS) if level_name == "peak_vram_bytes" else 0
    optimizer = get("optimizer_states", 0) + get("master_weights", 0)
    row = (_template(shared) if isinstance(shared, dict) else list(shared))
    row[_I_PARAMS_TOTAL] = _log2(vram.params_total)
    row[_I_PARAMS_TRAINABLE] = _log2(vram.params_trainable)
    row[_I_TRAINABLE_FRACTION] = vram.params_trainable / max(vram.params_total, 1)
    row[_I_GPUS] = _log2(vram.gpus)
    row[_I_GPU_MEMORY] = _log2(gpu.memory_bytes) if gpu is not None else math.nan
    row[_I_RESIDENT] = _log2(resident)
    row[_I_WEIGHTS_SHARE] = get("weights", 0) / max(resident, 1)
    row[_I_OPTIMIZER_SHARE] = optimizer / max(resident, 1)
    row[_I_TRANSIENT] = _log2(transient)
    row[_I_TRANSIENT_SHARE] = transient / level
    row[_I_FIXED_SHARE] = fixed / level
    row[_I_BACKWARD] = 1.0 if vram.peak_phase == "backward" else 0.0
    row[_I_SHARDING] = _code("sharding", spec.resolved_sharding(vram.gpus))
    row[_I_GPU_FAMILY] = _code("gpu_family", gpu.family if gpu is not None else "unknown")
    row[_I_METRIC] = _code("metric", metric)
    return row


def case_features(case: VramCase) -> np.ndarray:
    """The feature vector of one case, in the order of :data:`FEATURE_NAMES`."""
    return np.asarray(_row(case, _spec_features(case.spec, case.architecture)), dtype=np.float64)


def device_feature_matrix(spec: TrainingSpec, arch: Architecture,
                          items: Sequence[tuple[GpuSpec | None, VramPrediction]], metric: str) -> np.ndarray:
    """:func:`feature_matrix` of the cases ``(spec, arch, gpu, metric, vram)`` for each ``(gpu, vram)`` of one
    spec (placement: a spec on every pool's GPU), without building the case objects."""
    if not items:
        return np.empty((0, len(FEATURE_NAMES)), dtype=np.float64)
    shared = _template(_spec_features(spec, arch))
    return np.asarray([_row_of(spec, vram, gpu, metric, shared) for gpu, vram in items], dtype=np.float64)


def feature_matrix(cases: list[VramCase]) -> np.ndarray:
    """Stack the feature vectors of ``cases`` into an ``(n, len(FEATURE_NAMES))`` array.

    The spec's own features are computed once per spec (placement passes one spec on many GPUs).
    """
    if not cases:
        return np.empty((0, len(FEATURE_NAMES)), dtype=np.float64)
    shared: dict[tuple[int, int], list[float]] = {}  # by identity: the cases keep them alive
    rows = []
    for case in cases:
        key = (id(case.spec), id(case.architecture))
        if key not in shared:
            shared[key] = _template(_spec_features(case.spec, case.architecture))
        rows.append(_row(case, shared[key]))
    return np.asarray(rows, dtype=np.float64)
