"""What-if: the dev reference runs predicted with the settings their sources state but a TrainingSpec v1 cannot
express (torchtune's compile, chunked cross-entropy, optimizer in backward, activation offloading; PEFT's
modules_to_save), given as vramfit's extension fields in ``bench/data/stated_settings.yaml``.

    python bench/stated_settings.py [--runs ../shared/reference/runs-dev.jsonl] [--rows]

Prints, for the rows the file names and for the whole dev set (quality high/medium, per-GPU), the analytic
model's absolute percentage error with the v1 specs and with the stated settings. Issue 2's figures are the v1 ones;
this shows what the extensions do where a job says what it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from predictors.evaluation import Evaluation, evaluate, select_runs  # noqa: E402
from predictors.reference import ReferenceRun, parse_runs  # noqa: E402
from predictors.spec import parse_training_spec, spec_to_dict  # noqa: E402

SETTINGS = REPO / "bench" / "data" / "stated_settings.yaml"
DEFAULT_RUNS = REPO.parent / "shared" / "reference" / "runs-dev.jsonl"


def stated_settings(path: Path = SETTINGS) -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise SystemExit(f"{path}: expected a mapping of run id -> extension fields")
    return data


def with_settings(runs: list[ReferenceRun], settings: dict[str, dict[str, Any]]) -> list[ReferenceRun]:
    """The runs, those named in ``settings`` with the fields added to their spec (validated as any spec)."""
    known = {r.id for r in runs}
    missing = sorted(set(settings) - known)
    if missing:
        raise SystemExit(f"stated settings name runs that are not in the file: {', '.join(missing)}")
    out = []
    for run in runs:
        extra = settings.get(run.id)
        if extra:
            merged = spec_to_dict(run.spec)
            for key, value in extra.items():  # a mapping (lora) is merged into the run's own
                both_maps = isinstance(value, dict) and isinstance(merged.get(key), dict)
                merged[key] = {**merged[key], **value} if both_maps else value
            spec = parse_training_spec(merged, prefix=f"{run.id}.spec")
            run = run.model_copy(update={"spec": spec})
        out.append(run)
    return out


def both(runs_path: Path = DEFAULT_RUNS, settings_path: Path = SETTINGS) -> tuple[Evaluation, Evaluation, set[str]]:
    runs = select_runs(parse_runs(runs_path.read_text(), str(runs_path)), {"high", "medium"})
    settings = stated_settings(settings_path)
    return evaluate(runs), evaluate(with_settings(runs, settings)), set(settings)


def _pct(x: float) -> str:
    return f"{100 * x:5.1f} %"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--settings", type=Path, default=SETTINGS)
    ap.add_argument("--rows", action="store_true", help="one line per run with stated settings")
    args = ap.parse_args(argv)
    v1, stated, ids = both(args.runs, args.settings)
    print(f"{'':28s} {'n':>4s} {'median':>8s} {'p90':>8s} {'max':>8s} {'bias':>8s}")
    for label, ev, keep in (("named rows, v1 spec", v1, ids), ("named rows, stated settings", stated, ids),
                            ("all dev rows, v1 spec", v1, None), ("all dev rows, stated settings", stated, None)):
        s = ev.summary() if keep is None else Evaluation([r for r in ev.results if r.run.id in keep]).summary()
        print(f"{label:28s} {s['n']:4d} {_pct(s['median_ape'])} {_pct(s['p90_ape'])} {_pct(s['max_ape'])} "
              f"{_pct(s['bias'])}")
    print("by source, stated settings (v1 spec):")
    v1_sources = v1.by(lambda r: r.run.source)
    for source, st in stated.by(lambda r: r.run.source).items():
        print(f"  {source:6s} {st['n']:4d} median {_pct(st['median_ape'])} ({_pct(v1_sources[source]['median_ape'])})"
              f"  p90 {_pct(st['p90_ape'])} ({_pct(v1_sources[source]['p90_ape'])})")
    if args.rows:
        before = {r.run.id: r for r in v1.results}
        for r in stated.results:
            if r.run.id in ids and r.run.id in before and r.error is not None:
                b = before[r.run.id]
                fields = ", ".join(f"{k}" for k in stated_settings(args.settings)[r.run.id])
                print(f"  {r.run.id:9s} {r.run.measured.metric:9s} measured {r.measured_bytes / 2**30:6.2f} GiB  "
                      f"v1 {b.error:+7.1%}  stated {r.error:+7.1%}  ({fields})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
