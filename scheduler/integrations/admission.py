"""Kubernetes admission as a pure function: an AdmissionReview (v1) dict in, an AdmissionReview out.

:func:`review` never raises and does no I/O: the HTTP server around it only decodes JSON, calls it
and encodes the answer. Two webhooks share it:

``mutate``
    For a GPU training job (Pod, batch Job, JobSet, PyTorchJob, TrainJob, RayJob, RayCluster, Volcano
    Job) that fits a pool: a JSON Patch that adds the pool's ``nodeSelector`` and ``tolerations`` to
    every GPU pod template (never replacing a user's entries), sets the GPU count when the spec says
    ``gpus: auto`` (rule in :func:`_gpu_counts`), and annotates the object with the prediction, the
    pool and a ``decision-id``. The patch is additive and idempotent: reviewing the patched object
    again yields no operations. A job that fits no pool is let through unpatched (``/validate``
    denies it); objects that are not GPU training jobs pass untouched.
``validate``
    Denies a job that fits no pool, with every pool's reason and the best what-if change; for a
    placed job, soft concerns go to ``warnings`` (assumptions, low confidence, pool full now, a
    cheaper pool than the one the user pinned).

Pinning: when a GPU pod template already selects nodes by a GPU label, by a label one of the pools
uses, or by the Kueue flavor label, placement is restricted to the matching pools and nothing about
node selection is patched; a pinned GPU type no pool offers is only checked for fit. Kueue (setting
``kueue``): a job labelled ``kueue.x-k8s.io/queue-name`` gets only the ResourceFlavor's node label
(``kueue_flavor_label_key``; value: the pool's own label under that key, else the pool name), so Kueue
admits it to that flavor and injects the flavor's labels and tolerations itself. Pods created by a
controller (an ``ownerReference`` with ``controller: true``) or from a template vramfit already
annotated, and objects a placed job kind controls (``PLACED_KINDS``) whose pod templates carry the decision
id vramfit wrote into their parent, are skipped: their job was placed once. Only CREATE is reviewed, never a
subresource.

Failure: an exception inside the review follows ``failure_mode``: ``fail_open`` allows the object
with a warning, ``fail_closed`` denies it with the error. A GPU job vramfit cannot read (no model
found, a bad ``vramfit.io/spec`` annotation) follows ``unreadable_job`` (default allow, with the
reason as a warning). ``dryRun`` requests are reviewed the same way (the API server discards the
patch); :func:`admit` returns no ledger record for them, so the server records nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.spec import ModelRef, TrainingSpec, spec_to_dict
from predictors.units import format_bytes
from scheduler.placement import DEFAULT_HEADROOM_FRACTION, Decision, place, pod_shape
from scheduler.pools import NodePool, PoolsConfig, default_pools
from scheduler.spec import NoTrainingJob, ParsedJob
from scheduler.spec.merge import ANNOTATION, NO_GPU_REQUEST, Context
from scheduler.spec.pods import GPU_LABELS, GPU_RESOURCE
from scheduler.spec.registry import PARSERS, find_parser, parse_object

from .patches import Patch, escape, resolve

API_VERSION = "admission.k8s.io/v1"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Job kinds placed as a whole: an object one of them controls (a JobSet's Jobs, a TrainJob's JobSet, a
# RayJob's RayCluster) whose pod templates carry the parent's decision id inherits that placement and is not
# placed again.
PLACED_KINDS = frozenset(kind for _, kind in PARSERS if kind != "Pod")
Webhook = Literal["mutate", "validate"]
IdFactory = Callable[[str], str]
MAX_WARNING_CHARS = 250
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/$")
# Roles of a multi-role job that never get the GPUs of a ``gpus: auto`` job.
_NOT_TRAINING_ROLES = ("launcher", "driver", "head", "coordinator", "scheduler", "ps")


class AdmissionSettings(BaseModel):
    """How the admission webhook decides and what it writes (all fields have safe defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    failure_mode: Literal["fail_open", "fail_closed"] = Field(
        "fail_open",
        description="On an internal error: fail_open allows the object with a warning, fail_closed denies it",
    )
    unreadable_job: Literal["allow", "deny"] = Field(
        "allow", description="A GPU job whose TrainingSpec cannot be read: allow it with a warning, or deny it"
    )
    objective: Literal["cheapest", "fastest", "cheapest-within-deadline"] = Field(
        "cheapest", description="Placement objective; cheapest-within-deadline uses the spec's deadline_seconds"
    )
    headroom_fraction: float | None = Field(
        None, ge=0, lt=1, description="GPU memory kept free; unset: the pools file's value, else 0.05"
    )
    annotation_prefix: str = Field(
        "vramfit.io/", description="Prefix of the annotations vramfit writes (a DNS subdomain and '/')"
    )
    kueue: bool = Field(
        False, description="Kueue integration: a job labelled kueue.x-k8s.io/queue-name gets only the "
        "kueue_flavor_label_key node label (Kueue adds the flavor's labels and tolerations); off: Kueue jobs are "
        "patched like any other",
    )
    kueue_flavor_label_key: str = Field(
        "vramfit.io/pool",
        description="Node label key of the Kueue ResourceFlavors that stand for the pools; with kueue, a job "
        "with kueue.x-k8s.io/queue-name gets this key in its nodeSelector",
    )
    trainjob_patch_field: Literal["runtimePatches", "podTemplateOverrides"] = Field(
        "runtimePatches",
        description="How a TrainJob's pods get node selection: runtimePatches (Trainer >= 2.1) or "
        "podTemplateOverrides (Trainer 2.0)",
    )
    trainjob_manager: str = Field(
        "vramfit.io/admission", min_length=1, description="The runtimePatches manager entry vramfit owns"
    )
    low_confidence_defaults: int = Field(
        4, ge=1, description="Warn of low confidence when at least this many TrainingSpec fields were defaulted"
    )
    tight_fit_fraction: float = Field(
        0.05, ge=0, lt=1, description="Warn of low confidence when the upper bound leaves less than this "
        "fraction of the usable GPU memory free"
    )

    @field_validator("kueue_flavor_label_key")
    @classmethod
    def _label_key(cls, value: str) -> str:
        """A Kubernetes label key (an optional DNS-subdomain prefix and '/', a name of at most 63 characters): the
        API server refuses a nodeSelector with any other, so every Kueue job would fail to be created."""
        prefix, _, name = value.rpartition("/")
        if not _LABEL_NAME.fullmatch(name) or (prefix and not _PREFIX.match(prefix + "/")):
            raise ValueError(f"must be a Kubernetes label key (e.g. vramfit.io/pool: letters, digits, '-', '_', '.', "
                             f"at most 63 characters after an optional DNS-subdomain prefix); got {value!r}")
        return value

    @field_validator("annotation_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not _PREFIX.match(value):
            raise ValueError(f"must be a DNS subdomain followed by '/', e.g. vramfit.io/; got {value!r}")
        return value


_LABEL_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


class MalformedReview(ValueError):
    """The body is not an AdmissionReview v1 request (the server answers HTTP 400)."""


@dataclass
class Admission:
    """The AdmissionReview response, and a record of the decision for the ledger (None: record
    nothing, e.g. for ``dryRun`` requests or objects that are not GPU jobs)."""

    response: dict[str, Any]
    record: dict[str, Any] | None = None
    outcome: str = "allowed"  # allowed | patched | denied | skipped | error: a small fixed set for metrics


def check_review(body: Any) -> dict[str, Any]:
    """The ``request`` of an AdmissionReview v1, or :class:`MalformedReview` saying what is wrong."""
    if not isinstance(body, dict):
        raise MalformedReview(f"body must be a JSON object (an AdmissionReview); got {type(body).__name__}")
    if body.get("kind") != "AdmissionReview":
        raise MalformedReview(f"kind must be AdmissionReview; got {body.get('kind')!r}")
    if body.get("apiVersion") != API_VERSION:
        raise MalformedReview(f"apiVersion must be {API_VERSION}; got {body.get('apiVersion')!r}")
    request = body.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("request must be an object")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise MalformedReview("request.uid must be a non-empty string")
    for key in ("object", "oldObject"):
        if request.get(key) is not None and not isinstance(request[key], dict):
            raise MalformedReview(f"request.{key} must be an object or null")
    return request


def stable_digest(material: str) -> str:
    """The default id factory: 16 hex digits of SHA-256."""
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def _names_no_local_file(spec: TrainingSpec) -> None:
    """A job in the cluster names no file on the webhook's host: a ``config_path`` would let whoever can create a Pod
    make the webhook read its files (``/dev/zero`` without end) and learn from the error which ones exist."""
    for name, ref in (("model", spec.model), ("teacher_model", spec.teacher_model),
                      ("critic_model", spec.critic_model)):
        if isinstance(ref, ModelRef) and ref.config_path is not None:
            raise SpecError.one(f"spec.{name}.config_path", "names a file on the webhook's host, which the admission "
                                "webhook does not read", "give the model's config inline (`config: {...}`), a catalog "
                                "name or a Hugging Face id")


def review(
    body: Any,
    settings: AdmissionSettings | None = None,
    pools: PoolsConfig | None = None,
    now: datetime | None = None,
    id_factory: IdFactory = stable_digest,
    webhook: Webhook = "mutate",
) -> dict[str, Any]:
    """AdmissionReview request -> AdmissionReview response (see the module docstring). Never raises."""
    return admit(body, settings, pools, now, id_factory, webhook).response


def admit(
    body: Any,
    settings: AdmissionSettings | None = None,
    pools: PoolsConfig | None = None,
    now: datetime | None = None,
    id_factory: IdFactory = stable_digest,
    webhook: Webhook = "mutate",
) -> Admission:
    """:func:`review` with the ledger record of the decision. Never raises."""
    settings = settings or AdmissionSettings()
    uid = ""
    try:
        request = body.get("request") if isinstance(body, dict) else None
        uid = request.get("uid") if isinstance(request, dict) and isinstance(request.get("uid"), str) else ""
        request = check_review(body)
        review_ = _Review(request, settings, pools or default_pools(), now or datetime.now(timezone.utc),
                          id_factory, webhook)
        return review_.run()
    except Exception as exc:  # the configured failure mode, never an exception out of admission
        text = f"vramfit {webhook} failed ({type(exc).__name__}: {exc})"
        if settings.failure_mode == "fail_closed":
            return Admission(_deny(uid, text, {"error": text[:MAX_WARNING_CHARS]}), outcome="error")
        return Admission(_allow(uid, warnings=[text + "; allowed (fail_open)"],
                                audit={"error": text[:MAX_WARNING_CHARS]}), outcome="error")


# ---- responses ------------------------------------------------------------------------------------


def _clip(text: str) -> str:
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 3] + "..."


def _response(uid: str, allowed: bool, **fields: Any) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    response.update({k: v for k, v in fields.items() if v})
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def _allow(uid: str, patch: Patch | None = None, warnings: Sequence[str] = (),
           audit: Mapping[str, str] | None = None) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "warnings": [_clip(w) for w in warnings],
        "auditAnnotations": {k: str(v) for k, v in (audit or {}).items()},
    }
    if patch is not None and patch.ops:
        fields.update(patchType="JSONPatch", patch=patch.encode())
    return _response(uid, True, **fields)


def _deny(uid: str, message: str, audit: Mapping[str, str] | None = None,
          warnings: Sequence[str] = ()) -> dict[str, Any]:
    status = {"code": 403, "reason": "Forbidden", "message": message}
    return _response(uid, False, status=status, warnings=[_clip(w) for w in warnings],
                     auditAnnotations={k: str(v) for k, v in (audit or {}).items()})


# ---- one review -----------------------------------------------------------------------------------


@dataclass
class _Template:
    """A GPU pod template to patch: its pod spec pointer, role name and pod count."""

    pointer: str
    role: str
    replicas: int


@dataclass
class _Review:
    request: dict[str, Any]
    settings: AdmissionSettings
    pools: PoolsConfig
    now: datetime
    id_factory: IdFactory
    webhook: Webhook
    warnings: list[str] = field(default_factory=list)
    audit: dict[str, str] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return str(self.request["uid"])

    def key(self, name: str) -> str:
        return f"{self.settings.annotation_prefix}{name}"

    def skip(self, reason: str, warn: bool = False) -> Admission:
        self.audit["skipped"] = reason
        return Admission(_allow(self.uid, warnings=[f"vramfit: {reason}"] if warn else (), audit=self.audit),
                         outcome="skipped")

    def run(self) -> Admission:
        op = self.request.get("operation")
        obj = self.request.get("object")
        if op != "CREATE":  # a job is placed once; an UPDATE could not change its pod templates anyway
            return self.skip(f"operation {op} is not reviewed (a job is placed once, when it is created)")
        if self.request.get("subResource"):
            return self.skip(f"subresource {self.request.get('subResource')} is not reviewed")
        if not isinstance(obj, dict):
            return self.skip("request has no object")
        if not isinstance(obj.get("metadata", {}), dict):  # no API server sends this; nothing can be patched into it
            return self.skip(f"object metadata is a {type(obj['metadata']).__name__}, not a mapping; not reviewed")
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        owner = _controller_owner(meta)
        if owner and obj.get("kind") == "Pod":
            return self.skip(f"pod created by {owner[0]} {owner[1]}; its job is placed, not each pod", warn=True)
        if obj.get("kind") == "Pod":
            annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
            if (self.key("decision-id") in annotations and self.key("pool") not in annotations
                    and self.key("outcome") not in annotations):
                return self.skip(f"pod of a job vramfit placed (decision {annotations[self.key('decision-id')]})",
                                 warn=True)
        placed_by = self.placed_parent(obj, owner)
        if placed_by:  # before parsing: a child the webhook cannot size (no model in it) is still its parent's
            return self.skip(placed_by)
        try:
            job = parse_object({"kind": "AdmissionReview", "request": {"object": obj}}, "admission", None)
            _names_no_local_file(job.spec)
        except NoTrainingJob as exc:
            if obj.get("kind") == "TrainJob" and "runtime" in exc.reason:  # said to the user, who expects placement
                return self.skip(f"{exc.ref}: its GPUs are set in its runtime, which the webhook cannot read, so the "
                                 f"TrainJob itself is not placed (the JobSet the Trainer builds from it is reviewed "
                                 f"on its own). Set gpus (and model) in {ANNOTATION} to place the TrainJob",
                                 warn=self.webhook == "validate")
            return self.skip(exc.reason)
        except SpecError as exc:
            return self.unreadable(obj, exc)
        if job.spec.gpus == "auto" and job.provenance.get("gpus") == NO_GPU_REQUEST:
            where = ("its GPUs are set in its runtime, which the webhook cannot read" if job.kind == "TrainJob"
                     else f"it requests no GPU and its {ANNOTATION} sets no gpus")
            return self.skip(f"{job.ref}: {where}; not placed. Set gpus in {ANNOTATION} (a count, or auto to let "
                             "vramfit choose and write it)", warn=self.webhook == "validate")
        try:  # a spec the predictor refuses (parallel sizes the model cannot take, ...) is unreadable, not a crash
            off_pool = self.unoffered_gpu(job)
            if off_pool is not None:
                return self.check_off_pool(job, off_pool)
            return self.decide(obj, job)
        except SpecError as exc:
            self.audit.pop("decision-id", None)
            return self.unreadable(obj, exc)

    def unreadable(self, obj: dict[str, Any], exc: SpecError) -> Admission:
        """A GPU job vramfit cannot size: ``unreadable_job`` says whether /validate denies it or warns."""
        problems = "; ".join(f"`{p.path}` {p.message}" if p.path else p.message for p in exc.problems)
        hint = next((p.hint for p in exc.problems if p.hint), "")
        text = f"vramfit cannot size {_describe(obj)}: {problems}" + (f". To fix: {hint}" if hint else "")
        self.audit["unreadable"] = _clip(text)
        if self.settings.unreadable_job == "deny" and self.webhook == "validate":
            return Admission(_deny(self.uid, text, self.audit), outcome="denied")
        warns = [text] if self.webhook == "validate" else []  # /validate says it; kubectl shows it once
        return Admission(_allow(self.uid, warnings=warns, audit=self.audit), outcome="allowed")

    def placed_parent(self, obj: Mapping[str, Any], owner: tuple[str, str] | None) -> str:
        """Why an object a job controller made (a JobSet's Jobs, a TrainJob's JobSet, a RayJob's RayCluster) is
        not placed again: a pod template in it carries the decision id vramfit wrote into its parent's. One whose
        parent vramfit did not place (a TrainJob whose GPUs live in its runtime) is placed itself."""
        if not owner or owner[0] not in PLACED_KINDS:
            return ""
        found = _template_decision_id(obj.get("spec"), self.key("decision-id"))
        if not found:
            return ""
        return f"{obj.get('kind')} created by {owner[0]} {owner[1]}, which vramfit placed (decision {found})"

    def decide(self, obj: dict[str, Any], job: ParsedJob) -> Admission:
        decision_id = self.decision_id(obj)
        self.audit["decision-id"] = decision_id
        templates = [_Template(t.pointer, t.role, t.replicas) for t in job.pod_templates]
        auto = job.spec.gpus == "auto"
        if auto and not templates:
            templates = _auto_templates(obj, job, self.warnings)
        kueue = self.settings.kueue and _kueue_queue(obj)
        user_selectors = [s for s in (_selector(obj, t.pointer) for t in templates) if s]
        recorded = self.recorded_pool(obj, decision_id)
        all_pools = list(self.pools.pools)
        candidates = [recorded] if recorded else [p for p in all_pools if self.compatible(p, user_selectors)]
        pinned = bool(job.pinned_gpu) or any(self.pins(s) for s in user_selectors)
        decision = self.place(job, candidates or all_pools)
        if decision.decision != "placed" and recorded:  # changed since it was placed there: place afresh
            recorded = None
            decision = self.place(job, [p for p in all_pools if self.compatible(p, user_selectors)] or all_pools)
        record = self.record(job, decision, decision_id)
        if decision.decision != "placed" or decision.chosen is None:
            self.audit["decision"] = "unschedulable"
            if self.webhook == "validate":
                return Admission(_deny(self.uid, self.no_fit_message(job, decision), self.audit), record,
                                 outcome="denied")
            # Only the id, so /validate (another request uid) records the same decision, not a second one;
            # /validate denies the job and says why.
            patch = Patch(obj)
            patch.annotations("/metadata", {self.key("decision-id"): decision_id, self.key("outcome"): "no-fit"})
            return Admission(_allow(self.uid, patch, self.warnings, self.audit), record)
        pool = decision.chosen.pool
        self.audit.update({"decision": "placed", "pool": pool.name})
        if self.webhook == "validate":
            self.soft_concerns(job, decision, pinned and not recorded)
            return Admission(_allow(self.uid, warnings=self.warnings, audit=self.audit), record)
        patch = Patch(obj)
        patch.annotations("/metadata", self.annotations(decision, decision_id))
        if job.kind == "TrainJob":
            self.patch_trainjob(patch, decision, decision_id, pinned, kueue)
        else:
            for t in templates:
                self.patch_template(patch, t, decision, decision_id, pinned, kueue)
        if auto:
            _gpu_counts(patch, job.kind, templates, decision, self.warnings,
                        job.spec.model_parallel())
        return Admission(_allow(self.uid, patch, self.warnings, self.audit), record,
                         outcome="patched" if patch.ops else "allowed")

    # -- decision id and the ledger record --

    def decision_id(self, obj: Mapping[str, Any]) -> str:
        """``<subject>-<digest>``: subject from namespace/(generateName or name), digest from the
        subject, the uid (the request uid at CREATE, before the object has one) and the spec. Reused
        as it is when the object already carries an id for the same subject (a re-review)."""
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        subject = f"{self.request.get('namespace') or meta.get('namespace') or ''}/" + str(
            meta.get("generateName") or meta.get("name") or self.request.get("name") or "")
        head = hashlib.sha256(subject.encode()).hexdigest()[:8]
        annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
        existing = annotations.get(self.key("decision-id"))
        if isinstance(existing, str) and existing.startswith(head + "-") and len(existing) <= 63:
            return existing
        training = annotations.get(ANNOTATION)  # the TrainingSpec annotation is part of the job's spec
        spec = json.dumps([obj.get("spec"), training], sort_keys=True, separators=(",", ":"), default=str)
        material = "\n".join([subject, str(meta.get("uid") or self.uid), hashlib.sha256(spec.encode()).hexdigest()])
        return f"{head}-{self.id_factory(material)}"

    def record(self, job: ParsedJob, decision: Decision, decision_id: str) -> dict[str, Any] | None:
        """The decision as the ledger stores it (``records.DecisionIn`` fields); None for dry runs."""
        if self.request.get("dryRun"):
            return None
        meta = (self.request.get("object") or {}).get("metadata") or {}
        generated = isinstance(meta, dict) and not meta.get("name") and bool(meta.get("generateName"))
        return decision_record(decision, job.spec, decision_id, self.now, job.kind,
                               job.namespace or str(self.request.get("namespace") or ""), job.name,
                               generated_name=generated)

    # -- placement --

    def unoffered_gpu(self, job: ParsedJob) -> str | None:
        """The catalog GPU the job pins (a node selector or the spec's ``gpu``) when no pool offers it."""
        if not job.spec.gpu:
            return None
        gpu = lookup_gpu(job.spec.gpu).name  # the spec's validator has checked it is a catalog GPU
        return None if any(p.gpu == gpu for p in self.pools.pools) else gpu

    def check_off_pool(self, job: ParsedJob, gpu: str) -> Admission:
        """A job pinned to a GPU type no pool offers: vramfit cannot place it, only check that it fits that GPU
        (the pin is respected). /validate denies it only when even the point prediction does not fit, and warns
        when the upper bound does not; nothing is patched or recorded."""
        if job.spec.gpus == "auto":  # vramfit would write the GPU count, but it cannot place this job anywhere
            if self.webhook != "validate":
                return Admission(_allow(self.uid, audit=self.audit), outcome="allowed")
            self.audit["decision"] = "unschedulable"
            offered = ", ".join(sorted({p.gpu for p in self.pools.pools}))
            text = (f"vramfit: {job.ref} asks vramfit to choose its GPU count (gpus: auto) on {gpu}, which no node "
                    f"pool offers, so no count can be written. To fix: request the GPUs in the job, or remove the "
                    f"{gpu} pin so vramfit places it on a pool ({offered})")
            return Admission(_deny(self.uid, text, self.audit), outcome="denied")
        total = job.spec.gpus
        per_node = min(total, 8)
        probe = NodePool(name="pinned", gpu=gpu, gpus_per_node=per_node, nodes=-(-total // per_node),
                         price_usd_per_gpu_hour=1.0,
                         price_source="not a vramfit pool: a fit check only")
        decision = self.place(job, [probe])
        self.audit["decision"] = "not-placed"
        c = decision.chosen
        if c is not None:
            self.audit["skipped"] = f"pins {gpu}, which no node pool offers"
            text = (f"vramfit: {job.ref} pins {gpu}, which no node pool offers: left as it is, not placed. It fits: "
                    f"upper bound {format_bytes(c.peak_vram_upper_bytes or 0)} per GPU of the {gpu}'s usable "
                    f"{format_bytes(c.usable_bytes or 0)} on {c.gpus} GPUs")
            warns = [*self.warnings, text] if self.webhook == "validate" else []
            return Admission(_allow(self.uid, warnings=warns, audit=self.audit), outcome="allowed")
        probed = decision.alternatives[0] if decision.alternatives else None
        if probed and probed.peak_vram_bytes and probed.peak_vram_bytes <= probed.usable_bytes:
            # Placement needs the upper bound to fit; a pin the user chose is only refused when even the
            # point prediction does not fit.
            self.audit["skipped"] = f"pins {gpu}, which no node pool offers"
            text = (f"vramfit: {job.ref} pins {gpu}, which no node pool offers: left as it is, not placed. Risk of "
                    f"OOM: predicted peak {format_bytes(probed.peak_vram_bytes)} per GPU fits the {gpu}'s usable "
                    f"{format_bytes(probed.usable_bytes)}, its upper bound "
                    f"{format_bytes(probed.peak_vram_upper_bytes or 0)} does not")
            warns = [*self.warnings, text] if self.webhook == "validate" else []
            return Admission(_allow(self.uid, warnings=warns, audit=self.audit), outcome="allowed")
        if self.webhook != "validate":
            return Admission(_allow(self.uid, audit=self.audit), outcome="allowed")
        self.audit["decision"] = "unschedulable"
        offered = ", ".join(sorted({p.gpu for p in self.pools.pools}))
        lines = [f"vramfit: {job.ref} pins {gpu}, which no node pool offers, and would not fit it "
                 f"({decision.headroom_fraction:.0%} headroom):"]
        if probed and probed.peak_vram_bytes:
            lines.append(f"  - predicted peak {format_bytes(probed.peak_vram_bytes)} per GPU on {probed.gpus} GPUs "
                         f"(upper bound {format_bytes(probed.peak_vram_upper_bytes or 0)}); the {gpu} has "
                         f"{format_bytes(probed.usable_bytes)} usable")
        else:
            lines += [f"  - {r.removeprefix('pinned: ')}" for r in decision.reasons]
        fix = f"To fix: remove the {gpu} pin, and vramfit places it on a pool ({offered})"
        if decision.suggestions:
            s = decision.suggestions[0]
            fix += (f"; or keep it and {s.change} (peak {format_bytes(s.peak_vram_bytes)} per GPU on {s.gpus} x "
                    f"{gpu})")
        lines.append(fix)
        return Admission(_deny(self.uid, "\n".join(lines), self.audit), outcome="denied")

    def place(self, job: ParsedJob, pools: Sequence[NodePool]) -> Decision:
        headroom = self.settings.headroom_fraction
        if headroom is None:
            headroom = self.pools.headroom_fraction
        objective = self.settings.objective
        if objective == "cheapest-within-deadline" and job.spec.deadline_seconds is None:
            self.warnings.append("vramfit: no deadline_seconds in the spec; placed by the cheapest objective")
            objective = "cheapest"
        return place(job.spec, pools, objective,
                     headroom_fraction=DEFAULT_HEADROOM_FRACTION if headroom is None else headroom,
                     pod_shapes=job.pod_shapes)

    def pool_labels(self, pool: NodePool) -> dict[str, str]:
        """Every node label that selects this pool: its nodeSelector and the Kueue flavor label."""
        key = self.settings.kueue_flavor_label_key
        return {**pool.node_selector, key: pool.node_selector.get(key, pool.name)}

    def pins(self, selector: Mapping[str, Any]) -> bool:
        keys = set(GPU_LABELS).union(*(self.pool_labels(p) for p in self.pools.pools))
        return any(k in keys for k in selector)

    def compatible(self, pool: NodePool, selectors: Sequence[Mapping[str, Any]]) -> bool:
        labels = self.pool_labels(pool)
        return all(str(s[k]) == v for s in selectors for k, v in labels.items() if k in s)

    def recorded_pool(self, obj: Mapping[str, Any], decision_id: str) -> NodePool | None:
        """The pool of an earlier decision with this id, so a re-review keeps it (idempotency)."""
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
        if annotations.get(self.key("decision-id")) != decision_id:
            return None
        name = annotations.get(self.key("pool"))
        return next((p for p in self.pools.pools if p.name == name), None)

    # -- mutation --

    def annotations(self, decision: Decision, decision_id: str) -> dict[str, str]:
        c = decision.chosen
        assert c is not None

        def number(value: float | None, digits: int) -> str:
            return "unknown" if value is None else f"{value:.{digits}f}"

        return {
            self.key("pool"): c.pool.name,
            self.key("predicted-peak-vram-bytes"): str(c.peak_vram_bytes),
            self.key("predicted-peak-vram-upper-bytes"): str(c.peak_vram_upper_bytes),
            self.key("predicted-runtime-seconds"): number(c.runtime_seconds, 0),
            self.key("predicted-cost-usd"): number(c.cost_usd, 2),
            self.key("model-version"): _model_version(decision),
            self.key("decision-id"): decision_id,
        }

    def node_selection(self, pool: NodePool, kueue: bool) -> tuple[dict[str, str], list[dict[str, Any]]]:
        if kueue:
            key = self.settings.kueue_flavor_label_key
            return {key: self.pool_labels(pool)[key]}, []
        return dict(pool.node_selector), [t.model_dump(exclude_none=True) for t in pool.tolerations]

    def patch_template(self, patch: Patch, t: _Template, decision: Decision, decision_id: str, pinned: bool,
                       kueue: bool) -> None:
        assert decision.chosen is not None
        if t.pointer != "/spec":  # a Pod's own metadata is the object's
            meta = t.pointer.removesuffix("/spec") + "/metadata"
            patch.annotations(meta, {self.key("decision-id"): decision_id})
        if pinned:
            return
        labels, tolerations = self.node_selection(decision.chosen.pool, kueue)
        for note in patch.node_selector(t.pointer, labels):
            self.warnings.append(f"vramfit: {note}")
        patch.tolerations(t.pointer, tolerations)

    def patch_trainjob(self, patch: Patch, decision: Decision, decision_id: str, pinned: bool,
                       kueue: bool) -> None:
        """A TrainJob has no pod template: the decision id (and, unless the job pins its GPU, node selection)
        goes to its trainer job ``node`` through ``spec.runtimePatches`` (an entry owned by ``trainjob_manager``)
        or ``spec.podTemplateOverrides`` (an entry carrying the decision-id annotation). Either way the JobSet
        the Trainer makes carries the id in its pod templates, so the webhook does not place it again."""
        assert decision.chosen is not None
        key = self.key("decision-id")
        annotations = {key: decision_id}
        pod_spec: dict[str, Any] = {}
        if not pinned:
            labels, tolerations = self.node_selection(decision.chosen.pool, kueue)
            pod_spec["nodeSelector"] = labels
            if tolerations:
                pod_spec["tolerations"] = tolerations
        if self.settings.trainjob_patch_field == "podTemplateOverrides":
            # PodTemplateOverride.metadata is merged into the runtime's pod template metadata (Trainer's
            # trainjob_types.go: "metadata overrides the Pod template metadata").
            field = "/spec/podTemplateOverrides"
            entry: dict[str, Any] = {"targetJobs": [{"name": "node"}], "metadata": {"annotations": annotations}}
            if pod_spec:
                entry["spec"] = pod_spec

            def mine(item: Any) -> bool:
                meta = item.get("metadata") if isinstance(item, dict) else None
                found = meta.get("annotations") if isinstance(meta, dict) else None
                return isinstance(found, dict) and key in found
        else:
            field = "/spec/runtimePatches"
            pod: dict[str, Any] = {"metadata": {"annotations": annotations}}
            if pod_spec:
                pod["spec"] = pod_spec
            job = {"name": "node", "template": {"spec": {"template": pod}}}
            entry = {"manager": self.settings.trainjob_manager,
                     "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}

            def mine(item: Any) -> bool:
                return isinstance(item, dict) and item.get("manager") == self.settings.trainjob_manager
        current = resolve(patch.doc, field)
        if pinned and isinstance(current, list) and any(mine(item) for item in current):
            return  # a re-review: our own entry's node selection reads as a pin; it stays as it is
        _append_once(patch, field, entry, mine)

    # -- validation --

    def no_fit_message(self, job: ParsedJob, decision: Decision) -> str:
        headroom = f"{decision.headroom_fraction:.0%} headroom"
        lines = [f"vramfit: {job.ref} fits no node pool (objective {decision.objective}, {headroom}):"]
        lines += [f"  - {r}" for r in decision.reasons]
        if decision.suggestions:
            s = decision.suggestions[0]
            cost = f", ${s.predicted_cost_usd:,.2f}" if s.predicted_cost_usd is not None else ""
            lines.append(f"To fix: {s.change} -> fits on {s.pool} ({s.gpus} x {s.gpu}), peak "
                         f"{format_bytes(s.peak_vram_bytes)} per GPU{cost}; set it in the job or in the "
                         f"vramfit.io/spec annotation")
        else:
            lines.append("To fix: no single change found; ask for a pool with larger GPUs")
        return "\n".join(lines)

    def soft_concerns(self, job: ParsedJob, decision: Decision, pinned: bool) -> None:
        c = decision.chosen
        assert c is not None
        self.warnings += [f"vramfit: {w}" for w in decision.warnings]
        if decision.waits_for_capacity:
            self.warnings.append(f"vramfit: pool {c.pool.name} has {c.pool.free_gpus} free GPUs now, the job "
                                 f"needs {c.gpus}; it waits for capacity")
        if job.assumptions:
            shown = "; ".join(job.assumptions[:3])
            more = f" (+{len(job.assumptions) - 3} more)" if len(job.assumptions) > 3 else ""
            self.warnings.append(f"vramfit assumed: {shown}{more}")
        defaults = sum("TrainingSpec default" in a for a in job.assumptions)
        if defaults >= self.settings.low_confidence_defaults:
            self.warnings.append(f"vramfit: low confidence: {defaults} fields defaulted; set them in the "
                                 f"vramfit.io/spec annotation")
        upper = c.peak_vram_upper_bytes or 0
        if c.usable_bytes and upper > c.usable_bytes * (1 - self.settings.tight_fit_fraction):
            self.warnings.append(f"vramfit: low confidence: upper bound {format_bytes(upper)} per GPU is within "
                                 f"{self.settings.tight_fit_fraction:.0%} of {c.pool.name}'s usable "
                                 f"{format_bytes(c.usable_bytes)}")
        if pinned:
            free = place(job.spec.model_copy(update={"gpu": None}), self.pools.pools, decision.objective,
                         headroom_fraction=decision.headroom_fraction, suggest=False).chosen
            if free is not None and free.pool.name != c.pool.name and _cheaper(free, c):
                self.warnings.append(f"vramfit: the job pins {c.pool.gpu} ({c.pool.name}); {free.pool.name} "
                                     f"({free.gpus} x {free.pool.gpu}) would fit for less "
                                     f"({_money(free.cost_usd, free.hourly_cost_usd)} vs "
                                     f"{_money(c.cost_usd, c.hourly_cost_usd)})")


# ---- helpers --------------------------------------------------------------------------------------


def _describe(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    return f"{obj.get('kind')} {meta.get('name') or meta.get('generateName') or ''}".strip()


def _controller_owner(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the object's controller ownerReference, if it has one."""
    owners = meta.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else []:
        if isinstance(owner, dict) and owner.get("controller") is True:
            return str(owner.get("kind", "?")), str(owner.get("name", "?"))
    return None


def _kueue_queue(obj: Mapping[str, Any]) -> bool:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    for key in ("labels", "annotations"):  # the label; older Kueue also read the annotation
        values = meta.get(key)
        if isinstance(values, dict) and values.get(KUEUE_QUEUE_LABEL):
            return True
    return False


def _selector(obj: Mapping[str, Any], pod_spec_ptr: str) -> dict[str, Any]:
    value = resolve(obj, f"{pod_spec_ptr}/nodeSelector")
    return value if isinstance(value, dict) else {}


@cache
def _package_version() -> str:
    try:
        return version("vramfit")
    except PackageNotFoundError:
        return "dev"


def decision_record(decision: Decision, spec: Any, decision_id: str, decided_at: datetime, kind: str | None,
                    namespace: str | None, name: str | None, generated_name: bool = False) -> dict[str, Any]:
    """A placement decision as the ledger stores it (``records.DecisionIn`` fields): what the webhook records,
    and what ``vramfit ray submit --ledger-url`` posts. ``generated_name``: ``name`` is the object's
    ``generateName`` (the API server completes the name after admission)."""
    d = decision.to_dict()
    # the chosen prediction's other levels and figures, so that `vramfit report` compares an allocated or reserved
    # actual with its own predicted level (like with like), as `vramfit evaluate` does
    pred = decision.chosen_prediction.to_dict() if decision.chosen_prediction is not None else {}
    predicted = {k: pred[k] for k in ("peak_allocated_bytes", "peak_reserved_bytes", "params_total",
                                      "params_trainable", "peak_phase", "model", "residual_correction_ratio",
                                      "throughput_tokens_per_second", "runtime_upper_seconds",
                                      "runtime_model_version") if pred.get(k) is not None}
    return {
        **predicted,
        "decision_id": decision_id,
        "decided_at": decided_at.isoformat(),
        "kind": kind,
        "namespace": namespace,
        "name": name,
        **({"generated_name": True} if generated_name else {}),
        "method": spec.method,
        "outcome": "placed" if d["decision"] == "placed" else "no_fit",
        "features": spec_to_dict(spec),
        **{k: d[k] for k in ("pool", "gpu", "gpus", "peak_vram_bytes", "peak_vram_upper_bytes",
                             "predicted_runtime_seconds", "predicted_cost_usd") if d.get(k) is not None},
        "model_version": _model_version(decision),
    }


def _model_version(decision: Decision) -> str:
    """The predictor's model version and the vramfit release, e.g. ``analytic-0.1.0``."""
    pred = decision.chosen_prediction
    return f"{pred.model_version if pred else 'analytic'}-{_package_version()}"


def _cheaper(a: Any, b: Any) -> bool:
    if a.cost_usd is not None and b.cost_usd is not None:
        return bool(a.cost_usd < b.cost_usd)
    return bool((a.hourly_cost_usd or 0) < (b.hourly_cost_usd or 0))


def _money(cost: float | None, hourly: float | None) -> str:
    return f"${cost:,.2f}" if cost is not None else f"${hourly or 0:,.2f}/h"


def _template_decision_id(spec: Any, key: str, depth: int = 0) -> str:
    """The decision id under ``key`` in the annotations of a pod template anywhere in a controller's spec
    (``template.metadata``, ``replicatedJobs[].template.spec.template.metadata``, ``workerGroupSpecs[]``...)."""
    if depth > 12:
        return ""
    if isinstance(spec, dict):
        template = spec.get("template")
        meta = template.get("metadata") if isinstance(template, dict) else None
        annotations = meta.get("annotations") if isinstance(meta, dict) else None
        found = annotations.get(key) if isinstance(annotations, dict) else None
        if isinstance(found, str) and found:
            return found
        children: Iterable[Any] = spec.values()
    elif isinstance(spec, list):
        children = spec
    else:
        return ""
    for child in children:
        found = _template_decision_id(child, key, depth + 1)
        if found:
            return found
    return ""


def _append_once(patch: Patch, list_ptr: str, entry: dict[str, Any], mine: Callable[[Any], bool]) -> None:
    """Put ``entry`` in the list at ``list_ptr``: replace the entry ``mine`` finds when it differs,
    else append it (creating the list)."""
    current = resolve(patch.doc, list_ptr)
    if not isinstance(current, list):
        patch.put(list_ptr, [entry])
        return
    for i, item in enumerate(current):
        if mine(item):
            patch.put(f"{list_ptr}/{i}", entry)
            return
    patch.append(list_ptr, entry)


def _auto_templates(obj: dict[str, Any], job: ParsedJob, warnings: list[str]) -> list[_Template]:
    """The pod templates that get the GPUs of a ``gpus: auto`` job whose pods request none.

    Pod, batch Job and TrainJob: their one role; PyTorchJob: every replica type; RayCluster/RayJob:
    the worker groups (the head when there are none); JobSet and Volcano Job: the one role that is
    not a launcher/driver. Anything else is ambiguous: annotated only, with a warning.
    """
    workload = find_parser(obj, "admission")(obj, Context(source="admission"))
    roles = [_Template(_ptr(r.path), r.name, r.replicas) for r in workload.roles]
    if job.kind in ("RayCluster", "RayJob"):
        workers = [t for t in roles if t.role != "head"]
        chosen = workers or roles
    elif job.kind == "PyTorchJob" or len(roles) <= 1:
        chosen = roles
    else:
        chosen = [t for t in roles if t.role.lower() not in _NOT_TRAINING_ROLES]
        if len(chosen) != 1:
            warnings.append(f"vramfit: gpus: auto but {job.ref} has {len(chosen)} candidate roles for the GPUs "
                            f"({', '.join(t.role for t in chosen)}); GPU count not set")
            return []
    return chosen


def _ptr(path: Sequence[str | int]) -> str:
    return "".join("/" + escape(str(p)) for p in path)


def _gpu_counts(patch: Patch, kind: str, templates: Sequence[_Template], decision: Decision,
                warnings: list[str], model_parallel: int = 1) -> None:
    """Set the GPU count of a ``gpus: auto`` job so that its total is the decision's.

    Rule: one pod per node, :func:`scheduler.placement.pod_shape`: the total when it fits a node, else each node's
    largest multiple of the model-parallel size (a whole node without model parallelism); placement's counts
    divide by it. Each GPU pod template's GPU container (the one
    that requests ``nvidia.com/gpu``, else the first) gets the per-pod count in ``limits`` (and in
    ``requests`` when it has one there). The pod count goes to: Job ``parallelism`` (and
    ``completions`` when set or > 1), JobSet replicated Job ``replicas``, PyTorchJob ``Worker``
    replicas (Master stays 1), RayCluster worker group ``replicas`` and ``minReplicas`` (and
    ``maxReplicas`` when below), Volcano task ``replicas``, TrainJob ``numNodes`` with
    ``resourcesPerNode``. A Pod holds one pod. When the kind cannot express it, a warning says so.
    """
    c = decision.chosen
    assert c is not None and c.gpus is not None
    pods, per_pod = pod_shape(c.gpus, c.pool.gpus_per_node, model_parallel)
    if not templates:
        return
    if kind == "TrainJob":
        patch.put("/spec/trainer/numNodes", pods)
        patch.put(f"/spec/trainer/resourcesPerNode/limits/{escape(GPU_RESOURCE)}", str(per_pod))
        return
    roles = {t.role for t in templates}
    if kind == "PyTorchJob":
        masters = 1 if "Master" in roles else 0
        if "Worker" not in roles and pods > masters:
            warnings.append(f"vramfit: gpus: auto needs {pods} pods but the PyTorchJob has no Worker; not set")
            return
        if "Worker" in roles:
            patch.put("/spec/pytorchReplicaSpecs/Worker/replicas", pods - masters)
    elif len(templates) != 1:
        warnings.append(f"vramfit: gpus: auto over {len(templates)} GPU roles is ambiguous; GPU count not set")
        return
    else:
        if not _set_pod_count(patch, kind, templates[0], pods, warnings):
            return
    for t in templates:
        _set_container_gpus(patch, t.pointer, per_pod, warnings)


def _set_pod_count(patch: Patch, kind: str, t: _Template, pods: int, warnings: list[str]) -> bool:
    ptr = t.pointer
    if kind == "Pod" or t.role == "head":
        if pods != 1:
            warnings.append(f"vramfit: gpus: auto needs {pods} pods; a {kind} {t.role} holds one; not set")
            return False
    elif kind == "Job":
        patch.put("/spec/parallelism", pods)
        if pods > 1 or resolve(patch.doc, "/spec/completions") is not None:
            patch.put("/spec/completions", pods)
    elif kind == "JobSet":
        job_ptr = ptr.removesuffix("/template/spec/template/spec")
        if (resolve(patch.doc, f"{job_ptr}/template/spec/parallelism") or 1) != 1:
            warnings.append("vramfit: gpus: auto with a JobSet Job parallelism > 1; GPU count not set")
            return False
        patch.put(f"{job_ptr}/replicas", pods)
    elif kind in ("RayCluster", "RayJob"):
        group = ptr.removesuffix("/template/spec")
        patch.put(f"{group}/replicas", pods)
        if resolve(patch.doc, f"{group}/minReplicas") is not None:
            patch.put(f"{group}/minReplicas", pods)
        top = resolve(patch.doc, f"{group}/maxReplicas")
        if isinstance(top, int) and top < pods:
            patch.put(f"{group}/maxReplicas", pods)
    else:  # Volcano task; a gang size above the new pod total would never start
        patch.put(f"{ptr.removesuffix('/template/spec')}/replicas", pods)
        tasks = resolve(patch.doc, "/spec/tasks") or []
        total = sum(t.get("replicas", 1) if isinstance(t.get("replicas", 1), int) else 1 for t in tasks)
        gang = resolve(patch.doc, "/spec/minAvailable")
        if isinstance(gang, int) and gang > total:
            patch.put("/spec/minAvailable", total)
    return True


def _set_container_gpus(patch: Patch, pod_ptr: str, per_pod: int, warnings: list[str]) -> None:
    containers = resolve(patch.doc, f"{pod_ptr}/containers")
    if not isinstance(containers, list) or not containers:
        return
    requesting = [i for i, ctr in enumerate(containers) if _gpu_request(ctr)]
    if len(requesting) > 1:
        warnings.append(f"vramfit: {len(requesting)} containers of {pod_ptr} request GPUs; count not set")
        return
    i = requesting[0] if requesting else 0
    base = f"{pod_ptr}/containers/{i}/resources"
    patch.put(f"{base}/limits/{escape(GPU_RESOURCE)}", str(per_pod))
    requests = resolve(patch.doc, f"{base}/requests")
    if isinstance(requests, dict) and GPU_RESOURCE in requests:
        patch.put(f"{base}/requests/{escape(GPU_RESOURCE)}", str(per_pod))


def _gpu_request(container: Any) -> bool:
    resources = container.get("resources") if isinstance(container, dict) else None
    if not isinstance(resources, dict):
        return False
    return any(isinstance(resources.get(s), dict) and GPU_RESOURCE in resources[s] for s in ("limits", "requests"))
