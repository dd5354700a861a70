"""Save and load fitted residual models: skops (no pickle), with a version stamp and what it was trained on.

This is the only file I/O in ``predictors``. A model file holds ``{"metadata": {...}, "model": estimator}``;
a JSON copy of the metadata sits beside it (``<name>.json``) for humans and CI diffs.

Beside it, ``<name>.serving.npz`` holds what applying the model takes (its fitted arrays and numbers,
:func:`predictors.residual_serving.serving_state`, in numpy's ``.npy`` format, read without pickle) plus the
metadata and the SHA-256 of the skops file it was written with. :func:`load_model` uses it when that hash
matches, so predicting, placing and serving do not import scikit-learn and skops (1-4 s of start-up); a
missing, damaged or stale one (the skops file was replaced) falls back to the skops file.

Loading trusts exactly the types in :data:`TRUSTED_TYPES`; anything else in a file is refused. A model is
*incompatible* when its format version, feature layout or analytic fingerprint differ from this code's:
the residual was learned on top of analytic numbers that are no longer the ones computed, so applying it
would correct the wrong thing. :func:`load_default_model` then warns and returns ``None`` (analytic only).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import warnings
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from predictors.architecture import Architecture
    from predictors.hardware import GpuSpec
    from predictors.spec import TrainingSpec

FORMAT_VERSION = 1
DEFAULT_MODEL_FILE = "residual-default.skops"
DEFAULT_RUNTIME_MODEL_FILE = "runtime-residual-default.skops"
RUNTIME_MODEL_KIND = "runtime-residual"

# Types beyond skops' own trusted defaults (builtins, numpy, most of scikit-learn) that a residual model
# file may contain; skops refuses any other. Kept explicit: a new type here is a reviewed change, not
# something a file can ask for.
TRUSTED_TYPES: tuple[str, ...] = (
    "predictors.residual.ResidualVramRegressor",
    "predictors.runtime_residual.ResidualRuntimeRegressor",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    "sklearn.utils.validation.check_array",
    "functools.partial",
)


class IncompatibleModel(Exception):
    """A model file that cannot be used with this code (the message says why and how to rebuild)."""


REBUILD_HINT = "rebuild it with `python -m predictors.residual_build` (see README, 'Residual model')"
RUNTIME_REBUILD_HINT = ("rebuild it with `python -m predictors.residual_build --runtime` "
                        "(see README, 'Runtime residual')")


@dataclass(frozen=True)
class LoadedModel:
    model: Any  # a fitted ResidualVramRegressor / ResidualRuntimeRegressor, or its Served*Model (residual_serving)
    metadata: dict[str, Any]

    @property
    def version(self) -> str:
        return str(self.metadata.get("model_version", "residual"))


def sha256_of_texts(texts: Iterable[str]) -> str:
    """SHA-256 over training files' contents, in the order given (a byte-exact data fingerprint)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(hashlib.sha256(text.encode("utf-8")).digest())
    return digest.hexdigest()


def analytic_fingerprint() -> str:
    """SHA-256 of the analytic breakdowns of a few fixed specs: changes whenever the analytic constants do."""
    from predictors.vram import predict_vram

    specs = [
        {"model": "llama-3.1-8b", "method": "lora", "precision": "bf16-true", "micro_batch_size": 2,
         "seq_len": 2048, "gpus": 1},
        {"model": "llama-3.1-8b", "method": "qlora", "precision": "bf16-mixed", "micro_batch_size": 4,
         "seq_len": 1024, "gradient_checkpointing": "full", "gpus": 1},
        {"model": "mistral-7b-v0.1", "method": "full", "precision": "bf16-mixed", "micro_batch_size": 1,
         "seq_len": 4096, "gpus": 8, "sharding": "fsdp", "gradient_checkpointing": "selective"},
        {"model": "qwen2.5-1.5b", "method": "full", "precision": "bf16-mixed", "micro_batch_size": 8,
         "seq_len": 512, "gpus": 4, "sharding": "zero2", "optimizer": "adamw-8bit"},
        {"model": "bert-large-uncased", "task": "seq-classification", "precision": "16-mixed",
         "micro_batch_size": 8, "seq_len": 512, "gpus": 1, "attention": "eager"},
    ]
    def row(spec: TrainingSpec, architecture: Architecture, gpu: GpuSpec) -> dict[str, Any]:
        vram = predict_vram(spec, architecture, gpu)
        return {**vram.breakdown_bytes, "_allocated": vram.peak_allocated_bytes,
                "_reserved": vram.peak_reserved_bytes, "_phase": vram.peak_phase}

    return _fingerprint(specs, ("A100-80GB", "V100-32GB"), row)


def _fingerprint(specs: Iterable[dict[str, Any]], gpus: Iterable[str],
                 row: Callable[[TrainingSpec, Architecture, GpuSpec], dict[str, Any]]) -> str:
    """SHA-256 of ``row`` for every spec on every GPU, in order."""
    from predictors.catalog import resolve_model
    from predictors.hardware import lookup_gpu
    from predictors.spec import TrainingSpec

    rows = []
    for raw in specs:
        spec = TrainingSpec.model_validate(raw)
        resolved = resolve_model(spec)
        rows += [row(spec, resolved.architecture, lookup_gpu(gpu)) for gpu in gpus]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def build_metadata(**extra: Any) -> dict[str, Any]:
    """Metadata every model file carries, plus ``extra`` (training-data hash, evaluation figures...)."""
    import sklearn

    from predictors.features import FEATURE_NAMES, feature_schema_sha256

    return {
        "format_version": FORMAT_VERSION,
        "sklearn_version": sklearn.__version__,
        "feature_names": list(FEATURE_NAMES),
        "feature_schema_sha256": feature_schema_sha256(),
        "analytic_fingerprint": analytic_fingerprint(),
        **extra,
    }


def save_model(model: Any, path: Path, metadata: dict[str, Any]) -> None:
    """Write ``model`` with ``metadata`` to ``path`` (skops), the metadata to ``path`` with ``.json``, and the
    serving file :func:`serving_path` (removed where the model has no array form)."""
    import skops.io as sio

    from predictors.residual_serving import serving_state

    if path.is_dir():  # checked before writing `<path>.tmp` beside the folder
        raise IsADirectoryError(f"{path} is a folder, not a model file")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # replaced in one step: a server re-loading it never reads half a file
    sio.dump({"metadata": metadata, "model": model}, tmp)
    _make_reproducible(tmp)
    tmp.replace(path)
    path.with_suffix(".json").write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    state = serving_state(model)
    serving = serving_path(path)
    if state is None:
        serving.unlink(missing_ok=True)
        return
    params, arrays = state
    header = {"params": params, "metadata": metadata, "model_sha256": _file_sha256(path)}
    write_serving(serving, header, arrays)


def _make_reproducible(path: Path) -> None:
    """Rewrite the skops file ``path`` so that the same model always gives the same bytes. skops names each object
    (``__id__``) and each array file after the object's Python ``id()``, and stamps the zip members with the time:
    here the ids and the files are numbered in the order the schema lists them (references to one object keep one
    number) and the members get :data:`_ZIP_EPOCH`. Loading reads the same schema and arrays."""
    with zipfile.ZipFile(path) as archive:
        schema = json.loads(archive.read("schema.json"))
        arrays = {name: archive.read(name) for name in archive.namelist() if name != "schema.json"}
    ids: dict[int, int] = {}
    files: dict[str, str] = {}

    def renumber(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "__id__" and isinstance(value, int) and not isinstance(value, bool):
                    node[key] = ids.setdefault(value, len(ids) + 1)
                elif key == "file" and isinstance(value, str) and value in arrays:
                    node[key] = files.setdefault(value, f"{len(files) + 1}.npy")
                else:
                    renumber(value)
        elif isinstance(node, list):
            for value in node:
                renumber(value)

    renumber(schema)
    for name in sorted(arrays):  # an array the schema does not name (none today) keeps a place too
        files.setdefault(name, f"{len(files) + 1}.npy")
    rewritten = path.with_name(path.name + ".renumbered")
    with zipfile.ZipFile(rewritten, "w", compression=zipfile.ZIP_STORED) as archive:
        for old_name, new_name in sorted(files.items(), key=lambda item: int(item[1].split(".")[0])):
            archive.writestr(zipfile.ZipInfo(new_name, _ZIP_EPOCH), arrays[old_name])
        archive.writestr(zipfile.ZipInfo("schema.json", _ZIP_EPOCH), json.dumps(schema, indent=2))
    rewritten.replace(path)


def serving_path(path: Path) -> Path:
    """Where the serving file of the model file ``path`` is: ``<stem>.serving.npz`` beside it."""
    return path.with_name(f"{path.stem}.serving.npz")


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def serving_file_is_current(path: Path) -> bool | None:
    """Whether the serving file beside the model file ``path`` was written for it (its header names the model
    file's SHA-256); ``None`` when there is no serving file, or no readable one."""
    serving = serving_path(path)
    if not serving.exists():
        return None
    try:
        header, _ = read_serving(serving)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None
    return header.get("model_sha256") == _file_sha256(path)


_SERVING_HEADER = "header.json"
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same model gives the same bytes


def write_serving(path: Path, header: dict[str, Any], arrays: dict[str, Any]) -> None:
    """A zip of ``header.json`` and one ``<name>.npy`` per array (numpy's format, no pickled objects), with
    fixed member times so that rebuilding a model reproduces the file byte for byte."""
    import numpy as np

    tmp = path.with_name(path.name + ".tmp")
    def member_info(name: str) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, _ZIP_EPOCH)
        info.compress_type = zipfile.ZIP_DEFLATED
        return info

    with zipfile.ZipFile(tmp, "w") as archive:
        archive.writestr(member_info(_SERVING_HEADER), json.dumps(header, sort_keys=True))
        for name in sorted(arrays):
            with archive.open(member_info(f"{name}.npy"), "w") as member:
                np.lib.format.write_array(member, np.asarray(arrays[name]), allow_pickle=False)
    tmp.replace(path)


def read_serving(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(header, arrays)`` of a file :func:`write_serving` wrote; ``ValueError`` (or ``OSError``) if it is not
    one (arrays of Python objects are refused, not unpickled)."""
    import numpy as np

    arrays: dict[str, Any] = {}
    with zipfile.ZipFile(path) as archive:
        header = json.loads(archive.read(_SERVING_HEADER))
        for name in archive.namelist():
            if name.endswith(".npy"):
                with archive.open(name) as member:
                    arrays[name[: -len(".npy")]] = np.lib.format.read_array(member, allow_pickle=False)
    if not isinstance(header, dict):
        raise ValueError(f"{_SERVING_HEADER} is not an object")
    return header, arrays


def _load_served(path: Path) -> LoadedModel | None:
    """The model of ``path`` from its serving file, or ``None`` where there is none usable (missing, damaged, or
    written with another version of the skops file): the caller then reads the skops file."""
    from predictors.residual_serving import served_model

    serving = serving_path(path)
    if not serving.is_file():
        return None
    try:
        header, arrays = read_serving(serving)
        if header.get("model_sha256") != _file_sha256(path):
            return None
        model = served_model(header["params"], arrays)
        metadata = header["metadata"]
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, RecursionError):
        return None
    if not isinstance(metadata, dict):
        return None
    return LoadedModel(model=model, metadata=dict(metadata))


def check_compatible(metadata: dict[str, Any]) -> None:
    """Raise :class:`IncompatibleModel` unless ``metadata`` matches this code's layout and analytic model."""
    from predictors.features import feature_schema_sha256

    if metadata.get("format_version") != FORMAT_VERSION:
        raise IncompatibleModel(f"format version {metadata.get('format_version')!r}, this code reads "
                                f"{FORMAT_VERSION}; {REBUILD_HINT}")
    if metadata.get("feature_schema_sha256") != feature_schema_sha256():
        raise IncompatibleModel(f"its features differ from this code's; {REBUILD_HINT}")
    if metadata.get("analytic_fingerprint") != analytic_fingerprint():
        raise IncompatibleModel(f"it was trained on a different version of the analytic model; {REBUILD_HINT}")


def load_model(path: Path, check: Callable[[dict[str, Any]], None] = check_compatible,
               serving: bool = True) -> LoadedModel:
    """Load a model file, trusting only :data:`TRUSTED_TYPES`; raise :class:`IncompatibleModel` if unusable
    (``check``: the compatibility test of the metadata, :func:`check_compatible` for the VRAM residual).

    With ``serving`` (default) the model comes from its serving file where that is usable (no scikit-learn
    import); ``serving=False`` always reads the skops file (the fitted estimator itself, e.g. to refit it)."""
    served = _load_served(path) if serving and path.is_file() else None
    if served is not None:
        check(served.metadata)
        _check_model(served.model, served.metadata, path)
        return served
    try:
        import skops.io as sio
    except ImportError as exc:  # pragma: no cover - skops is a dependency
        raise IncompatibleModel(f"skops is not installed ({exc})") from None
    try:
        untrusted = set(sio.get_untrusted_types(file=path)) - set(TRUSTED_TYPES)
        if untrusted:
            raise IncompatibleModel(f"{path} holds types this code does not trust: {sorted(untrusted)}")
        payload = sio.load(path, trusted=list(TRUSTED_TYPES))
    except IncompatibleModel:
        raise
    except Exception as exc:  # a damaged file, or one from another scikit-learn
        raise IncompatibleModel(f"cannot read {path}: {type(exc).__name__}: {exc}; see the rebuild commands in "
                                "README, 'Residual model'") from None
    if (not isinstance(payload, dict) or "model" not in payload or not isinstance(payload.get("metadata"), dict)):
        raise IncompatibleModel(f"{path} is not a vramfit residual model file")
    check(payload["metadata"])
    _check_model(payload["model"], payload["metadata"], path)
    return LoadedModel(model=payload["model"], metadata=dict(payload["metadata"]))


def _check_model(model: Any, metadata: dict[str, Any], path: Path) -> None:
    """The payload is the fitted residual its metadata says (a file can hold any trusted type: a bare
    scikit-learn regressor, an unfitted residual), so that predictions never meet a model they cannot use."""
    from predictors.residual_serving import RuntimeServing, VramServing

    runtime = metadata.get("model_kind") == RUNTIME_MODEL_KIND
    expected: type = RuntimeServing if runtime else VramServing
    hint = RUNTIME_REBUILD_HINT if runtime else REBUILD_HINT
    if not isinstance(model, expected):
        raise IncompatibleModel(f"{path} holds a {type(model).__name__}, not a {expected.__name__}; {hint}")
    try:
        model._require_fitted()
    except (ValueError, AttributeError) as exc:  # NotFittedModel, or scikit-learn's NotFittedError
        raise IncompatibleModel(f"{path}: {exc}; {hint}") from None


# Where predict, place and serve load the residual models from instead of the shipped ones (say, the model that
# `vramfit train --ledger` fitted on this cluster's actuals): a path, read at the first load of the process.
MODEL_ENV = "VRAMFIT_RESIDUAL_MODEL"
RUNTIME_MODEL_ENV = "VRAMFIT_RUNTIME_RESIDUAL_MODEL"


def _configured_path(variable: str) -> Path | None:
    value = os.environ.get(variable, "").strip()
    return Path(value).expanduser() if value else None


def shipped_model_path() -> Path:
    """The residual model inside the package (what ``python -m predictors.residual_build`` rebuilds)."""
    return Path(str(resources.files("predictors") / "data" / DEFAULT_MODEL_FILE))


def default_model_path() -> Path:
    """The residual model predict, place and serve load: ``$VRAMFIT_RESIDUAL_MODEL`` if set, else the shipped
    one."""
    return _configured_path(MODEL_ENV) or shipped_model_path()


class DefaultModel:
    """A default model, loaded once at the first call (thread-safe) and kept: calling it returns it, or ``None``
    (analytic only, warned once) when it is missing or incompatible. ``install`` puts a model that was loaded and
    checked elsewhere in its place in one step (``vramfit serve`` re-loading a changed file: no moment without
    a model); ``cache_clear`` forgets it, so the next call loads again; ``cache_info().currsize`` is 1 once
    loaded (the names ``functools.cache`` gives, which this replaced)."""

    def __init__(self, load: Callable[[], LoadedModel | None]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._loaded: tuple[LoadedModel | None] | None = None
        functools.update_wrapper(self, load)

    def __call__(self) -> LoadedModel | None:
        loaded = self._loaded
        if loaded is None:
            with self._lock:
                if self._loaded is None:
                    self._loaded = (self._load(),)
                loaded = self._loaded
        return loaded[0]

    def install(self, model: LoadedModel) -> None:
        with self._lock:  # after a first load still running in another thread, not overwritten by it
            self._loaded = (model,)

    def cache_clear(self) -> None:
        with self._lock:
            self._loaded = None

    def cache_info(self) -> CacheInfo:
        return CacheInfo(currsize=0 if self._loaded is None else 1)


@dataclass(frozen=True)
class CacheInfo:
    currsize: int


def _load_default_vram() -> LoadedModel | None:
    """The residual model (:func:`default_model_path`); ``None`` with a warning when missing or incompatible."""
    return _load_default(default_model_path(), check_compatible, "residual model", REBUILD_HINT)


load_default_model = DefaultModel(_load_default_vram)


def configured_model_problems() -> list[str]:
    """The residual models ``$VRAMFIT_RESIDUAL_MODEL`` / ``$VRAMFIT_RUNTIME_RESIDUAL_MODEL`` name that are not in use
    (missing, unreadable or trained on another analytic model: predictions fall back to the analytic model), one
    line each. An unset variable is no problem (the shipped model, or the analytic model without it)."""
    problems: list[str] = []
    for variable, loader in ((MODEL_ENV, load_default_model), (RUNTIME_MODEL_ENV, load_default_runtime_model)):
        path = _configured_path(variable)
        if path is not None and loader() is None:
            problems.append(f"${variable} names {path}, which is missing or not a usable model, so predictions use "
                            "the analytic model alone (the server's log says why); point it at a model file or "
                            "unset it")
    return problems


def _load_default(path: Path, check: Callable[[dict[str, Any]], None], what: str, hint: str) -> LoadedModel | None:
    if not path.exists():
        configured = {_configured_path(MODEL_ENV): MODEL_ENV, _configured_path(RUNTIME_MODEL_ENV): RUNTIME_MODEL_ENV}
        if path in configured:
            hint = f"it is what ${configured[path]} names: point it at a model file or unset it"
        warnings.warn(f"{what} {path} is missing: predictions are analytic only; {hint}",
                      RuntimeWarning, stacklevel=4)
        return None
    try:
        return load_model(path, check)
    except IncompatibleModel as exc:
        warnings.warn(f"{what} not used, predictions are analytic only: {exc}", RuntimeWarning, stacklevel=4)
        return None


# ---- the runtime residual (predictors.runtime_residual) -----------------------------------------------
# Specs whose analytic runtime components fingerprint the runtime model: one per code path (LoRA, QLoRA
# dequantization, FSDP and ZeRO communication, tensor and pipeline parallelism, CPU offload, fp32).
_RUNTIME_FINGERPRINT_SPECS: tuple[dict[str, Any], ...] = (
    {"model": "llama-3.1-8b", "method": "lora", "micro_batch_size": 2, "seq_len": 2048, "gpus": 1,
     "steps": 100},
    {"model": "llama-3.1-8b", "method": "qlora", "micro_batch_size": 4, "seq_len": 1024,
     "gradient_checkpointing": "full", "gpus": 1, "train_tokens": 1.0e8},
    {"model": "llama-3.1-70b", "method": "full", "precision": "bf16-mixed", "micro_batch_size": 1, "seq_len": 8192,
     "gpus": 64, "sharding": "fsdp", "tensor_parallel": 8, "pipeline_parallel": 2,
     "gradient_checkpointing": "selective"},
    {"model": "mistral-7b-v0.1", "method": "full", "micro_batch_size": 2, "seq_len": 2048, "gpus": 4,
     "sharding": "zero2", "offload": "optimizer"},
    {"model": "bert-large-uncased", "task": "seq-classification", "precision": "32-true", "micro_batch_size": 8,
     "seq_len": 512, "gpus": 1, "attention": "eager"},
)
_RUNTIME_FINGERPRINT_GPUS: tuple[str, ...] = ("V100-32GB", "T4", "A100-80GB", "RTX-4090", "H100-80GB", "B200")


def runtime_analytic_fingerprint() -> str:
    """SHA-256 of the analytic runtime components of a few fixed specs on one GPU per family: changes
    whenever the runtime model or its efficiency table does (not when the VRAM model does)."""
    from predictors.runtime import predict_runtime

    def row(spec: TrainingSpec, architecture: Architecture, gpu: GpuSpec) -> dict[str, Any]:
        runtime = predict_runtime(spec, architecture, gpu)
        return {**runtime.components_seconds, "_tokens_per_second": runtime.tokens_per_second,
                "_flops_per_token": runtime.flops_per_token, "_efficiency": runtime.matmul_efficiency}

    return _fingerprint(_RUNTIME_FINGERPRINT_SPECS, _RUNTIME_FINGERPRINT_GPUS, row)


def build_runtime_metadata(**extra: Any) -> dict[str, Any]:
    """Metadata every runtime residual file carries, plus ``extra`` (training-data hash, evaluation...)."""
    import sklearn

    from predictors.runtime_features import RUNTIME_FEATURE_NAMES, runtime_feature_schema_sha256

    return {
        "model_kind": RUNTIME_MODEL_KIND,
        "format_version": FORMAT_VERSION,
        "sklearn_version": sklearn.__version__,
        "feature_names": list(RUNTIME_FEATURE_NAMES),
        "feature_schema_sha256": runtime_feature_schema_sha256(),
        "analytic_fingerprint": runtime_analytic_fingerprint(),
        **extra,
    }


def check_runtime_compatible(metadata: dict[str, Any]) -> None:
    """Raise :class:`IncompatibleModel` unless ``metadata`` is a runtime residual of this code's layout
    and analytic runtime model."""
    from predictors.runtime_features import runtime_feature_schema_sha256

    if metadata.get("model_kind") != RUNTIME_MODEL_KIND:
        raise IncompatibleModel(f"it is not a runtime residual model (kind {metadata.get('model_kind')!r}); "
                                f"{RUNTIME_REBUILD_HINT}")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise IncompatibleModel(f"format version {metadata.get('format_version')!r}, this code reads "
                                f"{FORMAT_VERSION}; {RUNTIME_REBUILD_HINT}")
    if metadata.get("feature_schema_sha256") != runtime_feature_schema_sha256():
        raise IncompatibleModel(f"its features differ from this code's; {RUNTIME_REBUILD_HINT}")
    if metadata.get("analytic_fingerprint") != runtime_analytic_fingerprint():
        raise IncompatibleModel("it was trained on a different version of the analytic runtime model; "
                                f"{RUNTIME_REBUILD_HINT}")


def shipped_runtime_model_path() -> Path:
    """The runtime residual inside the package (``python -m predictors.residual_build --runtime``)."""
    return Path(str(resources.files("predictors") / "data" / DEFAULT_RUNTIME_MODEL_FILE))


def default_runtime_model_path() -> Path:
    """The runtime residual predict, place and serve load: ``$VRAMFIT_RUNTIME_RESIDUAL_MODEL`` if set, else the
    shipped one."""
    return _configured_path(RUNTIME_MODEL_ENV) or shipped_runtime_model_path()


def _load_default_runtime() -> LoadedModel | None:
    """The runtime residual (:func:`default_runtime_model_path`); ``None`` with a warning when missing or
    incompatible."""
    return _load_default(default_runtime_model_path(), check_runtime_compatible, "runtime residual model",
                         RUNTIME_REBUILD_HINT)


load_default_runtime_model = DefaultModel(_load_default_runtime)
