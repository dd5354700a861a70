"""Training data for the residual model, and its honest evaluation (in-sample and leave-one-source-out).

Which measured runs become training rows:

* quality ``high``/``medium`` with a measured peak: yes (``low`` runs are doubted by their own notes);
* ``scope: total_all_gpus`` (S14 multi-GPU sums over symmetric data-parallel ranks): the peak divided
  by the job's GPUs is used for training; evaluation figures use per-GPU runs only, like
  ``vramfit evaluate``;
* out-of-memory runs: not used for training (their peak is only a lower bound); the evaluation checks
  that the corrected device peak exceeds the card.

Pure: takes parsed runs, returns rows, fitted models and figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from predictors.accuracy import ape_summary
from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.features import VramCase
from predictors.hardware import lookup_gpu
from predictors.predict import DEFAULT_UPPER_MARGIN
from predictors.reference import ReferenceRun
from predictors.residual import ResidualVramRegressor
from predictors.vram import colocated_engine_bytes, predict_vram


class _FromSource(Protocol):
    @property
    def source(self) -> str: ...


R = TypeVar("R", bound=_FromSource)
M = TypeVar("M")
S = TypeVar("S")

DEFAULT_QUALITIES: frozenset[str] = frozenset({"high", "medium"})


@dataclass(frozen=True)
class TrainingRow:
    """One measured run as the residual model sees it."""

    run_id: str
    source: str
    case: VramCase
    measured_bytes: float  # per GPU
    per_gpu_scope: bool  # False: derived from a total over all GPUs (training only)


def case_for_run(run: ReferenceRun, metric: str | None = None) -> VramCase:
    """The analytic prediction of a run, packaged for the residual model."""
    resolved = resolve_model(run.spec)
    gpu = lookup_gpu(run.gpu) if run.gpu != "unknown" else None
    vram = predict_vram(run.spec, resolved.architecture, gpu, params_override=resolved.params_override,
                        teacher=resolved.teacher_architecture, critic=resolved.critic_architecture)
    return VramCase(spec=run.spec, architecture=resolved.architecture, gpu=gpu,
                    metric=metric or run.measured.metric, vram=vram)


def training_rows(runs: Iterable[ReferenceRun], qualities: Iterable[str] = DEFAULT_QUALITIES,
                  ) -> tuple[list[TrainingRow], list[tuple[str, str]]]:
    """Rows usable for training, and ``(run id, reason)`` for every run left out."""
    wanted = set(qualities)
    rows: list[TrainingRow] = []
    skipped: list[tuple[str, str]] = []
    for run in runs:
        if run.quality not in wanted:
            skipped.append((run.id, f"quality {run.quality}"))
            continue
        if run.measured.oom or not run.measured.peak_bytes:
            skipped.append((run.id, "out of memory (a lower bound only)" if run.measured.oom else "no peak"))
            continue
        try:
            case = case_for_run(run)
        except SpecError as exc:
            skipped.append((run.id, str(exc)))
            continue
        per_gpu = run.measured.scope == "per_gpu"
        measured = run.measured.peak_bytes / (1 if per_gpu else max(case.vram.gpus, 1))
        # a colocated inference engine's share is a setting, not learned: off the measured peak, as the analytic
        # case leaves it out (serving adds it back after the correction)
        measured -= colocated_engine_bytes(run.spec, case.gpu)
        if measured <= 0:
            skipped.append((run.id, "the measured peak is no more than the colocated engine's share of the GPU"))
            continue
        rows.append(TrainingRow(run.id, run.source, case, float(measured), per_gpu))
    return rows, skipped


def fit_residual(rows: Sequence[TrainingRow], **params: Any) -> ResidualVramRegressor:
    """Fit a :class:`ResidualVramRegressor` on ``rows``, calibrated leave-one-source-out."""
    model = ResidualVramRegressor(**params)
    return model.fit([r.case for r in rows], [r.measured_bytes for r in rows], groups=[r.source for r in rows])


@dataclass(frozen=True)
class ScoredRow:
    row: TrainingRow
    analytic_bytes: float
    predicted_bytes: float
    upper_bytes: float


def score_rows(model: ResidualVramRegressor, rows: Sequence[TrainingRow]) -> list[ScoredRow]:
    if not rows:
        return []
    point, upper = model.predict_with_upper([r.case for r in rows])
    return [ScoredRow(r, float(r.case.level_bytes), float(p), float(u))
            for r, p, u in zip(rows, point, upper, strict=True)]


def bound_summary(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """Coverage (share of measured <= upper) and slack ((upper - measured) / measured) of a bound."""
    if not pairs:
        return {"coverage": math.nan, "median_slack": math.nan, "p90_slack": math.nan}
    slack = np.asarray([(u - m) / m for u, m in pairs])
    return {
        "coverage": float(np.mean(slack >= 0)),
        "median_slack": float(np.median(slack)),
        "p90_slack": float(np.quantile(slack, 0.9)),
    }


def summarize(scored: Sequence[ScoredRow]) -> dict[str, dict[str, float]]:
    """Analytic and analytic+residual figures over per-GPU rows: APE summaries and upper-bound coverage."""
    per_gpu = [s for s in scored if s.row.per_gpu_scope]
    analytic = ape_summary((s.analytic_bytes, s.row.measured_bytes) for s in per_gpu)
    residual = ape_summary((s.predicted_bytes, s.row.measured_bytes) for s in per_gpu)
    analytic.update(bound_summary([(s.analytic_bytes * (1 + DEFAULT_UPPER_MARGIN), s.row.measured_bytes)
                                    for s in per_gpu]))
    residual.update(bound_summary([(s.upper_bytes, s.row.measured_bytes) for s in per_gpu]))
    return {"analytic": analytic, "residual": residual}


def leave_one_source_out(rows: Sequence[TrainingRow], **params: Any) -> list[ScoredRow]:
    """Predict every source's rows with a model fitted (and calibrated) on all the other sources."""
    return predict_each_source_held_out(rows, lambda train: fit_residual(train, **params), score_rows)


def predict_each_source_held_out(rows: Sequence[R], fit: Callable[[list[R]], M],
                                 score: Callable[[M, list[R]], list[S]]) -> list[S]:
    """``score(fit(other sources' rows), one source's rows)`` for every source of ``rows`` (rows with a
    ``source``), concatenated in source order."""
    scored: list[S] = []
    for source in sorted({r.source for r in rows}):
        train = [r for r in rows if r.source != source]
        held = [r for r in rows if r.source == source]
        scored += score(fit(train), held)
    return scored
