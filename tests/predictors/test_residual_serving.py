"""The serving files of the residual models: the shipped models load from them without scikit-learn, apply
bit for bit as the fitted estimators do, and a missing, stale, damaged or unsafe one falls back to skops."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from sklearn.neighbors import KNeighborsRegressor

from predictors import persistence
from predictors.features import DISTANCE_SIGNS, FEATURE_NAMES, NUMERIC
from predictors.reference import parse_runs
from predictors.residual import ResidualVramRegressor
from predictors.residual_serving import (
    ServedRuntimeModel,
    ServedVramModel,
    correct_vram_many,
    served_model,
    serving_state,
)
from predictors.runtime_residual import ResidualRuntimeRegressor
from predictors.runtime_training import fit_runtime_residual, runtime_training_rows
from predictors.training import TrainingRow, fit_residual, training_rows
from predictors.vram import predict_vram

REPO = Path(__file__).resolve().parents[2]
DEV_RUNS = REPO.parent / "shared" / "reference" / "runs-dev.jsonl"
needs_dev = pytest.mark.skipif(not DEV_RUNS.exists(), reason="shared/reference/runs-dev.jsonl not found")


@pytest.fixture(scope="module")
def vram_rows() -> list[TrainingRow]:
    if not DEV_RUNS.exists():
        pytest.skip("shared/reference/runs-dev.jsonl not found")
    return training_rows(parse_runs(DEV_RUNS.read_text(encoding="utf-8")))[0]


@pytest.fixture(scope="module")
def runtime_rows() -> list:  # type: ignore[type-arg]
    if not DEV_RUNS.exists():
        pytest.skip("shared/reference/runs-dev.jsonl not found")
    return runtime_training_rows(parse_runs(DEV_RUNS.read_text(encoding="utf-8")))[0]


def _equal(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> None:
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


# ---- the shipped models -------------------------------------------------------------------------------------
@needs_dev
def test_shipped_models_load_from_serving_files_and_match_skops(vram_rows: list[TrainingRow],
                                                                runtime_rows: list) -> None:  # type: ignore[type-arg]
    """Every dev case: the served model's point and bound equal the skops estimator's, bit for bit."""
    vram_path, runtime_path = persistence.shipped_model_path(), persistence.shipped_runtime_model_path()
    served = persistence.load_model(vram_path)
    fitted = persistence.load_model(vram_path, serving=False)
    assert isinstance(served.model, ServedVramModel) and isinstance(fitted.model, ResidualVramRegressor)
    assert served.metadata == fitted.metadata and served.version == fitted.version
    cases = [r.case for r in vram_rows]
    _equal(served.model.predict_with_upper(cases), fitted.model.predict_with_upper(cases))
    for case in cases[:40]:
        floor = (case.spec, case.vram.peak_vram_bytes, case.floor_bytes)
        assert served.model.upper_floor_bytes(*floor) == fitted.model.upper_floor_bytes(*floor)

    served_rt = persistence.load_model(runtime_path, persistence.check_runtime_compatible)
    fitted_rt = persistence.load_model(runtime_path, persistence.check_runtime_compatible, serving=False)
    assert isinstance(served_rt.model, ServedRuntimeModel)
    assert isinstance(fitted_rt.model, ResidualRuntimeRegressor)
    rt_cases = [r.case for r in runtime_rows]
    _equal(served_rt.model.predict_with_lower(rt_cases), fitted_rt.model.predict_with_lower(rt_cases))


def test_shipped_serving_files_are_current() -> None:
    """Fails when a model file was rebuilt without its serving file (run `python -m predictors.residual_build`,
    which writes both)."""
    for path in (persistence.shipped_model_path(), persistence.shipped_runtime_model_path()):
        header, _ = persistence.read_serving(persistence.serving_path(path))
        assert header["model_sha256"] == persistence._file_sha256(path), path.name


def test_predict_and_place_do_not_import_scikit_learn() -> None:
    """The CLI's predict/place path: numpy and the serving files only (scikit-learn, skops and scipy take
    1-4 s to import)."""
    code = (
        "import sys\n"
        "from scheduler.cli import main\n"
        f"assert main(['predict', {str(REPO / 'examples' / 'llama-3.1-8b-lora.yaml')!r}, '--gpu', 'A100-80GB',"
        " '--format', 'json']) == 0\n"
        f"assert main(['place', {str(REPO / 'examples' / 'llama-3.1-70b-too-big.yaml')!r}, '--format', 'json']) == 1\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'skops', 'scipy', 'torch'))\n"
        "print('HEAVY', heavy[:5])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out and '"model_version": "residual-' in out


# ---- fitted models: served == estimator, including the learned correction ------------------------------
@needs_dev
def test_served_equals_estimator_with_a_learned_correction(tmp_path: Path, vram_rows: list[TrainingRow],
                                                           runtime_rows: list) -> None:  # type: ignore[type-arg]
    """With ``shrinkage=1`` the corrections (compiled trees, ridge coefficients) are applied: still equal."""
    vram = fit_residual(vram_rows[::2], shrinkage=1.0)
    assert vram.alpha_ == 1.0 and vram.compiled_ is not None
    path = tmp_path / "v.skops"
    persistence.save_model(vram, path, persistence.build_metadata(model_version="t"))
    served = persistence.load_model(path).model
    assert isinstance(served, ServedVramModel)
    cases = [r.case for r in vram_rows]
    _equal(served.predict_with_upper(cases), vram.predict_with_upper(cases))
    np.testing.assert_array_equal(served.log_correction(cases), vram.log_correction(cases))
    by_est = correct_vram_many(vram, cases[0].spec, cases[0].architecture, [(c.gpu, c.vram) for c in cases[:5]])
    by_srv = correct_vram_many(served, cases[0].spec, cases[0].architecture, [(c.gpu, c.vram) for c in cases[:5]])
    assert by_est == by_srv

    runtime = fit_runtime_residual(runtime_rows[::2], shrinkage=1.0)
    assert runtime.alpha_ == 1.0 and runtime.linear_ is not None
    rt_path = tmp_path / "r.skops"
    persistence.save_model(runtime, rt_path, persistence.build_runtime_metadata(model_version="t"))
    served_rt = persistence.load_model(rt_path, persistence.check_runtime_compatible).model
    assert isinstance(served_rt, ServedRuntimeModel)
    rt_cases = [r.case for r in runtime_rows]
    _equal(served_rt.predict_with_lower(rt_cases), runtime.predict_with_lower(rt_cases))


# ---- fallbacks: the serving file is a cache of the skops file, never trusted over it ----------------------
@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, vram_rows: list[TrainingRow]) -> tuple[Path, bytes]:
    model = fit_residual(vram_rows[::3], shrinkage=0.0)
    path = tmp_path_factory.mktemp("serving") / "m.skops"
    persistence.save_model(model, path, persistence.build_metadata(model_version="s"))
    return path, persistence.serving_path(path).read_bytes()


def _copy(saved: tuple[Path, bytes], tmp_path: Path) -> tuple[Path, Path, bytes]:
    """The saved model and its serving file, copied to ``tmp_path`` (to damage): model, serving file, its bytes."""
    source, good = saved
    path = tmp_path / "m.skops"
    path.write_bytes(source.read_bytes())
    serving = persistence.serving_path(path)
    serving.write_bytes(good)
    return path, serving, good


@needs_dev
@pytest.mark.parametrize("damage", ["garbage", "truncated", "no_header", "stale", "object_array", "wrong_kind",
                                    "missing_array", "header_not_object"])
def test_unusable_serving_file_falls_back_to_skops(tmp_path: Path, saved: tuple[Path, bytes], damage: str) -> None:
    path, serving, good = _copy(saved, tmp_path)
    header, arrays = persistence.read_serving(serving)
    if damage == "garbage":
        serving.write_bytes(b"not a zip at all")
    elif damage == "truncated":
        serving.write_bytes(good[: len(good) // 2])
    elif damage == "no_header":
        with zipfile.ZipFile(serving, "w") as archive:
            archive.writestr("x.npy", b"")
    elif damage == "stale":  # the skops file was replaced after the serving file was written
        persistence.write_serving(serving, {**header, "model_sha256": "0" * 64}, arrays)
    elif damage == "object_array":  # a pickled object array must be refused, not unpickled
        with zipfile.ZipFile(serving, "a") as archive, archive.open("evil.npy", "w") as member:
            np.lib.format.write_array(member, np.asarray([{"a": 1}], dtype=object), allow_pickle=True)
    elif damage == "wrong_kind":
        persistence.write_serving(serving, {**header, "params": {**header["params"], "kind": "other"}}, arrays)
    elif damage == "missing_array":
        persistence.write_serving(serving, header, {k: v for k, v in arrays.items() if k != "train_numeric_"})
    elif damage == "header_not_object":
        persistence.write_serving(serving, [1, 2], arrays)  # type: ignore[arg-type]
    loaded = persistence.load_model(path)
    assert isinstance(loaded.model, ResidualVramRegressor)  # the skops file, read as before
    assert loaded.version == "s"


@needs_dev
def test_incompatible_metadata_is_refused_on_the_serving_path_too(tmp_path: Path, saved: tuple[Path, bytes]) -> None:
    path, serving, _ = _copy(saved, tmp_path)
    header, arrays = persistence.read_serving(serving)
    old = {**header["metadata"], "analytic_fingerprint": "0" * 64}
    persistence.write_serving(serving, {**header, "metadata": old}, arrays)
    with pytest.raises(persistence.IncompatibleModel, match="different version of the analytic model"):
        persistence.load_model(path)


@needs_dev
def test_no_array_form_means_no_serving_file(tmp_path: Path, vram_rows: list[TrainingRow],
                                             runtime_rows: list) -> None:  # type: ignore[type-arg]
    """A runtime residual with a non-linear regressor (no coefficients to copy) is applied by the estimator:
    save_model writes no serving file and removes a stale one."""
    path = tmp_path / "r.skops"
    serving = persistence.serving_path(path)
    serving.write_bytes(b"stale")
    model = ResidualRuntimeRegressor(regressor=KNeighborsRegressor(n_neighbors=3), shrinkage=1.0)
    model.fit([r.case for r in runtime_rows], [r.measured_tokens_per_second for r in runtime_rows])
    assert model.linear_ is None and serving_state(model) is None
    persistence.save_model(model, path, persistence.build_runtime_metadata(model_version="l"))
    assert not serving.exists()
    assert isinstance(persistence.load_model(path, persistence.check_runtime_compatible).model,
                      ResidualRuntimeRegressor)


@needs_dev
def test_serving_file_is_reproducible(tmp_path: Path, saved: tuple[Path, bytes]) -> None:
    """The same model gives the same bytes (fixed member times, sorted members): a rebuild diffs clean."""
    source, good = saved
    header, arrays = persistence.read_serving(persistence.serving_path(source))
    again = tmp_path / "again.serving.npz"
    persistence.write_serving(again, header, arrays)
    assert again.read_bytes() == good


def test_served_model_errors_name_what_is_missing() -> None:
    with pytest.raises(ValueError, match="serving format"):
        served_model({"serving_format_version": 99}, {})
    with pytest.raises(ValueError, match="kind 'x'"):
        served_model({"serving_format_version": 1, "kind": "x"}, {})
    params = {"serving_format_version": 1, "kind": "vram", "alpha_": 0.0, "quantile_": 0.1, "class_quantiles_": {},
              "distance_ref_": 1.0, "n_neighbors": 5, "distance_weight": 0.5, "max_widening": 2.0,
              "n_features_in_": 3}
    with pytest.raises(ValueError, match="array numeric_mean_ is missing"):
        served_model(params, {})
    with pytest.raises(ValueError, match="alpha_ is missing"):
        served_model({k: v for k, v in params.items() if k != "alpha_"}, {})


def test_served_model_reads_the_distance_each_file_was_calibrated_with() -> None:
    """A file states its one-sided signs (``distance_signs_``); an earlier one its token-monotone distance, or
    neither (symmetric). A wrong list is refused with what it must be."""
    from predictors.residual_serving import _read_distance_signs

    token_signs = [float(NUMERIC[name]) for name in NUMERIC]  # the token features' monotonic constraints
    assert _read_distance_signs({}) is None
    assert _read_distance_signs({"token_monotone_distance_": True}).tolist() == token_signs
    assert _read_distance_signs({"token_monotone_distance_": False}) is None
    signs = [DISTANCE_SIGNS.get(name, 0) for name in NUMERIC]
    assert _read_distance_signs({"distance_signs_": signs}).tolist() == signs
    for bad in ([1, 0], [2] * len(NUMERIC), [0.5] * len(NUMERIC), "up", [True] * len(NUMERIC)):
        with pytest.raises(ValueError, match=f"distance_signs_ must be {len(NUMERIC)} of -1, 0 and 1"):
            _read_distance_signs({"distance_signs_": bad})
    with pytest.raises(ValueError, match="token_monotone_distance_ must be true or false"):
        _read_distance_signs({"token_monotone_distance_": "yes"})
    # an estimator fitted before distance_signs_, read back from its skops file, keeps its token-monotone distance
    from predictors.residual_serving import _distance_signs

    legacy = ServedVramModel()
    assert _distance_signs(legacy) is None
    legacy.token_monotone_distance_ = True  # type: ignore[attr-defined]
    assert _distance_signs(legacy).tolist() == token_signs
    # and a serving file written from such an estimator states the signs it was calibrated with
    shipped = persistence.load_model(persistence.shipped_model_path()).model
    for name in ("quantile_", "class_quantiles_", "alpha_", "distance_ref_", "n_neighbors", "distance_weight",
                 "max_widening", "n_features_in_", "numeric_mean_", "numeric_scale_", "train_numeric_",
                 "train_codes_", "compiled_"):
        setattr(legacy, name, getattr(shipped, name))
    params, _ = serving_state(legacy)
    assert params["distance_signs_"] == [int(v) for v in token_signs]


def test_header_is_plain_json(tmp_path: Path) -> None:
    """What a reviewer sees with `unzip -p FILE header.json`: the metadata, the parameters and the hash."""
    header, arrays = persistence.read_serving(persistence.serving_path(persistence.shipped_model_path()))
    assert set(header) == {"params", "metadata", "model_sha256"}
    assert header["metadata"]["model_version"].startswith("residual-")
    assert all(a.dtype != object for a in arrays.values())
    json.dumps(header)


def test_served_model_predicts_like_the_analytic_path_expects() -> None:
    """A served model is what SpecPredictor gets by default, and its bound sits above the analytic peak."""
    from predictors.catalog import resolve_model
    from predictors.hardware import lookup_gpu
    from predictors.predict import _residual_model
    from predictors.spec import TrainingSpec

    loaded = _residual_model()
    assert loaded is not None and isinstance(loaded.model, ServedVramModel)
    spec = TrainingSpec.model_validate({"model": "llama-3.1-8b", "method": "lora", "gpus": 1})
    arch = resolve_model(spec).architecture
    gpu = lookup_gpu("A100-80GB")
    vram = predict_vram(spec, arch, gpu)
    fixed = correct_vram_many(loaded.model, spec, arch, [(gpu, vram)])[0]
    assert fixed.upper_bytes >= vram.peak_vram_bytes


def test_distance_by_matrix_product_equals_the_element_wise_distance() -> None:
    """The VRAM residual's distance to its training cases (an expansion by products, placement's hot path) equals the
    element-wise ``sqrt(|z - t|^2 + mismatches)``; rows it cannot take (a NaN numeric value, a code outside its
    vocabulary, a NaN code) take the element-wise form and get its answer."""
    from predictors.residual_serving import _CATEGORICAL_COLUMNS, _NUMERIC_COLUMNS, _distance_table

    m = persistence.load_model(persistence.shipped_model_path()).model
    assert isinstance(m, ServedVramModel)
    assert _distance_table(m) is not None  # the shipped model takes the fast form
    rng = np.random.default_rng(3)
    n_rows, n_train = 40, m.train_numeric_.shape[0]
    features = np.empty((n_rows, len(_NUMERIC_COLUMNS) + len(_CATEGORICAL_COLUMNS)))
    picks = rng.integers(0, n_train, n_rows)
    features[:, _NUMERIC_COLUMNS] = (m.train_numeric_[picks] + rng.normal(0, 0.7, (n_rows, len(_NUMERIC_COLUMNS)))
                                     ) * m.numeric_scale_ + m.numeric_mean_
    codes = m.train_codes_[rng.integers(0, n_train, n_rows)].copy()
    shuffled = rng.random(codes.shape) < 0.3
    codes[shuffled] = m.train_codes_[rng.integers(0, n_train, shuffled.sum()), np.nonzero(shuffled)[1]]
    features[:, _CATEGORICAL_COLUMNS] = codes
    features[0, _NUMERIC_COLUMNS] = m.train_numeric_[7] * m.numeric_scale_ + m.numeric_mean_  # a training case
    features[0, _CATEGORICAL_COLUMNS] = m.train_codes_[7]

    # the shipped model counts the features that move as a job grows on one side only
    signs = [DISTANCE_SIGNS.get(name, 0) for name in FEATURE_NAMES if name in NUMERIC]
    assert m.distance_signs_ is not None and m.distance_signs_.tolist() == signs

    def element_wise(rows: np.ndarray, train_rows: np.ndarray | None = None) -> np.ndarray:
        """The squared distance, element by element, in plain Python loops: ``(z - t)^2`` per numeric feature,
        ``max(0, sign * (z - t))^2`` for a one-sided feature (sign +1 or -1), plus the mismatches."""
        z = m._standardize(rows)
        train_z, train_c = m.train_numeric_, m.train_codes_
        if train_rows is not None:
            train_z, train_c = train_z[train_rows], train_c[train_rows]
        c = rows[:, _CATEGORICAL_COLUMNS]
        out = np.empty((len(rows), len(train_z)))
        for i in range(len(rows)):
            for j in range(len(train_z)):
                total = 0.0
                for k, sign in enumerate(signs):
                    d = float(z[i, k] - train_z[j, k])
                    total += (d if sign == 0 else max(0.0, sign * d)) ** 2
                out[i, j] = total + float(np.sum(c[i] != train_c[j]))
        return out

    # the expansion |z|^2 + |t|^2 - 2 z.t rounds at ~1e-14 of the squared distances (a few units)
    np.testing.assert_allclose(m._pairwise_sq_distance(features), element_wise(features), rtol=0, atol=1e-9)
    assert 0.0 <= m._pairwise_sq_distance(features[:1])[0, 7] < 1e-9
    # each row's distances are the ones it gets alone, bit for bit (placement batches a spec's GPUs)
    alone = np.vstack([m._pairwise_sq_distance(features[i:i + 1]) for i in range(n_rows)])
    np.testing.assert_array_equal(m._pairwise_sq_distance(features), alone)
    subset = np.arange(0, n_train, 3)
    np.testing.assert_allclose(m._pairwise_sq_distance(features, subset), element_wise(features, subset), atol=1e-9)
    odd = features[:4].copy()
    odd[0, _NUMERIC_COLUMNS[4]] = np.nan  # no GPU: no memory size
    odd[1, _CATEGORICAL_COLUMNS[2]] = np.nan  # a value outside the vocabulary
    odd[2, _CATEGORICAL_COLUMNS[0]] = 99.0  # a code no vocabulary has
    odd[3, _CATEGORICAL_COLUMNS[1]] += 0.5  # not a whole code: matches nothing, as element-wise
    np.testing.assert_allclose(m._pairwise_sq_distance(odd), element_wise(odd), rtol=1e-12, atol=0)
    # a batch mixing clean and odd rows: every row gets what it gets alone
    mixed = np.vstack([features[:5], odd, features[5:9]])
    for train_rows in (None, subset):  # placement (all training cases) and calibration (a fold's)
        rows_alone = np.vstack([m._pairwise_sq_distance(mixed[i:i + 1], train_rows) for i in range(len(mixed))])
        np.testing.assert_array_equal(m._pairwise_sq_distance(mixed, train_rows), rows_alone)
    # whatever the memory order of the input
    np.testing.assert_array_equal(m._pairwise_sq_distance(np.asfortranarray(mixed)), m._pairwise_sq_distance(mixed))


# The bounds these (spec, GPU) pairs got at 32cfa90, before placement's device-level rows were built without
# VramCase objects and the distance became a matrix product: the shipped model's arrays are the same since.
# (re-pinned 2026-11-26: the measured Hopper CUDA context, 632 -> 1,382 MiB, moved the H100 column, and the
# adapters' own input copies with the models rebuilt on the H200 calibration rows moved the LoRA/QLoRA rows,
# and the model rebuilt after the cached-logits term moved the FSDP row; the H100's own measured context, 1,382 ->
# 1,247 MiB, moved the H100 column again; the one-sided trainable, rank and resident-share features moved the
# FSDP row's T4, farther from the training data, 42,528,848,919 -> 42,793,307,089; the ZeRO-2/3 gradient bucket at
# its full size moved the training cases' features and with them the T4's distance, 43,054,814,061 -> 43,054,769,379)
PINNED_UPPER_BYTES = [
    [135084701690, 135084701690, 136282486066, 135308747689, 136428977681, 135739605378],
    [126540113700, 126540113700, 127737898076, 126764159698, 127884389690, 127195017388],
    [41982172880, 41982172880, 42982014584, 42169193630, 43104297382, 43054770409],
]


def test_device_rows_without_case_objects_match_predict_with_upper() -> None:
    """Placement's path (one device-level row per GPU, built without VramCase objects) gives the bound that
    predict_with_upper gives the same cases, bit for bit, on six GPU families, and the bounds pinned from before
    the change (so a mistake shared by both paths shows too)."""
    from predictors.catalog import resolve_model
    from predictors.features import VramCase
    from predictors.hardware import lookup_gpu
    from predictors.residual_serving import correct_vram_many
    from predictors.spec import TrainingSpec
    from predictors.vram import predict_vram

    model = persistence.load_model(persistence.shipped_model_path()).model
    assert not model.corrects_point  # the shipped model: the bound only, so the device-only path applies
    gpus = [lookup_gpu(name) for name in ("L40S", "A100-80GB", "H100-80GB", "B200", "V100-32GB", "T4")]
    specs = ({"model": "llama-3.1-8b", "method": "lora", "micro_batch_size": 2, "seq_len": 2048},
             {"model": "qwen2.5-14b", "method": "qlora", "seq_len": 4096},
             {"model": "mistral-7b-v0.1", "method": "full", "gpus": 8, "sharding": "fsdp"})
    for raw, pinned in zip(specs, PINNED_UPPER_BYTES, strict=True):
        spec = TrainingSpec.model_validate(raw)
        resolved = resolve_model(spec)
        items = [(gpu, predict_vram(spec, resolved.architecture, gpu)) for gpu in gpus]
        fast = correct_vram_many(model, spec, resolved.architecture, items)
        _, upper = model.predict_with_upper([VramCase(spec, resolved.architecture, gpu, "nvml", vram)
                                             for gpu, vram in items])
        assert [f.upper_bytes for f in fast] == [max(int(round(u)), v.peak_vram_bytes)
                                                 for u, (_, v) in zip(upper, items, strict=True)]
        assert [f.upper_bytes for f in fast] == pinned


@pytest.mark.parametrize("payload", [
    "ridge",  # a trusted scikit-learn type, but not a vramfit residual
    "unfitted",  # the right class, never fitted
])
def test_a_model_file_holding_the_wrong_object_is_refused_at_load(tmp_path: Path, payload: str) -> None:
    import skops.io as sio
    from sklearn.linear_model import Ridge

    from predictors.persistence import IncompatibleModel, load_model, shipped_model_path
    from predictors.residual import ResidualVramRegressor

    metadata = load_model(shipped_model_path(), serving=False).metadata
    path = tmp_path / "model.skops"
    sio.dump({"metadata": metadata, "model": Ridge() if payload == "ridge" else ResidualVramRegressor()}, path)
    with pytest.raises(IncompatibleModel):
        load_model(path, serving=False)
