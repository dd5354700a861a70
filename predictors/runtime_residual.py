"""A learned correction on top of the analytic throughput model, with a conformal upper bound on runtime.

The analytic runtime model (:mod:`predictors.runtime`: FLOPs over a per-GPU-family efficiency) explains;
this estimator corrects what it systematically misses per GPU family and setting, and says how much slower
the job may still run. It has the shape of scikit-learn's ``TransformedTargetRegressor``: the unfitted
``regressor`` is a parameter, its fitted clone is ``regressor_``.

Notation for one case ``x`` (a :class:`~predictors.runtime_features.RuntimeCase`): ``a(x)`` the analytic
tokens/s of the whole job, ``F(x)`` its feature vector, ``Z(x)`` the same with the numeric features clipped
to the training range and standardized (one-hot columns as they are), ``w(x) >= 1`` its widening.

* ``fit(X, y)``: ``r_i = ln(y_i / a(x_i))`` (``y``: measured tokens/s of the job);
  ``regressor_ = clone(regressor).fit(Z(X), r)``. The default regressor is a ridge regression without
  intercept: with one-hot settings its L2 penalty shrinks each GPU family's (method's, ...) correction
  towards 0 (the analytic model) the fewer training runs have it. Calibration (cross-conformal, as
  :mod:`predictors.residual`): one fold per group (source) when ``groups`` are given; out-of-fold
  predictions ``f_-i``; the shrinkage ``alpha_`` in [0, 1] minimises the median of
  ``|r_i - alpha * f_-i(x_i)|`` (a correction that does not carry over to unseen sources is shrunk to the
  analytic level, ``alpha_ = 0``; being a median, it also drops a correction that helps fewer than half of
  the runs, e.g. one GPU family's, whatever it does for them). Scores
  ``s_i = (alpha_ * f_-i(x_i) - r_i) / w_-i(x_i)`` (positive: the job ran slower than predicted);
  ``quantile_`` is their ``ceil((n + 1) * coverage) / n`` empirical quantile.
* ``predict(X) = a(x) * exp(alpha_ * f(x))`` with ``f = regressor_.predict o Z``: tokens/s of the job.
* ``predict_lower(X) = min(predict(X), a(x) * exp(alpha_ * f(x) - quantile_ * w(x)))``: the throughput the
  job reaches with probability ``coverage``. Runtime is work over throughput, so the runtime upper bound
  is the analytic runtime times ``a(x) / predict_lower(X)``.

The site stage (:mod:`predictors.residual`): the cases of ``site_group`` (this cluster's finished jobs, from
the ledger) also fit a log offset of the throughput per method group and this cluster's own runtime margin,
applied after ``alpha_ * f(x)``.

``w(x) = min(max_widening, 1 + distance_weight * max(0, d(x) / d_ref - 1))``, where ``d(x)`` is the mean
Euclidean distance of ``(standardized numeric, one-hot)`` features to the ``n_neighbors`` nearest training
cases and ``d_ref`` the median of that distance among the training cases (a GPU family or scale unlike the
training data gets a wider bound, at most ``max_widening`` times the calibrated margin).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.linear_model import Ridge
from sklearn.utils.validation import check_is_fitted

from predictors.residual import ConformalResidualRegressor, calibration_folds, fit_weighted
from predictors.residual_serving import (  # noqa: F401  (re-exported: the prediction-time half)
    _N_NUMERIC,
    DEFAULT_RUNTIME_UPPER_MARGIN,
    CorrectedRuntime,
    RuntimeServing,
    predict_with_lower_exact,
    runtime_prediction_fields_many,
    scale_features,
    scale_runtime,
)
from predictors.runtime_features import RuntimeCase, runtime_feature_matrix
from predictors.spec import TrainingSpec

# Ridge penalty of the default regressor, in training runs: a setting seen in n runs gets about
# n / (n + 10) of its mean residual (numeric features are standardized, so the same penalty applies).
DEFAULT_PENALTY = 10.0


def default_runtime_regressor(penalty: float = DEFAULT_PENALTY) -> Ridge:
    """A ridge regression without intercept on standardized numeric and one-hot features: every term,
    including each setting's level, is shrunk towards 0 (the analytic model), none towards the mean of the
    training runs (see :data:`DEFAULT_PENALTY`)."""
    return Ridge(alpha=penalty, fit_intercept=False)


class ResidualRuntimeRegressor(RuntimeServing, ConformalResidualRegressor):
    """Analytic job throughput times a learned correction, with a lower bound (an upper bound on runtime).

    Parameters as :class:`~predictors.residual.ConformalResidualRegressor`; ``regressor`` ``None`` is
    :func:`default_runtime_regressor`; ``coverage`` is the probability that the measured throughput is at
    least :meth:`predict_lower`, i.e. that the job finishes within the runtime upper bound (default 0.95 as
    for VRAM; the shipped model uses ``predictors.runtime_training.DEFAULT_RUNTIME_COVERAGE``).
    """

    # ---- fitting ------------------------------------------------------------------------------------
    def _new_regressor(self) -> Any:
        return default_runtime_regressor() if self.regressor is None else clone(self.regressor)

    def fit(self, X: Sequence[RuntimeCase], y: Sequence[float], groups: Sequence[str] | None = None
            ) -> ResidualRuntimeRegressor:
        """Fit the correction on cases ``X`` with measured job throughputs ``y`` (tokens/s)."""
        cases, y_tps = self._checked_measurements(X, y, "measured throughputs must be positive tokens/s")
        features = runtime_feature_matrix(cases)
        target = np.log(y_tps / _analytic(cases))
        self.n_features_in_ = features.shape[1]
        self.scaling_ = fit_scaling(features)
        self.train_distance_rows_ = scale_features(features, self.scaling_, clip=False)
        self._fit_distance_reference(features, groups)
        weights = self._case_weights(groups, len(cases))
        rows = scale_features(features, self.scaling_)
        self.regressor_ = fit_weighted(self._new_regressor(), rows, target, weights)
        self.linear_ = _linear_form(self.regressor_, rows)
        self._calibrate(features, target, [c.spec for c in cases], groups, weights)
        # this cluster's own throughput offset and runtime margin, from the ledger's finished jobs
        self._fit_site([c.spec for c in cases], features, target, groups, lower=True)
        return self

    def _calibrate(self, features: np.ndarray, target: np.ndarray, specs: Sequence[TrainingSpec],
                   groups: Sequence[str] | None, weights: np.ndarray | None) -> None:
        n = len(target)
        out_of_fold = np.empty(n)
        widening = np.empty(n)
        for train_rows, held_rows in calibration_folds(n, groups, self.cv, self.random_state):
            # the fold's model sees only its own training rows' range and scale, as a fresh fit would
            scaling = fit_scaling(features[train_rows])
            fold_weights = None if weights is None else weights[train_rows]
            model = fit_weighted(self._new_regressor(), scale_features(features[train_rows], scaling),
                                 target[train_rows], fold_weights)
            out_of_fold[held_rows] = model.predict(scale_features(features[held_rows], scaling))
            widening[held_rows] = self._widening(self._neighbour_distance(features[held_rows], train_rows=train_rows))
        self._set_shrinkage_and_quantile(target, out_of_fold, widening, specs, groups, lower=True)

    # ---- prediction (the rest is RuntimeServing's) ----------------------------------------------------
    def _regressor_log_correction(self, rows: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "regressor_")
        return np.asarray(self.regressor_.predict(rows), dtype=np.float64)


def fit_scaling(features: np.ndarray) -> dict[str, np.ndarray]:
    """Range, mean and scale of the numeric columns of training ``features``."""
    numeric = features[:, :_N_NUMERIC]
    std = numeric.std(axis=0)
    return {"low": numeric.min(axis=0), "high": numeric.max(axis=0), "mean": numeric.mean(axis=0),
            "scale": np.where(std > 0, std, 1.0)}


def _linear_form(regressor: Any, rows: np.ndarray) -> dict[str, np.ndarray] | None:
    """``{"coef", "intercept"}`` of a fitted linear regressor (its predictions on ``rows`` reproduced), or
    ``None`` for anything else."""
    coef = getattr(regressor, "coef_", None)
    intercept = getattr(regressor, "intercept_", None)
    if coef is None or intercept is None or np.size(coef) != rows.shape[1] or np.size(intercept) != 1:
        return None
    form = {"coef": np.ravel(np.asarray(coef, dtype=np.float64)),
            "intercept": np.asarray(float(np.ravel(intercept)[0]), dtype=np.float64)}
    if not np.allclose(rows @ form["coef"] + float(form["intercept"]), regressor.predict(rows), rtol=1e-9, atol=1e-9):
        return None
    return form


def _analytic(cases: Sequence[RuntimeCase]) -> np.ndarray:
    return np.asarray([max(c.analytic_tokens_per_second, 1e-30) for c in cases], dtype=np.float64)


