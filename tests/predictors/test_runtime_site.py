"""The site stage of the runtime residual: this cluster's finished jobs (the ledger's throughput, work over
measured runtime) teach it the cluster's own throughput offset and runtime margin; persisted, served, and
printed by ``vramfit train --ledger --runtime-out``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from predictors import persistence
from predictors.catalog import resolve_model
from predictors.hardware import lookup_gpu
from predictors.reference import ReferenceRun, parse_runs
from predictors.residual import MIN_SITE_ROWS, SITE_GROUP
from predictors.residual_serving import SITE_FORMAT_VERSION, serving_state
from predictors.runtime import predict_runtime
from predictors.runtime_residual import ResidualRuntimeRegressor
from predictors.runtime_training import (
    DEFAULT_RUNTIME_PARAMS,
    RuntimeTrainingRow,
    runtime_training_rows,
)
from scheduler.cli import main

SLOWER = 0.7  # this cluster's jobs reach 70 % of the analytic throughput (start-up, data loading, its network)


@pytest.fixture(scope="module")
def dev_runs(dev_runs_path: Path) -> list[ReferenceRun]:
    return parse_runs(dev_runs_path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def reference_rows(dev_runs: list[ReferenceRun]) -> list[RuntimeTrainingRow]:
    return runtime_training_rows(dev_runs)[0]


def _cluster_jobs(dev_runs: list[ReferenceRun], ratio: float, sigma: float, seed: int,
                  stragglers: bool = False) -> list[ReferenceRun]:
    """Dev specs on a known GPU as this cluster's finished jobs, as ``vramfit report --export`` writes them:
    per-job tokens/s = analytic x ``ratio`` x log-normal noise (``stragglers``: only ever slower, a one-sided
    half-normal slowdown, as restarts and slow nodes make it)."""
    rng = np.random.default_rng(seed)
    jobs = [r for r in dev_runs if r.gpu != "unknown" and r.quality != "low" and not r.measured.oom][::2]
    out = []
    for i, run in enumerate(jobs[:90]):
        resolved = resolve_model(run.spec)
        gpus = run.spec.gpus if isinstance(run.spec.gpus, int) else 1
        analytic = predict_runtime(run.spec, resolved.architecture, lookup_gpu(run.gpu), gpus=gpus,
                                   params_override=resolved.params_override).tokens_per_second
        noise = -abs(rng.normal(0, sigma)) if stragglers else rng.normal(0, sigma)
        tokens_per_second = analytic * ratio * math.exp(noise)
        measured = run.measured.model_copy(update={"tokens_per_second": tokens_per_second,
                                                   "tokens_per_second_scope": "per_job"})
        out.append(run.model_copy(update={"id": f"ledger-{i}", "source_id": f"{SITE_GROUP}_vramfit_ledger",
                                          "quality": "high", "measured": measured}))
    return out


def _fit(reference: list[RuntimeTrainingRow], site: list[RuntimeTrainingRow], **params: object
         ) -> ResidualRuntimeRegressor:
    model = ResidualRuntimeRegressor(**{**DEFAULT_RUNTIME_PARAMS, **params})  # type: ignore[arg-type]
    rows = [*reference, *site]
    return model.fit([r.case for r in rows], [r.measured_tokens_per_second for r in rows],
                     groups=[r.source for r in rows])


def test_learns_a_clusters_throughput_from_its_finished_jobs(dev_runs: list[ReferenceRun],
                                                             reference_rows: list[RuntimeTrainingRow]) -> None:
    site = runtime_training_rows(_cluster_jobs(dev_runs, SLOWER, 0.05, seed=0))[0]
    assert {r.source for r in site} == {SITE_GROUP} and len(site) >= 80
    ledger, later = site[:50], site[50:]
    model = _fit(reference_rows, ledger)
    assert model.site_figures_["rows"] == 50 and model.site_figures_["offset_used"]
    for offset in model.site_offsets_.values():
        assert offset == pytest.approx(math.log(SLOWER), abs=0.05)
    measured = np.asarray([r.measured_tokens_per_second for r in later])
    analytic = np.asarray([r.case.analytic_tokens_per_second for r in later])
    point, lower = model.predict_with_lower([r.case for r in later])
    assert np.median(np.abs(analytic / measured - 1)) > 0.3
    assert np.median(np.abs(point / measured - 1)) < 0.06
    # the runtime bound (work / lower throughput) holds for the later jobs at about the target coverage
    assert np.mean(lower <= measured) >= 0.85
    assert np.median(measured / lower - 1) < 0.25  # the cluster's own margin, not the reference sources' wide one


def test_the_runtime_margin_covers_slow_stragglers(dev_runs: list[ReferenceRun],
                                                  reference_rows: list[RuntimeTrainingRow]) -> None:
    """The runtime bound is one-sided against *slower* jobs: with stragglers (only ever slower than the
    cluster's typical job) the site margin must cover the slow tail of later jobs, so it is the quantile of
    how much slower than predicted the held-out jobs ran (a margin on the faster side would cover ~half)."""
    site = runtime_training_rows(_cluster_jobs(dev_runs, SLOWER, 0.3, seed=3, stragglers=True))[0]
    ledger, later = site[:60], site[60:]
    model = _fit(reference_rows, ledger)
    assert model.site_quantiles_ and all(q > 0 for q in model.site_quantiles_.values())
    measured = np.asarray([r.measured_tokens_per_second for r in later])
    _, lower = model.predict_with_lower([r.case for r in later])
    assert np.mean(lower <= measured) >= 0.85  # the runtime bound (work / lower) holds for the stragglers too


def test_too_few_finished_jobs_fit_no_site_stage(dev_runs: list[ReferenceRun],
                                                 reference_rows: list[RuntimeTrainingRow]) -> None:
    site = runtime_training_rows(_cluster_jobs(dev_runs, SLOWER, 0.05, seed=0))[0][:MIN_SITE_ROWS - 1]
    model = _fit(reference_rows, site)
    assert model.site_figures_ == {"rows": MIN_SITE_ROWS - 1}
    assert model.site_offsets_ == {} and model.site_quantiles_ == {}


def test_served_runtime_site_model_matches_the_estimator(tmp_path: Path, dev_runs: list[ReferenceRun],
                                                         reference_rows: list[RuntimeTrainingRow]) -> None:
    site = runtime_training_rows(_cluster_jobs(dev_runs, SLOWER, 0.05, seed=0))[0][:40]
    model = _fit(reference_rows, site)
    params, _ = serving_state(model)  # type: ignore[misc]
    assert params["serving_format_version"] == SITE_FORMAT_VERSION and params["site_offsets_"]
    path = tmp_path / "runtime-site.skops"
    persistence.save_model(model, path, persistence.build_runtime_metadata(model_version="runtime-site-test"))
    served = persistence.load_model(path, persistence.check_runtime_compatible).model
    assert type(served).__name__ == "ServedRuntimeModel"
    cases = [r.case for r in [*site, *reference_rows]]
    for a, b in zip(served.predict_with_lower(cases), model.predict_with_lower(cases), strict=True):
        np.testing.assert_array_equal(a, b)


def test_train_cli_fits_the_runtime_site_stage_from_the_ledger(tmp_path: Path, dev_runs: list[ReferenceRun],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(r.model_dump_json() + "\n" for r in dev_runs), encoding="utf-8")
    jobs = _cluster_jobs(dev_runs, SLOWER, 0.05, seed=1)[:30]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(j.model_copy(update={"source_id": "vramfit_ledger"}).model_dump_json() + "\n"
                              for j in jobs), encoding="utf-8")
    vram, runtime = tmp_path / "m.skops", tmp_path / "rt.skops"
    assert main(["train", "--runs", str(runs), "--ledger", str(ledger), "--out", str(vram),
                 "--runtime-out", str(runtime), "--no-cv"]) == 0
    printed = capsys.readouterr().out
    assert "site stage: 30 ledger actuals; throughput offsets" in printed
    meta = json.loads(runtime.with_suffix(".json").read_text())
    assert meta["site"]["rows"] == 30 and meta["site"]["offset_used"] is True
    assert all(v == pytest.approx(math.log(SLOWER), abs=0.08) for v in meta["site"]["offsets"].values())
    assert "ledger" in meta["training_sources"]


def test_place_prices_jobs_by_the_clusters_runtime_model(tmp_path: Path, dev_runs: list[ReferenceRun],
                                                         reference_rows: list[RuntimeTrainingRow],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """$VRAMFIT_RUNTIME_RESIDUAL_MODEL: predict and place take runtime (and so cost per job) from this cluster's
    model: a cluster whose jobs reach 70 % of the analytic throughput gets runtimes and costs ~1 / 0.7 longer."""
    from predictors.predict import predict
    from predictors.spec import TrainingSpec
    from scheduler.placement import clear_prediction_cache, place
    from scheduler.pools import default_pools

    site = runtime_training_rows(_cluster_jobs(dev_runs, SLOWER, 0.02, seed=0))[0][:40]
    model = _fit(reference_rows, site)
    path = tmp_path / "cluster-runtime.skops"
    persistence.save_model(model, path, persistence.build_runtime_metadata(model_version="runtime-cluster"))
    spec = TrainingSpec.model_validate({"model": "llama-3.1-8b", "method": "lora", "micro_batch_size": 2,
                                        "seq_len": 2048, "train_tokens": 2e8})
    shipped = predict(spec, gpu_name="A100-80GB")
    before = place(spec, default_pools(), suggest=False)
    monkeypatch.setenv(persistence.RUNTIME_MODEL_ENV, str(path))
    persistence.load_default_runtime_model.cache_clear()
    clear_prediction_cache()
    try:
        ours = predict(spec, gpu_name="A100-80GB")
        assert ours.runtime_model_version == "runtime-cluster"
        assert ours.runtime_seconds == pytest.approx(
            shipped.runtime_seconds / math.exp(model.site_offsets_["adapter"]), rel=1e-6)
        assert ours.runtime_seconds > 1.35 * shipped.runtime_seconds
        after = place(spec, default_pools(), suggest=False)
        assert after.chosen is not None and before.chosen is not None
        assert after.chosen.pool.name == before.chosen.pool.name  # every pool's runtime grows by the same factor
        assert after.chosen.cost_usd == pytest.approx(before.chosen.cost_usd / math.exp(model.site_offsets_["adapter"]),
                                                      rel=1e-6)
    finally:
        monkeypatch.delenv(persistence.RUNTIME_MODEL_ENV)
        persistence.load_default_runtime_model.cache_clear()
        clear_prediction_cache()
