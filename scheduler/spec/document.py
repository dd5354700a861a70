"""Turn a file (YAML/JSON, possibly multi-document) into parsed jobs, each holding a TrainingSpec.

Every document of a file has one of three outcomes (:func:`scan_jobs_text`): a :class:`ParsedJob`, a
:class:`NoTrainingJob` (a valid object that trains nothing: a ConfigMap, a GPU-free JobSet), or a
:class:`~predictors.errors.SpecError`. :func:`read_jobs` keeps the jobs, raises every error at once,
and raises :class:`NoTrainingJob` (a ``SpecError`` subclass, so callers that only know ``SpecError``
still print a clean message) when the file holds no training job at all.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from predictors.errors import FieldProblem, SpecError
from predictors.spec import TrainingSpec, parse_training_spec
from scheduler.spec.yamltext import YAML_ERRORS, safe_load_all, yaml_error_hint, yaml_error_text

T = TypeVar("T")


@dataclass(frozen=True)
class PodTemplateRef:
    """One pod template of a job whose pods get GPUs: where it is, and how many pods and GPUs.

    ``pointer`` is the RFC 6901 JSON pointer of the template's pod ``spec`` inside the object
    (``/spec/template/spec`` for a batch Job, ``/spec`` for a Pod), ready for a JSON Patch. For a
    TrainJob whose GPUs are set in ``spec.trainer.resourcesPerNode`` it is ``/spec/trainer``: its pods
    are built by the Trainer from the runtime, so node selectors go through ``spec.runtimePatches``.
    """

    pointer: str
    role: str
    replicas: int
    gpus_per_pod: int


@dataclass
class ParsedJob:
    """A TrainingSpec found in an input, with where each field came from and what was assumed."""

    spec: TrainingSpec
    kind: str = "TrainingSpec"
    name: str = ""
    namespace: str = ""
    provenance: dict[str, str] = field(default_factory=dict)  # field -> source ("spec", "flag --bf16", ...)
    assumptions: list[str] = field(default_factory=list)
    base_dir: Path | None = None
    pod_templates: list[PodTemplateRef] = field(default_factory=list)
    pinned_gpu: str | None = None  # catalog GPU a nodeSelector/affinity of the job already pins
    annotations: dict[str, str] = field(default_factory=dict)
    document: int = 0  # position of its YAML document in the file (0-based)

    @property
    def ref(self) -> str:
        who = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {who}".strip()

    @property
    def label(self) -> str:
        """How output names the job: its object (``PyTorchJob team/ft``), or a plain TrainingSpec by its document
        in the file (``TrainingSpec [1]``), as error messages do."""
        return self.ref if self.kind != "TrainingSpec" else f"TrainingSpec [{self.document}]"

    @property
    def pod_shapes(self) -> tuple[tuple[int, int], ...] | None:
        """(GPUs per pod, pods) of each GPU pod template, when the pods' shape is fixed (a manifest, not
        ``gpus: auto``, whose count vramfit writes): placement then needs nodes that hold those pods."""
        if not isinstance(self.spec.gpus, int):
            return None
        shapes = tuple((t.gpus_per_pod, t.replicas) for t in self.pod_templates if t.gpus_per_pod > 0 and t.replicas)
        return shapes or None


class NoTrainingJob(SpecError):
    """A valid object that trains nothing (no GPU requested, not a workload): not an input error.

    ``vramfit parse`` reports it with its reason; :func:`read_jobs` raises it only when a file holds
    no training job at all. It subclasses :class:`SpecError` so that a caller that only handles
    ``SpecError`` still shows a clean message; test ``isinstance(exc, NoTrainingJob)`` first to tell
    the two apart.
    """

    def __init__(self, ref: str, reason: str, source: str = "") -> None:
        self.ref = ref
        self.reason = reason
        super().__init__([FieldProblem("", f"{ref}: {reason}")], source=source)

    def render(self) -> str:
        where = f" in {self.source}" if self.source else ""
        lines = [p.message for p in self.problems]
        if len(lines) == 1:
            return f"no training job found{where}: {lines[0]}"
        return "\n".join([f"no training job found{where}:", *(f"  - {line}" for line in lines)])


Outcome = ParsedJob | NoTrainingJob | SpecError


def not_a_mapping(doc: Any, path: str, source: str) -> SpecError:
    """The error for a YAML document that is a list or a scalar where a spec or an object must be."""
    return SpecError.one(path, f"must be a mapping (a TrainingSpec or a job manifest); got {type(doc).__name__}",
                         "each YAML document is one spec or object", source)


def load_documents(text: str, source: str) -> list[Any]:
    """All YAML documents of a text (JSON is YAML), empty ones dropped; a clear error when broken."""
    try:
        docs = [d for d in safe_load_all(text) if d is not None]
    except YAML_ERRORS as exc:
        raise SpecError.one("", yaml_error_text(exc), yaml_error_hint(exc), source) from None
    if not docs:
        raise SpecError.one("", "is empty", "write a TrainingSpec or a job manifest", source)
    return docs


def is_training_spec(doc: Any) -> bool:
    """A plain TrainingSpec document: no ``kind`` (or kind TrainingSpec) and not a Ray Jobs submission."""
    if not isinstance(doc, dict) or doc.get("kind", "TrainingSpec") != "TrainingSpec":
        return False
    if "model" in doc or "kind" in doc:
        return True
    return "entrypoint" not in doc and doc.get("apiVersion", "vramfit/v1") == "vramfit/v1"


def parse_document(
    doc: Any, source: str, base_dir: Path | None, index: int = 0, context: Sequence[Any] = ()
) -> list[ParsedJob]:
    """Parse one document. Plain TrainingSpecs are handled here; job kinds by the registry.

    ``context`` holds the file's other documents (ConfigMaps, training runtimes) that a job may refer to.
    """
    if is_training_spec(doc):
        prefix = "spec" if index == 0 else f"[{index}]"
        spec = parse_training_spec(doc, source=source, prefix=prefix)
        return [ParsedJob(spec=spec, provenance=dict.fromkeys(doc, "spec"), base_dir=base_dir, document=index)]
    from scheduler.spec.registry import parse_object  # job kinds (Kubernetes, Ray)

    return [parse_object(doc, source=source, base_dir=base_dir, context=context)]


def scan_documents(
    docs: Sequence[Any], source: str, base_dir: Path | None, extra_context: Sequence[Any] = ()
) -> list[Outcome]:
    """The outcome of every document: a job, a reported non-training object, or an error."""
    context = [*docs, *extra_context]
    outcomes: list[Outcome] = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict) and len(docs) > 1:  # say which document of the file
            outcomes.append(not_a_mapping(doc, f"[{i}]", source))
            continue
        try:
            outcomes.extend(parse_document(doc, source, base_dir, i, context))
        except SpecError as exc:  # NoTrainingJob included
            outcomes.append(exc)
    return outcomes


def scan_jobs_text(
    text: str, source: str = "<input>", base_dir: Path | None = None, extra_context: Sequence[Any] = ()
) -> list[Outcome]:
    return scan_documents(load_documents(text, source), source, base_dir, extra_context)


def jobs_from_outcomes(outcomes: Sequence[Outcome], source: str) -> list[ParsedJob]:
    """The training jobs; every error at once as one SpecError; NoTrainingJob when there are no jobs."""
    errors = [o for o in outcomes if isinstance(o, SpecError) and not isinstance(o, NoTrainingJob)]
    if errors:
        raise combine_errors(errors, source)
    jobs = [o for o in outcomes if isinstance(o, ParsedJob)]
    if not jobs:
        skipped = [o for o in outcomes if isinstance(o, NoTrainingJob)]
        exc = NoTrainingJob(skipped[0].ref, skipped[0].reason, source)
        exc.problems = [p for s in skipped for p in s.problems]
        raise exc
    return jobs


def combine_errors(errors: Sequence[SpecError], source: str) -> SpecError:
    """One SpecError holding every problem; each keeps the object it was found in."""
    if len(errors) == 1:
        return errors[0]
    problems = []
    for err in errors:
        where = err.source.removeprefix(source).strip(" :")
        for p in err.problems:
            problems.append(FieldProblem(p.path, f"{p.message} (in {where})" if where else p.message, p.hint))
    return SpecError(problems, source=source)


def answer_each(jobs: Sequence[ParsedJob], source: str, answer: Callable[[ParsedJob], T]) -> list[T]:
    """``answer(job)`` for every job of a file, or every job's SpecError at once, each naming its job (kind and
    name, or ``[i]``, the document of a plain TrainingSpec in a multi-document file): nothing is answered before
    every job is known to be answerable."""
    results: list[T] = []
    errors: list[SpecError] = []
    for job in jobs:
        try:
            results.append(answer(job))
        except SpecError as exc:
            if job.kind != "TrainingSpec":
                where = f"{source}: {job.ref}"
            else:
                where = f"{source} [{job.document}]" if len(jobs) > 1 else source
            errors.append(SpecError(exc.problems, source=where))
    if errors:
        raise combine_errors(errors, source)
    return results


def read_jobs_text(text: str, source: str = "<input>", base_dir: Path | None = None,
                   extra_context: Sequence[Any] = ()) -> list[ParsedJob]:
    return jobs_from_outcomes(scan_jobs_text(text, source, base_dir, extra_context), source)


def read_text(path: str | Path) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError.one("", f"file not found: {p}", "check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError.one("", f"cannot read {p}: {exc}") from None


def read_jobs(path: str | Path, runtimes: Sequence[str | Path] = ()) -> list[ParsedJob]:
    """Read every training job from a file: TrainingSpec YAML/JSON or supported job manifests.

    Objects that train nothing (ConfigMaps next to a RayJob, a CPU-only Job) are skipped; a file with
    no training job at all raises :class:`NoTrainingJob` with the reason for each object. ``-`` reads standard
    input (relative config paths then resolve against the working directory). ``runtimes``: files holding the
    (Cluster)TrainingRuntimes a TrainJob references (installed cluster-wide, not in the job's file).
    """
    extra: list[Any] = []
    for runtime in runtimes:
        extra += load_documents(read_text(runtime), str(runtime))
    if str(path) == "-":  # a spec piped in: `kubectl get job x -o yaml | vramfit place -`
        try:
            text = sys.stdin.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError.one("", f"cannot read standard input: {exc}") from None
        return read_jobs_text(text, source="<stdin>", base_dir=Path.cwd(), extra_context=extra)
    p = Path(path)
    return read_jobs_text(read_text(p), source=str(p), base_dir=p.parent, extra_context=extra)
