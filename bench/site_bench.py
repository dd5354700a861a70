"""The site stage on a simulated cluster: how much ``vramfit train --ledger`` learns from this cluster's actuals.

Run: ``python bench/site_bench.py [--bias 1.25] [--actuals 60] [--noise 0.03] [--runtime]``. The cluster's jobs
are dev reference specs with a known GPU (shuffled, seeded); each job's actual device peak is its analytic device
peak times ``bias`` times log-normal noise (``--runtime``: its throughput, the work of a finished job over its
measured runtime, is the analytic throughput times ``bias``). The first ``--actuals`` jobs form the ledger
(trained beside all dev runs), the next 40 are later jobs of the same cluster. Prints the site stage's figures
and, on the later jobs, the median APE of the analytic and the corrected prediction, the upper bound's coverage
(of the peak; ``--runtime``: of the runtime) and its median slack.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import numpy as np

from predictors.catalog import resolve_model
from predictors.hardware import lookup_gpu
from predictors.reference import ReferenceRun
from predictors.residual_build import DEFAULT_RUNS, RUNTIME, train
from predictors.runtime import predict_runtime
from predictors.runtime_features import RuntimeCase
from predictors.runtime_training import DEFAULT_RUNTIME_PARAMS
from predictors.training import case_for_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bias", type=float, default=1.25, help="actual / analytic device peak of the cluster")
    parser.add_argument("--actuals", type=int, default=60, help="ledger actuals to train on")
    parser.add_argument("--noise", type=float, default=0.03, help="sigma of the log-normal noise")
    parser.add_argument("--runtime", action="store_true", help="the runtime residual's site stage (throughput)")
    args = parser.parse_args()
    rng = random.Random(0)
    runs_text = DEFAULT_RUNS.read_text(encoding="utf-8")
    runs = [json.loads(line) for line in runs_text.splitlines() if line.strip()]
    jobs = [r for r in runs if r["quality"] != "low" and r["gpu"] != "unknown"
            and r["measured"]["scope"] == "per_gpu" and not r["measured"]["oom"]]
    rng.shuffle(jobs)
    ledger, later = [], []
    for i, job in enumerate(jobs[:args.actuals + 40]):
        run = ReferenceRun.model_validate(job)
        noise = math.exp(rng.gauss(0, args.noise))
        if args.runtime:
            resolved = resolve_model(run.spec)
            gpus = run.spec.gpus if isinstance(run.spec.gpus, int) else 1
            prediction = predict_runtime(run.spec, resolved.architecture, lookup_gpu(run.gpu), gpus=gpus,
                                         params_override=resolved.params_override)
            case: object = RuntimeCase(run.spec, resolved.architecture, lookup_gpu(run.gpu), gpus, prediction)
            measured = {**job["measured"], "peak_bytes": None, "tokens_per_second_scope": "per_job",
                        "tokens_per_second": prediction.tokens_per_second * args.bias * noise}
        else:
            case = case_for_run(run, "nvml")
            peak = case.vram.peak_vram_bytes * args.bias * noise  # type: ignore[attr-defined]
            measured = {**job["measured"], "peak_bytes": int(peak), "metric": "nvml", "scope": "per_gpu",
                        "oom": False, "unit_uncertain": False, "tokens_per_second": None,
                        "tokens_per_second_scope": None}
        row = {**job, "id": f"ledger-{i}", "source_id": "vramfit_ledger", "quality": "high", "measured": measured}
        (ledger if i < args.actuals else later).append((row, case))
    start = time.perf_counter()
    ledger_text = [("ledger.jsonl", "\n".join(json.dumps(row) for row, _ in ledger))]
    if args.runtime:
        model, metadata = train([(DEFAULT_RUNS.name, runs_text)], ledger_text, cv_source=False, kind=RUNTIME,
                                **DEFAULT_RUNTIME_PARAMS)
    else:
        model, metadata = train([(DEFAULT_RUNS.name, runs_text)], ledger_text, cv_source=False)
    print(f"trained in {time.perf_counter() - start:.1f} s; site: {json.dumps(metadata['site'])}")
    cases = [case for _, case in later]
    if args.runtime:
        measured_tps = np.asarray([row["measured"]["tokens_per_second"] for row, _ in later], dtype=float)
        analytic = np.asarray([c.analytic_tokens_per_second for c in cases], dtype=float)  # type: ignore[attr-defined]
        point, lower = model.predict_with_lower(cases)
        # runtime is work / throughput: the bound covers when the job is no slower than the lower throughput
        before = np.median(np.abs(analytic / measured_tps - 1))
        print(f"{len(cases)} later jobs: throughput median APE analytic {before:.1%}, with the site stage "
              f"{np.median(np.abs(point / measured_tps - 1)):.1%}; runtime upper bound coverage "
              f"{np.mean(lower <= measured_tps):.0%}, median slack {np.median(measured_tps / lower - 1):.1%}")
        return
    measured_bytes = np.asarray([row["measured"]["peak_bytes"] for row, _ in later], dtype=float)
    analytic = np.asarray([case.vram.peak_vram_bytes for case in cases], dtype=float)  # type: ignore[attr-defined]
    point, upper = model.predict_with_upper(cases)
    print(f"{len(cases)} later jobs: median APE analytic {np.median(np.abs(analytic / measured_bytes - 1)):.1%}, "
          f"with the site stage {np.median(np.abs(point / measured_bytes - 1)):.1%}; upper bound coverage "
          f"{np.mean(upper >= measured_bytes):.0%}, median slack {np.median(upper / measured_bytes - 1):.1%}")


if __name__ == "__main__":
    main()
