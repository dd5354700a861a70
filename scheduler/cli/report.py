"""``vramfit report``: how good the predictions were, from the ledger; export joined rows for training."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from predictors.accuracy import ape_summary
from scheduler.cli import check_output_file
from scheduler.cli.serve import DEFAULT_LEDGER, open_ledger_for

# (name, predicted field of the decision, measured field of the merged actual): like with like.
LEVELS: tuple[tuple[str, str, str], ...] = (
    ("device", "peak_vram_bytes", "peak_vram_bytes"),
    ("reserved", "peak_reserved_bytes", "peak_reserved_bytes"),
    ("allocated", "peak_allocated_bytes", "peak_allocated_bytes"),
    ("runtime", "runtime_prediction_seconds", "runtime_seconds"),
)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("report", help="accuracy of past predictions from the ledger; export reference runs")
    p.add_argument("--ledger", default=DEFAULT_LEDGER, help=f"ledger file (default {DEFAULT_LEDGER})")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--by", choices=("none", "pool", "method"), default="none", help="also break down by this")
    p.add_argument("--export", type=Path, metavar="FILE.jsonl",
                   help="write joined rows with a measured device peak as reference-run JSONL")
    p.set_defaults(func=_report)


def accuracy(rows: Iterable[Any]) -> dict[str, dict[str, float]]:
    """APE summaries per level over joined rows (``JoinedRow``), skipping rows missing either side; the runtime
    only of jobs that ran to their end (a failed or OOM job's runtime is not the job's)."""
    rows = list(rows)
    out: dict[str, dict[str, float]] = {}
    for name, predicted_field, measured_field in LEVELS:
        pairs = []
        for row in rows:
            merged = row.merged
            if name == "runtime" and (merged is None or not merged.ran_to_end):
                continue
            predicted = getattr(row.decision.decision, predicted_field)
            measured = getattr(merged, measured_field) if merged else None
            if predicted is not None and measured is not None:
                pairs.append((float(predicted), float(measured)))
        out[name] = ape_summary(pairs)
    return out


def summarize(rows: list[Any], pending: int, by: str) -> dict[str, Any]:
    scored = [r for r in rows if r.merged is not None]
    upper = [(r.decision.decision.peak_vram_upper_bytes, r.merged.peak_vram_bytes) for r in scored
             if r.decision.decision.peak_vram_upper_bytes and r.merged.peak_vram_bytes is not None]
    summary: dict[str, Any] = {
        "decisions": len(rows),
        "with_actuals": len(scored),
        "pending_actuals": pending,
        "ooms": sum(1 for r in scored if r.merged.oom),
        "upper_bound_exceeded_fraction": (sum(1 for u, m in upper if m > u) / len(upper)) if upper else math.nan,
        "accuracy": accuracy(scored),
    }
    if by != "none":
        groups: dict[str, list[Any]] = {}
        for r in scored:
            groups.setdefault(getattr(r.decision.decision, by) or "none", []).append(r)
        summary[f"by_{by}"] = {key: accuracy(group) for key, group in sorted(groups.items())}
    return summary


def _clean(value: Any) -> Any:
    """NaN (no data) becomes null so that the JSON is valid."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 100:+.1f}%" if value < 0 else f"{value * 100:.1f}%"


def _table(summary: dict[str, Any]) -> str:
    lines = [
        f"decisions {summary['decisions']}, with actuals {summary['with_actuals']}, "
        f"actuals waiting for a decision {summary['pending_actuals']}, OOMs {summary['ooms']}",
        f"measured device peak above the placement upper bound: {_pct(summary['upper_bound_exceeded_fraction'])}",
        "",
        f"{'level':22s} {'n':>5s} {'median APE':>11s} {'p90 APE':>8s} {'max APE':>8s} {'bias':>8s} {'under':>7s}",
    ]
    sections = [("", summary["accuracy"])]
    for key in ("by_pool", "by_method"):
        sections += [(f"{group} ", acc) for group, acc in summary.get(key, {}).items()]
    for prefix, acc in sections:
        for level, s in acc.items():
            if s["n"] == 0:
                continue
            lines.append(f"{(prefix + level):22s} {s['n']:>5d} {_pct(s['median_ape']):>11s} {_pct(s['p90_ape']):>8s} "
                         f"{_pct(s['max_ape']):>8s} {_pct(s['bias']):>8s} {_pct(s['under_fraction']):>7s}")
    return "\n".join(lines)


def _report(args: argparse.Namespace) -> int:
    if not Path(args.ledger).exists():
        print(f"vramfit report: no ledger at {args.ledger} (give --ledger PATH)", file=sys.stderr)
        return 2
    if args.export is not None:
        check_output_file(args.export, "--export")
    ledger = open_ledger_for("report", args.ledger, read_only=True)  # a report never creates or migrates one
    if ledger is None:
        return 2
    try:
        rows = ledger.joined_rows()
        summary = summarize(rows, len(ledger.pending_actuals()), args.by)
        if args.export is not None:
            with args.export.open("w") as out:
                result = ledger.export_reference_runs(out)
            summary["export"] = {"path": str(args.export), "written": result.written, "skipped": result.skipped}
    finally:
        ledger.close()
    if args.format == "json":
        print(json.dumps(_clean(summary), indent=2))
    else:
        print(_table(summary))
        if "export" in summary:
            e = summary["export"]
            skipped = ", ".join(f"{n} {why}" for why, n in e["skipped"].items()) or "none"
            print(f"\nexported {e['written']} reference runs to {e['path']} (skipped: {skipped})")
    return 0
