"""Place a training job on a Ray cluster's GPU pools and submit it through the Ray Jobs API.

Steps: read the job (a TrainingSpec, a job manifest, or an existing Ray Jobs submission), find the pools
of the cluster (:mod:`.discovery`), place the job (:func:`scheduler.placement.place`), and, when a pool
fits, send a submission whose driver lands on that pool's GPU type:

- ``entrypoint_resources = {"accelerator_type:<TYPE>": 0.001}`` (or, with ``use_label_selector``,
  ``entrypoint_label_selector = {"ray.io/accelerator-type": "<TYPE>"}``) pins the driver to such a node;
  with ``driver_gpus`` the driver also holds the decision's GPUs (``entrypoint_num_gpus``);
- ``runtime_env.env_vars`` gets ``VRAMFIT_ACCELERATOR_TYPE``, ``VRAMFIT_GPU``, ``VRAMFIT_NUM_GPUS``,
  ``VRAMFIT_NUM_NODES``, ``VRAMFIT_POOL``, ``VRAMFIT_DECISION_ID`` and ``VRAMFIT_PIN`` (``label`` or ``resource``:
  how the driver was pinned) (merged over the user's), which
  :func:`.train.scaling_config_from_env` turns into the workers' ``ScalingConfig``; with ``report_url`` also
  ``VRAMFIT_URL``, where the job's reporter posts its actual;
- ``metadata`` gets ``vramfit.*`` keys with the decision and the prediction (strings, as Ray requires).

When nothing fits, nothing is sent: :class:`JobRefused` carries the decision with one reason per pool.
"""

from __future__ import annotations

import copy
import shlex
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from predictors.errors import SpecError
from predictors.spec import TrainingSpec
from scheduler.integrations.ray.connection import (
    DEFAULT_TIMEOUT_SECONDS,
    RayIntegrationError,
    auth_hint,
    bounded,
    check_reachable,
    dashboard_url,
    gcs_address_for,
    import_ray,
)
from scheduler.integrations.ray.discovery import (
    ACCELERATOR_LABEL,
    ACCELERATOR_RESOURCE_PREFIX,
    ClusterPools,
    configured_pools,
    discover_pools,
)
from scheduler.placement import Decision, place
from scheduler.pools import PoolsConfig, default_pools, load_pools
from scheduler.spec import ParsedJob
from scheduler.spec.document import load_documents, parse_document, read_text

ENV_ACCELERATOR_TYPE = "VRAMFIT_ACCELERATOR_TYPE"
ENV_GPU = "VRAMFIT_GPU"
ENV_NUM_GPUS = "VRAMFIT_NUM_GPUS"
ENV_NUM_NODES = "VRAMFIT_NUM_NODES"
ENV_POOL = "VRAMFIT_POOL"
ENV_DECISION_ID = "VRAMFIT_DECISION_ID"
ENV_URL = "VRAMFIT_URL"
# How the driver was pinned to the pool: "label" (entrypoint_label_selector: nodes typed only by the
# ray.io/accelerator-type label have no accelerator_type:<TYPE> resource) or "resource"; the job's Ray Train
# workers must be steered the same way (scaling_config_from_env reads it), or on a label-only pool they wait forever.
ENV_PIN = "VRAMFIT_PIN"
# The driver asks for a sliver of the accelerator-type resource: enough to pick the node, not to hold a GPU.
DRIVER_PIN_AMOUNT = 0.001

JobInput = ParsedJob | TrainingSpec | Mapping[str, Any] | str | Path
_SUBMISSION_KEYS = ("entrypoint", "runtime_env", "metadata", "submission_id", "entrypoint_num_cpus",
                    "entrypoint_num_gpus", "entrypoint_memory", "entrypoint_resources", "entrypoint_label_selector")


class JobRefused(Exception):
    """No pool of the cluster fits the job; nothing was submitted. ``decision`` holds the reasons."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        reasons = "".join(f"\n  - {r}" for r in decision.reasons)
        super().__init__(f"refused: no pool of the Ray cluster fits the job; nothing submitted{reasons}")


@dataclass(frozen=True)
class JobRequest:
    """The Ray Jobs submission vramfit sends (the arguments of ``JobSubmissionClient.submit_job``)."""

    entrypoint: str
    runtime_env: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    entrypoint_resources: dict[str, float] | None = None
    entrypoint_label_selector: dict[str, str] | None = None
    entrypoint_num_gpus: float | None = None
    entrypoint_num_cpus: float | None = None
    entrypoint_memory: int | None = None
    submission_id: str | None = None

    def submit_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``submit_job``; unset ones are left out (older Ray lacks some)."""
        return {k: v for k, v in self.__dict__.items() if v not in (None, {})}


@dataclass(frozen=True)
class Plan:
    """Everything decided before anything is sent: the job, the cluster's pools, the decision, the request."""

    job: ParsedJob
    cluster: ClusterPools
    decision: Decision
    decision_id: str
    request: JobRequest | None  # None when the job is refused

    def to_dict(self) -> dict[str, Any]:
        return {"decision_id": self.decision_id, "decision": self.decision.to_dict(),
                "ray_accelerator_type": self.accelerator_type,
                "request": self.request.submit_kwargs() if self.request else None,
                "warnings": list(self.cluster.warnings)}

    @property
    def accelerator_type(self) -> str | None:
        c = self.decision.chosen
        return self.cluster.accelerator_type(c.pool.name) if c else None


class SubmitResult(NamedTuple):
    decision: Decision
    submission_id: str


def load_job(job: JobInput, source: str = "<job>") -> tuple[ParsedJob, dict[str, Any] | None]:
    """The job to place, and the Ray submission it came from (when it is one) to keep its fields."""
    if isinstance(job, ParsedJob):
        return job, None
    if isinstance(job, TrainingSpec):
        return ParsedJob(spec=job), None
    base_dir: Path | None = None
    if isinstance(job, Mapping):
        docs: list[Any] = [dict(job)]
    else:
        path = Path(job)
        source, base_dir = str(path), path.parent
        docs = load_documents(read_text(path), source)
    parsed: list[tuple[ParsedJob, Any]] = []
    for i, doc in enumerate(docs):
        parsed += [(p, doc) for p in parse_document(doc, source, base_dir, i, docs)]
    if len(parsed) != 1:
        raise SpecError.one("", f"holds {len(parsed)} training jobs; `vramfit ray submit` takes exactly one",
                            "split the file", source)
    parsed_job, doc = parsed[0]
    is_submission = isinstance(doc, dict) and "kind" not in doc and "entrypoint" in doc and "model" not in doc
    return parsed_job, (doc if is_submission else None)


def _entrypoint_text(entrypoint: str | Sequence[str] | None) -> str | None:
    if entrypoint is None:
        return None
    text = entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint)
    return text if text.strip() else None


def decision_metadata(decision: Decision, accelerator_type: str, decision_id: str) -> dict[str, str]:
    """``vramfit.*`` job metadata: the decision and the prediction, as strings."""
    c = decision.chosen
    assert c is not None
    values: dict[str, Any] = {
        "decision_id": decision_id,
        "objective": decision.objective,
        "pool": c.pool.name,
        "gpu": c.pool.gpu,
        "accelerator_type": accelerator_type,
        "gpus": c.gpus,
        "nodes": c.nodes,
        "predicted_peak_vram_bytes": c.peak_vram_bytes,
        "predicted_peak_vram_upper_bytes": c.peak_vram_upper_bytes,
        "predicted_runtime_seconds": None if c.runtime_seconds is None else round(c.runtime_seconds, 1),
        "predicted_cost_usd": None if c.cost_usd is None else round(c.cost_usd, 4),
        "price_usd_per_gpu_hour": c.pool.price_usd_per_gpu_hour,
        "waits_for_capacity": str(decision.waits_for_capacity).lower(),
    }
    return {f"vramfit.{k}": str(v) for k, v in values.items() if v is not None}


def decision_env(decision: Decision, accelerator_type: str, decision_id: str) -> dict[str, str]:
    """The environment variables that tell the job where it was placed."""
    c = decision.chosen
    assert c is not None and c.gpus is not None
    return {ENV_ACCELERATOR_TYPE: accelerator_type, ENV_GPU: c.pool.gpu, ENV_NUM_GPUS: str(c.gpus),
            ENV_NUM_NODES: str(c.nodes or 1), ENV_POOL: c.pool.name, ENV_DECISION_ID: decision_id}


def build_request(
    decision: Decision,
    accelerator_type: str,
    decision_id: str,
    entrypoint: str | None = None,
    base: Mapping[str, Any] | None = None,
    *,
    driver_gpus: bool = False,
    use_label_selector: bool = False,
    runtime_env: Mapping[str, Any] | None = None,
    metadata: Mapping[str, str] | None = None,
    submission_id: str | None = None,
    report_url: str | None = None,
) -> JobRequest:
    """The submission for a placed decision, merged over ``base`` (an existing submission); pure."""
    c = decision.chosen
    if c is None or c.gpus is None:
        raise JobRefused(decision)
    base = dict(base or {})
    unknown = sorted(set(base) - set(_SUBMISSION_KEYS) - {"job_id"})
    if unknown:
        raise SpecError.one(unknown[0], "is not a Ray Jobs submission field vramfit passes on",
                            f"remove it; known fields: {', '.join(_SUBMISSION_KEYS)}")
    command = _entrypoint_text(entrypoint)
    if command and base.get("entrypoint"):
        raise SpecError.one("entrypoint", "is given twice (in the submission and on the command line)",
                            "drop one of them")
    command = command or base.get("entrypoint")
    if not command:
        raise SpecError.one("entrypoint", "is missing", "give the command to run after `--`")

    env_base = copy.deepcopy(dict(base.get("runtime_env") or {}))
    env_base.update(copy.deepcopy(dict(runtime_env or {})))
    env_vars = {str(k): str(v) for k, v in dict(env_base.get("env_vars") or {}).items()}
    if report_url:  # where the job's VramReporter posts its actual (the collector that holds the decision)
        env_vars[ENV_URL] = report_url
    env_vars.update(decision_env(decision, accelerator_type, decision_id))
    env_vars[ENV_PIN] = "label" if use_label_selector else "resource"
    env_base["env_vars"] = env_vars

    meta = {str(k): str(v) for k, v in dict(base.get("metadata") or {}).items()}
    meta.update({str(k): str(v) for k, v in dict(metadata or {}).items()})
    meta.update(decision_metadata(decision, accelerator_type, decision_id))

    resources = {str(k): float(v) for k, v in dict(base.get("entrypoint_resources") or {}).items()
                 if not str(k).startswith(ACCELERATOR_RESOURCE_PREFIX)}
    selector = {str(k): str(v) for k, v in dict(base.get("entrypoint_label_selector") or {}).items()}
    if use_label_selector:
        selector[ACCELERATOR_LABEL] = accelerator_type
    else:
        resources[ACCELERATOR_RESOURCE_PREFIX + accelerator_type] = DRIVER_PIN_AMOUNT
    num_gpus = base.get("entrypoint_num_gpus")
    if driver_gpus:
        if (c.nodes or 1) > 1:
            raise RayIntegrationError(
                f"the decision needs {c.gpus} GPUs on {c.nodes} nodes, but a Ray job's driver runs on one node; "
                "drop --driver-gpus and start the GPU work as Ray workers (scaling_config_from_env)")
        num_gpus = c.gpus
    return JobRequest(
        entrypoint=str(command),
        runtime_env=env_base,
        metadata=meta,
        entrypoint_resources=resources or None,
        entrypoint_label_selector=selector or None,
        entrypoint_num_gpus=float(num_gpus) if num_gpus else None,
        entrypoint_num_cpus=base.get("entrypoint_num_cpus"),
        entrypoint_memory=base.get("entrypoint_memory"),
        submission_id=submission_id or base.get("submission_id") or base.get("job_id"),
    )


def _pools_config(pools: PoolsConfig | str | Path | None) -> PoolsConfig:
    if pools is None:
        return default_pools()
    return pools if isinstance(pools, PoolsConfig) else load_pools(pools)


def plan_submission(
    job: JobInput,
    pools: PoolsConfig | str | Path | None = None,
    entrypoint: str | Sequence[str] | None = None,
    *,
    gcs_address: str | None = None,
    address: str | None = None,
    discover: bool = True,
    objective: str = "cheapest",
    deadline_seconds: float | None = None,
    headroom_fraction: float | None = None,
    driver_gpus: bool = False,
    use_label_selector: bool = False,
    runtime_env: Mapping[str, Any] | None = None,
    metadata: Mapping[str, str] | None = None,
    submission_id: str | None = None,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    report_url: str | None = None,
) -> Plan:
    """Read, discover, place and build the request; sends nothing. ``request`` is None when refused.

    The cluster is read at ``gcs_address`` (default: the host of ``address`` on Ray's GCS port 6379); with
    ``discover=False`` the configured pools are used as they are.
    """
    parsed, base = load_job(job)
    config = _pools_config(pools)
    if discover:
        gcs = gcs_address or gcs_address_for(address or "http://127.0.0.1:8265")
        cluster = discover_pools(gcs, config, timeout_seconds)
    else:
        cluster = configured_pools(config)
    try:
        decision = place(parsed.spec, cluster.config(), objective, deadline_seconds, headroom_fraction,
                         base_dir=parsed.base_dir)
    except ValueError as exc:
        raise SpecError.one("objective", str(exc)) from None
    decision_id = f"vf-{uuid.uuid4().hex[:16]}"
    request = None
    if decision.chosen is not None:
        # a pool typed only by its nodes' label has no accelerator_type:<T> resource to pin the driver with
        use_label_selector = use_label_selector or decision.chosen.pool.name in cluster.label_only
        request = build_request(decision, cluster.accelerator_type(decision.chosen.pool.name), decision_id,
                                _entrypoint_text(entrypoint), base, driver_gpus=driver_gpus,
                                use_label_selector=use_label_selector, runtime_env=runtime_env, metadata=metadata,
                                submission_id=submission_id, report_url=report_url)
    return Plan(parsed, cluster, decision, decision_id, request)


def job_client(address: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> Any:
    """A ``JobSubmissionClient`` for the dashboard at ``address``, or a clear error within the time limit."""
    import_ray()
    url = dashboard_url(address)
    check_reachable(url, 8265, "job server (dashboard)", min(timeout_seconds, 5.0))
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise RayIntegrationError("the Ray Jobs client is missing; install `vramfit[ray]` (ray[default])") from None
    try:
        return bounded(lambda: JobSubmissionClient(url), timeout_seconds, f"the Ray job server at {url}")
    except RayIntegrationError:
        raise
    except Exception as exc:
        raise RayIntegrationError(f"cannot use the Ray job server at {url}: {exc}{auth_hint(exc)}") from None


def send(plan: Plan, address: str, client: Any = None, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> str:
    """Submit a placed plan; returns the submission id. Refused plans raise :class:`JobRefused`."""
    if plan.request is None:
        raise JobRefused(plan.decision)
    client = client or job_client(address, timeout_seconds)
    kwargs = plan.request.submit_kwargs()
    try:
        return str(bounded(lambda: client.submit_job(**kwargs), timeout_seconds, "the Ray job submission"))
    except RayIntegrationError:
        raise
    except TypeError as exc:
        if "entrypoint_label_selector" not in str(exc):
            raise
        raise RayIntegrationError("this Ray version has no label selectors for the driver; drop --label-selector "
                                  "or upgrade Ray") from None
    except Exception as exc:
        raise RayIntegrationError(f"the Ray job server rejected the submission: {exc}{auth_hint(exc)}") from None


def submit_job(
    job: JobInput,
    address: str,
    pools: PoolsConfig | str | Path | None = None,
    entrypoint: str | Sequence[str] | None = None,
    **options: Any,
) -> SubmitResult:
    """Place ``job`` on the cluster at ``address`` (its dashboard URL) and submit it; returns the decision and
    the submission id. Raises :class:`JobRefused` (nothing submitted) when no pool fits. ``options`` are
    those of :func:`plan_submission`."""
    timeout = float(options.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS))
    plan = plan_submission(job, pools, entrypoint, address=address, **options)
    if plan.request is None:
        raise JobRefused(plan.decision)
    return SubmitResult(plan.decision, send(plan, address, timeout_seconds=timeout))
