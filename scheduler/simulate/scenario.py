"""Assemble a scenario (jobs, per-template predictions, truth) from one of the three job sources.

1. ``build_generated``: templates drawn by :mod:`scheduler.simulate.jobs` plus, with a share of the jobs,
   the dev reference runs themselves (their truth is their measurement); Poisson arrivals at an offered load.
2. ``build_from_trace``: arrival times, GPU counts and durations of trace jobs (Philly, Alibaba PAI). Each
   trace job is mapped onto a generated template with the same GPU count (``templates_per_gpu_count`` per
   count, one drawn uniformly per job); its tokens are set so that its *true* runtime on the
   cluster's workhorse pool (the pool with the most GPUs) equals the trace duration (the trace measured
   how long the job really ran). Trace jobs asking for more GPUs than any pool accepts, or of zero duration,
   are dropped and counted.
3. ``build_from_specs``: given TrainingSpecs (fixed GPU counts), arrivals given or Poisson.

A template is kept only when the analytic point prediction fits the largest GPU of the cluster: nobody
submits a job that no GPU in the cluster holds even by the optimistic estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from predictors.predict import predict
from predictors.reference import ReferenceRun
from predictors.runtime import job_tokens
from predictors.spec import TrainingSpec
from scheduler.placement import resolve_model_cached
from scheduler.pools import PoolsConfig
from scheduler.simulate.jobs import (
    NOMINAL_TRAIN_TOKENS,
    JobMix,
    JobTemplate,
    dedupe,
    draw_template,
    draw_train_tokens,
    poisson_arrivals,
)
from scheduler.simulate.table import TemplateTable, build_table
from scheduler.simulate.truth import ErrorModel, Truth, draw_truth

DEFAULT_LOAD = 0.7
DEFAULT_TEMPLATES = 300
DEFAULT_REFERENCE_SHARE = 0.2
_MAX_DRAWS = 2000


@dataclass(frozen=True)
class Scenario:
    mix: JobMix
    table: TemplateTable
    truth: Truth
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TraceJobs:
    """Jobs read from a cluster trace: arrival, GPUs and duration, in seconds."""

    name: str
    arrival_seconds: np.ndarray
    gpus: np.ndarray
    duration_seconds: np.ndarray
    notes: tuple[str, ...] = ()  # what the reader skipped, for the report


class ScenarioError(ValueError):
    """The inputs make no scenario (a trace with no job the cluster can run); the CLI shows it as an input error."""


class _Fits:
    """Does the point prediction of a template fit the cluster's largest GPU? (cached per template key)"""

    def __init__(self, pools: PoolsConfig) -> None:
        self.largest = max(pools.pools, key=lambda p: (p.gpu_spec.memory_bytes, p.max_job_gpus))
        self.max_job_gpus = max(p.max_job_gpus for p in pools.pools)
        self._seen: dict[str, bool] = {}

    def __call__(self, template: JobTemplate) -> bool:
        key = template.key
        if key not in self._seen:
            ok = template.gpus <= self.max_job_gpus
            if ok:
                model = resolve_model_cached(template.spec)
                pred = predict(template.spec, gpu_name=self.largest.gpu, gpus=template.gpus, model=model)
                ok = pred.vram.peak_vram_bytes <= self.largest.gpu_spec.memory_bytes
            self._seen[key] = ok
        return self._seen[key]


def _draw_fitting(rng: np.random.Generator, fits: _Fits, gpus: int | None = None) -> JobTemplate:
    for _ in range(_MAX_DRAWS):
        template = draw_template(rng, gpus)
        if fits(template):
            return template
    raise ScenarioError(f"no generated template with gpus={gpus} fits the cluster's largest GPU "
                     f"({fits.largest.gpu}) after {_MAX_DRAWS} draws")


def reference_templates(runs: Sequence[ReferenceRun], errors: ErrorModel) -> list[JobTemplate]:
    """The dev reference runs with a measured per-GPU peak, as templates (GPU unpinned, fixed GPU count)."""
    out: list[JobTemplate] = []
    for run in runs:
        if run.id not in errors.run_peak_log_ratio or not isinstance(run.spec.gpus, int):
            continue
        spec = run.spec.model_copy(update={"gpu": None, "train_tokens": NOMINAL_TRAIN_TOKENS, "steps": None,
                                           "deadline_seconds": None})
        out.append(JobTemplate(spec, reference_run=run.id))
    return out


def _finish(templates: Sequence[JobTemplate], index: np.ndarray, pools: PoolsConfig, errors: ErrorModel,
            seed: int) -> tuple[tuple[JobTemplate, ...], np.ndarray, TemplateTable, Truth]:
    distinct, mapping = dedupe(templates)
    table = build_table(distinct, pools)
    truth = draw_truth(table, distinct, errors, seed)
    return distinct, mapping[index], table, truth


def offered_gpu_seconds(table: TemplateTable, template_index: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """[j] GPU-seconds a job asks for: predicted runtime averaged over the pools its point peak fits,
    weighted by pool size (the demand the arrival rate is set against)."""
    fits = table.peak_vram_bytes <= table.memory_bytes[None, :]
    weight = np.where(fits, table.total_gpus[None, :], 0).astype(float)
    weight[weight.sum(axis=1) == 0] = table.total_gpus  # fits nowhere: plain average
    spt = np.where(np.isfinite(table.seconds_per_token), table.seconds_per_token, 0.0)
    mean_spt = (spt * weight).sum(axis=1) / weight.sum(axis=1)
    return tokens * mean_spt[template_index] * table.gpus[template_index]


def _rate_for_load(table: TemplateTable, index: np.ndarray, tokens: np.ndarray, load: float) -> float:
    demand = float(offered_gpu_seconds(table, index, tokens).mean())
    return load * float(table.total_gpus.sum()) / demand


def build_generated(n_jobs: int, pools: PoolsConfig, errors: ErrorModel, seed: int = 0,
                    load: float = DEFAULT_LOAD, n_templates: int = DEFAULT_TEMPLATES,
                    reference: Sequence[JobTemplate] = (),
                    reference_share: float = DEFAULT_REFERENCE_SHARE) -> Scenario:
    """The default mix: generated jobs (and reference runs) with Poisson arrivals at ``load``."""
    rng = np.random.default_rng(seed)
    fits = _Fits(pools)
    drawn = [_draw_fitting(rng, fits) for _ in range(n_templates)]
    refs = [t for t in reference if fits(t)] if reference_share > 0 else []
    templates = drawn + refs
    use_ref = rng.random(n_jobs) < (reference_share if refs else 0.0)
    index = np.where(use_ref, n_templates + rng.integers(max(len(refs), 1), size=n_jobs),
                     rng.integers(n_templates, size=n_jobs))
    tokens = draw_train_tokens(rng, n_jobs)
    distinct, index, table, truth = _finish(templates, index, pools, errors, seed)
    arrivals = poisson_arrivals(rng, n_jobs, _rate_for_load(table, index, tokens, load))
    notes = (f"{len(distinct)} distinct templates ({len(refs)} reference runs, {use_ref.mean():.0%} of jobs)",
             f"Poisson arrivals at offered load {load:.2f}")
    return Scenario(JobMix(distinct, index, arrivals, tokens, "generated"), table, truth, notes)


def build_from_trace(trace: TraceJobs, n_jobs: int | None, pools: PoolsConfig, errors: ErrorModel,
                     seed: int = 0, templates_per_gpu_count: int = 40) -> Scenario:
    """Trace-driven arrivals, GPU counts and durations, mapped onto generated templates."""
    rng = np.random.default_rng(seed)
    fits = _Fits(pools)
    arrivals, gpus, durations = _take(trace, n_jobs)
    too_big = gpus > fits.max_job_gpus
    zero = ~too_big & (durations <= 0)
    keep = ~too_big & ~zero
    if not keep.any():
        raise ScenarioError(f"none of the {gpus.size} trace jobs can run: {int(too_big.sum())} ask for more GPUs "
                            f"than any pool accepts (at most {fits.max_job_gpus}), {int(zero.sum())} have a zero "
                            "duration")
    arrivals, gpus, durations = arrivals[keep], gpus[keep], durations[keep]
    templates: list[JobTemplate] = []
    first: dict[int, int] = {}
    for g in sorted(set(gpus.tolist())):
        first[g] = len(templates)
        templates += [_draw_fitting(rng, fits, g) for _ in range(templates_per_gpu_count)]
    index = np.array([first[g] for g in gpus.tolist()], dtype=np.int64) + rng.integers(
        templates_per_gpu_count, size=gpus.size)
    distinct, index, table, truth = _finish(templates, index, pools, errors, seed)
    workhorse = int(np.argmax(table.total_gpus))
    # the trace measured how long each job really ran: that is its *true* runtime on the workhorse pool
    tokens = durations / (table.seconds_per_token[index, workhorse] * truth.runtime_factor[index])
    notes = (*trace.notes,
             f"trace {trace.name}: {arrivals.size} jobs ({int(too_big.sum())} dropped: more GPUs than any pool "
             f"accepts; {int(zero.sum())} dropped: zero duration)",
             f"durations are true runtimes on pool {table.pools[workhorse].name}",
             f"{len(distinct)} distinct templates")
    return Scenario(JobMix(distinct, index, arrivals - arrivals.min(), tokens, trace.name), table, truth, notes)


def _take(trace: TraceJobs, n_jobs: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first ``n_jobs`` by arrival; the trace repeats (shifted by its span) when it has fewer."""
    order = np.argsort(trace.arrival_seconds, kind="stable")
    arr, gpus, dur = trace.arrival_seconds[order], trace.gpus[order], trace.duration_seconds[order]
    arr = arr - arr[0] if arr.size else arr
    n = arr.size if n_jobs is None else n_jobs
    if arr.size == 0:
        raise ScenarioError(f"trace {trace.name} has no jobs")
    reps = -(-n // arr.size)
    span = float(arr[-1]) + 1.0
    tiled = np.concatenate([arr + k * span for k in range(reps)])[:n]
    return tiled, np.tile(gpus, reps)[:n].astype(np.int64), np.tile(dur, reps)[:n].astype(float)


def build_from_specs(specs: Sequence[TrainingSpec], arrival_seconds: Sequence[float | None], pools: PoolsConfig,
                     errors: ErrorModel, seed: int = 0, load: float = DEFAULT_LOAD) -> Scenario:
    """Given jobs. Tokens: ``train_tokens``, else ``steps`` x tokens per step; missing arrivals: Poisson."""
    rng = np.random.default_rng(seed)
    templates: list[JobTemplate] = []
    tokens = np.empty(len(specs))
    for j, spec in enumerate(specs):
        if not isinstance(spec.gpus, int):
            raise ValueError(f"job {j}: gpus must be a number for simulation; got {spec.gpus!r}")
        given = job_tokens(spec)  # the runtime model's own count (a pipeline keeps its depth in flight)
        tokens[j] = given if given is not None else float(draw_train_tokens(rng, 1)[0])
        templates.append(JobTemplate(spec.model_copy(update={"train_tokens": NOMINAL_TRAIN_TOKENS, "steps": None})))
    distinct, index, table, truth = _finish(templates, np.arange(len(specs)), pools, errors, seed)
    given = np.array([np.nan if a is None else a for a in arrival_seconds], dtype=float)
    if np.isnan(given).any():
        poisson = poisson_arrivals(rng, len(specs), _rate_for_load(table, index, tokens, load))
        given = np.where(np.isnan(given), poisson, given)
    order = np.argsort(given, kind="stable")
    mix = JobMix(distinct, index[order], given[order], tokens[order], "specs")
    return Scenario(mix, table, truth, (f"{len(specs)} given jobs, {len(distinct)} distinct templates",))
