"""The numbers the runtime residual sees: a fixed, named feature vector per (spec, GPU, analytic runtime).

Pure: no I/O, no scikit-learn. Unlike :mod:`predictors.features` (categorical codes for tree models), the
settings are one-hot encoded here (one 0/1 column per known value; a value outside the vocabulary sets
none of its columns), so that a linear model with an L2 penalty shrinks every setting's correction
towards 0 in proportion to how few training runs have it: with ``n`` runs of a GPU family and penalty
``lambda``, the family's own correction is about ``n / (n + lambda)`` of its mean residual.

Nothing here depends on the analytic VRAM model: the runtime residual stays valid when the VRAM constants
change. :func:`runtime_feature_schema_sha256` fingerprints names and vocabularies so that a persisted
model trained on another layout is recognised as incompatible.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

import numpy as np

from predictors.architecture import Architecture
from predictors.features import GPU_FAMILIES
from predictors.hardware import GpuSpec
from predictors.runtime import RuntimePrediction
from predictors.spec import ALLOWED, TrainingSpec

# One-hot settings and their vocabularies. Kept to the settings that change how fast kernels run.
RUNTIME_CATEGORIES: dict[str, tuple[str, ...]] = {
    "gpu_family": GPU_FAMILIES,
    "method": ALLOWED["method"],
    "precision": ALLOWED["precision"],
    "gradient_checkpointing": ALLOWED["gradient_checkpointing"],
    "attention": ALLOWED["attention"],
    "sharding": ALLOWED["sharding"],
    "offload": ALLOWED["offload"],
}

# Numeric features: log2 of sizes and counts (a factor of two is one unit), shares of the analytic step.
RUNTIME_NUMERIC: tuple[str, ...] = (
    "log2_flops_per_token",
    "log2_hidden_size",
    "log2_tokens_per_micro_batch",
    "log2_gpus",
    "log2_model_parallel",
    "log2_memory_floor_over_compute",
    "communication_share",
    "optimizer_share",
)

RUNTIME_ONE_HOT: tuple[str, ...] = tuple(f"{name}={value}" for name, vocab in RUNTIME_CATEGORIES.items()
                                         for value in vocab)
# numeric first, then one-hot: the runtime residual relies on this order
RUNTIME_FEATURE_NAMES: tuple[str, ...] = (*RUNTIME_NUMERIC, *RUNTIME_ONE_HOT)
_ONE_HOT_INDEX: dict[str, int] = {name: i for i, name in enumerate(RUNTIME_FEATURE_NAMES)}
_ONE_HOT_ZEROS: list[float] = [0.0] * len(RUNTIME_ONE_HOT)


def runtime_feature_schema_sha256() -> str:
    """Fingerprint of the runtime feature layout: numeric names and one-hot vocabularies, in order."""
    blob = json.dumps({"numeric": list(RUNTIME_NUMERIC),
                       "categories": {k: list(v) for k, v in RUNTIME_CATEGORIES.items()}})
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class RuntimeCase:
    """One row of the runtime residual: the spec, its architecture, the GPU, the job's GPU count and the
    analytic runtime prediction for it."""

    spec: TrainingSpec
    architecture: Architecture
    gpu: GpuSpec
    gpus: int
    runtime: RuntimePrediction

    @property
    def analytic_tokens_per_second(self) -> float:
        """The analytic throughput of the whole job."""
        return self.runtime.tokens_per_second


def _log2(x: float) -> float:
    return math.log2(x) if x > 0 else 0.0


def _case_row(case: RuntimeCase) -> list[float]:
    """The features of one case as a list, in the order of :data:`RUNTIME_FEATURE_NAMES`."""
    spec, arch, rt = case.spec, case.architecture, case.runtime
    c = rt.components_seconds
    get = c.get
    step = max(get("step", 0.0), 1e-30)
    compute = max(get("compute", 0.0), 1e-30)
    communication = get("communication_exposed", 0.0) + get("tensor_parallel_communication", 0.0)
    memory_floor = get("memory_floor", 0.0)
    numeric = {
        "log2_flops_per_token": _log2(rt.flops_per_token),
        "log2_hidden_size": _log2(arch.hidden_size),
        "log2_tokens_per_micro_batch": _log2(spec.micro_batch_size * spec.seq_len / spec.context_parallel),
        "log2_gpus": _log2(case.gpus),
        "log2_model_parallel": _log2(spec.model_parallel()),
        "log2_memory_floor_over_compute": math.log2(memory_floor / compute) if memory_floor > 0 else 0.0,
        "communication_share": communication / step,
        "optimizer_share": (get("optimizer_step", 0.0) + get("cpu_optimizer_step", 0.0)) / step,
    }
    row = [numeric[name] for name in RUNTIME_NUMERIC]
    row += _ONE_HOT_ZEROS
    settings = (("gpu_family", case.gpu.family), ("method", spec.method), ("precision", spec.precision),
                ("gradient_checkpointing", spec.gradient_checkpointing), ("attention", spec.attention),
                ("sharding", spec.resolved_sharding(case.gpus)), ("offload", spec.offload))
    for name, value in settings:
        index = _ONE_HOT_INDEX.get(f"{name}={value}")
        if index is not None:
            row[index] = 1.0
    return row


def runtime_case_features(case: RuntimeCase) -> np.ndarray:
    """The feature vector of one case, in the order of :data:`RUNTIME_FEATURE_NAMES`."""
    return np.asarray(_case_row(case), dtype=np.float64)


def runtime_feature_matrix(cases: list[RuntimeCase]) -> np.ndarray:
    """Stack the feature vectors of ``cases`` into an ``(n, len(RUNTIME_FEATURE_NAMES))`` array."""
    if not cases:
        return np.empty((0, len(RUNTIME_FEATURE_NAMES)), dtype=np.float64)
    return np.asarray([_case_row(c) for c in cases], dtype=np.float64)
