"""The flat tree walk gives the compiled trees' predictions bit for bit (and so sklearn's, to 1e-12)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictors.features import CATEGORICAL_MASK, FEATURE_NAMES, feature_matrix
from predictors.reference import parse_runs
from predictors.residual import (
    compile_hist_gradient_boosting,
    default_regressor,
    predict_compiled,
    predict_compiled_flat,
)
from predictors.training import training_rows

DEV_RUNS = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "runs-dev.jsonl"


@pytest.mark.skipif(not DEV_RUNS.is_file(), reason="shared/reference/runs-dev.jsonl not found")
@pytest.mark.parametrize("max_depth", [3, 6])
def test_flat_walk_equals_compiled_walk(max_depth: int) -> None:
    rows, _ = training_rows(parse_runs(DEV_RUNS.read_text(encoding="utf-8")))
    X = feature_matrix([r.case for r in rows])
    y = np.log(np.asarray([r.measured_bytes / r.case.level_bytes for r in rows]))
    reg = default_regressor().set_params(max_depth=max_depth, max_iter=60).fit(X, y)
    compiled = compile_hist_gradient_boosting(reg)
    assert compiled is not None and compiled["is_categorical"].any()
    scaled = X[:40].copy()
    numeric = ~np.asarray(CATEGORICAL_MASK)
    scaled[:, numeric] *= 1.3  # numeric values between and beyond the training ones
    probe = np.vstack([X, scaled])
    probe[::3, FEATURE_NAMES.index("metric")] = np.nan  # missing category
    probe[::4, FEATURE_NAMES.index("gpu_family")] = 6.0  # a category unseen in training
    probe[::7, FEATURE_NAMES.index("sharding")] = 300.0  # beyond the category table
    probe[::5, FEATURE_NAMES.index("log2_gpus")] = np.nan
    want = predict_compiled(compiled, probe)
    assert np.array_equal(predict_compiled_flat(compiled, probe), want)
    for i in range(0, len(probe), 17):  # one row at a time as in a batch
        assert np.array_equal(predict_compiled_flat(compiled, probe[i:i + 1]), want[i:i + 1])
    np.testing.assert_allclose(want, reg.predict(probe), atol=1e-12)

