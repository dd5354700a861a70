"""Runtime accuracy on reference runs that report a training throughput (``measured.tokens_per_second``).

Pure: takes parsed :class:`~predictors.reference.ReferenceRun` rows, returns per-run errors and the
summary (median and p90 absolute percentage error of tokens/s). ``per_gpu`` throughputs are compared
with the job's predicted tokens/s divided by its GPU count; ``per_job`` with the job's tokens/s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from predictors.catalog import ResolvedModel, resolve_model
from predictors.errors import SpecError
from predictors.hardware import GpuSpec, lookup_gpu
from predictors.reference import ReferenceRun
from predictors.runtime import RuntimePrediction, predict_runtime


@dataclass(frozen=True)
class RuntimeError_:
    """One run: measured and predicted tokens/s in the run's scope."""

    run_id: str
    gpu: str
    scope: str
    measured_tokens_per_second: float
    predicted_tokens_per_second: float

    @property
    def error(self) -> float:
        """Signed relative error of the predicted tokens/s (> 0: predicted faster than measured)."""
        return self.predicted_tokens_per_second / self.measured_tokens_per_second - 1

    @property
    def ape(self) -> float:
        return abs(self.error)


@dataclass(frozen=True)
class RuntimeAccuracy:
    rows: tuple[RuntimeError_, ...]
    skipped: tuple[str, ...]
    scope_corrected: tuple[str, ...] = ()

    def _apes(self, scope: str | None = None) -> np.ndarray:
        return np.array([r.ape for r in self.rows if scope is None or r.scope == scope], dtype=float)

    def median_ape(self, scope: str | None = None) -> float | None:
        apes = self._apes(scope)
        return float(np.median(apes)) if apes.size else None

    def p90_ape(self, scope: str | None = None) -> float | None:
        apes = self._apes(scope)
        return float(np.percentile(apes, 90)) if apes.size else None

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {"runs": len(self.rows), "skipped": list(self.skipped),
                                  "scope_corrected": list(self.scope_corrected),
                                  "median_ape": self.median_ape(), "p90_ape": self.p90_ape()}
        for scope in ("per_gpu", "per_job"):
            out[scope] = {"runs": int(self._apes(scope).size), "median_ape": self.median_ape(scope),
                          "p90_ape": self.p90_ape(scope)}
        return out


@dataclass(frozen=True)
class RuntimeMeasurement:
    """One run with a measured throughput, its analytic runtime prediction and the scope they compare in."""

    run: ReferenceRun
    gpu: GpuSpec
    gpus: int
    scope: str  # per_gpu or per_job (after the implausible per-GPU claims are corrected)
    measured_tokens_per_second: float  # as reported, in ``scope``
    prediction: RuntimePrediction
    model: ResolvedModel

    @property
    def measured_job_tokens_per_second(self) -> float:
        """The measurement as a throughput of the whole job (per-GPU figures times the GPU count)."""
        return self.measured_tokens_per_second * (self.gpus if self.scope == "per_gpu" else 1)

    @property
    def predicted_tokens_per_second(self) -> float:
        """The analytic prediction in the measurement's scope."""
        job = self.prediction.tokens_per_second
        return job / self.gpus if self.scope == "per_gpu" else job


def runtime_measurements(runs: Iterable[ReferenceRun]) -> tuple[list[RuntimeMeasurement], list[str], list[str]]:
    """Every run with a throughput and a known GPU, predicted analytically; ``(measurements, skipped,
    scope_corrected)`` with a reason per skipped or corrected run."""
    out: list[RuntimeMeasurement] = []
    skipped: list[str] = []
    corrected: list[str] = []
    cache: dict[str, ResolvedModel] = {}
    for run in runs:
        measured = run.measured.tokens_per_second
        if measured is None:
            continue
        if run.gpu == "unknown":
            skipped.append(f"{run.id}: GPU unknown")
            continue
        try:
            gpu = lookup_gpu(run.gpu)
            key = run.spec.model_dump_json(include={"model", "teacher_model", "critic_model"})
            model = cache.get(key) or resolve_model(run.spec)
            cache[key] = model
        except SpecError as exc:
            skipped.append(f"{run.id}: {exc}")
            continue
        gpus = run.spec.gpus if isinstance(run.spec.gpus, int) else 1
        pred = predict_runtime(run.spec, model.architecture, gpu, gpus=gpus, params_override=model.params_override,
                               teacher=model.teacher_architecture, critic=model.critic_architecture)
        scope = run.measured.tokens_per_second_scope or "per_gpu"
        if scope == "per_gpu" and gpus > 1 and _implied_utilization(measured, pred.flops_per_token, gpu,
                                                                    run.spec.precision) > 1.0:
            # a per-GPU figure that would need more than the GPU's dense peak can only be per job
            scope = "per_job"
            corrected.append(f"{run.id}: per_gpu tokens/s implies > 100 % of peak; compared as per_job")
        out.append(RuntimeMeasurement(run, gpu, gpus, scope, measured, pred, model))
    return out, skipped, corrected


def evaluate_runtime(runs: Iterable[ReferenceRun]) -> RuntimeAccuracy:
    """Compare predicted with measured tokens/s on every run that has a throughput and a known GPU."""
    measurements, skipped, corrected = runtime_measurements(runs)
    rows = [RuntimeError_(m.run.id, m.gpu.name, m.scope, m.measured_tokens_per_second, m.predicted_tokens_per_second)
            for m in measurements]
    return RuntimeAccuracy(tuple(rows), tuple(skipped), tuple(corrected))


def _implied_utilization(tokens_per_second: float, flops_per_token: float, gpu: GpuSpec, precision: str) -> float:
    """Fraction of the dense peak that a per-GPU throughput claim needs (model FLOPs, no recomputation); an fp32
    job's against the TF32 peak, which it reaches with TF32 on whether or not its spec says so."""
    return tokens_per_second * flops_per_token / gpu.dense_flops(precision, tf32=True)
