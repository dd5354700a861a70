"""Runtime residual: features, scikit-learn contract, shrinkage, conformal runtime bound, persistence,
fallback, predict fields, CLI (train --runtime-out, evaluate), leave-one-source-out."""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.neighbors import KNeighborsRegressor

import predictors.predict as predict_module
from predictors import persistence
from predictors.catalog import resolve_model
from predictors.hardware import lookup_gpu
from predictors.predict import predict
from predictors.reference import parse_runs
from predictors.runtime import predict_runtime
from predictors.runtime_features import (
    RUNTIME_FEATURE_NAMES,
    RUNTIME_NUMERIC,
    RuntimeCase,
    runtime_case_features,
    runtime_feature_schema_sha256,
)
from predictors.runtime_residual import DEFAULT_RUNTIME_UPPER_MARGIN, ResidualRuntimeRegressor
from predictors.runtime_training import (
    RuntimeTrainingRow,
    fit_runtime_residual,
    runtime_leave_one_source_out,
    runtime_training_rows,
    score_runtime_rows,
    summarize_runtime,
)
from predictors.spec import TrainingSpec
from scheduler.cli import main

DEV_RUNS = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "runs-dev.jsonl"
needs_dev = pytest.mark.skipif(not DEV_RUNS.exists(), reason="shared/reference/runs-dev.jsonl not found")
# sources of the dev runs with a throughput that are small enough for CLI tests
SMALL_SOURCES = ("S02", "S06", "S17")
RunsSubset = Callable[[Iterable[str]], Path]  # the runs_subset fixture (tests/conftest.py)


def _case(model: str, method: str, gpu: str, seq_len: int, gpus: int = 1, **extra: object) -> RuntimeCase:
    spec = TrainingSpec.model_validate({"model": model, "method": method, "micro_batch_size": 2, "seq_len": seq_len,
                                        "gpus": gpus, "gpu": gpu, "train_tokens": 1.0e8, **extra})
    arch = resolve_model(spec).architecture
    gpu_spec = lookup_gpu(gpu)
    return RuntimeCase(spec, arch, gpu_spec, gpus, predict_runtime(spec, arch, gpu_spec, gpus=gpus))


GRID = list(itertools.product(("llama-3.2-1b", "llama-3.1-8b"), ("lora", "full"),
                              ("RTX-4090", "A100-80GB", "H100-80GB"), (512, 1024, 2048)))


@pytest.fixture(scope="module")
def cases() -> list[RuntimeCase]:
    return [_case(model, method, gpu, seq) for model, method, gpu, seq in GRID]


def _family_effect(cases: list[RuntimeCase], ratio_off_ampere: float, seed: int = 0, noise: float = 0.02
                   ) -> np.ndarray:
    """Measured tokens/s: analytic x ``ratio_off_ampere`` on Ada and Hopper GPUs (two thirds of the grid), x 1
    on Ampere, with log-normal noise."""
    rng = np.random.default_rng(seed)
    ratio = np.asarray([1.0 if c.gpu.family == "ampere" else ratio_off_ampere for c in cases])
    return np.asarray([c.analytic_tokens_per_second for c in cases]) * ratio * np.exp(rng.normal(0, noise, len(cases)))


# ---- features -----------------------------------------------------------------------------------------
def test_features_numeric_first_and_one_hot(cases: list[RuntimeCase]) -> None:
    row = runtime_case_features(cases[0])
    assert row.shape == (len(RUNTIME_FEATURE_NAMES),)
    assert RUNTIME_FEATURE_NAMES[: len(RUNTIME_NUMERIC)] == RUNTIME_NUMERIC
    one_hot = dict(zip(RUNTIME_FEATURE_NAMES, row, strict=True))
    assert one_hot["gpu_family=ada"] == 1.0 and one_hot["gpu_family=hopper"] == 0.0
    assert one_hot["method=lora"] == 1.0 and one_hot["method=full"] == 0.0
    # every setting sets exactly one of its columns
    for setting in ("gpu_family", "method", "precision", "gradient_checkpointing", "attention", "sharding"):
        assert sum(v for k, v in one_hot.items() if k.startswith(setting + "=")) == 1.0
    assert len(runtime_feature_schema_sha256()) == 64


# ---- estimator ----------------------------------------------------------------------------------------
def test_sklearn_contract(cases: list[RuntimeCase]) -> None:
    est = ResidualRuntimeRegressor(coverage=0.8, distance_weight=0.0)
    params = est.get_params()
    assert params["coverage"] == 0.8 and params["regressor"] is None
    twin = clone(est)
    assert twin.get_params() == params and twin is not est
    with pytest.raises(NotFittedError):
        est.predict(cases[:2])
    fitted = est.fit(cases, _family_effect(cases, 1.0))
    assert fitted is est and hasattr(est, "regressor_") and not hasattr(clone(est), "regressor_")
    with pytest.raises(ValueError, match="positive"):
        clone(est).fit(cases, -_family_effect(cases, 1.0))


def test_learns_a_family_effect_that_holds_in_every_source(cases: list[RuntimeCase]) -> None:
    """The shrinkage minimises the median error: an effect on most runs is kept (one on a minority of the runs
    would not be, whatever it does to them)."""
    groups = [f"src{i % 3}" for i in range(len(cases))]  # the effect is the same in every source
    model = ResidualRuntimeRegressor(distance_weight=0.0).fit(cases, _family_effect(cases, 1.6), groups=groups)
    assert model.alpha_ > 0.5
    ratio = model.predict(cases) / np.asarray([c.analytic_tokens_per_second for c in cases])
    ampere = np.asarray([c.gpu.family == "ampere" for c in cases])
    assert ratio[~ampere].min() > 1.3 and np.all(np.abs(ratio[ampere] - 1) < 0.15)


def test_shrinks_to_analytic_when_sources_disagree(cases: list[RuntimeCase]) -> None:
    """Ada and Hopper run 2x faster than analytic in one source, 2x slower in the other: nothing carries over."""
    groups = ["fast" if i % 2 else "slow" for i in range(len(cases))]
    measured = np.asarray([c.analytic_tokens_per_second * ((2.0 if g == "fast" else 0.5) if c.gpu.family != "ampere"
                                                           else 1.0) for c, g in zip(cases, groups, strict=True)])
    model = ResidualRuntimeRegressor().fit(cases, measured, groups=groups)
    assert model.alpha_ == 0.0
    np.testing.assert_allclose(model.predict(cases), [c.analytic_tokens_per_second for c in cases])


def test_lower_bound_below_point_and_coverage_on_noise(cases: list[RuntimeCase]) -> None:
    many = cases * 3
    model = ResidualRuntimeRegressor(coverage=0.9, distance_weight=0.0, shrinkage=0.0)
    model.fit(many, _family_effect(many, 1.0, seed=1, noise=0.1))
    point, lower = model.predict_with_lower(many)
    assert np.all(lower <= point)
    fresh = _family_effect(many, 1.0, seed=2, noise=0.1)
    covered = float(np.mean(fresh >= lower))
    assert 0.83 <= covered <= 0.98


def test_fast_linear_path_matches_regressor(cases: list[RuntimeCase]) -> None:
    from predictors.runtime_features import runtime_feature_matrix
    from predictors.runtime_residual import scale_features

    model = ResidualRuntimeRegressor(shrinkage=1.0).fit(cases, _family_effect(cases, 1.4))
    assert model.linear_ is not None
    features = runtime_feature_matrix(cases)
    np.testing.assert_allclose(model.log_correction(features),
                               model.regressor_.predict(scale_features(features, model.scaling_)), atol=1e-12)


def test_any_regressor_works(cases: list[RuntimeCase]) -> None:
    model = ResidualRuntimeRegressor(regressor=KNeighborsRegressor(n_neighbors=3), shrinkage=1.0)
    model.fit(cases, _family_effect(cases, 1.4))
    assert model.linear_ is None and np.all(np.isfinite(model.predict(cases)))


def test_far_from_training_data_widens_the_bound(cases: list[RuntimeCase]) -> None:
    model = ResidualRuntimeRegressor(shrinkage=0.0).fit(cases, _family_effect(cases, 1.0, noise=0.1))
    near = _case("llama-3.1-8b", "lora", "A100-80GB", 1024)
    far = _case("llama-3.1-70b", "full", "V100-32GB", 4096, gpus=64, sharding="fsdp", precision="16-mixed")
    (near_point,), (near_lower,) = model.predict_with_lower([near])
    (far_point,), (far_lower,) = model.predict_with_lower([far])
    assert far_lower / far_point < near_lower / near_point


# ---- persistence and fallback --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_model(cases: list[RuntimeCase]) -> ResidualRuntimeRegressor:
    return ResidualRuntimeRegressor(shrinkage=1.0).fit(cases, _family_effect(cases, 1.4))


def test_skops_round_trip(tmp_path: Path, small_model: ResidualRuntimeRegressor, cases: list[RuntimeCase]) -> None:
    path = tmp_path / "rt.skops"
    persistence.save_model(small_model, path, persistence.build_runtime_metadata(model_version="rt-test"))
    loaded = persistence.load_model(path, persistence.check_runtime_compatible)
    np.testing.assert_allclose(loaded.model.predict_lower(cases), small_model.predict_lower(cases))
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["model_version"] == "rt-test" and meta["model_kind"] == persistence.RUNTIME_MODEL_KIND
    # a runtime file is not a VRAM residual, and the other way round
    with pytest.raises(persistence.IncompatibleModel):
        persistence.load_model(path)
    with pytest.raises(persistence.IncompatibleModel, match="not a runtime residual"):
        persistence.check_runtime_compatible(persistence.build_metadata())


def test_missing_or_incompatible_runtime_model_falls_back(tmp_path: Path, small_model: ResidualRuntimeRegressor,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    old = tmp_path / "old.skops"
    persistence.save_model(small_model, old, {**persistence.build_runtime_metadata(),
                                              "analytic_fingerprint": "0" * 64})
    spec = TrainingSpec.model_validate({"model": "llama-3.1-8b", "method": "lora", "gpu": "A100-80GB",
                                        "train_tokens": 1.0e9})
    try:
        for path, message in ((old, "different version of the analytic runtime model"),
                              (tmp_path / "missing.skops", "missing")):
            monkeypatch.setattr(persistence, "default_runtime_model_path", lambda p=path: p)
            persistence.load_default_runtime_model.cache_clear()
            with pytest.warns(RuntimeWarning, match=message):
                assert persistence.load_default_runtime_model() is None
            out = predict(spec).to_dict()
            assert "runtime_model_version" not in out and "runtime_correction_ratio" not in out
            margin = 1 + DEFAULT_RUNTIME_UPPER_MARGIN
            assert out["runtime_upper_seconds"] == pytest.approx(out["runtime_seconds"] * margin)
    finally:
        persistence.load_default_runtime_model.cache_clear()


def test_predict_uses_the_shipped_model_and_keeps_the_contract() -> None:
    """Fails (a warning) after a runtime-model change: rebuild with `python -m predictors.residual_build --runtime`."""
    spec = TrainingSpec.model_validate({"model": "llama-3.1-8b", "method": "lora", "micro_batch_size": 2,
                                        "seq_len": 2048, "gpus": 1, "gpu": "H100-80GB", "train_tokens": 1.0e9})
    persistence.load_default_runtime_model.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = predict(spec).to_dict()
    # the 63 dev runs with a throughput and the measured calibration rows (119 on the H200, 96 on the H100)
    assert persistence.load_default_runtime_model().metadata["training_rows"] == 63 + 119 + 96  # type: ignore[union-attr]
    for key in ("peak_vram_bytes", "peak_vram_upper_bytes", "throughput_tokens_per_second", "runtime_seconds"):
        assert key in out
    assert out["runtime_model_version"].startswith("runtime-residual-")
    assert out["throughput_lower_tokens_per_second"] <= out["throughput_tokens_per_second"]
    assert out["runtime_upper_seconds"] >= out["runtime_seconds"]
    assert out["runtime_seconds"] == pytest.approx(1.0e9 / out["throughput_tokens_per_second"])
    analytic = predict(spec, residual=False).to_dict()
    assert "runtime_model_version" not in analytic and analytic["runtime_upper_seconds"] > analytic["runtime_seconds"]
    no_gpu = predict(spec.model_copy(update={"gpu": None})).to_dict()
    assert "runtime_upper_seconds" not in no_gpu and "runtime_seconds" not in no_gpu


def test_predict_without_runtime_model_uses_analytic(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = TrainingSpec.model_validate({"model": "llama-3.2-1b", "method": "full", "gpu": "A100-80GB",
                                        "steps": 100})
    monkeypatch.setattr(predict_module, "_runtime_residual_model", lambda: None)
    pred = predict(spec)
    assert pred.runtime is not None and pred.runtime_seconds == pytest.approx(pred.runtime.runtime_seconds)
    assert pred.runtime_model_version is None


# ---- training rows, leave-one-source-out, CLI --------------------------------------------------------
@pytest.fixture(scope="module")
def dev_rows() -> list[RuntimeTrainingRow]:
    if not DEV_RUNS.exists():
        pytest.skip("shared/reference/runs-dev.jsonl not found")
    rows, skipped = runtime_training_rows(parse_runs(DEV_RUNS.read_text(encoding="utf-8")))
    assert not skipped
    return rows


def test_training_rows_are_job_throughputs(dev_rows: list[RuntimeTrainingRow]) -> None:
    assert len(dev_rows) == 63
    row = next(r for r in dev_rows if r.run_id == "S11-161")  # per-GPU figure of an 8-GPU job
    run = next(r for r in parse_runs(DEV_RUNS.read_text(encoding="utf-8")) if r.id == "S11-161")
    assert row.measured_tokens_per_second == pytest.approx(run.measured.tokens_per_second * 8)


def test_leave_one_source_out_on_a_small_set(dev_rows: list[RuntimeTrainingRow]) -> None:
    rows = [r for r in dev_rows if r.source in SMALL_SOURCES]
    scored = runtime_leave_one_source_out(rows)
    assert sorted(s.row.run_id for s in scored) == sorted(r.run_id for r in rows)
    assert [s.row.source for s in scored] == sorted(s.row.source for s in scored)  # source by source
    figures = summarize_runtime(scored)
    assert figures["analytic"]["n"] == figures["residual"]["n"] == len(rows)
    assert {"median_ape", "p90_ape", "coverage", "median_slack", "p90_slack"} <= set(figures["residual"])
    # a held-out source's prediction does not depend on that source's own measurements
    held = [r for r in rows if r.source == "S17"]
    refit = score_runtime_rows(fit_runtime_residual([r for r in rows if r.source != "S17"]), held)
    assert [s.predicted_tokens_per_second for s in refit] == [s.predicted_tokens_per_second for s in scored
                                                              if s.row.source == "S17"]


# Leave-one-source-out on the 63 dev runs, as measured when this model was written (docs/residual-model.md).
# 2026-11-26: the host floor, LoRA elementwise and eager-attention terms took the p90 from 62.2 to 50.0 % and the
# bound's median slack from 84 to 58 %, at a coverage of 92.1 % (was 93.7 %: one run of 63). 2026-11-27: ring
# collectives across nodes run at the node's NICs together (S11's 128-GPU rows predicted 2.7 % faster, as fast as on 8
# GPUs; the bf16 one was already over): median 19.1 -> 19.8 %, coverage 92.1 -> 90.5 % (one run of 63),
# while held-out MPT-13b on 64 H100s went from -70 % to +29 % (bench/data/external_runtime.jsonl).
REPORTED_LOSO = {"median_ape": 0.199, "p90_ape": 0.501, "coverage": 0.905, "median_slack": 0.576}


def test_leave_one_source_out_no_worse_than_reported(dev_rows: list[RuntimeTrainingRow]) -> None:
    got = summarize_runtime(runtime_leave_one_source_out(dev_rows))["residual"]
    assert got["median_ape"] - 0.005 <= REPORTED_LOSO["median_ape"], got
    assert got["p90_ape"] - 0.01 <= REPORTED_LOSO["p90_ape"], got
    assert got["coverage"] + 0.01 >= REPORTED_LOSO["coverage"], got  # one run of 63 is 0.016
    assert got["median_slack"] - 0.03 <= REPORTED_LOSO["median_slack"], got


@needs_dev
def test_train_cli_runtime_out(tmp_path: Path, runs_subset: RunsSubset,
        capsys: pytest.CaptureFixture[str]) -> None:
    runs = runs_subset(SMALL_SOURCES)
    rt = tmp_path / "rt.skops"
    assert main(["train", "--runs", str(runs), "--out", str(tmp_path / "m.skops"), "--runtime-out", str(rt),
                 "--runtime-coverage", "0.8", "--no-cv"]) == 0
    meta = json.loads(rt.with_suffix(".json").read_text())
    assert meta["params"]["coverage"] == 0.8 and meta["training_sources"] == list(SMALL_SOURCES)
    assert len(meta["training_data_sha256"]) == 64 and set(meta["evaluation"]) == {"in_sample"}
    loaded = persistence.load_model(rt, persistence.check_runtime_compatible)
    assert loaded.model.quantile_ == meta["conformal_quantile"]
    assert f"wrote {rt}" in capsys.readouterr().out


@needs_dev
def test_train_cli_rejects_bad_runtime_coverage(tmp_path: Path, runs_subset: RunsSubset) -> None:
    runs = runs_subset(SMALL_SOURCES)
    assert main(["train", "--runs", str(runs), "--out", str(tmp_path / "m.skops"),
                 "--runtime-out", str(tmp_path / "rt.skops"), "--runtime-coverage", "1.5"]) == 2


@needs_dev
@pytest.mark.parametrize("cv", ["none", "source"])
def test_evaluate_shows_runtime_residual(runs_subset: RunsSubset, capsys: pytest.CaptureFixture[str], cv: str) -> None:
    runs = runs_subset(SMALL_SOURCES)
    assert main(["evaluate", "--runs", str(runs), "--cv", cv]) == 0
    table = capsys.readouterr().out
    assert "analytic vs analytic+runtime residual" in table and "runtime upper bound" in table
    assert main(["evaluate", "--runs", str(runs), "--cv", cv, "--format", "json"]) == 0
    side = json.loads(capsys.readouterr().out)["runtime_residual"]
    assert side["mode"].startswith("leave-one-source-out" if cv == "source" else "shipped model runtime-residual-")
    assert set(side["by_source"]) == set(SMALL_SOURCES)
    for block in (side["overall"], *side["by_source"].values()):
        assert set(block) == {"analytic", "residual"}
        assert {"median_ape", "p90_ape", "coverage", "median_slack"} <= set(block["residual"])


def test_predict_many_batches_to_the_same_answers_as_one_at_a_time() -> None:
    """One spec on several GPUs, counts and links in one call: each prediction is the one it gets alone."""
    from predictors.predict import predict, predict_many
    from predictors.runtime import Interconnect
    from predictors.spec import parse_training_spec

    spec = parse_training_spec({"model": "llama-3.1-8b", "method": "full", "sharding": "fsdp", "gpus": 8,
                                "train_tokens": "1e9"})
    pcie = Interconnect(gpus_per_node=4, intra_node_bytes_per_second=32e9, inter_node_bytes_per_second=12.5e9)
    requests = [("H100-80GB", 8, None), ("L40S", 8, pcie), ("A100-80GB", 16, None), (None, 4, None),
                ("H100-80GB", 8, pcie)]
    batched = predict_many(spec, requests)
    for (gpu, gpus, links), together in zip(requests, batched, strict=True):
        alone = predict(spec, gpu_name=gpu, gpus=gpus, interconnect=links)
        assert together.to_dict() == alone.to_dict()
    assert batched[3].runtime_seconds is None and batched[0].runtime_upper_seconds is not None
    assert batched[0].runtime_seconds != batched[4].runtime_seconds  # the links matter
