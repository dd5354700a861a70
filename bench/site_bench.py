"""The site stage on a simulated cluster: how much ``vramfit train --ledger`` learns from this cluster's actuals.

Run: ``python bench/site_bench.py [--bias 1.25] [--actuals 60] [--noise 0.03]``. The cluster's jobs are dev
reference specs with a known GPU (shuffled, seeded); each job's actual device peak is its analytic device peak
times ``bias`` times log-normal noise. The first ``--actuals`` jobs form the ledger (trained beside all dev runs),
the next 40 are later jobs of the same cluster. Prints the site stage's figures and, on the later jobs, the
median APE of the analytic and the corrected prediction, the upper bound's coverage and its median slack.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import numpy as np

from predictors.reference import ReferenceRun
from predictors.residual_build import DEFAULT_RUNS, train
from predictors.training import case_for_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bias", type=float, default=1.25, help="actual / analytic device peak of the cluster")
    parser.add_argument("--actuals", type=int, default=60, help="ledger actuals to train on")
    parser.add_argument("--noise", type=float, default=0.03, help="sigma of the log-normal noise")
    args = parser.parse_args()
    rng = random.Random(0)
    runs_text = DEFAULT_RUNS.read_text(encoding="utf-8")
    runs = [json.loads(line) for line in runs_text.splitlines() if line.strip()]
    jobs = [r for r in runs if r["quality"] != "low" and r["gpu"] != "unknown"
            and r["measured"]["scope"] == "per_gpu" and not r["measured"]["oom"]]
    rng.shuffle(jobs)
    ledger, later = [], []
    for i, job in enumerate(jobs[:args.actuals + 40]):
        case = case_for_run(ReferenceRun.model_validate(job), "nvml")
        peak = case.vram.peak_vram_bytes * args.bias * math.exp(rng.gauss(0, args.noise))
        measured = {**job["measured"], "peak_bytes": int(peak), "metric": "nvml", "scope": "per_gpu", "oom": False,
                    "unit_uncertain": False, "tokens_per_second": None, "tokens_per_second_scope": None}
        row = {**job, "id": f"ledger-{i}", "source_id": "vramfit_ledger", "quality": "high", "measured": measured}
        (ledger if i < args.actuals else later).append((row, case))
    start = time.perf_counter()
    model, metadata = train([(DEFAULT_RUNS.name, runs_text)],
                            [("ledger.jsonl", "\n".join(json.dumps(row) for row, _ in ledger))], cv_source=False)
    print(f"trained in {time.perf_counter() - start:.1f} s; site: {json.dumps(metadata['site'])}")
    cases = [case for _, case in later]
    measured_bytes = np.asarray([row["measured"]["peak_bytes"] for row, _ in later], dtype=float)
    analytic = np.asarray([case.vram.peak_vram_bytes for case in cases], dtype=float)
    point, upper = model.predict_with_upper(cases)
    print(f"{len(cases)} later jobs: median APE analytic {np.median(np.abs(analytic / measured_bytes - 1)):.1%}, "
          f"with the site stage {np.median(np.abs(point / measured_bytes - 1)):.1%}; upper bound coverage "
          f"{np.mean(upper >= measured_bytes):.0%}, median slack {np.median(upper / measured_bytes - 1):.1%}")


if __name__ == "__main__":
    main()
