"""Train, evaluate and save a residual model; ``python -m predictors.residual_build`` rebuilds the shipped one.

The default model is trained on ``../shared/reference/runs-dev.jsonl`` (relative to the repository root)
plus the calibration rows in ``predictors/data/measured/*.jsonl`` (none yet) with fixed seeds, so the
commands below reproduce ``predictors/data/residual-default.skops`` and
``predictors/data/runtime-residual-default.skops``::

    python -m predictors.residual_build            # = vramfit train --runs ../shared/reference/runs-dev.jsonl \\
                                                   #     --out predictors/data/residual-default.skops
    python -m predictors.residual_build --runtime  # the runtime (throughput) residual
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from predictors.persistence import (
    build_metadata,
    build_runtime_metadata,
    default_model_path,
    default_runtime_model_path,
    save_model,
    sha256_of_texts,
)
from predictors.reference import ReferenceRun, parse_runs
from predictors.residual import ResidualVramRegressor
from predictors.runtime_residual import DEFAULT_RUNTIME_UPPER_MARGIN, ResidualRuntimeRegressor
from predictors.runtime_training import (
    fit_runtime_residual,
    runtime_leave_one_source_out,
    runtime_training_rows,
    score_runtime_rows,
    summarize_runtime,
)
from predictors.training import fit_residual, leave_one_source_out, score_rows, summarize, training_rows

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


def _runs(texts: Sequence[tuple[str, str]]) -> list[ReferenceRun]:
    runs: list[ReferenceRun] = []
    for name, text in texts:
        runs += parse_runs(text, source=name)
    return runs


def _data_metadata(texts: Sequence[tuple[str, str]], rows: Sequence[Any], skipped: int) -> dict[str, Any]:
    """What a model was trained on: content hash, file names, rows, sources."""
    data_sha = sha256_of_texts(text for _, text in texts)
    return {
        "training_data_sha256": data_sha,
        "training_files": [name for name, _ in texts],
        "training_rows": len(rows),
        "training_sources": sorted({r.source for r in rows}),
        "skipped_runs": skipped,
    }


def train(runs_texts: Sequence[tuple[str, str]], ledger_texts: Sequence[tuple[str, str]] = (),
          cv_source: bool = True, **params: Any) -> tuple[ResidualVramRegressor, dict[str, Any]]:
    """Fit on reference runs (and ledger actuals, same JSONL schema), return the model and its metadata.

    ``runs_texts``/``ledger_texts``: ``(name, JSONL text)`` pairs. With ``cv_source`` the metadata also
    holds leave-one-source-out figures (one extra fit per source).
    """
    texts = [*runs_texts, *ledger_texts]
    rows, skipped = training_rows(_runs(texts))
    if len(rows) < 2:
        raise ValueError(f"need at least 2 usable runs to train; got {len(rows)}")
    model = fit_residual(rows, **params)
    figures: dict[str, Any] = {"in_sample": summarize(score_rows(model, rows))}
    if cv_source:
        figures["leave_one_source_out"] = summarize(leave_one_source_out(rows, **params))
    data = _data_metadata(texts, rows, len(skipped))
    metadata = build_metadata(
        model_version=f"residual-{data['training_data_sha256'][:12]}",
        **data,
        params={k: v for k, v in model.get_params(deep=False).items() if k != "regressor"},
        alpha=model.alpha_,
        conformal_quantile=model.quantile_,
        evaluation=figures,
    )
    return model, metadata


def train_runtime(runs_texts: Sequence[tuple[str, str]], ledger_texts: Sequence[tuple[str, str]] = (),
                  cv_source: bool = True, **params: Any) -> tuple[ResidualRuntimeRegressor, dict[str, Any]]:
    """As :func:`train`, for the runtime residual (the runs with a measured tokens/s)."""
    texts = [*runs_texts, *ledger_texts]
    rows, skipped = runtime_training_rows(_runs(texts))
    if len(rows) < 2:
        raise ValueError(f"need at least 2 usable runs with tokens_per_second to train; got {len(rows)}")
    model = fit_runtime_residual(rows, **params)
    figures: dict[str, Any] = {"in_sample": summarize_runtime(score_runtime_rows(model, rows))}
    if cv_source:
        figures["leave_one_source_out"] = summarize_runtime(runtime_leave_one_source_out(rows, **params))
    data = _data_metadata(texts, rows, len(skipped))
    metadata = build_runtime_metadata(
        model_version=f"runtime-residual-{data['training_data_sha256'][:12]}",
        **data,
        params={k: v for k, v in model.get_params(deep=False).items() if k != "regressor"},
        regressor=repr(model.regressor_),
        alpha=model.alpha_,
        conformal_quantile=model.quantile_,
        fallback_upper_margin=DEFAULT_RUNTIME_UPPER_MARGIN,
        evaluation=figures,
    )
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
    if args.runtime:
        out = args.out or default_runtime_model_path()
        model, metadata = train_runtime(texts)
    else:
        out = args.out or default_model_path()
        model, metadata = train(texts)
    save_model(model, out, metadata)
    print(f"wrote {out} ({metadata['model_version']}, {metadata['training_rows']} rows)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
