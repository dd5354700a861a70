"""Train, evaluate and save a residual model; ``python -m predictors.residual_build`` rebuilds the shipped one.

The default model is trained on ``../shared/reference/runs-dev.jsonl`` (relative to the repository root)
plus the calibration rows in ``predictors/data/measured/*.jsonl`` (none yet) with fixed seeds, so the
commands below reproduce ``predictors/data/residual-default.skops`` and
``predictors/data/runtime-residual-default.skops`` (the fitted numbers; skops embeds object ids, so not the
bytes) and their serving files ``*.serving.npz`` (see :mod:`predictors.persistence`)::

    python -m predictors.residual_build            # = vramfit train --runs ../shared/reference/runs-dev.jsonl \\
                                                   #     --out predictors/data/residual-default.skops
    python -m predictors.residual_build --runtime  # the runtime (throughput) residual
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictors.persistence import (
    LoadedModel,
    build_metadata,
    build_runtime_metadata,
    load_default_model,
    load_default_runtime_model,
    save_model,
    sha256_of_texts,
    shipped_model_path,
    shipped_runtime_model_path,
)
from predictors.reference import ReferenceRun, parse_runs
from predictors.residual import MIN_SITE_ROWS, SITE_GROUP
from predictors.runtime_residual import DEFAULT_RUNTIME_UPPER_MARGIN
from predictors.runtime_training import (
    fit_runtime_residual,
    runtime_leave_one_source_out,
    runtime_training_rows,
    score_runtime_rows,
    summarize_runtime,
)
from predictors.training import (
    DEFAULT_QUALITIES,
    fit_residual,
    leave_one_source_out,
    score_rows,
    summarize,
    training_rows,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
# ../shared next to the checkout (the main checkout), or two levels up (a worktree under wt/)
_RUNS_CANDIDATES = [root / "shared" / "reference" / "runs-dev.jsonl" for root in (REPO_ROOT.parent,
                                                                                    REPO_ROOT.parent.parent)]
DEFAULT_RUNS = next((p for p in _RUNS_CANDIDATES if p.exists()), _RUNS_CANDIDATES[0])
# rows measured by `vramfit calibrate` join the default training data (CPU and failed rows are quality low and
# are left out by training_rows)
MEASURED_DIR = REPO_ROOT / "predictors" / "data" / "measured"


def default_runs() -> list[Path]:
    return [DEFAULT_RUNS, *sorted(MEASURED_DIR.glob("*.jsonl"))]


def _runs(texts: Sequence[tuple[str, str]], site: bool = False) -> list[ReferenceRun]:
    """The runs of ``texts``; with ``site`` (this cluster's ledger actuals) each is relabelled to the source
    ``SITE_GROUP``, whatever source it names, so that the residuals fit their site stage on them."""
    runs: list[ReferenceRun] = []
    for name, text in texts:
        runs += parse_runs(text, source=name)
    if site:
        runs = [run.model_copy(update={"source_id": f"{SITE_GROUP}_{run.source_id}"}) for run in runs]
    return runs


@dataclass(frozen=True)
class ResidualKind:
    """One kind of residual model (VRAM or runtime): how its rows are made, fitted, scored, summarised,
    stamped and loaded. ``train`` and ``vramfit evaluate`` work with either."""

    name: str  # model_version prefix
    rows_wanted: str  # what a usable run is, for messages
    training_rows: Callable[[Iterable[ReferenceRun], Iterable[str]], tuple[list[Any], list[Any]]]
    fit: Callable[..., Any]
    score: Callable[[Any, Sequence[Any]], list[Any]]
    summarize: Callable[[Sequence[Any]], dict[str, dict[str, float]]]
    leave_one_source_out: Callable[..., list[Any]]
    build_metadata: Callable[..., dict[str, Any]]
    load_default: Callable[[], LoadedModel | None]
    default_path: Callable[[], Path]
    extra_metadata: Callable[[Any], dict[str, Any]] = lambda model: {}

    def held_out_scores(self, rows: Sequence[Any], **params: Any) -> tuple[list[Any] | None, str]:
        """``(scored, "")``: each source's rows scored by a model fitted on the other sources; ``(None, why)`` when
        that cannot be done (one source, or a fold whose other sources hold too few runs to fit on)."""
        sources = {r.source for r in rows}
        if len(sources) < 2:
            return None, f"needs {self.rows_wanted} from at least 2 sources; these have {len(sources)}"
        try:
            return self.leave_one_source_out(rows, **params), ""
        except ValueError as exc:
            return None, f"could not fit a fold: {exc}"

    def side_by_side(self, runs: Iterable[ReferenceRun], qualities: Iterable[str], cv: str) -> dict[str, Any]:
        """Analytic vs analytic+residual figures, overall and by source: leave-one-source-out refits
        (``cv == "source"``) or the shipped model."""
        rows, _ = self.training_rows(runs, qualities)
        if cv == "source":
            held_out, why_not = self.held_out_scores(rows)
            if held_out is None:
                return {"mode": f"unavailable: leave-one-source-out {why_not}", "overall": {}, "by_source": {}}
            scored = held_out
            how = "leave-one-source-out (each source predicted by a model fitted on the others)"
        else:
            loaded = self.load_default()
            if loaded is None:
                return {"mode": f"unavailable (no {self.name} model)", "overall": {}, "by_source": {}}
            scored = self.score(loaded.model, rows)
            how = f"shipped model {loaded.version} (in-sample where these runs were its training data)"
        sources = sorted({s.row.source for s in scored})
        return {
            "mode": how,
            "overall": self.summarize(scored),
            "by_source": {src: self.summarize([s for s in scored if s.row.source == src]) for src in sources},
        }


def _site_metadata(model: Any) -> dict[str, Any]:
    """What the site stage was fitted on, how it did on held-out actuals, and what it learned."""
    return {**getattr(model, "site_figures_", {"rows": 0}), "offsets": dict(getattr(model, "site_offsets_", {})),
            "quantiles": dict(getattr(model, "site_quantiles_", {}))}


VRAM = ResidualKind("residual", "usable runs", training_rows, fit_residual, score_rows, summarize,
                    leave_one_source_out, build_metadata, load_default_model, shipped_model_path,
                    extra_metadata=lambda model: {"class_quantiles": dict(getattr(model, "class_quantiles_", {})),
                                                  "site": _site_metadata(model)})
RUNTIME = ResidualKind(
    "runtime-residual", "usable runs with tokens_per_second", runtime_training_rows, fit_runtime_residual,
    score_runtime_rows, summarize_runtime, runtime_leave_one_source_out, build_runtime_metadata,
    load_default_runtime_model, shipped_runtime_model_path,
    extra_metadata=lambda model: {"regressor": repr(model.regressor_),
                                  "fallback_upper_margin": DEFAULT_RUNTIME_UPPER_MARGIN,
                                  "site": _site_metadata(model)})


def train(runs_texts: Sequence[tuple[str, str]], ledger_texts: Sequence[tuple[str, str]] = (),
          cv_source: bool = True, kind: ResidualKind = VRAM, **params: Any) -> tuple[Any, dict[str, Any]]:
    """Fit on reference runs (and ledger actuals, same JSONL schema), return the model and its metadata.

    ``runs_texts``/``ledger_texts``: ``(name, JSONL text)`` pairs. With ``cv_source`` the metadata also
    holds leave-one-source-out figures (one extra fit per source). ``kind``: :data:`VRAM` (a
    :class:`~predictors.residual.ResidualVramRegressor`) or :data:`RUNTIME` (a
    :class:`~predictors.runtime_residual.ResidualRuntimeRegressor`).
    """
    texts = [*runs_texts, *ledger_texts]
    rows, skipped = kind.training_rows([*_runs(runs_texts), *_runs(ledger_texts, site=True)], DEFAULT_QUALITIES)
    # A handful of ledger actuals would be one group weighing as much as a whole published source in the fit and
    # the conformal margins: one job that ran 4x longer than predicted doubled every runtime bound. Below the
    # site stage's minimum they are held back altogether (and say so).
    site_rows = [r for r in rows if r.source == SITE_GROUP]
    held_back = len(site_rows) if 0 < len(site_rows) < MIN_SITE_ROWS else 0
    if held_back:
        rows = [r for r in rows if r.source != SITE_GROUP]
    if len(rows) < 2:
        raise ValueError(f"need at least 2 {kind.rows_wanted} to train; got {len(rows)}")
    model = kind.fit(rows, **params)
    figures: dict[str, Any] = {"in_sample": kind.summarize(kind.score(model, rows))}
    not_run = ""
    if cv_source:
        held_out, not_run = kind.held_out_scores(rows, **params)
        if held_out is not None:
            figures["leave_one_source_out"] = kind.summarize(held_out)
    data_sha = sha256_of_texts(text for _, text in texts)
    metadata = kind.build_metadata(
        model_version=f"{kind.name}-{data_sha[:12]}",
        training_data_sha256=data_sha,
        training_files=[name for name, _ in texts],
        training_rows=len(rows),
        training_sources=sorted({r.source for r in rows}),
        skipped_runs=len(skipped),
        params={k: v for k, v in model.get_params(deep=False).items() if k != "regressor"},
        alpha=model.alpha_,
        conformal_quantile=model.quantile_,
        evaluation=figures,
        **kind.extra_metadata(model),
    )
    if held_back:
        metadata["site_held_back"] = held_back
    if not_run:
        metadata["leave_one_source_out_not_run"] = not_run
    return model, metadata


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m predictors.residual_build", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", action="append",
                        help=f"reference runs JSONL (default: {DEFAULT_RUNS} and predictors/data/measured/*.jsonl)")
    parser.add_argument("--runtime", action="store_true",
                        help="build the runtime (throughput) residual instead of the VRAM one")
    parser.add_argument("--out", type=Path, help="model file (.skops; default: the shipped one)")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.runs] if args.runs else default_runs()
    texts = [(p.name, p.read_text(encoding="utf-8")) for p in paths]  # names only: the hash is of contents
    kind = RUNTIME if args.runtime else VRAM
    out = args.out or kind.default_path()
    model, metadata = train(texts, kind=kind)
    save_model(model, out, metadata)
    print(f"wrote {out} ({metadata['model_version']}, {metadata['training_rows']} rows)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
