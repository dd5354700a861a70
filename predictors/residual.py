"""A learned correction on top of the analytic peak-VRAM model, with a conformal upper bound.

The analytic model (:mod:`predictors.vram`) explains; this estimator corrects what it systematically misses
(allocator behaviour, kernel workspaces, framework quirks) and says how far off it may still be.
It has the shape of scikit-learn's ``TransformedTargetRegressor``: the unfitted ``regressor`` is a
parameter, its fitted clone is ``regressor_``.

Notation for one case ``x`` (a :class:`~predictors.features.VramCase`): ``a(x)`` the analytic bytes of the
level its metric is compared with, ``m(x)`` the resident model states (weights, adapters, master weights,
optimizer states: the floor), ``F(x)`` its feature vector, ``w(x) >= 1`` its widening.

* ``fit(X, y, groups)``: ``r_i = ln(y_i / a(x_i))``; ``regressor_ = clone(regressor).fit(F(X), r, v)`` with
  case weights ``v_i = 1 / (cases of x_i's group)`` (``group_weighting``: every source weighs the same, so
  the two sources with 66 and 44 runs do not decide the model alone). Calibration (cross-conformal): the
  cases are split into folds (one fold per group when ``groups`` are given, so a fold is a source the fold's
  model never saw); each fold is predicted by a clone fitted on the other folds (``f_-i``). The shrinkage
  ``alpha_`` in [0, 1] minimises the weighted median of ``|r_i - alpha * f_-i(x_i)|`` over those
  out-of-fold predictions, and is 0 unless it also keeps the weighted 90th percentile of that error and
  lowers the median error of most sources: a correction that does not carry over to unseen sources is
  dropped (``alpha_ = 0``, the analytic model). Scores ``s_i = (r_i - alpha_ * f_-i(x_i)) / w_-i(x_i)``.
  Margins: ``quantile_`` over all scores, and ``class_quantiles_`` over the scores of full fine-tuning and
  of adapter methods separately (``mondrian``; their errors spread differently). With groups, each
  is a weighted quantile (every source the same) at the level chosen by
  :func:`source_calibrated_quantile` (the quantile of the other sources covers ``coverage`` of a held-out
  source's cases); without, the ``ceil((n + 1) * coverage) / n`` empirical quantile.
* ``predict(X) = max(m(x), a(x) * exp(alpha_ * f(x)))`` with ``f = regressor_.predict``.
* ``predict_upper(X) = max(predict(X), a(x) * exp(alpha_ * f(x) + q(x) * w(x)))``, ``q(x)`` the margin of
  ``x``'s method group (``quantile_`` where a group had too few sources to calibrate its own).

* Site stage (VRAM, the cases of ``site_group``: this cluster's ledger actuals): ``f(x)`` gains the site's log
  offset of ``x``'s method group, and ``q(x)`` becomes the site's margin where its actuals calibrate one (see
  the comment above :data:`SITE_GROUP`).

``w(x) = min(max_widening, 1 + distance_weight * max(0, d(x) / d_ref - 1))`` where ``d(x)`` is the mean
distance of ``x`` to its ``n_neighbors`` nearest training cases (standardized numeric features, plus one
per differing categorical setting) and ``d_ref`` the ``ordinary_distance`` (90 %) quantile of the training
cases' distances to the *other* sources' cases: a spec no farther from the training data than a typical
new source keeps the calibrated margin, one far from everything the model was trained on gets a
proportionally wider bound, up to ``max_widening`` times the margin (an unbounded margin would make an
unusual spec unschedulable).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GroupKFold, KFold, LeaveOneGroupOut
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_limits

from predictors.features import MONOTONIC_CST, VramCase, feature_matrix

# the prediction-time half (re-exported here: callers and model files name these from predictors.residual)
from predictors.residual_serving import (  # noqa: F401
    _CATEGORICAL,
    _CATEGORY_TABLE_SIZE,
    MARGIN_GROUPS,
    MIN_MARGIN_SOURCES,
    ONE_SIDED_SIGNS,
    ConformalServing,
    CorrectedVram,
    VramServing,
    correct_vram,
    correct_vram_many,
    flatten_compiled,
    margin_group,
    predict_compiled,
    predict_compiled_flat,
)
from predictors.spec import TrainingSpec


def default_regressor(random_state: int = 0) -> HistGradientBoostingRegressor:
    """Small, strongly regularised boosted trees: a few hundred training cases, many settings.

    Absolute-error loss (the median is what the accuracy target is stated in, and a few sources are
    outliers), native categorical splits, and the monotonic constraints of :mod:`predictors.features`.
    """
    return HistGradientBoostingRegressor(
        loss="absolute_error",
        learning_rate=0.05,
        max_iter=150,
        max_depth=3,
        min_samples_leaf=10,
        l2_regularization=1.0,
        categorical_features=_CATEGORICAL,
        monotonic_cst=list(MONOTONIC_CST),
        early_stopping=False,
        random_state=random_state,
    )


def calibration_folds(n: int, groups: Sequence[str] | None, cv: int | None, random_state: int
                      ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Folds of the cross-conformal calibration: one per group (``cv`` None) or ``cv`` group folds when
    ``groups`` has two or more groups, else ``cv`` (default 5) shuffled folds."""
    index = np.zeros(n)
    if groups is not None:
        labels = np.asarray(list(groups))
        if len(labels) != n:
            raise ValueError(f"groups has {len(labels)} entries for {n} cases")
        n_groups = len(set(labels.tolist()))
        if n_groups >= 2:
            if cv is None:
                return list(LeaveOneGroupOut().split(index, groups=labels))
            return list(GroupKFold(n_splits=min(cv, n_groups)).split(index, groups=labels))
    splits = min(cv or 5, n)
    return list(KFold(n_splits=splits, shuffle=True, random_state=random_state).split(index))


def group_weights(groups: Sequence[str] | np.ndarray | None, n: int) -> np.ndarray:
    """``1 / (rows of its group)`` for each row, so every group (source) weighs the same in total; ones
    without groups."""
    if groups is None:
        return np.ones(n)
    labels = np.asarray(list(groups))
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def weighted_quantile(values: np.ndarray, weights: np.ndarray, level: float) -> float:
    """The smallest value whose cumulative share of the total weight reaches ``level``."""
    order = np.argsort(values, kind="stable")
    share = np.cumsum(weights[order]) / weights.sum()
    at = int(np.searchsorted(share, level - 1e-12))
    return float(values[order][min(at, len(values) - 1)])


def shrinkage_from_out_of_fold(target: np.ndarray, out_of_fold: np.ndarray, groups: Sequence[str] | None = None,
                               weights: np.ndarray | None = None) -> float:
    """The ``alpha`` in 0, 0.1, ..., 1 that minimises the (weighted) median of ``|target - alpha * out_of_fold|``
    (ties: the smaller correction); 0 unless that ``alpha`` carries over: it must not make the (weighted)
    90th percentile of the error worse than the analytic model's, and with ``groups`` it must lower the
    median error of more than half of the groups (sources) on its own, not just the pooled median."""
    w = np.ones(len(target)) if weights is None else weights
    grid = np.linspace(0.0, 1.0, 11)
    errors = [np.abs(target - alpha * out_of_fold) for alpha in grid]
    best = int(np.argmin([weighted_quantile(e, w, 0.5) for e in errors]))
    if not best or weighted_quantile(errors[best], w, 0.9) > weighted_quantile(errors[0], w, 0.9):
        return 0.0
    if groups is not None:
        labels = np.asarray(list(groups))
        names = np.unique(labels)
        better = sum(np.median(errors[best][labels == g]) < np.median(errors[0][labels == g]) for g in names)
        if 2 * better <= len(names):
            return 0.0
    return float(grid[best])


# How much a held-out source's own coverage counts in the choice of the conformal level: n / (n + this) for
# a source with n cases, so a source with one or two runs (covered 0 % or 100 %) does not decide it alone.
SOURCE_RELIABILITY_CASES = 5.0


def source_calibrated_quantile(scores: np.ndarray, groups: np.ndarray, coverage: float) -> tuple[float, float]:
    """A quantile of ``scores`` (each group weighing the same) that covers ``coverage`` of a group it did not
    see, and the level it was taken at.

    The level is the smallest of ``coverage, coverage + 0.0025, ..., 1`` at which the share of each group
    ``g``'s scores at or below the level's weighted quantile of the *other* groups' scores reaches
    ``coverage`` on average over the groups (group ``g`` with ``n_g`` cases weighing
    ``n_g / (n_g + SOURCE_RELIABILITY_CASES)``): a jackknife over sources, since a new source's errors are
    not exchangeable with the cases of the sources already seen (a source's worst runs come in clusters).
    """
    names, counts = np.unique(groups, return_counts=True)
    weights = group_weights(groups, len(scores))
    if len(names) < 2:  # one source: plain split-conformal, with its (n + 1) correction (the largest score when
        # there are too few to calibrate the coverage: 19 for 95 %)
        return conformal_quantile(scores, coverage), coverage if calibrates(len(scores), coverage) else 1.0
    reliability = counts / (counts + SOURCE_RELIABILITY_CASES)
    held = [(groups == g, groups != g) for g in names]
    others = [(scores[o], group_weights(groups[o], int(o.sum()))) for _, o in held]
    for level in np.arange(coverage, 1.0 + 1e-9, 0.0025):
        covered = [np.mean(scores[h] <= weighted_quantile(s, w, level))
                   for (h, _), (s, w) in zip(held, others, strict=True)]
        if np.average(covered, weights=reliability) >= coverage:
            return weighted_quantile(scores, weights, level), float(min(level, 1.0))
    return float(np.max(scores)), 1.0


def fit_weighted(regressor: Any, features: np.ndarray, target: np.ndarray, weights: np.ndarray | None) -> Any:
    """``regressor.fit``, with ``sample_weight`` only when there are weights (not every regressor takes one)."""
    if weights is None:
        return regressor.fit(features, target)
    return regressor.fit(features, target, sample_weight=weights)


# ---- the site stage ---------------------------------------------------------------------------------------
# The reference runs come from many frameworks and clusters; the ledger's actuals come from *this* cluster.
# A systematic error of the analytic model on this cluster's jobs (its framework, its kernels, its allocator
# settings) shows in those actuals, and it is not a correction that carries over to other sources, so the
# leave-one-source-out shrinkage above rightly drops it. The site stage keeps it for this cluster only: a log
# offset per method group, shrunk toward the pooled offset and the pooled one toward 0 (``SITE_PRIOR_ROWS``
# pseudo-rows of "no offset"), used only if it lowers the median error of this cluster's jobs held out in
# K-fold cross-validation; and a split-conformal margin per method group from those held-out errors where the
# group has enough actuals to calibrate one at the target coverage (19 for 95 %), else the cluster's pooled
# margin where the group has at least MIN_SITE_ROWS actuals and the pool enough, else the reference margin.
# Both residuals have it: of the peak (its allocator, its kernels) and of the throughput of finished jobs
# (their start-up, data loading and checkpoints, this cluster's network), in ``ConformalResidualRegressor``.
SITE_GROUP = "ledger"  # the group (source) of the ledger's actuals: ``vramfit train --ledger``
MIN_SITE_ROWS = 5
SITE_PRIOR_ROWS = 5
SITE_FOLDS = 5


def site_offsets(excess: np.ndarray, methods: np.ndarray, prior_rows: float = SITE_PRIOR_ROWS) -> dict[str, float]:
    """Log offset per margin group from this cluster's ``excess`` (``ln(measured / prediction)``) and each
    row's margin group: medians shrunk toward the pooled median, which is shrunk toward 0."""
    n = excess.size
    pooled = float(np.median(excess)) * n / (n + prior_rows) if n else 0.0
    offsets = {}
    for name in MARGIN_GROUPS:
        group = excess[methods == name]
        own = float(np.median(group)) if group.size else pooled
        offsets[name] = pooled + (own - pooled) * group.size / (group.size + prior_rows)
    return offsets


def calibrates(n: int, coverage: float) -> bool:
    """Whether ``n`` scores are enough for the split-conformal quantile at ``coverage`` (19 for 95 %)."""
    return n > 0 and math.ceil((n + 1) * coverage) <= n


def conformal_quantile(scores: np.ndarray, coverage: float) -> float:
    """The ``ceil((n + 1) * coverage) / n`` empirical quantile of ``n`` calibration scores (split-conformal)."""
    n = len(scores)
    rank = min(n, math.ceil((n + 1) * coverage))
    return float(np.sort(scores)[rank - 1])


class ConformalResidualRegressor(ConformalServing, RegressorMixin, BaseEstimator):
    """What the residual estimators share: their parameters, the checks of ``fit``'s inputs, the per-source
    weights, the widening of the bound with the distance to the training data, and the choice of shrinkage
    and conformal margins from out-of-fold predictions.

    Parameters
    ----------
    regressor:
        Unfitted scikit-learn regressor for the log correction; ``None``: the subclass's default.
    coverage:
        Target probability that the measurement falls on the safe side of the (one-sided) bound.
    cv:
        Folds for the cross-conformal calibration. ``None``: one fold per group when ``groups`` are given
        to ``fit``, else 5 shuffled folds.
    n_neighbors:
        Training cases the distance to the training data is averaged over.
    distance_weight:
        How fast the bound widens with the distance to the training data (0: no widening).
    max_widening:
        Cap of that widening factor.
    ordinary_distance:
        Quantile of the training cases' distances to the other groups' cases (to the other cases without
        groups) beyond which the bound widens: a spec no farther from the training data than most sources
        are from each other is ordinary and keeps the calibrated margin.
    shrinkage:
        Fixed ``alpha`` for the correction; ``None``: chosen from out-of-fold predictions at fit time.
    group_weighting:
        With ``groups``, weigh every group (source) the same in the regressor's fit, the shrinkage and the
        conformal quantile (each case ``1 / rows of its group``), so that a source with many runs does not
        decide the model alone; ``False``: every case the same.
    mondrian:
        Calibrate separate conformal margins for full fine-tuning and adapter methods (``MARGIN_GROUPS``).
    random_state:
        Seed of the default regressor (where it has one) and of shuffled folds.
    site_group:
        The group (as given to ``fit``) of this cluster's own actuals (``SITE_GROUP``: the ledger's): they are
        one more source for the reference stage and also fit the site stage (this cluster's own offset and
        margin). ``None``: no site stage.
    """

    site_group: str | None = SITE_GROUP  # the default for models saved before the parameter existed

    def __init__(
        self,
        regressor: Any = None,
        coverage: float = 0.95,
        cv: int | None = None,
        n_neighbors: int = 5,
        distance_weight: float = 0.5,
        max_widening: float = 2.0,
        ordinary_distance: float = 0.9,
        shrinkage: float | None = None,
        group_weighting: bool = True,
        mondrian: bool = True,
        random_state: int = 0,
        site_group: str | None = SITE_GROUP,
    ) -> None:
        self.regressor = regressor
        self.coverage = coverage
        self.cv = cv
        self.n_neighbors = n_neighbors
        self.distance_weight = distance_weight
        self.max_widening = max_widening
        self.ordinary_distance = ordinary_distance
        self.shrinkage = shrinkage
        self.group_weighting = group_weighting
        self.mondrian = mondrian
        self.random_state = random_state
        self.site_group = site_group

    def _checked_measurements(self, X: Sequence[Any], y: Sequence[float], not_positive: str
                              ) -> tuple[list[Any], np.ndarray]:
        if not 0 < self.coverage < 1:
            raise ValueError(f"coverage must be in (0, 1); got {self.coverage}")
        if not 0 < self.ordinary_distance <= 1:
            raise ValueError(f"ordinary_distance must be in (0, 1]; got {self.ordinary_distance}")
        cases = list(X)
        measured = np.asarray(y, dtype=np.float64)
        if len(cases) != len(measured) or len(cases) < 2:
            raise ValueError(f"need at least 2 cases with one measurement each; got {len(cases)} and {len(measured)}")
        if np.any(measured <= 0):
            raise ValueError(not_positive)
        return cases, measured

    def _case_weights(self, groups: Sequence[str] | None, n: int) -> np.ndarray | None:
        """Per-case weights of the regressor's fit (``None``: unweighted), scaled to a mean of 1 so that a
        regressor's penalty keeps its scale in cases."""
        if not self.group_weighting or groups is None:
            return None
        weights = group_weights(groups, n)
        return weights * (n / weights.sum())

    # ---- distance to the training data ----------------------------------------------------------------
    def _fit_distance_reference(self, features: np.ndarray, groups: Sequence[str] | None) -> None:
        """``distance_ref_``: the ``ordinary_distance`` quantile of the training cases' distances to the
        other groups' cases (each case to the others without groups), i.e. of how far a held-out source
        typically is from the rest."""
        n = features.shape[0]
        if groups is not None and len(set(groups)) >= 2:
            labels = np.asarray(list(groups))
            exclude = labels[:, None] == labels[None, :]
        else:
            exclude = np.eye(n, dtype=bool)
        own = self._neighbour_distance(features, exclude=exclude)
        own = own[np.isfinite(own)]
        ref = float(np.quantile(own, self.ordinary_distance)) if own.size else 0.0
        self.distance_ref_ = ref if ref > 0 else 1.0

    # ---- calibration ----------------------------------------------------------------------------------
    def _set_shrinkage_and_quantile(self, target: np.ndarray, out_of_fold: np.ndarray, widening: np.ndarray,
                                    specs: Sequence[TrainingSpec], groups: Sequence[str] | None,
                                    lower: bool = False) -> None:
        """``alpha_`` (fixed, or from the out-of-fold predictions), the scores, their pooled ``quantile_`` and
        the per-method ``class_quantiles_``: by how much the measurement exceeds the shrunk prediction
        (``lower``: falls short of it), per widening.

        With ``group_weighting`` and ``groups`` the quantiles are weighted (every group the same in total;
        no finite-sample correction: with 15 sources, ``(S + 1) / S * coverage`` would ask for more than
        the largest score), else the split-conformal ``ceil((n + 1) * coverage) / n`` quantile.
        """
        n = len(target)
        weights = self._case_weights(groups, n)
        if self.shrinkage is None:
            self.alpha_ = shrinkage_from_out_of_fold(target, out_of_fold, groups, weights)
        else:
            self.alpha_ = float(self.shrinkage)
        excess = target - self.alpha_ * out_of_fold
        scores = (-excess if lower else excess) / widening
        self.calibration_scores_ = scores
        labels = np.asarray(list(groups)) if groups is not None else None
        self.quantile_ = self._quantile(scores, labels)
        self.class_quantiles_: dict[str, float] = {}
        if not self.mondrian:
            return
        methods = np.asarray([margin_group(spec) for spec in specs])
        for name in MARGIN_GROUPS:
            rows = methods == name
            support = len(set(labels[rows].tolist())) if labels is not None else int(rows.sum()) // 10
            if support >= MIN_MARGIN_SOURCES:
                self.class_quantiles_[name] = self._quantile(scores[rows], None if labels is None else labels[rows])

    # ---- the site stage --------------------------------------------------------------------------------
    def _fit_site(self, specs: Sequence[TrainingSpec], features: np.ndarray, target: np.ndarray,
                  groups: Sequence[str] | None, lower: bool = False) -> None:
        """The site stage from the cases of ``site_group`` (``target``: their ``ln(measured / analytic)``):
        ``site_offsets_``, ``site_quantiles_`` and ``site_figures_`` (what it was fitted on and how it did on
        held-out actuals). The margins are of the scores the bound is one-sided against: how far the
        measurement exceeds the prediction (``lower``: falls short of it, a slower job than predicted)."""
        self.site_offsets_: dict[str, float] = {}
        self.site_quantiles_: dict[str, float] = {}
        self.site_figures_: dict[str, Any] = {"rows": 0}
        if self.site_group is None or groups is None:
            return
        rows = np.flatnonzero(np.asarray(list(groups)) == self.site_group)
        self.site_figures_["rows"] = int(rows.size)
        if rows.size < MIN_SITE_ROWS:
            return
        methods = np.asarray([margin_group(specs[i]) for i in rows])
        learned = self.alpha_ * self.log_correction(features[rows]) if self.alpha_ else 0.0
        excess = target[rows] - learned  # ln(measured / prediction before the site stage)
        out_of_fold = np.empty(rows.size)
        folds = KFold(n_splits=min(SITE_FOLDS, rows.size), shuffle=True, random_state=self.random_state)
        for train_rows, held_rows in folds.split(rows):
            offsets = site_offsets(excess[train_rows], methods[train_rows])
            out_of_fold[held_rows] = [offsets[m] for m in methods[held_rows]]
        # APE of a prediction p of a measurement y: |p / y - 1| = |exp(-ln(y / p)) - 1|
        before = float(np.median(np.abs(np.expm1(-excess))))
        after = float(np.median(np.abs(np.expm1(-(excess - out_of_fold)))))
        used = after < before
        scores = excess - out_of_fold if used else excess
        if lower:
            scores = -scores
        # not divided by a widening as the reference stage's scores are: this cluster's jobs are near their own
        # rows of the training data (widening ~1); serving still widens the margin far from the data (safer)
        if used:
            self.site_offsets_ = site_offsets(excess, methods)
        for name in MARGIN_GROUPS:
            group = scores[methods == name]
            if calibrates(group.size, self.coverage):
                self.site_quantiles_[name] = conformal_quantile(group, self.coverage)
            elif group.size >= MIN_SITE_ROWS and calibrates(scores.size, self.coverage):
                # too few of its own: the cluster's pooled margin, for a group the cluster does run
                self.site_quantiles_[name] = conformal_quantile(scores, self.coverage)
        self.site_figures_.update({
            "offset_used": used,
            "rows_by_group": {name: int((methods == name).sum()) for name in MARGIN_GROUPS},
            "held_out_median_ape_before": before,
            "held_out_median_ape_after": after if used else before,
        })

    def _quantile(self, scores: np.ndarray, labels: np.ndarray | None) -> float:
        if self.group_weighting and labels is not None:
            return source_calibrated_quantile(scores, labels, self.coverage)[0]
        return conformal_quantile(scores, self.coverage)

    def _require_fitted(self) -> None:
        """``check_is_fitted`` for the per-decision paths (sklearn's costs more than a one-row prediction)."""
        if not hasattr(self, "regressor_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")


class ResidualVramRegressor(VramServing, ConformalResidualRegressor):
    """Analytic peak VRAM times a learned correction, floored at the resident model states.

    Parameters as :class:`ConformalResidualRegressor`; ``regressor`` ``None`` is :func:`default_regressor`,
    ``coverage`` the probability that the measured peak is at most :meth:`predict_upper`; the cases of
    ``site_group`` also fit the site stage.
    """

    # ---- fitting ------------------------------------------------------------------------------------
    def _new_regressor(self) -> Any:
        if self.regressor is None:
            return default_regressor(self.random_state)
        return clone(self.regressor)

    def fit(self, X: Sequence[VramCase], y: Sequence[float], groups: Sequence[str] | None = None
            ) -> ResidualVramRegressor:
        """Fit the correction on cases ``X`` with measured peaks ``y`` (bytes, per GPU)."""
        cases, y_bytes = self._checked_measurements(X, y, "measured peaks must be positive bytes")
        features = feature_matrix(cases)
        analytic = np.asarray([max(c.level_bytes, 1) for c in cases], dtype=np.float64)
        target = np.log(y_bytes / analytic)
        self.n_features_in_ = features.shape[1]
        self._fit_distance(features, groups)
        weights = self._case_weights(groups, len(cases))
        # a few hundred rows: thread start-up costs more than it saves
        with threadpool_limits(1):
            self.regressor_ = fit_weighted(self._new_regressor(), features, target, weights)
            self._calibrate(features, target, [c.spec for c in cases], groups, weights)
        self.compiled_ = compile_hist_gradient_boosting(self.regressor_)
        self._fit_site([c.spec for c in cases], features, target, groups)
        return self

    def _fit_distance(self, features: np.ndarray, groups: Sequence[str] | None) -> None:
        numeric = features[:, ~_CATEGORICAL]
        mean = np.nanmean(numeric, axis=0)
        std = np.nanstd(numeric, axis=0)
        self.numeric_mean_ = np.where(np.isfinite(mean), mean, 0.0)
        self.numeric_scale_ = np.where(np.isfinite(std) & (std > 0), std, 1.0)
        self.train_numeric_ = self._standardize(features)
        self.train_codes_ = features[:, _CATEGORICAL]
        # a signed feature counts only where a spec lies beyond a training case on the side a growing job moves
        # it, so the bound never falls as the job grows (features.DISTANCE_SIGNS, VramServing._pairwise_sq_distance)
        self.distance_signs_ = ONE_SIDED_SIGNS.copy()
        self._fit_distance_reference(features, groups)

    def _folds(self, n: int, groups: Sequence[str] | None) -> list[tuple[np.ndarray, np.ndarray]]:
        return calibration_folds(n, groups, self.cv, self.random_state)

    def _calibrate(self, features: np.ndarray, target: np.ndarray, specs: Sequence[TrainingSpec],
                   groups: Sequence[str] | None, weights: np.ndarray | None) -> None:
        n = len(target)
        out_of_fold = np.empty(n)
        widening = np.empty(n)
        for train_rows, held_rows in self._folds(n, groups):
            fold_weights = None if weights is None else weights[train_rows]
            model = fit_weighted(self._new_regressor(), features[train_rows], target[train_rows], fold_weights)
            out_of_fold[held_rows] = model.predict(features[held_rows])
            widening[held_rows] = self._widening(self._neighbour_distance(features[held_rows], train_rows=train_rows))
        self._set_shrinkage_and_quantile(target, out_of_fold, widening, specs, groups)

    # ---- prediction (the rest is VramServing's) -------------------------------------------------------
    def _regressor_log_correction(self, rows: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "regressor_")
        return np.asarray(self.regressor_.predict(rows), dtype=np.float64)


# ---- fast single-row prediction -----------------------------------------------------------------------
# scikit-learn's HistGradientBoostingRegressor.predict validates its input and starts an OpenMP region per
# call: milliseconds for one row. Placement calls predict() thousands of times per second, so the fitted
# trees are copied into flat arrays once (here, where scikit-learn is at hand) and walked level by level
# with numpy for all trees at once (predictors.residual_serving.predict_compiled_flat).


def compile_hist_gradient_boosting(model: Any) -> dict[str, np.ndarray] | None:
    """Flat arrays of a fitted single-output ``HistGradientBoostingRegressor``; ``None`` for anything else.

    With categorical features, scikit-learn ordinal-encodes them (unseen codes become missing) and moves
    them in front of the numeric ones; both are folded in here, so the arrays take the original columns.
    """
    if not isinstance(model, HistGradientBoostingRegressor) or not hasattr(model, "_predictors"):
        return None
    trees = [stage[0] for stage in model._predictors]
    size = max(len(t.nodes) for t in trees)
    n = len(trees)
    n_columns = int(model.n_features_in_)
    if model._preprocessor is None:
        columns = np.arange(n_columns)
        encoded_of_raw: dict[int, dict[int, int]] = {}
    else:
        mask = np.asarray(model.is_categorical_, dtype=bool)
        columns = np.concatenate([np.flatnonzero(mask), np.flatnonzero(~mask)])
        encoder = model._preprocessor.named_transformers_["encoder"]
        encoded_of_raw = {
            j: {int(raw): code for code, raw in enumerate(cats) if not np.isnan(raw)}
            for j, cats in enumerate(encoder.categories_)
        }
    known, f_idx_map = model._bin_mapper.make_known_categories_bitsets()

    def in_bitset(bitset: np.ndarray, value: int) -> bool:
        return bool((int(bitset[value // 32]) >> (value % 32)) & 1)

    arrays = {
        "feature": np.zeros((n, size), dtype=np.intp),
        "threshold": np.zeros((n, size), dtype=np.float64),
        "left": np.zeros((n, size), dtype=np.intp),
        "right": np.zeros((n, size), dtype=np.intp),
        "is_leaf": np.ones((n, size), dtype=bool),
        "missing_left": np.zeros((n, size), dtype=bool),
        "is_categorical": np.zeros((n, size), dtype=bool),
        "value": np.zeros((n, size), dtype=np.float64),
        "category_left": np.zeros((n, size, _CATEGORY_TABLE_SIZE), dtype=bool),
    }
    depth = 0
    for t, tree in enumerate(trees):
        nodes = tree.nodes
        k = len(nodes)
        arrays["feature"][t, :k] = columns[nodes["feature_idx"]]
        arrays["threshold"][t, :k] = nodes["num_threshold"]
        arrays["left"][t, :k] = nodes["left"]
        arrays["right"][t, :k] = nodes["right"]
        arrays["is_leaf"][t, :k] = nodes["is_leaf"].astype(bool)
        arrays["missing_left"][t, :k] = nodes["missing_go_to_left"].astype(bool)
        arrays["is_categorical"][t, :k] = nodes["is_categorical"].astype(bool)
        arrays["value"][t, :k] = nodes["value"]
        depth = max(depth, int(nodes["depth"].max()))
        for i in np.flatnonzero(nodes["is_categorical"]):
            feature = int(nodes["feature_idx"][i])
            left_set = tree.raw_left_cat_bitsets[nodes["bitset_idx"][i]]
            known_set = known[f_idx_map[feature]]
            missing_left = bool(nodes["missing_go_to_left"][i])
            encoding = encoded_of_raw.get(feature)
            for raw in range(_CATEGORY_TABLE_SIZE):
                code = raw if encoding is None else encoding.get(raw)
                if code is not None and in_bitset(left_set, code):
                    arrays["category_left"][t, i, raw] = True
                elif code is None or not in_bitset(known_set, code):
                    arrays["category_left"][t, i, raw] = missing_left
    arrays["depth"] = np.asarray(depth, dtype=np.intp)
    arrays["baseline"] = np.asarray(float(np.ravel(model._baseline_prediction)[0]), dtype=np.float64)
    return arrays


