"""What ledger reads cost as the ledger grows, by index lookups against the full join they replaced:
``GET /v1/decisions/{id}`` (``Ledger.joined_row``) and the collector's DCGM sweep, which looks for jobs
Kubernetes saw finish that have no DCGM peak yet (``Ledger.rows_awaiting``), every ``--interval-seconds``.

Fills a fresh SQLite ledger with ``--decisions`` decisions (real predictions), each with a reporter, a
Kubernetes and, for all but one in a hundred, a DCGM actual; then times ``--lookups`` lookups of random
decisions and three sweeps both ways, and checks that they agree.

    python bench/ledger_lookup.py [--decisions 20000] [--lookups 200]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler.integrations.ledger import Ledger, SqliteLedger  # noqa: E402
from scheduler.integrations.records import ActualIn, DecisionIn  # noqa: E402
from tests.integrations.payloads import GIB, decision_payload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--lookups", type=int, default=200, help="index lookups (the full join: a tenth of them)")
    args = parser.parse_args(argv)
    ledger = SqliteLedger(Path(tempfile.mkdtemp(prefix="vramfit-ledger-")) / "ledger.sqlite")
    template = decision_payload("template")
    start = time.perf_counter()
    for i in range(args.decisions):
        ledger.record_decision(DecisionIn.model_validate(template | {"decision_id": f"d{i}", "name": f"job-{i}"}))
        for source in ("reporter", "kubernetes", "dcgm") if i % 100 else ("reporter", "kubernetes"):
            ledger.record_actual(ActualIn.model_validate({
                "decision_id": f"d{i}", "peak_vram_bytes": 11 * GIB, "runtime_seconds": 3000.0, "oom": False,
                "source": source}))
    print(f"filled {args.decisions:,} decisions and their actuals in {time.perf_counter() - start:.1f} s")
    rng = random.Random(0)
    ids = [f"d{rng.randrange(args.decisions)}" for _ in range(args.lookups)]
    one_ms, full_ms = [], []
    for n, decision_id in enumerate(ids):
        start = time.perf_counter()
        row = ledger.joined_row(decision_id)
        one_ms.append((time.perf_counter() - start) * 1000)
        if n % 10 == 0:
            start = time.perf_counter()
            full = next(r for r in ledger.joined_rows() if r.decision.decision_id == decision_id)
            full_ms.append((time.perf_counter() - start) * 1000)
            assert row == full, decision_id
    print(f"joined_row (index lookups): median {statistics.median(one_ms):.2f} ms, max {max(one_ms):.2f} ms "
          f"over {len(one_ms)} lookups")
    print(f"full join, then find:       median {statistics.median(full_ms):.1f} ms, max {max(full_ms):.1f} ms "
          f"over {len(full_ms)} lookups; same rows")
    sweep_ms, full_sweep_ms = [], []
    for _ in range(3):
        start = time.perf_counter()
        awaiting = ledger.rows_awaiting("dcgm", after="kubernetes")
        sweep_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        everything = Ledger.rows_awaiting(ledger, "dcgm", "kubernetes")
        full_sweep_ms.append((time.perf_counter() - start) * 1000)
        assert {r.decision.decision_id for r in awaiting} == {r.decision.decision_id for r in everything}
    print(f"DCGM sweep rows ({len(awaiting)} awaiting): by index {statistics.median(sweep_ms):.1f} ms, "
          f"from the full join {statistics.median(full_sweep_ms):.1f} ms (median of 3)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
