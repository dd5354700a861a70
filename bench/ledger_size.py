"""Ledger size: bytes of SQLite ledger per decision, with realistic records.

Run: ``python bench/ledger_size.py [--decisions N]``. Each decision is the record ``admit()`` makes for one of the
example job manifests (examples/jobs), with three actuals (reporter, kubernetes, dcgm), as a busy cluster's ledger
holds them. Prints bytes per decision and how many fit in the chart's 1 GiB volume.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler.integrations.admission import admit  # noqa: E402
from scheduler.integrations.ledger import SqliteLedger  # noqa: E402
from scheduler.integrations.records import ActualIn, DecisionIn  # noqa: E402
from tests.integrations.manifests import admission_review  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=5000)
    args = parser.parse_args()
    objects = [next(d for d in yaml.safe_load_all(p.read_text(encoding="utf-8")) if d)
               for p in sorted((REPO / "examples" / "jobs").glob("*.yaml"))]
    records = [a.record for a in (admit(admission_review(o)) for o in objects) if a.record]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ledger.sqlite"
        ledger = SqliteLedger(path)
        for i in range(args.decisions):
            record = {**records[i % len(records)], "decision_id": f"d{i}", "name": f"job-{i}"}
            ledger.record_decision(DecisionIn.model_validate(record))
            for source in ("reporter", "kubernetes", "dcgm"):
                ledger.record_actual(ActualIn.model_validate({
                    "decision_id": f"d{i}", "peak_vram_bytes": 11 * 2**30, "runtime_seconds": 3000.0,
                    "oom": False, "source": source}))
        ledger.close()
        size = sum(f.stat().st_size for f in path.parent.iterdir())
    per = size / args.decisions
    print(f"{args.decisions:,} decisions ({len(records)} example jobs' records, 3 actuals each): "
          f"{per / 1024:.2f} KiB per decision; a 1 GiB volume holds about {2**30 / per:,.0f}")


if __name__ == "__main__":
    main()
