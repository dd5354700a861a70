"""``vramfit ray pools`` and ``vramfit ray submit SPEC [options] -- ENTRYPOINT...``.

Exit codes: 0 submitted (or listed), 1 refused (no pool fits; nothing submitted), 2 bad input, Ray missing
or no cluster at the address.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from predictors.errors import SpecError
from scheduler.cli.place import deadline_seconds, render_table
from scheduler.cli.server_common import read_token, seconds_problem
from scheduler.placement import OBJECTIVES
from scheduler.pools import default_pools, load_pools

SUBMIT_HELP = """Predict, place and submit a training job to a Ray cluster through the Ray Jobs API. SPEC is a
TrainingSpec, a job manifest, or a Ray Jobs submission (JSON/YAML with `entrypoint`, `runtime_env`, ...). The
command after `--` is the job's entrypoint (not needed when SPEC is a submission with its own). The driver is
pinned to the chosen GPU type (entrypoint resource accelerator_type:<TYPE>, or a label selector), and the
decision reaches the job as VRAMFIT_ACCELERATOR_TYPE, VRAMFIT_GPU, VRAMFIT_NUM_GPUS, VRAMFIT_NUM_NODES,
VRAMFIT_POOL, VRAMFIT_DECISION_ID and as vramfit.* job metadata. Exit 1 when no pool fits (nothing is
submitted)."""


def _default_address() -> str:
    env = os.environ.get("RAY_ADDRESS", "")
    return env if env.startswith(("http://", "https://")) else "http://127.0.0.1:8265"


class _EntrypointParser(argparse.ArgumentParser):
    """Everything after the first ``--`` is the entrypoint, taken before argparse sees it (argparse would
    otherwise match an empty entrypoint right after SPEC and reject the rest)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        items = list(sys.argv[1:] if args is None else args)
        rest: list[str] = []
        if "--" in items:
            cut = items.index("--")
            items, rest = items[:cut], items[cut + 1:]
        parsed, extras = super().parse_known_args(items, namespace)
        parsed.entrypoint = rest
        return parsed, extras


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="the cluster's dashboard / Ray Jobs URL (default: $RAY_ADDRESS if it is an http URL, "
                        "else http://127.0.0.1:8265)")
    p.add_argument("--gcs-address", help="the cluster's GCS HOST:PORT, read for its nodes (default: the host of "
                                         "--address, port 6379)")
    p.add_argument("--pools", help="node pools YAML with the prices (default: the embedded pools)")
    p.add_argument("--timeout", type=float, default=15.0,
                   help="seconds to wait for the cluster (default 15)")
    p.add_argument("--format", choices=("table", "json"), default="table")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("ray", help="place and submit jobs on a Ray cluster (needs vramfit[ray])",
                       description="Ray integration: pools from a live cluster, submission through Ray Jobs.")
    ray_sub = p.add_subparsers(dest="ray_command", metavar="RAY_COMMAND", parser_class=_EntrypointParser)
    ray_sub.required = True

    pools = ray_sub.add_parser("pools", help="the GPU pools of a live Ray cluster, priced by the pools config")
    _add_cluster_args(pools)
    pools.set_defaults(func=run_pools)

    submit = ray_sub.add_parser("submit", help="place a job on the cluster's cheapest fitting GPU type and submit it",
                                description=SUBMIT_HELP, usage="vramfit ray submit SPEC [options] -- ENTRYPOINT...")
    submit.add_argument("spec", help="TrainingSpec, job manifest or Ray Jobs submission (YAML/JSON)")
    _add_cluster_args(submit)
    submit.add_argument("--objective", choices=OBJECTIVES, default="cheapest")
    submit.add_argument("--deadline-hours", type=float, help="deadline for cheapest-within-deadline")
    submit.add_argument("--headroom", type=float, help="fraction of GPU memory kept free (default 0.05)")
    submit.add_argument("--driver-gpus", action="store_true",
                        help="the entrypoint trains itself: give the driver the chosen GPUs (one node only)")
    submit.add_argument("--label-selector", action="store_true",
                        help="pin the driver with the ray.io/accelerator-type label instead of the resource")
    submit.add_argument("--submission-id", help="the Ray submission id (default: Ray's)")
    submit.add_argument("--no-discover", action="store_true",
                        help="do not read the cluster's nodes; place on the pools file as it is")
    submit.add_argument("--dry-run", action="store_true", help="place and show the submission; send nothing")
    submit.add_argument("--ledger-url", help="the collector (e.g. http://vramfit-collector.vramfit-system.svc:8080): "
                        "the decision is recorded there once submitted, and the job gets VRAMFIT_URL so its "
                        "reporter's actual joins it")
    submit.add_argument("--ledger-token-file", type=Path, help="bearer token for --ledger-url (file)")
    submit.set_defaults(func=run_submit)


MIN_TIMEOUT_SECONDS = 0.1


def _timeout_problem(args: argparse.Namespace) -> int | None:
    """Exit 2 with the message when --timeout is not a positive, finite number of seconds."""
    problem = seconds_problem(args.timeout, "--timeout", "ray", MIN_TIMEOUT_SECONDS)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    return None


def _error(message: str) -> int:
    print(f"vramfit: {message}", file=sys.stderr)
    return 2


def run_pools(args: argparse.Namespace) -> int:
    if (code := _timeout_problem(args)) is not None:
        return code
    from scheduler.integrations.ray.connection import RayIntegrationError, gcs_address_for
    from scheduler.integrations.ray.discovery import discover_pools

    config = load_pools(args.pools) if args.pools else default_pools()
    gcs = args.gcs_address or gcs_address_for(args.address or _default_address())
    try:
        cluster = discover_pools(gcs, config, args.timeout)
    except RayIntegrationError as exc:
        return _error(str(exc))
    if args.format == "json":
        print(json.dumps(cluster.to_dict(), indent=2))
        return 0
    print(f"{'pool':16s} {'gpu':10s} {'ray type':9s} {'nodes':>5s} {'gpus/node':>9s} {'free':>5s} {'$/GPU-h':>8s}")
    for pool in cluster.pools:
        print(f"{pool.name:16s} {pool.gpu:10s} {cluster.accelerator_type(pool.name):9s} {pool.nodes:>5d} "
              f"{pool.gpus_per_node:>9d} {pool.free_gpus if pool.free_gpus is not None else '-':>5} "
              f"{pool.price_usd_per_gpu_hour:>8.2f}")
    if not cluster.pools:
        print("(no priced GPU pool in the cluster)")
    for w in cluster.warnings:
        print(f"warning: {w}")
    return 0


def _request_lines(request: dict[str, Any]) -> list[str]:
    """Everything submit_job is given (the JSON format has it too): vramfit's environment on one line, the
    job's own environment and the other runtime_env fields, metadata, resources and ids as they are sent."""
    lines = [f"  entrypoint: {request['entrypoint']}"]
    runtime_env = dict(request.get("runtime_env") or {})
    env = dict(runtime_env.pop("env_vars", None) or {})
    for key, value in request.items():
        if key not in ("entrypoint", "runtime_env", "metadata"):
            lines.append(f"  {key}: {json.dumps(value)}")
    lines.append("  env: " + " ".join(f"{k}={v}" for k, v in env.items() if k.startswith("VRAMFIT_")))
    own = {k: v for k, v in env.items() if not k.startswith("VRAMFIT_")}
    if own:
        lines.append("  env (the job's): " + " ".join(f"{k}={v}" for k, v in own.items()))
    if runtime_env:
        lines.append(f"  runtime_env: {json.dumps(runtime_env)}")
    if request.get("metadata"):
        lines.append(f"  metadata: {json.dumps(request['metadata'])}")
    return lines


def _record(plan: Any, submission_id: str, ledger_url: str, token: str | None) -> bool:
    """POST the decision to the collector's ledger (retried, never raises), named by its Ray submission id."""
    from scheduler.integrations.admission import decision_record
    from scheduler.integrations.reporter import post_json

    body = decision_record(plan.decision, plan.job.spec, plan.decision_id, datetime.now(timezone.utc),
                           "RayJobSubmission", None, submission_id)
    return post_json(ledger_url.rstrip("/") + "/v1/decisions", body, token, timeout_seconds=5.0, attempts=3,
                     backoff_seconds=0.5)


def run_submit(args: argparse.Namespace) -> int:
    if (code := _timeout_problem(args)) is not None:
        return code
    from scheduler.integrations.ray.connection import RayIntegrationError
    from scheduler.integrations.ray.submit import JobRefused, plan_submission, send

    entrypoint = list(getattr(args, "entrypoint", []) or [])
    if args.headroom is not None and not 0 <= args.headroom < 1:
        raise SpecError.one("--headroom", f"must be a fraction in [0, 1); got {args.headroom}")
    deadline = deadline_seconds(args.deadline_hours)
    address = args.address or _default_address()
    pools = load_pools(args.pools) if args.pools else default_pools()
    try:
        plan = plan_submission(
            args.spec, pools, entrypoint or None, address=address, gcs_address=args.gcs_address,
            discover=not args.no_discover, objective=args.objective,
            deadline_seconds=deadline,
            headroom_fraction=args.headroom, driver_gpus=args.driver_gpus, use_label_selector=args.label_selector,
            submission_id=args.submission_id, timeout_seconds=args.timeout, report_url=args.ledger_url)
    except RayIntegrationError as exc:
        return _error(str(exc))

    submission_id = None
    failure = None
    recorded: bool | None = None
    token = read_token(args.ledger_token_file, "--ledger-token-file")
    if plan.request is not None and not args.dry_run:
        try:
            submission_id = send(plan, address, timeout_seconds=args.timeout)
        except (RayIntegrationError, JobRefused) as exc:
            failure = str(exc)
    if submission_id and args.ledger_url:
        recorded = _record(plan, submission_id, args.ledger_url, token)

    if args.format == "json":
        print(json.dumps({**plan.to_dict(), "submission_id": submission_id, "recorded": recorded}, indent=2))
    else:
        print(render_table(plan.decision))
        for w in plan.cluster.warnings:
            print(f"warning: {w}")
        if plan.request is None:
            print("refused: no pool of the Ray cluster fits the job; nothing submitted")
        else:
            print(f"{'would submit' if args.dry_run else 'submitting'} to {address} "
                  f"(decision {plan.decision_id}, Ray accelerator type {plan.accelerator_type}):")
            print("\n".join(_request_lines(plan.request.submit_kwargs())))
            if submission_id:
                print(f"submission_id: {submission_id}")
            if recorded is not None:
                print(f"decision {plan.decision_id} {'recorded at' if recorded else 'NOT recorded at'} "
                      f"{args.ledger_url}")
    if failure:
        return _error(failure)
    return 1 if plan.request is None else 0
