"""Applying a fitted residual model: the prediction-time half of :mod:`predictors.residual` and
:mod:`predictors.runtime_residual`, with numpy and nothing of scikit-learn, skops or scipy.

The estimators (``ResidualVramRegressor``, ``ResidualRuntimeRegressor``) are fitted with scikit-learn and
persisted with skops; predicting with them needs only their fitted arrays and numbers (the trees compiled to
flat arrays, the ridge coefficients, the training cases' distance features, the conformal margins). The
prediction methods live here, in :class:`VramServing` and :class:`RuntimeServing`, which the estimators
inherit; :class:`ServedVramModel` and :class:`ServedRuntimeModel` are the same methods over a fitted model's
state as saved by :func:`serving_state` (``predictors.persistence`` writes it beside the skops file). So
``vramfit predict``, ``place`` and the webhook load and apply the shipped models without importing
scikit-learn (about 1 s of start-up, 4 s where torch is installed, which scikit-learn's array-API support
imports), with predictions bit for bit those of the estimators (tests/predictors/test_residual_serving.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from predictors.architecture import Architecture
from predictors.features import (
    CATEGORICAL_MASK,
    CATEGORIES,
    DISTANCE_SIGNS,
    FEATURE_NAMES,
    MONOTONIC_CST,
    VramCase,
    device_feature_matrix,
    feature_matrix,
    resident_bytes,
)
from predictors.hardware import GpuSpec
from predictors.runtime import RuntimePrediction
from predictors.runtime_features import RUNTIME_NUMERIC, RuntimeCase, runtime_feature_matrix
from predictors.spec import TrainingSpec
from predictors.vram import VramPrediction, with_breakdown

if TYPE_CHECKING:
    from predictors.persistence import LoadedModel

_CATEGORICAL = np.asarray(CATEGORICAL_MASK, dtype=bool)
_NUMERIC_COLUMNS = np.flatnonzero(~_CATEGORICAL)
_CATEGORICAL_COLUMNS = np.flatnonzero(_CATEGORICAL)
_FLOAT_MAX = np.finfo(np.float64).max
_N_VRAM_NUMERIC = len(_NUMERIC_COLUMNS)
# the one-hot layout of the categorical features in the distance (VramServing._pairwise_sq_distance): column
# j's value v sits at _CATEGORY_OFFSETS[j] + v of the one-hot table
_CATEGORY_SIZES = np.asarray([len(vocab) for vocab in CATEGORIES.values()], dtype=np.float64)
_CATEGORY_OFFSETS = np.concatenate(([0], np.cumsum(_CATEGORY_SIZES)[:-1]))
_ONE_HOT_WIDTH = int(_CATEGORY_SIZES.sum())
_EXPANSION_LIMIT = 1e100  # standardized values beyond this take the element-wise distance (no inf - inf)
# The one-sided distance: per numeric column, the side on which the feature moves as a job grows
# (features.DISTANCE_SIGNS; 0: both sides count). A model fitted with it (``distance_signs_``) counts a signed
# feature only where the spec lies beyond a training case on that side: a smaller job is no farther from its
# neighbours for it, so the bound's widening, and with it the bound, never falls as the micro-batch, the sequence,
# the LoRA rank or the adapted modules grow. Models saved with the earlier token-monotone distance
# (``token_monotone_distance_``) had the token features (features.NUMERIC's monotonic constraints) one-sided only;
# older ones none.
ONE_SIDED_SIGNS = np.asarray([DISTANCE_SIGNS.get(FEATURE_NAMES[c], 0) for c in _NUMERIC_COLUMNS], dtype=np.float64)
_TOKEN_SIGNS = np.asarray([MONOTONIC_CST[c] for c in _NUMERIC_COLUMNS], dtype=np.float64)
# the runtime features: the numeric ones come first (runtime_features), then the one-hot columns
_N_NUMERIC = len(RUNTIME_NUMERIC)

# Without a runtime residual model (missing or incompatible, or ``residual=False``) the runtime upper bound is
# the analytic runtime times 1 + this: a fallback, not a calibrated bound (its coverage on the dev reference
# runs is in docs/residual-model.md, "The runtime residual and the runtime bound").
DEFAULT_RUNTIME_UPPER_MARGIN = 1.0


class NotFittedModel(ValueError, AttributeError):
    """A residual model used before it was fitted (scikit-learn's ``NotFittedError`` has the same bases)."""


# Conformal margins are calibrated separately for full fine-tuning and for adapter methods (LoRA, QLoRA):
# their errors spread differently. A margin group needs calibration cases from this many groups (sources),
# or 10 times as many cases without groups; with fewer it takes the pooled margin.
MARGIN_GROUPS: tuple[str, ...] = ("full", "adapter")
MIN_MARGIN_SOURCES = 3


def margin_group(spec: TrainingSpec) -> str:
    """The conformal margin group of a spec: ``full`` fine-tuning or an ``adapter`` method."""
    return "full" if spec.method == "full" else "adapter"



class ConformalServing:
    """The prediction-time part the residual models share: the widening of the bound with the distance to
    the training data, the conformal margins, and the per-row terms of the prediction and its bound.

    Fitted state it reads: ``alpha_``, ``quantile_``, ``class_quantiles_``, ``distance_ref_`` and the
    parameters ``n_neighbors``, ``distance_weight``, ``max_widening`` (see
    :class:`predictors.residual.ConformalResidualRegressor`); and, where present, the site stage's
    ``site_offsets_`` and ``site_quantiles_`` (:class:`predictors.residual.ResidualVramRegressor`).
    """

    alpha_: float
    quantile_: float
    distance_ref_: float
    n_neighbors: int
    distance_weight: float
    max_widening: float

    def _pairwise_sq_distance(self, features: np.ndarray, train_rows: np.ndarray | None = None) -> np.ndarray:
        """Squared :meth:`_pairwise_distance`; subclasses define it."""
        raise NotImplementedError

    def _pairwise_distance(self, features: np.ndarray, train_rows: np.ndarray | None = None) -> np.ndarray:
        """Distances of each row of ``features`` to the (selected) training cases."""
        return np.sqrt(self._pairwise_sq_distance(features, train_rows))

    def _neighbour_distance(self, features: np.ndarray, exclude: np.ndarray | None = None,
                            train_rows: np.ndarray | None = None) -> np.ndarray:
        """Mean distance of each row of ``features`` to its ``n_neighbors`` nearest training cases, leaving
        out the pairs where ``exclude`` (rows x training cases) is true."""
        sq = self._pairwise_sq_distance(features, train_rows)
        if exclude is not None:
            sq = np.where(exclude, np.inf, sq)
            available = int(np.isfinite(sq).sum(axis=1).min()) if sq.size else 0
        else:
            available = sq.shape[1]
        k = max(1, min(self.n_neighbors, available))
        # the k nearest by squared distance (the same cases: the root is monotone), then the root of k only
        nearest = np.sqrt(np.partition(sq, k - 1, axis=1)[:, :k])
        return nearest.sum(axis=1) / k  # the mean, without ndarray.mean's per-call overhead

    def _widening(self, distance: np.ndarray) -> np.ndarray:
        raw = 1.0 + self.distance_weight * np.maximum(0.0, distance / self.distance_ref_ - 1.0)
        return np.minimum(raw, self.max_widening)

    def _row_terms(self, features: np.ndarray, specs: Sequence[TrainingSpec]) -> tuple[list[float], list[float]]:
        """Per row: the shrunk learned log correction ``alpha_ * f(x)`` and the widened margin of the bound.

        A shrinkage of 0 (the correction did not carry over to held-out sources) skips the regressor; only a
        positive margin is widened (a negative quantile, where the model errs on the safe side, is not made
        worse). Plain floats: placement sends a handful of rows, for which numpy's per-call cost dominates the
        arithmetic that follows.
        """
        n = len(specs)
        f = (self.alpha_ * self.log_correction(features)).tolist() if self.alpha_ else [0.0] * n
        offsets = getattr(self, "site_offsets_", None)
        if offsets:  # the site stage: this cluster's own offset per method group
            f = [fi + offsets.get(margin_group(spec), 0.0) for fi, spec in zip(f, specs, strict=True)]
        by_spec: dict[int, float] = {}  # placement sends one spec on many GPUs: its margin once
        margins = [by_spec[id(spec)] if id(spec) in by_spec else by_spec.setdefault(id(spec), self._margin(spec))
                   for spec in specs]
        if not any(m > 0 for m in margins):
            return f, margins
        # _widening per row in plain floats (the same IEEE operations, so the same numbers)
        ref, weight, cap = self.distance_ref_, self.distance_weight, self.max_widening
        widening = [min(1.0 + weight * max(0.0, d / ref - 1.0), cap)
                    for d in self._neighbour_distance(features).tolist()]
        return f, [m * w if m > 0 else m for m, w in zip(margins, widening, strict=True)]

    def log_correction(self, X: Any) -> np.ndarray:
        """``f(x)``, the learned log correction of each feature row; subclasses define it."""
        raise NotImplementedError

    def _regressor_log_correction(self, rows: np.ndarray) -> np.ndarray:
        """``f`` by the fitted scikit-learn regressor, for a model whose correction has no array form."""
        raise NotFittedModel(f"this {type(self).__name__} has no fitted regressor to correct with")

    def _require_fitted(self) -> None:
        """Raise :class:`NotFittedModel` unless the model is fitted (cheap: called once per prediction)."""
        if not hasattr(self, "quantile_"):
            raise NotFittedModel(f"this {type(self).__name__} is not fitted yet; call fit first")

    def _margin(self, spec: TrainingSpec) -> float:
        """The calibrated margin (before widening) of ``spec``: the site's for its method group where this
        cluster's actuals calibrate one, else its method group's, else the pooled one."""
        group = margin_group(spec)
        site = getattr(self, "site_quantiles_", None)
        if site and group in site:
            return float(site[group])
        margins = getattr(self, "class_quantiles_", None) or {}
        return float(margins.get(group, self.quantile_))

    def _site_offset(self, spec: TrainingSpec) -> float:
        """The site stage's log offset of ``spec``'s method group (0 without a site stage)."""
        offsets = getattr(self, "site_offsets_", None)
        return float(offsets.get(margin_group(spec), 0.0)) if offsets else 0.0

    @property
    def corrects_point(self) -> bool:
        """Whether predictions differ from the analytic ones (a learned correction or a site offset), not
        only the bound."""
        return bool(self.alpha_) or any(v != 0 for v in (getattr(self, "site_offsets_", None) or {}).values())


class VramServing(ConformalServing):
    """Prediction with a fitted VRAM residual: point, calibrated upper bound, and the bound's cheap floor.

    Fitted state it reads beyond :class:`ConformalServing`'s: ``numeric_mean_``, ``numeric_scale_``,
    ``train_numeric_``, ``train_codes_`` (the distance to the training data) and ``compiled_`` (the boosted
    trees as flat arrays; without them the estimator's regressor).
    """

    numeric_mean_: np.ndarray
    numeric_scale_: np.ndarray
    train_numeric_: np.ndarray
    train_codes_: np.ndarray
    # the one-sided distance's sign per numeric column (ONE_SIDED_SIGNS when fitted); None: the symmetric distance
    # that models saved before it were calibrated with
    distance_signs_: np.ndarray | None = None

    def _standardize(self, features: np.ndarray) -> np.ndarray:
        z = (features[:, _NUMERIC_COLUMNS] - self.numeric_mean_) / self.numeric_scale_
        z[np.isnan(z)] = 0.0  # np.nan_to_num(z, nan=0.0), without its per-call overhead
        return np.clip(z, -_FLOAT_MAX, _FLOAT_MAX, out=z)

    def _pairwise_sq_distance(self, features: np.ndarray, train_rows: np.ndarray | None = None) -> np.ndarray:
        """Squared distance: the standardized numeric one plus one per differing categorical setting.

        Two products (:func:`_distance_table`): ``|z - t|^2 + mismatches`` is
        ``|z|^2 + (|t|^2 + n_categorical) - 2 z . t - onehot(codes) . onehot(t)``: a matching setting adds one
        to the product of the one-hots, so it takes one away from the mismatches. Placement sends a handful of
        rows, for which numpy's per-call cost dominates, hence the few calls. Rows with a missing numeric value
        (NaN: standardized to 0), a code outside its vocabulary (NaN: matches nothing, as ``NaN != x``) or a
        value so far out that its square overflows take the element-wise form, which handles them.

        With ``distance_signs_`` the one-sided features are left out of the products (zero in both operands) and
        add ``max(0, sign * (z - t))^2`` each, element by element (:func:`_one_sided_sq_distance`).
        """
        table = _distance_table(self)
        if table is None:  # a model of another feature layout: element by element
            return self._elementwise_sq_distance(features, train_rows)
        features = np.ascontiguousarray(features)  # row-major: einsum's order per output then follows the rows
        z = (features[:, :_N_VRAM_NUMERIC] - self.numeric_mean_) / self.numeric_scale_
        codes = features[:, _N_VRAM_NUMERIC:]
        # NaN fails every comparison; a code must be a whole index into its vocabulary
        if (np.abs(z).max(initial=0.0) <= _EXPANSION_LIMIT and codes.min(initial=0.0) >= 0
                and (codes < _CATEGORY_SIZES).all() and (codes == np.floor(codes)).all()):
            return self._clean_sq_distance(z, codes, table, train_rows)
        # some rows cannot take the product: each row the form it takes alone (so the same numbers as alone)
        clean = ((np.abs(z) <= _EXPANSION_LIMIT).all(axis=1)
                 & ((codes >= 0) & (codes < _CATEGORY_SIZES) & (codes == np.floor(codes))).all(axis=1))
        constant = table.train_constant
        n_train = constant.size if train_rows is None else constant[train_rows].size
        out = np.empty((features.shape[0], n_train))
        if clean.any():
            out[clean] = self._clean_sq_distance(z[clean], codes[clean], table, train_rows)
        out[~clean] = self._elementwise_sq_distance(features[~clean], train_rows)
        return out

    def _clean_sq_distance(self, z: np.ndarray, codes: np.ndarray, table: DistanceTable,
                           train_rows: np.ndarray | None) -> np.ndarray:
        """The squared distance of clean rows: the products over the two-sided features, plus the one-sided ones."""
        if not table.one_sided_columns.size:
            return self._expanded_sq_distance(z, codes, table, train_rows)
        sq = self._expanded_sq_distance(z * table.two_sided, codes, table, train_rows)
        return sq + _one_sided_sq_distance(z, table, train_rows)

    def _expanded_sq_distance(self, z: np.ndarray, codes: np.ndarray,
                              table: DistanceTable,
                              train_rows: np.ndarray | None) -> np.ndarray:
        """The squared distance of clean rows (standardized numeric ``z``, whole in-vocabulary ``codes``) by the
        products. Each row's numbers are the ones it gets alone: ``einsum`` sums every output over the features
        in one order whatever the number of rows (BLAS's matrix product does not), and the one-hot product counts
        matches, whole numbers that any order sums exactly."""
        numeric_t, one_hot_t, train_constant = table.numeric_t, table.one_hot_t, table.train_constant
        if train_rows is not None:
            numeric_t, one_hot_t = numeric_t[:, train_rows], one_hot_t[:, train_rows]
            train_constant = train_constant[train_rows]
        n_rows = z.shape[0]
        hits = np.zeros((n_rows, one_hot_t.shape[0]))
        hits[np.arange(n_rows)[:, None], (codes + _CATEGORY_OFFSETS).astype(np.intp)] = 1.0
        sq = np.einsum("ik,kj->ij", z, numeric_t)
        sq *= -2.0
        sq -= hits @ one_hot_t
        sq += train_constant
        sq += (z * z).sum(axis=1)[:, None]
        return np.maximum(sq, 0.0, out=sq)  # rounding in the expansion can dip a zero distance below 0

    def _elementwise_sq_distance(self, features: np.ndarray, train_rows: np.ndarray | None) -> np.ndarray:
        """The squared distance element by element: NaN numeric values standardized to 0, a NaN code matching
        nothing (``NaN != x``), values of any size (clipped to the float range)."""
        z = np.ascontiguousarray(self._standardize(features))
        train_z, train_c = self.train_numeric_, self.train_codes_
        if train_rows is not None:
            train_z, train_c = train_z[train_rows], train_c[train_rows]
        # row-major operands: the sum over the last axis then runs in one order per row, whatever the batch
        train_z = np.ascontiguousarray(train_z)
        codes = features[:, _CATEGORICAL_COLUMNS]
        diff = z[:, None, :] - train_z[None, :, :]
        signs = _distance_signs(self)
        if signs is not None:  # the one-sided features on their one side only
            columns = np.flatnonzero(signs)
            diff[:, :, columns] = np.maximum(diff[:, :, columns] * signs[columns], 0.0)
        sq = (diff ** 2).sum(axis=2)
        return sq + (codes[:, None, :] != train_c[None, :, :]).sum(axis=2)

    def log_correction(self, X: Sequence[VramCase] | np.ndarray) -> np.ndarray:
        """``f(x)``: the learned ``ln(measured / analytic)`` of each case (or feature row), before the
        shrinkage ``alpha_``."""
        self._require_fitted()
        features = X if isinstance(X, np.ndarray) else feature_matrix(list(X))
        if getattr(self, "compiled_", None) is not None:
            return predict_compiled_flat(self.compiled_, features)
        return self._regressor_log_correction(features)

    def predict(self, X: Sequence[VramCase]) -> np.ndarray:
        """Corrected peak bytes of the level each case's metric is compared with."""
        return self.predict_with_upper(X)[0]

    def predict_upper(self, X: Sequence[VramCase]) -> np.ndarray:
        """Upper bound in bytes that the measured peak stays below with probability ``coverage``."""
        return self.predict_with_upper(X)[1]

    def predict_with_upper(self, X: Sequence[VramCase]) -> tuple[np.ndarray, np.ndarray]:
        """Point prediction and upper bound (bytes) in one pass over the features."""
        self._require_fitted()
        cases = list(X)
        return self._point_and_upper(feature_matrix(cases), [c.spec for c in cases],
                                     [c.level_bytes for c in cases], [c.floor_bytes for c in cases])

    def _point_and_upper(self, features: np.ndarray, specs: Sequence[TrainingSpec], levels: Sequence[int],
                         floors: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`predict_with_upper` of feature rows whose analytic level and resident model states are
        ``levels`` and ``floors`` (bytes)."""
        f, width = self._row_terms(features, specs)
        point = np.empty(len(levels))
        upper = np.empty(len(levels))
        for i, (level, floor) in enumerate(zip(levels, floors, strict=True)):
            analytic = float(max(level, 1))
            point[i] = p = max(float(floor), analytic * math.exp(f[i]))
            upper[i] = max(p, analytic * math.exp(f[i] + width[i]))
        return point, upper

    def upper_floor_bytes(self, spec: TrainingSpec, device_bytes: int, resident: int) -> float:
        """A number the calibrated bound that :func:`correct_vram` gives an analytic prediction of ``spec`` is
        never below, from its device peak ``device_bytes`` and resident model states ``resident`` alone (no
        features, no tree walk, no distance).

        With a shrinkage of 0 the bound is ``analytic * exp(offset + margin * w)`` (or the point if larger) with
        a widening ``w >= 1`` and the site offset (0 without a site stage): so at least
        ``analytic * exp(offset + max(margin, 0))``. With a learned correction the
        point may fall below the analytic peak, but never below the resident model states. Placement uses it to
        skip GPU counts that surely do not fit.
        """
        factor = self.upper_floor_factor(spec)
        return float(resident) if factor is None else device_bytes * factor

    def upper_floor_factor(self, spec: TrainingSpec) -> float | None:
        """The factor on the device peak that :meth:`upper_floor_bytes` applies to ``spec`` (the same for all
        its GPUs and counts: placement works it out once per spec); ``None`` with a learned correction, whose
        floor is the resident model states."""
        self._require_fitted()
        if self.alpha_:
            return None
        margin = self._margin(spec)
        lowest_widening = min(1.0, self.max_widening) if self.distance_weight >= 0 else 0.0
        return math.exp(self._site_offset(spec) + max(margin, 0.0) * lowest_widening)


class RuntimeServing(ConformalServing):
    """Prediction with a fitted runtime (throughput) residual: point and calibrated lower bound of tokens/s.

    Fitted state it reads beyond :class:`ConformalServing`'s: ``scaling_`` (range, mean and scale of the
    training features), ``train_distance_rows_`` and ``linear_`` (the ridge's coefficients; without them the
    estimator's regressor).
    """

    scaling_: dict[str, np.ndarray]
    train_distance_rows_: np.ndarray

    def _pairwise_sq_distance(self, features: np.ndarray, train_rows: np.ndarray | None = None) -> np.ndarray:
        """Squared Euclidean distances to the training cases (standardized, unclipped: a case beyond the
        training range is far from it)."""
        train = self.train_distance_rows_ if train_rows is None else self.train_distance_rows_[train_rows]
        diff = scale_features(features, self.scaling_, clip=False)[:, None, :] - train[None, :, :]
        return (diff * diff).sum(axis=2)

    def log_correction(self, X: Sequence[RuntimeCase] | np.ndarray) -> np.ndarray:
        """``f(x)``: the learned ``ln(measured / analytic)`` tokens/s of each case (or feature row), before
        the shrinkage ``alpha_``."""
        self._require_fitted()
        features = X if isinstance(X, np.ndarray) else runtime_feature_matrix(list(X))
        rows = scale_features(features, self.scaling_)
        if getattr(self, "linear_", None) is not None:  # one dot product: no input validation per call
            return rows @ self.linear_["coef"] + float(self.linear_["intercept"])
        return self._regressor_log_correction(rows)

    def predict(self, X: Sequence[RuntimeCase]) -> np.ndarray:
        """Corrected tokens/s of each job."""
        return self.predict_with_lower(X)[0]

    def predict_lower(self, X: Sequence[RuntimeCase]) -> np.ndarray:
        """Tokens/s that each job reaches with probability ``coverage``."""
        return self.predict_with_lower(X)[1]

    def predict_with_lower(self, X: Sequence[RuntimeCase]) -> tuple[np.ndarray, np.ndarray]:
        """Point prediction and lower bound of the job's tokens/s in one pass over the features."""
        self._require_fitted()
        cases = list(X)
        f, width = self._row_terms(runtime_feature_matrix(cases), [c.spec for c in cases])
        point = np.empty(len(cases))
        lower = np.empty(len(cases))
        for i, case in enumerate(cases):
            analytic = max(case.analytic_tokens_per_second, 1e-30)
            point[i] = p = analytic * math.exp(f[i])
            lower[i] = min(p, analytic * math.exp(f[i] - width[i]))
        return point, lower


class DistanceTable(NamedTuple):
    """A fitted model's training cases, arranged for the distance's products (:func:`_distance_table`)."""

    numeric_t: np.ndarray  # standardized numeric columns x cases, the one-sided columns zeroed
    one_hot_t: np.ndarray  # one-hot categorical columns x cases
    train_constant: np.ndarray  # per case: |t|^2 (two-sided columns) + the number of categorical features
    signed_t: np.ndarray  # sign * the one-sided columns, one-sided columns x cases
    one_sided_columns: np.ndarray  # positions of the one-sided columns among the numeric ones
    one_sided_signs: np.ndarray  # their signs
    two_sided: np.ndarray  # per numeric column: 1 two-sided, 0 one-sided


_TABLES: dict[tuple[int, bytes | None], tuple[np.ndarray, np.ndarray, DistanceTable | None]] = {}


def _distance_signs(model: VramServing) -> np.ndarray | None:
    """The model's one-sided distance signs per numeric column: ``distance_signs_``, else the token features' for
    an estimator fitted with the earlier ``token_monotone_distance_`` (read back from its skops file), else
    ``None`` (symmetric)."""
    signs = getattr(model, "distance_signs_", None)
    if signs is not None:
        return np.asarray(signs, dtype=np.float64)
    return _TOKEN_SIGNS if getattr(model, "token_monotone_distance_", False) else None


def _distance_table(model: VramServing) -> DistanceTable | None:
    """The model's training cases arranged for the distance's products (memoised per fitted model and signs);
    ``None`` when a training code is outside its vocabulary or the layout is not this code's (numeric columns
    first, then the categorical ones)."""
    train_z, train_c = model.train_numeric_, model.train_codes_
    signs = _distance_signs(model)
    key = (id(train_z), None if signs is None else signs.tobytes())
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is train_z and hit[1] is train_c:
        return hit[2]
    table: DistanceTable | None = None
    layout = (bool(np.array_equal(_NUMERIC_COLUMNS, np.arange(_N_VRAM_NUMERIC)))
              and train_c.ndim == 2 and train_c.shape[1] == len(_CATEGORY_SIZES)
              and train_z.ndim == 2 and train_z.shape[1] == _N_VRAM_NUMERIC
              and (signs is None or np.shape(signs) == (_N_VRAM_NUMERIC,)))
    if layout and bool(((train_c >= 0) & (train_c < _CATEGORY_SIZES) & (train_c == np.round(train_c))).all()):
        signed = np.zeros(_N_VRAM_NUMERIC) if signs is None else signs
        columns = np.flatnonzero(signed)
        two_sided = np.where(signed != 0, 0.0, 1.0)
        operand = train_z * two_sided
        one_hot = np.zeros((train_c.shape[0], _ONE_HOT_WIDTH))
        one_hot[np.arange(train_c.shape[0])[:, None], (_CATEGORY_OFFSETS + train_c).astype(np.intp)] = 1.0
        table = DistanceTable(np.ascontiguousarray(operand.T), np.ascontiguousarray(one_hot.T),
                              (operand * operand).sum(axis=1) + train_c.shape[1],
                              np.ascontiguousarray((train_z[:, columns] * signed[columns]).T),
                              columns, signed[columns], two_sided)
    if len(_TABLES) > 16:
        _TABLES.clear()
    _TABLES[key] = (train_z, train_c, table)
    return table


def _one_sided_sq_distance(z: np.ndarray, table: DistanceTable, train_rows: np.ndarray | None) -> np.ndarray:
    """The one-sided features' part of the squared distance: ``sum max(0, sign * (z - t))^2`` over the table's
    one-sided columns (standardized ``z``; rows x selected training cases). The training side is the table's signed,
    transposed columns (one-sided features x cases), so that each pass runs along the cases."""
    signed_t = table.signed_t if train_rows is None else table.signed_t[:, train_rows]
    # features x rows x cases, C-ordered: a reduction over the outermost axis adds the features' slices one after
    # another, whatever the number of rows or cases, so each row's sums are the ones it gets alone (over a middle
    # axis numpy may sum 8 or more features pairwise, in an order that depends on the shape)
    signed_z = (z[:, table.one_sided_columns] * table.one_sided_signs).T
    excess = np.empty((signed_z.shape[0], signed_z.shape[1], signed_t.shape[1]))  # C order, whatever the operands'
    np.subtract(signed_z[:, :, None], signed_t[:, None, :], out=excess)
    np.maximum(excess, 0.0, out=excess)
    excess *= excess
    return excess.sum(axis=0)


def scale_features(features: np.ndarray, scaling: dict[str, np.ndarray], clip: bool = True) -> np.ndarray:
    """``Z``: numeric columns (clipped to the training range with ``clip``) standardized; one-hot as is."""
    numeric = features[:, :_N_NUMERIC]
    if clip:
        numeric = np.minimum(np.maximum(numeric, scaling["low"]), scaling["high"])
    z = features.copy()
    z[:, :_N_NUMERIC] = (numeric - scaling["mean"]) / scaling["scale"]
    return z


# ---- the boosted trees as flat arrays -----------------------------------------------------------------------
# scikit-learn's HistGradientBoostingRegressor.predict validates its input and starts an OpenMP region per
# call: milliseconds for one row. Placement calls predict() thousands of times per second, so the fitted
# trees are copied into flat arrays once and walked level by level with numpy for all trees at once.
# The walk follows sklearn/ensemble/_hist_gradient_boosting/_predictor.pyx: NaN takes the node's missing
# direction; a categorical value goes left if in the node's left set, right if a known category, and the
# missing direction otherwise; a numeric value goes left if <= the threshold.

_CATEGORY_TABLE_SIZE = 256  # HistGradientBoosting's largest category code + 1


def predict_compiled(compiled: dict[str, np.ndarray], features: np.ndarray) -> np.ndarray:
    """Raw predictions of compiled trees for the rows of ``features`` (identity link: the regression value)."""
    n_trees = compiled["feature"].shape[0]
    rows = features.shape[0]
    tree_idx = np.broadcast_to(np.arange(n_trees), (rows, n_trees))
    row_idx = np.broadcast_to(np.arange(rows)[:, None], (rows, n_trees))
    node = np.zeros((rows, n_trees), dtype=np.intp)
    for _ in range(int(compiled["depth"])):
        x = features[row_idx, compiled["feature"][tree_idx, node]]
        missing = np.isnan(x)
        code = np.where(missing | (x < 0) | (x >= _CATEGORY_TABLE_SIZE), -1, np.nan_to_num(x)).astype(np.intp)
        missing_left = compiled["missing_left"][tree_idx, node]
        categorical_left = np.where(code >= 0, compiled["category_left"][tree_idx, node, np.maximum(code, 0)],
                                    missing_left)
        numeric_left = np.where(missing, missing_left, x <= compiled["threshold"][tree_idx, node])
        go_left = np.where(compiled["is_categorical"][tree_idx, node], categorical_left, numeric_left)
        step = np.where(go_left, compiled["left"][tree_idx, node], compiled["right"][tree_idx, node])
        node = np.where(compiled["is_leaf"][tree_idx, node], node, step)
    return float(compiled["baseline"]) + compiled["value"][tree_idx, node].sum(axis=1)


# ---- applying a fitted model to one prediction --------------------------------------------------------
_LEVEL_METRICS: dict[str, str] = {
    "peak_allocated_bytes": "allocated",
    "peak_reserved_bytes": "reserved",
    "peak_vram_bytes": "nvml",
}


@dataclass(frozen=True)
class CorrectedVram:
    """An analytic prediction with the residual applied to its three levels, and the calibrated bound."""

    vram: VramPrediction  # corrected levels; the breakdown gains ``residual_correction`` so it still sums
    upper_bytes: int  # calibrated upper bound of the device peak (nvml level)
    correction_ratio: float  # corrected / analytic device peak


def correct_vram(model: VramServing, spec: TrainingSpec, architecture: Architecture,
                 gpu: GpuSpec | None, vram: VramPrediction) -> CorrectedVram:
    """Apply ``model`` to the three levels of ``vram`` (one batched pass over three feature rows)."""
    return correct_vram_many(model, spec, architecture, [(gpu, vram)])[0]


def correct_vram_many(model: VramServing, spec: TrainingSpec, architecture: Architecture,
                      items: Sequence[tuple[GpuSpec | None, VramPrediction]]) -> list[CorrectedVram]:
    """:func:`correct_vram` of one spec on several (GPU, analytic prediction) pairs in one batched pass.

    Rows are independent, so the result of each pair is the one it gets alone; placement predicts a spec
    on every pool's GPU at once and pays the fixed cost of the numpy calls once instead of per pool.
    With a shrinkage of 0 and no site offset the levels stay analytic (above the model-state floor) and only
    the device level's upper bound needs the features: one row instead of three.
    """
    device_only: list[bool] = []
    corrects = model.corrects_point
    residents = [resident_bytes(vram) for _, vram in items]
    for (_, vram), resident in zip(items, residents, strict=True):
        device_only.append(not corrects and resident <= vram.peak_allocated_bytes)
    if all(device_only):  # placement's usual case: one device-level row per pair, without case objects
        model._require_fitted()
        device_metric = _LEVEL_METRICS["peak_vram_bytes"]
        point, upper = model._point_and_upper(
            device_feature_matrix(spec, architecture, items, device_metric), [spec] * len(items),
            [vram.peak_vram_bytes for _, vram in items], residents)
    else:
        cases: list[VramCase] = []
        for (gpu, vram), alone in zip(items, device_only, strict=True):
            metrics = (_LEVEL_METRICS["peak_vram_bytes"],) if alone else tuple(_LEVEL_METRICS.values())
            cases.extend(VramCase(spec, architecture, gpu, metric, vram) for metric in metrics)
        point, upper = model.predict_with_upper(cases)
    out: list[CorrectedVram] = []
    row = 0
    for (_, vram), alone in zip(items, device_only, strict=True):
        if alone:
            breakdown = {**vram.breakdown_bytes, "residual_correction": 0}
            out.append(CorrectedVram(with_breakdown(vram, breakdown),
                                     max(int(round(upper[row])), vram.peak_vram_bytes), 1.0))
            row += 1
            continue
        allocated = int(round(point[row]))
        reserved = max(int(round(point[row + 1])), allocated)
        device = max(int(round(point[row + 2])), reserved)
        breakdown = dict(vram.breakdown_bytes)
        breakdown["residual_correction"] = device - vram.peak_vram_bytes
        corrected = replace(vram, peak_allocated_bytes=allocated, peak_reserved_bytes=reserved,
                            peak_vram_bytes=device, breakdown_bytes=breakdown)
        ratio = device / vram.peak_vram_bytes if vram.peak_vram_bytes else 1.0
        out.append(CorrectedVram(corrected, max(int(round(upper[row + 2])), device), ratio))
        row += 3
    return out


# ---- flat tree walk -------------------------------------------------------------------------------------
# The arrays of compile_hist_gradient_boosting, flattened: node ``t * size + i`` is node ``i`` of tree ``t``,
# children are global node ids, a leaf is its own child (so the walk needs no leaf test), and each level of
# the walk is a handful of 1-D takes over all (row, tree) pairs. The leaves' values are then summed exactly as
# predict_compiled sums them (along the trees of each row), so the two give bit-identical predictions.
_FLAT: dict[int, tuple[dict[str, np.ndarray], dict[str, Any]]] = {}  # id(compiled) -> (compiled, flat)


def flatten_compiled(compiled: dict[str, np.ndarray]) -> dict[str, Any]:
    """The flat form of ``compiled`` (memoised per compiled model)."""
    hit = _FLAT.get(id(compiled))
    if hit is not None and hit[0] is compiled:
        return hit[1]
    n_trees, size = compiled["feature"].shape
    own = np.arange(n_trees * size).reshape(n_trees, size)
    offset = (np.arange(n_trees) * size)[:, None]
    leaf = compiled["is_leaf"]
    categorical = compiled["is_categorical"] & ~leaf
    flat: dict[str, Any] = {
        "roots": offset.ravel().copy(),
        "feature": np.where(leaf, 0, compiled["feature"]).ravel(),
        "threshold": compiled["threshold"].ravel(),
        "left": np.where(leaf, own, compiled["left"] + offset).ravel(),
        "right": np.where(leaf, own, compiled["right"] + offset).ravel(),
        "missing_left": compiled["missing_left"].ravel(),
        "is_categorical": categorical.ravel(),
        "any_categorical": bool(categorical.any()),
        "category_left": compiled["category_left"].reshape(-1),
        "value": compiled["value"].ravel(),
        "depth": int(compiled["depth"]),
        "baseline": float(compiled["baseline"]),
    }
    if len(_FLAT) > 16:
        _FLAT.clear()
    _FLAT[id(compiled)] = (compiled, flat)
    return flat


def predict_compiled_flat(compiled: dict[str, np.ndarray], features: np.ndarray) -> np.ndarray:
    """:func:`predict_compiled` (the same numbers, bit for bit) by a flat, level-by-level walk of all trees
    for all rows at once."""
    flat = flatten_compiled(compiled)
    features = np.ascontiguousarray(features, dtype=np.float64)
    rows, n_columns = features.shape
    values = features.ravel()
    node = np.broadcast_to(flat["roots"], (rows, flat["roots"].size)).ravel()
    row_start = np.repeat(np.arange(rows) * n_columns, flat["roots"].size)
    feature, threshold, left, right = flat["feature"], flat["threshold"], flat["left"], flat["right"]
    missing_left = flat["missing_left"]
    for _ in range(flat["depth"]):
        x = values.take(row_start + feature.take(node))
        missing = np.isnan(x)
        go_left = x <= threshold.take(node)  # NaN compares False; fixed below
        if missing.any():
            go_left = np.where(missing, missing_left.take(node), go_left)
        if flat["any_categorical"]:
            categorical = flat["is_categorical"].take(node)
            if categorical.any():
                code = np.where(missing | (x < 0) | (x >= _CATEGORY_TABLE_SIZE), -1, np.nan_to_num(x)).astype(np.intp)
                by_code = flat["category_left"].take(node * _CATEGORY_TABLE_SIZE + np.maximum(code, 0))
                categorical_left = np.where(code >= 0, by_code, missing_left.take(node))
                go_left = np.where(categorical, categorical_left, go_left)
        node = np.where(go_left, left.take(node), right.take(node))
    return flat["baseline"] + flat["value"].take(node).reshape(rows, -1).sum(axis=1)


# ---- applying a fitted runtime model to one prediction---------------------------------------------------
@dataclass(frozen=True)
class CorrectedRuntime:
    """An analytic runtime prediction with the residual applied, and the calibrated bounds."""

    tokens_per_second: float  # corrected, whole job
    tokens_per_second_lower: float  # reached with probability ``coverage``
    runtime_seconds: float | None  # corrected; None without train_tokens or steps
    runtime_upper_seconds: float | None  # the job finishes within this with probability ``coverage``
    correction_ratio: float  # corrected / analytic tokens/s


def scale_runtime(runtime: RuntimePrediction, tokens_per_second: float, tokens_per_second_lower: float
                  ) -> CorrectedRuntime:
    """Runtime and its upper bound for a throughput and a lower bound of it (work / throughput)."""
    analytic = runtime.tokens_per_second
    seconds = runtime.runtime_seconds
    return CorrectedRuntime(
        tokens_per_second=tokens_per_second,
        tokens_per_second_lower=tokens_per_second_lower,
        runtime_seconds=None if seconds is None else seconds * analytic / tokens_per_second,
        runtime_upper_seconds=None if seconds is None else seconds * analytic / tokens_per_second_lower,
        correction_ratio=tokens_per_second / analytic,
    )


def runtime_prediction_fields_many(spec: TrainingSpec, architecture: Architecture,
                                   items: Sequence[tuple[GpuSpec, int, RuntimePrediction]],
                                   loaded: LoadedModel | None) -> list[dict[str, Any]]:
    """The runtime fields of a :class:`~predictors.predict.Prediction` for each ``(gpu, gpus, analytic runtime)``
    of one spec: throughput and runtime (corrected by ``loaded``, the runtime residual, when there is one),
    their bounds, and the model's version and correction ratio; without a model the bound is the analytic
    runtime times ``1 + DEFAULT_RUNTIME_UPPER_MARGIN``. One batched pass of the residual (rows are
    independent: each result is the one it gets alone)."""
    if not items:
        return []
    if loaded is None:
        fixed = [scale_runtime(r, r.tokens_per_second, r.tokens_per_second / (1 + DEFAULT_RUNTIME_UPPER_MARGIN))
                 for _, _, r in items]
        extras: list[dict[str, Any]] = [{} for _ in items]
    else:
        cases = [RuntimeCase(spec, architecture, gpu, gpus, r) for gpu, gpus, r in items]
        point, lower = predict_with_lower_exact(loaded.model, cases)
        fixed = [scale_runtime(c.runtime, float(p), float(lo)) for c, p, lo in zip(cases, point, lower, strict=True)]
        extras = [{"runtime_model_version": loaded.version, "runtime_correction_ratio": f.correction_ratio}
                  for f in fixed]
    return [{"throughput_tokens_per_second": f.tokens_per_second,
             "throughput_lower_tokens_per_second": f.tokens_per_second_lower,
             "runtime_seconds": f.runtime_seconds, "runtime_upper_seconds": f.runtime_upper_seconds, **extra}
            for f, extra in zip(fixed, extras, strict=True)]


def predict_with_lower_exact(model: RuntimeServing, cases: Sequence[RuntimeCase]
                             ) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`RuntimeServing.predict_with_lower` of ``cases``, each row bit-identical to predicting it
    alone: in one batched pass when the learned correction is off (``alpha_ == 0``; every other step is
    elementwise per row), else row by row, because the correction's dot product (BLAS) may round differently
    with the number of rows it sees (placement compares its batched decisions with single predictions)."""
    if not getattr(model, "alpha_", 0.0) or len(cases) < 2:
        return model.predict_with_lower(cases)
    rows = [model.predict_with_lower([case]) for case in cases]
    return np.concatenate([p for p, _ in rows]), np.concatenate([lo for _, lo in rows])


# ---- a fitted model's state, applied without scikit-learn ------------------------------------------------
SERVING_FORMAT_VERSION = 1
# a model with a site stage is written as format 2 (an older reader refuses it and falls back to the skops
# file instead of silently dropping the stage); one without stays format 1, byte for byte as before
SITE_FORMAT_VERSION = 2
_READABLE_FORMATS = (SERVING_FORMAT_VERSION, SITE_FORMAT_VERSION)
_SITE_SCALARS: tuple[str, ...] = ("site_offsets_", "site_quantiles_")
# what both kinds keep: the shrinkage, the conformal margins, the distance reference and widening parameters
_SERVING_SCALARS: tuple[str, ...] = ("alpha_", "quantile_", "class_quantiles_", "distance_ref_", "n_neighbors",
                                     "distance_weight", "max_widening", "n_features_in_")


class ServedVramModel(VramServing):
    """A fitted VRAM residual's prediction state (:func:`served_model`), applied as the estimator applies it."""


class ServedRuntimeModel(RuntimeServing):
    """A fitted runtime residual's prediction state (:func:`served_model`), applied as the estimator applies it."""


# per kind: the class, its array attributes, and its attributes that are dicts of arrays
_SERVING_KINDS: dict[str, tuple[type[ConformalServing], tuple[str, ...], tuple[str, ...]]] = {
    "vram": (ServedVramModel, ("numeric_mean_", "numeric_scale_", "train_numeric_", "train_codes_"), ("compiled_",)),
    "runtime": (ServedRuntimeModel, ("train_distance_rows_",), ("scaling_", "linear_")),
}


def serving_state(model: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The numbers (JSON-able) and arrays that :func:`served_model` applies ``model`` with, a fitted VRAM or
    runtime residual; ``None`` when it is not fitted or its correction has no array form (a regressor other
    than the default boosted trees or ridge: then only the estimator itself can apply it)."""
    kind = "vram" if isinstance(model, VramServing) else "runtime" if isinstance(model, RuntimeServing) else None
    if kind is None or not hasattr(model, "quantile_"):
        return None
    _, array_names, dict_names = _SERVING_KINDS[kind]
    arrays = {name: np.asarray(getattr(model, name)) for name in array_names}
    for name in dict_names:
        value = getattr(model, name, None)
        if value is None:
            return None
        arrays.update({f"{name}/{key}": np.asarray(array) for key, array in value.items()})
    params: dict[str, Any] = {"kind": kind, "serving_format_version": SERVING_FORMAT_VERSION}
    for name in _SERVING_SCALARS:
        value = getattr(model, name)
        params[name] = ({str(k): float(v) for k, v in value.items()} if isinstance(value, dict)
                        else int(value) if name in ("n_neighbors", "n_features_in_") else float(value))
    signs = _distance_signs(model) if kind == "vram" else None
    if signs is not None:  # absent (older files): the symmetric distance, or the token-monotone one
        params["distance_signs_"] = [int(v) for v in signs]
    site = {name: {str(k): float(v) for k, v in (getattr(model, name, None) or {}).items()} for name in _SITE_SCALARS}
    if any(site.values()):
        params.update(site, serving_format_version=SITE_FORMAT_VERSION)
    return params, arrays


def _read_distance_signs(params: dict[str, Any]) -> np.ndarray | None:
    """The one-sided distance's signs a serving file states: ``distance_signs_`` (one of -1, 0, 1 per numeric
    feature), or the token features' under the earlier ``token_monotone_distance_``; ``None`` (symmetric) if
    neither."""
    signs = params.get("distance_signs_")
    if signs is not None:
        if (not isinstance(signs, list) or len(signs) != _N_VRAM_NUMERIC
                or not all(type(v) is int and v in (-1, 0, 1) for v in signs)):
            raise ValueError(f"distance_signs_ must be {_N_VRAM_NUMERIC} of -1, 0 and 1; got {signs!r}")
        return np.asarray(signs, dtype=np.float64)
    monotone = params.get("token_monotone_distance_", False)
    if not isinstance(monotone, bool):
        raise ValueError(f"token_monotone_distance_ must be true or false; got {monotone!r}")
    return _TOKEN_SIGNS.copy() if monotone else None


def served_model(params: dict[str, Any], arrays: dict[str, np.ndarray]) -> ServedVramModel | ServedRuntimeModel:
    """The model that :func:`serving_state` describes; ``ValueError`` saying what is missing or wrong."""
    if params.get("serving_format_version") not in _READABLE_FORMATS:
        raise ValueError(f"serving format {params.get('serving_format_version')!r}, this code reads "
                         f"{' and '.join(map(str, _READABLE_FORMATS))}")
    kind = params.get("kind")
    if kind not in _SERVING_KINDS:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(_SERVING_KINDS)}")
    cls, array_names, dict_names = _SERVING_KINDS[kind]
    model = cls()
    for name in _SERVING_SCALARS:
        if name not in params:
            raise ValueError(f"{name} is missing")
        setattr(model, name, params[name])
    if kind == "vram":
        model.distance_signs_ = _read_distance_signs(params)
    for name in _SITE_SCALARS:
        value = params.get(name, {})
        if not isinstance(value, dict) or not all(isinstance(v, int | float) for v in value.values()):
            raise ValueError(f"{name} must map method groups to numbers")
        setattr(model, name, {str(k): float(v) for k, v in value.items()})
    for name in array_names:
        if name not in arrays:
            raise ValueError(f"array {name} is missing")
        setattr(model, name, arrays[name])
    for name in dict_names:
        members = {key.split("/", 1)[1]: array for key, array in arrays.items() if key.startswith(f"{name}/")}
        if not members:
            raise ValueError(f"arrays {name}/* are missing")
        setattr(model, name, members)
    for name in (*_SERVING_SCALARS, *array_names):  # a damaged file fails here, not in a prediction
        value = getattr(model, name)
        numbers = np.asarray(value, dtype=float) if not isinstance(value, dict) else np.array(list(value.values()))
        if numbers.size and not np.isfinite(numbers).all():
            raise ValueError(f"{name} holds values that are not finite numbers")
    if getattr(model, "distance_ref_", 1.0) <= 0:
        raise ValueError("distance_ref_ must be positive")
    return model

