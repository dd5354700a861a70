"""``vramfit train --runs FILE.jsonl [--runs ...] [--ledger FILE.jsonl] --out MODEL.skops [--runtime-out RT.skops]``:
fit the residual VRAM model (and, with ``--runtime-out``, the runtime residual on the same runs)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from predictors.errors import SpecError
from scheduler.cli import check_output_file


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("train", help="fit the residual VRAM (and runtime) model on measured runs and save it (skops)")
    p.add_argument("--runs", action="append", required=True, help="reference runs JSONL (repeatable)")
    p.add_argument("--ledger", action="append", default=[],
                   help="this cluster's actuals joined to their specs: the ledger file itself (SQLite, what "
                        "vramfit serve --ledger writes) or its export (vramfit report --export, reference-run "
                        "JSONL); repeatable. They also fit the site stage, this cluster's own offset and "
                        "upper-bound margin (of the peak, and with --runtime-out of the throughput of its "
                        "finished jobs)")
    p.add_argument("--out", required=True, type=Path, help="model file to write (.skops; metadata beside it)")
    p.add_argument("--coverage", type=float, default=0.95, help="upper-bound target coverage (default 0.95)")
    p.add_argument("--no-cv", action="store_true", help="skip the leave-one-source-out figures in the metadata")
    p.add_argument("--runtime-out", type=Path,
                   help="also fit the runtime (throughput) residual on the runs with tokens/s; write it here")
    p.add_argument("--runtime-coverage", type=float, default=0.9,
                   help="runtime upper-bound target coverage (default 0.9)")
    p.set_defaults(func=run)


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _read(paths: list[str], flag: str) -> list[tuple[str, str]]:
    texts = []
    for path in paths:
        try:
            with open(path, "rb") as head:
                sqlite = head.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
            text = _export_ledger(path) if sqlite and flag == "--ledger" else Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError.one(flag, f"cannot read {path}: {exc}") from None
        texts.append((Path(path).name, text))
    return texts


def _export_ledger(path: str) -> str:
    """The reference-run JSONL of a ledger file (what ``vramfit report --export`` writes), with a line saying
    how many joined rows it gave. A record that cannot be read (a damaged payload or timestamp) is left out with a
    warning naming it, as ``vramfit report`` leaves it out; the rest of the ledger is used."""
    import io
    import sqlite3

    from pydantic import ValidationError

    from scheduler.integrations.ledger import LedgerError, SqliteLedger

    out = io.StringIO()
    try:
        ledger = SqliteLedger(path, read_only=True)  # a live ledger's file is read, never written
        try:
            read = ledger.report_rows()  # one read; unreadable records are named, not raised
            result = ledger.export_reference_runs(out, read.rows)
        finally:
            ledger.close()
    except LedgerError as exc:
        raise SpecError.one("--ledger", str(exc)) from None
    except (sqlite3.DatabaseError, ValidationError) as exc:
        raise SpecError.one("--ledger", f"cannot read the ledger {path}: {str(exc).splitlines()[0]}") from None
    for table, records in read.unreadable.items():
        shown = "; ".join(records[:5]) + (f"; and {len(records) - 5} more" if len(records) > 5 else "")
        print(f"vramfit train: warning: ledger {path}: {len(records)} unreadable {table} left out ({shown})",
              file=sys.stderr)
    skipped = ", ".join(f"{n} {why}" for why, n in result.skipped.items()) or "none"
    print(f"ledger {path}: {result.written} joined actuals (skipped: {skipped})")
    return out.getvalue()


def run(args: argparse.Namespace) -> int:
    from predictors.persistence import save_model
    from predictors.residual_build import RUNTIME, train

    for flag, coverage in (("--coverage", args.coverage), ("--runtime-coverage", args.runtime_coverage)):
        if not 0 < coverage < 1:
            raise SpecError.one(flag, f"must be between 0 and 1; got {coverage}")
    check_output_file(args.out, "--out")  # before the fit, not after it
    if args.runtime_out is not None:
        check_output_file(args.runtime_out, "--runtime-out")
    runs, ledger = _read(args.runs, "--runs"), _read(args.ledger, "--ledger")
    try:
        model, metadata = train(runs, ledger, cv_source=not args.no_cv, coverage=args.coverage)
    except ValueError as exc:
        raise SpecError.one("--runs", str(exc)) from None
    save_model(model, args.out, metadata)
    _report(args.out, metadata, model.alpha_, "offsets")
    if args.runtime_out is not None:
        try:
            runtime_model, runtime_metadata = train(runs, ledger, cv_source=not args.no_cv, kind=RUNTIME,
                                                    coverage=args.runtime_coverage)
        except ValueError as exc:
            raise SpecError.one("--runtime-out", str(exc)) from None
        save_model(runtime_model, args.runtime_out, runtime_metadata)
        _report(args.runtime_out, runtime_metadata, runtime_model.alpha_, "throughput offsets")
    return 0


def _report(path: Path, metadata: dict[str, Any], alpha: float, offsets_are: str) -> None:
    from predictors.persistence import serving_path
    from predictors.residual import MIN_SITE_ROWS

    print(f"wrote {path} ({metadata['model_version']}: {metadata['training_rows']} rows from "
          f"{len(metadata['training_sources'])} sources, shrinkage {alpha:.2f})")
    if serving_path(path).exists():
        print(f"wrote {serving_path(path)} (what predict/place/serve apply it with, without scikit-learn)")
    print(f"wrote {path.with_suffix('.json')} (its metadata: keep the three files together)")
    site = metadata.get("site") or {}
    if metadata.get("site_held_back"):
        print(f"  site stage: {metadata['site_held_back']} ledger actuals, fewer than {MIN_SITE_ROWS}: not used, "
              "neither fitted nor in the reference fit and margins (one job would weigh as much as a source)")
    elif site.get("rows"):
        print(f"  {_site_line(site, offsets_are)}")
    for name, block in metadata["evaluation"].items():
        a, r = block["analytic"], block["residual"]
        print(f"  {name:22s} median APE {a['median_ape'] * 100:5.1f}% -> {r['median_ape'] * 100:5.1f}%  "
              f"p90 {a['p90_ape'] * 100:5.1f}% -> {r['p90_ape'] * 100:5.1f}%  "
              f"coverage {r['coverage'] * 100:5.1f}%  median slack {r['median_slack'] * 100:5.1f}%")
    if metadata.get("leave_one_source_out_not_run"):
        print(f"  leave_one_source_out   not run: {metadata['leave_one_source_out_not_run']}")


def _site_line(site: dict[str, Any], offsets_are: str = "offsets") -> str:
    """What the site stage learned from the ledger's actuals (this cluster's jobs): ``offsets_are`` names its
    offsets (of the peak, or of the throughput)."""
    from predictors.residual import MIN_SITE_ROWS

    rows = site["rows"]
    if "offset_used" not in site:
        return f"site stage: {rows} ledger actuals, fewer than {MIN_SITE_ROWS}: none fitted"
    if site["offset_used"]:
        offsets = ", ".join(f"{group} {math.expm1(v) * 100:+.1f}%" for group, v in site["offsets"].items())
        what = (f"{offsets_are} {offsets}; held-out (5-fold) median APE "
                f"{site['held_out_median_ape_before'] * 100:.1f}% -> {site['held_out_median_ape_after'] * 100:.1f}%")
    else:
        what = (f"no offset (it did not lower the held-out median APE, "
                f"{site['held_out_median_ape_before'] * 100:.1f}%)")
    margins = ", ".join(f"{group} x{math.exp(q):.3f}" for group, q in site["quantiles"].items()) or "reference"
    return f"site stage: {rows} ledger actuals; {what}; upper-bound margins {margins}"
