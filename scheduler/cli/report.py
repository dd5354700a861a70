"""``vramfit report``: how good the predictions were, from the ledger; export joined rows for training."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predictors.accuracy import ape_summary
from scheduler.cli import check_output_file
from scheduler.cli.jsonout import json_text
from scheduler.cli.serve import DEFAULT_LEDGER, open_ledger_for

if TYPE_CHECKING:  # the ledger is imported when a report runs, not when the CLI starts
    from scheduler.integrations.ledger import RuntimeLimitCache
    from scheduler.integrations.records import JoinedRow, MergedActual

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


@dataclass(frozen=True)
class Scored:
    """A joined row with actuals: its merged actual (merged once) and why its runtime is not scored, if so."""

    row: JoinedRow
    merged: MergedActual
    runtime_left_out: str | None = None


def score(rows: Iterable[JoinedRow]) -> list[Scored]:
    """The rows with actuals, each merged once; a runtime that would need more than the GPUs' peak FLOP/s is
    marked left out by the export's rule (:func:`runtime_left_out`), so that report and export agree."""
    from scheduler.integrations.ledger import runtime_left_out

    cache: RuntimeLimitCache = {}
    out = []
    for row in rows:
        merged = row.merged
        if merged is not None:
            out.append(Scored(row, merged, runtime_left_out(row, merged, cache)))
    return out


def accuracy(scored: Iterable[Scored]) -> dict[str, dict[str, float]]:
    """APE summaries per level, skipping rows missing either side, with the rows ``vramfit evaluate`` compares:
    VRAM levels only of jobs that did not run out of memory (an OOM job's reading is where it stopped, not its
    peak; evaluate scores OOM runs apart); the runtime only of jobs that ran to their end (a failed or OOM job's
    runtime is not the job's) and whose throughput is physically possible (see :func:`score`)."""
    scored = list(scored)
    out: dict[str, dict[str, float]] = {}
    for name, predicted_field, measured_field in LEVELS:
        pairs = []
        for s in scored:
            if name == "runtime":
                if not s.merged.ran_to_end or s.runtime_left_out is not None:
                    continue
            elif s.merged.oom:
                continue
            predicted = getattr(s.row.decision.decision, predicted_field)
            measured = getattr(s.merged, measured_field)
            if predicted is not None and measured is not None:
                pairs.append((float(predicted), float(measured)))
        out[name] = ape_summary(pairs)
    return out


def _above_upper(s: Scored) -> bool | None:
    """Whether the job needed more than the placement upper bound: its measured device peak above it, or a CUDA
    OOM (a placed job's bound fits the GPU, so an OOM job needed more than the bound whatever peak was read
    before it stopped); None without a bound or a reading."""
    decision = s.row.decision.decision
    upper = decision.peak_vram_upper_bytes
    if not upper:
        return None
    if s.merged.oom and decision.outcome == "placed":  # fail-open or no-fit jobs ran where the bound may not fit
        return True
    return None if s.merged.peak_vram_bytes is None else s.merged.peak_vram_bytes > upper


def summarize(rows: list[JoinedRow], pending: int, by: str,
              unreadable: dict[str, list[str]] | None = None) -> dict[str, Any]:
    scored = score(rows)
    upper = [above for s in scored if (above := _above_upper(s)) is not None]
    left_out: dict[str, int] = {}
    for s in scored:
        if s.runtime_left_out is not None and s.merged.ran_to_end:
            left_out[s.runtime_left_out] = left_out.get(s.runtime_left_out, 0) + 1
    summary: dict[str, Any] = {
        "decisions": len(rows),
        "with_actuals": len(scored),
        "pending_actuals": pending,
        "ooms": sum(1 for s in scored if s.merged.oom),
        "upper_bound_exceeded_fraction": (sum(upper) / len(upper)) if upper else math.nan,
        "accuracy": accuracy(scored),
        "runtime_left_out": left_out,
        "unreadable": {table: {"count": len(keys), "first": keys[:5]} for table, keys in (unreadable or {}).items()},
    }
    if by != "none":
        groups: dict[str, list[Scored]] = {}
        for s in scored:
            groups.setdefault(getattr(s.row.decision.decision, by) or "none", []).append(s)
        summary[f"by_{by}"] = {key: accuracy(group) for key, group in sorted(groups.items())}
    return summary


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 100:+.1f}%" if value < 0 else f"{value * 100:.1f}%"


def _table(summary: dict[str, Any]) -> str:
    lines = [
        f"decisions {summary['decisions']}, with actuals {summary['with_actuals']}, "
        f"actuals waiting for a decision {summary['pending_actuals']}, OOMs {summary['ooms']}",
        f"jobs above the placement upper bound (measured device peak above it, or a CUDA OOM): "
        f"{_pct(summary['upper_bound_exceeded_fraction'])}",
        *(f"runtime of {n} jobs left out: {why}" for why, n in summary["runtime_left_out"].items()),
        *(f"{table} left out, unreadable: {u['count']} (first: {'; '.join(u['first'])})"
          for table, u in summary["unreadable"].items()),
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
    if all(s["n"] == 0 for s in summary["accuracy"].values()):
        lines.append("(no prediction with a measurement to compare it with yet)")
    return "\n".join(lines)


def _report(args: argparse.Namespace) -> int:
    if not Path(args.ledger).exists():
        print(f"vramfit report: no ledger at {args.ledger} (give --ledger PATH)", file=sys.stderr)
        return 2
    if args.export is not None:
        check_output_file(args.export, "--export")
    from scheduler.integrations.ledger import LedgerError

    ledger = open_ledger_for("report", args.ledger, read_only=True)  # a report never creates or migrates one
    if ledger is None:
        return 2
    try:
        read = ledger.report_rows()  # one read of the ledger for the figures and the export
        summary = summarize(read.rows, read.pending_actuals, args.by, read.unreadable)
        if args.export is not None:
            with args.export.open("w") as out:
                result = ledger.export_reference_runs(out, read.rows)
            summary["export"] = {"path": str(args.export), "written": result.written, "skipped": result.skipped}
    except LedgerError as exc:
        print(f"vramfit report: {exc}", file=sys.stderr)
        return 2
    finally:
        ledger.close()
    if args.format == "json":
        print(json_text(summary))
    else:
        print(_table(summary))
        if "export" in summary:
            e = summary["export"]
            skipped = ", ".join(f"{n} {why}" for why, n in e["skipped"].items()) or "none"
            print(f"\nexported {e['written']} reference runs to {e['path']} (skipped: {skipped})")
    return 0
