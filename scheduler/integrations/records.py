"""What the ledger stores: placement decisions, measured actuals, and the two joined.

The request schemas are strict (``extra="forbid"``): they are our own contract, posted by the webhook and
by the training-side reporter. A decision accepts every key of ``Prediction.to_dict()`` plus the placement
fields, so the webhook can post ``{**prediction.to_dict(), "pool": ..., ...}`` unchanged.

How an actual finds its decision: by ``decision_id`` when it has one, else by the job ``uid``, else by
``namespace``/``kind``/``name`` (the latest decision with that triple). The most specific identifier the
actual carries is the only one used, so an actual naming another decision never joins by name.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

ActualSource = Literal["reporter", "dcgm", "kubernetes", "manual"]
# Bounds on what a client may post, so that every stored record can be read, scored and exported again: a
# 400-digit integer was stored and then broke the metrics (float overflow) and `vramfit report`.
MAX_INT = 2**62  # bytes, parameter counts: 4 EiB, beyond any GPU or model
MAX_GPUS = 1_000_000
# A predicted cost above a trillion USD for one job is a broken client, not a prediction (1e308 was accepted and
# took the cost counter to +Inf).
MAX_JOB_COST_USD = 1e12
# Far above any real job, yet not so low that an odd but valid spec is refused: Llama-3.1-8B full fine-tuning on
# 15e12 tokens (Llama 3's pre-training corpus) on 8 H100s is predicted at 6 years, its upper bound at 11.
MAX_RUNTIME_SECONDS = 1000 * 365.25 * 86400.0
# A measured wall time is 0 (the Kubernetes watcher's whole seconds: a container that started and ended in one) or at
# least this: no training job runs for less than a millisecond, and 1e-320 s was stored and then made the report's
# runtime error infinite (`Infinity` in its JSON).
MIN_MEASURED_RUNTIME_SECONDS = 1e-3
# Bounds on the free-form parts of a record (``features``, ``notes``, the keys of ``breakdown_bytes``): a spec is a
# few levels deep and a few hundred values; features nested 400 levels could not be written, and 250 levels were
# written but could never be read back (pydantic's JSON reader stops at about 200), losing the job's actuals.
MAX_FREE_FORM_DEPTH = 32
MAX_FREE_FORM_VALUES = 10_000  # containers, keys and values of one field, all counted
MAX_FREE_FORM_STRING = 65_536  # characters of one string or key
# Validation context of records read back from the ledger: the bounds above only apply to what is posted now, so
# that a row stored before a bound existed can still be read.
STORED: dict[str, Any] = {"stored": True}


def _plausible_time(value: datetime) -> datetime:
    """A time that converts to UTC and lies in 2000-2200 (``0001-01-01T00:00:00+14:00`` was stored, and then
    every read of it failed: it has no UTC form)."""
    try:
        converted = value.astimezone(timezone.utc) if value.tzinfo else value
    except (OverflowError, ValueError):
        raise ValueError("is not a time that has a UTC form") from None
    if not 2000 <= converted.year <= 2200:
        raise ValueError(f"must be between the years 2000 and 2200; got {value.isoformat()}")
    return value


When = Annotated[datetime, AfterValidator(_plausible_time)]


def _segment(path: str, key: Any) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"


def _readable(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates) written as ``\\udXXX`` escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _string_problem(text: str, path: str, field: str, what: str) -> str | None:
    subject = "is" if path == field else f"has a {what} at `{_readable(path)}` that is"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"{subject} not valid Unicode: it holds a lone UTF-16 surrogate (U+{ord(text[exc.start]):04X}), "
                "which cannot be stored as UTF-8")
    if len(text) > MAX_FREE_FORM_STRING:
        return f"{subject} longer than {MAX_FREE_FORM_STRING} characters"
    return None


def free_form_problem(value: Any, field: str) -> str | None:
    """Why ``value``, posted as ``field``, cannot be stored and read back, or None: a string that is not valid
    Unicode (a lone UTF-16 surrogate, which JSON's ``\\ud800`` escape can carry and UTF-8 cannot), a number that is
    not finite inside a list or mapping (JSON has no NaN; it was stored as null), nesting deeper than
    :data:`MAX_FREE_FORM_DEPTH` levels, more than :data:`MAX_FREE_FORM_VALUES` values, or a string longer than
    :data:`MAX_FREE_FORM_STRING`. Messages name the path inside the field (``features.lora.rank``, ``notes[2]``)."""
    count = 0
    problem: str | None
    # (value, its path, its depth: the field's own list or mapping is level 1)
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    while stack:
        item, path, depth = stack.pop()
        count += 1
        if count > MAX_FREE_FORM_VALUES:
            return f"has more than {MAX_FREE_FORM_VALUES} values (keys, values and nested lists or mappings)"
        if isinstance(item, str):
            problem = _string_problem(item, path, field, "string")
        elif isinstance(item, float) and not math.isfinite(item) and path != field:  # a field's own: its type's
            problem = f"has a number that is not finite at `{_readable(path)}` ({item}); only finite numbers are stored"
        elif isinstance(item, (dict, list, tuple)):
            if depth + 1 > MAX_FREE_FORM_DEPTH:
                return f"is nested deeper than {MAX_FREE_FORM_DEPTH} levels"
            children = item.items() if isinstance(item, dict) else enumerate(item)
            problem = None
            nested: list[tuple[Any, str, int]] = []
            for key, child in children:
                if isinstance(item, dict):
                    count += 1  # the key
                    if isinstance(key, str) and (problem := _string_problem(key, _segment(path, key), field, "key")):
                        break
                nested.append((child, _segment(path, key), depth + 1))
            stack.extend(reversed(nested))  # the first problem in the order the body gives them is the one named
        else:
            problem = None
        if problem:
            return problem
    return None


def _bounded(high: float, unit: str, high_note: str = "") -> AfterValidator:
    """Bounds on a posted value (not on one read back with the :data:`STORED` context)."""

    def check(value: float, info: ValidationInfo) -> float:
        if (info.context or {}).get("stored"):
            return value
        if value > high:
            raise ValueError(f"must be at most {high:g} {unit}{high_note}; got {value:g}")
        return value

    return AfterValidator(check)


def _measured_runtime(value: float, info: ValidationInfo) -> float:
    """0, or at least :data:`MIN_MEASURED_RUNTIME_SECONDS` (for a posted value)."""
    if (info.context or {}).get("stored") or value == 0 or value >= MIN_MEASURED_RUNTIME_SECONDS:
        return value
    raise ValueError(f"must be 0 (a job that started and ended within one whole second, as Kubernetes times it) or "
                     f"at least {MIN_MEASURED_RUNTIME_SECONDS:g} seconds (1 ms): no training job is shorter, and a "
                     f"shorter wall time would make its runtime error infinite; got {value:g}")


# No lower bound on a prediction: a spec of `train_tokens: 1` is validly predicted at a few microseconds (the metrics
# leave out a measured/predicted ratio too large to be a prediction's error, see scheduler/integrations/metrics.py).
PredictedRuntime = Annotated[float, Field(ge=0), _bounded(MAX_RUNTIME_SECONDS, "seconds", high_note=" (1000 years)")]
MeasuredRuntime = Annotated[float, Field(ge=0), _bounded(MAX_RUNTIME_SECONDS, "seconds", high_note=" (1000 years)"),
                            AfterValidator(_measured_runtime)]
CostUsd = Annotated[float, Field(ge=0), _bounded(MAX_JOB_COST_USD, "USD")]
Outcome = Literal["placed", "no_fit", "fail_open", "error"]

# When several sources report the same job, scalar facts come from the first source in this order that has
# them; peaks take the largest reading (every sampler can only miss the true peak, never exceed it).
SOURCE_PRIORITY: tuple[str, ...] = ("manual", "reporter", "kubernetes", "dcgm")


def storable(value: Any, info: ValidationInfo) -> Any:
    """Every posted field, before its type is checked: :func:`free_form_problem` (not for records read back)."""
    if (info.context or {}).get("stored") or info.field_name is None:
        return value
    problem = free_form_problem(value, info.field_name)
    if problem:
        raise ValueError(problem)
    return value


def storable_keys(data: Any, info: ValidationInfo) -> Any:
    """A posted body's own keys, before anything else: one that is not valid Unicode names no field, and pydantic
    would only say that some string is not one."""
    if isinstance(data, dict) and not (info.context or {}).get("stored"):
        for key in data:
            if isinstance(key, str) and (problem := _string_problem(key, f"(body).{key}", "(body)", "key")):
                raise ValueError(problem)
    return data


class _Posted(BaseModel):
    """A record a client posts: every field, and the body's own keys, must be storable and readable again."""

    @model_validator(mode="before")
    @classmethod
    def _storable_keys(cls, data: Any, info: ValidationInfo) -> Any:
        return storable_keys(data, info)

    @field_validator("*", mode="before")
    @classmethod
    def _storable(cls, value: Any, info: ValidationInfo) -> Any:
        return storable(value, info)


class DecisionIn(_Posted):
    """A placement decision as the webhook (or any caller of ``POST /v1/decisions``) records it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    decision_id: str | None = Field(None, min_length=1, max_length=253,
                                    description="Id the webhook wrote into the job's annotations; defaults to uid")
    uid: str | None = Field(None, min_length=1, max_length=253, description="Kubernetes metadata.uid of the job")
    namespace: str | None = Field(None, max_length=253, description="Namespace of the job")
    name: str | None = Field(None, max_length=253, description="metadata.name of the job")
    generated_name: bool = Field(False, description="name is the job's metadata.generateName: the API server "
                                 "named it that and 5 random characters, after admission")
    kind: str | None = Field(None, max_length=63, description="Job kind: Job, Pod, PyTorchJob, RayJob, ...")
    method: str | None = Field(None, max_length=32, description="Training method (full, lora, qlora)")
    outcome: Outcome = Field("placed", description="placed | no_fit | fail_open | error")
    pool: str | None = Field(None, max_length=253, description="Chosen node pool; none when nothing fits")
    spec_hash: str | None = Field(None, max_length=128, description="Hash of the features; computed if absent")
    features: dict[str, Any] = Field(default_factory=dict,
                                     description="The TrainingSpec in its contract JSON form (spec_to_dict)")
    decided_at: When | None = Field(None, description="When the decision was made; now if absent")

    # The keys of predictors.predict.Prediction.to_dict().
    peak_allocated_bytes: int | None = Field(None, ge=0, le=MAX_INT, description="Predicted torch max_memory_allocated")
    peak_reserved_bytes: int | None = Field(None, ge=0, le=MAX_INT, description="Predicted torch max_memory_reserved")
    peak_vram_bytes: int | None = Field(None, ge=0, le=MAX_INT, description="Predicted device peak (as NVML sees it)")
    peak_vram_upper_bytes: int | None = Field(None, ge=0, le=MAX_INT, description="Upper bound used for placement")
    breakdown_bytes: dict[str, Annotated[int, Field(ge=0, le=MAX_INT)]] | None = Field(
        None, description="Components of the predicted peak")
    params_total: int | None = Field(None, ge=0, le=MAX_INT, description="Parameters of the model")
    params_trainable: int | None = Field(None, ge=0, le=MAX_INT, description="Trainable parameters")
    gpus: int | None = Field(None, gt=0, le=MAX_GPUS, description="GPUs of the job as placed")
    peak_phase: str | None = Field(None, max_length=64, description="Phase of the predicted peak")
    model: str | None = Field(None, max_length=253, description="Model label")
    model_version: str | None = Field(None, max_length=128, description="Predictor version")
    residual_correction_ratio: float | None = Field(None, gt=0, description="Residual model's correction factor")
    gpu: str | None = Field(None, max_length=64, description="GPU type of the chosen pool")
    throughput_tokens_per_second: float | None = Field(None, gt=0, description="Predicted throughput")
    runtime_seconds: PredictedRuntime | None = Field(None, description="Predicted runtime (Prediction.to_dict name)")
    throughput_lower_tokens_per_second: float | None = Field(
        None, gt=0, description="Throughput the job reaches with the runtime bound's coverage")
    runtime_upper_seconds: PredictedRuntime | None = Field(None,
                                                           description="Calibrated upper bound of runtime_seconds")
    runtime_correction_ratio: float | None = Field(None, gt=0, description="Runtime residual's throughput factor")
    runtime_model_version: str | None = Field(None, max_length=128, description="Runtime predictor version")
    notes: list[str] | None = Field(None, description="Predictor notes")

    # Placement fields.
    predicted_runtime_seconds: PredictedRuntime | None = Field(None, description="Predicted runtime on the pool")
    predicted_cost_usd: CostUsd | None = Field(None, description="Predicted cost of the job on the pool")

    @model_validator(mode="after")
    def _identified(self) -> DecisionIn:
        if self.decision_id is None and self.uid is None:
            raise ValueError("needs `decision_id` or `uid` to identify the decision")
        return self

    @property
    def key(self) -> str:
        return self.decision_id or self.uid or ""

    @property
    def runtime_prediction_seconds(self) -> float | None:
        return self.predicted_runtime_seconds if self.predicted_runtime_seconds is not None else self.runtime_seconds


class ActualIn(_Posted):
    """What a job really used. ``peak_vram_bytes`` and ``runtime_seconds`` must be present (null when the
    source cannot know them: the Kubernetes watcher sees no memory, DCGM sees no exit)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    decision_id: str | None = Field(None, min_length=1, max_length=253, description="Decision this belongs to")
    uid: str | None = Field(None, min_length=1, max_length=253, description="Job uid, instead of decision_id")
    namespace: str | None = Field(None, max_length=253, description="Job namespace, with name and kind")
    name: str | None = Field(None, max_length=253, description="Job name, with namespace and kind")
    kind: str | None = Field(None, max_length=63, description="Job kind, with namespace and name")
    peak_vram_bytes: int | None = Field(..., ge=0, le=MAX_INT,
                                        description="Device peak of the most loaded GPU (NVML/DCGM)")
    peak_reserved_bytes: int | None = Field(None, ge=0, le=MAX_INT, description="torch.cuda.max_memory_reserved")
    peak_allocated_bytes: int | None = Field(None, ge=0, le=MAX_INT, description="torch.cuda.max_memory_allocated")
    # 0 is valid: the Kubernetes watcher's times are whole seconds, and a container can start and end in one.
    runtime_seconds: MeasuredRuntime | None = Field(..., description="Wall time of the training")
    oom: bool = Field(..., description="The job ran out of GPU memory")
    exit_reason: str | None = Field(None, max_length=128, description="Completed, Error, OOMKilled, CudaOOM, ...")
    exit_code: int | None = Field(None, ge=-(2**31), le=2**32,
                                  description="Exit code of the failing container, when known")
    gpu: str | None = Field(None, max_length=64, description="GPU type it ran on, when known")
    finished_at: When | None = Field(None, description="When the job finished")
    source: ActualSource = Field(..., description="reporter | dcgm | kubernetes | manual")

    @model_validator(mode="after")
    def _identified(self) -> ActualIn:
        if self.decision_id is None and self.uid is None:
            missing = [f for f in ("namespace", "name", "kind") if getattr(self, f) is None]
            if missing:
                raise ValueError("needs `decision_id`, `uid`, or all of `namespace`, `name` and `kind`; "
                                 f"missing {', '.join(missing)}")
        return self

    @model_validator(mode="after")
    def _a_peak_a_gpu_can_have(self) -> ActualIn:
        """A device peak above the named GPU's memory measured no training step: refused with the field named (the
        residual model learned such peaks as they were). One below any CUDA context is stored, and left out of
        training by the export (ledger.plausible_peak)."""
        peak = self.peak_vram_bytes
        if peak is None:
            return self
        if self.gpu:
            from predictors.errors import SpecError
            from predictors.hardware import gpu_catalog, lookup_gpu

            # a bare family name ("V100", "A100") may be any of its cards: the largest one's memory is the limit
            family = [g.memory_bytes for g in gpu_catalog().values() if g.name.lower().startswith(self.gpu.lower())]
            try:
                memory = max([*family, lookup_gpu(self.gpu).memory_bytes])
            except SpecError:
                if not family:
                    return self
                memory = max(family)
            if peak > memory * 1.02:
                raise ValueError(f"peak_vram_bytes {peak:,} is more than the {self.gpu}'s {memory:,} bytes: no device "
                                 "peak of that GPU (the peak of one GPU, in bytes)")
        return self

    @property
    def job_ref(self) -> str:
        """The identifier this actual is stored (and made idempotent) under."""
        if self.decision_id is not None:
            return f"id:{self.decision_id}"
        if self.uid is not None:
            return f"uid:{self.uid}"
        return f"name:{self.namespace}/{self.kind}/{self.name}"


@dataclass(frozen=True)
class StoredDecision:
    decision: DecisionIn
    spec_hash: str
    decided_at: datetime
    recorded_at: datetime

    @property
    def decision_id(self) -> str:
        return self.decision.key

    def to_dict(self) -> dict[str, Any]:
        out = self.decision.model_dump(mode="json", exclude_none=True)
        out["decision_id"] = self.decision_id
        out["spec_hash"] = self.spec_hash
        out["decided_at"] = iso(self.decided_at)
        out["recorded_at"] = iso(self.recorded_at)
        return out

    def matches(self, actual: ActualIn) -> bool:
        d = self.decision
        if actual.decision_id is not None:
            return actual.decision_id == self.decision_id
        if actual.uid is not None:
            return actual.uid == d.uid
        return (actual.namespace, actual.kind, actual.name) == (d.namespace, d.kind, d.name)


@dataclass(frozen=True)
class StoredActual:
    actual: ActualIn
    received_at: datetime

    def to_dict(self) -> dict[str, Any]:
        out = self.actual.model_dump(mode="json", exclude_none=True)
        out["received_at"] = iso(self.received_at)
        return out


# Exit reasons of a job that ran to its end (the reporter and the Kubernetes watcher both say ``Completed``);
# ``None``: the source does not say. An OOM or any other failure ends the job early.
FINISHED_EXIT_REASONS: tuple[str | None, ...] = (None, "Completed")


def ran_to_end(oom: bool, exit_reason: str | None, runtime_seconds: float | None) -> bool:
    """Whether a job did all its work, so that its runtime is the runtime of the whole job (what the runtime
    prediction is compared with): a runtime of at least :data:`MIN_MEASURED_RUNTIME_SECONDS` (a shorter one can only
    have been stored before that bound), no OOM, and an exit reason of ``Completed`` (or none given)."""
    return (not oom and exit_reason in FINISHED_EXIT_REASONS and runtime_seconds is not None
            and runtime_seconds >= MIN_MEASURED_RUNTIME_SECONDS)


@dataclass(frozen=True)
class MergedActual:
    """The actuals of one job from all its sources, merged (see ``SOURCE_PRIORITY``)."""

    peak_vram_bytes: int | None
    peak_reserved_bytes: int | None
    peak_allocated_bytes: int | None
    runtime_seconds: float | None
    oom: bool
    exit_reason: str | None
    sources: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None} | {"sources": list(self.sources)}

    @property
    def ran_to_end(self) -> bool:
        """Whether the job did all its work (:func:`ran_to_end`)."""
        return ran_to_end(self.oom, self.exit_reason, self.runtime_seconds)


@dataclass(frozen=True)
class JoinedRow:
    decision: StoredDecision
    actuals: tuple[StoredActual, ...]

    @property
    def merged(self) -> MergedActual | None:
        return merge_actuals([a.actual for a in self.actuals]) if self.actuals else None

    def to_dict(self) -> dict[str, Any]:
        merged = self.merged
        return {"decision": self.decision.to_dict(), "actual": merged.to_dict() if merged else None}


def merge_actuals(actuals: list[ActualIn]) -> MergedActual:
    ordered = sorted(actuals, key=lambda a: SOURCE_PRIORITY.index(a.source))

    def peak(field: str) -> int | None:
        values = [getattr(a, field) for a in ordered if getattr(a, field) is not None]
        return max(values) if values else None

    def first(field: str) -> Any:
        return next((getattr(a, field) for a in ordered if getattr(a, field) is not None), None)

    return MergedActual(
        peak_vram_bytes=peak("peak_vram_bytes"),
        peak_reserved_bytes=peak("peak_reserved_bytes"),
        peak_allocated_bytes=peak("peak_allocated_bytes"),
        runtime_seconds=first("runtime_seconds"),
        oom=any(a.oom for a in ordered),
        exit_reason=first("exit_reason"),
        sources=tuple(a.source for a in ordered),
    )


def merge_same_source(old: ActualIn, new: ActualIn) -> ActualIn:
    """A repeated report from one source: newer non-null values win, but peaks keep the largest reading (each
    rank or node of a job reports its own GPU: the job's peak is the most loaded one), OOM sticks once seen, the
    exit reason is that of the report that ended last (a watch's re-list re-sends every finished pod, in no
    particular order; a retried pod that succeeds after a failed one ends later), a failure where both ended at
    the same moment, and the runtime and the end are the latest of the reports (the job lasts until its last pod
    ends)."""
    merged = old.model_dump() | {k: v for k, v in new.model_dump().items() if v is not None}
    for peak in ("peak_vram_bytes", "peak_reserved_bytes", "peak_allocated_bytes"):
        readings = [v for v in (getattr(old, peak), getattr(new, peak)) if v is not None]
        merged[peak] = max(readings) if readings else None
    merged["oom"] = old.oom or new.oom
    if _ends_later(old, new):  # the pod that ended last tells how the job ended, not the event delivered last
        merged["exit_reason"], merged["exit_code"] = old.exit_reason, old.exit_code
    for latest in ("runtime_seconds", "finished_at"):
        values = [v for v in (getattr(old, latest), getattr(new, latest)) if v is not None]
        merged[latest] = max(values, key=lambda v: utc(v) if isinstance(v, datetime) else v) if values else None
    # `old` was read back from the ledger, maybe from before a bound existed; `new` has been checked already
    return ActualIn.model_validate(merged, context=STORED)


def _ends_later(old: ActualIn, new: ActualIn) -> bool:
    """Whether ``old`` tells how the job ended rather than ``new``: it ended later, or at the same moment with a
    failure where ``new`` says it finished. Without both ends, the newer report does."""
    if old.finished_at is None or new.finished_at is None or old.exit_reason is None:
        return False
    ended, ends = utc(old.finished_at), utc(new.finished_at)
    return ended > ends or (ended == ends and old.exit_reason not in FINISHED_EXIT_REASONS
                            and new.exit_reason in FINISHED_EXIT_REASONS)


def spec_hash(features: dict[str, Any]) -> str:
    """A stable hash of the features: SHA-256 of their canonical JSON, first 16 hex digits."""
    canonical = json.dumps(features, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def utc(value: datetime | None) -> datetime:
    if value is None:
        return datetime.now(timezone.utc)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def iso(value: datetime) -> str:
    return utc(value).isoformat()
