"""The site stage of the VRAM residual: what the ledger's actuals of *this* cluster teach it (an offset per method
group, and the cluster's own upper-bound margin), how it is persisted and served, and ``vramfit train --ledger``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from predictors import persistence
from predictors.features import VramCase
from predictors.reference import parse_runs
from predictors.residual import MIN_SITE_ROWS, SITE_GROUP, ResidualVramRegressor, site_offsets
from predictors.residual_serving import SERVING_FORMAT_VERSION, SITE_FORMAT_VERSION, serving_state
from predictors.training import TrainingRow, case_for_run, training_rows
from scheduler.cli import main

REFERENCE_SOURCES = ("S02", "S07", "S11", "S17")
BIAS = 1.25  # this cluster's jobs peak 25 % above the analytic device peak (its framework, say)


@pytest.fixture(scope="module")
def dev_runs(dev_runs_path: Path) -> list:  # type: ignore[type-arg]
    return parse_runs(dev_runs_path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def reference_rows(dev_runs: list) -> list[TrainingRow]:  # type: ignore[type-arg]
    rows, _ = training_rows(dev_runs)
    return [r for r in rows if r.source in REFERENCE_SOURCES]


@pytest.fixture(scope="module")
def site_cases(dev_runs: list) -> list[VramCase]:  # type: ignore[type-arg]
    """The cluster's jobs: dev specs of other sources with a known GPU, as device-level (nvml) cases."""
    runs = [r for r in dev_runs if r.source not in REFERENCE_SOURCES and r.gpu != "unknown"
            and r.quality != "low" and not r.measured.oom]
    return [case_for_run(r, "nvml") for r in runs[::2]][:80]


def _actuals(cases: list[VramCase], bias: float, sigma: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    device = np.asarray([c.vram.peak_vram_bytes for c in cases], dtype=float)
    return device * bias * np.exp(rng.normal(0, sigma, len(cases)))


def _fit(reference: list[TrainingRow], site: list[VramCase], measured: np.ndarray, **params: object
         ) -> ResidualVramRegressor:
    model = ResidualVramRegressor(**params)  # type: ignore[arg-type]
    cases = [r.case for r in reference] + site
    y = [r.measured_bytes for r in reference] + list(measured)
    return model.fit(cases, y, groups=[r.source for r in reference] + [SITE_GROUP] * len(site))


def test_site_offsets_shrink_toward_the_pool_and_zero() -> None:
    excess = np.asarray([0.2] * 5 + [0.4] * 5)
    methods = np.asarray(["full"] * 5 + ["adapter"] * 5)
    offsets = site_offsets(excess, methods, prior_rows=5)
    pooled = 0.3 * 10 / 15  # the median 0.3, shrunk by 5 pseudo-rows of "no offset"
    assert offsets["full"] == pytest.approx(pooled + (0.2 - pooled) * 5 / 10)
    assert offsets["adapter"] == pytest.approx(pooled + (0.4 - pooled) * 5 / 10)
    only_full = site_offsets(excess[:5], methods[:5], prior_rows=5)
    assert only_full["adapter"] == pytest.approx(0.2 * 5 / 10)  # a group the cluster never ran: the pooled offset


def test_learns_a_clusters_bias_from_its_actuals(reference_rows: list[TrainingRow],
                                                 site_cases: list[VramCase]) -> None:
    ledger, new_jobs = site_cases[:50], site_cases[50:]
    model = _fit(reference_rows, ledger, _actuals(ledger, BIAS, 0.03, seed=0))
    assert model.site_figures_["rows"] == 50 and model.site_figures_["offset_used"]
    for offset in model.site_offsets_.values():
        assert offset == pytest.approx(math.log(BIAS), abs=0.04)
    assert model.site_figures_["held_out_median_ape_after"] < 0.05 < 0.15 < model.site_figures_[
        "held_out_median_ape_before"]
    # jobs the ledger never saw, from the same cluster
    measured = _actuals(new_jobs, BIAS, 0.03, seed=1)
    point, upper = model.predict_with_upper(new_jobs)
    analytic = np.asarray([c.vram.peak_vram_bytes for c in new_jobs], dtype=float)
    assert np.median(np.abs(analytic / measured - 1)) > 0.15
    assert np.median(np.abs(point / measured - 1)) < 0.05
    assert np.mean(upper >= measured) >= 0.9
    assert np.median(upper / measured - 1) < 0.15  # the cluster's own margin, not the reference sources'
    # the bound's cheap floor (placement skips GPU counts by it) stays below the bound
    for case, bound in zip(new_jobs, upper, strict=True):
        assert model.upper_floor_bytes(case.spec, case.vram.peak_vram_bytes, 0) <= bound * (1 + 1e-12)


def test_without_a_site_group_nothing_changes(reference_rows: list[TrainingRow], site_cases: list[VramCase]) -> None:
    ledger = site_cases[:40]
    measured = _actuals(ledger, BIAS, 0.03, seed=0)
    off = _fit(reference_rows, ledger, measured, site_group=None)
    assert off.site_offsets_ == {} and off.site_quantiles_ == {} and not off.corrects_point
    on = _fit(reference_rows, ledger, measured)
    assert on.corrects_point
    np.testing.assert_array_equal(on.calibration_scores_, off.calibration_scores_)  # the reference stage is shared


def test_too_few_actuals_fit_no_site_stage(reference_rows: list[TrainingRow], site_cases: list[VramCase]) -> None:
    ledger = site_cases[:MIN_SITE_ROWS - 1]
    model = _fit(reference_rows, ledger, _actuals(ledger, BIAS, 0.03, seed=0))
    assert model.site_figures_ == {"rows": MIN_SITE_ROWS - 1}
    assert model.site_offsets_ == {} and model.site_quantiles_ == {}


def test_margins_need_enough_actuals(reference_rows: list[TrainingRow], site_cases: list[VramCase]) -> None:
    """19 actuals calibrate a 95 % margin; a group with fewer takes the cluster's pooled margin (if it has
    MIN_SITE_ROWS), and with fewer than 19 in all the reference margin stays."""
    adapter = [c for c in site_cases if c.spec.method != "full"]
    full = [c for c in site_cases if c.spec.method == "full"]
    assert len(adapter) >= 20 and len(full) >= MIN_SITE_ROWS
    ledger = adapter[:20] + full[:MIN_SITE_ROWS]
    model = _fit(reference_rows, ledger, _actuals(ledger, BIAS, 0.03, seed=2))
    assert set(model.site_quantiles_) == {"full", "adapter"}
    few = adapter[:10]
    small = _fit(reference_rows, few, _actuals(few, BIAS, 0.03, seed=2))
    assert small.site_quantiles_ == {} and small.site_offsets_  # the offset alone: margins stay the reference's
    assert small._margin(few[0].spec) == small.class_quantiles_.get("adapter", small.quantile_)


def test_served_site_model_matches_the_estimator(tmp_path: Path, reference_rows: list[TrainingRow],
                                                 site_cases: list[VramCase]) -> None:
    ledger = site_cases[:40]
    model = _fit(reference_rows, ledger, _actuals(ledger, BIAS, 0.03, seed=0))
    params, _ = serving_state(model)  # type: ignore[misc]
    assert params["serving_format_version"] == SITE_FORMAT_VERSION and params["site_offsets_"]
    path = tmp_path / "site.skops"
    persistence.save_model(model, path, persistence.build_metadata(model_version="site-test"))
    served = persistence.load_model(path).model
    assert type(served).__name__ == "ServedVramModel"
    cases = site_cases + [r.case for r in reference_rows]
    for a, b in zip(served.predict_with_upper(cases), model.predict_with_upper(cases), strict=True):
        np.testing.assert_array_equal(a, b)
    plain = _fit(reference_rows, ledger, _actuals(ledger, BIAS, 0.03, seed=0), site_group=None)
    assert serving_state(plain)[0]["serving_format_version"] == SERVING_FORMAT_VERSION  # type: ignore[index]


def test_train_cli_with_ledger(tmp_path: Path, dev_runs: list, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[type-arg]
    reference = [r for r in dev_runs if r.source in REFERENCE_SOURCES]
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(r.model_dump_json() + "\n" for r in reference), encoding="utf-8")
    jobs = [r for r in dev_runs if r.source not in REFERENCE_SOURCES and r.gpu != "unknown"
            and r.quality != "low" and not r.measured.oom][::2][:30]
    rng = np.random.default_rng(0)
    ledger = tmp_path / "ledger.jsonl"
    with ledger.open("w", encoding="utf-8") as out:
        for i, run in enumerate(jobs):  # as `vramfit report --export` writes them
            device = case_for_run(run, "nvml").vram.peak_vram_bytes
            measured = run.measured.model_copy(update={"peak_bytes": int(device * BIAS * math.exp(rng.normal(0, 0.03))),
                                                       "metric": "nvml", "scope": "per_gpu"})
            out.write(run.model_copy(update={"id": f"ledger-{i}", "source_id": "vramfit_ledger",
                                             "quality": "high", "measured": measured}).model_dump_json() + "\n")
    model = tmp_path / "m.skops"
    assert main(["train", "--runs", str(runs), "--ledger", str(ledger), "--out", str(model), "--no-cv"]) == 0
    printed = capsys.readouterr().out
    assert "site stage: 30 ledger actuals; offsets full +" in printed and "held-out (5-fold) median APE" in printed
    meta = json.loads(model.with_suffix(".json").read_text())
    assert meta["site"]["rows"] == 30 and meta["site"]["offset_used"] is True
    assert "ledger" in meta["training_sources"] and meta["params"]["site_group"] == SITE_GROUP
    loaded = persistence.load_model(model).model
    assert loaded.site_offsets_ == pytest.approx(meta["site"]["offsets"])


def test_predict_loads_the_model_the_environment_names(tmp_path: Path, reference_rows: list[TrainingRow],
                                                        site_cases: list[VramCase],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """$VRAMFIT_RESIDUAL_MODEL: predict, place and serve apply this cluster's model instead of the shipped one."""
    from predictors.predict import predict

    ledger = site_cases[:40]
    model = _fit(reference_rows, ledger, _actuals(ledger, BIAS, 0.03, seed=0))
    path = tmp_path / "cluster.skops"
    persistence.save_model(model, path, persistence.build_metadata(model_version="residual-cluster"))
    job = site_cases[-1]
    monkeypatch.setenv(persistence.MODEL_ENV, str(path))
    persistence.load_default_model.cache_clear()
    try:
        ours = predict(job.spec, gpu_name=job.gpu.name if job.gpu else None)
        assert ours.model_version == "residual-cluster"
        assert ours.vram.peak_vram_bytes == pytest.approx(
            predict(job.spec, gpu_name=job.gpu.name if job.gpu else None, residual=False).vram.peak_vram_bytes
            * math.exp(model.site_offsets_["full" if job.spec.method == "full" else "adapter"]), rel=1e-6)
        monkeypatch.setenv(persistence.MODEL_ENV, str(tmp_path / "missing.skops"))
        persistence.load_default_model.cache_clear()
        with pytest.warns(RuntimeWarning, match=f"what \\${persistence.MODEL_ENV} names"):
            assert persistence.load_default_model() is None
    finally:
        monkeypatch.delenv(persistence.MODEL_ENV)
        persistence.load_default_model.cache_clear()
    assert persistence.default_model_path() == persistence.shipped_model_path()
