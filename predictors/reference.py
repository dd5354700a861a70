"""Reference runs (measured peak VRAM / throughput) and how to compare predictions with them.

The schema is the one of ``shared/reference/README.md``; rows are validated with pydantic so that a
broken file is reported with its line number and field.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from predictors.errors import FieldProblem, SpecError
from predictors.spec import TrainingSpec, problems_from_validation

Metric = Literal["allocated", "active", "reserved", "nvml", "unknown"]

# Which predicted level a measured metric is compared with (issue 2: like with like).
LEVEL_FOR_METRIC: dict[str, str] = {
    "allocated": "peak_allocated_bytes",
    "active": "peak_allocated_bytes",
    "reserved": "peak_reserved_bytes",
    "unknown": "peak_reserved_bytes",
    "nvml": "peak_vram_bytes",
}


class Measured(BaseModel):
    model_config = ConfigDict(extra="allow")

    # at most 2^62 bytes (4 EiB, the ledger's bound too): beyond it a figure is a typo, and past float's range it
    # overflowed every ratio the evaluation takes
    peak_bytes: int | None = Field(None, ge=0, le=2**62)
    metric: Metric = "unknown"
    scope: Literal["per_gpu", "total_all_gpus"] = "per_gpu"
    oom: bool = False
    unit_uncertain: bool = False
    tokens_per_second: float | None = Field(None, gt=0)
    tokens_per_second_scope: Literal["per_gpu", "per_job"] | None = None


class ReferenceRun(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    source_id: str = "unknown"
    source_url: str | None = None
    quality: Literal["high", "medium", "low"] = "medium"
    spec: TrainingSpec
    gpu: str = "unknown"
    measured: Measured
    unknowns: list[str] = Field(default_factory=list)
    notes: str = ""

    @property
    def source(self) -> str:
        return self.source_id.split("_", 1)[0]


# Extra levels a row may carry beside its primary metric (``vramfit calibrate`` rows record all three).
EXTRA_LEVEL_FIELDS: dict[str, str] = {"reserved": "peak_reserved_bytes", "nvml": "peak_nvml_bytes"}


def with_extra_levels(runs: list[ReferenceRun]) -> list[ReferenceRun]:
    """``runs`` plus one run per extra measured level (``measured.peak_reserved_bytes`` -> metric ``reserved``,
    ``measured.peak_nvml_bytes`` -> ``nvml``), id suffixed with the metric, so that one evaluation compares each
    predicted level with its own measurement. OOM rows and rows whose primary metric is that level add nothing."""
    out: list[ReferenceRun] = []
    for run in runs:
        out.append(run)
        if run.measured.oom:
            continue
        extra = run.measured.model_extra or {}
        for metric, field in EXTRA_LEVEL_FIELDS.items():
            value = extra.get(field)
            if metric == run.measured.metric or not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                continue
            measured = run.measured.model_copy(update={"peak_bytes": value, "metric": metric})
            out.append(run.model_copy(update={"id": f"{run.id}-{metric}", "measured": measured}))
    return out


def parse_runs(text: str, source: str = "<runs>") -> list[ReferenceRun]:
    """Parse JSONL reference runs; every bad line is reported with its line number."""
    runs, problems = parse_runs_with_problems(text)
    if problems:
        raise SpecError(problems, source=source)
    return runs


def parse_runs_with_problems(text: str) -> tuple[list[ReferenceRun], list[FieldProblem]]:
    """The valid runs of a JSONL text and the problems of every other line (each named by its line number)."""
    runs: list[ReferenceRun] = []
    problems: list[FieldProblem] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw: Any = json.loads(line)
        except ValueError as exc:  # JSONDecodeError, and an integer of more than 4,300 digits
            problems.append(FieldProblem(f"line {lineno}", f"is not valid JSON: {getattr(exc, 'msg', exc)}"))
            continue
        except RecursionError:
            problems.append(FieldProblem(f"line {lineno}", "is not valid JSON: nested too deeply"))
            continue
        if not isinstance(raw, dict):
            problems.append(FieldProblem(f"line {lineno}", f"must be a JSON object (one reference run); got "
                                         f"{type(raw).__name__}"))
            continue
        try:
            runs.append(ReferenceRun.model_validate(raw))
        except ValidationError as exc:
            problems += [FieldProblem(f"line {lineno}: {p.path}", p.message, p.hint)
                         for p in problems_from_validation(exc, prefix="")]
    return runs, problems
