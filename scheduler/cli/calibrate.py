"""``vramfit calibrate``: measure real training steps of a sweep and record them as reference runs."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from pydantic import ValidationError

from predictors.errors import FieldProblem, SpecError
from predictors.spec import problems_from_validation
from scheduler.calibrate.runner import CalibrateError, RunnerOptions, run_sweep
from scheduler.calibrate.sweep import RunSettings, load_sweep
from scheduler.cli.server_common import Terminated, sigterm_raises


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "calibrate",
        help="run a sweep of real training steps and record peak memory and tokens/s as reference runs",
        description="Each config of the sweep runs in its own process (random weights, synthetic tokens); "
        "its row is appended to --out as soon as it finishes. Needs the calibrate extra: "
        "pip install 'vramfit[calibrate]'.",
    )
    parser.add_argument("--sweep", type=Path, required=True, help="sweep YAML (see bench/sweeps/)")
    parser.add_argument("--out", type=Path, help="JSONL file the rows are appended to (required unless --list)")
    parser.add_argument("--resume", action="store_true", help="skip configs whose rows are already in --out")
    parser.add_argument("--retry-failed", action="store_true",
                        help="with --resume (required): first drop the crash/timeout rows of --out so those configs "
                        "run again")
    parser.add_argument("--list", action="store_true", help="print the expanded configs and exit (no torch needed)")
    parser.add_argument("--only", action="append", default=[], metavar="ID_OR_GROUP",
                        help="run only these config ids or grid names (repeatable), in the order given")
    parser.add_argument("--limit", type=int, help="run at most this many configs")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="where to train (auto: CUDA when available)")
    parser.add_argument("--timeout-seconds", type=float, help="budget per config (default: the sweep's settings)")
    parser.add_argument("--warmup-steps", type=int, help="steps before measuring (default: the sweep's settings)")
    parser.add_argument("--measured-steps", type=int, help="timed steps (default: the sweep's settings)")
    parser.add_argument("--scratch-dir", help="folder for the temporary checkpoints qlora quantizes from")
    parser.set_defaults(func=_calibrate)


def _calibrate(args: argparse.Namespace) -> int:
    if args.retry_failed and not args.resume:
        raise SpecError.one("--retry-failed", "goes with --resume (it re-runs the failed configs of a sweep "
                            "that --resume continues)", "add --resume")
    sweep, configs = load_sweep(args.sweep)
    if args.only:
        wanted = set(args.only)
        unknown = sorted(wanted - {c.config_id for c in configs} - {c.group for c in configs})
        if unknown:
            raise SpecError.one("--only", f"no config id or group {', '.join(map(repr, unknown))} in the sweep",
                                "run with --list to see the ids and groups", str(args.sweep))
        # in the order the selectors are given (a priority order for a sweep that may be cut short), then the
        # sweep's own order within one selector
        rank = {selector: n for n, selector in reversed(list(enumerate(args.only)))}
        selected = [c for c in configs if c.config_id in wanted or c.group in wanted]
        configs = sorted(selected, key=lambda c: min(rank.get(c.config_id, len(rank)), rank.get(c.group, len(rank))))
    if args.limit is not None:
        if args.limit < 1:
            raise SpecError.one("--limit", f"must be a positive number of configs; got {args.limit}")
        configs = configs[: args.limit]
    if args.list:
        for config in configs:
            print(f"{config.config_id}  {config.group:24s} {config.summary}")
        print(f"{len(configs)} configs", file=sys.stderr)
        return 0
    if args.out is None:
        print("vramfit: `--out` is required to run a sweep. To fix: give --out runs.jsonl (or use --list)",
              file=sys.stderr)
        return 2
    overrides = {"warmup_steps": args.warmup_steps, "measured_steps": args.measured_steps,
                 "timeout_seconds": args.timeout_seconds}
    try:  # the flags obey the sweep file's own limits (warm-up >= 0, measured > 0, a positive finite budget)
        settings = RunSettings.model_validate(
            {**sweep.settings.model_dump(), **{k: v for k, v in overrides.items() if v is not None}})
    except ValidationError as exc:
        raise SpecError([FieldProblem("--" + str(p.path).replace("_", "-"), p.message, p.hint)
                         for p in problems_from_validation(exc, prefix="")]) from None
    options = RunnerOptions(
        warmup_steps=settings.warmup_steps,
        measured_steps=settings.measured_steps,
        timeout_seconds=settings.timeout_seconds,
        device=args.device,
        scratch_dir=args.scratch_dir,
    )
    try:
        with sigterm_raises():  # SIGTERM, like Ctrl-C, unwinds through the runner, which kills the running worker
            summary = run_sweep(configs, args.out, sweep.name, options, resume=args.resume,
                                retry_failed=args.retry_failed,
                                log=lambda line: print(line, file=sys.stderr, flush=True))
    except CalibrateError as exc:
        print(f"vramfit: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"vramfit calibrate: terminated; the finished configs' rows are in {args.out} (--resume continues)",
              file=sys.stderr)
        return 128 + signal.SIGTERM
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(summary.outcomes.items())) or "nothing to run"
    print(f"{len(summary.rows)} rows appended to {args.out}: {counts}", file=sys.stderr)
    return 0
